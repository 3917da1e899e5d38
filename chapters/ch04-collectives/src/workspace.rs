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
    /// World PE of each member, in member order (`Workspace::my_pe` indexes it).
    pub members: Vec<usize>,
}

impl<W: Deref<Target = World>> Memory<W> {
    /// Collective. Zeroes this PE's flags, then waits for every PE to have done so: after the
    /// barrier no peer can still see garbage, and no peer has written yet.
    pub(crate) fn new(
        world: W,
        members: Vec<usize>,
        config: &CollectivesConfig,
    ) -> Result<Self, CollError> {
        let my_pe = member_index(&members, world.my_pe(), world.n_pes())?;
        let n_pes = members.len();
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
        let peer_delta = peer_deltas(symmetric.world(), &members, base)?;
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
            members,
        })
    }

    /// `Err` unless every member maps `ptr` (symmetric) at the offsets the kernels add: they
    /// compute peer addresses from `peer_delta` instead of calling nvshmem_ptr per access.
    pub(crate) fn check_peer_mapping(&self, ptr: u64) -> Result<(), CollError> {
        let world = self.symmetric.world();
        let deltas = peer_deltas(world, &self.members, ptr)?;
        match (0..self.members.len()).find(|&i| deltas[i] != self.workspace.peer_delta[i]) {
            None => Ok(()),
            Some(i) => Err(CollError::invalid(
                "collective",
                format!(
                    "pe {} maps address {ptr:#x} at offset {} but the communicator's workspace \
                     at offset {}: NVSHMEM's heap is not mapped as one range",
                    self.members[i], deltas[i], self.workspace.peer_delta[i]
                ),
            )),
        }
    }

    /// `Err` with the kernel's account if any kernel of this communicator failed. Cheap (one
    /// read of pinned memory): every call makes it first. The kernels number PEs as members;
    /// the account names world PEs.
    pub(crate) fn check(&self, timeout_ms: u64) -> Result<(), CollError> {
        let me = self.members[self.workspace.my_pe as usize];
        match read_failure(&self.record, me, timeout_ms)? {
            None => Ok(()),
            Some(mut failure) => {
                if let Some(&pe) = self.members.get(failure.pe as usize) {
                    failure.pe = pe as u64;
                }
                Err(CollError::Device(failure))
            }
        }
    }
}

/// The failure a kernel left in `record` (the host-mapped failure record, FAILURE_WORDS
/// words: see `Workspace::error`), if any, as PE `me` reports it. A wait for a peer that
/// timed out (every kind named WAIT_*) means the peer is dead or stalled, so this marks the
/// job broken: the collective teardown must be skipped (ch01's `mark_broken`).
pub fn read_failure(
    record: &HostMapped,
    me: usize,
    timeout_ms: u64,
) -> Result<Option<DeviceFailure>, CollError> {
    let word: [u64; 8] = record.snapshot();
    if word[0] == 0 {
        return Ok(None);
    }
    let kind = DeviceFailureKind::from_code(word[4])
        .map_err(|code| CollError::UnknownFailureKind { me, code })?;
    if kind.device_name().starts_with("WAIT_") {
        ch01_bootstrap::world::mark_broken();
    }
    Ok(Some(DeviceFailure {
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

/// This PE's index in `members` (world PEs), or why the list cannot be a communicator's:
/// empty, longer than MAX_PES, a PE past the job, a PE twice, or this PE missing.
pub fn member_index(members: &[usize], my_pe: usize, n_pes: usize) -> Result<usize, CollError> {
    if members.len() > MAX_PES {
        return Err(CollError::TooManyPes {
            n_pes: members.len(),
            max: MAX_PES,
        });
    }
    let bad = |what: String| Err(CollError::invalid("communicator", what));
    if let Some(&pe) = members.iter().find(|&&pe| pe >= n_pes) {
        return bad(format!("member pe {pe} is past the job's PEs 0..{n_pes}"));
    }
    if let Some((i, &pe)) = members
        .iter()
        .enumerate()
        .find(|(i, pe)| members[..*i].contains(pe))
    {
        return bad(format!("pe {pe} is listed twice (again as member {i})"));
    }
    match members.iter().position(|&pe| pe == my_pe) {
        Some(i) => Ok(i),
        None => bad(format!("pe {my_pe} is not among the members {members:?}")),
    }
}

/// nvshmem_ptr(ptr, m) - ptr for every member m: where each member's copy of the symmetric
/// heap appears in our address space. Every member must be reachable by loads and stores
/// (one NVLink domain); NVSHMEM is asked about members only, never about another PE
/// (chapter 5's nodes rely on that: [`member_deltas`] is the rule, with NVSHMEM's call).
fn peer_deltas(world: &World, members: &[usize], ptr: u64) -> Result<[i64; MAX_PES], CollError> {
    member_deltas(members, world.my_pe(), ptr, |ptr, pe| {
        // SAFETY: nvshmem_ptr only translates addresses.
        unsafe { (world.nvshmem().ptr)(ptr as *const c_void, pe as i32) as u64 }
    })
}

/// `translate(ptr, pe) - ptr` for every member, in member order (0 past the last): the
/// offsets the kernels add to reach a member's copy. `translate` is nvshmem_ptr; it is called
/// once per member and never for any other PE. A member it cannot reach (null) is an error.
pub fn member_deltas(
    members: &[usize],
    my_pe: usize,
    ptr: u64,
    translate: impl Fn(u64, usize) -> u64,
) -> Result<[i64; MAX_PES], CollError> {
    let mut deltas = [0i64; MAX_PES];
    for (delta, &pe) in deltas.iter_mut().zip(members) {
        let peer = translate(ptr, pe);
        if peer == 0 {
            return Err(ch03_put_get::PutGetError::NotLoadStoreReachable { me: my_pe, pe }.into());
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
    fn members_are_checked_and_only_members_are_translated() {
        assert_eq!(member_index(&[2, 3], 3, 4).unwrap(), 1);
        for (members, why) in [
            (vec![0, 1], "not among"),
            (vec![3, 9], "past the job"),
            (vec![3, 3], "listed twice"),
        ] {
            let err = member_index(&members, 3, 4).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let asked = std::cell::RefCell::new(Vec::new());
        let deltas = member_deltas(&[4, 5], 5, 0x1000, |ptr, pe| {
            asked.borrow_mut().push(pe);
            ptr + 0x100 * pe as u64
        })
        .unwrap();
        assert_eq!(*asked.borrow(), vec![4, 5]);
        assert_eq!(&deltas[..3], &[0x400, 0x500, 0]);
        let err = member_deltas(&[4, 5], 5, 0x1000, |_, _| 0).unwrap_err();
        assert!(err.to_string().contains("4"), "{err}");
    }

    #[test]
    fn layout_regions_do_not_overlap_and_ll_is_aligned() {
        assert!(ll_offset() >= READY_BYTES + DONE_BYTES + COUNTS_BYTES);
        assert_eq!(ll_offset() % 256, 0);
        assert_eq!(ll_slot_bytes(1000), 2016);
        assert_eq!(symmetric_bytes(8, 512 << 10), ll_offset() + 16 * (1 << 20));
    }
}
