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
    INTERNODE_NOTIFY_THREADS, InternodeNotifyArgs, MAX_CHANNELS, MAX_NODES, MAX_PES,
};

use crate::buffer::{Blocks, NvshmemBuffer, arg};
use crate::checks;
use crate::config::{Config, MAX_NORMAL_RANKS};
use crate::error::BufferError;
use crate::internode::rail_row_words;
use crate::regions::MAX_EXPERTS;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

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
    pub fn bytes(&self) -> usize {
        self.staging() + self.rows_bytes()
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

fn invalid(message: String) -> BufferError {
    BufferError::invalid(WHAT, message)
}

const WHAT: &str = "internode_notify";

/// The buffer's side of the checks: a normal-mode buffer across nodes, with its area and state.
fn check_buffer(spec: &BufferSpec) -> Result<NotifyArea, BufferError> {
    if !spec.spans_nodes() {
        return Err(invalid(format!(
            "this buffer's {} ranks are one node: its notify step is chapter 7's \
             (notify_raw), as DeepEP's intranode mode",
            spec.n_pes
        )));
    }
    if spec.options.low_latency_mode {
        return Err(invalid(
            "this buffer was made with low_latency_mode=True: normal calls across nodes on a \
             low-latency buffer come with mode sharing (design step 9); create it with \
             low_latency_mode=False and num_rdma_bytes > 0"
                .into(),
        ));
    }
    let (area, base) = (spec.notify_area(), spec.notify_area_base());
    match (area, base) {
        (Some(area), Some(_)) if spec.internode_state != 0 && spec.n_pes <= MAX_NORMAL_RANKS => {
            Ok(area)
        }
        _ => Err(invalid(format!(
            "this buffer has no internode notify area or state ({} ranks in nodes of {}, at \
             most MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS}): it was not made by \
             NvshmemBuffer::new for normal mode across nodes",
            spec.n_pes, spec.node_pes
        ))),
    }
}

/// Shapes of positions 1-6 for n ranks, N nodes, C channels.
fn check_handle(
    handle: &InternodeHandle,
    n: usize,
    nodes: usize,
    c: usize,
) -> Result<(), BufferError> {
    let (n, nodes, c) = (Some(n), Some(nodes), Some(c));
    let named = [
        (
            &handle.rdma_channel_prefix_matrix,
            "rdma_channel_prefix_matrix",
            &[nodes, c][..],
        ),
        (
            &handle.gbl_channel_prefix_matrix,
            "gbl_channel_prefix_matrix",
            &[n, c],
        ),
        (
            &handle.recv_rdma_channel_prefix_matrix,
            "recv_rdma_channel_prefix_matrix",
            &[nodes, c],
        ),
        (
            &handle.recv_rdma_rank_prefix_sum,
            "recv_rdma_rank_prefix_sum",
            &[nodes],
        ),
        (
            &handle.recv_gbl_channel_prefix_matrix,
            "recv_gbl_channel_prefix_matrix",
            &[n, c],
        ),
        (
            &handle.recv_gbl_rank_prefix_sum,
            "recv_gbl_rank_prefix_sum",
            &[n],
        ),
    ];
    for (view, name, shape) in named {
        view.expect(WHAT, name, ElemType::I32, shape)?;
    }
    Ok(())
}

/// The full notify's inputs, checked: returns the number of experts.
fn check_inputs(
    inputs: &InternodeNotifyInputs,
    n: usize,
    nodes: usize,
) -> Result<usize, BufferError> {
    let num_experts = inputs.num_tokens_per_expert.rows();
    checks::num_experts(
        WHAT,
        "num_tokens_per_expert's length",
        num_experts,
        n,
        MAX_EXPERTS,
    )?;
    inputs
        .num_tokens_per_rank
        .expect(WHAT, "num_tokens_per_rank", ElemType::I32, &[Some(n)])?;
    inputs.num_tokens_per_rdma_rank.expect(
        WHAT,
        "num_tokens_per_rdma_rank",
        ElemType::I32,
        &[Some(nodes)],
    )?;
    inputs
        .num_tokens_per_expert
        .expect(WHAT, "num_tokens_per_expert", ElemType::I32, &[None])?;
    if inputs.expert_alignment == 0 || inputs.expert_alignment > i32::MAX as usize {
        return Err(invalid(format!(
            "expert_alignment = {} must be at least 1",
            inputs.expert_alignment
        )));
    }
    Ok(num_experts)
}

// ANCHOR: plan_internode_notify
/// Checks an internode notify for `config` (its channels) and plans it: the buffer spans
/// nodes in normal mode, the views have the shapes of `n` ranks in N nodes and C channels, and
/// every row fits its stride.
pub fn plan_internode_notify(
    spec: &BufferSpec,
    config: &Config,
    call: &InternodeNotifyCall,
    handle: &InternodeHandle,
) -> Result<InternodeNotifyPlan, BufferError> {
    let area = check_buffer(spec)?;
    let (n, g, nodes) = (spec.n_pes, spec.node_pes, area.num_nodes);
    // The NVL stage has G peers: its warps and rings are checked as chapter 7's for G ranks.
    config.check_for_launch(g)?;
    let c = config.num_channels();
    check_handle(handle, n, nodes, c)?;
    let (is_token_in_rank, full) = match call {
        InternodeNotifyCall::Full(inputs) => (inputs.is_token_in_rank, Some(inputs)),
        InternodeNotifyCall::Cached { is_token_in_rank } => (*is_token_in_rank, None),
    };
    is_token_in_rank.expect(WHAT, "is_token_in_rank", ElemType::Bool, &[None, Some(n)])?;
    let num_tokens = is_token_in_rank.rows();
    if num_tokens > i32::MAX as usize {
        return Err(invalid(format!(
            "{num_tokens} tokens: at most {} per call",
            i32::MAX
        )));
    }
    // A cached notify sends no rows and writes no counts: its expert count is not needed.
    let num_experts = match full {
        Some(inputs) => check_inputs(inputs, n, nodes)?,
        None => n,
    };
    let words = rail_row_words(g, num_experts / n, c);
    if words > area.row_stride() {
        return Err(invalid(format!(
            "a rail row of {words} words exceeds the area's stride of {}: num_experts = \
             {num_experts} and {c} channels are past MAX_EXPERTS = {MAX_EXPERTS} or \
             MAX_CHANNELS = {MAX_CHANNELS}",
            area.row_stride()
        )));
    }
    let base = spec.notify_area_base().unwrap_or_default();
    let null = |view: Option<View>| view.map_or(0, |v| v.ptr);
    let args = InternodeNotifyArgs {
        is_token_in_rank: is_token_in_rank.ptr,
        num_tokens_per_rank: null(full.map(|i| i.num_tokens_per_rank)),
        num_tokens_per_rdma_rank: null(full.map(|i| i.num_tokens_per_rdma_rank)),
        num_tokens_per_expert: null(full.map(|i| i.num_tokens_per_expert)),
        rdma_channel_prefix_matrix: handle.rdma_channel_prefix_matrix.ptr,
        gbl_channel_prefix_matrix: handle.gbl_channel_prefix_matrix.ptr,
        recv_rdma_channel_prefix_matrix: handle.recv_rdma_channel_prefix_matrix.ptr,
        recv_rdma_rank_prefix_sum: handle.recv_rdma_rank_prefix_sum.ptr,
        recv_gbl_channel_prefix_matrix: handle.recv_gbl_channel_prefix_matrix.ptr,
        recv_gbl_rank_prefix_sum: handle.recv_gbl_rank_prefix_sum.ptr,
        counts: 0, // the buffer's host-mapped counts, filled at launch
        signals: base + NotifyArea::SIGNALS as u64,
        tickets: base + NotifyArea::TICKETS as u64,
        rows: base + NotifyArea::ROWS as u64,
        staging: base + area.staging() as u64,
        state: spec.internode_state,
        bad_input: spec.input_error,
        topo: spec.ll_topology(),
        row_stride: area.row_stride() as i32,
        num_tokens: num_tokens as i32,
        num_channels: c as i32,
        num_experts: num_experts as i32,
        expert_alignment: full.map_or(1, |i| i.expert_alignment as i32),
        cached: full.is_none() as i32,
    };
    Ok(InternodeNotifyPlan {
        args,
        num_blocks: 1 + nodes as u32,
        num_local_experts: num_experts / n,
    })
}
// ANCHOR_END: plan_internode_notify

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
        let ws = self.workspace();
        // SAFETY: a checked plan; block 0 waits for other ranks' blocks, so all must be
        // resident (MayWait); the caller vouches for the views and the stream.
        unsafe {
            self.launch(
                spec,
                Blocks::MayWait,
                stream,
                &mut [arg(&ws), arg(&plan.args)],
            )
        }?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::heap_bytes;
    use crate::regions::Regions;
    use crate::spec::BufferOptions;
    use crate::test_views::{matrix, vector};
    use kernels::contract::MAX_LL_RANKS;

    const NUM_RDMA_BYTES: usize = 1 << 20;

    /// A normal-mode buffer of `n` ranks in nodes of `g`, as rank `me` sees it.
    fn spec(n: usize, g: usize, me: usize) -> BufferSpec {
        let options = BufferOptions {
            num_rdma_bytes: NUM_RDMA_BYTES,
            ..BufferOptions::normal(1 << 20)
        };
        let mut spec = BufferSpec::for_tests(n, options);
        spec.node_pes = g;
        spec.my_pe = me;
        spec
    }

    fn config() -> Config {
        Config::new(24, 8, 256, 6, 128).unwrap()
    }

    /// Views of the right shapes for `n` ranks, N nodes, C channels, T tokens, E experts.
    fn views(
        n: usize,
        nodes: usize,
        c: usize,
        t: usize,
        e: usize,
    ) -> (InternodeNotifyInputs, InternodeHandle) {
        let inputs = InternodeNotifyInputs {
            num_tokens_per_rank: vector(1, n, ElemType::I32),
            num_tokens_per_rdma_rank: vector(2, nodes, ElemType::I32),
            num_tokens_per_expert: vector(3, e, ElemType::I32),
            is_token_in_rank: matrix(4, t, n, ElemType::Bool),
            expert_alignment: 1,
        };
        let handle = InternodeHandle {
            rdma_channel_prefix_matrix: matrix(5, nodes, c, ElemType::I32),
            gbl_channel_prefix_matrix: matrix(6, n, c, ElemType::I32),
            recv_rdma_channel_prefix_matrix: matrix(7, nodes, c, ElemType::I32),
            recv_rdma_rank_prefix_sum: vector(8, nodes, ElemType::I32),
            recv_gbl_channel_prefix_matrix: matrix(9, n, c, ElemType::I32),
            recv_gbl_rank_prefix_sum: vector(10, n, ElemType::I32),
        };
        (inputs, handle)
    }

    fn plan(
        spec: &BufferSpec,
        inputs: InternodeNotifyInputs,
        handle: &InternodeHandle,
    ) -> Result<InternodeNotifyPlan, BufferError> {
        plan_internode_notify(spec, &config(), &InternodeNotifyCall::Full(inputs), handle)
    }

    fn error_of(result: Result<InternodeNotifyPlan, BufferError>) -> String {
        result.expect_err("a bad call was planned").to_string()
    }

    #[test]
    fn every_layout_plans_with_its_area_inside_the_allocation() {
        for (n, g) in [
            (4, 2),
            (8, 4),
            (8, 2),
            (8, 1),
            (16, 8),
            (16, 4),
            (64, 8),
            (64, 1),
        ] {
            let nodes = n / g;
            for me in [0, g - 1, n - 1] {
                let spec = spec(n, g, me);
                let (inputs, handle) = views(n, nodes, 12, 100, 4 * n);
                let p = plan(&spec, inputs, &handle).unwrap();
                let a = p.args;
                assert_eq!((p.num_blocks, p.num_local_experts), (1 + nodes as u32, 4));
                assert_eq!(
                    (a.cached, a.num_channels, a.num_experts),
                    (0, 12, 4 * n as i32)
                );
                assert_eq!(a.topo.node_start as usize, me / g * g);
                let area = spec.notify_area().unwrap();
                assert_eq!(area, NotifyArea::new(nodes, g));
                // Signals, tickets, rows, staging: in order, 256-aligned, inside the buffer's
                // part of the allocation, after every other region.
                let regions = Regions {
                    num_nvl_bytes: spec.options.num_nvl_bytes,
                    num_rdma_bytes: NUM_RDMA_BYTES,
                    notify_area_bytes: area.bytes(),
                };
                let base = spec.base + regions.notify_area() as u64;
                assert!(regions.notify_area() >= regions.rdma() + NUM_RDMA_BYTES);
                assert_eq!(a.signals, base);
                assert_eq!(a.tickets, base + (3 * MAX_NODES * 8) as u64);
                assert!(a.rows >= a.tickets + (MAX_PES * 8) as u64);
                assert_eq!(
                    a.staging - a.rows,
                    (2 * nodes * area.row_stride() * 4).next_multiple_of(256) as u64
                );
                assert!(
                    a.staging + (2 * nodes * area.row_stride() * 4) as u64
                        <= spec.base + regions.total() as u64
                );
                for at in [a.signals, a.rows, a.staging] {
                    assert_eq!(at % 256, 0);
                }
                assert_eq!(area.row_stride() % 4, 0);
                // The heap's reservation covers this node size.
                assert!(area.bytes() <= NotifyArea::most_bytes(n));
                let one_node = heap_bytes(n, 1 << 20, 0);
                assert!(
                    heap_bytes(n, 1 << 20, NUM_RDMA_BYTES)
                        >= one_node + NUM_RDMA_BYTES + area.bytes()
                );
            }
        }
    }

    /// The stride bounds every call's row: the most experts and channels there can be.
    #[test]
    fn the_longest_rows_fit_their_stride() {
        for (n, g) in [(4, 2), (16, 8), (64, 8), (64, 1), (16, 1)] {
            let area = NotifyArea::new(n / g, g);
            let most = rail_row_words(g, MAX_EXPERTS / n, MAX_CHANNELS);
            assert!(
                most <= area.row_stride(),
                "n {n}, g {g}: {most} > {}",
                area.row_stride()
            );
            let spec = spec(n, g, 0);
            let config = Config::new(2 * MAX_CHANNELS as u32, 8, 256, 6, 128).unwrap();
            let (inputs, handle) = views(n, n / g, MAX_CHANNELS, 10, MAX_EXPERTS);
            let call = InternodeNotifyCall::Full(inputs);
            assert!(plan_internode_notify(&spec, &config, &call, &handle).is_ok());
        }
        // A few hundred KB at most, the bound for a buffer's heap.
        assert!(
            NotifyArea::most_bytes(64) < 1 << 20,
            "{}",
            NotifyArea::most_bytes(64)
        );
        assert_eq!(NotifyArea::most_bytes(1), 0);
    }

    #[test]
    fn the_cached_notify_needs_the_routing_and_positions_one_to_six_only() {
        let (n, g) = (8, 2);
        let spec = spec(n, g, 3);
        let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
        let call = InternodeNotifyCall::Cached {
            is_token_in_rank: inputs.is_token_in_rank,
        };
        let p = plan_internode_notify(&spec, &config(), &call, &handle).unwrap();
        assert!(p.cached());
        let a = p.args;
        assert_eq!(
            (
                a.num_tokens_per_rank,
                a.num_tokens_per_rdma_rank,
                a.num_tokens_per_expert
            ),
            (0, 0, 0)
        );
        assert_eq!(
            a.rdma_channel_prefix_matrix,
            handle.rdma_channel_prefix_matrix.ptr
        );
        // Its handle is checked as the full notify's outputs are.
        let wrong = InternodeHandle {
            gbl_channel_prefix_matrix: matrix(6, n, 11, ElemType::I32),
            ..handle
        };
        let error = error_of(plan_internode_notify(&spec, &config(), &call, &wrong));
        assert!(error.contains("gbl_channel_prefix_matrix"), "{error}");
    }

    /// Every refusal of the buffer names its mode and the fix: one node, a low-latency
    /// buffer, one not made for the internode notify.
    #[test]
    fn a_buffer_without_the_notify_is_refused_naming_it() {
        let (n, g) = (8, 4);
        let good = spec(n, g, 5);
        let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
        assert!(plan(&good, inputs, &handle).is_ok());
        let one_node = spec(4, 4, 1);
        let (one_inputs, one_handle) = views(4, 1, 12, 100, 16);
        let error = error_of(plan(&one_node, one_inputs, &one_handle));
        assert!(
            error.contains("one node") && error.contains("notify_raw"),
            "{error}"
        );
        let mut ll = good;
        ll.options.low_latency_mode = true;
        let error = error_of(plan(&ll, inputs, &handle));
        assert!(error.contains("low_latency_mode=False"), "{error}");
        let mut no_state = good;
        no_state.internode_state = 0;
        let error = error_of(plan(&no_state, inputs, &handle));
        assert!(
            error.contains("no internode notify area or state"),
            "{error}"
        );
    }

    /// Every bad input is refused naming the argument, one at a time.
    #[test]
    fn every_bad_input_is_refused_naming_it() {
        let (n, g) = (8, 4);
        let good = spec(n, g, 5);
        let (inputs, handle) = views(n, n / g, 12, 100, 4 * n);
        let cases: Vec<(&str, InternodeNotifyInputs)> = vec![
            (
                "num_tokens_per_rank",
                InternodeNotifyInputs {
                    num_tokens_per_rank: vector(1, n - 1, ElemType::I32),
                    ..inputs
                },
            ),
            (
                "num_tokens_per_rank",
                InternodeNotifyInputs {
                    num_tokens_per_rank: vector(1, n, ElemType::I64),
                    ..inputs
                },
            ),
            (
                "num_tokens_per_rdma_rank",
                InternodeNotifyInputs {
                    num_tokens_per_rdma_rank: vector(2, n, ElemType::I32),
                    ..inputs
                },
            ),
            (
                "num_tokens_per_expert's length",
                InternodeNotifyInputs {
                    num_tokens_per_expert: vector(3, 4 * n + 1, ElemType::I32),
                    ..inputs
                },
            ),
            (
                "num_tokens_per_expert's length",
                InternodeNotifyInputs {
                    num_tokens_per_expert: vector(3, MAX_EXPERTS + n, ElemType::I32),
                    ..inputs
                },
            ),
            (
                "is_token_in_rank",
                InternodeNotifyInputs {
                    is_token_in_rank: matrix(4, 100, n, ElemType::I32),
                    ..inputs
                },
            ),
            (
                "is_token_in_rank",
                InternodeNotifyInputs {
                    is_token_in_rank: matrix(4, 100, g, ElemType::Bool),
                    ..inputs
                },
            ),
            (
                "expert_alignment",
                InternodeNotifyInputs {
                    expert_alignment: 0,
                    ..inputs
                },
            ),
        ];
        for (name, bad) in cases {
            let error = error_of(plan(&good, bad, &handle));
            assert!(
                error.contains(name) && error.starts_with("internode_notify"),
                "{name}: {error}"
            );
        }
    }

    /// Every bad handle position (N rows where n are due, the wrong channel count, a dtype)
    /// and a bad config are refused naming them.
    #[test]
    fn every_bad_handle_and_config_is_refused_naming_it() {
        let (n, g) = (8, 4);
        let nodes = n / g;
        let good = spec(n, g, 5);
        let (inputs, handle) = views(n, nodes, 12, 100, 4 * n);
        let handles = [
            (
                "rdma_channel_prefix_matrix",
                InternodeHandle {
                    rdma_channel_prefix_matrix: matrix(5, n, 12, ElemType::I32),
                    ..handle
                },
            ),
            (
                "recv_rdma_channel_prefix_matrix",
                InternodeHandle {
                    recv_rdma_channel_prefix_matrix: matrix(7, nodes, 13, ElemType::I32),
                    ..handle
                },
            ),
            (
                "recv_rdma_rank_prefix_sum",
                InternodeHandle {
                    recv_rdma_rank_prefix_sum: vector(8, n, ElemType::I32),
                    ..handle
                },
            ),
            (
                "recv_gbl_channel_prefix_matrix",
                InternodeHandle {
                    recv_gbl_channel_prefix_matrix: matrix(9, nodes, 12, ElemType::I32),
                    ..handle
                },
            ),
            (
                "recv_gbl_rank_prefix_sum",
                InternodeHandle {
                    recv_gbl_rank_prefix_sum: vector(10, n, ElemType::I64),
                    ..handle
                },
            ),
        ];
        for (name, bad) in handles {
            let error = error_of(plan(&good, inputs, &bad));
            assert!(error.contains(name), "{name}: {error}");
        }

        // The config: chapter 7's checks, for the node's G peers.
        let odd = Config {
            num_sms: 23,
            ..config()
        };
        let call = InternodeNotifyCall::Full(inputs);
        let error = error_of(plan_internode_notify(&good, &odd, &call, &handle));
        assert!(error.contains("must be even"), "{error}");
    }

    /// The buffer's options: normal mode across nodes needs an rdma region, and stops at
    /// MAX_NORMAL_RANKS; on one node an rdma region still asks for what one node cannot be.
    #[test]
    fn normal_mode_across_nodes_is_made_with_an_rdma_region() {
        let across = BufferOptions {
            num_rdma_bytes: NUM_RDMA_BYTES,
            ..BufferOptions::normal(1 << 20)
        };
        for (n, g) in [(4, 2), (8, 1), (16, 8), (64, 8)] {
            assert!(across.check_nodes(n, g).is_ok(), "{n} in nodes of {g}");
        }
        let error = across.check_nodes(128, 8).unwrap_err().to_string();
        assert!(
            error.contains("MAX_NORMAL_RANKS = 64") && error.contains("low_latency_mode=True"),
            "{error}"
        );
        let error = across.check_nodes(8, 8).unwrap_err().to_string();
        assert!(
            error.contains("inter-node") && error.contains("num_rdma_bytes=0"),
            "{error}"
        );
        let error = BufferOptions::normal(1 << 20)
            .check_nodes(8, 4)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("needs num_rdma_bytes > 0")
                && error.contains("normal mode runs inside one node"),
            "{error}"
        );
        // Low-latency mode and one node: unchanged, no area.
        let ll = BufferOptions::low_latency(NUM_RDMA_BYTES);
        assert!(ll.check_nodes(MAX_LL_RANKS, 8).is_ok());
        let mut spec = BufferSpec::for_tests(8, ll);
        spec.node_pes = 4;
        assert_eq!(spec.notify_area(), None);
        assert_eq!(
            BufferSpec::for_tests(8, BufferOptions::normal(1 << 20)).notify_area(),
            None
        );
    }

    /// The route rules of the design (2.1), on the kernel's source: a rank is turned into an
    /// address only by node_peer (which refuses another node's rank), other nodes are reached
    /// by put-with-signal and signal ops only (no nvshmem_ptr, no fence or quiet, no trap), and
    /// every wait is chapter 4's bounded one, recording a kind that names what it waited for.
    #[test]
    fn the_kernel_reaches_other_nodes_by_signals_only_and_bounds_every_wait() {
        let source = include_str!("../kernels/cuda/buffer/internode_notify.cu");
        let code: String = source
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for banned in [
            "nvshmem_ptr",
            "peer_delta",
            "nvshmem_quiet",
            "nvshmem_fence",
            "__trap",
            "nvshmem_barrier",
        ] {
            assert!(!code.contains(banned), "internode_notify.cu uses {banned}");
        }
        assert_eq!(
            code.matches("node_peer(").count(),
            2,
            "node_peer's two uses"
        );
        let remote: Vec<&str> = code
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("nvshmem") && *word != "nvshmem_tutorial")
            .collect();
        for word in &remote {
            assert!(
                ["nvshmemx_putmem_signal_nbi_block", "nvshmemx_signal_op"].contains(word),
                "{word}: across nodes only put-with-signal and signal ops"
            );
        }
        let waits: Vec<&str> = code.split("wait_at_least(").skip(1).collect();
        assert_eq!(waits.len(), 2, "two waits: the rows and the tickets");
        for (wait, kind) in waits.iter().zip(["WAIT_NOTIFY_ROWS", "WAIT_READY"]) {
            let args = wait.split(';').next().unwrap();
            assert!(args.contains(kind), "a wait records {kind}: {args}");
        }
        // One kernel, named for the profiler's `notify` row (design 2.5), and no other word.
        assert!(code.contains(
            "__global__ void __launch_bounds__(INTERNODE_NOTIFY_THREADS) internode_notify("
        ));
        assert_eq!(code.matches("__global__").count(), 1);
        assert!(!code.contains("dispatch") && !code.contains("combine"));
    }

    /// A rail row that never came names the rank waited for and its node (a rank of another
    /// node is recorded past MAX_LL_RANKS, as chapter 8's failures); the input errors name the
    /// node or handle entry and both numbers.
    #[test]
    fn failures_name_the_rank_and_node_waited_for() {
        use crate::error::{LastRingCall, describe};
        use ch04_collectives::{CollError, DeviceFailure};
        use kernels::contract::Failure;
        let failure = DeviceFailure {
            me: 1,
            kind: Failure::NotifyRows,
            pe: (MAX_LL_RANKS + 5) as u64,
            expected: 7,
            seen: 6,
            block: 0,
            call: 7,
            timeout_ms: 300,
        };
        let text = describe(CollError::Device(failure), LastRingCall::default(), 2).to_string();
        for part in [
            "rank 1: internode notify (call 7",
            "rail row of rank 5 (node 2)",
            "reached 6 of 7",
            "300 ms",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert!(
            Failure::NotifyRows.device_name().starts_with("WAIT_"),
            "a wait: the job is broken"
        );
    }

    /// Chapter 7's notify, dispatch and combine refuse a buffer across nodes, naming this step.
    #[test]
    fn chapter_sevens_calls_refuse_a_buffer_across_nodes() {
        let spec = spec(8, 4, 0);
        let error = checks::one_node("dispatch", &spec).unwrap_err().to_string();
        assert!(
            error.contains("span 2 nodes of 4") && error.contains("internode_notify_raw"),
            "{error}"
        );
        assert!(
            checks::one_node(
                "dispatch",
                &BufferSpec::for_tests(8, BufferOptions::normal(1 << 20))
            )
            .is_ok()
        );
    }
}
