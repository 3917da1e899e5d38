//! The internode dispatch's plan: every check of the buffer, the inputs, the handle and the
//! outputs, the rings' sizes, then the kernel's argument struct (pure: no buffer, no device).

use kernels::contract::{
    DispatchSlot, InternodeDispatchArgs, MAX_RDMA_CHUNKS, NvlCounters, RdmaRings, WINDOW_TOKENS,
};

use super::{InternodeDispatchOutputs, InternodeDispatchPlan};
use crate::config::{Config, internode_dispatch_slot_bytes};
use crate::dispatch::{DispatchInputs, RowFormat, check_inputs};
use crate::error::BufferError;
use crate::internode_notify::{InternodeCall, InternodeHandle, NotifyArea, check_call};
use crate::low_latency::regions::CONTROL_BYTES;
use crate::spec::{BufferSpec, Progress};
use crate::view::{ElemType, View};

const WHAT: &str = "internode_dispatch";

fn invalid(message: String) -> BufferError {
    BufferError::invalid(WHAT, message)
}

/// The RDMA rings of `config`, checked for `what` (the dispatch or the combine): (R_r, c_r).
/// Chunks of c_r leave in one put each and fill a 32-bit lane mask (c_r <= WINDOW_TOKENS); a
/// sender window (a round of home receivers) needs R_r >= WINDOW_TOKENS + c_r, as whole chunks
/// are written; a ring has at most MAX_RDMA_CHUNKS words.
pub(crate) fn rdma_ring(
    what: &'static str,
    config: &Config,
) -> Result<(usize, usize), BufferError> {
    let ring = config.num_max_rdma_chunked_recv_tokens as usize;
    let chunk = config.num_max_rdma_chunked_send_tokens as usize;
    let window = WINDOW_TOKENS as usize;
    // Config's fields are public: a ring not a whole number of chunks would let a chunk, and
    // its one put, cross the ring's end (Config::new rounds the ring up; this holds the rest).
    if chunk == 0
        || !ring.is_multiple_of(chunk)
        || chunk > window
        || ring < window + chunk
        || ring / chunk > MAX_RDMA_CHUNKS
    {
        return Err(BufferError::invalid(
            what,
            format!(
                "num_max_rdma_chunked_send_tokens = {chunk} and num_max_rdma_chunked_recv_tokens = \
             {ring}: a chunk holds at most {window} tokens, a ring at least {window} + the chunk \
             and at most MAX_RDMA_CHUNKS = {MAX_RDMA_CHUNKS} chunks, a whole number of them \
             (a sender's window of \
             {window} tokens must fit beside the chunk it has not posted yet)"
            ),
        ));
    }
    Ok((ring, chunk))
}

/// The dispatch's outputs as the kernel takes them: rows received (M) and forwarded (M_r), and
/// the addresses (0: not written, as handle 7-9 in a cached dispatch).
pub(crate) struct Written {
    pub(crate) rows: usize,
    pub(crate) forwarded: usize,
    pub(crate) recv_x: u64,
    pub(crate) recv_x_scales: u64,
    pub(crate) recv_topk: (u64, u64),
    pub(crate) recv_src_meta: u64,
    pub(crate) send_rdma_head: u64,
    pub(crate) send_nvl_head: u64,
}

/// recv_x [M, H] of x's dtype and, with fp8, recv_x_scales [M, S] of x_scales' dtype (row
/// major), for rows of format `f` (`what`: the full or the cached dispatch): M.
pub(crate) fn check_recv_x(
    what: &'static str,
    recv_x: &View,
    recv_x_scales: &Option<View>,
    f: &RowFormat,
) -> Result<usize, BufferError> {
    let rows = recv_x.rows();
    recv_x.expect(what, "recv_x", f.elem, &[None, Some(f.hidden)])?;
    recv_x.expect_aligned(what, "recv_x", 16)?;
    match (recv_x_scales, f.num_scales) {
        (Some(s), scales) if scales > 0 => {
            let shape = [Some(rows), Some(scales)];
            s.expect(what, "recv_x_scales", f.scale_elem(), &shape)?;
        }
        (None, 0) => {}
        (Some(_), _) => {
            return Err(BufferError::invalid(
                what,
                "recv_x_scales goes with fp8 x and its x_scales only: pass None for bf16",
            ));
        }
        (None, _) => {
            return Err(BufferError::invalid(
                what,
                "fp8 x needs recv_x_scales [M, S] of x_scales' dtype, row major",
            ));
        }
    }
    Ok(rows)
}

