//! Chapter 2: symmetric memory.
//!
//! NVSHMEM gives every PE a *symmetric heap*: a region of GPU memory of the same layout on
//! every PE. An allocation made collectively (every PE asks for the same size in the same
//! order) lands at the same offset of every PE's heap, so one address names "this buffer" on
//! any PE: a put to `(ptr, pe)` means "the copy of `ptr` that lives on `pe`". Where two GPUs
//! share NVLink, NVSHMEM also maps each peer's heap into our address space, and
//! `nvshmem_ptr` hands out a plain device pointer to the peer's copy.
//!
//! [`SymmetricBuffer`] is that allocation as a typed, RAII value. It borrows the
//! [`World`] (or holds an `Arc` of it), so it cannot outlive NVSHMEM, and frees itself
//! collectively on drop.

pub mod heap;

use std::marker::PhantomData;
use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

pub use heap::{
    SYMMETRIC_SIZE_VAR, check_sizes_agree, configured_heap_bytes, exchange_u64, parse_size,
};

/// Everything that can go wrong with symmetric memory, caught on the host before any GPU
/// work is enqueued.
#[derive(Debug, thiserror::Error)]
pub enum SymmetricError {
    #[error(
        "symmetric allocation of {requested} bytes failed: the symmetric heap cannot hold it \
         ({heap}). Raise {SYMMETRIC_SIZE_VAR} on every rank (e.g. {SYMMETRIC_SIZE_VAR}=8G) \
         and relaunch"
    )]
    HeapExhausted { requested: usize, heap: String },
    #[error(
        "symmetric allocation of {requested} bytes is larger than the GPU's {device_bytes} bytes \
         of memory"
    )]
    LargerThanGpu {
        requested: usize,
        device_bytes: usize,
    },
    #[error("a symmetric allocation must hold at least one element")]
    Empty,
    #[error(
        "symmetric allocations must be identical on every PE, in the same order, but this one \
         differs: {}. Every PE must request the same size",
        describe_sizes(.sizes)
    )]
    SizeMismatch { sizes: Vec<(usize, u64)> },
    #[error("PE {pe} is out of range: this job has PEs 0..{n_pes}")]
    PeOutOfRange { pe: usize, n_pes: usize },
    #[error(
        "elements {offset}..{} are past the end of a symmetric buffer of {len} elements",
        .offset + .count
    )]
    OutOfBounds {
        offset: usize,
        count: usize,
        len: usize,
    },
    #[error("host slice has {host} elements but the buffer has {device}")]
    LengthMismatch { host: usize, device: usize },
    #[error(
        "device address {ptr:#x} is not inside NVSHMEM's symmetric heap (allocate it with SymmetricBuffer)"
    )]
    NotSymmetric { ptr: u64 },
    #[error("CUDA driver error while {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
}

