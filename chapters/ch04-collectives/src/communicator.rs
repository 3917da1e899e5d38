//! `Communicator`: the collectives, each a checked call that launches one kernel (rs_ag, two).
//!
//! Two layers. The raw methods (`*_raw`) take device addresses and a stream, for callers that
//! hold pointers (the Python package); they check everything that can be checked about an
//! address: that it is symmetric for its whole length, that sizes fit. The typed methods take
//! chapter 2's `SymmetricBuffer`s and run on the world's stream.

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{check_sizes_agree, size_checks_enabled};
use ch03_put_get::check_symmetric_range;
use cudarc::driver::{DeviceRepr, sys};

use crate::algorithm::{Algorithm, Collective, DType, Plan, choose, plan};
use crate::config::CollectivesConfig;
use crate::error::CollError;
use crate::launch::{Kernels, LaunchSpec};
use crate::workspace::{Memory, Workspace, symmetric_bytes};

/// Element types the reductions take (summed in fp32).
pub trait Reducible: DeviceRepr {
    const DTYPE: DType;
}
impl Reducible for f32 {
    const DTYPE: DType = DType::F32;
}
impl Reducible for half::bf16 {
    const DTYPE: DType = DType::Bf16;
}

/// The chapter's kernel modules (kernels/cuda/coll_*.cu).
const MODULES: [&str; 5] = [
    "coll_sync",
    "coll_broadcast",
    "coll_all_gather",
    "coll_reduce",
    "coll_all_to_all",
];

/// One call as the checks see it.
struct Call<'a> {
    collective: Collective,
    algorithm: Option<Algorithm>,
    /// The call's size as nccl-tests counts it (see `SIZE_TABLE`).
    size_bytes: usize,
    dtype: Option<DType>,
    /// (address, bytes) ranges that must lie in the symmetric heap.
    symmetric: &'a [(u64, usize)],
}

fn arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

// ANCHOR: communicator
/// Collectives over every PE of the world, with their own symmetric flags and scratch.
/// Every PE must make the same calls, in the same order, with the same sizes: the calls are
/// numbered on the device, and call e on one PE meets call e on the others.
pub struct Communicator<W: Deref<Target = World>> {
    memory: Memory<W>,
    kernels: Kernels,
    config: CollectivesConfig,
    num_sms: u32,
}
// ANCHOR_END: communicator

impl<W: Deref<Target = World>> Communicator<W> {
    /// Collective: allocates the workspace on every PE and loads the kernels.
    pub fn new(world: W, config: CollectivesConfig) -> Result<Self, CollError> {
        let members = (0..world.n_pes()).collect();
        Self::with_members(world, members, config)
    }

    /// Collective over the world (every PE allocates the workspace at once), but each PE's
    /// communicator spans only `members`: world PEs, in the order its kernels number them
    /// (member i is PE i of every call). Every member must pass the same list; PEs of
    /// disjoint lists (the nodes of chapter 5) call collectives of their own at the same
    /// time. Only members are reached, by peer pointers: nothing is asked of NVSHMEM about
    /// any other PE.
    pub fn with_members(
        world: W,
        members: Vec<usize>,
        config: CollectivesConfig,
    ) -> Result<Self, CollError> {
        let kernels = Kernels::load(&world, &MODULES)?;
        let num_sms = kernels.num_sms();
        let memory = Memory::new(world, members, &config)?;
        Ok(Self {
            memory,
            kernels,
            config,
            num_sms,
        })
    }

    pub fn world(&self) -> &World {
        self.memory.symmetric.world()
    }
    /// The PEs of the communicator, as world PEs, in member order.
    pub fn members(&self) -> &[usize] {
        &self.memory.members
    }
    /// How many PEs the communicator spans (every PE of the world, unless made
    /// `with_members`).
    pub fn n_pes(&self) -> usize {
        self.memory.members.len()
    }
    /// This PE's index among the members.
    pub fn my_index(&self) -> usize {
        self.memory.workspace.my_pe as usize
    }
    pub fn config(&self) -> &CollectivesConfig {
        &self.config
    }

    /// The communicator as its kernels see it, for kernels of a caller that build on it
    /// (they must follow the protocol of coll_common.cuh: begin_call and end_call).
    pub fn workspace(&self) -> Workspace {
        self.memory.workspace
    }

    /// The symmetric bytes after the communicator's own (`CollectivesConfig::extra_bytes`):
    /// (device address, length). Zeroed at creation, on every PE.
    pub fn extra_region(&self) -> (u64, usize) {
        let own = symmetric_bytes(self.n_pes(), self.config.ll_max_bytes) as u64;
        (
            self.memory.symmetric.device_ptr() + own,
            self.config.extra_bytes,
        )
    }

    /// `Err` with the device's account if a kernel of this communicator failed (a wait that
    /// timed out, all-to-all-v counts that do not add up). Every call checks it first; call it
    /// after synchronising to learn about the last call.
    pub fn check(&self) -> Result<(), CollError> {
        self.memory.check(self.config.timeout_ms)
    }

