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
//! - put/get/barrier/quiet, and the pairwise signal handshake (put_signal, signal_op,
//!   wait_signal), enqueued on a stream the caller names (torch's current stream), validated
//!   before anything is enqueued.
//!
//! Pointers cross the boundary as integers (`tensor.data_ptr()`, `stream.cuda_stream`): torch
//! and cudarc both use the GPU's primary context, so the addresses mean the same to both.
//! Every entry point that touches the state or blocks in NVSHMEM releases the GIL.

mod dlpack;
mod errors;
mod state;

use std::ffi::c_int;

use ch01_bootstrap::{InitSpec, World};
use nvshmem_sys::{CudaStream, UNIQUE_ID_BYTES, UniqueId};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

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

// ---- signals: the pairwise handshake -------------------------------------------------------
//
// A global barrier answers "has every PE finished?" when a pair of PEs only needs "has my
// partner's data landed?". The NVSHMEM idiom for the latter: the sender's put carries a signal
// (NVSHMEM updates a u64 word on the receiver only after the data is visible there), and the
// receiver's stream waits until that word reaches a value. No third PE is involved.

/// Signal update operations by the name Python passes, and NVSHMEM's code for each.
const SIGNAL_OPS: [(&str, c_int); 2] = [
    ("set", nvshmem_sys::SIGNAL_SET),
    ("add", nvshmem_sys::SIGNAL_ADD),
];

/// Comparisons `wait_signal` can wait for (`signal <cmp> value`), by name, and NVSHMEM's code.
const SIGNAL_CMPS: [(&str, c_int); 6] = [
    ("eq", nvshmem_sys::CMP_EQ),
    ("ne", nvshmem_sys::CMP_NE),
    ("gt", nvshmem_sys::CMP_GT),
    ("ge", nvshmem_sys::CMP_GE),
    ("lt", nvshmem_sys::CMP_LT),
    ("le", nvshmem_sys::CMP_LE),
];

/// Bytes of one signal word (`uint64_t`).
const SIGNAL_BYTES: usize = 8;

/// Looks `name` up in `table`, or says which names exist. Needs no NVSHMEM: argument errors
/// come before "not initialised", so they can be tested on any machine.
fn parse_name(table: &[(&str, c_int)], what: &str, name: &str) -> Result<c_int, Error> {
    table
        .iter()
        .find(|(known, _)| *known == name)
        .map(|&(_, code)| code)
        .ok_or_else(|| {
            let known: Vec<String> = table.iter().map(|(n, _)| format!("{n:?}")).collect();
            Error::Invalid(format!(
                "{what}={name:?} is not one of {}",
                known.join(", ")
            ))
        })
}

/// NVSHMEM's code for signal operation `op` ("set" or "add"). Raises InvalidArgumentError for
/// anything else. Needs no NVSHMEM.
#[pyfunction]
fn signal_op_code(op: &str) -> PyResult<i32> {
    Ok(parse_name(&SIGNAL_OPS, "op", op)?)
}

/// NVSHMEM's code for comparison `cmp` ("eq", "ne", "gt", "ge", "lt", "le"). Raises
/// InvalidArgumentError for anything else. Needs no NVSHMEM.
#[pyfunction]
fn signal_cmp_code(cmp: &str) -> PyResult<i32> {
    Ok(parse_name(&SIGNAL_CMPS, "cmp", cmp)?)
}

impl state::State {
    /// `Err` unless `ptr` is one whole, 8-byte aligned u64 inside a live symmetric allocation:
    /// the only kind of word NVSHMEM's signal operations may touch (its atomics need alignment,
    /// and the remote PE finds the word at the same heap offset).
    fn check_signal(&self, ptr: u64) -> Result<(), Error> {
        self.locate(ptr, SIGNAL_BYTES)?;
        if !ptr.is_multiple_of(SIGNAL_BYTES as u64) {
            return Err(Error::Invalid(format!(
                "signal word at device address {ptr:#x} is not 8-byte aligned; NVSHMEM's signal \
                 atomics need aligned u64 words. Use an element of a tensor from \
                 nvshmem_tutorial.empty((n,), torch.uint64)"
            )));
        }
        Ok(())
    }

