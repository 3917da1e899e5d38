//! Chapter 3: put and get.
//!
//! Chapter 2 gave every PE the same buffer at the same offset. Now the PEs move data between
//! those buffers:
//!
//! - a **put** writes local bytes into a symmetric buffer on another PE, a **get** reads a
//!   peer's symmetric buffer into local memory;
//! - either side can be a GPU kernel (**device-initiated**, at thread, warp or block scope:
//!   [`DeviceOps`]) or the host enqueueing the transfer on a CUDA stream
//!   (**host-initiated**: [`put_on_stream`], [`get_on_stream`] and friends);
//! - a put is **blocking** (returns once the source may be reused) or **non-blocking**
//!   (`_nbi`, returns at once; `quiet` completes everything issued so far);
//! - `putmem_signal` delivers the bytes *and then* updates a flag on the receiver: the
//!   producer/consumer handshake that every later chapter is built on;
//! - where NVLink maps a peer's memory, a kernel may also just store through `nvshmem_ptr`.
//!
//! Every entry point checks its arguments on the host (the PE exists, the range fits the
//! symmetric allocation, a raw pointer lies in the symmetric heap, the local side is long
//! enough) before anything is enqueued, using chapter 2's checks.

pub mod bench;
pub mod config;

use std::ops::Deref;

use ch01_bootstrap::{BootstrapError, World};
use ch02_symmetric_memory::{SymmetricBuffer, SymmetricError, check_pe, check_symmetric};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg, sys,
};

/// Everything that can go wrong in this chapter. Argument errors are found on the host before
/// any work is enqueued; a timeout is a kernel's bounded wait that gave up.
#[derive(Debug, thiserror::Error)]
pub enum PutGetError {
    #[error(transparent)]
    Symmetric(#[from] SymmetricError),
    #[error(
        "the local {side} holds {len} elements, too few for elements {offset}..{}; pass a \
         count that fits, or a larger buffer",
        .offset + .count
    )]
    LocalOutOfBounds {
        side: &'static str,
        offset: usize,
        count: usize,
        len: usize,
    },
    #[error(
        "bytes {ptr:#x}..{:#x} run past the end of NVSHMEM's symmetric heap: the range must lie \
         inside one symmetric allocation",
        .ptr + .num_bytes
    )]
    RangeNotSymmetric { ptr: u64, num_bytes: u64 },
    #[error(
        "launch shape {num_blocks} x {threads_per_block}: {why}. Use 1..=2147483647 blocks of a \
         multiple of 32 threads, at most {}",
        config::MAX_THREADS_PER_BLOCK
    )]
    BadLaunchShape {
        num_blocks: u32,
        threads_per_block: u32,
        why: &'static str,
    },
    #[error(
        "pe {pe} cannot be reached with loads and stores from pe {me} (nvshmem_ptr is null: \
         another node, or no peer access); use put/get instead"
    )]
    NotLoadStoreReachable { me: usize, pe: usize },
    #[error(
        "pe {me}: timed out after {timeout_ms} ms in `{kernel}` waiting for pe {from_pe}'s \
         signal to reach {expected} (it was {seen}). Did pe {from_pe} launch its side, with the \
         same sizes? Run with NVSHMEM_DEBUG=INFO for NVSHMEM's own account"
    )]
    Timeout {
        me: usize,
        kernel: &'static str,
        from_pe: u64,
        expected: u64,
        seen: u64,
        timeout_ms: u64,
    },
    #[error(transparent)]
    Kernel(#[from] kernels::KernelError),
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error("CUDA driver error while {what}: {source}")]
    Cuda {
        what: &'static str,
        #[source]
        source: cudarc::driver::DriverError,
    },
}

