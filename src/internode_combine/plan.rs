//! The internode combine's plan: every check of the buffer, the inputs, the handle and the
//! outputs, the rings' sizes, then the kernel's argument struct (pure: no buffer, no device).

use kernels::contract::{COMBINE_NVL_WINDOW, InternodeCombineArgs, MAX_NORMAL_RANKS, NvlCounters};

use super::{InternodeCombineCall, InternodeCombinePlan};
use crate::checks;
use crate::config::Config;
use crate::error::BufferError;
use crate::internode_dispatch::{fits, rdma_ring, rdma_rings};
use crate::internode_notify::check_call;
use crate::low_latency::regions::CONTROL_BYTES;
use crate::regions::combine_slot_bytes;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

const WHAT: &str = "internode_combine";

fn invalid(message: String) -> BufferError {
    BufferError::invalid(WHAT, message)
}

/// A view to check: (the view, its name, dtype, shape, whether bf16 rows of it are read or
/// written a vector at a time).
type Named<'a> = (Option<View>, &'a str, ElemType, [Option<usize>; 2], bool);

/// x and the views sized by it, checked: (M rows, hidden, K top-k). Every view with its name,
/// dtype and shape, bf16 rows 16-byte aligned; the combined weights exactly with the weights.
fn check_views(
    call: &InternodeCombineCall,
    (num_tokens, nodes, g): (usize, usize, usize),
) -> Result<(usize, usize, usize), BufferError> {
    let (inputs, handle, outputs) = (&call.inputs, &call.handle, &call.outputs);
    let x = &inputs.x;
    x.expect(WHAT, "x", ElemType::Bf16, &[None, None])?;
    x.expect_aligned(WHAT, "x", 16)?;
    let (rows, hidden) = (x.rows(), x.cols());
    checks::row_bytes(WHAT, 2 * hidden)?;
    let num_topk = inputs.topk_weights.map_or(0, |w| w.cols());
    checks::num_topk(WHAT, num_topk)?;
    if inputs.topk_weights.is_some() != outputs.combined_topk_weights.is_some() {
        return Err(invalid(
            "combined_topk_weights comes exactly with topk_weights (the weights are summed back)"
                .into(),
        ));
    }
    let (t, by_hidden) = (Some(num_tokens), Some(hidden));
    let named: [Named; 7] = [
        (
            inputs.topk_weights,
            "topk_weights",
            ElemType::F32,
            [Some(rows), None],
            false,
        ),
        (
            inputs.bias[0],
            "bias[0]",
            ElemType::Bf16,
            [t, by_hidden],
            true,
        ),
        (
            inputs.bias[1],
            "bias[1]",
            ElemType::Bf16,
            [t, by_hidden],
            true,
        ),
        (
            Some(outputs.combined_x),
            "combined_x",
            ElemType::Bf16,
            [t, by_hidden],
            true,
        ),
        (
            outputs.combined_topk_weights,
            "combined_topk_weights",
            ElemType::F32,
            [t, Some(num_topk)],
            false,
        ),
        (
            Some(handle.send_rdma_head),
            "send_rdma_head",
            ElemType::I32,
            [t, Some(nodes)],
            false,
        ),
        (
            Some(handle.send_nvl_head),
            "send_nvl_head",
            ElemType::I32,
            [None, Some(g)],
            false,
        ),
    ];
    for (view, name, elem, shape, vectors) in named {
        let Some(view) = view else { continue };
        view.expect(WHAT, name, elem, &shape)?;
        if vectors {
            view.expect_aligned(WHAT, name, 16)?;
        }
    }
    let most = i32::MAX as usize;
    if rows > most || handle.send_nvl_head.rows() > most {
        return Err(invalid(format!(
            "x has {rows} rows and send_nvl_head {}: at most {most}",
            handle.send_nvl_head.rows()
        )));
    }
    Ok((rows, hidden, num_topk))
}

/// The NVL sub-rings of `config` across `nodes` nodes of `g`: (slots of one, a sender's window).
/// A sub-ring holds a forwarder's chunk of pieces (c_r) beside a sender's window (internode_combine.cu
/// NOTES), so it must exceed c_r; nodes of one rank have no NVL stage.
fn sub_rings(
    config: &Config,
    nodes: usize,
    g: usize,
    chunk: usize,
) -> Result<(usize, usize), BufferError> {
    let ring = config.num_max_nvl_chunked_recv_tokens as usize;
    let slots = ring / nodes;
    if g > 1 && slots <= chunk {
        return Err(invalid(format!(
            "num_max_nvl_chunked_recv_tokens = {ring} across {nodes} nodes gives sub-rings of \
             {slots} slots, which must exceed num_max_rdma_chunked_send_tokens = {chunk} (a \
             forwarder's chunk of rows beside a sender's window): raise it to at least {}",
            nodes * (chunk + 1)
        )));
    }
    Ok((
        slots.max(1),
        slots.saturating_sub(chunk).clamp(1, COMBINE_NVL_WINDOW),
    ))
}