    /// Binds the world's context to this thread: NVSHMEM's on-stream calls use the current
    /// context, and the GIL-free thread we run on may never have had one.
    fn bind(&self) -> Result<(), Error> {
        self.world
            .context()
            .bind_to_thread()
            .map_err(Error::cuda("binding the context"))
    }
}

/// One put-with-signal as Python asked for it.
struct PutSignal {
    /// Device pointer [num_bytes] u8, symmetric: written on `pe`.
    dst_ptr: u64,
    /// Device pointer [num_bytes] u8 on this GPU.
    src_ptr: u64,
    num_bytes: usize,
    /// Device pointer to one u64, symmetric: updated on `pe` after the data landed there.
    signal_ptr: u64,
    value: u64,
    op: c_int,
    pe: i64,
    stream: u64,
    nbi: bool,
}

/// Enqueues on `stream`: copy `num_bytes` from local `src_ptr` into `pe`'s copy of symmetric
/// `dst_ptr`, then update `pe`'s copy of the symmetric u64 at `signal_ptr` with `op` ("set"
/// or "add") and `value`. NVSHMEM orders the signal after the data: a PE that sees the signal
/// change sees the bytes. `nbi`: the stream does not wait for the source to be read (reuse it
/// only after `quiet`). With `num_bytes == 0` only the signal is sent.
#[pyfunction]
#[pyo3(signature = (dst_ptr, src_ptr, num_bytes, signal_ptr, value, op, pe, stream, nbi=false))]
#[allow(clippy::too_many_arguments)] // mirrors nvshmemx_putmem_signal_on_stream one to one
fn put_signal(
    py: Python<'_>,
    dst_ptr: u64,
    src_ptr: u64,
    num_bytes: usize,
    signal_ptr: u64,
    value: u64,
    op: &str,
    pe: i64,
    stream: u64,
    nbi: bool,
) -> PyResult<()> {
    let op = parse_name(&SIGNAL_OPS, "op", op)?;
    let call = PutSignal {
        dst_ptr,
        src_ptr,
        num_bytes,
        signal_ptr,
        value,
        op,
        pe,
        stream,
        nbi,
    };
    py.detach(|| state::with_state("put_signal", |s| enqueue_put_signal(s, call)))
        .map_err(Into::into)
}

fn enqueue_put_signal(s: &mut state::State, call: PutSignal) -> Result<(), Error> {
    let pe = s.check_pe(call.pe)? as i32;
    s.check_signal(call.signal_ptr)?;
    if call.num_bytes > 0 {
        s.locate(call.dst_ptr, call.num_bytes)?;
        let dst_end = call.dst_ptr + call.num_bytes as u64;
        if call.signal_ptr < dst_end && call.dst_ptr < call.signal_ptr + SIGNAL_BYTES as u64 {
            // The data would land on the word that says it has landed: the receiver could see
            // a "signal" written by the copy, or the copy could overwrite the signal.
            return Err(Error::Invalid(format!(
                "signal word {:#x} lies inside dst ({:#x}..{dst_end:#x}); keep signal words in \
                 a tensor of their own (nvshmem_tutorial.empty((n,), torch.uint64))",
                call.signal_ptr, call.dst_ptr
            )));
        }
    }
    s.bind()?;
    let nvshmem = s.world.nvshmem();
    let stream = stream_handle(call.stream);
    let signal = call.signal_ptr as usize as *mut u64;
    let (dst, src) = (call.dst_ptr as usize, call.src_ptr as usize);
    // SAFETY: NVSHMEM is initialised (we hold the state); the destination range and the
    // signal word lie inside live symmetric allocations and the word is aligned (checked
    // above); the source is `num_bytes` of device memory on this GPU (checked by the Python
    // layer); every call only enqueues work on `stream`.
    unsafe {
        if call.num_bytes == 0 {
            // Nothing to copy, but the receiver still counts on the signal.
            (nvshmem.signal_op_on_stream)(signal, call.value, call.op, pe, stream);
        } else if call.nbi {
            (nvshmem.putmem_signal_nbi_on_stream)(
                dst as _,
                src as _,
                call.num_bytes,
                signal,
                call.value,
                call.op,
                pe,
                stream,
            );
        } else {
            (nvshmem.putmem_signal_on_stream)(
                dst as _,
                src as _,
                call.num_bytes,
                signal,
                call.value,
                call.op,
                pe,
                stream,
            );
        }
    }
    Ok(())
}

