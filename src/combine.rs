//! Combine: every expert result back to its token's rank, summed there
//! (kernels/cuda/buffer/combine.cu, `moe_gather`), with the handle of the dispatch.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::GatherArgs;

use crate::buffer::NvshmemBuffer;
use crate::checks;
use crate::config::Config;
use crate::error::BufferError;
use crate::handle::Handle;
use crate::regions::combine_slot_bytes;
use crate::spec::{BufferSpec, Progress};
use crate::view::{ElemType, View};

/// What a combine sends back: `x` [M, H] bf16 (one row per row the dispatch delivered here),
/// optional `topk_weights` [M, K] f32 (summed back too), optional biases [N, H] bf16 added
/// once on the token's rank.
#[derive(Debug, Clone, Copy)]
pub struct CombineInputs {
    pub x: View,
    pub topk_weights: Option<View>,
    pub bias: [Option<View>; 2],
}

/// What a combine fills: `combined_x` [N, H] bf16, `combined_topk_weights` [N, K] f32 (with
/// `topk_weights`).
#[derive(Debug, Clone, Copy)]
pub struct CombineOutputs {
    pub combined_x: View,
    pub combined_topk_weights: Option<View>,
}

/// A checked combine: `moe_gather` on `num_channels` channels with these arguments.
#[derive(Debug, Clone, Copy)]
pub struct CombinePlan {
    pub args: GatherArgs,
    pub num_channels: usize,
}

// ANCHOR: plan_combine
/// Checks a combine with the handle of the dispatch that delivered `x`'s rows (cached or
/// not) for `config`, and plans it.
pub fn plan_combine(
    spec: &BufferSpec,
    config: &Config,
    inputs: &CombineInputs,
    handle: &Handle,
    outputs: &CombineOutputs,
) -> Result<CombinePlan, BufferError> {
    const WHAT: &str = "combine";
    let (n, c) = checks::intranode_call(WHAT, spec, config)?;
    handle.check(WHAT, n, c)?;
    let (num_tokens, rows) = (handle.num_tokens(), handle.num_recv_tokens());
    let x = &inputs.x;
    x.expect(WHAT, "x", ElemType::Bf16, &[Some(rows), None])?;
    x.expect_aligned(WHAT, "x", 16)?;
    let hidden = x.cols();
    let hidden_bytes = hidden * 2;
    checks::row_bytes(WHAT, hidden_bytes)?;
    let num_topk = match &inputs.topk_weights {
        Some(w) => {
            w.expect(WHAT, "topk_weights", ElemType::F32, &[Some(rows), None])?;
            w.cols()
        }
        None => 0,
    };
    checks::num_topk(WHAT, num_topk)?;
    let tokens_by_hidden = [Some(num_tokens), Some(hidden)];
    for (bias, name) in inputs.bias.iter().zip(["bias[0]", "bias[1]"]) {
        if let Some(b) = bias {
            b.expect(WHAT, name, ElemType::Bf16, &tokens_by_hidden)?;
            b.expect_aligned(WHAT, name, 16)?;
        }
    }
    let combined_x = &outputs.combined_x;
    combined_x.expect(WHAT, "combined_x", ElemType::Bf16, &tokens_by_hidden)?;
    combined_x.expect_aligned(WHAT, "combined_x", 16)?;
    if let Some(w) = &outputs.combined_topk_weights {
        let shape = [Some(num_tokens), Some(num_topk)];
        w.expect(WHAT, "combined_topk_weights", ElemType::F32, &shape)?;
    }
    let slot_bytes = combine_slot_bytes(hidden_bytes, num_topk);
    let ring_tokens = config.num_max_nvl_chunked_recv_tokens as usize;
    checks::rings_fit(
        WHAT,
        (n, spec.options.num_nvl_bytes),
        c,
        ring_tokens,
        slot_bytes,
    )?;
    let opt = |v: &Option<View>| v.map_or(0, |v| v.ptr);
    let args = GatherArgs {
        x: x.ptr,
        topk_weights: opt(&inputs.topk_weights),
        bias0: opt(&inputs.bias[0]),
        bias1: opt(&inputs.bias[1]),
        rank_prefix_matrix: handle.rank_prefix_matrix.ptr,
        recv_channel_prefix_matrix: handle.recv_channel_prefix_matrix.ptr,
        send_head: handle.send_head.ptr,
        combined_x: combined_x.ptr,
        combined_topk_weights: opt(&outputs.combined_topk_weights),
        nvl: spec.nvl(),
        tails: spec.counters(2),
        heads: spec.counters(3),
        sent: spec.progress(Progress::CombineSent),
        received: spec.progress(Progress::CombineReceived),
        bad_input: spec.input_error,
        num_tokens: num_tokens as i32,
        hidden_bytes: hidden_bytes as i32,
        num_topk: num_topk as i32,
        num_channels: c as i32,
        ring_tokens: ring_tokens as i32,
        slot_bytes: slot_bytes as i32,
        num_recv_rows: rows as i32,
    };
    Ok(CombinePlan {
        args,
        num_channels: c,
    })
}
// ANCHOR_END: plan_combine

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: combine
    /// Combine (see `plan_combine`): combined_x[t] = bias0[t] + bias1[t] + the results of
    /// every rank t went to, in rank order, summed in fp32 and rounded once.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`.
    pub unsafe fn combine_raw(
        &self,
        inputs: &CombineInputs,
        handle: &Handle,
        outputs: &CombineOutputs,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_combine(&self.spec, config, inputs, handle, outputs)?;
        // SAFETY: a checked plan; the caller vouches for the views and the stream.
        unsafe { self.launch_channels("moe_gather", plan.num_channels, &plan.args, stream) }
    }
    // ANCHOR_END: combine
}