/// The outputs for rows of format `f`, T tokens, N nodes of G ranks, checked.
fn check_outputs(
    outputs: &InternodeDispatchOutputs,
    f: &RowFormat,
    num_tokens: usize,
    (nodes, g): (usize, usize),
) -> Result<Written, BufferError> {
    let rows = check_recv_x(WHAT, &outputs.recv_x, &outputs.recv_x_scales, f)?;
    let meta = [Some(rows), Some(2)];
    outputs
        .recv_src_meta
        .expect(WHAT, "recv_src_meta", ElemType::I32, &meta)?;
    let recv_topk = match (&outputs.recv_topk_idx, &outputs.recv_topk_weights) {
        (Some(i), Some(w)) if f.num_topk > 0 => {
            let shape = [Some(rows), Some(f.num_topk)];
            i.expect(WHAT, "recv_topk_idx", ElemType::I64, &shape)?;
            w.expect(WHAT, "recv_topk_weights", ElemType::F32, &shape)?;
            (i.ptr, w.ptr)
        }
        (None, None) if f.num_topk == 0 => (0, 0),
        _ => {
            return Err(invalid(
                "recv_topk_idx and recv_topk_weights come exactly with topk_idx".into(),
            ));
        }
    };
    let head = [Some(num_tokens), Some(nodes)];
    outputs
        .send_rdma_head
        .expect(WHAT, "send_rdma_head", ElemType::I32, &head)?;
    let nvl = &outputs.send_nvl_head;
    nvl.expect(WHAT, "send_nvl_head", ElemType::I32, &[None, Some(g)])?;
    Ok(Written {
        rows,
        forwarded: nvl.rows(),
        recv_x: outputs.recv_x.ptr,
        recv_x_scales: outputs.recv_x_scales.map_or(0, |v| v.ptr),
        recv_topk,
        recv_src_meta: outputs.recv_src_meta.ptr,
        send_rdma_head: outputs.send_rdma_head.ptr,
        send_nvl_head: nvl.ptr,
    })
}

/// The RDMA rings of `spec`'s buffer, R_r slots each with chunks of c_r, and their words
/// (the notify area's): what the internode dispatch and combine share.
pub(crate) fn rdma_rings(spec: &BufferSpec, ring: usize, chunk: usize) -> RdmaRings {
    let (area, base) = (spec.notify_area(), spec.notify_area_base());
    let word = |offset: fn(&NotifyArea) -> usize| {
        area.zip(base)
            .map_or(0, |(area, base)| base + offset(&area) as u64)
    };
    RdmaRings {
        base: spec.local_region(true).0 + CONTROL_BYTES as u64,
        chunk_words: word(NotifyArea::chunk_words),
        heads: word(NotifyArea::rdma_heads),
        sent: word(NotifyArea::rdma_sent),
        received: word(NotifyArea::rdma_received),
        ring_tokens: ring as i32,
        chunk_tokens: chunk as i32,
    }
}

/// `Err` (for `what`) naming the hint unless `needed` bytes of `region` fit in the buffer's `have`.
pub(crate) fn fits(
    what: &'static str,
    region: &str,
    needed: usize,
    have: usize,
    rings: String,
) -> Result<(), BufferError> {
    if needed > have {
        return Err(BufferError::invalid(
            what,
            format!(
                "this call needs {region} >= {needed} ({rings}) but the buffer has {have}: create \
             it with Config.get_buffer_size_hints_for_nodes(hidden_bytes, num_ranks, \
             node_pes) or more"
            ),
        ));
    }
    Ok(())
}

// ANCHOR: plan_internode_dispatch
/// Checks an internode dispatch for `config` and plans it: a normal-mode buffer across nodes,
/// `inputs` of `is_token_in_rank`'s tokens (bf16 rows, or fp8 bytes with their scales),
/// positions 3-6 of `handle` as the notify wrote them, outputs of the notify's counts (or of
/// num_worst_tokens rows: the kernel bounds every store and records RECV_OVERFLOW), and the
/// RDMA and NVL rings inside their regions.
pub fn plan_internode_dispatch(
    spec: &BufferSpec,
    config: &Config,
    inputs: &DispatchInputs,
    is_token_in_rank: View,
    handle: &InternodeHandle,
    outputs: &InternodeDispatchOutputs,
) -> Result<InternodeDispatchPlan, BufferError> {
    let call = check_call(WHAT, spec, config, handle, is_token_in_rank)?;
    let f = check_inputs(WHAT, inputs, call.num_tokens, call.n)?;
    let written = check_outputs(outputs, &f, call.num_tokens, (call.nodes, call.g))?;
    let routing = (is_token_in_rank, handle);
    let args = dispatch_args(spec, config, (&call, &f), inputs, routing, &written)?;
    Ok(InternodeDispatchPlan {
        args,
        num_channels: call.c,
    })
}
// ANCHOR_END: plan_internode_dispatch

