//! Low-latency combine: what it takes and fills, its plan (every check, then the argument
//! struct of kernels/cuda/buffer/ll_combine.cu) and its launch.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::LlCombineArgs;

use crate::buffer::NvshmemBuffer;
use crate::error::BufferError;
use crate::low_latency::dispatch::optional_vector;
use crate::low_latency::launch::{COMBINE_KERNEL, LlPlan, ll_args, ll_shape};
use crate::low_latency::phases::{PendingReceive, Phases, check_phases};
use crate::low_latency::regions::{LlShape, invalid};
use crate::spec::BufferSpec;
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

/// A checked low-latency combine.
pub type LlCombinePlan = LlPlan<LlCombineArgs>;

const WHAT: &str = "low_latency_combine";

/// A handle of another call shape shows in its tensors' shapes.
fn check_handle(handle: &LlHandle, shape: &LlShape) -> Result<(), BufferError> {
    let (t, hidden, n, l) = (
        shape.max_tokens,
        shape.hidden,
        shape.num_ranks,
        shape.num_local_experts(),
    );
    let num_experts = shape.num_experts;
    let from_handle = |name: &str, v: &View, elem, dims: &[Option<usize>]| {
        v.expect(WHAT, name, elem, dims).map_err(|e| {
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
    let rows_per_expert = [Some(l), Some(n * t)];
    from_handle(
        "handle[0] (src_info)",
        &handle.src_info,
        ElemType::I32,
        &rows_per_expert,
    )?;
    let ranges = [Some(l), Some(n)];
    from_handle(
        "handle[1] (layout_range)",
        &handle.layout_range,
        ElemType::I64,
        &ranges,
    )
}

/// The expert results' address: `x` [L x R x T, H] bf16 checked, or the staging rows.
fn check_x(spec: &BufferSpec, x: &Option<View>, shape: &LlShape) -> Result<u64, BufferError> {
    let (t, hidden, n, l) = (
        shape.max_tokens,
        shape.hidden,
        shape.num_ranks,
        shape.num_local_experts(),
    );
    let Some(x) = x else {
        return Ok(spec.ll_staging());
    };
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
    x.expect_aligned(WHAT, "x", 16)?;
    Ok(x.ptr)
}

// ANCHOR: plan_ll_combine
/// Checks a low-latency combine of the results of the dispatch that made `handle` (`phases`
/// of it, after `pending`) into `out` [N, H] bf16, and plans it.
pub fn plan_ll_combine(
    spec: &BufferSpec,
    inputs: &LlCombineInputs,
    handle: &LlHandle,
    out: &View,
    phases: Phases,
    pending: Option<PendingReceive>,
) -> Result<LlCombinePlan, BufferError> {
    let (t, hidden, num_experts) = (
        handle.num_max_dispatch_tokens_per_rank,
        handle.hidden,
        handle.num_experts,
    );
    let topk_idx = &inputs.topk_idx;
    topk_idx.expect(WHAT, "topk_idx", ElemType::I64, &[None, None])?;
    let (num_tokens, num_topk) = (topk_idx.rows(), topk_idx.cols());
    let shape = ll_shape(spec, WHAT, t, hidden, num_experts, num_topk)?;
    let pending_after = check_phases(WHAT, phases, &shape, pending)?;
    let n = shape.num_ranks;
    if num_tokens > t {
        return Err(invalid(
            WHAT,
            format!(
                "topk_idx has {num_tokens} tokens, more than the handle's \
                 num_max_dispatch_tokens_per_rank = {t}"
            ),
        ));
    }
    let tokens_by_topk = [Some(num_tokens), Some(num_topk)];
    let weights = &inputs.topk_weights;
    weights.expect(WHAT, "topk_weights", ElemType::F32, &tokens_by_topk)?;
    check_handle(handle, &shape)?;
    let x = check_x(spec, &inputs.x, &shape)?;
    out.expect(
        WHAT,
        "out",
        ElemType::Bf16,
        &[Some(num_tokens), Some(hidden)],
    )?;
    out.expect_aligned(WHAT, "out", 16)?;
    let wait_cost = optional_vector(
        WHAT,
        "combine_wait_recv_cost_stats",
        &inputs.combine_wait_recv_cost_stats,
        ElemType::I64,
        n,
    )?;
    let args = ll_args!(
        LlCombineArgs {
            x,
            src_info: handle.src_info.ptr,
            layout_range: handle.layout_range.ptr,
            topk_idx: topk_idx.ptr,
            topk_weights: weights.ptr,
            out: out.ptr,
            wait_recv_cost: wait_cost,
        },
        spec,
        shape,
        (num_tokens, num_topk)
    );
    Ok(LlCombinePlan {
        args,
        phases,
        pending_after,
    })
}
// ANCHOR_END: plan_ll_combine

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: ll_combine
    /// DeepEP's `low_latency_combine` (see `plan_ll_combine`): every expert result back to
    /// its token's rank, summed there with the top-k weights into `out` [N, H] bf16.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`.
    pub unsafe fn low_latency_combine_raw(
        &self,
        inputs: &LlCombineInputs,
        handle: &LlHandle,
        out: &View,
        phases: Phases,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let plan = |pending| plan_ll_combine(&self.spec, inputs, handle, out, phases, pending);
        // SAFETY: ll_launch launches only what the plan checked; the caller vouches for the
        // views and the stream.
        unsafe { self.ll_launch(&COMBINE_KERNEL, phases, stream, plan) }
    }
    // ANCHOR_END: ll_combine
}