    /// The algorithm and launch shape a call would use; `None` for a call with nothing to do.
    pub fn plan(
        &self,
        collective: Collective,
        algorithm: Option<Algorithm>,
        size_bytes: usize,
        dtype: Option<DType>,
    ) -> Result<Plan, CollError> {
        let n_pes = self.n_pes();
        let algorithm = algorithm
            .unwrap_or_else(|| choose(collective, size_bytes, n_pes, self.config.ll_max_bytes));
        plan(
            collective,
            algorithm,
            size_bytes,
            n_pes,
            dtype,
            self.config.ll_max_bytes,
            self.num_sms,
        )
    }

    /// Everything before a launch: the sticky failure, symmetric ranges, the plan, and (with
    /// size checks on, outside stream capture) that every PE passed the same size.
    fn prepare(&self, call: Call<'_>, stream: sys::CUstream) -> Result<Option<Plan>, CollError> {
        self.check()?;
        let world = self.world();
        for &(ptr, num_bytes) in call.symmetric {
            if num_bytes > 0 {
                check_symmetric_range(world, ptr, num_bytes as u64)?;
                self.memory.check_peer_mapping(ptr)?;
            }
        }
        let plan = self.plan(call.collective, call.algorithm, call.size_bytes, call.dtype)?;
        // SAFETY: a live stream of this context.
        let capturing = unsafe { cudarc::driver::result::stream::is_capturing(stream) }
            .map_err(CollError::cuda("querying stream capture"))?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if size_checks_enabled() && !capturing {
            check_sizes_agree(world, call.size_bytes as u64)?;
        }
        // Zero bytes is nothing to do on every PE alike (sizes agree), so skipping the launch
        // keeps the call counts equal. The barrier has no size, and all-to-all-v's sizes
        // are only known on the device.
        let sized = !matches!(call.collective, Collective::SyncAll | Collective::AllToAllV);
        Ok((!sized || call.size_bytes > 0).then_some(plan))
    }

    /// Checks `call`, then launches its kernel with `args` (the Workspace first), and the
    /// plan's second kernel, if any, with the same arguments.
    fn run(
        &self,
        call: Call<'_>,
        stream: sys::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), CollError> {
        let Some(plan) = self.prepare(call, stream)? else {
            return Ok(());
        };
        self.world()
            .context()
            .bind_to_thread()
            .map_err(CollError::cuda("binding the context"))?;
        // SAFETY: every caller passes the arguments of `plan.kernel` in its order.
        unsafe { self.kernels.launch(&(&plan).into(), stream, args) }?;
        if let Some(kernel) = plan.then {
            let spec = LaunchSpec {
                kernel,
                ..(&plan).into()
            };
            // SAFETY: a plan's second kernel takes the first one's arguments.
            unsafe { self.kernels.launch(&spec, stream, args) }?;
        }
        Ok(())
    }

    // ANCHOR: sync_all_raw
    /// The signal barrier: returns (in stream order) once every PE's stream reached it. Does
    /// not complete puts in flight (`nvshmemx_barrier_all_on_stream` does).
    pub fn sync_all_raw(&self, stream: sys::CUstream) -> Result<(), CollError> {
        let call = Call {
            collective: Collective::SyncAll,
            algorithm: None,
            size_bytes: 0,
            dtype: None,
            symmetric: &[],
        };
        self.run(call, stream, &mut [arg(&self.memory.workspace)])
    }
    // ANCHOR_END: sync_all_raw

    /// `root`'s `num_bytes` at `input` into every PE's `out`.
    /// out, input: symmetric [num_bytes].
    pub fn broadcast_raw(
        &self,
        out: u64,
        input: u64,
        num_bytes: usize,
        root: usize,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        if root >= self.n_pes() {
            // The root is a member index (a world PE when the communicator spans the world).
            let n_pes = self.n_pes();
            return Err(
                ch02_symmetric_memory::SymmetricError::PeOutOfRange { pe: root, n_pes }.into(),
            );
        }
        let call = Call {
            collective: Collective::Broadcast,
            algorithm,
            size_bytes: num_bytes,
            dtype: None,
            symmetric: &[(out, num_bytes), (input, num_bytes)],
        };
        let (num_bytes, root) = (num_bytes as u64, root as i32);
        let ws = &self.memory.workspace;
        self.run(
            call,
            stream,
            &mut [arg(ws), arg(&input), arg(&out), arg(&num_bytes), arg(&root)],
        )
    }

    /// Every PE's `num_bytes` at `input` into every PE's `out`, PE p's at out + p * num_bytes.
    /// out: symmetric [n_pes * num_bytes]; input: symmetric [num_bytes].
    pub fn all_gather_raw(
        &self,
        out: u64,
        input: u64,
        num_bytes: usize,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        self.exchange_raw(
            Collective::AllGather,
            out,
            input,
            num_bytes,
            num_bytes,
            algorithm,
            stream,
        )
    }