fn describe_sizes(sizes: &[(usize, u64)]) -> String {
    sizes
        .iter()
        .map(|(pe, bytes)| format!("pe {pe} asked for {bytes} bytes"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl SymmetricError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

// ANCHOR: buffer
/// `len` elements of `T` on every PE's symmetric heap.
///
/// `W` is how the buffer holds the world: `&World` in a program (the borrow checker then
/// proves the buffer dies first), `Arc<World>` where lifetimes cannot be written, as in the
/// Python package.
///
/// A buffer that outlives its world (and so NVSHMEM's heap) does not compile:
///
/// ```compile_fail,E0505
/// # use ch01_bootstrap::World;
/// # use ch02_symmetric_memory::SymmetricBuffer;
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let world = World::from_env()?;
/// let buffer = SymmetricBuffer::<_, f32>::new(&world, 1024)?;
/// drop(world); // finalize NVSHMEM while `buffer` still points into its heap
/// buffer.fill_bytes(0)?;
/// # Ok(())
/// # }
/// ```
pub struct SymmetricBuffer<W: Deref<Target = World>, T> {
    world: W,
    /// Device pointer [len] T, symmetric: the same offset in every PE's heap.
    ptr: u64,
    len: usize,
    _element: PhantomData<T>,
}
// ANCHOR_END: buffer

/// Where checking is on: debug builds, or `NVSHMEM_TUTORIAL_CHECK_SYMMETRIC=1`.
pub fn size_checks_enabled() -> bool {
    cfg!(debug_assertions)
        || std::env::var("NVSHMEM_TUTORIAL_CHECK_SYMMETRIC").is_ok_and(|v| v == "1")
}

impl<W: Deref<Target = World>, T: DeviceRepr> SymmetricBuffer<W, T> {
    // ANCHOR: new
    /// Collective: every PE must call this with the same `len`, in the same order as its
    /// other symmetric allocations. With checks on ([`size_checks_enabled`]) a mismatch is
    /// an error on every PE instead of silent corruption.
    pub fn new(world: W, len: usize) -> Result<Self, SymmetricError> {
        Self::aligned(world, len, 256)
    }

    /// Like [`SymmetricBuffer::new`] with the start aligned to `alignment` bytes (a power of
    /// two, at least 8).
    pub fn aligned(world: W, len: usize, alignment: usize) -> Result<Self, SymmetricError> {
        if len == 0 {
            return Err(SymmetricError::Empty);
        }
        let num_bytes = len * std::mem::size_of::<T>();
        let device_bytes = world
            .context()
            .total_mem()
            .map_err(SymmetricError::cuda("reading the GPU's memory size"))?;
        if num_bytes > device_bytes {
            return Err(SymmetricError::LargerThanGpu {
                requested: num_bytes,
                device_bytes,
            });
        }
        if size_checks_enabled() {
            check_sizes_agree(&world, num_bytes as u64)?;
        }
        let nvshmem = world.nvshmem();
        // SAFETY: NVSHMEM is initialised (we hold the World); collective on every PE.
        let ptr =
            unsafe { (nvshmem.align)(alignment.max(8).next_power_of_two(), num_bytes) } as u64;
        if ptr == 0 {
            return Err(SymmetricError::HeapExhausted {
                requested: num_bytes,
                heap: heap::describe_heap(),
            });
        }
        Ok(Self {
            world,
            ptr,
            len,
            _element: PhantomData,
        })
    }
    // ANCHOR_END: new

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// Device pointer [len] T to this PE's copy; the same offset is valid on every PE.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Device pointer to element `offset`, checked so that `count` elements fit after it.
    pub fn element_ptr(&self, offset: usize, count: usize) -> Result<u64, SymmetricError> {
        self.check_range(offset, count)?;
        Ok(self.ptr + (offset * std::mem::size_of::<T>()) as u64)
    }
    pub fn world(&self) -> &World {
        &self.world
    }

    /// `Err` unless elements `offset..offset + count` are inside the buffer.
    pub fn check_range(&self, offset: usize, count: usize) -> Result<(), SymmetricError> {
        match offset.checked_add(count) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(SymmetricError::OutOfBounds {
                offset,
                count,
                len: self.len,
            }),
        }
    }

    /// `Err` unless `pe` is a PE of this job.
    pub fn check_pe(&self, pe: usize) -> Result<(), SymmetricError> {
        check_pe(&self.world, pe)
    }

    // ANCHOR: peer_ptr
    /// A device pointer [len] T to `pe`'s copy that this GPU can load from and store to
    /// directly (NVLink or PCIe peer mapping), or `None` when `pe` is only reachable through
    /// NVSHMEM's put/get (another node, or no peer access).
    pub fn peer_ptr(&self, pe: usize) -> Result<Option<u64>, SymmetricError> {
        self.check_pe(pe)?;
        // SAFETY: `ptr` is symmetric; nvshmem_ptr only translates addresses.
        let peer = unsafe { (self.world.nvshmem().ptr)(self.ptr as *const _, pe as i32) };
        Ok((!peer.is_null()).then_some(peer as u64))
    }
    // ANCHOR_END: peer_ptr

    /// Copies `host` into this PE's copy (blocking: returns once the data is on the GPU).
    pub fn copy_from_host(&self, host: &[T]) -> Result<(), SymmetricError> {
        if host.len() != self.len {
            return Err(SymmetricError::LengthMismatch {
                host: host.len(),
                device: self.len,
            });
        }
        self.copy_from_host_at(0, host)
    }

    /// Copies `host` into elements `offset..offset + host.len()` of this PE's copy (blocking).
    pub fn copy_from_host_at(&self, offset: usize, host: &[T]) -> Result<(), SymmetricError> {
        let ptr = self.element_ptr(offset, host.len())?;
        if host.is_empty() {
            return Ok(());
        }
        let stream = self.world.stream();
        // SAFETY: the range was checked; the copy completes before we return.
        unsafe { cudarc::driver::result::memcpy_htod_async(ptr, host, stream.cu_stream()) }
            .map_err(SymmetricError::cuda("copying host to device"))?;
        stream
            .synchronize()
            .map_err(SymmetricError::cuda("synchronising the copy"))
    }

    /// Sets every byte of this PE's copy to `byte`, on the world's stream. Use it to poison an
    /// output before a run, so an element nothing wrote cannot pass for a result.
    pub fn fill_bytes(&self, byte: u8) -> Result<(), SymmetricError> {
        // SAFETY: `ptr` holds `num_bytes` bytes.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.ptr,
                byte,
                self.num_bytes(),
                self.world.stream().cu_stream(),
            )
        }
        .map_err(SymmetricError::cuda("filling the buffer"))
    }
}

