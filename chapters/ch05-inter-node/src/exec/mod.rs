//! Running a plan: each step on this PE's node (chapter 4's communicator, or NVSHMEM's node
//! team), its rail (an RMA kernel, or NVSHMEM's rail team) or itself. The public calls that
//! make the plans are in `calls.rs`; the rail's RMA steps are in `rail.rs`, the steps on
//! NVSHMEM's teams in `team.rs`.

use std::ffi::c_void;
use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::{check_sizes_agree, size_checks_enabled};
use ch03_put_get::check_symmetric_range;
use ch04_collectives::config::COLL_THREADS;
use ch04_collectives::{DType, LaunchSpec};
use cudarc::driver::sys;

use crate::config::{MAX_GROUP, RMA_THREADS};
use crate::error::InterNodeError;
use crate::method::{Method, check_call};
use crate::plan::{Buf, Plan, Scope, Step};
use crate::rma::RmaGroup;
use crate::topology::Topology;

mod rail;
mod team;

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
