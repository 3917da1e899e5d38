//! Device-initiated transfers: a kernel of `kernels/cuda/put_get.cu` issues the put or get.
//!
//! [`DeviceOps`] holds the chapter's kernels, loaded and registered with NVSHMEM. A put or a
//! get is one call parameterised by [`Scope`] (which threads cooperate in one NVSHMEM call)
//! and [`Completion`] (blocking, or `_nbi` + `nvshmem_quiet`); [`DeviceOps::store`] writes
//! through the peer pointer without NVSHMEM; [`DeviceOps::put_bulk`] uses Hopper's bulk-copy
//! unit. The kernels that wait for a signal are in [`crate::signal`].

use cudarc::driver::{CudaFunction, CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg, sys};

use ch01_bootstrap::World;

use crate::{Completion, Put, PutGetError, Transfer, config};

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

/// Grid of a device-initiated transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchShape {
    pub num_blocks: u32,
    pub threads_per_block: u32,
}

impl LaunchShape {
    /// One block of `config::THREADS_PER_BLOCK` threads per SM this PE may fill
    /// (`World::num_sms`: the whole GPU, or this PE's share when PEs share it).
    pub fn one_per_sm(world: &World) -> Self {
        Self {
            num_blocks: world.num_sms(),
            threads_per_block: config::THREADS_PER_BLOCK,
        }
    }

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

/// Bytes `[begin, end)` that part `part_idx` of `num_parts` moves: the host mirror of
/// `slice_bounds` in `kernels/cuda/put_get.cu` (equal 16-byte-rounded shares).
pub fn slice_bounds(num_bytes: u64, num_parts: u64, part_idx: u64) -> (u64, u64) {
    let per_part = num_bytes.div_ceil(16).div_ceil(num_parts) * 16;
    let begin = num_bytes.min(part_idx * per_part);
    (begin, num_bytes.min(begin + per_part))
}

/// `Err` unless a GPU of compute capability `(major, minor)` has Hopper's bulk-copy (TMA)
/// instructions, which `kernel` needs.
pub fn check_hopper(kernel: &'static str, (major, minor): (i32, i32)) -> Result<(), PutGetError> {
    if major >= 9 {
        Ok(())
    } else {
        Err(PutGetError::NeedsHopper {
            kernel,
            device_arch: format!("sm_{major}{minor}"),
        })
    }
}

/// The chapter's kernels (`kernels/cuda/put_get.cu`), loaded and registered with NVSHMEM,
/// what this GPU is (for the checks made before a launch), and the small error record that
/// the kernels' bounded waits report into.
pub struct DeviceOps<'w> {
    pub(crate) world: &'w World,
    _module: std::sync::Arc<kernels::NvshmemModule>,
    put: [CudaFunction; 3],
    get: [CudaFunction; 3],
    store_copy: CudaFunction,
    put_stores: CudaFunction,
    put_bulk: CudaFunction,
    pub(crate) put_signal_ring: CudaFunction,
    pub(crate) wait_signal_copy: CudaFunction,
    pub(crate) pingpong: CudaFunction,
    /// Device [4] u64: (timed out?, PE waited for, expected, seen), written by a kernel that
    /// gave up waiting (see `signal_wait_bounded` in kernels/cuda/common.cuh).
    pub(crate) error: CudaSlice<u64>,
    /// `error`'s device address, passed to the waiting kernels.
    pub(crate) error_ptr: u64,
    /// config::WAIT_TIMEOUT_MS in SM clock cycles of this GPU.
    pub(crate) timeout_cycles: i64,
    compute_capability: (i32, i32),
    pub(crate) num_sms: u32,
}

