//! The checks more than one plan makes, each written once, each error naming the argument and
//! what it must be.

use kernels::contract::MAX_TOPK;

use crate::config::Config;
use crate::error::BufferError;
use crate::regions::{MAX_EXPERTS, ring_bytes};
use crate::spec::BufferSpec;
use crate::view::View;

/// Chapter 7's notify, dispatch and combine reach every rank through the node's peer pointers:
/// a buffer whose ranks span nodes (normal mode across nodes, issue 32) has its own notify,
/// dispatch and combine (`internode_notify_raw`, `internode_dispatch_raw`,
/// `internode_cached_dispatch_raw`, `internode_combine_raw`), so they refuse it.
pub(crate) fn one_node(what: &'static str, spec: &BufferSpec) -> Result<(), BufferError> {
    if spec.spans_nodes() {
        return Err(BufferError::invalid(
            what,
            format!(
                "this buffer's {} ranks span {} nodes of {}: across nodes, normal mode has its \
                 notify step, a bf16 or fp8 dispatch (fresh or cached) and a bf16 combine in Rust \
                 (internode_notify_raw, internode_dispatch_raw, internode_cached_dispatch_raw, \
                 internode_combine_raw, internode_pair_raw); chapter 7's calls run inside one \
                 node (unset NVSHMEM_TUTORIAL_NODE_PES, at most 8 ranks), or use \
                 low_latency_mode=True",
                spec.n_pes,
                spec.n_pes / spec.node_pes,
                spec.node_pes
            ),
        ));
    }
    Ok(())
}

/// The start of every chapter 7 plan: one node, a config that launches at this rank count.
/// Returns (ranks, channels).
pub(crate) fn intranode_call(
    what: &'static str,
    spec: &BufferSpec,
    config: &Config,
) -> Result<(usize, usize), BufferError> {
    one_node(what, spec)?;
    config.check_for_launch(spec.n_pes)?;
    Ok((spec.n_pes, config.num_channels()))
}

/// `num_experts` experts spread evenly over `n_pes` ranks, at most `max`.
pub(crate) fn num_experts(
    what: &'static str,
    name: &str,
    num_experts: usize,
    n_pes: usize,
    max: usize,
) -> Result<(), BufferError> {
    if num_experts == 0 || !num_experts.is_multiple_of(n_pes) || num_experts > max {
        return Err(BufferError::invalid(
            what,
            format!(
                "{name} = {num_experts} must be a positive multiple of the {n_pes} ranks, at \
                 most {max}"
            ),
        ));
    }
    Ok(())
}

/// The experts a notify step's `num_tokens_per_expert` counts (its length), checked as
/// `num_experts` checks them against the buffer's `MAX_EXPERTS`; chapter 7's notify and the
/// internode one share it.
pub(crate) fn experts_counted(
    what: &'static str,
    num_tokens_per_expert: &View,
    n_pes: usize,
) -> Result<usize, BufferError> {
    let counted = num_tokens_per_expert.rows();
    num_experts(
        what,
        "num_tokens_per_expert's length",
        counted,
        n_pes,
        MAX_EXPERTS,
    )?;
    Ok(counted)
}

/// At most `MAX_TOPK` experts per token (the kernels keep a token's top-k in registers).
pub(crate) fn num_topk(what: &'static str, num_topk: usize) -> Result<(), BufferError> {
    if num_topk > MAX_TOPK {
        return Err(BufferError::invalid(
            what,
            format!("{num_topk} experts per token (topk_idx's columns); at most {MAX_TOPK}"),
        ));
    }
    Ok(())
}

/// Rows the kernels copy 16 bytes at a time.
pub(crate) fn row_bytes(what: &'static str, hidden_bytes: usize) -> Result<(), BufferError> {
    if !hidden_bytes.is_multiple_of(16) {
        return Err(BufferError::invalid(
            what,
            format!("a row of x is {hidden_bytes} bytes; rows must be a multiple of 16 bytes"),
        ));
    }
    Ok(())
}

/// `Err` naming the bytes to ask for unless the rings of a call fit in the buffer's
/// num_nvl_bytes (`have`): channels x `n` ranks x ring_tokens slots of slot_bytes (regions.rs).
pub(crate) fn rings_fit(
    what: &'static str,
    (n, have): (usize, usize),
    channels: usize,
    ring_tokens: usize,
    slot_bytes: usize,
) -> Result<(), BufferError> {
    let needed = ring_bytes(channels, n, ring_tokens, slot_bytes);
    if needed > have {
        return Err(BufferError::BufferTooSmall {
            what,
            needed,
            have,
            rings: format!(
                "{channels} channels x {n} ranks x {ring_tokens} slots x {slot_bytes} bytes"
            ),
        });
    }
    Ok(())
}
