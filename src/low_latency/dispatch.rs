//! Low-latency dispatch: what it takes and fills, its plan (every check, then the argument
//! struct of kernels/cuda/buffer/ll_dispatch.cu) and its launch.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::{FP8_GROUP, LlDispatchArgs};

use crate::buffer::NvshmemBuffer;
use crate::error::BufferError;
use crate::low_latency::launch::{DISPATCH_KERNEL, LlPlan, ll_args, ll_shape};
use crate::low_latency::phases::{PendingReceive, Phases, check_phases};
use crate::low_latency::regions::invalid;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

/// UE8M0 scales are packed four to an int: hidden must cover whole ints.
const UE8M0_PER_INT: usize = 4;

/// What a low-latency dispatch takes (DeepEP's arguments).
#[derive(Debug, Clone, Copy)]
pub struct LlDispatchInputs {
    /// [N, H] bf16, N <= num_max_dispatch_tokens_per_rank.
    pub x: View,
    /// [N, K] i64: global expert ids or -1.
    pub topk_idx: View,
    /// [L] i32, added to: tokens each local expert received.
    pub cumulative_local_expert_recv_stats: Option<View>,
    /// [R] i64, added to: SM cycles spent waiting for each source rank.
    pub dispatch_wait_recv_cost_stats: Option<View>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlDispatchOptions {
    pub num_max_dispatch_tokens_per_rank: usize,
    pub num_experts: usize,
    pub use_fp8: bool,
    pub round_scale: bool,
    pub use_ue8m0: bool,
}

/// What a low-latency dispatch fills. The 3-D tensors come flattened to 2-D:
/// `recv_x` [L x R x T, H] (fp8 with use_fp8, else bf16); `recv_x_scales` (fp8 only) the
/// storage of DeepEP's column-major scales, f32 [L x H/FP8_GROUP, R x T], or with use_ue8m0 i32
/// [L x H/512, R x T] (four exponents per int); `recv_src_info` [L, R x T] i32;
/// `recv_layout_range` [L, R] i64 ((begin << 32) | count); `recv_count` [L] i32.
#[derive(Debug, Clone, Copy)]
pub struct LlDispatchOutputs {
    pub recv_x: View,
    pub recv_x_scales: Option<View>,
    pub recv_src_info: View,
    pub recv_layout_range: View,
    pub recv_count: View,
}

/// A checked low-latency dispatch.
pub type LlDispatchPlan = LlPlan<LlDispatchArgs>;

/// An optional vector argument of `len` elements: its address, or 0.
pub(crate) fn optional_vector(
    what: &'static str,
    name: &str,
    view: &Option<View>,
    elem: ElemType,
    len: usize,
) -> Result<u64, BufferError> {
    match view {
        Some(v) => {
            v.expect(what, name, elem, &[Some(len)])?;
            Ok(v.ptr)
        }
        None => Ok(0),
    }
}

/// `recv_x_scales`' address, checked against the format: f32 [L x H/128, R x T], or with
/// UE8M0 i32 [L x H/512, R x T]; none without fp8.
fn recv_scales(
    what: &'static str,
    scales: &Option<View>,
    options: &LlDispatchOptions,
    hidden: usize,
    (l, n, t): (usize, usize, usize),
) -> Result<u64, BufferError> {
    match (scales, options.use_fp8) {
        (Some(s), true) => {
            let (elem, groups) = if options.use_ue8m0 {
                (ElemType::I32, hidden / (FP8_GROUP * UE8M0_PER_INT))
            } else {
                (ElemType::F32, hidden / FP8_GROUP)
            };
            s.expect(
                what,
                "recv_x_scales",
                elem,
                &[Some(l * groups), Some(n * t)],
            )?;
            Ok(s.ptr)
        }
        (None, false) => Ok(0),
        (None, true) => Err(invalid(what, "use_fp8 needs recv_x_scales".into())),
        (Some(_), false) => Err(invalid(what, "recv_x_scales is only for use_fp8".into())),
    }
}

/// The fp8 formats asked for, checked against each other and the row width.
fn check_formats(options: &LlDispatchOptions, hidden: usize) -> Result<(), BufferError> {
    const WHAT: &str = "low_latency_dispatch";
    if options.use_ue8m0 && !(options.use_fp8 && options.round_scale) {
        return Err(invalid(
            WHAT,
            "use_ue8m0 needs use_fp8=True and round_scale=True (UE8M0 scales are powers of two)"
                .into(),
        ));
    }
    if options.use_ue8m0 && !hidden.is_multiple_of(FP8_GROUP * UE8M0_PER_INT) {
        return Err(invalid(
            WHAT,
            format!(
                "use_ue8m0 packs {UE8M0_PER_INT} scales per int: hidden = {hidden} must be a \
                 multiple of {}",
                FP8_GROUP * UE8M0_PER_INT
            ),
        ));
    }
    Ok(())
}

/// The outputs of a call of `l` local experts, `n` ranks and `t` slots, checked: the
/// scales' address (0 without fp8).
fn check_outputs(
    outputs: &LlDispatchOutputs,
    options: &LlDispatchOptions,
    hidden: usize,
    (l, n, t): (usize, usize, usize),
) -> Result<u64, BufferError> {
    const WHAT: &str = "low_latency_dispatch";
    let recv_elem = if options.use_fp8 {
        ElemType::Fp8E4m3
    } else {
        ElemType::Bf16
    };
    let recv_x = &outputs.recv_x;
    recv_x.expect(WHAT, "recv_x", recv_elem, &[Some(l * n * t), Some(hidden)])?;
    recv_x.expect_aligned(WHAT, "recv_x", 16)?;
    let scales = recv_scales(WHAT, &outputs.recv_x_scales, options, hidden, (l, n, t))?;
    let (lv, nv) = (Some(l), Some(n));
    outputs
        .recv_src_info
        .expect(WHAT, "recv_src_info", ElemType::I32, &[lv, Some(n * t)])?;
    outputs
        .recv_layout_range
        .expect(WHAT, "recv_layout_range", ElemType::I64, &[lv, nv])?;
    outputs
        .recv_count
        .expect(WHAT, "recv_count", ElemType::I32, &[lv])?;
    Ok(scales)
}

// ANCHOR: plan_ll_dispatch
/// Checks a low-latency dispatch (`phases` of it, after `pending`) and plans it.
pub fn plan_ll_dispatch(
    spec: &BufferSpec,
    inputs: &LlDispatchInputs,
    outputs: &LlDispatchOutputs,
    options: &LlDispatchOptions,
    phases: Phases,
    pending: Option<PendingReceive>,
) -> Result<LlDispatchPlan, BufferError> {
    const WHAT: &str = "low_latency_dispatch";
    let t = options.num_max_dispatch_tokens_per_rank;
    let x = &inputs.x;
    x.expect(WHAT, "x", ElemType::Bf16, &[None, None])?;
    x.expect_aligned(WHAT, "x", 16)?;
    let (num_tokens, hidden) = (x.rows(), x.cols());
    let topk_idx = &inputs.topk_idx;
    topk_idx.expect(WHAT, "topk_idx", ElemType::I64, &[Some(num_tokens), None])?;
    let num_topk = topk_idx.cols();
    let shape = ll_shape(spec, WHAT, t, hidden, options.num_experts, num_topk)?;
    let pending_after = check_phases(WHAT, phases, &shape, pending)?;
    if num_tokens > t {
        return Err(invalid(
            WHAT,
            format!(
                "x has {num_tokens} tokens, more than num_max_dispatch_tokens_per_rank = {t} \
                 (every rank's slots hold {t} tokens per expert)"
            ),
        ));
    }
    check_formats(options, hidden)?;
    let (n, l) = (shape.num_ranks, shape.num_local_experts());
    let scales = check_outputs(outputs, options, hidden, (l, n, t))?;
    let cumulative = optional_vector(
        WHAT,
        "cumulative_local_expert_recv_stats",
        &inputs.cumulative_local_expert_recv_stats,
        ElemType::I32,
        l,
    )?;
    let wait_cost = optional_vector(
        WHAT,
        "dispatch_wait_recv_cost_stats",
        &inputs.dispatch_wait_recv_cost_stats,
        ElemType::I64,
        n,
    )?;
    let args = ll_args!(
        LlDispatchArgs {
            x: x.ptr,
            topk_idx: topk_idx.ptr,
            recv_x: outputs.recv_x.ptr,
            recv_scales: scales,
            recv_src_info: outputs.recv_src_info.ptr,
            recv_layout_range: outputs.recv_layout_range.ptr,
            recv_count: outputs.recv_count.ptr,
            cumulative_recv_stats: cumulative,
            wait_recv_cost: wait_cost,
            use_fp8: options.use_fp8 as i32,
            round_scale: options.round_scale as i32,
            use_ue8m0: options.use_ue8m0 as i32,
        },
        spec,
        shape,
        (num_tokens, num_topk)
    );
    Ok(LlDispatchPlan {
        args,
        phases,
        pending_after,
    })
}
// ANCHOR_END: plan_ll_dispatch

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: ll_dispatch
    /// DeepEP's `low_latency_dispatch` (see `plan_ll_dispatch`): every token to the slots of
    /// its top-k experts, then (with `Phases::SendAndReceive`, or in a later
    /// `Phases::Receive` launch) packed per local expert into `outputs`. Capturable in a CUDA
    /// graph.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`.
    pub unsafe fn low_latency_dispatch_raw(
        &self,
        inputs: &LlDispatchInputs,
        outputs: &LlDispatchOutputs,
        options: &LlDispatchOptions,
        phases: Phases,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let plan =
            |pending| plan_ll_dispatch(&self.spec, inputs, outputs, options, phases, pending);
        // SAFETY: ll_launch launches only what the plan checked; the caller vouches for the
        // views and the stream.
        unsafe { self.ll_launch(&DISPATCH_KERNEL, phases, stream, plan) }
    }
    // ANCHOR_END: ll_dispatch
}