impl<'w> DeviceOps<'w> {
    pub fn new(world: &'w World) -> Result<Self, PutGetError> {
        let module = world.load_module("put_get")?;
        let f = |name: &str| module.function(name);
        let stream = world.stream();
        let error = stream
            .alloc_zeros::<u64>(4)
            .map_err(PutGetError::cuda("allocating the error record"))?;
        let error_ptr = crate::LocalBuffer::device_address(&error, stream);
        let ctx = world.context();
        let attribute = |attribute, what| ctx.attribute(attribute).map_err(PutGetError::cuda(what));
        // clock64() counts SM cycles: convert the timeout with this GPU's clock rate (kHz).
        let clock_khz = attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
            "reading the SM clock rate",
        )?;
        let compute_capability = ctx
            .compute_capability()
            .map_err(PutGetError::cuda("reading the compute capability"))?;
        Ok(Self {
            world,
            put: [f("put_thread")?, f("put_warp")?, f("put_block")?],
            get: [f("get_thread")?, f("get_warp")?, f("get_block")?],
            store_copy: f("store_copy")?,
            put_stores: f("put_stores")?,
            put_bulk: f("put_bulk")?,
            put_signal_ring: f("put_signal_ring")?,
            wait_signal_copy: f("wait_signal_copy")?,
            pingpong: f("pingpong")?,
            _module: module,
            error,
            error_ptr,
            timeout_cycles: (config::WAIT_TIMEOUT_MS as i64) * clock_khz as i64,
            compute_capability,
            num_sms: world.num_sms(),
        })
    }

    pub fn world(&self) -> &'w World {
        self.world
    }

    // ANCHOR: device_put
    /// Device-initiated put: a kernel of `shape` splits the put's bytes into one slice per
    /// thread, warp or block (`scope`), and each owner puts its slice with one NVSHMEM call
    /// (`nvshmem_putmem`, `nvshmemx_putmem_warp`, `nvshmemx_putmem_block`). With
    /// [`Completion::NonBlockingQuiet`] every owner issues the `_nbi` form and ends with
    /// `nvshmem_quiet`, so the data has landed when the kernel ends.
    pub fn put(
        &self,
        scope: Scope,
        completion: Completion,
        shape: LaunchShape,
        put: &Put,
    ) -> Result<(), PutGetError> {
        self.launch_transfer(&self.put[scope as usize], completion, shape, put)
    }
    // ANCHOR_END: device_put

    /// Device-initiated get, sliced as in [`DeviceOps::put`] (`nvshmem_getmem` and its warp
    /// and block forms): the data is in the local destination when the kernel ends.
    pub fn get(
        &self,
        scope: Scope,
        completion: Completion,
        shape: LaunchShape,
        get: &crate::Get,
    ) -> Result<(), PutGetError> {
        self.launch_transfer(&self.get[scope as usize], completion, shape, get)
    }

    // ANCHOR: device_store
    /// No NVSHMEM call at all: `store_copy` writes the put's source through the pointer
    /// `nvshmem_ptr` returns for its destination on its PE. Only for peers this GPU can
    /// reach with loads and stores ([`PutGetError::NotLoadStoreReachable`] otherwise). With
    /// `fenced` every thread ends with a system-scope fence, the completion a put's quiet
    /// gives; without, the kernel's end is the only completion.
    pub fn store(&self, shape: LaunchShape, put: &Put, fenced: bool) -> Result<(), PutGetError> {
        let config = shape.checked()?;
        // SAFETY: nvshmem_ptr only translates addresses; the put's destination is symmetric.
        let peer = unsafe { (self.world.nvshmem().ptr)(put.dest() as *const _, put.pe() as i32) };
        if peer.is_null() {
            return Err(PutGetError::NotLoadStoreReachable {
                me: self.world.my_pe(),
                pe: put.pe(),
            });
        }
        let (dest, source) = (peer as u64, put.source());
        let num_bytes = put.num_bytes() as u64;
        let fence = i32::from(fenced);
        let mut launch = self.world.stream().launch_builder(&self.store_copy);
        launch.arg(&dest).arg(&source).arg(&num_bytes).arg(&fence);
        // SAFETY: matches store_copy(char*, const char*, uint64_t, int); `dest` is the peer's
        // mapping of the checked destination range, `source` the checked local range.
        unsafe { launch.launch(config) }.map_err(PutGetError::cuda("launching store_copy"))?;
        Ok(())
    }
    // ANCHOR_END: device_store

    // ANCHOR: device_put_stores
    /// Device-initiated block put written as stores: each block of `shape` stores its slice
    /// through the peer pointer and completes it with one system-scope fence after a block
    /// barrier (`put_stores` in put_get.cu). Falls back to NVSHMEM's block put for a peer
    /// that is not load/store reachable. The data has landed when the kernel ends.
    pub fn put_stores(&self, shape: LaunchShape, put: &Put) -> Result<(), PutGetError> {
        self.launch_transfer(&self.put_stores, Completion::Blocking, shape, put)
    }
    // ANCHOR_END: device_put_stores

    // ANCHOR: device_put_bulk
    /// Device-initiated put through Hopper's bulk-copy (TMA) unit: each block of `shape`
    /// streams its chunks of the put through shared memory into the peer's memory (NVSHMEM's
    /// block put where the peer is not load/store reachable). The data has landed when the
    /// kernel ends. On a GPU older than Hopper: [`PutGetError::NeedsHopper`], before anything
    /// is launched.
    pub fn put_bulk(&self, shape: LaunchShape, put: &Put) -> Result<(), PutGetError> {
        check_hopper("put_bulk", self.compute_capability)?;
        // Blocking: the kernel waits for its bulk stores before it ends.
        self.launch_transfer(&self.put_bulk, Completion::Blocking, shape, put)
    }
    // ANCHOR_END: device_put_bulk

    /// Launches one of put_*, get_*, put_stores, put_bulk: they share the signature
    /// `(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi)`.
    fn launch_transfer(
        &self,
        kernel: &CudaFunction,
        completion: Completion,
        shape: LaunchShape,
        transfer: &Transfer,
    ) -> Result<(), PutGetError> {
        let config = shape.checked()?;
        if transfer.num_bytes() == 0 {
            return Ok(());
        }
        let args = TransferArgs::of(transfer);
        let (pe, nbi) = (
            transfer.pe() as i32,
            completion == Completion::NonBlockingQuiet,
        );
        let nbi = nbi as i32;
        let mut launch = self.world.stream().launch_builder(kernel);
        args.push(&mut launch);
        launch.arg(&pe).arg(&nbi);
        // SAFETY: arguments match the kernel's signature; the transfer's ranges were
        // checked when it was made, and it borrows its buffers.
        unsafe { launch.launch(config) }
            .map_err(PutGetError::cuda("launching a put/get kernel"))?;
        Ok(())
    }
}

