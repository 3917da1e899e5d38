//! Normal mode's notify step across nodes (issue 32, step 3; kernels/cuda/buffer/internode_notify.cu,
//! design: benchmarks/notes/buffer_internode_normal.md 2.3 and 2.5). One launch of 1 + N blocks
//! gives DeepEP's handle positions 1-6 and the host's counts, by the two-level exchange that
//! `internode::two_level` models on the host: a rail row to each node's rank with our local
//! index (put-with-signal across nodes), then the node's rows read through peer pointers. Its
//! cached flavour is the entry barrier alone, with a check of the handle.
//!
//! This module holds the notify's area (where its words and rows live in the buffer's
//! allocation), the plan (every check, then the kernel's argument struct) and the launch.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;
use kernels::contract::{
    INTERNODE_NOTIFY_THREADS, InternodeNotifyArgs, MAX_CHANNELS, MAX_DISPATCH_BLOCKS, MAX_NODES,
    MAX_NORMAL_RANKS, MAX_PES, MAX_RDMA_CHUNKS,
};

use crate::buffer::NvshmemBuffer;
use crate::config::Config;
use crate::error::BufferError;
use crate::regions::MAX_EXPERTS;
use crate::view::View;

// ANCHOR: notify_area
/// The internode notify's area, after the rdma region of a normal-mode buffer across N nodes of
/// G ranks (`Regions::notify_area`). Offsets from its start, each 256-byte aligned:
///
/// ```text
/// signals  [3][MAX_NODES] u64       signals[p][b]: rows of parity p from node b's rail peer;
///                                   signals[2][b]: its cached notifies (the kernel's NOTES)
/// tickets  [MAX_PES] u64            tickets[l]: the last notify node member l has every row of
/// rows     [2][N][row_stride] i32   rows[p][b]: the rail row from node b, parity p
/// staging  [2][N][row_stride] i32   staging[p][k]: our row for node k, read by the put
/// then the dispatch's ring words (internode_dispatch.cu), u64, from `chunk_words()`:
/// chunks   [MAX_CHANNELS][N][MAX_RDMA_CHUNKS]  the word of each chunk of landing ring (c, b)
/// heads    [MAX_CHANNELS][N]        positions node k's forwarder consumed of our ring (c, k)
/// sent, received [MAX_CHANNELS][N]  the sender's and the forwarder's positions (local use)
/// calls    [MAX_DISPATCH_BLOCKS]    the dispatches each block finished (local use)
/// then the combine's (internode_combine.cu; its RDMA rings use the dispatch's words above):
/// calls    [MAX_DISPATCH_BLOCKS]    the combines each block finished (local use)
/// NVL sub-ring words [MAX_CHANNELS][MAX_NORMAL_RANKS] each, by (member, node) = l N + k:
///          tails, heads (symmetric), sent, received (local use)
/// ```
///
/// A row's stride bounds every call's row (`rail_row_words`): E / N <= MAX_EXPERTS / N expert
/// counts and C <= MAX_CHANNELS channels. The area depends on (N, G) only, never on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyArea {
    pub num_nodes: usize,
    pub node_pes: usize,
}

impl NotifyArea {
    pub const SIGNALS: usize = 0;
    /// Signal counters: one per parity of rows, one for cached notifies.
    pub const SIGNAL_SETS: usize = 3;
    pub const TICKETS: usize = Self::SIGNAL_SETS * MAX_NODES * 8;
    pub const ROWS: usize = (Self::TICKETS + MAX_PES * 8).next_multiple_of(256);

