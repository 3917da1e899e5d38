//! Chapters 7 and 8 for Python: `BufferCore`, the Rust buffer behind one DeepEP-style
//! `Buffer` (nvshmem_tutorial/buffer.py), with every call of both modes as a method.
//!
//! # One call, one crossing
//! Each DeepEP call is one call from Python into Rust. The method reads its tensors
//! (torch.rs), checks the whole call with the crate's pure plans before anything is allocated
//! or launched, orders the streams as DeepEP does (events.rs), allocates the outputs with
//! torch.empty, launches, and returns DeepEP's values; buffer.py only shapes DeepEP's
//! signatures and tuples. A fresh dispatch (the notify step, the wait for the counts, the
//! outputs, the dispatch) is one crossing too.
//!
//! From `Buffer.dispatch` to `cuLaunchKernel`, seven frames are our code (the wrapper PyO3
//! generates and cudarc's launch function are not counted):
//!
//! ```text
//! 1  Buffer.dispatch                  python/nvshmem_tutorial/buffer.py
//! 2  BufferCore::dispatch             python/src/buffer.rs (DeepEP's signature; hands over)
//! 3  BufferCore::dispatch_in_node     python/src/buffer/intranode_calls.rs
//! 4  NvshmemBuffer::dispatch_raw      src/dispatch.rs
//! 5  NvshmemBuffer::launch_channels   src/buffer.rs
//! 6  NvshmemBuffer::launch            src/buffer.rs
//! 7  Kernels::launch                  chapters/ch04-collectives/src/launch.rs
//!    -> cuLaunchCooperativeKernel (cuLaunchKernel while a CUDA graph is captured)
//! ```
//!
//! The same holds for the other calls: the notify step of a fresh dispatch goes 3 -> the
//! closure that releases the GIL while the host waits for the counts -> `notify_raw` ->
//! `launch` -> `Kernels::launch` (7); combine is 1-7 with `combine_in_node` and `combine_raw`;
//! the layout step has 5 (its body is here; `get_dispatch_layout_raw` launches directly); a
//! low-latency call goes `Buffer.low_latency_dispatch` -> `BufferCore::low_latency_dispatch`
//! -> `ll_dispatch` -> `low_latency_dispatch_raw` -> `ll_launch` -> `launch` ->
//! `Kernels::launch` (7), and a receive hook starts at `ReceiveHook::__call__` (5). Everything
//! else a call does (reading tensors, the plans, the stream order, the allocations) returns
//! before the launch. The calls' bodies live by mode in child modules
//! (`buffer/intranode_calls.rs`, `buffer/internode_calls.rs`, `buffer/low_latency_calls.rs`):
//! this file holds the class, its helpers, DeepEP's signatures with their docs, and the calls
//! of no one mode.
//!
//! # Memory and lifetime
//! The buffer's symmetric allocation follows the package's freeing rule (state.rs): the
//! package's state owns it, and a token keeps it alive. The `BufferCore` holds the token
//! until `destroy()` (or until it is garbage-collected), and so does every region view
//! (`local_region`, `next_low_latency_combine_buffer`: DLPack capsules over the buffer's
//! memory), so a view never dangles: after `destroy()` it still reads and writes the
//! buffer's memory, which returns to NVSHMEM at the first collect point after the last view
//! on every rank is gone (buffer.py's `destroy()` runs one).
//!
//! # The GIL
//! A call holds it (it calls torch) except while a fresh dispatch waits for its counts. Calls
//! of one buffer must not overlap: a second one from another thread is refused (shared.rs).

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys;
use nvshmem_tutorial::{BufferError, BufferOptions, Config, NvshmemBuffer, plan_layout};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::config::{self, PyConfig, buffer_timeout_ms};
use crate::dlpack;
use crate::errors::Error;
use crate::events::{StreamArgs, Streams};
use crate::internode::{InternodeLayout, PyInternodeHandle};
use crate::low_latency::PyLlHandle;
use crate::normal::{self, Layout, PyHandle};
use crate::shared::{Call, Shared};
use crate::state::{self, Token};
use crate::torch::{Alloc, Outputs, Tensor};

mod internode_calls;
mod intranode_calls;
mod low_latency_calls;

/// A 3-D shape, as DeepEP gives the low-latency tensors.
type Shape3 = (usize, usize, usize);

/// torch's `stream.cuda_stream` integer as the driver's handle.
fn cu(stream: u64) -> sys::CUstream {
    stream as usize as sys::CUstream
}