/// The arguments every transfer kernel starts with, `(dest, source, num_bytes)`, held by
/// value so that the launch can push references to them.
pub(crate) struct TransferArgs {
    dest: u64,
    source: u64,
    num_bytes: u64,
}

impl TransferArgs {
    pub(crate) fn of(transfer: &Transfer) -> Self {
        Self {
            dest: transfer.dest(),
            source: transfer.source(),
            num_bytes: transfer.num_bytes() as u64,
        }
    }

    pub(crate) fn push<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        launch
            .arg(&self.dest)
            .arg(&self.source)
            .arg(&self.num_bytes);
    }
}

impl Drop for DeviceOps<'_> {
    fn drop(&mut self) {
        // The error record may still be written by a kernel in flight.
        let _ = self.world.stream().synchronize();
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
    fn launch_shapes_are_checked() {
        let one_per_sm = LaunchShape {
            num_blocks: 132,
            threads_per_block: crate::config::THREADS_PER_BLOCK,
        };
        assert!(one_per_sm.checked().is_ok());
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
    fn bulk_copies_are_refused_before_hopper() {
        assert!(check_hopper("put_bulk", (9, 0)).is_ok());
        assert!(check_hopper("put_bulk", (10, 0)).is_ok());
        let err = check_hopper("put_bulk", (8, 6)).unwrap_err().to_string();
        assert!(err.contains("this GPU is sm_86"), "{err}");
        assert!(check_hopper("put_bulk", (8, 0)).is_err());
    }
}
