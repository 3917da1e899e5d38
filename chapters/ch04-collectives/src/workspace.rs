//! The memory a communicator owns and the launch of its kernels.
//!
//! Layout of the one symmetric allocation (the same on every PE; see coll_common.cuh for who
//! writes what):
//!
//! ```text
//! ready   MAX_PES x u64                         ready[p]: the last call PE p announced
//! done    MAX_PES x MAX_BLOCKS x u64            done[p][b]: PE p's block b's last ticket
//! counts  2 x MAX_PES x MAX_PES x u64           all-to-all-v count rows, by call parity
//! ll      2 x n_pes x ll_slot_bytes             LL lines, by call parity and sender
//!         ll_slot_bytes = 2 x ll_max_bytes (rounded up to 16): half of each line is flag
//! ```
//!
//! Beside it, per PE: `state` (device: failed, and the last finished call in MAX_BLOCKS slots,
//! one per block of a launch: [`STATE_WORDS`]) and the
//! error record (host-mapped pinned memory, so the host reads it without synchronising).

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use cudarc::driver::{CudaSlice, sys};

use crate::config::{CollectivesConfig, MAX_BLOCKS, MAX_PES};
use crate::error::{CollError, DeviceFailure, DeviceFailureKind};

// The communicator as every kernel receives it (by value, first argument) is `Workspace`
// of the host/device contract (kernels/contract/defs.rs): one definition for Rust and CUDA.
pub use kernels::contract::{STATE_WORDS, Workspace};

const READY_BYTES: usize = MAX_PES * 8;
const DONE_BYTES: usize = MAX_PES * MAX_BLOCKS * 8;
const COUNTS_BYTES: usize = 2 * MAX_PES * MAX_PES * 8;

/// Bytes of the symmetric allocation for `n_pes` PEs and LL payloads up to `ll_max_bytes`.
pub fn symmetric_bytes(n_pes: usize, ll_max_bytes: usize) -> usize {
    ll_offset() + 2 * n_pes * ll_slot_bytes(ll_max_bytes)
}
fn ll_offset() -> usize {
    (READY_BYTES + DONE_BYTES + COUNTS_BYTES).next_multiple_of(256)
}
fn ll_slot_bytes(ll_max_bytes: usize) -> usize {
    2 * ll_max_bytes.next_multiple_of(16)
}

/// `len` words of pinned host memory that the GPU reads and writes through its mapping: a
/// kernel leaves a result there (a failure record, a count) and the host reads it at any
/// time, without synchronising a stream.
pub struct HostMapped {
    host: *mut u64,
    device: u64,
    len: usize,
}

// SAFETY: pinned host memory is valid from every thread; host accesses are volatile, the
// GPU's go through its own mapping.
unsafe impl Send for HostMapped {}
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// `len` zeroed u64 words.
    pub fn new(len: usize) -> Result<Self, CollError> {
        // SAFETY: a fresh pinned allocation, mapped into the device's address space.
        let host = unsafe {
            cudarc::driver::result::malloc_host(len.max(1) * 8, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        }
        .map_err(CollError::cuda("allocating host-mapped memory"))? as *mut u64;
        // SAFETY: `host` holds `len` words.
        unsafe { std::ptr::write_bytes(host, 0, len) };
        let mut device = 0;
        // SAFETY: `host` was allocated with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0) }
            .result()
            .map_err(CollError::cuda("mapping host memory into the GPU"))?;
        Ok(Self { host, device, len })
    }

    /// The address kernels use.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    /// Word `i`, as the GPU last left it.
    pub fn read(&self, i: usize) -> u64 {
        assert!(i < self.len, "word {i} of {}", self.len);
        // SAFETY: in bounds (checked); volatile because the GPU writes it.
        unsafe { std::ptr::read_volatile(self.host.add(i)) }
    }

    pub fn write(&self, i: usize, value: u64) {
        assert!(i < self.len, "word {i} of {}", self.len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_volatile(self.host.add(i), value) }
    }

    /// 32-bit word `i` (kernels that count in int32 write halves of the u64 words).
    pub fn read_i32(&self, i: usize) -> i32 {
        assert!(i < 2 * self.len, "i32 {i} of {}", 2 * self.len);
        // SAFETY: in bounds (checked); volatile because the GPU writes it.
        unsafe { std::ptr::read_volatile((self.host as *const i32).add(i)) }
    }

    pub fn write_i32(&self, i: usize, value: i32) {
        assert!(i < 2 * self.len, "i32 {i} of {}", 2 * self.len);
        // SAFETY: in bounds (checked).
        unsafe { std::ptr::write_volatile((self.host as *mut i32).add(i), value) }
    }

    /// Words `0..len`, read after word 0 (which the GPU writes last, after a system fence).
    pub fn snapshot<const N: usize>(&self) -> [u64; N] {
        let first = self.read(0);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        std::array::from_fn(|i| if i == 0 { first } else { self.read(i) })
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; its users synchronised before dropping it.
        let _ = unsafe { cudarc::driver::result::free_host(self.host as *mut c_void) };
    }
}

/// What a communicator allocates: the symmetric flags and scratch, the local state and the
/// error record, and the kernel view of all of them.
pub(crate) struct Memory<W: Deref<Target = World>> {
    pub symmetric: SymmetricBuffer<W, u8>,
    /// Read and written by the kernels only (through `workspace.state`); held to keep it alive.
    pub _state: CudaSlice<u64>,
    /// Host-mapped [8] u64: the failure record (see `Workspace::error`).
    pub record: HostMapped,
    pub workspace: Workspace,
}

