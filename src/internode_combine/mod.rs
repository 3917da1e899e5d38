//! Normal mode's combine across nodes (issue 32, step 5; kernels/cuda/buffer/internode_combine.cu,
//! design: benchmarks/notes/buffer_internode_normal.md 2.7 and 8). The dispatch backwards, with
//! its handle: each rank's rows go back through the NVL stage to the forwarder they came
//! through, which sums a token's rows of its node (fp32, member order, one rounding) and sends
//! the sum once across the network to the token's rank, in the dispatch's RDMA rings; there
//! the nodes' sums and the two optional biases are added (fp32, node order, one rounding).
//! The top-k weights come back summed the same way. bf16 only (DeepEP's combine is too).
//!
//! This module holds the call's types and the launch; `plan` every check and the argument struct.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;
use kernels::contract::InternodeCombineArgs;

use crate::buffer::NvshmemBuffer;
use crate::combine::{CombineInputs, CombineOutputs};
use crate::config::Config;
use crate::error::BufferError;
use crate::internode_notify::InternodeHandle;
use crate::view::View;

/// What the combine reads of its dispatch's handle (DeepEP's 10-tuple, section 2.10): T tokens,
/// n ranks in N nodes of G, M_r rows forwarded. Position 7 (`recv_src_meta`) is not read.
#[derive(Debug, Clone, Copy)]
pub struct InternodeCombineHandle {
    /// [T, n] bool, position 0: the cached notify before the combine checks positions 1-2
    /// against it.
    pub is_token_in_rank: View,
    /// Positions 1-6, as the full notify wrote them.
    pub prefixes: InternodeHandle,
    /// [T, N] i32, position 8: token t's index in its channel's stream to node k, -1 if none.
    pub send_rdma_head: View,
    /// [M_r, G] i32, position 9: -1 where forwarded row j skipped local rank l' (only the -1
    /// entries are read: a row's place in l''s stream back is its count among them).
    pub send_nvl_head: View,
}

/// One combine's views: what each rank sends back (a row per row the dispatch delivered, in
/// its order), the dispatch's handle, and what the combine fills ([T, H] rows, [T, K] weights).
#[derive(Debug, Clone, Copy)]
pub struct InternodeCombineCall {
    pub inputs: CombineInputs,
    pub handle: InternodeCombineHandle,
    pub outputs: CombineOutputs,
}

/// A checked internode combine: the kernel's arguments and its channels (grid 2C).
#[derive(Debug, Clone, Copy)]
pub struct InternodeCombinePlan {
    pub args: InternodeCombineArgs,
    pub num_channels: usize,
}

mod plan;
#[cfg(test)]
mod tests;

pub use plan::plan_internode_combine;

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: internode_combine
    /// The combine across nodes of `call`, with the handle of the dispatch that delivered
    /// `call.inputs.x`'s rows, on `stream`: combined_x[t] = bias0[t] + bias1[t] + the rows of every rank t went
    /// to, summed per node (member order) and then over nodes (node order), in fp32, rounded
    /// to bf16 once per node and once at home; the weights likewise (never rounded). First the
    /// cached notify, as DeepEP's `internode_combine` (the entry barrier: the dispatch before
    /// has finished on every rank, so the rings change their slots). Collective: every rank
    /// makes the same calls in the same order.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`: the views are live device memory of this GPU, `stream` a
    /// live stream of this buffer's context, and `handle` is the dispatch's, on the same stream.
    pub unsafe fn internode_combine_raw(
        &self,
        call: &InternodeCombineCall,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_internode_combine(&self.spec, config, call)?;
        let handle = (call.handle.is_token_in_rank, &call.handle.prefixes);
        let planned = (plan.num_channels, &plan.args);
        // SAFETY: a checked plan for this handle; the caller vouches for the views and stream.
        unsafe {
            self.launch_after_cached_notify("internode_combine", handle, config, planned, stream)
        }
    }
    // ANCHOR_END: internode_combine
}
