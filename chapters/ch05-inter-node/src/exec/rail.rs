//! A plan's steps across nodes: RMA kernels over this PE's rail group (puts and signals only,
//! never a peer pointer).

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::DType;
use cudarc::driver::sys;

use crate::error::InterNodeError;
use crate::plan::{Step, first_part_bytes, round16};
use crate::rma::{RmaGroup, rma_blocks};
use crate::topology::Topology;

use super::{Call, arg};

impl<W: Deref<Target = World> + Clone> Topology<W> {
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
}
