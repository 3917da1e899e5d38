//! An RMA group: PEs that reach each other through NVSHMEM's RMA calls only (this PE's rail,
//! or every PE for the flat algorithms), with its symmetric flags and landing space, its call
//! state and its failure record. The kernels are kernels/cuda/rma_*.cu; the protocol is
//! written down at the top of kernels/cuda/rma.cuh.
//!
//! Layout of the one symmetric allocation (the same on every PE):
//!
//! ```text
//! ready    MAX_GROUP x u64                               ready[i]: calls member i entered
//! done     RMA_STEPS x MAX_GROUP x MAX_RMA_BLOCKS x u64   tickets by step, sender, block
//! counts   MAX_GROUP x MAX_GROUP x u64                   all-to-all-v rows of counts
//! scratch  scratch_bytes, 256-aligned                    reduce-scatter parts, a2av slots
//! ```

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::workspace::read_failure;
use ch04_collectives::{HostMapped, Kernels, LaunchSpec};
use cudarc::driver::{CudaSlice, sys};

use crate::config::{MAX_GROUP, MAX_RMA_BLOCKS, RMA_STEPS, RMA_THREADS};
use crate::error::{InterNodeError, RemoteFailure};
use crate::layout::{Layout, Strided};

pub use kernels::contract::{RmaWorkspace, STATE_WORDS};

const READY_BYTES: usize = MAX_GROUP * 8;
const DONE_BYTES: usize = RMA_STEPS * MAX_GROUP * MAX_RMA_BLOCKS * 8;
const COUNTS_BYTES: usize = MAX_GROUP * MAX_GROUP * 8;

/// Where the landing space starts in the group's allocation.
pub fn scratch_offset() -> usize {
    (READY_BYTES + DONE_BYTES + COUNTS_BYTES).next_multiple_of(256)
}

/// Bytes of a group's symmetric allocation with `scratch_bytes` of landing space.
pub fn group_bytes(scratch_bytes: usize) -> usize {
    scratch_offset() + scratch_bytes.next_multiple_of(16)
}

/// Bytes an RMA kernel's block should send per member: a few NVSHMEM puts in flight per
/// block keep a link (NVLink or InfiniBand) busy, and small calls stay on few blocks.
const BYTES_PER_BLOCK: usize = 64 << 10;

// ANCHOR: rma_blocks
/// Blocks of an RMA launch that sends `bytes_per_member` to each member: one per 64 KiB, at
/// most MAX_RMA_BLOCKS and `num_sms` (the job's smallest share of a GPU, so that every member
/// launches the same grid: tickets are matched block by block).
pub fn rma_blocks(bytes_per_member: usize, num_sms: u32) -> u32 {
    let most = (num_sms as usize).clamp(1, MAX_RMA_BLOCKS);
    bytes_per_member.div_ceil(BYTES_PER_BLOCK).clamp(1, most) as u32
}
// ANCHOR_END: rma_blocks

/// One RMA group of this PE and the memory it owns.
pub struct RmaGroup<W: Deref<Target = World>> {
    symmetric: SymmetricBuffer<W, u8>,
    /// Read and written by the kernels only (through `workspace.state`); held to keep it alive.
    _state: CudaSlice<u64>,
    record: HostMapped,
    workspace: RmaWorkspace,
    team: Strided,
    layout: Layout,
    name: &'static str,
    timeout_ms: u64,
}

