//! Stream ordering with driver events: DeepEP's `stream_wait(a, b)` (an event recorded on `b`
//! and waited on by `a`), and the order around one call of a buffer (events.rs has the rest
//! of DeepEP's stream rules and the events a call hands back). torch's Python `wait_stream`
//! costs a Stream object, an Event object and two calls through the interpreter per wait; a
//! low-latency dispatch + combine pair orders streams four times around kernels of ~40 us, so
//! in an eager decode step those microseconds would be the step's time.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, result, sys};

use crate::errors::Error;
use crate::transfers::stream_handle;

fn failed(what: &'static str) -> impl FnOnce(result::DriverError) -> Error {
    move |e| Error::Failed(format!("{what}: {e}"))
}

/// A new event without timing (the cheap kind) in `context`.
pub(crate) fn new_event(context: &Arc<CudaContext>) -> Result<CudaEvent, Error> {
    context
        .new_event(None)
        .map_err(failed("creating a CUDA event"))
}

/// Records `event` on `stream`: it completes when the work queued on `stream` so far has.
///
/// # Safety
/// `event` must be a live event and `stream` a live stream of the same context.
pub(crate) unsafe fn record(event: sys::CUevent, stream: u64) -> Result<(), Error> {
    // SAFETY: forwarded to the caller.
    unsafe { result::event::record(event, stream_handle(stream) as _) }
        .map_err(failed("recording a CUDA event"))
}

/// Work queued on `stream` from now on runs after `event`'s latest record.
///
/// # Safety
/// As `record`.
pub(crate) unsafe fn wait_event(stream: u64, event: sys::CUevent) -> Result<(), Error> {
    // SAFETY: forwarded to the caller.
    unsafe {
        result::stream::wait_event(
            stream_handle(stream) as _,
            event,
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(failed("ordering two CUDA streams"))
}

/// One event, re-recorded for every wait: a wait takes the event's latest record at the time
/// it is issued, so reuse is safe in stream order (and inside a CUDA-graph capture it is the
/// usual fork/join).
pub(crate) struct StreamOrder {
    event: CudaEvent,
}

impl StreamOrder {
    pub(crate) fn new(context: &Arc<CudaContext>) -> Result<Self, Error> {
        Ok(Self {
            event: new_event(context)?,
        })
    }

    /// Work queued on `waiter` from now on runs after everything queued so far on `waited`.
    ///
    /// # Safety
    /// Both must be live streams of the event's context.
    pub(crate) unsafe fn wait(&self, waiter: u64, waited: u64) -> Result<(), Error> {
        // SAFETY: forwarded; the event is ours and alive.
        unsafe {
            record(self.event.cu_event(), waited)?;
            wait_event(waiter, self.event.cu_event())
        }
    }

    // ANCHOR: around
    /// Before a call's kernels go on `comm`: it waits for `previous` (DeepEP's
    /// `previous_event`) if given, else for everything queued on `compute` (torch's current
    /// stream). With `comm == compute` (a low-latency call with `return_recv_hook`, which
    /// runs on the current stream) there is nothing to order.
    ///
    /// # Safety
    /// As `wait`; `previous` must be a live event of the same context.
    pub(crate) unsafe fn enter(
        &self,
        compute: u64,
        comm: u64,
        previous: Option<sys::CUevent>,
    ) -> Result<(), Error> {
        // SAFETY (both): forwarded to the caller.
        match previous {
            Some(event) => unsafe { wait_event(comm, event) },
            None if comm == compute => Ok(()),
            None => unsafe { self.wait(comm, compute) },
        }
    }

    /// After the kernels of a call without `async_finish`: `compute` waits for them, so its
    /// results are usable on the current stream at once (with `async_finish`, the event the
    /// call returns is waited on instead: events.rs).
    ///
    /// # Safety
    /// As `wait`.
    pub(crate) unsafe fn join(&self, compute: u64, comm: u64) -> Result<(), Error> {
        if comm == compute {
            return Ok(());
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.wait(compute, comm) }
    }
    // ANCHOR_END: around
}
