//! Low-latency dispatch: what it takes and fills, and the checks before its kernel
//! (kernels/cuda/buffer/ll_dispatch.cu).

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::LlDispatchArgs;

use super::{DISPATCH_KERNEL, PendingReceive, Phases, invalid, optional_vector};
use crate::buffer::NvshmemBuffer;
use crate::error::BufferError;
use crate::view::{ElemType, View};

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
/// storage of DeepEP's column-major scales, f32 [L x H/128, R x T], or with use_ue8m0 i32
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

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: ll_dispatch
    /// DeepEP's `low_latency_dispatch`: every token to the slots of its top-k experts, then
    /// (with `Phases::SendAndReceive`, or in a later `Phases::Receive` launch) packed per
    /// local expert into `outputs`. Capturable in a CUDA graph.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU.
    pub unsafe fn low_latency_dispatch(
        &self,
        inputs: &LlDispatchInputs,
        outputs: &LlDispatchOutputs,
        options: &LlDispatchOptions,
        phases: Phases,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "low_latency_dispatch";
        self.begin_ll_call(WHAT, phases)?;
        let LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: t,
            num_experts,
            use_fp8,
            round_scale,
            use_ue8m0,
        } = *options;
        let x = &inputs.x;
        x.expect(WHAT, "x", ElemType::Bf16, &[None, None])?;
        let (num_tokens, hidden) = (x.rows(), x.cols());
        inputs
            .topk_idx
            .expect(WHAT, "topk_idx", ElemType::I64, &[Some(num_tokens), None])?;
        let num_topk = inputs.topk_idx.cols();
        let layout = self.ll_layout(WHAT, t, hidden, num_experts, num_topk)?;
        self.check_phases(WHAT, phases, &layout)?;
        if num_tokens > t {
            return Err(invalid(
                WHAT,
                format!(
                    "x has {num_tokens} tokens, more than num_max_dispatch_tokens_per_rank = {t} \
                     (every rank's slots hold {t} tokens per expert)"
                ),
            ));
        }
        if use_ue8m0 && !(use_fp8 && round_scale) {
            return Err(invalid(
                WHAT,
                "use_ue8m0 needs use_fp8=True and round_scale=True (UE8M0 scales are powers of two)"
                    .into(),
            ));
        }
        if use_ue8m0 && !hidden.is_multiple_of(512) {
            return Err(invalid(
                WHAT,
                format!(
                    "use_ue8m0 packs 4 scales per int: hidden = {hidden} must be a multiple of 512"
                ),
            ));
        }
        let (n, l) = (layout.num_ranks, layout.num_local_experts());
        let rows = l * n * t;
        let recv_elem = if use_fp8 {
            ElemType::Fp8E4m3
        } else {
            ElemType::Bf16
        };
        outputs
            .recv_x
            .expect(WHAT, "recv_x", recv_elem, &[Some(rows), Some(hidden)])?;
        let recv_scales = match (&outputs.recv_x_scales, use_fp8) {
            (Some(s), true) => {
                let (elem, groups) = if use_ue8m0 {
                    (ElemType::I32, hidden / 512)
                } else {
                    (ElemType::F32, hidden / 128)
                };
                s.expect(
                    WHAT,
                    "recv_x_scales",
                    elem,
                    &[Some(l * groups), Some(n * t)],
                )?;
                s.ptr
            }
            (None, false) => 0,
            (None, true) => return Err(invalid(WHAT, "use_fp8 needs recv_x_scales".into())),
            (Some(_), false) => {
                return Err(invalid(WHAT, "recv_x_scales is only for use_fp8".into()));
            }
        };
        outputs.recv_src_info.expect(
            WHAT,
            "recv_src_info",
            ElemType::I32,
            &[Some(l), Some(n * t)],
        )?;
        outputs.recv_layout_range.expect(
            WHAT,
            "recv_layout_range",
            ElemType::I64,
            &[Some(l), Some(n)],
        )?;
        outputs
            .recv_count
            .expect(WHAT, "recv_count", ElemType::I32, &[Some(l)])?;
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
        let args = LlDispatchArgs {
            x: x.ptr,
            topk_idx: inputs.topk_idx.ptr,
            recv_x: outputs.recv_x.ptr,
            recv_scales,
            recv_src_info: outputs.recv_src_info.ptr,
            recv_layout_range: outputs.recv_layout_range.ptr,
            recv_count: outputs.recv_count.ptr,
            cumulative_recv_stats: cumulative,
            wait_recv_cost: wait_cost,
            region: self.ll_region(),
            state: self.ll_state(),
            bad_input: self.input_error_args(),
            num_tokens: num_tokens as i32,
            hidden: hidden as i32,
            num_topk: num_topk as i32,
            num_experts: num_experts as i32,
            max_tokens: t as i32,
            use_fp8: use_fp8 as i32,
            round_scale: round_scale as i32,
            use_ue8m0: use_ue8m0 as i32,
        };
        let pending = PendingReceive {
            op: WHAT,
            shape: layout,
        };
        self.ll_launch(&DISPATCH_KERNEL, &args, phases, pending, stream)
    }
    // ANCHOR_END: ll_dispatch
}
