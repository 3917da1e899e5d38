//! The library and the bootstrap: chapter 1's `World`, started from Python.
//!
//! The Python layer (`nvshmem_tutorial/_bootstrap.py`) runs the exchange: every rank checks
//! locally that it can start ([`probe_driver`], [`library_info`]), rank 0 creates the
//! [`unique_id`], the verdicts and the id travel over torch.distributed, and only then does
//! every rank enter NVSHMEM's blocking [`init`].

use ch01_bootstrap::{InitSpec, World};
use nvshmem_sys::{UNIQUE_ID_BYTES, UniqueId};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::Error;
use crate::state;

/// Loads libnvshmem_host.so.3 (searching NVSHMEM_HOME first) and returns (path, (major,
/// minor, patch)). Raises LibraryError with every place searched when it is missing or is
/// not the pinned release. Needs no GPU.
#[pyfunction]
pub fn library_info(py: Python<'_>) -> PyResult<(String, (i32, i32, i32))> {
    let nvshmem = py
        .detach(ch01_bootstrap::load_library)
        .map_err(Error::from)?;
    let v = nvshmem.version();
    Ok((
        nvshmem.path().display().to_string(),
        (v.major, v.minor, v.patch),
    ))
}

/// The NVSHMEM release the embedded kernels were linked against: (major, minor, patch).
#[pyfunction]
pub fn pinned_nvshmem_version() -> (i32, i32, i32) {
    let v = nvshmem_sys::PINNED_VERSION;
    (v.major, v.minor, v.patch)
}

/// Raises NoDeviceError unless libcuda.so.1 (the NVIDIA driver) can be opened.
#[pyfunction]
pub fn probe_driver(py: Python<'_>) -> PyResult<()> {
    py.detach(ch01_bootstrap::probe_driver)
        .map_err(|e| Error::from(e).into())
}

/// Rank 0's part of the bootstrap: a fresh 128-byte NVSHMEM unique id, as bytes.
#[pyfunction]
pub fn unique_id(py: Python<'_>) -> PyResult<Py<PyBytes>> {
    let bytes = py
        .detach(|| -> Result<[u8; UNIQUE_ID_BYTES], Error> {
            let nvshmem = ch01_bootstrap::load_library()?;
            Ok(ch01_bootstrap::create_unique_id(nvshmem)?.to_bytes())
        })
        .map_err(PyErr::from)?;
    Ok(PyBytes::new(py, &bytes).unbind())
}

/// Collective: initialises NVSHMEM as PE `rank` of `world_size` on GPU `device` (an ordinal
/// of this host), with the `unique_id` bytes rank 0 created. Blocks until every rank has
/// called it. Raises if NVSHMEM is already initialised here.
#[pyfunction]
pub fn init(
    py: Python<'_>,
    rank: usize,
    world_size: usize,
    device: usize,
    unique_id: &[u8],
) -> PyResult<()> {
    let bytes: &[u8; UNIQUE_ID_BYTES] = unique_id.try_into().map_err(|_| {
        Error::Invalid(format!(
            "unique_id has {} bytes; NVSHMEM's is exactly {UNIQUE_ID_BYTES} (pass the bytes \
             rank 0 got from unique_id(), unchanged)",
            unique_id.len()
        ))
    })?;
    let spec = InitSpec {
        rank,
        world_size,
        local_rank: device,
        unique_id: UniqueId::from_bytes(bytes),
    };
    py.detach(|| state::install(|| Ok(World::init(&spec)?)))
        .map_err(Into::into)
}

#[pyfunction]
pub fn is_initialized(py: Python<'_>) -> bool {
    py.detach(state::is_initialized)
}

/// Collective: frees every symmetric allocation and finalises NVSHMEM. Returns how many
/// allocations Python still referenced (their tensors must not be used any more). A no-op
/// returning 0 when NVSHMEM is not initialised.
#[pyfunction]
pub fn finalize(py: Python<'_>) -> PyResult<usize> {
    py.detach(state::finalize).map_err(Into::into)
}

/// (my_pe, n_pes, node_pe, node_size, device ordinal).
#[pyfunction]
pub fn topology(py: Python<'_>) -> PyResult<(usize, usize, usize, usize, usize)> {
    state::with_state_detached(py, "topology", |s| {
        let w = &s.world;
        Ok((
            w.my_pe(),
            w.n_pes(),
            w.node_pe(),
            w.node_size(),
            w.context().ordinal(),
        ))
    })
}
