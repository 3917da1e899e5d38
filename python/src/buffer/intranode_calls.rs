//! `BufferCore`'s calls on one node in normal mode (chapter 7: DeepEP's intranode `dispatch`,
//! its cached form and `combine`), a #[pymethods] block of their own (PyO3's
//! `multiple-pymethods`), as the calls across nodes are in `internode_calls.rs` and the
//! low-latency ones in `low_latency_calls.rs`. A child module of buffer.rs, so it uses that
//! module's helpers (`enter_with`, `plan_and_allocate`, `streams`, `cu`, `tensors_used`).

use nvshmem_tutorial::config::{combine_config, dispatch_config};
use nvshmem_tutorial::{plan_combine, plan_dispatch, plan_notify};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{BufferCore, cu, tensors_used};
use crate::config::PyConfig;
use crate::errors::Error;
use crate::events::StreamArgs;
use crate::normal::{self, Layout, PyHandle};
use crate::torch::{Outputs, Tensor};

/// Every call takes DeepEP's arguments in DeepEP's order (a few grouped in tuples: `streams`,
/// `topk`, ...), which is more than clippy's limit.
#[pymethods]
#[allow(clippy::too_many_arguments)]
impl BufferCore {
    /// DeepEP's intranode dispatch without a handle: the notify step, the host's wait for
    /// the counts (none with `num_worst_tokens`), then the dispatch. Returns (recv_x,
    /// recv_x_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
    /// handle, event). `layout`: (num_tokens_per_rank, is_token_in_rank,
    /// num_tokens_per_expert) from get_dispatch_layout.
    fn dispatch<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        x_scales: Option<Tensor<'py>>,
        layout: Layout<'py>,
        topk: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        expert_alignment: usize,
        num_worst_tokens: usize,
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, dispatch_config)?;
        let (n, dev) = (call.buffer.world().n_pes(), self.device);
        if num_worst_tokens > 0 && topk.0.is_none() {
            return Err(Error::Invalid(
                "num_worst_tokens > 0 needs topk_idx (as in DeepEP)".into(),
            ));
        }
        let notify_inputs = layout.views(dev, expert_alignment)?;
        let num_experts = notify_inputs.num_tokens_per_expert.rows();
        let inputs =
            normal::dispatch_inputs(dev, (&x, &x_scales), (&topk.0, &topk.1), num_experts)?;
        let routing = notify_inputs.is_token_in_rank;
        let (c, tokens) = (config.num_channels(), routing.rows());
        // The whole call is checked before the notify step, which the peers wait for.
        let planned = Outputs::Planned;
        let (_, notify_planned) = normal::notify_outputs(py, &planned, n, c)?;
        let (_, rest) = normal::handle_rest(py, &planned, num_worst_tokens, (tokens, n))?;
        let (_, outputs) = normal::dispatch_outputs(py, &planned, &inputs, num_worst_tokens)?;
        let handle = normal::fresh_handle(&notify_planned, routing, rest);
        let spec = call.buffer.spec();
        plan_notify(spec, &config, &notify_inputs, &notify_planned)?;
        plan_dispatch(spec, &config, &inputs, &handle, &outputs)?;

        let (streams, alloc) = self.streams(py, &call, streams)?;
        let (prefix, notify_outputs) = normal::notify_outputs(py, &alloc, n, c)?;
        let (buffer, launch, wait) = (&call.buffer, streams.launch, num_worst_tokens == 0);
        // SAFETY (both launches): views of live tensors on this PE's GPU (checked by the
        // plans and torch.rs), a stream of its context. The GIL is released while the host
        // waits for the counts.
        let counts = py.detach(|| unsafe {
            buffer.notify_raw(&notify_inputs, &notify_outputs, &config, wait, cu(launch))
        })?;
        let rows = counts
            .as_ref()
            .map_or(num_worst_tokens, |c| c.num_recv_tokens);
        let (rest, rest_views) = normal::handle_rest(py, &alloc, rows, (tokens, n))?;
        let (received, outputs) = normal::dispatch_outputs(py, &alloc, &inputs, rows)?;
        let handle = normal::fresh_handle(&notify_outputs, routing, rest_views);
        unsafe {
            call.buffer
                .dispatch_raw(&inputs, &handle, &outputs, &config, cu(streams.launch))
        }?;

        let [rank_prefix, channel_prefix, recv_channel_prefix] = &prefix;
        let [src_idx, send_head] = &rest;
        let handle = [
            rank_prefix,
            channel_prefix,
            recv_channel_prefix,
            src_idx,
            &layout.0[1].obj,
            send_head,
        ];
        let handle = PyTuple::new(py, handle)?;
        let layout_objects = layout.0.iter().map(|t| &t.obj);
        let made = layout_objects.chain(&prefix).chain(&rest).chain(&received);
        let used = tensors_used(&[&x], &[&x_scales, &topk.0, &topk.1], made);
        let event = streams.finish(&call, &used)?;
        let per_expert = counts.map(|c| c.per_local_expert).unwrap_or_default();
        let [recv_x, recv_scales, recv_idx, recv_weights] = received;
        let values = (
            recv_x,
            recv_scales,
            recv_idx,
            recv_weights,
            per_expert,
            handle,
            event,
        );
        Ok(values.into_pyobject(py)?)
    }

    /// DeepEP's intranode dispatch with a cached `handle` (no notify step, no top-k).
    /// Returns (recv_x, recv_x_scales, event).
    fn dispatch_cached<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        x_scales: Option<Tensor<'py>>,
        handle: PyHandle<'py>,
        topk: (Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>),
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, dispatch_config)?;
        let dev = self.device;
        if topk.0.is_some() || topk.1.is_some() {
            return Err(Error::Invalid(
                "a cached dispatch (handle given) takes no topk_idx/topk_weights".into(),
            ));
        }
        let handle_views = handle.views(dev)?;
        let inputs = normal::dispatch_inputs(dev, (&x, &x_scales), (&None, &None), 0)?;
        let rows = handle_views.num_recv_tokens();
        let (streams, [recv_x, recv_scales, _, _], outputs) = self.plan_and_allocate(
            py,
            &call,
            streams,
            |make| normal::dispatch_outputs(py, make, &inputs, rows),
            |planned| plan_dispatch(call.buffer.spec(), &config, &inputs, &handle_views, planned),
        )?;
        let (buffer, launch) = (&call.buffer, cu(streams.launch));
        // SAFETY: as in `dispatch`.
        unsafe { buffer.dispatch_raw(&inputs, &handle_views, &outputs, &config, launch) }?;
        let made = [&recv_x, &recv_scales].into_iter().chain(handle.tensors());
        let used = tensors_used(&[&x], &[&x_scales], made);
        let event = streams.finish(&call, &used)?;
        Ok((recv_x, recv_scales, event).into_pyobject(py)?)
    }

    /// DeepEP's intranode combine with the handle of the dispatch that delivered `x`'s rows:
    /// (combined_x, combined_topk_weights, event). `bias`: (bias_0, bias_1).
    fn combine<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        handle: PyHandle<'py>,
        topk_weights: Option<Tensor<'py>>,
        bias: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, combine_config)?;
        let dev = self.device;
        let handle_views = handle.views(dev)?;
        let inputs = normal::combine_inputs(dev, &x, &topk_weights, (&bias.0, &bias.1))?;
        let shape = (handle_views.num_tokens(), inputs.x.cols());
        let num_topk = inputs.topk_weights.map(|w| w.cols());
        let (streams, combined, outputs) = self.plan_and_allocate(
            py,
            &call,
            streams,
            |make| normal::combine_outputs(py, make, shape, num_topk),
            |planned| plan_combine(call.buffer.spec(), &config, &inputs, &handle_views, planned),
        )?;
        let (buffer, launch) = (&call.buffer, cu(streams.launch));
        // SAFETY: as in `dispatch`.
        unsafe { buffer.combine_raw(&inputs, &handle_views, &outputs, &config, launch) }?;
        let made = combined.iter().chain(handle.tensors());
        let used = tensors_used(&[&x], &[&topk_weights, &bias.0, &bias.1], made);
        let event = streams.finish(&call, &used)?;
        let [combined_x, combined_weights] = combined;
        Ok((combined_x, combined_weights, event).into_pyobject(py)?)
    }
}