/// The RDMA and NVL rings of a call with rows of format `f`, checked inside their regions:
/// (slot bytes, R_r, c_r, R_n).
fn check_rings(
    spec: &BufferSpec,
    config: &Config,
    call: &InternodeCall,
    f: &RowFormat,
) -> Result<(usize, usize, usize, usize), BufferError> {
    let (c, nodes, g) = (call.c, call.nodes, call.g);
    let (rdma_ring, rdma_chunk) = rdma_ring(WHAT, config)?;
    let nvl_ring = config.num_max_nvl_chunked_recv_tokens as usize;
    let slot_bytes = internode_dispatch_slot_bytes(f.hidden_bytes(), f.num_topk, f.num_scales);
    let rings = |peers: usize, what: &str, ring: usize| {
        format!("{what}: {c} channels x {peers} x {ring} slots x {slot_bytes} bytes")
    };
    let (rdma_have, nvl_have) = (spec.options.num_rdma_bytes, spec.options.num_nvl_bytes);
    let rdma_needed = CONTROL_BYTES + 2 * c * nodes * rdma_ring * slot_bytes;
    let rdma_described = rings(nodes, "staging and landing", rdma_ring);
    fits(
        WHAT,
        "num_rdma_bytes",
        rdma_needed,
        rdma_have,
        rdma_described,
    )?;
    let nvl_needed = c * g * nvl_ring * slot_bytes;
    let nvl_described = rings(g, "ranks of the node", nvl_ring);
    fits(WHAT, "num_nvl_bytes", nvl_needed, nvl_have, nvl_described)?;
    Ok((slot_bytes, rdma_ring, rdma_chunk, nvl_ring))
}

/// The kernel's arguments for a checked call (`call`, rows of format `f`) with `written`
/// outputs, the routing (handle 0) and positions 3-6 of `handle`, the rings checked first.
pub(crate) fn dispatch_args(
    spec: &BufferSpec,
    config: &Config,
    (call, f): (&InternodeCall, &RowFormat),
    inputs: &DispatchInputs,
    (is_token_in_rank, handle): (View, &InternodeHandle),
    written: &Written,
) -> Result<InternodeDispatchArgs, BufferError> {
    let (slot_bytes, rdma_ring, rdma_chunk, nvl_ring) = check_rings(spec, config, call, f)?;
    let base = spec.notify_area_base().unwrap_or_default();
    let optional = |view: Option<View>| view.map_or(0, |v| v.ptr);
    let (scale_token_stride, scale_hidden_stride) = inputs
        .x_scales
        .map_or((0, 0), |s| (s.strides[0] as i64, s.strides[1] as i64));
    Ok(InternodeDispatchArgs {
        x: inputs.x.ptr,
        x_scales: optional(inputs.x_scales),
        scale_token_stride,
        scale_hidden_stride,
        topk_idx: optional(inputs.topk_idx),
        topk_weights: optional(inputs.topk_weights),
        is_token_in_rank: is_token_in_rank.ptr,
        recv_rdma_channel_prefix_matrix: handle.recv_rdma_channel_prefix_matrix.ptr,
        recv_rdma_rank_prefix_sum: handle.recv_rdma_rank_prefix_sum.ptr,
        recv_gbl_channel_prefix_matrix: handle.recv_gbl_channel_prefix_matrix.ptr,
        recv_gbl_rank_prefix_sum: handle.recv_gbl_rank_prefix_sum.ptr,
        recv_x: written.recv_x,
        recv_x_scales: written.recv_x_scales,
        recv_src_meta: written.recv_src_meta,
        recv_topk_idx: written.recv_topk.0,
        recv_topk_weights: written.recv_topk.1,
        send_rdma_head: written.send_rdma_head,
        send_nvl_head: written.send_nvl_head,
        calls: base + call.area.dispatch_calls() as u64,
        nvl: spec.nvl(),
        nvl_counters: NvlCounters {
            tails: spec.counters(0),
            heads: spec.counters(1),
            sent: spec.progress(Progress::DispatchSent),
            received: spec.progress(Progress::DispatchReceived),
        },
        bad_input: spec.input_error,
        rings: rdma_rings(spec, rdma_ring, rdma_chunk),
        topo: spec.ll_topology(),
        slot: DispatchSlot {
            hidden_bytes: f.hidden_bytes() as i32,
            num_topk: f.num_topk as i32,
            num_scales: f.num_scales as i32,
            bytes: slot_bytes as i32,
        },
        num_tokens: call.num_tokens as i32,
        num_experts: inputs.num_experts as i32,
        num_channels: call.c as i32,
        nvl_ring_tokens: nvl_ring as i32,
        num_recv_rows: written.rows as i32,
        num_forwarded_rows: written.forwarded as i32,
    })
}
