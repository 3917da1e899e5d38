//! `BufferCore`'s calls across nodes (issue 32: DeepEP's `internode_dispatch`, its cached form
//! and `internode_combine`), a #[pymethods] block of their own (PyO3's `multiple-pymethods`). A
//! child module of buffer.rs, so it uses that module's helpers (`enter_with`,
//! `plan_and_allocate`, `streams`, `cu`, `tensors_used`), as `intranode_calls.rs` and
//! `low_latency_calls.rs` do for the other calls.

use nvshmem_tutorial::config::{combine_config, dispatch_config};
use nvshmem_tutorial::{
    InternodeCachedDispatchCall, InternodeCombineCall, InternodeNotifyCall,
    plan_internode_cached_dispatch, plan_internode_combine, plan_internode_dispatch,
    plan_internode_notify,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{BufferCore, cu, tensors_used};
use crate::config::PyConfig;
use crate::errors::Error;
use crate::events::StreamArgs;
use crate::internode::{self, InternodeLayout, PyInternodeHandle};
use crate::normal;
use crate::torch::{Outputs, Tensor};

/// Every call takes DeepEP's arguments in DeepEP's order (a few grouped in tuples: `streams`,
/// `topk`, ...), which is more than clippy's limit.
#[pymethods]
#[allow(clippy::too_many_arguments)]
impl BufferCore {
    /// DeepEP's internode dispatch without a handle (issue 32): the notify step across nodes,
    /// the host's wait for the counts (none with `num_worst_tokens`: outputs of that many rows,
    /// received and forwarded, and no host sync, as DeepEP's), then the two-level dispatch.
    /// Returns (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights,
    /// num_recv_tokens_per_expert_list (empty with num_worst_tokens), handle, event), the handle
    /// DeepEP's 10-tuple (internode.rs: position 7 as [M, 2] int32). `layout`:
    /// (num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank, num_tokens_per_expert)
    /// from get_dispatch_layout. bf16 rows, or fp8 bytes with their scales (recv_x_scales row
    /// major, as DeepEP's).
    fn internode_dispatch<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        x_scales: Option<Tensor<'py>>,
        layout: InternodeLayout<'py>,
        topk: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        expert_alignment: usize,
        num_worst_tokens: usize,
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, dispatch_config)?;
        let dev = self.device;
        let notify_inputs = layout.views(dev, expert_alignment)?;
        let num_experts = notify_inputs.num_tokens_per_expert.rows();
        let inputs =
            normal::dispatch_inputs(dev, (&x, &x_scales), (&topk.0, &topk.1), num_experts)?;
        let routing = notify_inputs.is_token_in_rank;
        let spec = *call.buffer.spec();
        let (n, g) = (spec.n_pes, spec.node_pes);
        let shape = (n, n / g, config.num_channels());
        let heads = (routing.rows(), n / g, g);
        let worst = (num_worst_tokens, num_worst_tokens);
        // The whole call is checked before the notify step, which the peers wait for.
        let planned = Outputs::Planned;
        let (_, handle_planned) = internode::notify_outputs(py, &planned, shape)?;
        let (_, outputs_planned) =
            internode::dispatch_outputs(py, &planned, &inputs, worst, heads)?;
        // The grid must stay resident (checked again at the launch): refused here, before the
        // notify step, every rank refuses alike and none waits for the others.
        call.buffer
            .check_resident("internode_dispatch", &config, config.num_channels())?;
        let notify = InternodeNotifyCall::Full(notify_inputs);
        plan_internode_notify(&spec, &config, &notify, &handle_planned)?;
        plan_internode_dispatch(
            &spec,
            &config,
            &inputs,
            routing,
            &handle_planned,
            &outputs_planned,
        )?;

        let (streams, alloc) = self.streams(py, &call, streams)?;
        let (prefix, handle_views) = internode::notify_outputs(py, &alloc, shape)?;
        let (buffer, launch, wait) = (&call.buffer, streams.launch, num_worst_tokens == 0);
        // SAFETY (both launches): views of live tensors on this PE's GPU (checked by the
        // plans and torch.rs), a stream of its context. The GIL is released while the host
        // waits for the counts.
        let counts = py.detach(|| unsafe {
            buffer.internode_notify_raw(&notify, &handle_views, &config, wait, cu(launch))
        })?;
        let rows = counts
            .as_ref()
            .map_or(worst, |c| (c.num_recv_tokens, c.num_rdma_recv_tokens));
        let (received, outputs) = internode::dispatch_outputs(py, &alloc, &inputs, rows, heads)?;
        unsafe {
            buffer.internode_dispatch_raw(
                &inputs,
                routing,
                &handle_views,
                &outputs,
                &config,
                cu(streams.launch),
            )
        }?;

        let [
            recv_x,
            recv_scales,
            recv_idx,
            recv_weights,
            meta,
            rdma_head,
            nvl_head,
        ] = &received;
        let [p1, p2, p3, p4, p5, p6] = &prefix;
        let in_rank = &layout.0[2].obj;
        let handle = [in_rank, p1, p2, p3, p4, p5, p6, meta, rdma_head, nvl_head];
        let handle = PyTuple::new(py, handle)?;
        let layout_objects = layout.0.iter().map(|t| &t.obj);
        let made = layout_objects.chain(&prefix).chain(&received);
        let used = tensors_used(&[&x], &[&x_scales, &topk.0, &topk.1], made);
        let event = streams.finish(&call, &used)?;
        let per_expert = counts.map(|c| c.per_local_expert).unwrap_or_default();
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

    /// DeepEP's internode dispatch with a cached `handle` (the 10-tuple of a full one, position
    /// 7 as [M, 2] int32): the cached notify (the entry barrier), then the dispatch with the
    /// handle's positions; no top-k, no host wait. Returns (recv_x, recv_x_scales, event).
    fn internode_dispatch_cached<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        x_scales: Option<Tensor<'py>>,
        handle: PyInternodeHandle<'py>,
        topk: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, dispatch_config)?;
        let dev = self.device;
        let cached = handle.cached_views(dev)?;
        let inputs = normal::dispatch_inputs(dev, (&x, &x_scales), (&topk.0, &topk.1), 0)?;
        let rows = cached.recv_src_meta.rows();
        let make = |outputs: &Outputs<'_>| {
            let (tensors, (recv_x, recv_x_scales)) =
                internode::recv_x_outputs(py, outputs, &inputs, rows)?;
            let dispatch = InternodeCachedDispatchCall {
                inputs,
                handle: cached,
                recv_x,
                recv_x_scales,
            };
            Ok((tensors, dispatch))
        };
        let (streams, [recv_x, recv_scales], dispatch) =
            self.plan_and_allocate(py, &call, streams, make, |planned| {
                plan_internode_cached_dispatch(call.buffer.spec(), &config, planned)
            })?;
        let (buffer, launch) = (&call.buffer, cu(streams.launch));
        // SAFETY: as in `dispatch` (intranode_calls.rs).
        unsafe { buffer.internode_cached_dispatch_raw(&dispatch, &config, launch) }?;
        let made = [&recv_x, &recv_scales].into_iter().chain(handle.objects());
        let used = tensors_used(&[&x], &[&x_scales], made);
        let event = streams.finish(&call, &used)?;
        Ok((recv_x, recv_scales, event).into_pyobject(py)?)
    }

    /// DeepEP's internode combine with the 10-tuple handle of the dispatch that delivered `x`'s
    /// rows: (combined_x, combined_topk_weights, event). `bias`: (bias_0, bias_1). The cached
    /// notify runs first (the entry barrier), as DeepEP's.
    fn internode_combine<'py>(
        &self,
        py: Python<'py>,
        x: Tensor<'py>,
        handle: PyInternodeHandle<'py>,
        topk_weights: Option<Tensor<'py>>,
        bias: (Option<Tensor<'py>>, Option<Tensor<'py>>),
        config: Option<PyRef<'py, PyConfig>>,
        num_sms: u32,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let (call, config) = self.enter_with(config, num_sms, combine_config)?;
        let dev = self.device;
        let handle_views = handle.combine_views(dev)?;
        let inputs = normal::combine_inputs(dev, &x, &topk_weights, (&bias.0, &bias.1))?;
        let shape = (handle_views.is_token_in_rank.rows(), inputs.x.cols());
        let num_topk = inputs.topk_weights.map(|w| w.cols());
        let combine = |outputs| InternodeCombineCall {
            inputs,
            handle: handle_views,
            outputs,
        };
        let (streams, combined, outputs) = self.plan_and_allocate(
            py,
            &call,
            streams,
            |make| normal::combine_outputs(py, make, shape, num_topk),
            |planned| plan_internode_combine(call.buffer.spec(), &config, &combine(*planned)),
        )?;
        let (buffer, launch) = (&call.buffer, cu(streams.launch));
        // SAFETY: as in `dispatch` (intranode_calls.rs).
        unsafe { buffer.internode_combine_raw(&combine(outputs), &config, launch) }?;
        let made = combined.iter().chain(handle.objects());
        let used = tensors_used(&[&x], &[&topk_weights, &bias.0, &bias.1], made);
        let event = streams.finish(&call, &used)?;
        let [combined_x, combined_weights] = combined;
        Ok((combined_x, combined_weights, event).into_pyobject(py)?)
    }
}
