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
//! From `Buffer.dispatch` to `cuLaunchKernel`, six frames are our code (the wrapper PyO3
//! generates and cudarc's launch function are not counted):
//!
//! ```text
//! 1  Buffer.dispatch                  python/nvshmem_tutorial/buffer.py
//! 2  BufferCore::dispatch             python/src/buffer/intranode_calls.rs
//! 3  NvshmemBuffer::dispatch_raw      src/dispatch.rs
//! 4  NvshmemBuffer::launch_channels   src/buffer.rs
//! 5  NvshmemBuffer::launch            src/buffer.rs
//! 6  Kernels::launch                  chapters/ch04-collectives/src/launch.rs
//!    -> cuLaunchCooperativeKernel (cuLaunchKernel while a CUDA graph is captured)
//! ```
//!
//! The same holds for the other calls: the notify step of a fresh dispatch goes 2 -> the
//! closure that releases the GIL while the host waits for the counts -> `notify_raw` ->
//! `launch` -> `Kernels::launch` (6); combine is 1-6 with `combine` and `combine_raw`; the
//! layout step has 4 (its body is here; `get_dispatch_layout_raw` launches directly); a
//! low-latency call goes `Buffer.low_latency_dispatch` -> `BufferCore::low_latency_dispatch`
//! -> `low_latency_dispatch_raw` -> `ll_launch` -> `launch` -> `Kernels::launch` (6), and a
//! receive hook starts at `ReceiveHook::__call__` (5). Everything else a call does (reading
//! tensors, the plans, the stream order, the allocations) returns before the launch. The
//! calls of one mode are a #[pymethods] block in a child module each (PyO3's
//! `multiple-pymethods`: `buffer/intranode_calls.rs`, `buffer/internode_calls.rs`,
//! `buffer/low_latency_calls.rs`); this file holds the class, its helpers and the calls of no
//! one mode.
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
use crate::normal;
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
    /// path to the kernel keeps its six frames: see the module docs).
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

/// The calls of no one mode; those of each mode are in the child modules' #[pymethods].
#[pymethods]
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
}