impl<W: Deref<Target = World>> RmaGroup<W> {
    /// Collective over the world (every PE allocates at once, each for its own group):
    /// `team` is this PE's group, `name` says which in messages (`rail`, `world`).
    pub fn new(
        world: W,
        team: Strided,
        layout: Layout,
        name: &'static str,
        scratch_bytes: usize,
        timeout_ms: u64,
    ) -> Result<Self, InterNodeError> {
        let me = team.index_of(world.my_pe()).ok_or_else(|| {
            InterNodeError::Topology(format!(
                "pe {} is not in its {name} group {team:?}",
                world.my_pe()
            ))
        })?;
        if team.size > MAX_GROUP {
            let what = format!("a {name} group of {} PEs: at most {MAX_GROUP}", team.size);
            return Err(InterNodeError::Topology(what));
        }
        let clock_khz = world
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .map_err(InterNodeError::cuda("reading the SM clock rate"))?;
        let stream = world.stream().clone();
        let state = stream
            .alloc_zeros::<u64>(STATE_WORDS)
            .map_err(InterNodeError::cuda("allocating the call state"))?;
        let record = HostMapped::new(8)?;
        let symmetric = SymmetricBuffer::<W, u8>::new(world, group_bytes(scratch_bytes))?;
        symmetric.fill_bytes(0)?;
        // No member may signal into our flags before they are zero.
        symmetric.world().barrier_all()?;
        let base = symmetric.device_ptr();
        let (state_ptr, _) = cudarc::driver::DevicePtr::device_ptr(&state, &stream);
        let workspace = RmaWorkspace {
            state: state_ptr,
            error: record.device_ptr(),
            ready: base,
            done: base + READY_BYTES as u64,
            counts: base + (READY_BYTES + DONE_BYTES) as u64,
            scratch: base + scratch_offset() as u64,
            scratch_bytes: scratch_bytes.next_multiple_of(16) as u64,
            timeout_cycles: timeout_ms as i64 * clock_khz as i64,
            start: team.start as i32,
            stride: team.stride as i32,
            size: team.size as i32,
            me: me as i32,
        };
        Ok(Self {
            symmetric,
            _state: state,
            record,
            workspace,
            team,
            layout,
            name,
            timeout_ms,
        })
    }

    /// The group as its kernels see it: a strided set of world PEs and this PE's own memory,
    /// no address of any other PE.
    pub fn workspace(&self) -> RmaWorkspace {
        self.workspace
    }
    pub fn team(&self) -> Strided {
        self.team
    }
    pub fn world(&self) -> &World {
        self.symmetric.world()
    }

    /// `Err` with the kernel's account if a kernel of this group failed (a wait across nodes
    /// that timed out, counts that do not add up), naming PEs by node and local index.
    pub fn check(&self) -> Result<(), InterNodeError> {
        let me = self.world().my_pe();
        match read_failure(&self.record, me, self.timeout_ms)? {
            None => Ok(()),
            Some(failure) => Err(InterNodeError::Remote(RemoteFailure {
                failure,
                layout: self.layout,
                group: self.name,
            })),
        }
    }

    /// Launches `kernel` over this group with `num_blocks` blocks; `args` after the workspace.
    ///
    /// # Safety
    /// `args` must be the kernel's parameters after its `RmaWorkspace`, alive for the call.
    pub unsafe fn launch(
        &self,
        kernels: &Kernels,
        kernel: &'static str,
        num_blocks: u32,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), InterNodeError> {
        self.check()?;
        let spec = LaunchSpec {
            kernel,
            num_blocks,
            threads_per_block: RMA_THREADS,
            shared_mem_bytes: 0,
        };
        let mut all: Vec<*mut c_void> = vec![&self.workspace as *const RmaWorkspace as *mut c_void];
        all.extend_from_slice(args);
        // SAFETY: the caller vouches for `args`; the workspace is the kernel's first parameter.
        Ok(unsafe { kernels.launch(&spec, stream, &mut all) }?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_matches_the_kernel_struct() {
        // rma::RmaWorkspace: 6 pointers, a u64, a long long, four ints.
        assert_eq!(std::mem::size_of::<RmaWorkspace>(), 80);
        assert_eq!(std::mem::offset_of!(RmaWorkspace, timeout_cycles), 56);
        assert_eq!(std::mem::offset_of!(RmaWorkspace, me), 76);
    }

    #[test]
    fn regions_do_not_overlap_and_the_scratch_is_aligned() {
        assert!(scratch_offset() >= READY_BYTES + DONE_BYTES + COUNTS_BYTES);
        assert_eq!(scratch_offset() % 256, 0);
        assert_eq!(group_bytes(1000), scratch_offset() + 1008);
    }

    #[test]
    fn grids_follow_the_bytes_and_stay_within_the_limits() {
        assert_eq!(rma_blocks(0, 132), 1);
        assert_eq!(rma_blocks(64 << 10, 132), 1);
        assert_eq!(rma_blocks((64 << 10) + 1, 132), 2);
        assert_eq!(rma_blocks(1 << 30, 132), MAX_RMA_BLOCKS as u32);
        assert_eq!(rma_blocks(1 << 30, 16), 16);
        assert_eq!(rma_blocks(1 << 30, 0), 1);
    }
}
