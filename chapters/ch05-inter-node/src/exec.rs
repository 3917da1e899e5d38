//! Running a plan: each step on this PE's node (chapter 4's communicator, or NVSHMEM's node
//! team), its rail (an RMA kernel, or NVSHMEM's rail team) or itself. The public calls that
//! make the plans are in `calls.rs`.

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{check_sizes_agree, size_checks_enabled};
use ch03_put_get::check_symmetric_range;
use ch04_collectives::config::COLL_THREADS;
use ch04_collectives::team::{
    TeamCall, check_reduce_scratch, enqueue_on_team, process_reduce_scratch_bytes, team_call,
};
use ch04_collectives::{Collective, DType, LaunchSpec};
use cudarc::driver::sys;

use crate::config::{MAX_GROUP, RMA_THREADS};
use crate::error::InterNodeError;
use crate::method::{Method, check_call};
use crate::plan::{Buf, Plan, Scope, Step, first_part_bytes, round16};
use crate::rma::{RmaGroup, rma_blocks};
use crate::topology::Topology;

/// One call's device addresses: the caller's buffers, and the all-to-all-v count arrays.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Call {
    pub(crate) input: u64,
    pub(crate) out: u64,
    pub(crate) dtype: Option<DType>,
    /// device int64 [n_pes]; device int64 [2, n_pes] (all-to-all-v only)
    pub(crate) in_splits: u64,
    pub(crate) out_splits_offsets: u64,
}

pub(crate) fn arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

