//! The internode notify's plan: every check of the buffer, the inputs and the handle, then
//! the kernel's argument struct (pure: no buffer, no device).

use kernels::contract::{InternodeNotifyArgs, MAX_CHANNELS};

use super::{
    InternodeHandle, InternodeNotifyCall, InternodeNotifyInputs, InternodeNotifyPlan, NotifyArea,
};
use crate::checks;
use crate::config::{Config, MAX_NORMAL_RANKS};
use crate::error::BufferError;
use crate::internode::rail_row_words;
use crate::regions::MAX_EXPERTS;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

fn invalid(message: String) -> BufferError {
    BufferError::invalid(WHAT, message)
}

const WHAT: &str = "internode_notify";

/// The buffer's side of the checks of `what` (the notify, or the dispatch): a buffer across
/// nodes (normal mode, or low-latency mode sharing its rdma region), with its area and state.
pub(crate) fn check_buffer(
    what: &'static str,
    spec: &BufferSpec,
) -> Result<NotifyArea, BufferError> {
    let invalid = |message: String| BufferError::invalid(what, message);
    if !spec.spans_nodes() {
        return Err(invalid(format!(
            "this buffer's {} ranks are one node: its calls are chapter 7's (notify_raw, \
             dispatch_raw), as DeepEP's intranode mode",
            spec.n_pes
        )));
    }
    // A low-latency buffer serves normal calls too, in the same rdma region
    // (src/mode_sharing/), up to MAX_NORMAL_RANKS ranks.
    if let Some(message) = crate::mode_sharing::too_many_ranks_for_normal(spec) {
        return Err(invalid(message));
    }
    let (area, base) = (spec.notify_area(), spec.notify_area_base());
    match (area, base) {
        (Some(area), Some(_)) if spec.internode_state != 0 && spec.n_pes <= MAX_NORMAL_RANKS => {
            Ok(area)
        }
        _ => Err(invalid(format!(
            "this buffer has no internode notify area or state ({} ranks in nodes of {}, at \
             most MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS}): it was not made by \
             NvshmemBuffer::new with num_rdma_bytes > 0 across nodes",
            spec.n_pes, spec.node_pes
        ))),
    }
}

/// What every internode call checks first, and what it learns: the buffer's area, n ranks in
/// N nodes of G, C channels, T tokens.
pub(crate) struct InternodeCall {
    pub area: NotifyArea,
    pub n: usize,
    pub g: usize,
    pub nodes: usize,
    pub c: usize,
    pub num_tokens: usize,
}

/// The start of every internode plan (`what`: the notify, the dispatch or the combine): a
/// normal-mode buffer across nodes (`check_buffer`), a config that launches, positions 1-6 of
/// `handle` for its channels, and `is_token_in_rank` [T, n] with T < 2^31.
pub(crate) fn check_call(
    what: &'static str,
    spec: &BufferSpec,
    config: &Config,
    handle: &InternodeHandle,
    is_token_in_rank: View,
) -> Result<InternodeCall, BufferError> {
    let area = check_buffer(what, spec)?;
    let (n, g, nodes) = (spec.n_pes, spec.node_pes, area.num_nodes);
    // The NVL stage has G peers: its warps and rings are checked as chapter 7's for G ranks.
    config.check_for_launch(g)?;
    let c = config.num_channels();
    check_handle(what, handle, n, nodes, c)?;
    is_token_in_rank.expect(what, "is_token_in_rank", ElemType::Bool, &[None, Some(n)])?;
    let num_tokens = is_token_in_rank.rows();
    if num_tokens > i32::MAX as usize {
        return Err(BufferError::invalid(
            what,
            format!("{num_tokens} tokens: at most {} per call", i32::MAX),
        ));
    }
    Ok(InternodeCall {
        area,
        n,
        g,
        nodes,
        c,
        num_tokens,
    })
}

/// Shapes of positions 1-6 for n ranks, N nodes, C channels (`what`: the notify or the dispatch).
pub(crate) fn check_handle(
    what: &'static str,
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
        view.expect(what, name, ElemType::I32, shape)?;
    }
    Ok(())
}

/// The full notify's inputs, checked: returns the number of experts.
fn check_inputs(
    inputs: &InternodeNotifyInputs,
    n: usize,
    nodes: usize,
) -> Result<usize, BufferError> {
    let num_experts = checks::experts_counted(WHAT, &inputs.num_tokens_per_expert, n)?;
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
    let (is_token_in_rank, full) = match call {
        InternodeNotifyCall::Full(inputs) => (inputs.is_token_in_rank, Some(inputs)),
        InternodeNotifyCall::Cached { is_token_in_rank } => (*is_token_in_rank, None),
    };
    let InternodeCall {
        area,
        n,
        g,
        nodes,
        c,
        num_tokens,
    } = check_call(WHAT, spec, config, handle, is_token_in_rank)?;
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
