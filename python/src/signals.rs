//! Signals: the pairwise handshake, enqueued on a stream.
//!
//! A global barrier answers "has every PE finished?" when a pair of PEs only needs "has my
//! partner's data landed?". The NVSHMEM idiom for the latter: the sender's put carries a signal
//! (NVSHMEM updates a u64 word on the receiver only after the data is visible there), and the
//! receiver's stream waits until that word reaches a value. No third PE is involved.

use std::ffi::c_int;

use nvshmem_sys::CudaStream;
use pyo3::prelude::*;

use crate::errors::Error;
use crate::state::{self, State};
use crate::transfers::stream_handle;

/// Signal update operations by the name Python passes, and NVSHMEM's code for each.
pub const SIGNAL_OPS: [(&str, c_int); 2] = [
    ("set", nvshmem_sys::SIGNAL_SET),
    ("add", nvshmem_sys::SIGNAL_ADD),
];

/// Comparisons `wait_signal` can wait for (`signal <cmp> value`), by name, and NVSHMEM's code.
pub const SIGNAL_CMPS: [(&str, c_int); 6] = [
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
pub fn signal_op_code(op: &str) -> PyResult<i32> {
    Ok(parse_name(&SIGNAL_OPS, "op", op)?)
}

/// NVSHMEM's code for comparison `cmp` ("eq", "ne", "gt", "ge", "lt", "le"). Raises
/// InvalidArgumentError for anything else. Needs no NVSHMEM.
#[pyfunction]
pub fn signal_cmp_code(cmp: &str) -> PyResult<i32> {
    Ok(parse_name(&SIGNAL_CMPS, "cmp", cmp)?)
}

impl State {
    /// `Err` unless `ptr` is one whole, 8-byte aligned u64 inside a live symmetric allocation:
    /// the only kind of word NVSHMEM's signal operations may touch (its atomics need alignment,
    /// and the remote PE finds the word at the same heap offset).
    fn check_signal(&self, ptr: u64) -> Result<*mut u64, Error> {
        self.locate(ptr, SIGNAL_BYTES)?;
        if !ptr.is_multiple_of(SIGNAL_BYTES as u64) {
            return Err(Error::Invalid(format!(
                "signal word at device address {ptr:#x} is not 8-byte aligned; NVSHMEM's signal \
                 atomics need aligned u64 words. Use an element of a tensor from \
                 nvshmem_tutorial.empty((n,), torch.uint64)"
            )));
        }
        Ok(ptr as usize as *mut u64)
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
pub fn put_signal(
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
    state::with_state_detached(py, "put_signal", |s| enqueue_put_signal(s, call))
}

fn enqueue_put_signal(s: &mut State, call: PutSignal) -> Result<(), Error> {
    let pe = s.check_pe(call.pe)? as i32;
    let signal = s.check_signal(call.signal_ptr)?;
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
    let (dst, src) = (call.dst_ptr as usize, call.src_ptr as usize);
    // Both calls share one C signature; the nbi one does not wait for the source to be read.
    let putmem_signal = if call.nbi {
        nvshmem.putmem_signal_nbi_on_stream
    } else {
        nvshmem.putmem_signal_on_stream
    };
    // SAFETY: NVSHMEM is initialised (we hold the state); the destination range and the
    // signal word lie inside live symmetric allocations and the word is aligned (checked
    // above); the source is `num_bytes` of device memory on this GPU (checked by the Python
    // layer); every call only enqueues work on `stream`.
    unsafe {
        if call.num_bytes == 0 {
            // Nothing to copy, but the receiver still counts on the signal.
            (nvshmem.signal_op_on_stream)(signal, call.value, call.op, pe, stream);
        } else {
            putmem_signal(
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

/// The common path of `signal_op` and `wait_signal`, after their `op`/`cmp` name has been
/// parsed into `code` (an argument error needs no NVSHMEM, so it comes first): with the GIL
/// released, check the signal word, bind the context, then `enqueue(state, code, word,
/// stream)` makes the one NVSHMEM call.
fn enqueue_on_signal_word(
    py: Python<'_>,
    what: &'static str,
    code: c_int,
    signal_ptr: u64,
    stream: u64,
    enqueue: impl FnOnce(&State, c_int, *mut u64, CudaStream) -> Result<(), Error> + Send,
) -> PyResult<()> {
    state::with_state_detached(py, what, |s| {
        let signal = s.check_signal(signal_ptr)?;
        s.bind()?;
        enqueue(s, code, signal, stream_handle(stream))
    })
}

/// Enqueues on `stream`: update `pe`'s copy of the symmetric u64 at `signal_ptr` with `op`
/// ("set" or "add") and `value`, after the work already on the stream. Carries no data: to
/// publish data with it, complete the puts first (`quiet`), or use `put_signal`.
#[pyfunction]
pub fn signal_op(
    py: Python<'_>,
    signal_ptr: u64,
    value: u64,
    op: &str,
    pe: i64,
    stream: u64,
) -> PyResult<()> {
    let code = parse_name(&SIGNAL_OPS, "op", op)?;
    enqueue_on_signal_word(
        py,
        "signal_op",
        code,
        signal_ptr,
        stream,
        |s, op, word, stream| {
            let pe = s.check_pe(pe)? as i32;
            // SAFETY: initialised; the word is an aligned u64 of a live symmetric allocation
            // (checked by enqueue_on_signal_word); the call only enqueues work on `stream`.
            unsafe { (s.world.nvshmem().signal_op_on_stream)(word, value, op, pe, stream) };
            Ok(())
        },
    )
}

/// Enqueues on `stream`: later work on it waits until this PE's symmetric u64 at
/// `signal_ptr` satisfies `signal <cmp> value` (nvshmemx_signal_wait_until_on_stream).
///
/// The wait has no timeout inside NVSHMEM: if no PE ever makes the comparison true, the
/// stream stalls for good (and so does anything that synchronises with it). Everything is
/// validated here, before the wait is enqueued, so a bad argument can never become a hang.
#[pyfunction]
pub fn wait_signal(
    py: Python<'_>,
    signal_ptr: u64,
    cmp: &str,
    value: u64,
    stream: u64,
) -> PyResult<()> {
    let wait = |s: &State, cmp, word, stream| {
        // SAFETY: initialised; the word is an aligned u64 of a live symmetric allocation
        // (checked by enqueue_on_signal_word); the call only enqueues work on `stream`.
        unsafe { (s.world.nvshmem().signal_wait_until_on_stream)(word, cmp, value, stream) };
        Ok(())
    };
    let code = parse_name(&SIGNAL_CMPS, "cmp", cmp)?;
    enqueue_on_signal_word(py, "wait_signal", code, signal_ptr, stream, wait)
}