impl<W: Deref<Target = World>, T: DeviceRepr + ValidAsZeroBits + Clone + Default>
    SymmetricBuffer<W, T>
{
    /// Copies this PE's copy to the host, after the world's stream has finished its work.
    pub fn copy_to_host(&self) -> Result<Vec<T>, SymmetricError> {
        self.copy_to_host_range(0, self.len)
    }

    /// Elements `offset..offset + len` of this PE's copy, after the world's stream has
    /// finished its work.
    pub fn copy_to_host_range(&self, offset: usize, len: usize) -> Result<Vec<T>, SymmetricError> {
        let ptr = self.element_ptr(offset, len)?;
        let mut host = vec![T::default(); len];
        let stream = self.world.stream();
        if len > 0 {
            // SAFETY: the range was checked; we synchronise before reading `host`.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut host, ptr, stream.cu_stream())
            }
            .map_err(SymmetricError::cuda("copying device to host"))?;
        }
        stream
            .synchronize()
            .map_err(SymmetricError::cuda("synchronising the copy"))?;
        Ok(host)
    }
}

impl<W: Deref<Target = World>, T> Drop for SymmetricBuffer<W, T> {
    fn drop(&mut self) {
        // Work still queued on our stream may read or write this memory.
        let _ = self.world.stream().synchronize();
        if ch01_bootstrap::world::is_broken() {
            return; // a dead peer would never join the collective free: leave it to the driver
        }
        // SAFETY: allocated by nvshmem_align; nvshmem_free is collective, and every PE drops
        // its buffers in the same order because they were created in the same order.
        unsafe { (self.world.nvshmem().free)(self.ptr as *mut _) };
    }
}

/// `Err` unless `pe` is a PE of this job.
pub fn check_pe(world: &World, pe: usize) -> Result<(), SymmetricError> {
    if pe < world.n_pes() {
        Ok(())
    } else {
        Err(SymmetricError::PeOutOfRange {
            pe,
            n_pes: world.n_pes(),
        })
    }
}

/// `Err` unless `ptr` lies in NVSHMEM's symmetric heap. NVSHMEM 3.4's `nvshmem_ptr(ptr,
/// my_pe)` returns null for any address outside the heap, which makes it a cheap membership
/// test. That is the implementation's behaviour, not the specification's: OpenSHMEM's
/// `shmem_ptr` is defined for symmetric addresses only. Recheck it when the pinned NVSHMEM
/// release changes (chapter 2's example does, on every run).
pub fn check_symmetric(world: &World, ptr: u64) -> Result<(), SymmetricError> {
    // SAFETY: nvshmem_ptr only translates addresses.
    let local = unsafe { (world.nvshmem().ptr)(ptr as *const _, world.my_pe() as i32) };
    if local.is_null() {
        Err(SymmetricError::NotSymmetric { ptr })
    } else {
        Ok(())
    }
}