/// Enqueues on `stream`: update `pe`'s copy of the symmetric u64 at `signal_ptr` with `op`
/// ("set" or "add") and `value`, after the work already on the stream. Carries no data: to
/// publish data with it, complete the puts first (`quiet`), or use `put_signal`.
#[pyfunction]
fn signal_op(
    py: Python<'_>,
    signal_ptr: u64,
    value: u64,
    op: &str,
    pe: i64,
    stream: u64,
) -> PyResult<()> {
    let op = parse_name(&SIGNAL_OPS, "op", op)?;
    py.detach(|| {
        state::with_state("signal_op", |s| {
            let pe = s.check_pe(pe)? as i32;
            s.check_signal(signal_ptr)?;
            s.bind()?;
            // SAFETY: initialised; the word is an aligned u64 of a live symmetric allocation
            // (checked above); the call only enqueues work on `stream`.
            unsafe {
                (s.world.nvshmem().signal_op_on_stream)(
                    signal_ptr as usize as *mut u64,
                    value,
                    op,
                    pe,
                    stream_handle(stream),
                )
            };
            Ok(())
        })
    })
    .map_err(Into::into)
}

/// Enqueues on `stream`: later work on it waits until this PE's symmetric u64 at
/// `signal_ptr` satisfies `signal <cmp> value` (nvshmemx_signal_wait_until_on_stream).
///
/// The wait has no timeout inside NVSHMEM: if no PE ever makes the comparison true, the
/// stream stalls for good (and so does anything that synchronises with it). Everything is
/// validated here, before the wait is enqueued, so a bad argument can never become a hang.
#[pyfunction]
fn wait_signal(
    py: Python<'_>,
    signal_ptr: u64,
    cmp: &str,
    value: u64,
    stream: u64,
) -> PyResult<()> {
    let cmp = parse_name(&SIGNAL_CMPS, "cmp", cmp)?;
    py.detach(|| {
        state::with_state("wait_signal", |s| {
            s.check_signal(signal_ptr)?;
            s.bind()?;
            // SAFETY: initialised; the word is an aligned u64 of a live symmetric allocation
            // (checked above); the call only enqueues work on `stream`.
            unsafe {
                (s.world.nvshmem().signal_wait_until_on_stream)(
                    signal_ptr as usize as *mut u64,
                    cmp,
                    value,
                    stream_handle(stream),
                )
            };
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
    // The names put_signal/signal_op take as `op` and wait_signal as `cmp`, in table order.
    m.add(
        "SIGNAL_OPS",
        PyTuple::new(py, SIGNAL_OPS.map(|(name, _)| name))?,
    )?;
    m.add(
        "SIGNAL_CMPS",
        PyTuple::new(py, SIGNAL_CMPS.map(|(name, _)| name))?,
    )?;
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
    m.add_function(wrap_pyfunction!(signal_op_code, m)?)?;
    m.add_function(wrap_pyfunction!(signal_cmp_code, m)?)?;
    m.add_function(wrap_pyfunction!(put_signal, m)?)?;
    m.add_function(wrap_pyfunction!(signal_op, m)?)?;
    m.add_function(wrap_pyfunction!(wait_signal, m)?)?;
    Ok(())
}
