//! Dispatch: every token to the ranks that hold its experts (kernels/cuda/buffer/
//! dispatch.cu, `moe_scatter`). The notify step (or a cached handle) has already told
//! every rank how many tokens come from whom and in which channel.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::ScatterArgs;

use crate::buffer::NvshmemBuffer;
use crate::checks;
use crate::config::Config;
use crate::error::BufferError;
use crate::handle::Handle;
use crate::regions::{MAX_EXPERTS, dispatch_slot};
use crate::spec::{BufferSpec, Progress};
use crate::view::{ElemType, View};

/// What a dispatch sends. `x` is [N, H] bf16, or fp8 e4m3 with `x_scales` [N, S] f32 or
/// int32 (any strides: DeepEP's test passes column-major ones). `topk_idx` [N, K] i64 (global
/// expert ids, -1 for none) and `topk_weights` [N, K] f32 come together or not at all.
#[derive(Debug, Clone, Copy)]
pub struct DispatchInputs {
    pub x: View,
    pub x_scales: Option<View>,
    pub topk_idx: Option<View>,
    pub topk_weights: Option<View>,
    /// Global expert count (local ids are `id - rank * num_experts / n_pes`).
    pub num_experts: usize,
}

/// What a dispatch fills: `recv_x` [M, H] (x's dtype), `recv_x_scales` [M, S] (x_scales' dtype, row
/// major), `recv_src_idx` [M] i32, `recv_topk_idx` [M, K] i64 (local ids, -1 for other
/// ranks' experts and past the received rows), `recv_topk_weights` [M, K] f32 (0 where -1).
/// M is the number of tokens received, or `num_worst_tokens` for fixed-size outputs.
#[derive(Debug, Clone, Copy)]
pub struct DispatchOutputs {
    pub recv_x: View,
    pub recv_x_scales: Option<View>,
    pub recv_topk_idx: Option<View>,
    pub recv_topk_weights: Option<View>,
}

/// A checked dispatch: `moe_scatter` on `num_channels` channels with these arguments.
#[derive(Debug, Clone, Copy)]
pub struct DispatchPlan {
    pub args: ScatterArgs,
    pub num_channels: usize,
}

fn ptr_or_null(view: Option<&View>) -> u64 {
    view.map_or(0, |v| v.ptr)
}

/// The scales that go with `x`: none for bf16, or for fp8 f32 (or int32, packed UE8M0, as
/// DeepEP takes them: copied as 4-byte words either way) [num_tokens, S] with any strides
/// (DeepEP's test passes column-major ones). Returns (S, their dtype).
fn x_scales_format(
    what: &'static str,
    x: &View,
    x_scales: &Option<View>,
    num_tokens: usize,
) -> Result<(usize, ElemType), BufferError> {
    let fp8 = match x.elem {
        ElemType::Bf16 => false,
        ElemType::Fp8E4m3 => true,
        other => {
            return Err(BufferError::invalid(
                what,
                format!("x must be bfloat16 or float8_e4m3fn, got {}", other.name()),
            ));
        }
    };
    match (fp8, x_scales) {
        (true, Some(s)) => {
            let four_bytes = matches!(s.elem, ElemType::F32 | ElemType::I32);
            if !four_bytes || s.dims != 2 || s.rows() != num_tokens {
                return Err(BufferError::invalid(
                    what,
                    format!(
                        "x_scales must be float32 or int32 [{num_tokens}, S], got {} {:?}",
                        s.elem.name(),
                        &s.shape[..s.dims]
                    ),
                ));
            }
            s.expect_aligned(what, "x_scales", 4)?;
            Ok((s.cols(), s.elem))
        }
        (true, None) => Err(BufferError::invalid(what, "fp8 x comes as (x, x_scales)")),
        (false, Some(_)) => Err(BufferError::invalid(what, "x_scales only go with fp8 x")),
        (false, None) => Ok((0, ElemType::F32)),
    }
}

/// What a dispatch's rows hold: their dtype and width, their scales, their top-k.
pub(crate) struct RowFormat {
    pub(crate) elem: ElemType,
    pub(crate) hidden: usize,
    pub(crate) num_scales: usize,
    scale_elem: ElemType,
    pub(crate) num_topk: usize,
}

impl RowFormat {
    pub(crate) fn hidden_bytes(&self) -> usize {
        self.hidden * self.elem.size()
    }
    /// The scales' dtype (f32 or int32; f32 when there are none).
    pub(crate) fn scale_elem(&self) -> ElemType {
        self.scale_elem
    }
}

const WHAT: &str = "dispatch";

/// The inputs of `num_tokens` tokens on `n` ranks, checked: what their rows hold (the
/// internode dispatch checks its inputs here too, as `what`).
pub(crate) fn check_inputs(
    what: &'static str,
    inputs: &DispatchInputs,
    num_tokens: usize,
    n: usize,
) -> Result<RowFormat, BufferError> {
    let x = &inputs.x;
    let (num_scales, scale_elem) = x_scales_format(what, x, &inputs.x_scales, num_tokens)?;
    x.expect(what, "x", x.elem, &[Some(num_tokens), None])?;
    x.expect_aligned(what, "x", 16)?;
    checks::row_bytes(what, x.cols() * x.elem.size())?;
    let num_topk = match (&inputs.topk_idx, &inputs.topk_weights) {
        (Some(i), Some(w)) => {
            i.expect(what, "topk_idx", ElemType::I64, &[Some(num_tokens), None])?;
            let shape = [Some(num_tokens), Some(i.cols())];
            w.expect(what, "topk_weights", ElemType::F32, &shape)?;
            i.cols()
        }
        (None, None) => 0,
        _ => {
            return Err(BufferError::invalid(
                what,
                "topk_idx and topk_weights come together or not at all",
            ));
        }
    };
    checks::num_topk(what, num_topk)?;
    if num_topk > 0 {
        checks::num_experts(what, "num_experts", inputs.num_experts, n, MAX_EXPERTS)?;
    }
    Ok(RowFormat {
        elem: x.elem,
        hidden: x.cols(),
        num_scales,
        scale_elem,
        num_topk,
    })
}