impl<W: Deref<Target = World> + Clone> Topology<W> {
    /// Everything before a launch: earlier failures, symmetric ranges, and (with size checks
    /// on, outside stream capture) that every PE passed the same size.
    pub(crate) fn prepare(
        &self,
        (collective, method, dtype): (&'static str, Method, Option<DType>),
        ranges: &[(u64, usize); 2],
        size: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        check_call(collective, method, dtype, ranges[0], ranges[1])?;
        self.check()?;
        for &(ptr, num_bytes) in ranges.iter().filter(|r| r.1 > 0) {
            check_symmetric_range(self.world(), ptr, num_bytes as u64)?;
        }
        // SAFETY: a live stream of this context.
        let capturing = unsafe { cudarc::driver::result::stream::is_capturing(stream) }
            .map_err(InterNodeError::cuda("querying stream capture"))?
            != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        if size_checks_enabled() && !capturing {
            check_sizes_agree(self.world(), size as u64)?;
        }
        Ok(())
    }

    pub(crate) fn address(&self, buf: Buf, call: &Call) -> u64 {
        match buf {
            Buf::Input => call.input,
            Buf::Out => call.out,
            Buf::StageA => self.stages.device_ptr(),
            Buf::StageB => self.stages.device_ptr() + self.config.stage_bytes as u64,
        }
    }

    pub(crate) fn world_group(
        &self,
        collective: &'static str,
    ) -> Result<&RmaGroup<W>, InterNodeError> {
        self.world_group.as_ref().ok_or_else(|| {
            let n = self.layout.n_pes;
            InterNodeError::invalid(
                collective,
                format!("the flat algorithms take at most {MAX_GROUP} PEs, not {n}"),
            )
        })
    }

    // ANCHOR: run_plan
    /// Runs `plan` with `method`: each step on this PE's node, its rail, or itself.
    pub(crate) fn run_plan(
        &self,
        plan: &Plan,
        call: Call,
        method: Method,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        plan.check_fits(&self.config)?;
        if method == Method::NvshmemTeams {
            self.check_team_steps(plan)?;
        }
        for step in &plan.steps {
            match (step.scope(), method) {
                (Scope::Local, _) => self.local_step(step, &call, stream)?,
                (_, Method::NvshmemTeams) => {
                    self.team_step(plan.collective, step, &call, stream)?
                }
                (Scope::Node, _) => self.node_step(step, &call, stream)?,
                (Scope::Rail, _) => self.rail_step(step, &call, stream)?,
            }
        }
        Ok(())
    }
    // ANCHOR_END: run_plan

    // ANCHOR: node_step
    /// A step inside the node: chapter 4's collectives over the node's communicator.
    pub(crate) fn node_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        let dtype = call.dtype.unwrap_or(DType::Bf16);
        let node = &self.node;
        match *step {
            Step::NodeReduceScatter { out, input, count } => {
                node.reduce_scatter_raw(a(out), a(input), count, dtype, None, stream)?
            }
            Step::NodeAllReduce { out, input, count } => {
                node.all_reduce_raw(a(out), a(input), count, dtype, None, stream)?
            }
            Step::NodeAllGather {
                out,
                input,
                num_bytes,
            } => node.all_gather_raw(a(out), a(input), num_bytes, None, stream)?,
            Step::NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => node.broadcast_raw(a(out), a(input), num_bytes, root, None, stream)?,
            Step::NodeAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            } => {
                let (splits, counts) = (call.in_splits, call.out_splits_offsets);
                // SAFETY: the caller of all_to_all_v_raw vouched for both count arrays.
                unsafe {
                    node.all_to_all_v_raw(
                        a(out),
                        out_rows,
                        a(input),
                        in_rows,
                        row_bytes,
                        splits,
                        counts,
                        stream,
                    )
                }?
            }
            Step::A2avForward {
                out,
                row_bytes,
                out_rows,
            } => self.forward(a(out), call, row_bytes, out_rows, stream)?,
            _ => unreachable!("not a node step: {step:?}"),
        }
        Ok(())
    }
    // ANCHOR_END: node_step

    /// The hierarchical all-to-all-v's second half: a call of the node's communicator (its
    /// protocol, its record) that also reads the rail group's landing slots.
    pub(crate) fn forward(
        &self,
        out: u64,
        call: &Call,
        row_bytes: usize,
        out_rows: usize,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        self.node.check()?;
        let (ws, rail) = (self.node.workspace(), self.rail.workspace());
        let (row_bytes, out_rows) = (row_bytes as u64, out_rows as u64);
        // Every node PE must launch the same grid (tickets are matched block by block), and
        // out_rows is each PE's own: the grid is the job's share of a GPU, whatever the call.
        let blocks = self.num_sms.max(1);
        let spec = LaunchSpec {
            kernel: "hier_a2av_forward",
            num_blocks: blocks,
            threads_per_block: COLL_THREADS,
            shared_mem_bytes: 0,
        };
        let counts = call.out_splits_offsets;
        let mut args = [
            arg(&ws),
            arg(&rail),
            arg(&out),
            arg(&counts),
            arg(&row_bytes),
            arg(&out_rows),
        ];
        // SAFETY: the arguments of hier_a2av_forward, in its order; `counts` vouched for by
        // the caller of all_to_all_v_raw.
        Ok(unsafe { self.kernels.launch(&spec, stream, &mut args) }?)
    }

    // ANCHOR: rail_step
    /// A step across nodes: an RMA kernel over this PE's rail.
    pub(crate) fn rail_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        let n = self.layout.num_nodes();
        match *step {
            Step::RailReduceScatter { out, input, count } => {
                self.rma_reduce(&self.rail, false, a(out), a(input), count, call, stream)
            }
            Step::RailAllReduce { out, input, count } => {
                self.rma_reduce(&self.rail, true, a(out), a(input), count, call, stream)
            }
            Step::RailAllGather {
                out,
                input,
                num_bytes,
            } => self.rma_exchange(
                &self.rail,
                "rma_all_gather",
                a(out),
                a(input),
                num_bytes,
                None,
                stream,
            ),
            Step::RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => self.rma_exchange(
                &self.rail,
                "rma_broadcast",
                a(out),
                a(input),
                num_bytes,
                Some(root),
                stream,
            ),
            Step::RailAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            } => self.rma_a2av(
                &self.rail,
                a(out),
                a(input),
                row_bytes,
                in_rows,
                out_rows,
                call,
                stream,
            ),
            Step::A2avSend {
                input,
                row_bytes,
                in_rows,
            } => {
                let (input, row_bytes, in_rows) = (a(input), row_bytes as u64, in_rows as u64);
                let node_pes = self.layout.node_pes as i32;
                let blocks = rma_blocks((in_rows * row_bytes) as usize / n, self.num_sms);
                let mut args = [
                    arg(&input),
                    arg(&call.in_splits),
                    arg(&row_bytes),
                    arg(&in_rows),
                    arg(&node_pes),
                ];
                // SAFETY: the arguments of hier_a2av_send after its workspace, in order.
                unsafe {
                    self.rail
                        .launch(&self.kernels, "hier_a2av_send", blocks, stream, &mut args)
                }
            }
            _ => unreachable!("not a rail step: {step:?}"),
        }
    }
    // ANCHOR_END: rail_step

    /// Reduce-scatter (`all_reduce` false) or all-reduce over `group`, in its landing space.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_reduce(
        &self,
        group: &RmaGroup<W>,
        all_reduce: bool,
        out: u64,
        input: u64,
        count: usize,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let (dtype, size) = (call.dtype.unwrap_or(DType::Bf16), group.team().size);
        let part = match all_reduce {
            true => first_part_bytes(count * dtype.size(), size),
            false => count * dtype.size(),
        };
        let (need, have) = (
            size * round16(part),
            group.workspace().scratch_bytes as usize,
        );
        if need > have {
            let field = if group.team().stride == 1 {
                "world_scratch_bytes"
            } else {
                "rail_scratch_bytes"
            };
            let collective = if all_reduce {
                "all_reduce"
            } else {
                "reduce_scatter"
            };
            let what = "landing space";
            return Err(InterNodeError::TooLarge {
                collective,
                what,
                field,
                need,
                have,
            });
        }
        let kernel = match (all_reduce, dtype) {
            (true, DType::F32) => "rma_all_reduce_f32",
            (true, DType::Bf16) => "rma_all_reduce_bf16",
            (false, DType::F32) => "rma_reduce_scatter_f32",
            (false, DType::Bf16) => "rma_reduce_scatter_bf16",
        };
        let count = count as u64;
        let mut args = [arg(&input), arg(&out), arg(&count)];
        // SAFETY: the arguments of the reduction kernels after the workspace, in order.
        unsafe {
            group.launch(
                &self.kernels,
                kernel,
                rma_blocks(part, self.num_sms),
                stream,
                &mut args,
            )
        }
    }

    /// All-gather (every member sends), all-to-all, or broadcast (`root`) over `group`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_exchange(
        &self,
        group: &RmaGroup<W>,
        kernel: &'static str,
        out: u64,
        input: u64,
        num_bytes: usize,
        root: Option<usize>,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let blocks = rma_blocks(num_bytes, self.num_sms);
        let (num_bytes, root) = (num_bytes as u64, root.unwrap_or(0) as i32);
        let mut args = [arg(&input), arg(&out), arg(&num_bytes), arg(&root)];
        let used = if kernel == "rma_broadcast" { 4 } else { 3 };
        // SAFETY: the arguments of the exchange kernels after the workspace, in order.
        unsafe { group.launch(&self.kernels, kernel, blocks, stream, &mut args[..used]) }
    }

    /// All-to-all-v over `group` (the flat kernel: rows straight into the outputs).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_a2av(
        &self,
        group: &RmaGroup<W>,
        out: u64,
        input: u64,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        // From in_rows, which every PE passes alike (prepare checks it), never out_rows (each
        // PE's own): every member must launch the same grid.
        let blocks = rma_blocks(in_rows * row_bytes / group.team().size, self.num_sms);
        let (row_bytes, in_rows, out_rows) = (row_bytes as u64, in_rows as u64, out_rows as u64);
        let (splits, counts) = (call.in_splits, call.out_splits_offsets);
        let mut args = [
            arg(&input),
            arg(&out),
            arg(&splits),
            arg(&counts),
            arg(&row_bytes),
            arg(&in_rows),
            arg(&out_rows),
        ];
        // SAFETY: the arguments of rma_all_to_all_v after the workspace, in order.
        unsafe { group.launch(&self.kernels, "rma_all_to_all_v", blocks, stream, &mut args) }
    }

    // ANCHOR: team_step
    /// A node or rail step on NVSHMEM's own on-stream team collectives (bf16 reductions).
    pub(crate) fn team_step(
        &self,
        collective: &'static str,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let (team, team_call, out, input, root) = self.team_call_of(collective, step)?;
        // ANCHOR: team_enqueue
        debug_assert_ne!(call.dtype, Some(DType::F32), "check_call refuses f32 teams");
        let (out, input) = (self.address(out, call), self.address(input, call));
        // SAFETY: symmetric addresses checked by `prepare` (or the topology's stages) holding
        // the bytes the plan's extents say; a team of this PE; the caller's stream.
        Ok(unsafe { enqueue_on_team(self.world(), team, &team_call, out, input, root, stream) }?)
        // ANCHOR_END: team_enqueue
    }
    // ANCHOR_END: team_step

    /// The team and NVSHMEM call of a node or rail step, with its buffers and root.
    fn team_call_of(
        &self,
        collective: &'static str,
        step: &Step,
    ) -> Result<(nvshmem_sys::Team, TeamCall, Buf, Buf, usize), InterNodeError> {
        let (team, team_pes) = match step.scope() {
            Scope::Node => (self.teams.node, self.layout.node_pes),
            _ => (self.teams.rail, self.layout.num_nodes()),
        };
        let bf16 = DType::Bf16.size(); // check_call refuses other sums on NVSHMEM's teams
        let (c, size, out, input, root) = match *step {
            Step::NodeReduceScatter { out, input, count }
            | Step::RailReduceScatter { out, input, count } => (
                Collective::ReduceScatter,
                team_pes * count * bf16,
                out,
                input,
                0,
            ),
            Step::NodeAllReduce { out, input, count }
            | Step::RailAllReduce { out, input, count } => {
                (Collective::AllReduce, count * bf16, out, input, 0)
            }
            Step::NodeAllGather {
                out,
                input,
                num_bytes,
            }
            | Step::RailAllGather {
                out,
                input,
                num_bytes,
            } => (Collective::AllGather, team_pes * num_bytes, out, input, 0),
            Step::NodeBroadcast {
                out,
                input,
                num_bytes,
                root,
            }
            | Step::RailBroadcast {
                out,
                input,
                num_bytes,
                root,
            } => (Collective::Broadcast, num_bytes, out, input, root),
            // check_call refuses what NVSHMEM's teams cannot do before any step runs.
            _ => {
                let what = "NVSHMEM has no team all-to-all-v";
                return Err(InterNodeError::invalid(collective, what));
            }
        };
        Ok((team, team_call(c, size, team_pes)?, out, input, root))
    }

    /// Every team step of `plan`, checked before the first is enqueued: a call NVSHMEM cannot
    /// take (its reduce-scatter past the team's scratch) stops every PE before any step runs,
    /// so the PEs' call counts stay in step.
    fn check_team_steps(&self, plan: &Plan) -> Result<(), InterNodeError> {
        let scratch = process_reduce_scratch_bytes()?;
        for step in plan.steps.iter().filter(|s| s.scope() != Scope::Local) {
            let (_, call, ..) = self.team_call_of(plan.collective, step)?;
            check_reduce_scratch(&call, scratch)?;
        }
        Ok(())
    }

    /// A step of this PE alone: a permutation, a copy, a fill.
    pub(crate) fn local_step(
        &self,
        step: &Step,
        call: &Call,
        stream: sys::CUstream,
    ) -> Result<(), InterNodeError> {
        let a = |buf| self.address(buf, call);
        match *step {
            Step::Permute {
                out,
                input,
                outer,
                inner,
                block_bytes,
            } => {
                let (out, input) = (a(out), a(input));
                let (outer, inner, block) = (outer as u64, inner as u64, block_bytes as u64);
                let blocks = (outer * inner).clamp(1, u64::from(self.num_sms)) as u32;
                let spec = LaunchSpec {
                    kernel: "local_permute",
                    num_blocks: blocks,
                    threads_per_block: RMA_THREADS,
                    shared_mem_bytes: 0,
                };
                let mut args = [
                    arg(&input),
                    arg(&out),
                    arg(&outer),
                    arg(&inner),
                    arg(&block),
                ];
                // SAFETY: the arguments of local_permute, in order; both buffers hold
                // outer x inner x block bytes (the plan's extents, checked).
                unsafe { self.kernels.launch(&spec, stream, &mut args) }?
            }
            Step::Copy {
                out,
                input,
                num_bytes,
            } if a(out) != a(input) => {
                // SAFETY: both ranges hold num_bytes (the plan's extents); stream order.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(a(out), a(input), num_bytes, stream)
                }
                .map_err(InterNodeError::cuda("copying to a stage"))?
            }
            Step::Copy { .. } => {}
            Step::Zero {
                buf,
                offset,
                num_bytes,
            } => {
                // SAFETY: the stage holds offset + num_bytes (the plan's extents, checked).
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        a(buf) + offset as u64,
                        0,
                        num_bytes,
                        stream,
                    )
                }
                .map_err(InterNodeError::cuda("zeroing a stage"))?
            }
            _ => unreachable!("not a local step: {step:?}"),
        }
        Ok(())
    }
}
