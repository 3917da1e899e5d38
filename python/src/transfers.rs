//! One-sided transfers and their completion, enqueued on a stream the caller names (torch's
//! current stream): put/get (blocking or `nbi`), barrier, quiet. Every argument is validated
//! before anything is enqueued, so a mistake is an exception and the stream stays untouched.

use nvshmem_sys::{CudaStream, Nvshmem};
use pyo3::prelude::*;

use crate::state;

/// Turns torch's `stream.cuda_stream` integer back into the handle NVSHMEM takes.
pub fn stream_handle(stream: u64) -> CudaStream {
    stream as usize as CudaStream
}

/// Which direction a one-sided copy goes: the symmetric side is remote on `pe`.
#[derive(Clone, Copy)]
enum Direction {
    Put,
    Get,
}

/// `put` and `get` take the same arguments in NVSHMEM's order, destination first:
///
/// - `dst_ptr`: device pointer [num_bytes] u8: symmetric, written on `pe` (put); on this GPU
///   (get);
/// - `src_ptr`: device pointer [num_bytes] u8: on this GPU (put); symmetric, read on `pe` (get);
/// - `stream`: `cudaStream_t` as an integer (torch's `stream.cuda_stream`);
/// - `nbi`: non-blocking, complete only at the next quiet/barrier.
///
/// One template defines both, so that their signatures and checks cannot drift apart: the pe,
/// then the symmetric side's range, before anything is enqueued.
macro_rules! one_sided_pyfunction {
    ($(#[doc = $doc:literal])* $name:ident, $direction:ident) => {
        $(#[doc = $doc])*
        #[pyfunction]
        #[pyo3(signature = (dst_ptr, src_ptr, num_bytes, pe, stream, nbi=false))]
        pub fn $name(
            py: Python<'_>,
            dst_ptr: u64,
            src_ptr: u64,
            num_bytes: usize,
            pe: i64,
            stream: u64,
            nbi: bool,
        ) -> PyResult<()> {
            let direction = Direction::$direction;
            state::with_state_detached(py, stringify!($name), |s| {
                let pe = s.check_pe(pe)? as i32;
                if num_bytes == 0 {
                    return Ok(());
                }
                let symmetric_ptr = match direction {
                    Direction::Put => dst_ptr,
                    Direction::Get => src_ptr,
                };
                s.locate(symmetric_ptr, num_bytes)?;
                s.bind()?;
                let nvshmem = s.world.nvshmem();
                // The four calls share one C signature (dest, source, bytes, pe, stream).
                let copy = match (direction, nbi) {
                    (Direction::Put, false) => nvshmem.putmem_on_stream,
                    (Direction::Put, true) => nvshmem.putmem_nbi_on_stream,
                    (Direction::Get, false) => nvshmem.getmem_on_stream,
                    (Direction::Get, true) => nvshmem.getmem_nbi_on_stream,
                };
                let (dst, src) = (dst_ptr as usize, src_ptr as usize);
                // SAFETY: NVSHMEM is initialised (we hold the state); the symmetric side is
                // inside a live symmetric allocation (checked above); the local side is a
                // device pointer of `num_bytes` on this GPU (checked by the Python layer); the
                // call only enqueues work on the stream.
                unsafe { copy(dst as _, src as _, num_bytes, pe, stream_handle(stream)) };
                Ok(())
            })
        }
    };
}

one_sided_pyfunction!(
    /// Enqueues on `stream`: copy `num_bytes` from local device pointer `src_ptr` into `pe`'s
    /// copy of symmetric `dst_ptr`. `nbi`: return without waiting for local completion (the
    /// source may not be reused until `quiet`).
    put,
    Put
);

one_sided_pyfunction!(
    /// Enqueues on `stream`: copy `num_bytes` of `pe`'s copy of symmetric `src_ptr` into local
    /// device pointer `dst_ptr`. `nbi`: the data is there only after `quiet`.
    get,
    Get
);

/// Barrier and quiet: one NVSHMEM call that takes nothing but the stream.
fn enqueue_stream_call(
    py: Python<'_>,
    what: &'static str,
    stream: u64,
    call: impl FnOnce(&Nvshmem) -> unsafe extern "C" fn(CudaStream) + Send,
) -> PyResult<()> {
    state::with_state_detached(py, what, |s| {
        s.bind()?;
        let function = call(s.world.nvshmem());
        // SAFETY: initialised (we hold the state); the call only enqueues work on `stream`.
        unsafe { function(stream_handle(stream)) };
        Ok(())
    })
}

/// Collective, enqueued on `stream`: completes this PE's puts and waits for every PE to
/// reach the same point of its stream (nvshmemx_barrier_all_on_stream).
#[pyfunction]
pub fn barrier(py: Python<'_>, stream: u64) -> PyResult<()> {
    enqueue_stream_call(py, "barrier", stream, |nvshmem| {
        nvshmem.barrier_all_on_stream
    })
}

/// Enqueued on `stream`: later work on it runs after every put/get this PE issued on it
/// has completed (nvshmemx_quiet_on_stream). Not collective.
#[pyfunction]
pub fn quiet(py: Python<'_>, stream: u64) -> PyResult<()> {
    enqueue_stream_call(py, "quiet", stream, |nvshmem| nvshmem.quiet_on_stream)
}