// ANCHOR: plan_internode_combine
/// Checks an internode combine for `config` and plans it: a normal-mode buffer across nodes,
/// bf16 `inputs` with a row per row the dispatch delivered, `handle` as the dispatch left it,
/// outputs of its tokens, and the RDMA rings and NVL sub-rings inside their regions.
pub fn plan_internode_combine(
    spec: &BufferSpec,
    config: &Config,
    call: &InternodeCombineCall,
) -> Result<InternodeCombinePlan, BufferError> {
    let handle = &call.handle;
    let checked = check_call(
        WHAT,
        spec,
        config,
        &handle.prefixes,
        handle.is_token_in_rank,
    )?;
    let (area, c, num_tokens) = (checked.area, checked.c, checked.num_tokens);
    let (g, nodes) = (checked.g, checked.nodes);
    let (rows, hidden, num_topk) = check_views(call, (num_tokens, nodes, g))?;
    let (rdma_ring, rdma_chunk) = rdma_ring(WHAT, config)?;
    let (sub_ring, window) = sub_rings(config, nodes, g, rdma_chunk)?;
    let slot_bytes = combine_slot_bytes(2 * hidden, num_topk);
    let rings = |what: &str, count: usize, ring: usize| {
        format!("{what}: {c} channels x {count} x {ring} slots x {slot_bytes} bytes")
    };
    fits(
        WHAT,
        "num_rdma_bytes",
        CONTROL_BYTES + 2 * c * nodes * rdma_ring * slot_bytes,
        spec.options.num_rdma_bytes,
        rings("staging and landing", nodes, rdma_ring),
    )?;
    fits(
        WHAT,
        "num_nvl_bytes",
        c * g * nodes * sub_ring * slot_bytes,
        spec.options.num_nvl_bytes,
        rings(
            "a sub-ring per rank of the node and node",
            g * nodes,
            sub_ring,
        ),
    )?;
    debug_assert!(g * nodes <= MAX_NORMAL_RANKS, "check_call holds the ranks");
    let base = spec.notify_area_base().unwrap_or_default();
    let at = |offset: usize| base + offset as u64;
    let optional = |view: Option<View>| view.map_or(0, |v| v.ptr);
    let (inputs, outputs, prefixes) = (&call.inputs, &call.outputs, &handle.prefixes);
    let args = InternodeCombineArgs {
        x: inputs.x.ptr,
        topk_weights: optional(inputs.topk_weights),
        bias0: optional(inputs.bias[0]),
        bias1: optional(inputs.bias[1]),
        rdma_channel_prefix_matrix: prefixes.rdma_channel_prefix_matrix.ptr,
        recv_rdma_channel_prefix_matrix: prefixes.recv_rdma_channel_prefix_matrix.ptr,
        recv_rdma_rank_prefix_sum: prefixes.recv_rdma_rank_prefix_sum.ptr,
        recv_gbl_channel_prefix_matrix: prefixes.recv_gbl_channel_prefix_matrix.ptr,
        recv_gbl_rank_prefix_sum: prefixes.recv_gbl_rank_prefix_sum.ptr,
        send_rdma_head: handle.send_rdma_head.ptr,
        send_nvl_head: handle.send_nvl_head.ptr,
        combined_x: outputs.combined_x.ptr,
        combined_topk_weights: optional(outputs.combined_topk_weights),
        calls: at(area.combine_calls()),
        nvl: spec.nvl(),
        nvl_counters: NvlCounters {
            tails: at(area.combine_nvl_words(0)),
            heads: at(area.combine_nvl_words(1)),
            sent: at(area.combine_nvl_words(2)),
            received: at(area.combine_nvl_words(3)),
        },
        bad_input: spec.input_error,
        rings: rdma_rings(spec, rdma_ring, rdma_chunk),
        topo: spec.ll_topology(),
        num_tokens: num_tokens as i32,
        hidden_bytes: (2 * hidden) as i32,
        num_topk: num_topk as i32,
        slot_bytes: slot_bytes as i32,
        num_channels: c as i32,
        nvl_sub_ring_tokens: sub_ring as i32,
        nvl_window_tokens: window as i32,
        num_recv_rows: rows as i32,
        num_forwarded_rows: handle.send_nvl_head.rows() as i32,
    };
    Ok(InternodeCombinePlan {
        args,
        num_channels: c,
    })
}
// ANCHOR_END: plan_internode_combine