impl PutGetError {
    fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

// ANCHOR: local_buffer
/// Device memory of this PE that a transfer reads from (put) or writes into (get): a plain
/// CUDA allocation or this PE's copy of a symmetric buffer. Over NVLink the local side needs
/// no registration; only the remote side must be symmetric.
pub trait LocalBuffer<T> {
    /// Number of `T` elements.
    fn num_elements(&self) -> usize;
    /// Device pointer [num_elements] T on this PE.
    fn device_address(&self, stream: &CudaStream) -> u64;
}

impl<T> LocalBuffer<T> for CudaSlice<T> {
    fn num_elements(&self) -> usize {
        cudarc::driver::DeviceSlice::len(self)
    }
    fn device_address(&self, stream: &CudaStream) -> u64 {
        // The guard records cudarc's read event when dropped; all of our work is on `stream`.
        let (ptr, _record) = self.device_ptr(stream);
        ptr
    }
}

impl<W: Deref<Target = World>, T: DeviceRepr> LocalBuffer<T> for SymmetricBuffer<W, T> {
    fn num_elements(&self) -> usize {
        self.len()
    }
    fn device_address(&self, _stream: &CudaStream) -> u64 {
        self.device_ptr()
    }
}
// ANCHOR_END: local_buffer

// ANCHOR: checks
/// Byte offset of elements `offset..offset + count` of a local buffer of `len` elements of
/// `element_bytes` each, or why they do not fit. Pure: the host-side half of every check.
pub fn local_range(
    side: &'static str,
    len: usize,
    offset: usize,
    count: usize,
    element_bytes: usize,
) -> Result<u64, PutGetError> {
    match offset.checked_add(count) {
        Some(end) if end <= len => Ok((offset * element_bytes) as u64),
        _ => Err(PutGetError::LocalOutOfBounds {
            side,
            offset,
            count,
            len,
        }),
    }
}

/// Device pointer to elements `offset..offset + count` of `buffer` as named on `pe`: chapter
/// 2's checks that `pe` exists and that the range lies inside the allocation.
pub fn remote_range<W: Deref<Target = World>, T: DeviceRepr>(
    buffer: &SymmetricBuffer<W, T>,
    offset: usize,
    count: usize,
    pe: usize,
) -> Result<u64, PutGetError> {
    buffer.check_pe(pe)?;
    Ok(buffer.element_ptr(offset, count)?)
}

/// `Err` unless every byte of `ptr..ptr + num_bytes` is symmetric: both ends are tested,
/// so a range that starts in the heap and runs off its end is caught too.
pub fn check_symmetric_range(world: &World, ptr: u64, num_bytes: u64) -> Result<(), PutGetError> {
    check_symmetric(world, ptr)?;
    if num_bytes > 1 && check_symmetric(world, ptr + num_bytes - 1).is_err() {
        return Err(PutGetError::RangeNotSymmetric { ptr, num_bytes });
    }
    Ok(())
}
// ANCHOR_END: checks

/// Bytes `[begin, end)` that part `part_idx` of `num_parts` moves: the host mirror of
/// `slice_bounds` in `kernels/cuda/put_get.cu` (equal 16-byte-rounded shares).
pub fn slice_bounds(num_bytes: u64, num_parts: u64, part_idx: u64) -> (u64, u64) {
    let per_part = num_bytes.div_ceil(16).div_ceil(num_parts) * 16;
    let begin = num_bytes.min(part_idx * per_part);
    (begin, num_bytes.min(begin + per_part))
}

/// Which threads cooperate in one device-side NVSHMEM call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `nvshmem_putmem`: each thread moves its own slice.
    Thread,
    /// `nvshmemx_putmem_warp`: the 32 threads of a warp move one slice together.
    Warp,
    /// `nvshmemx_putmem_block`: all threads of a block move one slice together.
    Block,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Thread, Scope::Warp, Scope::Block];
    pub fn name(self) -> &'static str {
        match self {
            Scope::Thread => "thread",
            Scope::Warp => "warp",
            Scope::Block => "block",
        }
    }
}

/// When a call returns, and what completes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Completion {
    /// Returns once the source may be reused (put) or the data is here (get).
    Blocking,
    /// `_nbi`: returns at once; `quiet` completes it.
    NonBlockingQuiet,
}

impl Completion {
    pub const ALL: [Completion; 2] = [Completion::Blocking, Completion::NonBlockingQuiet];
    pub fn name(self) -> &'static str {
        match self {
            Completion::Blocking => "blocking",
            Completion::NonBlockingQuiet => "nbi+quiet",
        }
    }
}

/// How a signal word is updated once the data before it has landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOp {
    /// The signal becomes the value (one producer, a sequence number).
    Set,
    /// The value is added (many producers, the consumer waits for the sum).
    Add,
}

impl SignalOp {
    fn raw(self) -> i32 {
        match self {
            SignalOp::Set => nvshmem_sys::SIGNAL_SET,
            SignalOp::Add => nvshmem_sys::SIGNAL_ADD,
        }
    }
}

/// Grid of a device-initiated transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchShape {
    pub num_blocks: u32,
    pub threads_per_block: u32,
}

impl Default for LaunchShape {
    fn default() -> Self {
        Self {
            num_blocks: config::DEFAULT_NUM_BLOCKS,
            threads_per_block: config::DEFAULT_THREADS_PER_BLOCK,
        }
    }
}

