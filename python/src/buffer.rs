//! Chapter 7 for Python (chapter 8's calls are in low_latency.rs): `BufferCore` (one `NvshmemBuffer` per DeepEP-style `Buffer`) and
//! `Config`. Tensors arrive as views, `(address, shape, strides, dtype name)`; every check,
//! size formula and launch is the Rust crate's. nvshmem_tutorial/buffer.py adds the torch
//! side: allocation of outputs, streams and events, DeepEP's tuples.

use std::sync::{Arc, Mutex};

use ch01_bootstrap::World;
use nvshmem_tutorial::{
    BufferError, BufferOptions, CombineInputs, CombineOutputs, Config, DispatchInputs,
    DispatchOutputs, ElemType, Handle, LayoutOutputs, NotifyInputs, NotifyOutputs, NvshmemBuffer,
    View,
};
use pyo3::prelude::*;

use crate::errors::Error;
use crate::state;
use crate::streams::StreamOrder;
use crate::transfers::stream_handle;

impl From<BufferError> for Error {
    fn from(e: BufferError) -> Self {
        match e {
            BufferError::Invalid { .. }
            | BufferError::BufferTooSmall { .. }
            | BufferError::BadExpert { .. }
            | BufferError::BadHandle { .. }
            | BufferError::SlotsFull { .. } => Error::Invalid(e.to_string()),
            BufferError::Coll(e) => e.into(),
            other => Error::Failed(other.to_string()),
        }
    }
}

/// A tensor as buffer.py passes it: (address, shape, strides in elements, torch dtype name).
pub(crate) type PyView = (u64, Vec<usize>, Vec<usize>, String);

pub(crate) fn view(name: &str, (ptr, shape, strides, dtype): PyView) -> Result<View, Error> {
    let elem = ElemType::from_name(&dtype).ok_or_else(|| {
        Error::Invalid(format!(
            "{name} is torch.{dtype}; the buffer takes bfloat16, float8_e4m3fn, float32, int32, \
             int64 and bool tensors"
        ))
    })?;
    let dims = shape.len();
    if !(1..=2).contains(&dims) || strides.len() != dims {
        return Err(Error::Invalid(format!(
            "{name} must be 1-D or 2-D, got shape {shape:?}"
        )));
    }
    let pad = |v: &[usize], fill: usize| [v[0], if dims == 2 { v[1] } else { fill }];
    Ok(View {
        ptr,
        dims,
        shape: pad(&shape, 1),
        strides: pad(&strides, 1),
        elem,
    })
}

pub(crate) fn optional(name: &str, v: Option<PyView>) -> Result<Option<View>, Error> {
    v.map(|v| view(name, v)).transpose()
}

/// DeepEP's `Config`: the same constructor, defaults and hints (src/config.rs).
#[pyclass(name = "Config", module = "nvshmem_tutorial._native", frozen)]
#[derive(Clone)]
pub struct PyConfig(pub Config);

#[pymethods]
impl PyConfig {
    #[new]
    #[pyo3(signature = (num_sms = 20, num_max_nvl_chunked_send_tokens = 6, num_max_nvl_chunked_recv_tokens = 256, num_max_rdma_chunked_send_tokens = 6, num_max_rdma_chunked_recv_tokens = 256))]
    fn new(
        num_sms: u32,
        num_max_nvl_chunked_send_tokens: u32,
        num_max_nvl_chunked_recv_tokens: u32,
        num_max_rdma_chunked_send_tokens: u32,
        num_max_rdma_chunked_recv_tokens: u32,
    ) -> PyResult<Self> {
        let config = Config::new(
            num_sms,
            num_max_nvl_chunked_send_tokens,
            num_max_nvl_chunked_recv_tokens,
            num_max_rdma_chunked_send_tokens,
            num_max_rdma_chunked_recv_tokens,
        )
        .map_err(Error::from)?;
        Ok(Self(config))
    }
    /// Bytes of `num_nvl_bytes` a dispatch/combine of rows of `hidden_bytes` needs.
    fn get_nvl_buffer_size_hint(&self, hidden_bytes: usize, num_ranks: usize) -> usize {
        self.0.get_nvl_buffer_size_hint(hidden_bytes, num_ranks)
    }
    fn get_rdma_buffer_size_hint(&self, hidden_bytes: usize, num_ranks: usize) -> usize {
        self.0.get_rdma_buffer_size_hint(hidden_bytes, num_ranks)
    }
    #[getter]
    fn num_sms(&self) -> u32 {
        self.0.num_sms
    }
    fn __repr__(&self) -> String {
        let c = &self.0;
        format!(
            "Config({}, {}, {}, {}, {})",
            c.num_sms,
            c.num_max_nvl_chunked_send_tokens,
            c.num_max_nvl_chunked_recv_tokens,
            c.num_max_rdma_chunked_send_tokens,
            c.num_max_rdma_chunked_recv_tokens
        )
    }
}

