//! `nvshmem_tutorial._native`: the Rust side of the Python package.
//!
//! The chapters do the work: chapter 1's [`World`] initialises NVSHMEM, chapter 2's
//! `SymmetricBuffer` owns each allocation and checks ranges, PEs and heap membership. This
//! module adds only what Python needs on top:
//!
//! - one process-wide `Arc<World>` ([`state`]), because Python has no lifetimes to borrow with;
//! - allocations handed to torch zero-copy as DLPack capsules ([`dlpack`]) whose storage
//!   keeps the allocation alive exactly as long as any tensor over it lives;
//! - the deferred, collective free those objects need ([`state`] explains the rule);
//! - put/get/barrier/quiet enqueued on a stream the caller names (torch's current stream),
//!   validated before anything is enqueued.
//!
//! Pointers cross the boundary as integers (`tensor.data_ptr()`, `stream.cuda_stream`): torch
//! and cudarc both use the GPU's primary context, so the addresses mean the same to both.
//! Every entry point that touches the state or blocks in NVSHMEM releases the GIL.

mod dlpack;
mod errors;
mod state;

use ch01_bootstrap::{InitSpec, World};
use nvshmem_sys::{CudaStream, UNIQUE_ID_BYTES, UniqueId};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use errors::Error;

/// Turns torch's `stream.cuda_stream` integer back into the handle NVSHMEM takes.
fn stream_handle(stream: u64) -> CudaStream {
    stream as usize as CudaStream
}

// ---- library and bootstrap ----------------------------------------------------------------