impl LaunchShape {
    /// `Err` unless CUDA can launch it and every warp is whole (the warp variants split work
    /// by warp; a partial warp would leave threads out of a collective call).
    pub fn checked(self) -> Result<LaunchConfig, PutGetError> {
        let why = if self.num_blocks == 0 || self.num_blocks > i32::MAX as u32 {
            Some("the block count is out of range")
        } else if self.threads_per_block == 0 || !self.threads_per_block.is_multiple_of(32) {
            Some("threads per block must be a positive multiple of 32")
        } else if self.threads_per_block > config::MAX_THREADS_PER_BLOCK {
            Some("too many threads per block")
        } else {
            None
        };
        match why {
            Some(why) => Err(PutGetError::BadLaunchShape {
                num_blocks: self.num_blocks,
                threads_per_block: self.threads_per_block,
                why,
            }),
            None => Ok(LaunchConfig {
                grid_dim: (self.num_blocks, 1, 1),
                block_dim: (self.threads_per_block, 1, 1),
                shared_mem_bytes: 0,
            }),
        }
    }
}

// ---- host-initiated -----------------------------------------------------------------------

// ANCHOR: put_on_stream
/// Host-initiated put, enqueued on the world's stream: elements `0..count` of `src` go to
/// elements `dst_offset..dst_offset + count` of `dst` on PE `pe`. Blocking in NVSHMEM's
/// sense: later work on the stream may reuse `src`; the data is delivered on `pe` after a
/// `quiet` or a barrier.
pub fn put_on_stream<W, T, L>(
    dst: &SymmetricBuffer<W, T>,
    dst_offset: usize,
    src: &L,
    count: usize,
    pe: usize,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    host_put(dst, dst_offset, src, count, pe, Completion::Blocking)
}
// ANCHOR_END: put_on_stream

/// [`put_on_stream`] with `nvshmemx_putmem_nbi_on_stream`: complete it with [`quiet_on_stream`].
pub fn put_nbi_on_stream<W, T, L>(
    dst: &SymmetricBuffer<W, T>,
    dst_offset: usize,
    src: &L,
    count: usize,
    pe: usize,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    host_put(
        dst,
        dst_offset,
        src,
        count,
        pe,
        Completion::NonBlockingQuiet,
    )
}

fn host_put<W, T, L>(
    dst: &SymmetricBuffer<W, T>,
    dst_offset: usize,
    src: &L,
    count: usize,
    pe: usize,
    completion: Completion,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    let world = dst.world();
    let dst_ptr = remote_range(dst, dst_offset, count, pe)?;
    local_range("source", src.num_elements(), 0, count, size_of::<T>())?;
    let stream = world.stream();
    let src_ptr = src.device_address(stream);
    let num_bytes = count * size_of::<T>();
    let put = match completion {
        Completion::Blocking => world.nvshmem().putmem_on_stream,
        Completion::NonBlockingQuiet => world.nvshmem().putmem_nbi_on_stream,
    };
    // SAFETY: checked above: `dst_ptr` is `num_bytes` inside a symmetric allocation, `pe`
    // exists, `src_ptr` holds at least `num_bytes`; the stream belongs to this context.
    unsafe {
        put(
            dst_ptr as *mut _,
            src_ptr as *const _,
            num_bytes,
            pe as i32,
            stream.cu_stream() as _,
        )
    };
    Ok(())
}

/// Host-initiated get: elements `src_offset..src_offset + count` of `src` as it is on PE `pe`
/// land in elements `0..count` of the local `dst`, in stream order.
pub fn get_on_stream<W, T, L>(
    dst: &L,
    src: &SymmetricBuffer<W, T>,
    src_offset: usize,
    count: usize,
    pe: usize,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    host_get(dst, src, src_offset, count, pe, Completion::Blocking)
}

/// [`get_on_stream`] with `nvshmemx_getmem_nbi_on_stream`: complete it with [`quiet_on_stream`].
pub fn get_nbi_on_stream<W, T, L>(
    dst: &L,
    src: &SymmetricBuffer<W, T>,
    src_offset: usize,
    count: usize,
    pe: usize,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    host_get(
        dst,
        src,
        src_offset,
        count,
        pe,
        Completion::NonBlockingQuiet,
    )
}

fn host_get<W, T, L>(
    dst: &L,
    src: &SymmetricBuffer<W, T>,
    src_offset: usize,
    count: usize,
    pe: usize,
    completion: Completion,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    let world = src.world();
    let src_ptr = remote_range(src, src_offset, count, pe)?;
    local_range("destination", dst.num_elements(), 0, count, size_of::<T>())?;
    let stream = world.stream();
    let dst_ptr = dst.device_address(stream);
    let get = match completion {
        Completion::Blocking => world.nvshmem().getmem_on_stream,
        Completion::NonBlockingQuiet => world.nvshmem().getmem_nbi_on_stream,
    };
    // SAFETY: as in `host_put`, with the roles of the two sides swapped.
    unsafe {
        get(
            dst_ptr as *mut _,
            src_ptr as *const _,
            count * size_of::<T>(),
            pe as i32,
            stream.cu_stream() as _,
        )
    };
    Ok(())
}