/// The outputs for rows of format `f`, checked against each other and the handle: how many
/// rows they hold.
fn check_outputs(
    outputs: &DispatchOutputs,
    handle: &Handle,
    f: &RowFormat,
) -> Result<usize, BufferError> {
    let rows = outputs.recv_x.rows();
    let recv_x = &outputs.recv_x;
    recv_x.expect(WHAT, "recv_x", f.elem, &[None, Some(f.hidden)])?;
    recv_x.expect_aligned(WHAT, "recv_x", 16)?;
    let src_idx = &handle.recv_src_idx;
    src_idx.expect(WHAT, "recv_src_idx", ElemType::I32, &[Some(rows)])?;
    match (&outputs.recv_x_scales, f.num_scales) {
        (Some(s), _) => {
            let shape = [Some(rows), Some(f.num_scales)];
            s.expect(WHAT, "recv_x_scales", f.scale_elem, &shape)?;
        }
        (None, 0) => {}
        (None, _) => return Err(BufferError::invalid(WHAT, "fp8 x needs recv_x_scales")),
    }
    match (&outputs.recv_topk_idx, &outputs.recv_topk_weights) {
        (Some(i), Some(w)) => {
            let shape = [Some(rows), Some(f.num_topk)];
            i.expect(WHAT, "recv_topk_idx", ElemType::I64, &shape)?;
            w.expect(WHAT, "recv_topk_weights", ElemType::F32, &shape)?;
        }
        (None, None) if f.num_topk == 0 => {}
        _ => {
            return Err(BufferError::invalid(
                WHAT,
                "recv_topk_idx and recv_topk_weights go with topk_idx",
            ));
        }
    }
    Ok(rows)
}

// ANCHOR: plan_dispatch
/// Checks a dispatch with `handle` (the notify step's matrices, fresh or cached) into
/// `outputs` for `config`, and plans it.
pub fn plan_dispatch(
    spec: &BufferSpec,
    config: &Config,
    inputs: &DispatchInputs,
    handle: &Handle,
    outputs: &DispatchOutputs,
) -> Result<DispatchPlan, BufferError> {
    let (n, c) = checks::intranode_call(WHAT, spec, config)?;
    handle.check(WHAT, n, c)?;
    let num_tokens = handle.num_tokens();
    let format = check_inputs(WHAT, inputs, num_tokens, n)?;
    let rows = check_outputs(outputs, handle, &format)?;
    let slot = dispatch_slot(format.hidden_bytes(), format.num_topk, format.num_scales);
    let ring_tokens = config.num_max_nvl_chunked_recv_tokens as usize;
    let have = (n, spec.options.num_nvl_bytes);
    checks::rings_fit(WHAT, have, c, ring_tokens, slot.bytes as usize)?;
    let (token_stride, hidden_stride) = inputs
        .x_scales
        .map_or((0, 0), |s| (s.strides[0] as i64, s.strides[1] as i64));
    let args = ScatterArgs {
        x: inputs.x.ptr,
        x_scales: ptr_or_null(inputs.x_scales.as_ref()),
        scale_token_stride: token_stride,
        scale_hidden_stride: hidden_stride,
        topk_idx: ptr_or_null(inputs.topk_idx.as_ref()),
        topk_weights: ptr_or_null(inputs.topk_weights.as_ref()),
        is_token_in_rank: handle.is_token_in_rank.ptr,
        channel_prefix_matrix: handle.channel_prefix_matrix.ptr,
        send_head: handle.send_head.ptr,
        rank_prefix_matrix: handle.rank_prefix_matrix.ptr,
        recv_channel_prefix_matrix: handle.recv_channel_prefix_matrix.ptr,
        recv_x: outputs.recv_x.ptr,
        recv_x_scales: ptr_or_null(outputs.recv_x_scales.as_ref()),
        recv_src_idx: handle.recv_src_idx.ptr,
        recv_topk_idx: ptr_or_null(outputs.recv_topk_idx.as_ref()),
        recv_topk_weights: ptr_or_null(outputs.recv_topk_weights.as_ref()),
        nvl: spec.nvl(),
        tails: spec.counters(0),
        heads: spec.counters(1),
        sent: spec.progress(Progress::DispatchSent),
        received: spec.progress(Progress::DispatchReceived),
        bad_input: spec.input_error,
        slot,
        num_tokens: num_tokens as i32,
        num_experts: inputs.num_experts as i32,
        num_channels: c as i32,
        ring_tokens: ring_tokens as i32,
        num_recv_rows: rows as i32,
    };
    Ok(DispatchPlan {
        args,
        num_channels: c,
    })
}
// ANCHOR_END: plan_dispatch

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: dispatch
    /// Dispatch with a handle (see `plan_dispatch`). Received rows are grouped by source
    /// rank, in source-token order within each.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`.
    pub unsafe fn dispatch_raw(
        &self,
        inputs: &DispatchInputs,
        handle: &Handle,
        outputs: &DispatchOutputs,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_dispatch(&self.spec, config, inputs, handle, outputs)?;
        // SAFETY: a checked plan; the caller vouches for the views and the stream.
        unsafe { self.launch_channels("moe_scatter", plan.num_channels, &plan.args, stream) }
    }
    // ANCHOR_END: dispatch
}
