//! DeepEP's `Config` for Python (src/config.rs has the fields, defaults, checks and hints),
//! its per-rank-count defaults, and the buffer's size helpers that need no buffer.

use nvshmem_tutorial::{BufferError, Config};
use pyo3::prelude::*;

use crate::errors::Error;

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
    /// Bytes of `num_rdma_bytes` normal mode needs across nodes of 8 (0 on one node), as DeepEP's.
    fn get_rdma_buffer_size_hint(&self, hidden_bytes: usize, num_ranks: usize) -> usize {
        self.0.get_rdma_buffer_size_hint(hidden_bytes, num_ranks)
    }
    /// (num_nvl_bytes, num_rdma_bytes) on nodes of `node_pes` ranks, any size from 1 to 8.
    fn get_buffer_size_hints_for_nodes(
        &self,
        hidden_bytes: usize,
        num_ranks: usize,
        node_pes: usize,
    ) -> PyResult<(usize, usize)> {
        Ok(self
            .0
            .get_buffer_size_hints_for_nodes(hidden_bytes, num_ranks, node_pes)
            .map_err(Error::from)?)
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

/// The config of a call: the one given, else DeepEP's default for `num_ranks` with
/// `num_sms` (`Buffer.num_sms`), as `default` (dispatch_config or combine_config) makes it.
pub(crate) fn or_default(
    config: Option<PyRef<'_, PyConfig>>,
    num_ranks: usize,
    num_sms: u32,
    default: fn(usize, u32) -> Result<Config, BufferError>,
) -> Result<Config, Error> {
    match config {
        Some(config) => Ok(config.0),
        None => Ok(default(num_ranks, num_sms)?),
    }
}

/// Symmetric heap bytes a buffer of these sizes takes on `n_pes` PEs (buffer.py sizes
/// NVSHMEM_SYMMETRIC_SIZE with it before initialising NVSHMEM).
#[pyfunction]
pub fn buffer_heap_bytes(n_pes: usize, num_nvl_bytes: usize, num_rdma_bytes: usize) -> usize {
    nvshmem_tutorial::buffer::heap_bytes(n_pes, num_nvl_bytes, num_rdma_bytes)
}

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

/// The variable that sets the default bound on a buffer's waits (device and host), in
/// milliseconds. The rendezvous has its own (`NVSHMEM_TUTORIAL_TIMEOUT_MS`): a buffer's waits
/// must outlast a peer's checkpoint save, a start-up must not.
pub const BUFFER_TIMEOUT_VAR: &str = "NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS";

/// The timeout a buffer gets, checked: `timeout_ms` if given (the `Buffer` constructor's),
/// else `NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS` if set, else 100 s (`DEFAULT_TIMEOUT_MS`).
#[pyfunction]
#[pyo3(signature = (timeout_ms = None))]
pub fn buffer_timeout_ms(timeout_ms: Option<i64>) -> PyResult<u64> {
    let variable = std::env::var(BUFFER_TIMEOUT_VAR).ok();
    let (text, source) = match (timeout_ms, variable) {
        (Some(ms), _) => (ms.to_string(), "timeout_ms"),
        (None, Some(value)) => (value, BUFFER_TIMEOUT_VAR),
        (None, None) => return Ok(nvshmem_tutorial::DEFAULT_TIMEOUT_MS),
    };
    let invalid = |why: String| PyErr::from(Error::Invalid(format!("{source} = {text:?}: {why}")));
    let ms = text.trim().parse::<u64>().map_err(|_| {
        invalid(format!(
            "not a whole number of milliseconds (the default is {})",
            nvshmem_tutorial::DEFAULT_TIMEOUT_MS
        ))
    })?;
    nvshmem_tutorial::spec::check_timeout_ms(ms).map_err(|e| invalid(e.to_string()))?;
    Ok(ms)
}