/// Loads libnvshmem_host.so.3 (searching NVSHMEM_HOME first) and returns (path, (major,
/// minor, patch)). Raises LibraryError with every place searched when it is missing or is
/// not the pinned release. Needs no GPU.
#[pyfunction]
fn library_info(py: Python<'_>) -> PyResult<(String, (i32, i32, i32))> {
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
fn pinned_nvshmem_version() -> (i32, i32, i32) {
    let v = nvshmem_sys::PINNED_VERSION;
    (v.major, v.minor, v.patch)
}

/// Raises NoDeviceError unless libcuda.so.1 (the NVIDIA driver) can be opened.
#[pyfunction]
fn probe_driver(py: Python<'_>) -> PyResult<()> {
    py.detach(ch01_bootstrap::probe_driver)
        .map_err(|e| Error::from(e).into())
}

/// Rank 0's part of the bootstrap: a fresh 128-byte NVSHMEM unique id, as bytes.
#[pyfunction]
fn unique_id(py: Python<'_>) -> PyResult<Py<PyBytes>> {
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
fn init(
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
fn is_initialized(py: Python<'_>) -> bool {
    py.detach(state::is_initialized)
}

/// Collective: frees every symmetric allocation and finalises NVSHMEM. Returns how many
/// allocations Python still referenced (their tensors must not be used any more). A no-op
/// returning 0 when NVSHMEM is not initialised.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<usize> {
    py.detach(state::finalize).map_err(Into::into)
}

/// (my_pe, n_pes, node_pe, node_size, device ordinal).
#[pyfunction]
fn topology(py: Python<'_>) -> PyResult<(usize, usize, usize, usize, usize)> {
    py.detach(|| {
        state::with_state("topology", |s| {
            let w = &s.world;
            Ok((
                w.my_pe(),
                w.n_pes(),
                w.node_pe(),
                w.node_size(),
                w.context().ordinal(),
            ))
        })
    })
    .map_err(Into::into)
}

// ---- symmetric allocations ----------------------------------------------------------------

/// Collective: allocates `num_bytes` bytes (256-byte aligned) on every PE's symmetric heap.
/// Every rank must call it with the same size, in the same order. Returns (a DLPack capsule
/// of uint8 [max(num_bytes, 1)] on this PE's GPU, allocation id, device pointer). The
/// allocation is released when the last torch storage over it (this one, and any peer view)
/// dies, and freed at the next collective point (see state.rs).
#[pyfunction]
fn alloc(py: Python<'_>, num_bytes: usize) -> PyResult<(Py<PyAny>, u64, u64)> {
    let (id, ptr, device, token) = py.detach(|| {
        state::with_state("alloc", |s| {
            let (id, ptr, token) = s.alloc(num_bytes)?;
            Ok((id, ptr, s.world.context().ordinal() as i32, token))
        })
    })?;
    let capsule = dlpack::byte_tensor(py, ptr, num_bytes.max(1), device, token)?;
    Ok((capsule, id, ptr))
}

/// Ids released on this rank (no Python reference left) and not yet freed, in allocation
/// order. The Python layer gathers them from every rank and frees the intersection.
#[pyfunction]
fn released_ids(py: Python<'_>) -> PyResult<Vec<u64>> {
    py.detach(|| state::with_state("released_ids", |s| Ok(s.take_released())))
        .map_err(Into::into)
}

/// Collective: frees the allocations `ids`, which every rank must pass identically (the
/// intersection of every rank's `released_ids()`). Waits for the GPU first. Returns how many
/// were freed.
#[pyfunction]
fn free_released(py: Python<'_>, ids: Vec<u64>) -> PyResult<usize> {
    py.detach(|| state::with_state("free_released", |s| s.free_released(&ids)))
        .map_err(Into::into)
}

/// (live allocations, of them released but not yet freed, bytes held by live allocations).
#[pyfunction]
fn heap_usage(py: Python<'_>) -> PyResult<(usize, usize, usize)> {
    py.detach(|| {
        state::with_state("heap_usage", |s| {
            s.take_released();
            let live = s.allocations.len();
            let released = s.allocations.values().filter(|a| a.released).count();
            let bytes = s.allocations.values().map(|a| a.buffer.num_bytes()).sum();
            Ok((live, released, bytes))
        })
    })
    .map_err(Into::into)
}

/// Checks that bytes `ptr..ptr + num_bytes` lie inside one live symmetric allocation and
/// returns (allocation id, byte offset in it). Raises NotSymmetricError / OutOfBoundsError.
#[pyfunction]
fn locate(py: Python<'_>, ptr: u64, num_bytes: usize) -> PyResult<(u64, usize)> {
    py.detach(|| state::with_state("locate", |s| s.locate(ptr, num_bytes)))
        .map_err(Into::into)
}

/// Device address of `pe`'s copy of the symmetric bytes `ptr..ptr + num_bytes`, loadable
/// and storable from this GPU (NVLink/PCIe peer mapping), or None when `pe` is reachable only
/// through put/get. Raises for a non-symmetric range or a PE out of range.
#[pyfunction]
fn peer_ptr(py: Python<'_>, ptr: u64, num_bytes: usize, pe: i64) -> PyResult<Option<u64>> {
    py.detach(|| {
        state::with_state("peer_ptr", |s| {
            let pe = s.check_pe(pe)?;
            let (id, offset) = s.locate(ptr, num_bytes)?;
            let base = s.allocations[&id].buffer.peer_ptr(pe)?;
            Ok(base.map(|b| b + offset as u64))
        })
    })
    .map_err(Into::into)
}

/// A DLPack capsule (1-D uint8, `num_bytes` long) over device address `ptr` on this PE's
/// GPU, keeping alive the symmetric allocation that contains device address `anchor_ptr`
/// (for a peer view: the local tensor's address). `torch.from_dlpack` takes the device from
/// the capsule, so a peer's memory mapped into our address space stays on our device (see
/// dlpack.rs). Private: the Python layer passes only addresses it has checked.
#[pyfunction]
fn to_dlpack(py: Python<'_>, ptr: u64, num_bytes: usize, anchor_ptr: u64) -> PyResult<Py<PyAny>> {
    let (device, token) = py.detach(|| {
        state::with_state("to_dlpack", |s| {
            Ok((s.world.context().ordinal() as i32, s.token_for(anchor_ptr)?))
        })
    })?;
    dlpack::byte_tensor(py, ptr, num_bytes, device, token)
}

/// After `torch.from_dlpack(capsule)`: makes sure the capsule's destructor leaves the
/// DLPack deleter to torch (see dlpack.rs).
#[pyfunction]
fn mark_consumed(capsule: &Bound<'_, PyAny>) {
    dlpack::mark_consumed(capsule)
}

// ---- communication on a stream ------------------------------------------------------------

/// Which direction a one-sided copy goes: the symmetric side is remote on `pe`.
#[derive(Clone, Copy)]
enum Direction {
    Put,
    Get,
}

/// One put or get as Python asked for it.
struct OneSided {
    direction: Direction,
    /// The remote side: device pointer [num_bytes] u8, symmetric (dst of a put, src of a get).
    symmetric_ptr: u64,
    /// The local side: device pointer [num_bytes] u8 on this GPU.
    local_ptr: u64,
    num_bytes: usize,
    pe: i64,
    /// `cudaStream_t` as an integer (torch's `stream.cuda_stream`).
    stream: u64,
    /// Non-blocking: completion only at the next quiet/barrier.
    nbi: bool,
}

/// Validates and enqueues one put or get.
fn one_sided(py: Python<'_>, op: OneSided) -> PyResult<()> {
    let OneSided {
        direction,
        symmetric_ptr,
        local_ptr,
        num_bytes,
        pe,
        stream,
        nbi,
    } = op;
    py.detach(|| {
        state::with_state(
            match direction {
                Direction::Put => "put",
                Direction::Get => "get",
            },
            |s| {
                let pe = s.check_pe(pe)? as i32;
                if num_bytes == 0 {
                    return Ok(());
                }
                s.locate(symmetric_ptr, num_bytes)?;
                let nvshmem = s.world.nvshmem();
                s.world
                    .context()
                    .bind_to_thread()
                    .map_err(Error::cuda("binding the context"))?;
                let stream = stream_handle(stream);
                let (sym, local) = (symmetric_ptr as usize, local_ptr as usize);
                // SAFETY: NVSHMEM is initialised (we hold the state); `sym..sym+num_bytes` is
                // inside a live symmetric allocation (checked above); the local side is a
                // device pointer of `num_bytes` on this GPU (checked by the Python layer);
                // the call only enqueues work on `stream`.
                unsafe {
                    match (direction, nbi) {
                        (Direction::Put, false) => {
                            (nvshmem.putmem_on_stream)(sym as _, local as _, num_bytes, pe, stream)
                        }
                        (Direction::Put, true) => (nvshmem.putmem_nbi_on_stream)(
                            sym as _, local as _, num_bytes, pe, stream,
                        ),
                        (Direction::Get, false) => {
                            (nvshmem.getmem_on_stream)(local as _, sym as _, num_bytes, pe, stream)
                        }
                        (Direction::Get, true) => (nvshmem.getmem_nbi_on_stream)(
                            local as _, sym as _, num_bytes, pe, stream,
                        ),
                    }
                }
                Ok(())
            },
        )
    })
    .map_err(Into::into)
}

/// Enqueues on `stream`: copy `num_bytes` from local device pointer `src_ptr` into `pe`'s
/// copy of symmetric `dst_ptr`. `nbi`: return without waiting for local completion (the
/// source may not be reused until `quiet`).
#[pyfunction]
#[pyo3(signature = (dst_ptr, src_ptr, num_bytes, pe, stream, nbi=false))]
fn put(
    py: Python<'_>,
    dst_ptr: u64,
    src_ptr: u64,
    num_bytes: usize,
    pe: i64,
    stream: u64,
    nbi: bool,
) -> PyResult<()> {
    let op = OneSided {
        direction: Direction::Put,
        symmetric_ptr: dst_ptr,
        local_ptr: src_ptr,
        num_bytes,
        pe,
        stream,
        nbi,
    };
    one_sided(py, op)
}

/// Enqueues on `stream`: copy `num_bytes` of `pe`'s copy of symmetric `src_ptr` into local
/// device pointer `dst_ptr`. `nbi`: the data is there only after `quiet`.
#[pyfunction]
#[pyo3(signature = (dst_ptr, src_ptr, num_bytes, pe, stream, nbi=false))]
fn get(
    py: Python<'_>,
    dst_ptr: u64,
    src_ptr: u64,
    num_bytes: usize,
    pe: i64,
    stream: u64,
    nbi: bool,
) -> PyResult<()> {
    let op = OneSided {
        direction: Direction::Get,
        symmetric_ptr: src_ptr,
        local_ptr: dst_ptr,
        num_bytes,
        pe,
        stream,
        nbi,
    };
    one_sided(py, op)
}

/// Collective, enqueued on `stream`: completes this PE's puts and waits for every PE to
/// reach the same point of its stream (nvshmemx_barrier_all_on_stream).
#[pyfunction]
fn barrier(py: Python<'_>, stream: u64) -> PyResult<()> {
    py.detach(|| {
        state::with_state("barrier", |s| {
            s.world
                .context()
                .bind_to_thread()
                .map_err(Error::cuda("binding the context"))?;
            // SAFETY: initialised; the call only enqueues work on `stream`.
            unsafe { (s.world.nvshmem().barrier_all_on_stream)(stream_handle(stream)) };
            Ok(())
        })
    })
    .map_err(Into::into)
}

/// Enqueued on `stream`: later work on it runs after every put/get this PE issued on it
/// has completed (nvshmemx_quiet_on_stream). Not collective.
#[pyfunction]
fn quiet(py: Python<'_>, stream: u64) -> PyResult<()> {
    py.detach(|| {
        state::with_state("quiet", |s| {
            s.world
                .context()
                .bind_to_thread()
                .map_err(Error::cuda("binding the context"))?;
            // SAFETY: initialised; the call only enqueues work on `stream`.
            unsafe { (s.world.nvshmem().quiet_on_stream)(stream_handle(stream)) };
            Ok(())
        })
    })
    .map_err(Into::into)
}

// ---- the module ---------------------------------------------------------------------------

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("UNIQUE_ID_BYTES", UNIQUE_ID_BYTES)?;
    for (name, exception) in [
        ("NvshmemError", py.get_type::<errors::NvshmemError>()),
        (
            "NotInitializedError",
            py.get_type::<errors::NotInitializedError>(),
        ),
        ("NoDeviceError", py.get_type::<errors::NoDeviceError>()),
        ("LibraryError", py.get_type::<errors::LibraryError>()),
        (
            "InvalidArgumentError",
            py.get_type::<errors::InvalidArgumentError>(),
        ),
        (
            "NotSymmetricError",
            py.get_type::<errors::NotSymmetricError>(),
        ),
        (
            "OutOfBoundsError",
            py.get_type::<errors::OutOfBoundsError>(),
        ),
        (
            "PeOutOfRangeError",
            py.get_type::<errors::PeOutOfRangeError>(),
        ),
    ] {
        m.add(name, exception)?;
    }
    m.add_function(wrap_pyfunction!(library_info, m)?)?;
    m.add_function(wrap_pyfunction!(pinned_nvshmem_version, m)?)?;
    m.add_function(wrap_pyfunction!(probe_driver, m)?)?;
    m.add_function(wrap_pyfunction!(unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(finalize, m)?)?;
    m.add_function(wrap_pyfunction!(topology, m)?)?;
    m.add_function(wrap_pyfunction!(alloc, m)?)?;
    m.add_function(wrap_pyfunction!(released_ids, m)?)?;
    m.add_function(wrap_pyfunction!(free_released, m)?)?;
    m.add_function(wrap_pyfunction!(heap_usage, m)?)?;
    m.add_function(wrap_pyfunction!(locate, m)?)?;
    m.add_function(wrap_pyfunction!(peer_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(to_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(mark_consumed, m)?)?;
    m.add_function(wrap_pyfunction!(put, m)?)?;
    m.add_function(wrap_pyfunction!(get, m)?)?;
    m.add_function(wrap_pyfunction!(barrier, m)?)?;
    m.add_function(wrap_pyfunction!(quiet, m)?)?;
    Ok(())
}