/// DeepEP's default dispatch config for `num_ranks` with `num_sms` SMs.
#[pyfunction]
pub fn dispatch_config(num_ranks: usize, num_sms: u32) -> PyResult<PyConfig> {
    Ok(PyConfig(
        nvshmem_tutorial::config::dispatch_config(num_ranks, num_sms).map_err(Error::from)?,
    ))
}

/// DeepEP's default combine config.
#[pyfunction]
pub fn combine_config(num_ranks: usize, num_sms: u32) -> PyResult<PyConfig> {
    Ok(PyConfig(
        nvshmem_tutorial::config::combine_config(num_ranks, num_sms).map_err(Error::from)?,
    ))
}

/// Symmetric heap bytes a buffer of these sizes takes on `n_pes` PEs (buffer.py sizes
/// NVSHMEM_SYMMETRIC_SIZE with it before initialising NVSHMEM).
#[pyfunction]
pub fn buffer_heap_bytes(n_pes: usize, num_nvl_bytes: usize, num_rdma_bytes: usize) -> usize {
    nvshmem_tutorial::buffer::heap_bytes(n_pes, num_nvl_bytes, num_rdma_bytes)
}

/// The Rust buffer behind one Python `Buffer`. `None` once destroyed.
#[pyclass(module = "nvshmem_tutorial._native")]
pub struct BufferCore {
    inner: Mutex<Option<NvshmemBuffer<Arc<World>>>>,
    /// Orders the compute and communication streams around a launch (streams.rs).
    pub(crate) order: StreamOrder,
}

impl BufferCore {
    pub(crate) fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&NvshmemBuffer<Arc<World>>) -> Result<R, Error> + Send,
    ) -> PyResult<R> {
        py.detach(|| {
            let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let buffer = guard
                .as_ref()
                .ok_or_else(|| Error::from(BufferError::Destroyed))?;
            f(buffer)
        })
        .map_err(Into::into)
    }
}

#[pymethods]
impl BufferCore {
    /// Collective: every rank makes its buffer with the same sizes. NVSHMEM must be up.
    #[new]
    fn new(
        py: Python<'_>,
        num_nvl_bytes: usize,
        num_rdma_bytes: usize,
        low_latency_mode: bool,
        timeout_ms: u64,
    ) -> PyResult<Self> {
        let world = state::with_state_detached(py, "Buffer", |s| Ok(s.world.clone()))?;
        let options = BufferOptions {
            num_nvl_bytes,
            num_rdma_bytes,
            low_latency_mode,
            timeout_ms,
        };
        let (buffer, order) =
            py.detach(|| -> Result<_, Error> {
                let buffer = NvshmemBuffer::new(world, options)?;
                buffer.world().context().bind_to_thread().map_err(|e| {
                    Error::Failed(format!("binding the buffer's CUDA context: {e}"))
                })?;
                Ok((buffer, StreamOrder::new()?))
            })?;
        Ok(Self {
            inner: Mutex::new(Some(buffer)),
            order,
        })
    }

    /// Collective: frees the buffer's symmetric allocation (every rank destroys its buffer).
    fn destroy(&self, py: Python<'_>) {
        py.detach(|| {
            let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(buffer) = taken {
                let _ = buffer.world().context().synchronize();
                drop(buffer);
            }
        })
    }

