//! `BufferCore`'s low-latency calls (chapter 8: DeepEP's `low_latency_dispatch`,
//! `low_latency_combine`, `clean_low_latency_buffer` and the zero-copy combine's staging rows),
//! a #[pymethods] block of their own (PyO3's `multiple-pymethods`). A child module of
//! buffer.rs, so it uses that module's helpers (`region`, `comm`, `cu`, `tensors_used`).

use nvshmem_tutorial::{ElemType, LlDispatchOptions, plan_ll_combine, plan_ll_dispatch};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{BufferCore, Shape3, cu, tensors_used};
use crate::errors::Error;
use crate::events::Streams;
use crate::low_latency::{self, PyLlHandle, Receive};
use crate::shared::Call;
use crate::torch::{Outputs, Tensor, Torch, optional_view};

/// Every call takes DeepEP's arguments in DeepEP's order (a few grouped in tuples: `streams`,
/// `topk`, ...), which is more than clippy's limit.
#[pymethods]
#[allow(clippy::too_many_arguments)]
impl BufferCore {
    /// The zero-copy combine's staging rows for `handle` (a low-latency dispatch's): a DLPack
    /// capsule (uint8, bf16 rows) that keeps the buffer's memory alive, and the shape DeepEP
    /// gives them, (num_local_experts, num_ranks x T, hidden).
    fn next_low_latency_combine_buffer(
        &self,
        py: Python<'_>,
        handle: PyLlHandle<'_>,
    ) -> Result<(Py<PyAny>, Shape3), Error> {
        let shared = self.shared()?;
        let (t, hidden) = (handle.max_tokens, handle.hidden);
        let rows =
            shared
                .buffer
                .next_low_latency_combine_buffer_raw(t, hidden, handle.num_experts)?;
        let n = shared.buffer.world().n_pes();
        let capsule = self.region(py, rows.ptr, rows.rows() * rows.cols() * 2)?;
        Ok((capsule, (handle.num_experts / n, n * t, hidden)))
    }

    /// DeepEP's `clean_low_latency_buffer` (collective), on torch's current stream.
    fn clean_low_latency_buffer(
        &self,
        py: Python<'_>,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
    ) -> Result<(), Error> {
        let call = Call::enter(&self.shared)?;
        let stream = Torch::get(py)?.current_stream(py, self.device)?;
        let t = num_max_dispatch_tokens_per_rank;
        // SAFETY: torch's current stream of this PE's GPU.
        unsafe {
            call.buffer
                .clean_low_latency_buffer_raw(t, hidden, num_experts, cu(stream))
        }?;
        Ok(())
    }