    pub fn new(num_nodes: usize, node_pes: usize) -> Self {
        Self {
            num_nodes,
            node_pes,
        }
    }
    /// i32 words between two rows: the longest row any call makes, a multiple of 4 (16 bytes).
    pub fn row_stride(&self) -> usize {
        let g = self.node_pes;
        (g + MAX_EXPERTS / self.num_nodes + 1 + MAX_CHANNELS + g * MAX_CHANNELS).next_multiple_of(4)
    }
    /// Bytes of the rows (or of the staging): two parities of N rows.
    fn rows_bytes(&self) -> usize {
        (2 * self.num_nodes * self.row_stride() * 4).next_multiple_of(256)
    }
    pub fn staging(&self) -> usize {
        Self::ROWS + self.rows_bytes()
    }
    /// The dispatch's chunk words, after the staging.
    pub fn chunk_words(&self) -> usize {
        self.staging() + self.rows_bytes()
    }
    /// u64 words of one [MAX_CHANNELS][N] array.
    fn per_channel_node(&self) -> usize {
        MAX_CHANNELS * self.num_nodes
    }
    pub fn rdma_heads(&self) -> usize {
        self.chunk_words() + self.per_channel_node() * MAX_RDMA_CHUNKS * 8
    }
    pub fn rdma_sent(&self) -> usize {
        self.rdma_heads() + self.per_channel_node() * 8
    }
    pub fn rdma_received(&self) -> usize {
        self.rdma_sent() + self.per_channel_node() * 8
    }
    pub fn dispatch_calls(&self) -> usize {
        self.rdma_received() + self.per_channel_node() * 8
    }
    pub fn combine_calls(&self) -> usize {
        self.dispatch_calls() + MAX_DISPATCH_BLOCKS * 8
    }
    /// The combine's NVL sub-ring words: `which` 0 tails, 1 heads, 2 sent, 3 received.
    pub fn combine_nvl_words(&self, which: usize) -> usize {
        self.combine_calls() + MAX_DISPATCH_BLOCKS * 8 + which * MAX_CHANNELS * MAX_NORMAL_RANKS * 8
    }
    pub fn bytes(&self) -> usize {
        self.combine_nvl_words(4).next_multiple_of(256)
    }
    /// The largest area any split of `n_pes` ranks into several nodes needs (nodes of 1 to
    /// MAX_PES ranks): what `heap_bytes` reserves, as it does not know the node size. 0 when
    /// `n_pes` cannot span nodes.
    pub fn most_bytes(n_pes: usize) -> usize {
        (1..=MAX_PES.min(n_pes))
            .filter(|&g| n_pes.is_multiple_of(g) && g < n_pes)
            .map(|g| Self::new(n_pes / g, g).bytes())
            .max()
            .unwrap_or(0)
    }
}
// ANCHOR_END: notify_area

/// The full notify's inputs: the layout of this rank's tokens (`get_dispatch_layout`'s, with
/// its per-node counts).
#[derive(Debug, Clone, Copy)]
pub struct InternodeNotifyInputs {
    /// [n] i32: only compared with what `is_token_in_rank` sends to each rank (a difference is
    /// `BufferError::CountsMismatch` at the next check).
    pub num_tokens_per_rank: View,
    /// [N] i32: only compared with what `is_token_in_rank` sends to each node
    /// (NODE_COUNTS_MISMATCH at the next check).
    pub num_tokens_per_rdma_rank: View,
    /// [E] i32: summed over ranks into the rows per local expert the host gets back.
    pub num_tokens_per_expert: View,
    /// [T, n] bool: which ranks each token goes to (handle position 0).
    pub is_token_in_rank: View,
    pub expert_alignment: usize,
}

/// DeepEP's handle positions 1-6 (buffer_internode_normal.md 2.10), all i32: written by the
/// full notify, positions 1 and 2 read (and checked) by the cached one.
#[derive(Debug, Clone, Copy)]
pub struct InternodeHandle {
    /// [N, C]: tokens to node k in channels 0..=c.
    pub rdma_channel_prefix_matrix: View,
    /// [n, C]: tokens to rank r in channels 0..=c.
    pub gbl_channel_prefix_matrix: View,
    /// [N, C]: tokens this rank forwards from source node b, channels 0..=c.
    pub recv_rdma_channel_prefix_matrix: View,
    /// [N]: tokens this rank forwards from source nodes 0..=b.
    pub recv_rdma_rank_prefix_sum: View,
    /// [n, C]: this rank's first receive row of source rank s's channel c.
    pub recv_gbl_channel_prefix_matrix: View,
    /// [n]: tokens this rank receives from source ranks 0..=s.
    pub recv_gbl_rank_prefix_sum: View,
}