/// What a call marks as used by its streams (and its event or hook keeps alive): the tensors
/// it was given, `required` and the `optional` ones that were, then those it `made`.
fn tensors_used<'a, 'py>(
    required: &[&'a Tensor<'py>],
    optional: &[&'a Option<Tensor<'py>>],
    made: impl IntoIterator<Item = &'a Bound<'py, PyAny>>,
) -> Vec<&'a Bound<'py, PyAny>> {
    let optional = optional.iter().filter_map(|t| t.as_ref());
    let given = required.iter().copied().chain(optional);
    given.map(|t| &t.obj).chain(made).collect()
}

/// The Rust buffer behind one Python `Buffer`.
#[pyclass(module = "nvshmem_tutorial._native", frozen)]
pub struct BufferCore {
    /// The package's state owns the buffer (see the module docs).
    shared: Weak<Shared>,
    /// This object's claim on the buffer's memory; None once destroyed.
    token: Mutex<Option<Arc<Token>>>,
    /// This PE's GPU.
    device: i32,
    timeout_ms: u64,
    /// The communication stream (a torch Stream): kernels run on it, async_finish marks the
    /// call's tensors as used by it.
    comm_stream: Py<PyAny>,
    alloc: Alloc,
}

impl BufferCore {
    fn shared(&self) -> Result<Arc<Shared>, Error> {
        let shared = self.shared.upgrade();
        shared.ok_or_else(|| BufferError::Destroyed.into())
    }

    fn token(&self) -> Result<Arc<Token>, Error> {
        let token = self.token.lock().unwrap_or_else(|p| p.into_inner());
        token.clone().ok_or_else(|| BufferError::Destroyed.into())
    }

    /// Starts a normal-mode call with `config`, or DeepEP's `default` for the ranks and
    /// `num_sms` when none is given.
    fn enter_with(
        &self,
        config: Option<PyRef<'_, PyConfig>>,
        num_sms: u32,
        default: fn(usize, u32) -> Result<Config, BufferError>,
    ) -> Result<(Call, Config), Error> {
        let call = Call::enter(&self.shared)?;
        let n = call.buffer.world().n_pes();
        Ok((call, config::or_default(config, n, num_sms, default)?))
    }

    /// Orders a normal-mode call's streams (events.rs), and where its outputs come from.
    fn streams<'py>(
        &self,
        py: Python<'py>,
        call: &Call,
        args: StreamArgs<'py>,
    ) -> Result<(Streams<'py>, Outputs<'_>), Error> {
        let streams = Streams::normal(call, self.comm(py), args)?;
        Ok((streams, Outputs::Allocated(&self.alloc)))
    }

    /// Readies a normal-mode call of one launch, in the order every such call keeps: `plan`
    /// checks the whole call against outputs of their planned shapes (`make(&Outputs::Planned)`:
    /// views, no memory), so nothing is ordered or allocated for a call it refuses; then the
    /// streams are ordered and `make` allocates the outputs. Returns the streams, the output
    /// tensors and their views; the caller launches on `streams.launch` (not from here, so the
    /// path to the kernel keeps its seven frames: see the module docs).
    fn plan_and_allocate<'py, T, V, P>(
        &self,
        py: Python<'py>,
        call: &Call,
        streams: StreamArgs<'py>,
        make: impl Fn(&Outputs<'_>) -> PyResult<(T, V)>,
        plan: impl FnOnce(&V) -> Result<P, BufferError>,
    ) -> Result<(Streams<'py>, T, V), Error> {
        let (_, planned) = make(&Outputs::Planned)?;
        plan(&planned)?;
        let (streams, alloc) = self.streams(py, call, streams)?;
        let (tensors, views) = make(&alloc)?;
        Ok((streams, tensors, views))
    }

    /// The communication stream (a torch Stream).
    fn comm<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.comm_stream.bind(py).clone()
    }

    /// A DLPack capsule of `num_bytes` at `ptr` in the buffer's memory, holding its token.
    fn region(&self, py: Python<'_>, ptr: u64, num_bytes: usize) -> Result<Py<PyAny>, Error> {
        Ok(dlpack::byte_tensor(
            py,
            ptr,
            num_bytes,
            self.device,
            self.token()?,
        )?)
    }
}

