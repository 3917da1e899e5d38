//! Combine: every expert result back to its token's rank, summed there
//! (kernels/cuda/buffer/intranode.cu, `moe_gather`), with the handle of the dispatch.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::GatherArgs;

use crate::buffer::{NvshmemBuffer, Progress};
use crate::config::Config;
use crate::error::BufferError;
use crate::handle::Handle;
use crate::layout::{Regions, combine_slot_bytes};
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

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: combine
    /// Combine with the handle of the dispatch that delivered `x`'s rows (cached or not):
    /// combined_x[t] = bias0[t] + bias1[t] + the results of every rank t went to, in rank
    /// order, summed in fp32 and rounded once.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU:
    /// nothing on the host can check a device address, and the kernels write the outputs.
    pub unsafe fn combine(
        &self,
        inputs: &CombineInputs,
        handle: &Handle,
        outputs: &CombineOutputs,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "combine";
        self.check()?;
        let n = self.world().n_pes();
        config.check_for_launch(n)?;
        let c = config.num_channels();
        handle.check(WHAT, n, c)?;
        let (num_tokens, rows) = (handle.num_tokens(), handle.num_recv_tokens());
        let x = &inputs.x;
        x.expect(WHAT, "x", ElemType::Bf16, &[Some(rows), None])?;
        let hidden = x.cols();
        let hidden_bytes = hidden * 2;
        if !hidden_bytes.is_multiple_of(16) {
            return Err(BufferError::invalid(
                WHAT,
                format!("a row of x is {hidden_bytes} bytes; rows must be a multiple of 16 bytes"),
            ));
        }
        let num_topk = match &inputs.topk_weights {
            Some(w) => {
                w.expect(WHAT, "topk_weights", ElemType::F32, &[Some(rows), None])?;
                w.cols()
            }
            None => 0,
        };
        for (i, bias) in inputs.bias.iter().enumerate() {
            if let Some(b) = bias {
                b.expect(
                    WHAT,
                    if i == 0 { "bias[0]" } else { "bias[1]" },
                    ElemType::Bf16,
                    &[Some(num_tokens), Some(hidden)],
                )?;
            }
        }
        outputs.combined_x.expect(
            WHAT,
            "combined_x",
            ElemType::Bf16,
            &[Some(num_tokens), Some(hidden)],
        )?;
        if let Some(w) = &outputs.combined_topk_weights {
            w.expect(
                WHAT,
                "combined_topk_weights",
                ElemType::F32,
                &[Some(num_tokens), Some(num_topk)],
            )?;
        }
        let slot_bytes = combine_slot_bytes(hidden_bytes, num_topk);
        let ring_tokens = config.num_max_nvl_chunked_recv_tokens as usize;
        self.check_rings_fit(WHAT, c, ring_tokens, slot_bytes)?;
        let opt = |v: &Option<View>| v.map_or(0, |v| v.ptr);
        let args = GatherArgs {
            x: x.ptr,
            topk_weights: opt(&inputs.topk_weights),
            bias0: opt(&inputs.bias[0]),
            bias1: opt(&inputs.bias[1]),
            rank_prefix_matrix: handle.rank_prefix_matrix.ptr,
            recv_channel_prefix_matrix: handle.recv_channel_prefix_matrix.ptr,
            send_head: handle.send_head.ptr,
            combined_x: outputs.combined_x.ptr,
            combined_topk_weights: opt(&outputs.combined_topk_weights),
            nvl: self.base + Regions::nvl() as u64,
            tails: self.counters(2),
            heads: self.counters(3),
            sent: self.progress(Progress::CombineSent),
            received: self.progress(Progress::CombineReceived),
            num_tokens: num_tokens as i32,
            hidden_bytes: hidden_bytes as i32,
            num_topk: num_topk as i32,
            num_channels: c as i32,
            ring_tokens: ring_tokens as i32,
            slot_bytes: slot_bytes as i32,
        };
        self.launch_channels("moe_gather", c, &args, stream)
    }
    // ANCHOR_END: combine
}
