//! Dispatch: every token to the ranks that hold its experts (kernels/cuda/buffer/
//! intranode.cu, `moe_scatter`). The notify step (or a cached handle) has already told
//! every rank how many tokens come from whom and in which channel.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::{MAX_TOPK, ScatterArgs};

use crate::buffer::{NvshmemBuffer, Progress};
use crate::config::Config;
use crate::error::BufferError;
use crate::handle::Handle;
use crate::layout::{Regions, dispatch_slot};
use crate::view::{ElemType, View};

/// What a dispatch sends. `x` is [N, H] bf16, or fp8 e4m3 with `x_scales` [N, H / 128] f32
/// (any strides: DeepEP's test passes column-major ones). `topk_idx` [N, K] i64 (global
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

/// What a dispatch fills: `recv_x` [M, H] (x's dtype), `recv_x_scales` [M, S] f32 (row
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

fn ptr_or_null(view: Option<&View>) -> u64 {
    view.map_or(0, |v| v.ptr)
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: dispatch
    /// Dispatch with a handle: the notify step's matrices (fresh from `notify`, or cached
    /// from an earlier dispatch with the same routing), `send_head` to fill, `recv_src_idx`
    /// to fill. Received rows are grouped by source rank, in source-token order within each.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU:
    /// nothing on the host can check a device address, and the kernels write the outputs.
    pub unsafe fn dispatch(
        &self,
        inputs: &DispatchInputs,
        handle: &Handle,
        outputs: &DispatchOutputs,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "dispatch";
        self.check()?;
        let n = self.world().n_pes();
        config.check_for_launch(n)?;
        let c = config.num_channels();
        handle.check(WHAT, n, c)?;
        let (num_tokens, rows) = (handle.num_tokens(), outputs.recv_x.rows());
        let x = &inputs.x;
        let fp8 = match x.elem {
            ElemType::Bf16 => false,
            ElemType::Fp8E4m3 => true,
            other => {
                return Err(BufferError::invalid(
                    WHAT,
                    format!("x must be bfloat16 or float8_e4m3fn, got {}", other.name()),
                ));
            }
        };
        x.expect(WHAT, "x", x.elem, &[Some(num_tokens), None])?;
        let hidden = x.cols();
        let hidden_bytes = hidden * x.elem.size();
        if !hidden_bytes.is_multiple_of(16) {
            return Err(BufferError::invalid(
                WHAT,
                format!("a row of x is {hidden_bytes} bytes; rows must be a multiple of 16 bytes"),
            ));
        }
        let num_scales = match (fp8, &inputs.x_scales) {
            (true, Some(s)) => {
                if s.elem != ElemType::F32 || s.dims != 2 || s.rows() != num_tokens {
                    return Err(BufferError::invalid(
                        WHAT,
                        format!(
                            "x_scales must be float32 [{num_tokens}, S], got {} {:?}",
                            s.elem.name(),
                            &s.shape[..s.dims]
                        ),
                    ));
                }
                s.cols()
            }
            (true, None) => return Err(BufferError::invalid(WHAT, "fp8 x comes as (x, x_scales)")),
            (false, Some(_)) => {
                return Err(BufferError::invalid(WHAT, "x_scales only go with fp8 x"));
            }
            (false, None) => 0,
        };
        let num_topk = match (&inputs.topk_idx, &inputs.topk_weights) {
            (Some(i), Some(w)) => {
                i.expect(WHAT, "topk_idx", ElemType::I64, &[Some(num_tokens), None])?;
                w.expect(
                    WHAT,
                    "topk_weights",
                    ElemType::F32,
                    &[Some(num_tokens), Some(i.cols())],
                )?;
                i.cols()
            }
            (None, None) => 0,
            _ => {
                return Err(BufferError::invalid(
                    WHAT,
                    "topk_idx and topk_weights come together or not at all",
                ));
            }
        };
        if num_topk > MAX_TOPK {
            return Err(BufferError::invalid(
                WHAT,
                format!("{num_topk} experts per token; at most {MAX_TOPK}"),
            ));
        }
        outputs
            .recv_x
            .expect(WHAT, "recv_x", x.elem, &[None, Some(hidden)])?;
        handle
            .recv_src_idx
            .expect(WHAT, "recv_src_idx", ElemType::I32, &[Some(rows)])?;
        if let Some(s) = &outputs.recv_x_scales {
            s.expect(
                WHAT,
                "recv_x_scales",
                ElemType::F32,
                &[Some(rows), Some(num_scales)],
            )?;
        }
        match (&outputs.recv_topk_idx, &outputs.recv_topk_weights) {
            (Some(i), Some(w)) => {
                i.expect(
                    WHAT,
                    "recv_topk_idx",
                    ElemType::I64,
                    &[Some(rows), Some(num_topk)],
                )?;
                w.expect(
                    WHAT,
                    "recv_topk_weights",
                    ElemType::F32,
                    &[Some(rows), Some(num_topk)],
                )?;
            }
            (None, None) if num_topk == 0 => {}
            _ => {
                return Err(BufferError::invalid(
                    WHAT,
                    "recv_topk_idx and recv_topk_weights go with topk_idx",
                ));
            }
        }
        if num_topk > 0 && (inputs.num_experts == 0 || !inputs.num_experts.is_multiple_of(n)) {
            return Err(BufferError::invalid(
                WHAT,
                format!(
                    "num_experts = {} must be a positive multiple of {n}",
                    inputs.num_experts
                ),
            ));
        }
        let slot = dispatch_slot(hidden_bytes, num_topk, num_scales);
        let ring_tokens = config.num_max_nvl_chunked_recv_tokens as usize;
        self.check_rings_fit(WHAT, c, ring_tokens, slot.bytes as usize)?;
        let (token_stride, hidden_stride) = inputs
            .x_scales
            .map_or((0, 0), |s| (s.strides[0] as i64, s.strides[1] as i64));
        let args = ScatterArgs {
            x: x.ptr,
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
            nvl: self.base + Regions::nvl() as u64,
            tails: self.counters(0),
            heads: self.counters(1),
            sent: self.progress(Progress::DispatchSent),
            received: self.progress(Progress::DispatchReceived),
            slot,
            num_tokens: num_tokens as i32,
            num_experts: inputs.num_experts as i32,
            num_channels: c as i32,
            ring_tokens: ring_tokens as i32,
            num_recv_rows: rows as i32,
        };
        self.launch_channels("moe_scatter", c, &args, stream)
    }
    // ANCHOR_END: dispatch
}