    /// DeepEP's low-latency dispatch: (recv_x, the fp8 scales' storage or None, recv_count,
    /// handle, event, hook). The scales' storage is [L, H / 128, R x T] (buffer.py returns its
    /// transpose); see low_latency.rs for the shapes. `stats`:
    /// (cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats); `fp8`: (use_fp8,
    /// round_scale, use_ue8m0).
    fn low_latency_dispatch<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        topk_idx: Tensor<'py>,
        num_max_dispatch_tokens_per_rank: usize,
        num_experts: usize,
        stats: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        fp8: (bool, bool, bool),
        async_finish: bool,
        return_recv_hook: bool,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let call = Call::enter(&self.shared)?;
        let (n, dev) = (call.buffer.world().n_pes(), self.device);
        let inputs = low_latency::dispatch_inputs(dev, (&x, &topk_idx), (&stats.0, &stats.1))?;
        let options = LlDispatchOptions {
            num_max_dispatch_tokens_per_rank,
            num_experts,
            use_fp8: fp8.0,
            round_scale: fp8.1,
            use_ue8m0: fp8.2,
        };
        let phases = low_latency::phases(return_recv_hook);
        let shape = (n, inputs.x.cols());
        let (_, planned) = low_latency::dispatch_outputs(py, &Outputs::Planned, &options, shape)?;
        plan_ll_dispatch(
            call.buffer.spec(),
            &inputs,
            &planned,
            &options,
            phases,
            None,
        )?;
        let streams = Streams::low_latency(&call, self.comm(py), async_finish, return_recv_hook)?;
        let alloc = Outputs::Allocated(&self.alloc);
        let (received, outputs) = low_latency::dispatch_outputs(py, &alloc, &options, shape)?;
        let launch = cu(streams.launch);
        // SAFETY: as in `dispatch` (intranode_calls.rs).
        unsafe {
            call.buffer
                .low_latency_dispatch_raw(&inputs, &outputs, &options, phases, launch)
        }?;
        let used = tensors_used(&[&x, &topk_idx], &[&stats.0, &stats.1], &received);
        let receive = (
            Receive::Dispatch(inputs, outputs, options),
            return_recv_hook,
        );
        let (hook, event) = low_latency::finish(py, &call, streams, receive, &used)?;
        let [recv_x, scales, count, src_info, layout_range] = received;
        let hidden = inputs.x.cols();
        let t = num_max_dispatch_tokens_per_rank;
        let handle = (src_info, layout_range, t, hidden, num_experts).into_pyobject(py)?;
        Ok((recv_x, scales, count, handle, event, hook).into_pyobject(py)?)
    }

    /// DeepEP's low-latency combine (`x` is not read with `zero_copy`, which combines the
    /// staging rows of `next_low_latency_combine_buffer`): (combined_x, event, hook).
    fn low_latency_combine<'py>(
        &self,
        py: Python<'py>,
        x: Option<Bound<'py, PyAny>>,
        topk_idx: Tensor<'py>,
        topk_weights: Tensor<'py>,
        handle: PyLlHandle<'py>,
        zero_copy: bool,
        async_finish: bool,
        return_recv_hook: bool,
        out: Option<Tensor<'py>>,
        combine_wait_recv_cost_stats: Option<Tensor<'py>>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let call = Call::enter(&self.shared)?;
        let dev = self.device;
        let (ll_handle, handle_tensors) = handle.read(dev)?;
        let wait_cost = &combine_wait_recv_cost_stats;
        let topk = (&topk_idx, &topk_weights);
        let (x, inputs) = low_latency::combine_inputs(dev, (x, zero_copy), topk, wait_cost)?;
        let phases = low_latency::phases(return_recv_hook);
        let out_shape = [inputs.topk_idx.rows(), ll_handle.hidden];
        let given = optional_view(&out, "out", dev)?;
        let make = |outputs: &Outputs<'_>| match (&out, given) {
            (Some(out), Some(view)) => Ok((out.obj.clone(), view)),
            _ => outputs.make(py, &out_shape, ElemType::Bf16),
        };
        let (_, planned) = make(&Outputs::Planned)?;
        plan_ll_combine(
            call.buffer.spec(),
            &inputs,
            &ll_handle,
            &planned,
            phases,
            None,
        )?;
        let streams = Streams::low_latency(&call, self.comm(py), async_finish, return_recv_hook)?;
        let (combined, out_view) = make(&Outputs::Allocated(&self.alloc))?;
        let launch = cu(streams.launch);
        // SAFETY: as in `dispatch` (intranode_calls.rs).
        unsafe {
            call.buffer
                .low_latency_combine_raw(&inputs, &ll_handle, &out_view, phases, launch)
        }?;
        let made = handle_tensors.iter().chain([&combined]);
        let used = tensors_used(&[&topk_idx, &topk_weights], &[&x, wait_cost], made);
        let receive = (
            Receive::Combine(inputs, ll_handle, out_view),
            return_recv_hook,
        );
        let (hook, event) = low_latency::finish(py, &call, streams, receive, &used)?;
        Ok((combined, event, hook).into_pyobject(py)?)
    }
}