/// Which notify: the full one (a dispatch without a handle), or the cached one (with a handle:
/// the barrier and the handle's check; `is_token_in_rank` is the handle's position 0).
#[derive(Debug, Clone, Copy)]
pub enum InternodeNotifyCall {
    Full(InternodeNotifyInputs),
    Cached { is_token_in_rank: View },
}

/// What this rank will receive and forward, from the full notify's host-mapped counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternodeRecvCounts {
    /// Rows this rank receives (recv_gbl_rank_prefix_sum[n - 1]).
    pub num_recv_tokens: usize,
    /// Rows this rank forwards to its node (recv_rdma_rank_prefix_sum[N - 1]).
    pub num_rdma_recv_tokens: usize,
    /// Rows per local expert, each rounded up to `expert_alignment`.
    pub per_local_expert: Vec<i32>,
}

/// A checked internode notify: the kernel's argument struct and its grid.
#[derive(Debug, Clone, Copy)]
pub struct InternodeNotifyPlan {
    pub args: InternodeNotifyArgs,
    /// 1 + N: block 0 receives, block 1 + k sends node k's row.
    pub num_blocks: u32,
    pub num_local_experts: usize,
}

impl InternodeNotifyPlan {
    pub fn cached(&self) -> bool {
        self.args.cached != 0
    }
}

mod plan;
#[cfg(test)]
mod tests;

pub use plan::plan_internode_notify;
pub(crate) use plan::{InternodeCall, check_call};

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: internode_notify
    /// The notify step across nodes, on `stream` (see `plan_internode_notify`). The full notify
    /// with `wait` blocks (bounded, from the moment the kernel starts) until the counts reached
    /// the host and returns them; without (`num_worst_tokens`, CUDA graphs), or cached, returns
    /// at once. Collective: every rank of the buffer makes the same calls in the same order.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`: the views are live device memory of this GPU, `stream` a
    /// live stream of this buffer's context.
    pub unsafe fn internode_notify_raw(
        &self,
        call: &InternodeNotifyCall,
        handle: &InternodeHandle,
        config: &Config,
        wait: bool,
        stream: sys::CUstream,
    ) -> Result<Option<InternodeRecvCounts>, BufferError> {
        self.check()?;
        let mut plan = plan_internode_notify(&self.spec, config, call, handle)?;
        // Every normal call across nodes starts here (its entry barrier): on a low-latency
        // buffer, not while a low-latency receive is pending (src/mode_sharing/).
        let user =
            crate::mode_sharing::before_normal("internode_notify", &self.spec, *self.ll_pending())?;
        plan.args.counts = self.counts.device_ptr();
        let wait = wait && !plan.cached();
        if wait {
            self.counts.write_i32(0, -1); // the kernel writes the total last: -1 = not yet
            // SAFETY: the caller vouches for the stream.
            unsafe { self.mark_started(stream) }?;
        }
        let spec = LaunchSpec {
            kernel: "internode_notify",
            num_blocks: plan.num_blocks,
            threads_per_block: INTERNODE_NOTIFY_THREADS,
            shared_mem_bytes: 0,
        };
        // SAFETY: a checked plan (block 0 waits for other ranks' blocks: every block resident);
        // the caller vouches for the views and the stream.
        unsafe { self.launch_resident(spec, &plan.args, stream) }?;
        *self.rdma_user() = user;
        if !wait {
            return Ok(None);
        }
        let counts = self.wait_for_counts(plan.num_local_experts)?;
        Ok(Some(InternodeRecvCounts {
            num_recv_tokens: counts.num_recv_tokens,
            num_rdma_recv_tokens: self.counts.read_i32(1 + plan.num_local_experts) as usize,
            per_local_expert: counts.per_local_expert,
        }))
    }
    // ANCHOR_END: internode_notify
}