impl<W: Deref<Target = World>> Memory<W> {
    /// Collective. Zeroes this PE's flags, then waits for every PE to have done so: after the
    /// barrier no peer can still see garbage, and no peer has written yet.
    pub(crate) fn new(world: W, config: &CollectivesConfig) -> Result<Self, CollError> {
        let (my_pe, n_pes) = (world.my_pe(), world.n_pes());
        if n_pes > MAX_PES {
            return Err(CollError::TooManyPes {
                n_pes,
                max: MAX_PES,
            });
        }
        let clock_khz = world
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .map_err(CollError::cuda("reading the SM clock rate"))?;
        let stream = world.stream().clone();
        let state = stream
            .alloc_zeros::<u64>(STATE_WORDS)
            .map_err(CollError::cuda("allocating the call state"))?;
        let record = HostMapped::new(8)?;
        let own_bytes = symmetric_bytes(n_pes, config.ll_max_bytes);
        let symmetric = SymmetricBuffer::<W, u8>::new(world, own_bytes + config.extra_bytes)?;
        symmetric.fill_bytes(0)?;
        symmetric.world().barrier_all()?;
        let base = symmetric.device_ptr();
        let peer_delta = peer_deltas(symmetric.world(), base)?;
        let (state_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&state, &stream);
        let workspace = Workspace {
            state: state_ptr,
            error: record.device_ptr(),
            ready: base,
            done: base + READY_BYTES as u64,
            counts: base + (READY_BYTES + DONE_BYTES) as u64,
            ll: base + ll_offset() as u64,
            ll_slot_bytes: ll_slot_bytes(config.ll_max_bytes) as u64,
            timeout_cycles: config.timeout_ms as i64 * clock_khz as i64,
            my_pe: my_pe as i32,
            n_pes: n_pes as i32,
            peer_delta,
        };
        Ok(Self {
            symmetric,
            _state: state,
            record,
            workspace,
        })
    }

    /// `Err` unless every PE maps `ptr` (symmetric) at the offsets the kernels add: they
    /// compute peer addresses from `peer_delta` instead of calling nvshmem_ptr per access.
    pub(crate) fn check_peer_mapping(&self, ptr: u64) -> Result<(), CollError> {
        let world = self.symmetric.world();
        let deltas = peer_deltas(world, ptr)?;
        match (0..world.n_pes()).find(|&p| deltas[p] != self.workspace.peer_delta[p]) {
            None => Ok(()),
            Some(pe) => Err(CollError::invalid(
                "collective",
                format!(
                    "pe {pe} maps address {ptr:#x} at offset {} but the communicator's workspace \
                     at offset {}: NVSHMEM's heap is not mapped as one range",
                    deltas[pe], self.workspace.peer_delta[pe]
                ),
            )),
        }
    }

    /// `Err` with the kernel's account if any kernel of this communicator failed. Cheap (one
    /// read of pinned memory): every call makes it first.
    pub(crate) fn check(&self, timeout_ms: u64) -> Result<(), CollError> {
        let word: [u64; 8] = self.record.snapshot();
        if word[0] == 0 {
            return Ok(());
        }
        let me = self.workspace.my_pe as usize;
        let kind = DeviceFailureKind::from_code(word[4])
            .map_err(|code| CollError::UnknownFailureKind { me, code })?;
        // Every kind named WAIT_* is a wait for a peer that timed out: the peer is dead or
        // stalled, so the collective teardown must be skipped (ch01's `mark_broken`).
        if kind.device_name().starts_with("WAIT_") {
            ch01_bootstrap::world::mark_broken();
        }
        Err(CollError::Device(DeviceFailure {
            me,
            kind,
            pe: word[1],
            expected: word[2],
            seen: word[3],
            block: word[5],
            call: word[6],
            timeout_ms,
        }))
    }
}

/// nvshmem_ptr(ptr, p) - ptr for every PE p: where each peer's copy of the symmetric heap
/// appears in our address space. Every PE must be reachable by loads and stores (one NVLink
/// domain): chapter 5 is where PEs on other nodes come in.
fn peer_deltas(world: &World, ptr: u64) -> Result<[i64; MAX_PES], CollError> {
    let mut deltas = [0i64; MAX_PES];
    for (pe, delta) in deltas.iter_mut().enumerate().take(world.n_pes()) {
        // SAFETY: nvshmem_ptr only translates addresses.
        let peer = unsafe { (world.nvshmem().ptr)(ptr as *const c_void, pe as i32) } as u64;
        if peer == 0 {
            return Err(ch03_put_get::PutGetError::NotLoadStoreReachable {
                me: world.my_pe(),
                pe,
            }
            .into());
        }
        *delta = peer.wrapping_sub(ptr) as i64;
    }
    Ok(deltas)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_matches_the_kernel_struct() {
        // coll::Workspace: 7 x 8-byte fields, a long long, two ints, MAX_PES x int64_t.
        assert_eq!(std::mem::size_of::<Workspace>(), 72 + 8 * MAX_PES);
        assert_eq!(std::mem::offset_of!(Workspace, timeout_cycles), 56);
        assert_eq!(std::mem::offset_of!(Workspace, n_pes), 68);
    }

    #[test]
    fn layout_regions_do_not_overlap_and_ll_is_aligned() {
        assert!(ll_offset() >= READY_BYTES + DONE_BYTES + COUNTS_BYTES);
        assert_eq!(ll_offset() % 256, 0);
        assert_eq!(ll_slot_bytes(1000), 2016);
        assert_eq!(symmetric_bytes(8, 512 << 10), ll_offset() + 16 * (1 << 20));
    }
}