/// Completes, in stream order, every put and get this PE issued on the world's stream.
pub fn quiet_on_stream(world: &World) {
    // SAFETY: initialised; only orders work on our stream.
    unsafe { (world.nvshmem().quiet_on_stream)(world.stream().cu_stream() as _) };
}

// ANCHOR: put_signal_on_stream
/// Host-initiated `putmem_signal`: the put of [`put_on_stream`], then word `signal_idx` of
/// `signal` on `pe` is updated with `op`/`value` once the data has landed there. The consumer
/// on `pe` waits on the signal, never on a barrier.
#[allow(clippy::too_many_arguments)]
pub fn put_signal_on_stream<W, W2, T, L>(
    dst: &SymmetricBuffer<W, T>,
    dst_offset: usize,
    src: &L,
    count: usize,
    signal: &SymmetricBuffer<W2, u64>,
    signal_idx: usize,
    value: u64,
    op: SignalOp,
    pe: usize,
) -> Result<(), PutGetError>
where
    W: Deref<Target = World>,
    W2: Deref<Target = World>,
    T: DeviceRepr,
    L: LocalBuffer<T>,
{
    let world = dst.world();
    let dst_ptr = remote_range(dst, dst_offset, count, pe)?;
    let signal_ptr = remote_range(signal, signal_idx, 1, pe)?;
    local_range("source", src.num_elements(), 0, count, size_of::<T>())?;
    let stream = world.stream();
    let src_ptr = src.device_address(stream);
    // SAFETY: both remote ranges and the local one were checked above.
    unsafe {
        (world.nvshmem().putmem_signal_on_stream)(
            dst_ptr as *mut _,
            src_ptr as *const _,
            count * size_of::<T>(),
            signal_ptr as *mut u64,
            value,
            op.raw(),
            pe as i32,
            stream.cu_stream() as _,
        )
    };
    Ok(())
}
// ANCHOR_END: put_signal_on_stream

// ANCHOR: put_raw
/// The untyped put, for pointers that did not come from a [`SymmetricBuffer`] (another
/// library's allocation, an offset computed by hand): `dst` must be a symmetric device
/// address whose whole range lies in the heap; `src` is a local device pointer of
/// `num_bytes` bytes that the caller vouches for.
///
/// # Safety
/// `src` must point to `num_bytes` readable device bytes on this PE.
pub unsafe fn put_raw_on_stream(
    world: &World,
    dst: u64,
    src: u64,
    num_bytes: usize,
    pe: usize,
) -> Result<(), PutGetError> {
    check_pe(world, pe)?;
    check_symmetric_range(world, dst, num_bytes as u64)?;
    // SAFETY: `dst..dst + num_bytes` is symmetric, `pe` exists, the caller vouches for `src`.
    unsafe {
        (world.nvshmem().putmem_on_stream)(
            dst as *mut _,
            src as *const _,
            num_bytes,
            pe as i32,
            world.stream().cu_stream() as _,
        )
    };
    Ok(())
}
// ANCHOR_END: put_raw

// ---- device-initiated ---------------------------------------------------------------------

/// The chapter's kernels (`kernels/cuda/put_get.cu`), loaded and registered with NVSHMEM,
/// plus the small error word their bounded waits report into.
pub struct DeviceOps<'w> {
    world: &'w World,
    _module: kernels::NvshmemModule,
    put: [CudaFunction; 3],
    get: [CudaFunction; 3],
    put_signal_ring: CudaFunction,
    wait_signal_copy: CudaFunction,
    store_copy: CudaFunction,
    put_bulk: CudaFunction,
    pingpong: CudaFunction,
    /// Device [4] u64: (timed out?, PE waited for, expected, seen), written by a kernel that
    /// gave up waiting.
    error: CudaSlice<u64>,
    error_ptr: u64,
    timeout_cycles: i64,
}