    fn is_destroyed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Raises what a kernel of this buffer recorded, if anything.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |b| Ok(b.check()?))
    }

    /// (address, bytes) of the normal-mode region, or of the low-latency one with `rdma`.
    fn local_region(&self, py: Python<'_>, rdma: bool) -> PyResult<(u64, usize)> {
        self.with(py, move |b| Ok(b.local_region(rdma)))
    }

    #[allow(clippy::too_many_arguments)]
    fn get_dispatch_layout(
        &self,
        py: Python<'_>,
        topk_idx: PyView,
        num_experts: usize,
        num_tokens_per_rank: PyView,
        num_tokens_per_expert: PyView,
        is_token_in_rank: PyView,
        stream: u64,
    ) -> PyResult<()> {
        let topk_idx = view("topk_idx", topk_idx)?;
        let out = LayoutOutputs {
            num_tokens_per_rank: view("num_tokens_per_rank", num_tokens_per_rank)?,
            num_tokens_per_expert: view("num_tokens_per_expert", num_tokens_per_expert)?,
            is_token_in_rank: view("is_token_in_rank", is_token_in_rank)?,
        };
        // SAFETY: buffer.py passes views of live torch tensors on this GPU.
        self.with(py, move |b| {
            Ok(unsafe {
                b.get_dispatch_layout_raw(&topk_idx, num_experts, &out, stream_handle(stream) as _)
            }?)
        })
    }

    /// The notify step; with `wait`, returns (tokens to receive, per-local-expert counts).
    #[allow(clippy::too_many_arguments)]
    fn notify(
        &self,
        py: Python<'_>,
        num_tokens_per_rank: PyView,
        num_tokens_per_expert: PyView,
        is_token_in_rank: PyView,
        expert_alignment: usize,
        rank_prefix_matrix: PyView,
        channel_prefix_matrix: PyView,
        recv_channel_prefix_matrix: PyView,
        config: PyRef<'_, PyConfig>,
        wait: bool,
        stream: u64,
    ) -> PyResult<Option<(usize, Vec<i32>)>> {
        let config = config.0;
        let inputs = NotifyInputs {
            num_tokens_per_rank: view("num_tokens_per_rank", num_tokens_per_rank)?,
            num_tokens_per_expert: view("num_tokens_per_expert", num_tokens_per_expert)?,
            is_token_in_rank: view("is_token_in_rank", is_token_in_rank)?,
            expert_alignment,
        };
        let outputs = NotifyOutputs {
            rank_prefix_matrix: view("rank_prefix_matrix", rank_prefix_matrix)?,
            channel_prefix_matrix: view("channel_prefix_matrix", channel_prefix_matrix)?,
            recv_channel_prefix_matrix: view(
                "recv_channel_prefix_matrix",
                recv_channel_prefix_matrix,
            )?,
        };
        self.with(py, move |b| {
            // SAFETY: as in get_dispatch_layout.
            let counts = unsafe {
                b.notify_raw(&inputs, &outputs, &config, wait, stream_handle(stream) as _)
            }?;
            Ok(counts.map(|c| (c.num_recv_tokens, c.per_local_expert)))
        })
    }

    /// Dispatch with `handle` = (rank_prefix_matrix, channel_prefix_matrix,
    /// recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, x_scales, topk_idx, topk_weights, num_experts, handle, recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, config, stream))]
    fn dispatch(
        &self,
        py: Python<'_>,
        x: PyView,
        x_scales: Option<PyView>,
        topk_idx: Option<PyView>,
        topk_weights: Option<PyView>,
        num_experts: usize,
        handle: (PyView, PyView, PyView, PyView, PyView, PyView),
        recv_x: PyView,
        recv_x_scales: Option<PyView>,
        recv_topk_idx: Option<PyView>,
        recv_topk_weights: Option<PyView>,
        config: PyRef<'_, PyConfig>,
        stream: u64,
    ) -> PyResult<()> {
        let config = config.0;
        let inputs = DispatchInputs {
            x: view("x", x)?,
            x_scales: optional("x_scales", x_scales)?,
            topk_idx: optional("topk_idx", topk_idx)?,
            topk_weights: optional("topk_weights", topk_weights)?,
            num_experts,
        };
        let handle = to_handle(handle)?;
        let outputs = DispatchOutputs {
            recv_x: view("recv_x", recv_x)?,
            recv_x_scales: optional("recv_x_scales", recv_x_scales)?,
            recv_topk_idx: optional("recv_topk_idx", recv_topk_idx)?,
            recv_topk_weights: optional("recv_topk_weights", recv_topk_weights)?,
        };
        // SAFETY: as in get_dispatch_layout.
        self.with(py, move |b| {
            Ok(unsafe {
                b.dispatch_raw(
                    &inputs,
                    &handle,
                    &outputs,
                    &config,
                    stream_handle(stream) as _,
                )
            }?)
        })
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, topk_weights, bias0, bias1, handle, combined_x, combined_topk_weights, config, stream))]
    fn combine(
        &self,
        py: Python<'_>,
        x: PyView,
        topk_weights: Option<PyView>,
        bias0: Option<PyView>,
        bias1: Option<PyView>,
        handle: (PyView, PyView, PyView, PyView, PyView, PyView),
        combined_x: PyView,
        combined_topk_weights: Option<PyView>,
        config: PyRef<'_, PyConfig>,
        stream: u64,
    ) -> PyResult<()> {
        let config = config.0;
        let inputs = CombineInputs {
            x: view("x", x)?,
            topk_weights: optional("topk_weights", topk_weights)?,
            bias: [optional("bias[0]", bias0)?, optional("bias[1]", bias1)?],
        };
        let handle = to_handle(handle)?;
        let outputs = CombineOutputs {
            combined_x: view("combined_x", combined_x)?,
            combined_topk_weights: optional("combined_topk_weights", combined_topk_weights)?,
        };
        // SAFETY: as in get_dispatch_layout.
        self.with(py, move |b| {
            Ok(unsafe {
                b.combine_raw(
                    &inputs,
                    &handle,
                    &outputs,
                    &config,
                    stream_handle(stream) as _,
                )
            }?)
        })
    }
}

fn to_handle(
    (rpm, cpm, rcpm, src, in_rank, head): (PyView, PyView, PyView, PyView, PyView, PyView),
) -> Result<Handle, Error> {
    Ok(Handle {
        rank_prefix_matrix: view("handle[0]", rpm)?,
        channel_prefix_matrix: view("handle[1]", cpm)?,
        recv_channel_prefix_matrix: view("handle[2]", rcpm)?,
        recv_src_idx: view("handle[3]", src)?,
        is_token_in_rank: view("handle[4]", in_rank)?,
        send_head: view("handle[5]", head)?,
    })
}
