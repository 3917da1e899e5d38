//! Stream ordering done natively: DeepEP's `stream_wait(a, b)`, an event recorded on `b` and
//! waited on by `a`. torch's Python `Stream.wait_stream` costs a Stream object, an Event object
//! and two calls through the interpreter per wait; a low-latency dispatch + combine pair orders
//! streams four times around kernels of ~40 us, so in an eager decode step those microseconds
//! are the step's time (chapter 8 measures the host time of an eager pair).

use cudarc::driver::{result, sys};

use crate::errors::Error;
use crate::transfers::stream_handle;

/// One event, re-recorded for every wait: a wait takes the event's latest record at the time
/// it is issued, so reuse is safe in stream order (and inside a CUDA-graph capture it is the
/// usual fork/join).
pub(crate) struct StreamOrder {
    event: sys::CUevent,
}

// SAFETY: the event is a driver handle; cuEventRecord and cuStreamWaitEvent are thread-safe,
// and every use happens under the owning buffer's lock.
unsafe impl Send for StreamOrder {}
unsafe impl Sync for StreamOrder {}

impl StreamOrder {
    /// Needs the buffer's CUDA context current (the caller binds it).
    pub(crate) fn new() -> Result<Self, Error> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| Error::Failed(format!("creating the stream-ordering event: {e}")))?;
        Ok(Self { event })
    }

    /// Work queued on `waiter` from now on runs after everything queued so far on `waited`.
    ///
    /// # Safety
    /// Both must be live streams of the event's context.
    pub(crate) unsafe fn wait(&self, waiter: u64, waited: u64) -> Result<(), Error> {
        let failed = |e| Error::Failed(format!("ordering two CUDA streams: {e}"));
        // SAFETY: the caller vouches for the streams; the event is ours and alive.
        unsafe {
            result::event::record(self.event, stream_handle(waited) as _).map_err(failed)?;
            result::stream::wait_event(
                stream_handle(waiter) as _,
                self.event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(failed)
        }
    }

    // ANCHOR: around
    /// Runs `launch` on `comm` after `compute`'s queued work and, with `join`, makes `compute`
    /// wait for it (DeepEP's calls without `async_finish`); with `comm` 0 runs it on `compute`.
    ///
    /// # Safety
    /// As `wait`.
    pub(crate) unsafe fn around<R>(
        &self,
        compute: u64,
        comm: u64,
        join: bool,
        launch: impl FnOnce(u64) -> Result<R, Error>,
    ) -> Result<R, Error> {
        if comm == 0 || comm == compute {
            return launch(compute);
        }
        // SAFETY: forwarded.
        unsafe { self.wait(comm, compute) }?;
        let out = launch(comm)?;
        if join {
            // SAFETY: forwarded.
            unsafe { self.wait(compute, comm) }?;
        }
        Ok(out)
    }
    // ANCHOR_END: around
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        // SAFETY: created in `new`; a failure here (context already gone) leaks nothing usable.
        let _ = unsafe { result::event::destroy(self.event) };
    }
}