impl<'w> DeviceOps<'w> {
    pub fn new(world: &'w World) -> Result<Self, PutGetError> {
        let module = world.load_module("put_get")?;
        let f = |name: &str| module.function(name);
        let stream = world.stream();
        let error = stream
            .alloc_zeros::<u64>(4)
            .map_err(PutGetError::cuda("allocating the error word"))?;
        let error_ptr = error.device_address(stream);
        // clock64() counts SM cycles: convert the timeout with this GPU's clock rate (kHz).
        let clock_khz = world
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .map_err(PutGetError::cuda("reading the SM clock rate"))?;
        Ok(Self {
            world,
            put: [f("put_thread")?, f("put_warp")?, f("put_block")?],
            get: [f("get_thread")?, f("get_warp")?, f("get_block")?],
            put_signal_ring: f("put_signal_ring")?,
            wait_signal_copy: f("wait_signal_copy")?,
            store_copy: f("store_copy")?,
            put_bulk: f("put_bulk")?,
            pingpong: f("pingpong")?,
            _module: module,
            error,
            error_ptr,
            timeout_cycles: (config::WAIT_TIMEOUT_MS as i64) * clock_khz as i64,
        })
    }

    pub fn world(&self) -> &'w World {
        self.world
    }

    // ANCHOR: device_put
    /// Device-initiated put: a kernel of `shape` splits elements `0..count` of `src` into one
    /// slice per thread, warp or block (`scope`), and each owner puts its slice into
    /// `dst[dst_offset..]` on `pe`. With [`Completion::NonBlockingQuiet`] every owner issues
    /// `_nbi` calls and ends with `nvshmem_quiet`, so the data has landed when the kernel ends.
    #[allow(clippy::too_many_arguments)]
    pub fn put<W, T, L>(
        &self,
        scope: Scope,
        completion: Completion,
        shape: LaunchShape,
        dst: &SymmetricBuffer<W, T>,
        dst_offset: usize,
        src: &L,
        count: usize,
        pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
    {
        let kernel = &self.put[scope as usize];
        self.checked_put(kernel, completion, shape, dst, dst_offset, src, count, pe)
    }
    // ANCHOR_END: device_put

    /// The host-side checks every device put makes before launching `kernel`: the launch
    /// shape, the remote range on `pe` and the local source range.
    #[allow(clippy::too_many_arguments)]
    fn checked_put<W, T, L>(
        &self,
        kernel: &CudaFunction,
        completion: Completion,
        shape: LaunchShape,
        dst: &SymmetricBuffer<W, T>,
        dst_offset: usize,
        src: &L,
        count: usize,
        pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
    {
        let config = shape.checked()?;
        let dst_ptr = remote_range(dst, dst_offset, count, pe)?;
        local_range("source", src.num_elements(), 0, count, size_of::<T>())?;
        let src_ptr = src.device_address(self.world.stream());
        let num_bytes = count * size_of::<T>();
        self.launch_transfer(kernel, config, dst_ptr, src_ptr, num_bytes, pe, completion)
    }

    /// Device-initiated get: elements `src_offset..src_offset + count` of `src` on `pe` land
    /// in elements `0..count` of the local `dst`, sliced as in [`DeviceOps::put`].
    #[allow(clippy::too_many_arguments)]
    pub fn get<W, T, L>(
        &self,
        scope: Scope,
        completion: Completion,
        shape: LaunchShape,
        dst: &L,
        src: &SymmetricBuffer<W, T>,
        src_offset: usize,
        count: usize,
        pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
    {
        let config = shape.checked()?;
        let src_ptr = remote_range(src, src_offset, count, pe)?;
        local_range("destination", dst.num_elements(), 0, count, size_of::<T>())?;
        let dst_ptr = dst.device_address(self.world.stream());
        self.launch_transfer(
            &self.get[scope as usize],
            config,
            dst_ptr,
            src_ptr,
            count * size_of::<T>(),
            pe,
            completion,
        )
    }

    /// Launches one of put_*/get_* (they share the signature
    /// `(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi)`).
    #[allow(clippy::too_many_arguments)]
    fn launch_transfer(
        &self,
        kernel: &CudaFunction,
        config: LaunchConfig,
        dst_ptr: u64,
        src_ptr: u64,
        num_bytes: usize,
        pe: usize,
        completion: Completion,
    ) -> Result<(), PutGetError> {
        if num_bytes == 0 {
            return Ok(());
        }
        let num_bytes = num_bytes as u64;
        let pe = pe as i32;
        let nbi = (completion == Completion::NonBlockingQuiet) as i32;
        let mut launch = self.world.stream().launch_builder(kernel);
        launch
            .arg(&dst_ptr)
            .arg(&src_ptr)
            .arg(&num_bytes)
            .arg(&pe)
            .arg(&nbi);
        // SAFETY: arguments match the kernel's signature; both ranges were checked by the
        // caller (one symmetric on `pe`, one local).
        unsafe { launch.launch(config) }
            .map_err(PutGetError::cuda("launching a put/get kernel"))?;
        Ok(())
    }

    // ANCHOR: device_put_signal
    /// The handshake on a ring: every block of this PE's kernel puts its slice of
    /// `src[0..count]` into `inbox` on `next_pe` with `putmem_signal` (ADD 1 to word 0 of
    /// `signal` there), then waits until all `shape.num_blocks` blocks of `previous_pe` have
    /// signalled it and copies its slice of its own `inbox` into `seen`. `signal` must be 0 on
    /// every PE before any PE launches (zero it, then barrier). Returns once the kernel
    /// finished, with a timeout turned into [`PutGetError::Timeout`].
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal_ring<W, W2, T, L, S>(
        &self,
        shape: LaunchShape,
        inbox: &SymmetricBuffer<W, T>,
        src: &L,
        count: usize,
        signal: &SymmetricBuffer<W2, u64>,
        seen: &S,
        next_pe: usize,
        previous_pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        W2: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
        S: LocalBuffer<T>,
    {
        let config = shape.checked()?;
        let inbox_ptr = remote_range(inbox, 0, count, next_pe)?;
        check_pe(self.world, previous_pe)?;
        let signal_ptr = remote_range(signal, 0, 1, next_pe)?;
        local_range("source", src.num_elements(), 0, count, size_of::<T>())?;
        local_range("destination", seen.num_elements(), 0, count, size_of::<T>())?;
        let stream = self.world.stream();
        let (src_ptr, seen_ptr) = (src.device_address(stream), seen.device_address(stream));
        let num_bytes = (count * size_of::<T>()) as u64;
        let (next, previous) = (next_pe as i32, previous_pe as i32);
        self.arm()?;
        let mut launch = stream.launch_builder(&self.put_signal_ring);
        launch
            .arg(&inbox_ptr)
            .arg(&src_ptr)
            .arg(&num_bytes)
            .arg(&signal_ptr)
            .arg(&next)
            .arg(&previous)
            .arg(&seen_ptr)
            .arg(&self.timeout_cycles)
            .arg(&self.error_ptr);
        // SAFETY: matches put_signal_ring's signature; every range was checked above.
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching put_signal_ring"))?;
        self.finish_waiting("put_signal_ring")
    }
    // ANCHOR_END: device_put_signal

    /// The consumer alone: waits (bounded) until word 0 of the local `signal` reaches
    /// `expected` (raised by `from_pe`), then copies `inbox[0..count]` into `seen`.
    #[allow(clippy::too_many_arguments)]
    pub fn wait_signal_copy<W, W2, T, S>(
        &self,
        shape: LaunchShape,
        inbox: &SymmetricBuffer<W, T>,
        count: usize,
        signal: &SymmetricBuffer<W2, u64>,
        expected: u64,
        seen: &S,
        from_pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        W2: Deref<Target = World>,
        T: DeviceRepr,
        S: LocalBuffer<T>,
    {
        let config = shape.checked()?;
        check_pe(self.world, from_pe)?;
        let inbox_ptr = inbox.element_ptr(0, count)?;
        let signal_ptr = signal.element_ptr(0, 1)?;
        local_range("destination", seen.num_elements(), 0, count, size_of::<T>())?;
        let stream = self.world.stream();
        let seen_ptr = seen.device_address(stream);
        let num_bytes = (count * size_of::<T>()) as u64;
        let from = from_pe as i32;
        self.arm()?;
        let mut launch = stream.launch_builder(&self.wait_signal_copy);
        launch
            .arg(&inbox_ptr)
            .arg(&signal_ptr)
            .arg(&expected)
            .arg(&seen_ptr)
            .arg(&num_bytes)
            .arg(&from)
            .arg(&self.timeout_cycles)
            .arg(&self.error_ptr);
        // SAFETY: matches wait_signal_copy's signature; local ranges checked above.
        unsafe { launch.launch(config) }
            .map_err(PutGetError::cuda("launching wait_signal_copy"))?;
        self.finish_waiting("wait_signal_copy")
    }

    // ANCHOR: device_store
    /// No NVSHMEM call at all: `store_copy` writes `src[0..count]` through the pointer
    /// `nvshmem_ptr` returns for `dst[dst_offset..]` on `pe`. Only for peers this GPU can
    /// address (same node, NVLink or PCIe peer access): otherwise
    /// [`PutGetError::NotLoadStoreReachable`].
    #[allow(clippy::too_many_arguments)]
    pub fn store<W, T, L>(
        &self,
        shape: LaunchShape,
        dst: &SymmetricBuffer<W, T>,
        dst_offset: usize,
        src: &L,
        count: usize,
        pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
    {
        let config = shape.checked()?;
        remote_range(dst, dst_offset, count, pe)?;
        let peer = dst
            .peer_ptr(pe)?
            .ok_or(PutGetError::NotLoadStoreReachable {
                me: self.world.my_pe(),
                pe,
            })?;
        local_range("source", src.num_elements(), 0, count, size_of::<T>())?;
        let dst_ptr = peer + (dst_offset * size_of::<T>()) as u64;
        let src_ptr = src.device_address(self.world.stream());
        self.launch_store(config, dst_ptr, src_ptr, (count * size_of::<T>()) as u64)
    }
    // ANCHOR_END: device_store

    /// `store_copy` on raw pointers, for the benchmark (ranges checked by the caller).
    pub fn launch_store(
        &self,
        config: LaunchConfig,
        dst_ptr: u64,
        src_ptr: u64,
        num_bytes: u64,
    ) -> Result<(), PutGetError> {
        let mut launch = self.world.stream().launch_builder(&self.store_copy);
        launch.arg(&dst_ptr).arg(&src_ptr).arg(&num_bytes);
        // SAFETY: matches store_copy(char*, const char*, uint64_t).
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching store_copy"))?;
        Ok(())
    }

    // ANCHOR: device_put_bulk
    /// Device-initiated put through the bulk-copy (TMA) unit: each block of `shape` streams
    /// its slice of `src[0..count]` through shared memory into `dst[dst_offset..]` on `pe`
    /// (NVSHMEM's block put where `pe` is not load/store reachable). The data has landed
    /// when the kernel ends.
    #[allow(clippy::too_many_arguments)]
    pub fn put_bulk<W, T, L>(
        &self,
        shape: LaunchShape,
        dst: &SymmetricBuffer<W, T>,
        dst_offset: usize,
        src: &L,
        count: usize,
        pe: usize,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        T: DeviceRepr,
        L: LocalBuffer<T>,
    {
        // Blocking: the kernel waits for its bulk stores before it ends.
        let completion = Completion::Blocking;
        self.checked_put(
            &self.put_bulk,
            completion,
            shape,
            dst,
            dst_offset,
            src,
            count,
            pe,
        )
    }
    // ANCHOR_END: device_put_bulk

    /// `put_bulk` on raw pointers, for the benchmark (ranges checked by the caller).
    pub fn launch_put_bulk_raw(
        &self,
        config: LaunchConfig,
        dst_ptr: u64,
        src_ptr: u64,
        num_bytes: usize,
        pe: usize,
    ) -> Result<(), PutGetError> {
        self.launch_transfer(
            &self.put_bulk,
            config,
            dst_ptr,
            src_ptr,
            num_bytes,
            pe,
            Completion::Blocking,
        )
    }

    /// Launches `put_{scope}` on raw pointers, for the benchmark (ranges checked by the
    /// caller), always `_nbi` + quiet.
    pub fn launch_put_raw(
        &self,
        scope: Scope,
        config: LaunchConfig,
        dst_ptr: u64,
        src_ptr: u64,
        num_bytes: usize,
        pe: usize,
    ) -> Result<(), PutGetError> {
        self.launch_transfer(
            &self.put[scope as usize],
            config,
            dst_ptr,
            src_ptr,
            num_bytes,
            pe,
            Completion::NonBlockingQuiet,
        )
    }

    // ANCHOR: device_pingpong
    /// Enqueues one side of the ping-pong: `num_iters` round trips of `num_bytes` between this
    /// PE and `peer` through `buffer` and word 0 of `signal` (0 on both PEs before either
    /// launches). One block of `threads_per_block`. Call [`DeviceOps::finish_waiting`] after
    /// timing it.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_pingpong<W, W2, L>(
        &self,
        threads_per_block: u32,
        buffer: &SymmetricBuffer<W, u8>,
        src: &L,
        num_bytes: usize,
        signal: &SymmetricBuffer<W2, u64>,
        peer: usize,
        initiator: bool,
        num_iters: u64,
    ) -> Result<(), PutGetError>
    where
        W: Deref<Target = World>,
        W2: Deref<Target = World>,
        L: LocalBuffer<u8>,
    {
        let config = LaunchShape {
            num_blocks: 1,
            threads_per_block,
        }
        .checked()?;
        let buffer_ptr = remote_range(buffer, 0, num_bytes, peer)?;
        let signal_ptr = remote_range(signal, 0, 1, peer)?;
        local_range("source", src.num_elements(), 0, num_bytes, 1)?;
        let src_ptr = src.device_address(self.world.stream());
        let (num_bytes, peer, initiator) = (num_bytes as u64, peer as i32, initiator as i32);
        self.arm()?;
        let mut launch = self.world.stream().launch_builder(&self.pingpong);
        launch
            .arg(&buffer_ptr)
            .arg(&src_ptr)
            .arg(&num_bytes)
            .arg(&signal_ptr)
            .arg(&peer)
            .arg(&initiator)
            .arg(&num_iters)
            .arg(&self.timeout_cycles)
            .arg(&self.error_ptr);
        // SAFETY: matches pingpong's signature; ranges checked above.
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching pingpong"))?;
        Ok(())
    }
    // ANCHOR_END: device_pingpong

    /// Clears the error word before a kernel that waits.
    fn arm(&self) -> Result<(), PutGetError> {
        // SAFETY: `error_ptr` holds 4 u64.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.error_ptr,
                0,
                32,
                self.world.stream().cu_stream(),
            )
        }
        .map_err(PutGetError::cuda("clearing the error word"))
    }

    // ANCHOR: finish_waiting
    /// Waits for the stream, then turns a timeout the kernel recorded into an error that
    /// names this PE, the PE it waited for and the signal values.
    pub fn finish_waiting(&self, kernel: &'static str) -> Result<(), PutGetError> {
        let stream = self.world.stream();
        let mut word = [0u64; 4];
        // SAFETY: `error_ptr` holds 4 u64; synchronised before reading.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(&mut word, self.error_ptr, stream.cu_stream())
        }
        .map_err(PutGetError::cuda("reading the error word"))?;
        stream
            .synchronize()
            .map_err(PutGetError::cuda("waiting for the kernel"))?;
        if word[0] != 0 {
            return Err(PutGetError::Timeout {
                me: self.world.my_pe(),
                kernel,
                from_pe: word[1],
                expected: word[2],
                seen: word[3],
                timeout_ms: config::WAIT_TIMEOUT_MS,
            });
        }
        Ok(())
    }
    // ANCHOR_END: finish_waiting
}

impl Drop for DeviceOps<'_> {
    fn drop(&mut self) {
        // The error word may still be written by a kernel in flight.
        let _ = self.world.stream().synchronize();
        let _ = &self.error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_every_byte_once() {
        for num_bytes in [0u64, 1, 12, 15, 16, 17, 4_000_012, 1 << 20] {
            for num_parts in [1u64, 2, 3, 7, 32, 132, 33_792] {
                let mut next = 0;
                for part in 0..num_parts {
                    let (begin, end) = slice_bounds(num_bytes, num_parts, part);
                    assert!(begin <= end, "{num_bytes} {num_parts} {part}");
                    if begin < end {
                        assert_eq!(begin, next, "gap or overlap at part {part}");
                        // Every non-empty slice but the last starts 16-byte aligned.
                        assert_eq!(begin % 16, 0);
                        next = end;
                    }
                }
                assert_eq!(next, num_bytes, "{num_bytes} bytes in {num_parts} parts");
            }
        }
    }

    #[test]
    fn local_ranges_are_checked() {
        assert_eq!(local_range("source", 10, 0, 10, 4).unwrap(), 0);
        assert_eq!(local_range("source", 10, 3, 7, 4).unwrap(), 12);
        let err = local_range("source", 10, 0, 11, 4).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("local source holds 10 elements") && msg.contains("0..11"),
            "{msg}"
        );
        // An overflowing end is an error, not a wrap-around.
        assert!(local_range("destination", 10, usize::MAX, 2, 4).is_err());
    }

    #[test]
    fn launch_shapes_are_checked() {
        assert!(LaunchShape::default().checked().is_ok());
        for (num_blocks, threads_per_block, expected) in [
            (0, 256, "block count"),
            (4, 100, "multiple of 32"),
            (4, 0, "multiple of 32"),
            (4, 2048, "too many threads"),
        ] {
            let err = LaunchShape {
                num_blocks,
                threads_per_block,
            }
            .checked()
            .unwrap_err()
            .to_string();
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn timeout_names_both_pes_and_the_signal() {
        let err = PutGetError::Timeout {
            me: 1,
            kernel: "pingpong",
            from_pe: 0,
            expected: 5,
            seen: 4,
            timeout_ms: 10_000,
        }
        .to_string();
        assert!(
            err.starts_with("pe 1: timed out after 10000 ms in `pingpong`"),
            "{err}"
        );
        assert!(err.contains("pe 0's signal to reach 5 (it was 4)"), "{err}");
    }

    #[test]
    fn range_error_says_what_to_do() {
        let err = PutGetError::RangeNotSymmetric {
            ptr: 0x1000,
            num_bytes: 0x100,
        }
        .to_string();
        assert!(
            err.contains("0x1000..0x1100") && err.contains("inside one symmetric"),
            "{err}"
        );
        let err: PutGetError = SymmetricError::PeOutOfRange { pe: 4, n_pes: 2 }.into();
        assert!(err.to_string().contains("PE 4 is out of range"), "{err}");
    }
}
