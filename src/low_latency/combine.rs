//! Low-latency combine: what it takes and fills, and the checks before its kernel
//! (kernels/cuda/buffer/ll_combine.cu).

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::LlCombineArgs;

use super::{COMBINE_KERNEL, PendingReceive, Phases, invalid, optional_vector};
use crate::buffer::NvshmemBuffer;
use crate::error::BufferError;
use crate::view::{ElemType, View};

/// DeepEP's low-latency handle: (src_info, layout_range, T, hidden, num_experts).
#[derive(Debug, Clone, Copy)]
pub struct LlHandle {
    pub src_info: View,
    pub layout_range: View,
    pub num_max_dispatch_tokens_per_rank: usize,
    pub hidden: usize,
    pub num_experts: usize,
}

/// What a low-latency combine takes: `x` [L x R x T, H] bf16 (ignored with zero_copy, which
/// reads the staging region instead), `topk_idx` [N, K] i64, `topk_weights` [N, K] f32.
#[derive(Debug, Clone, Copy)]
pub struct LlCombineInputs {
    pub x: Option<View>,
    pub topk_idx: View,
    pub topk_weights: View,
    pub combine_wait_recv_cost_stats: Option<View>,
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: ll_combine
    /// DeepEP's `low_latency_combine`: every expert result back to its token's rank, summed
    /// there with the top-k weights into `out` [N, H] bf16.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU.
    pub unsafe fn low_latency_combine(
        &self,
        inputs: &LlCombineInputs,
        handle: &LlHandle,
        out: &View,
        phases: Phases,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "low_latency_combine";
        self.begin_ll_call(WHAT, phases)?;
        let (t, hidden, num_experts) = (
            handle.num_max_dispatch_tokens_per_rank,
            handle.hidden,
            handle.num_experts,
        );
        let topk_idx = &inputs.topk_idx;
        topk_idx.expect(WHAT, "topk_idx", ElemType::I64, &[None, None])?;
        let (num_tokens, num_topk) = (topk_idx.rows(), topk_idx.cols());
        let layout = self.ll_layout(WHAT, t, hidden, num_experts, num_topk)?;
        self.check_phases(WHAT, phases, &layout)?;
        let (n, l) = (layout.num_ranks, layout.num_local_experts());
        if num_tokens > t {
            return Err(invalid(
                WHAT,
                format!(
                    "topk_idx has {num_tokens} tokens, more than the handle's \
                     num_max_dispatch_tokens_per_rank = {t}"
                ),
            ));
        }
        inputs.topk_weights.expect(
            WHAT,
            "topk_weights",
            ElemType::F32,
            &[Some(num_tokens), Some(num_topk)],
        )?;
        // A handle of another call shape shows in its tensors' shapes.
        let from_handle = |name: &str, v: &View, elem, shape: &[Option<usize>]| {
            v.expect(WHAT, name, elem, shape).map_err(|e| {
                invalid(
                    WHAT,
                    format!(
                        "{e}: the handle does not match its own shape (T = {t}, hidden = {hidden}, \
                         {num_experts} experts over {n} ranks); pass the handle of the dispatch \
                         whose results x holds"
                    ),
                )
            })
        };
        from_handle(
            "handle[0] (src_info)",
            &handle.src_info,
            ElemType::I32,
            &[Some(l), Some(n * t)],
        )?;
        from_handle(
            "handle[1] (layout_range)",
            &handle.layout_range,
            ElemType::I64,
            &[Some(l), Some(n)],
        )?;
        let x = match &inputs.x {
            Some(x) => {
                x.expect(WHAT, "x", ElemType::Bf16, &[Some(l * n * t), Some(hidden)])
                    .map_err(|e| {
                        invalid(
                            WHAT,
                            format!(
                                "{e}: x must be [num_local_experts, num_ranks x T, hidden] = \
                                 [{l}, {}, {hidden}] for this handle",
                                n * t
                            ),
                        )
                    })?;
                x.ptr
            }
            None => self.local_region(true).0 + self.ll_parts().staging() as u64,
        };
        out.expect(
            WHAT,
            "out",
            ElemType::Bf16,
            &[Some(num_tokens), Some(hidden)],
        )?;
        let wait_cost = optional_vector(
            WHAT,
            "combine_wait_recv_cost_stats",
            &inputs.combine_wait_recv_cost_stats,
            ElemType::I64,
            n,
        )?;
        let args = LlCombineArgs {
            x,
            src_info: handle.src_info.ptr,
            layout_range: handle.layout_range.ptr,
            topk_idx: topk_idx.ptr,
            topk_weights: inputs.topk_weights.ptr,
            out: out.ptr,
            wait_recv_cost: wait_cost,
            region: self.ll_region(),
            state: self.ll_state(),
            bad_input: self.input_error_args(),
            num_tokens: num_tokens as i32,
            hidden: hidden as i32,
            num_topk: num_topk as i32,
            num_experts: num_experts as i32,
            max_tokens: t as i32,
        };
        let pending = PendingReceive {
            op: WHAT,
            shape: layout,
        };
        self.ll_launch(&COMBINE_KERNEL, &args, phases, pending, stream)
    }
    // ANCHOR_END: ll_combine
}