    /// Block q (num_bytes at input + q * num_bytes) of every PE to PE q, landing at
    /// out + p * num_bytes for sender p. out, input: symmetric [n_pes * num_bytes].
    pub fn all_to_all_raw(
        &self,
        out: u64,
        input: u64,
        num_bytes: usize,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        let n = self.n_pes();
        self.exchange_raw(
            Collective::AllToAll,
            out,
            input,
            n * num_bytes,
            num_bytes,
            algorithm,
            stream,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn exchange_raw(
        &self,
        collective: Collective,
        out: u64,
        input: u64,
        input_bytes: usize,
        num_bytes: usize,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        let out_bytes = self.n_pes() * num_bytes;
        let call = Call {
            collective,
            algorithm,
            size_bytes: out_bytes,
            dtype: None,
            symmetric: &[(out, out_bytes), (input, input_bytes)],
        };
        let num_bytes = num_bytes as u64;
        let ws = &self.memory.workspace;
        self.run(
            call,
            stream,
            &mut [arg(ws), arg(&input), arg(&out), arg(&num_bytes)],
        )
    }

    // ANCHOR: all_reduce_raw
    /// out[i] = sum over PEs of input[i], i < count, summed in fp32 in PE order. In place
    /// (out == input) is allowed. out, input: symmetric [count] dtype.
    pub fn all_reduce_raw(
        &self,
        out: u64,
        input: u64,
        count: usize,
        dtype: DType,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        let num_bytes = count * dtype.size();
        self.reduce_raw(
            Collective::AllReduce,
            out,
            input,
            num_bytes,
            num_bytes,
            count,
            dtype,
            algorithm,
            stream,
        )
    }
    // ANCHOR_END: all_reduce_raw

    /// out[i] = sum over PEs of input[my_pe * count + i], i < count.
    /// out: symmetric [count] dtype; input: symmetric [n_pes * count] dtype.
    pub fn reduce_scatter_raw(
        &self,
        out: u64,
        input: u64,
        count: usize,
        dtype: DType,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        let out_bytes = count * dtype.size();
        let in_bytes = self.n_pes() * out_bytes;
        self.reduce_raw(
            Collective::ReduceScatter,
            out,
            input,
            out_bytes,
            in_bytes,
            count,
            dtype,
            algorithm,
            stream,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_raw(
        &self,
        collective: Collective,
        out: u64,
        input: u64,
        out_bytes: usize,
        in_bytes: usize,
        count: usize,
        dtype: DType,
        algorithm: Option<Algorithm>,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        let call = Call {
            collective,
            algorithm,
            size_bytes: in_bytes,
            dtype: Some(dtype),
            symmetric: &[(out, out_bytes), (input, in_bytes)],
        };
        let count = count as u64;
        let ws = &self.memory.workspace;
        self.run(
            call,
            stream,
            &mut [arg(ws), arg(&input), arg(&out), arg(&count)],
        )
    }

    // ANCHOR: all_to_all_v_raw
    /// PE p sends in_splits[q] rows (in order q = 0, 1, ...) of `input` to PE q; PE q receives
    /// them after the rows of PEs 0..p-1, and learns the counts and offsets from the device:
    /// out_splits_offsets[0][p] rows came from p, starting at row out_splits_offsets[1][p].
    /// Counts that do not add up (negative, more than the input, more than the output) are
    /// found on the device by every PE and reported by the next call or `check()`.
    /// out: symmetric [out_rows, row_bytes]; input: symmetric [in_rows, row_bytes];
    /// in_splits: device int64 [n_pes]; out_splits_offsets: device int64 [2, n_pes].
    ///
    /// # Safety
    /// `in_splits` and `out_splits_offsets` must be device memory of at least n_pes and
    /// 2 x n_pes int64 on this GPU (nothing on the host can check plain device pointers).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_all_v_raw(
        &self,
        out: u64,
        out_rows: usize,
        input: u64,
        in_rows: usize,
        row_bytes: usize,
        in_splits: u64,
        out_splits_offsets: u64,
        stream: sys::CUstream,
    ) -> Result<(), CollError> {
        if row_bytes == 0 {
            return Err(CollError::invalid(
                "all_to_all_v",
                "rows must hold at least one byte",
            ));
        }
        let call = Call {
            collective: Collective::AllToAllV,
            algorithm: None,
            size_bytes: in_rows * row_bytes,
            dtype: None,
            symmetric: &[(out, out_rows * row_bytes), (input, in_rows * row_bytes)],
        };
        let (row_bytes, in_rows, out_rows) = (row_bytes as u64, in_rows as u64, out_rows as u64);
        let ws = &self.memory.workspace;
        self.run(
            call,
            stream,
            &mut [
                arg(ws),
                arg(&input),
                arg(&out),
                arg(&in_splits),
                arg(&out_splits_offsets),
                arg(&row_bytes),
                arg(&in_rows),
                arg(&out_rows),
            ],
        )
    }
    // ANCHOR_END: all_to_all_v_raw
}

impl<W: Deref<Target = World>> Drop for Communicator<W> {
    fn drop(&mut self) {
        // Kernels still queued read the workspace; the symmetric buffer's own drop waits for
        // the world's stream, but a caller's stream may be another one.
        let _ = self.world().context().synchronize();
    }
}