/// Every call takes DeepEP's arguments in DeepEP's order (a few grouped in tuples: `streams`,
/// `topk`, ...), which is more than clippy's limit.
#[pymethods]
#[allow(clippy::too_many_arguments)]
impl BufferCore {
    /// Collective: every rank makes its buffer with the same sizes, after NVSHMEM is up.
    /// `comm_stream` is the torch Stream the buffer's kernels run on; `timeout_ms` bounds
    /// every wait (None: `NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS`, else 100 s).
    #[new]
    #[pyo3(signature = (num_nvl_bytes, num_rdma_bytes, low_latency_mode, comm_stream, timeout_ms = None))]
    fn new(
        py: Python<'_>,
        num_nvl_bytes: usize,
        num_rdma_bytes: usize,
        low_latency_mode: bool,
        comm_stream: Bound<'_, PyAny>,
        timeout_ms: Option<i64>,
    ) -> Result<Self, Error> {
        let timeout_ms = buffer_timeout_ms(timeout_ms)?;
        let comm: u64 = comm_stream.getattr("cuda_stream")?.extract()?;
        let world = state::with_state_detached(py, "Buffer", |s| Ok(s.world.clone()))?;
        let device = world.context().ordinal() as i32;
        let alloc = Alloc::new(py, device)?;
        let options = BufferOptions {
            num_nvl_bytes,
            num_rdma_bytes,
            low_latency_mode,
            timeout_ms,
        };
        let heap_bytes = config::buffer_heap_bytes(world.n_pes(), num_nvl_bytes, num_rdma_bytes);
        let shared = py.detach(|| -> Result<_, Error> {
            let buffer = NvshmemBuffer::new(world, options)?;
            let context = buffer.world().context();
            context
                .bind_to_thread()
                .map_err(Error::cuda("binding the buffer's CUDA context"))?;
            Ok(Arc::new(Shared::new(buffer, device, comm)?))
        })?;
        let owner = shared.clone();
        let token = state::with_state_detached(py, "Buffer", |s| Ok(s.adopt(owner, heap_bytes)))?;
        Ok(Self {
            shared: Arc::downgrade(&shared),
            token: Mutex::new(Some(token)),
            device,
            timeout_ms,
            comm_stream: comm_stream.unbind(),
            alloc,
        })
    }

    /// Releases the buffer after waiting for the GPU, then raises what its kernels recorded
    /// (the error record is read here). Its memory returns to NVSHMEM at the next collect
    /// point once no region view over it is left (buffer.py's `destroy()` runs one). A second
    /// call does nothing.
    fn destroy(&self, py: Python<'_>) -> Result<(), Error> {
        let token = self.token.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (Some(token), Some(shared)) = (token, self.shared.upgrade()) else {
            return Ok(());
        };
        shared.mark_destroyed();
        let checked = py.detach(|| {
            let context = shared.buffer.world().context();
            context
                .bind_to_thread()
                .and_then(|()| context.synchronize())
                .map_err(Error::cuda(
                    "waiting for the GPU before destroying the buffer",
                ))?;
            shared.check()
        });
        drop((shared, token));
        checked
    }

    fn is_destroyed(&self) -> bool {
        let token = self.token.lock().unwrap_or_else(|p| p.into_inner());
        token.is_none() || self.shared.strong_count() == 0
    }

    /// Raises what a kernel of this buffer recorded, if anything (reads host-mapped memory;
    /// never waits for the GPU).
    fn check(&self) -> Result<(), Error> {
        self.shared()?.check()
    }

    /// The bound on every wait of this buffer, in milliseconds.
    #[getter]
    fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// A DLPack capsule (uint8) over this rank's normal-mode region, or over the low-latency
    /// one with `rdma`, that keeps the buffer's memory alive.
    fn local_region(&self, py: Python<'_>, rdma: bool) -> Result<Py<PyAny>, Error> {
        let (ptr, num_bytes) = self.shared()?.buffer.local_region(rdma);
        self.region(py, ptr, num_bytes)
    }

    /// The zero-copy combine's staging rows for `handle` (a low-latency dispatch's): a DLPack
    /// capsule (uint8, bf16 rows) that keeps the buffer's memory alive, and the shape DeepEP
    /// gives them, (num_local_experts, num_ranks x T, hidden).
    fn next_low_latency_combine_buffer(
        &self,
        py: Python<'_>,
        handle: PyLlHandle<'_>,
    ) -> Result<(Py<PyAny>, Shape3), Error> {
        self.ll_combine_buffer(py, handle)
    }

