//! Chapter 8 for Python: the low-latency calls on a `BufferCore` (DeepEP's
//! `low_latency_dispatch`, `low_latency_combine`, `get_next_low_latency_combine_buffer`,
//! `clean_low_latency_buffer`, `get_low_latency_rdma_size_hint`), as functions taking the core.
//! nvshmem_tutorial/buffer.py allocates the outputs and builds DeepEP's tuples.

use nvshmem_tutorial::{
    LlCombineInputs, LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs, LlHandle, Phases,
};
use pyo3::prelude::*;

use crate::buffer::{BufferCore, PyView, optional, view};
use crate::errors::Error;
use crate::transfers::stream_handle;

/// DeepEP's `get_low_latency_rdma_size_hint`: num_rdma_bytes for a low-latency shape.
#[pyfunction]
pub fn low_latency_rdma_size_hint(
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_ranks: usize,
    num_experts: usize,
) -> usize {
    nvshmem_tutorial::get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank,
        hidden,
        num_ranks,
        num_experts,
    )
}

/// "both", "send" or "recv": which halves of a low-latency call a launch runs.
fn parse_phases(name: &str) -> Result<Phases, Error> {
    match name {
        "both" => Ok(Phases::SendAndReceive),
        "send" => Ok(Phases::Send),
        "recv" => Ok(Phases::Receive),
        other => Err(Error::Invalid(format!(
            "phases must be 'both', 'send' or 'recv', got {other:?}"
        ))),
    }
}

/// Low-latency dispatch (chapter 8). The 3-D outputs come flattened (see the Rust
/// `LlDispatchOutputs`); `phases` is "both", "send" or "recv". It runs on `comm` after
/// `compute` (and, with `join`, `compute` waits for it), or on `compute` when `comm` is 0.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (core, x, topk_idx, cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale, use_ue8m0, recv_x, recv_x_scales, recv_src_info, recv_layout_range, recv_count, phases, compute, comm, join))]
pub fn low_latency_dispatch(
    py: Python<'_>,
    core: PyRef<'_, BufferCore>,
    x: PyView,
    topk_idx: PyView,
    cumulative_local_expert_recv_stats: Option<PyView>,
    dispatch_wait_recv_cost_stats: Option<PyView>,
    num_max_dispatch_tokens_per_rank: usize,
    num_experts: usize,
    use_fp8: bool,
    round_scale: bool,
    use_ue8m0: bool,
    recv_x: PyView,
    recv_x_scales: Option<PyView>,
    recv_src_info: PyView,
    recv_layout_range: PyView,
    recv_count: PyView,
    phases: &str,
    compute: u64,
    comm: u64,
    join: bool,
) -> PyResult<()> {
    let inputs = LlDispatchInputs {
        x: view("x", x)?,
        topk_idx: view("topk_idx", topk_idx)?,
        cumulative_local_expert_recv_stats: optional(
            "cumulative_local_expert_recv_stats",
            cumulative_local_expert_recv_stats,
        )?,
        dispatch_wait_recv_cost_stats: optional(
            "dispatch_wait_recv_cost_stats",
            dispatch_wait_recv_cost_stats,
        )?,
    };
    let outputs = LlDispatchOutputs {
        recv_x: view("recv_x", recv_x)?,
        recv_x_scales: optional("recv_x_scales", recv_x_scales)?,
        recv_src_info: view("recv_src_info", recv_src_info)?,
        recv_layout_range: view("recv_layout_range", recv_layout_range)?,
        recv_count: view("recv_count", recv_count)?,
    };
    let options = LlDispatchOptions {
        num_max_dispatch_tokens_per_rank,
        num_experts,
        use_fp8,
        round_scale,
        use_ue8m0,
    };
    let phases = parse_phases(phases)?;
    let order = &core.order;
    // SAFETY: buffer.py passes views of live torch tensors and live streams of this GPU.
    core.with(py, move |b| unsafe {
        order.around(compute, comm, join, |stream| {
            Ok(b.low_latency_dispatch_raw(
                &inputs,
                &outputs,
                &options,
                phases,
                stream_handle(stream) as _,
            )?)
        })
    })
}

/// Low-latency combine; `x` None reads the zero-copy staging rows. Streams as in
/// `low_latency_dispatch`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (core, x, topk_idx, topk_weights, src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts, combine_wait_recv_cost_stats, out, phases, compute, comm, join))]
pub fn low_latency_combine(
    py: Python<'_>,
    core: PyRef<'_, BufferCore>,
    x: Option<PyView>,
    topk_idx: PyView,
    topk_weights: PyView,
    src_info: PyView,
    layout_range: PyView,
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_experts: usize,
    combine_wait_recv_cost_stats: Option<PyView>,
    out: PyView,
    phases: &str,
    compute: u64,
    comm: u64,
    join: bool,
) -> PyResult<()> {
    let inputs = LlCombineInputs {
        x: optional("x", x)?,
        topk_idx: view("topk_idx", topk_idx)?,
        topk_weights: view("topk_weights", topk_weights)?,
        combine_wait_recv_cost_stats: optional(
            "combine_wait_recv_cost_stats",
            combine_wait_recv_cost_stats,
        )?,
    };
    let handle = LlHandle {
        src_info: view("handle[0]", src_info)?,
        layout_range: view("handle[1]", layout_range)?,
        num_max_dispatch_tokens_per_rank,
        hidden,
        num_experts,
    };
    let out = view("out", out)?;
    let phases = parse_phases(phases)?;
    let order = &core.order;
    // SAFETY: as in low_latency_dispatch.
    core.with(py, move |b| unsafe {
        order.around(compute, comm, join, |stream| {
            Ok(b.low_latency_combine_raw(
                &inputs,
                &handle,
                &out,
                phases,
                stream_handle(stream) as _,
            )?)
        })
    })
}

/// (address, rows, hidden) of the zero-copy combine staging: bf16 [L x R x T, hidden].
#[pyfunction]
pub fn next_low_latency_combine_buffer(
    py: Python<'_>,
    core: PyRef<'_, BufferCore>,
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_experts: usize,
) -> PyResult<(u64, usize, usize)> {
    core.with(py, move |b| {
        let v = b.next_low_latency_combine_buffer_raw(
            num_max_dispatch_tokens_per_rank,
            hidden,
            num_experts,
        )?;
        Ok((v.ptr, v.rows(), v.cols()))
    })
}

/// Collective: zeroes the low-latency control words and call count on every rank.
#[pyfunction]
pub fn clean_low_latency_buffer(
    py: Python<'_>,
    core: PyRef<'_, BufferCore>,
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_experts: usize,
    stream: u64,
) -> PyResult<()> {
    // SAFETY: buffer.py passes the current torch stream of this GPU.
    core.with(py, move |b| {
        Ok(unsafe {
            b.clean_low_latency_buffer_raw(
                num_max_dispatch_tokens_per_rank,
                hidden,
                num_experts,
                stream_handle(stream) as _,
            )
        }?)
    })
}
