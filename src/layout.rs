//! The layout step (kernels/cuda/buffer/layout.cu, `moe_layout`): from each token's top-k
//! experts, how many tokens go to each rank, to each node and to each expert, and which ranks
//! each token goes to. Local: no communication. DeepEP's `get_dispatch_layout`.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;
use kernels::contract::{LAYOUT_THREADS, LayoutArgs};

use crate::buffer::{Blocks, NvshmemBuffer, arg};
use crate::checks;
use crate::error::BufferError;
use crate::regions::MAX_EXPERTS;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

/// What `get_dispatch_layout` fills: tokens per rank [R] i32, per node [R / G] i32 (DeepEP's
/// `num_tokens_per_rdma_rank`: a token counts once per node it has an expert on; `None` when the
/// buffer spans one node, as DeepEP's), per expert [E] i32, and the routing [N, R] bool.
#[derive(Debug, Clone, Copy)]
pub struct LayoutOutputs {
    pub num_tokens_per_rank: View,
    pub num_tokens_per_rdma_rank: Option<View>,
    pub num_tokens_per_expert: View,
    pub is_token_in_rank: View,
}

/// A checked layout step: the counts to zero, then one launch of `moe_layout` with `args`.
#[derive(Debug, Clone, Copy)]
pub struct LayoutPlan {
    pub launch: LaunchSpec,
    /// The counts the kernel adds into: (address, bytes), zeroed on the stream first (bytes 0:
    /// none, the per-node counts of a one-node buffer).
    pub zeroed: [(u64, usize); 3],
    pub args: LayoutArgs,
}

// ANCHOR: plan_layout
/// Checks a layout step of `topk_idx` [N, K] i64 (global expert ids, -1 for none) over
/// `num_experts` experts into `out`, and plans it: a grid of one thread per token, at most
/// one block per SM of this PE. Any number of ranks the buffer holds: a token's ranks are not a
/// mask but found among its K experts.
pub fn plan_layout(
    spec: &BufferSpec,
    topk_idx: &View,
    num_experts: usize,
    out: &LayoutOutputs,
) -> Result<LayoutPlan, BufferError> {
    const WHAT: &str = "get_dispatch_layout";
    let n = spec.n_pes;
    let num_nodes = n / spec.node_pes;
    checks::num_experts(WHAT, "num_experts", num_experts, n, MAX_EXPERTS)?;
    topk_idx.expect(WHAT, "topk_idx", ElemType::I64, &[None, None])?;
    let (num_tokens, num_topk) = (topk_idx.rows(), topk_idx.cols());
    checks::num_topk(WHAT, num_topk)?;
    out.num_tokens_per_rank
        .expect(WHAT, "num_tokens_per_rank", ElemType::I32, &[Some(n)])?;
    match (num_nodes, &out.num_tokens_per_rdma_rank) {
        (1, None) => {}
        (1, Some(_)) => {
            return Err(BufferError::invalid(
                WHAT,
                "num_tokens_per_rdma_rank given for a buffer of one node: there are no per-node \
                 counts to fill; pass none",
            ));
        }
        (_, None) => {
            return Err(BufferError::invalid(
                WHAT,
                format!(
                    "num_tokens_per_rdma_rank missing: the buffer spans {num_nodes} nodes of {} \
                     ranks; pass an int32 tensor of {num_nodes} entries",
                    spec.node_pes
                ),
            ));
        }
        (_, Some(view)) => view.expect(
            WHAT,
            "num_tokens_per_rdma_rank",
            ElemType::I32,
            &[Some(num_nodes)],
        )?,
    }
    out.num_tokens_per_expert.expect(
        WHAT,
        "num_tokens_per_expert",
        ElemType::I32,
        &[Some(num_experts)],
    )?;
    out.is_token_in_rank.expect(
        WHAT,
        "is_token_in_rank",
        ElemType::Bool,
        &[Some(num_tokens), Some(n)],
    )?;
    let (per_node, per_node_bytes) = match out.num_tokens_per_rdma_rank {
        Some(view) => (view.ptr, num_nodes * 4),
        None => (0, 0),
    };
    let num_blocks = num_tokens
        .div_ceil(LAYOUT_THREADS as usize)
        .clamp(1, spec.num_sms as usize) as u32;
    Ok(LayoutPlan {
        launch: LaunchSpec {
            kernel: "moe_layout",
            num_blocks,
            threads_per_block: LAYOUT_THREADS,
            shared_mem_bytes: ((n + num_experts + per_node_bytes / 4) * 4) as u32,
        },
        zeroed: [
            (out.num_tokens_per_rank.ptr, n * 4),
            (out.num_tokens_per_expert.ptr, num_experts * 4),
            (per_node, per_node_bytes),
        ],
        args: LayoutArgs {
            topk_idx: topk_idx.ptr,
            num_tokens_per_rank: out.num_tokens_per_rank.ptr,
            num_tokens_per_rdma_rank: per_node,
            num_tokens_per_expert: out.num_tokens_per_expert.ptr,
            is_token_in_rank: out.is_token_in_rank.ptr,
            bad_input: spec.input_error,
            num_tokens: num_tokens as i32,
            num_topk: num_topk as i32,
            num_experts: num_experts as i32,
            n_pes: n as i32,
            node_pes: spec.node_pes as i32,
        },
    })
}
// ANCHOR_END: plan_layout

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// The layout step on `stream` (see `plan_layout`). An expert id outside -1..num_experts
    /// is reported by the next `check()` (every dispatch makes one), as
    /// `BufferError::BadExpert`.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU, and
    /// `stream` must be a live stream of the buffer's context: nothing on the host can check
    /// a device address, and the kernel writes the outputs.
    pub unsafe fn get_dispatch_layout_raw(
        &self,
        topk_idx: &View,
        num_experts: usize,
        out: &LayoutOutputs,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let p = plan_layout(&self.spec, topk_idx, num_experts, out)?;
        for (ptr, bytes) in p.zeroed.into_iter().filter(|&(_, bytes)| bytes > 0) {
            // SAFETY: the plan checked that the views hold these many bytes.
            unsafe { self.memset_zero(ptr, bytes, stream, "zeroing the layout counts") }?;
        }
        // SAFETY: the kernel's one parameter, from a checked plan; the caller vouches for the
        // views and the stream.
        unsafe { self.launch(p.launch, Blocks::MayWait, stream, &mut [arg(&p.args)]) }
    }
}