    /// DeepEP's `get_dispatch_layout`: (num_tokens_per_rank, num_tokens_per_rdma_rank (None
    /// on one node), num_tokens_per_expert, is_token_in_rank, event). `streams`: (previous_event, async_finish,
    /// allocate_on_comm_stream), as every normal-mode call takes them.
    fn get_dispatch_layout<'py>(
        &self,
        py: Python<'py>,
        topk_idx: Tensor<'py>,
        num_experts: usize,
        streams: StreamArgs<'py>,
    ) -> Result<Bound<'py, PyTuple>, Error> {
        let call = Call::enter(&self.shared)?;
        let topk = topk_idx.view("topk_idx", self.device)?;
        let spec = call.buffer.spec();
        let shape = (
            spec.n_pes,
            spec.n_pes / spec.node_pes,
            num_experts,
            topk.rows(),
        );
        let (streams, ([per_rank, per_expert, in_rank], per_node), out) = self.plan_and_allocate(
            py,
            &call,
            streams,
            |make| normal::layout_outputs(py, make, shape),
            |planned| plan_layout(call.buffer.spec(), &topk, num_experts, planned),
        )?;
        // SAFETY: views of live tensors on this PE's GPU (checked by the plan and torch.rs),
        // a stream of its context.
        unsafe {
            call.buffer
                .get_dispatch_layout_raw(&topk, num_experts, &out, cu(streams.launch))
        }?;
        let mut used = vec![&topk_idx.obj, &per_rank, &per_expert, &in_rank];
        used.extend(per_node.as_ref());
        let event = streams.finish(&call, &used)?;
        Ok((per_rank, per_node, per_expert, in_rank, event).into_pyobject(py)?)
    }

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
        self.dispatch_in_node(
            py,
            x,
            x_scales,
            layout,
            topk,
            expert_alignment,
            num_worst_tokens,
            config,
            num_sms,
            streams,
        )
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
        self.cached_dispatch_in_node(py, x, x_scales, handle, topk, config, num_sms, streams)
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
        self.combine_in_node(py, x, handle, topk_weights, bias, config, num_sms, streams)
    }

    /// DeepEP's `runtime.get_num_rdma_ranks()`: the nodes the buffer spans (N = ranks / G,
    /// chapter 5's node size G, `NVSHMEM_TUTORIAL_NODE_PES` for virtual ones); 1 on one node.
    /// buffer.py routes normal-mode calls across nodes when it is above 1, as DeepEP's.
    fn get_num_rdma_ranks(&self) -> Result<usize, Error> {
        let spec = *self.shared()?.buffer.spec();
        Ok(if spec.spans_nodes() {
            spec.n_pes / spec.node_pes
        } else {
            1
        })
    }

    /// DeepEP's `runtime.get_rdma_rank()`: this rank's node (0 on one node).
    fn get_rdma_rank(&self) -> Result<usize, Error> {
        let spec = *self.shared()?.buffer.spec();
        Ok(if spec.spans_nodes() {
            spec.my_pe / spec.node_pes
        } else {
            0
        })
    }

    /// DeepEP's `runtime.get_root_rdma_rank(global)` (`global_`: `global` is Python's keyword):
    /// the rank that roots this rank's rail (the ranks of its local index on every node): its
    /// local index with `global_`, else 0.
    /// DeepEP bootstraps one NVSHMEM world per rail from it; ours has one world, so this is
    /// information only.
    fn get_root_rdma_rank(&self, global_: bool) -> Result<usize, Error> {
        let spec = *self.shared()?.buffer.spec();
        let local = if spec.spans_nodes() {
            spec.my_pe % spec.node_pes
        } else {
            spec.my_pe
        };
        Ok(if global_ { local } else { 0 })
    }

    /// DeepEP's `runtime.get_local_device_id()`: this rank's GPU.
    fn get_local_device_id(&self) -> i32 {
        self.device
    }

    /// Ours: the largest `Config.num_sms` whose internode dispatch and combine grids (all blocks
    /// resident) this PE can launch: the GPU's SMs with one PE per GPU, its share under MPS.
    /// A larger one is refused by the call, naming this.
    fn internode_max_num_sms(&self) -> Result<u32, Error> {
        let call = Call::enter(&self.shared)?;
        Ok(call.buffer.internode_max_num_sms()?)
    }

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
        self.dispatch_across_nodes(
            py,
            x,
            x_scales,
            layout,
            topk,
            expert_alignment,
            num_worst_tokens,
            config,
            num_sms,
            streams,
        )
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
        self.cached_dispatch_across_nodes(py, x, x_scales, handle, topk, config, num_sms, streams)
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
        self.combine_across_nodes(py, x, handle, topk_weights, bias, config, num_sms, streams)
    }

    /// DeepEP's `clean_low_latency_buffer` (collective), on torch's current stream.
    fn clean_low_latency_buffer(
        &self,
        py: Python<'_>,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
    ) -> Result<(), Error> {
        self.ll_clean(py, num_max_dispatch_tokens_per_rank, hidden, num_experts)
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
        self.ll_dispatch(
            py,
            x,
            topk_idx,
            num_max_dispatch_tokens_per_rank,
            num_experts,
            stats,
            fp8,
            async_finish,
            return_recv_hook,
        )
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
        self.ll_combine(
            py,
            x,
            topk_idx,
            topk_weights,
            handle,
            zero_copy,
            async_finish,
            return_recv_hook,
            out,
            combine_wait_recv_cost_stats,
        )
    }
}
