//! Symmetric allocations as torch tensors: chapter 2's `SymmetricBuffer`, handed to torch
//! zero-copy as DLPack capsules ([`crate::dlpack`]), freed collectively ([`crate::state`]
//! explains the rule), and the checks every other call builds on ([`locate`], [`peer_ptr`]).

use pyo3::prelude::*;

use crate::{dlpack, state};

/// Collective: allocates `num_bytes` bytes (256-byte aligned) on every PE's symmetric heap.
/// Every rank must call it with the same size, in the same order. Returns (a DLPack capsule
/// of uint8 [max(num_bytes, 1)] on this PE's GPU, allocation id, device pointer). The
/// allocation is released when the last torch storage over it (this one, and any peer view)
/// dies, and freed at the next collective point (see state.rs).
#[pyfunction]
pub fn alloc(py: Python<'_>, num_bytes: usize) -> PyResult<(Py<PyAny>, u64, u64)> {
    let (id, ptr, device, token) = state::with_state_detached(py, "alloc", |s| {
        let (id, ptr, token) = s.alloc(num_bytes)?;
        Ok((id, ptr, s.world.context().ordinal() as i32, token))
    })?;
    let capsule = dlpack::byte_tensor(py, ptr, num_bytes.max(1), device, token)?;
    Ok((capsule, id, ptr))
}

/// Ids released on this rank (no Python reference left) and not yet freed, in allocation
/// order. The Python layer gathers them from every rank and frees the intersection.
#[pyfunction]
pub fn released_ids(py: Python<'_>) -> PyResult<Vec<u64>> {
    state::with_state_detached(py, "released_ids", |s| Ok(s.take_released()))
}

/// Collective: frees the allocations `ids`, which every rank must pass identically (the
/// intersection of every rank's `released_ids()`). Waits for the GPU first. Returns how many
/// were freed.
#[pyfunction]
pub fn free_released(py: Python<'_>, ids: Vec<u64>) -> PyResult<usize> {
    state::with_state_detached(py, "free_released", |s| s.free_released(&ids))
}

/// (live allocations, of them released but not yet freed, bytes held by live allocations).
/// A `Buffer`'s memory counts as one allocation.
#[pyfunction]
pub fn heap_usage(py: Python<'_>) -> PyResult<(usize, usize, usize)> {
    state::with_state_detached(py, "heap_usage", |s| {
        let released = s.take_released().len();
        let live = s.allocations.len() + s.owned.len();
        let tensor_bytes: usize = s.allocations.values().map(|a| a.buffer.num_bytes()).sum();
        let owned_bytes: usize = s.owned.values().map(|o| o.num_bytes).sum();
        Ok((live, released, tensor_bytes + owned_bytes))
    })
}

/// Checks that bytes `ptr..ptr + num_bytes` lie inside one live symmetric allocation and
/// returns (allocation id, byte offset in it). Raises NotSymmetricError / OutOfBoundsError.
#[pyfunction]
pub fn locate(py: Python<'_>, ptr: u64, num_bytes: usize) -> PyResult<(u64, usize)> {
    state::with_state_detached(py, "locate", |s| s.locate(ptr, num_bytes))
}

/// Device address of `pe`'s copy of the symmetric bytes `ptr..ptr + num_bytes`, loadable
/// and storable from this GPU (NVLink/PCIe peer mapping), or None when `pe` is reachable only
/// through put/get. Raises for a non-symmetric range or a PE out of range.
#[pyfunction]
pub fn peer_ptr(py: Python<'_>, ptr: u64, num_bytes: usize, pe: i64) -> PyResult<Option<u64>> {
    state::with_state_detached(py, "peer_ptr", |s| {
        let pe = s.check_pe(pe)?;
        let (id, offset) = s.locate(ptr, num_bytes)?;
        let base = s.allocations[&id].buffer.peer_ptr(pe)?;
        Ok(base.map(|b| b + offset as u64))
    })
}

/// A DLPack capsule (1-D uint8, `num_bytes` long) over device address `ptr` on this PE's
/// GPU, keeping alive the symmetric allocation that contains device address `anchor_ptr`
/// (for a peer view: the local tensor's address). `torch.from_dlpack` takes the device from
/// the capsule, so a peer's memory mapped into our address space stays on our device (see
/// dlpack.rs). Private: the Python layer passes only addresses it has checked.
#[pyfunction]
pub fn to_dlpack(
    py: Python<'_>,
    ptr: u64,
    num_bytes: usize,
    anchor_ptr: u64,
) -> PyResult<Py<PyAny>> {
    let (device, token) = state::with_state_detached(py, "to_dlpack", |s| {
        Ok((s.world.context().ordinal() as i32, s.token_for(anchor_ptr)?))
    })?;
    dlpack::byte_tensor(py, ptr, num_bytes, device, token)
}

/// After `torch.from_dlpack(capsule)`: makes sure the capsule's destructor leaves the
/// DLPack deleter to torch (see dlpack.rs).
#[pyfunction]
pub fn mark_consumed(capsule: &Bound<'_, PyAny>) {
    dlpack::mark_consumed(capsule)
}
