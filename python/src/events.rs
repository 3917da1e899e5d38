//! DeepEP's stream rules for one call, and the events calls hand back (`async_finish`) and
//! take (`previous_event`): driver events (DeepEP's `EventHandle`), never torch's Python
//! Stream or Event objects, so a call costs no Python object for its ordering.
//!
//! - The buffer's kernels run on its communication stream, which first waits for
//!   `previous_event` if given, else for torch's current stream (the compute stream).
//! - Without `async_finish`, the compute stream then waits for them (results usable at
//!   once); with it, the call returns an [`Event`] on the communication stream, and every
//!   tensor of the call is marked as used by that stream (torch's `record_stream`) and kept
//!   alive by the event.
//! - `allocate_on_comm_stream` (which needs both) allocates the outputs with the
//!   communication stream as torch's current stream.
//! - A low-latency call with `return_recv_hook` runs on the compute stream itself.

use std::sync::Weak;

use cudarc::driver::{CudaEvent, sys};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::Error;
use crate::shared::{Call, Shared};
use crate::state;
use crate::streams::{new_event, record, wait_event};
use crate::torch::Torch;

/// An event on a stream of this PE's GPU, as DeepEP's `EventHandle`: what `EventOverlap`
/// wraps.
#[pyclass(module = "nvshmem_tutorial._native", frozen)]
pub struct Event {
    event: CudaEvent,
    device: i32,
    /// The buffer whose error record `current_stream_wait` reads (none for `capture()`).
    shared: Option<Weak<Shared>>,
    /// The tensors of the call, alive as long as the event (DeepEP's `extra_tensors`).
    _tensors: Option<Py<PyTuple>>,
}

#[pymethods]
impl Event {
    /// torch's current stream waits for the event; then the buffer's error record is read,
    /// and what a kernel of it recorded is raised.
    fn current_stream_wait(&self, py: Python<'_>) -> PyResult<()> {
        let stream = Torch::get(py)?.current_stream(py, self.device)?;
        let context = self.event.context();
        context
            .bind_to_thread()
            .map_err(Error::cuda("binding the event's CUDA context"))?;
        // SAFETY: our live event; torch's current stream of the event's GPU.
        unsafe { wait_event(stream, self.event.cu_event()) }?;
        if let Some(shared) = self.shared.as_ref().and_then(Weak::upgrade) {
            shared.check()?;
        }
        Ok(())
    }

    /// The `CUevent` handle, as an int.
    #[getter]
    fn cuda_event(&self) -> u64 {
        self.event.cu_event() as u64
    }
}

/// DeepEP's `Buffer.capture()`: an event recorded on torch's current stream.
#[pyfunction]
pub fn capture(py: Python<'_>) -> PyResult<Event> {
    let torch = Torch::get(py)?;
    let device = torch.current_device(py)?;
    let stream = torch.current_stream(py, device)?;
    // The world's context: the GPU's primary context, torch's.
    let context = state::with_state_detached(py, "capture", |s| Ok(s.world.context().clone()))?;
    let event = new_event(&context)?;
    // SAFETY: a new event and torch's current stream, of its context (bound by new_event).
    unsafe { record(event.cu_event(), stream) }?;
    Ok(Event {
        event,
        device,
        shared: None,
        _tensors: None,
    })
}

/// The driver event of DeepEP's `previous_event`: an `EventOverlap` (its `.event`), or an
/// event itself (ours, or any with a `cuda_event` handle, as torch.cuda.Event). None, or an
/// `EventOverlap` without an event, is no event, as in DeepEP.
fn previous_event(previous: Option<&Bound<'_, PyAny>>) -> PyResult<Option<sys::CUevent>> {
    let Some(previous) = previous else {
        return Ok(None);
    };
    let py = previous.py();
    let event = match previous.getattr(intern!(py, "event")) {
        Ok(event) => event,
        Err(_) => previous.clone(),
    };
    if event.is_none() {
        return Ok(None);
    }
    if let Ok(ours) = event.cast::<Event>() {
        return Ok(Some(ours.get().event.cu_event()));
    }
    match event
        .getattr(intern!(py, "cuda_event"))
        .and_then(|h| h.extract::<u64>())
    {
        Ok(handle) if handle != 0 => Ok(Some(handle as usize as sys::CUevent)),
        _ => Err(Error::Invalid(format!(
            "previous_event must be an EventOverlap from Buffer.capture() or from a call with \
             async_finish=True, got {}",
            event.get_type().name()?
        ))
        .into()),
    }
}

/// DeepEP's three stream arguments of a normal-mode call, as buffer.py passes them:
/// (previous_event, async_finish, allocate_on_comm_stream).
pub(crate) struct StreamArgs<'py> {
    previous_event: Option<Bound<'py, PyAny>>,
    async_finish: bool,
    allocate_on_comm_stream: bool,
}

impl<'a, 'py> FromPyObject<'a, 'py> for StreamArgs<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let (previous_event, async_finish, allocate_on_comm_stream): (
            Bound<'py, PyAny>,
            bool,
            bool,
        ) = obj.extract()?;
        Ok(Self {
            previous_event: (!previous_event.is_none()).then_some(previous_event),
            async_finish,
            allocate_on_comm_stream,
        })
    }
}

/// The streams of one call (see the module docs): `launch` is where its kernels go.
pub(crate) struct Streams<'py> {
    pub compute: u64,
    pub launch: u64,
    async_finish: bool,
    /// The buffer's communication stream (a torch Stream), which the call's tensors are
    /// marked as used by.
    comm: Bound<'py, PyAny>,
    /// With `allocate_on_comm_stream`: torch's current stream (the compute stream) to make
    /// current again when the call ends, and to mark the tensors as used by.
    compute_object: Option<Bound<'py, PyAny>>,
}

impl<'py> Streams<'py> {
    /// Orders a normal-mode call on the communication stream `comm`: it waits for the
    /// previous event or for torch's current stream.
    pub(crate) fn normal(
        call: &Call,
        comm: Bound<'py, PyAny>,
        args: StreamArgs<'py>,
    ) -> Result<Self, Error> {
        let py = comm.py();
        let previous = previous_event(args.previous_event.as_ref())?;
        if args.allocate_on_comm_stream && (previous.is_none() || !args.async_finish) {
            return Err(Error::Invalid(
                "allocate_on_comm_stream needs previous_event and async_finish (as in DeepEP)"
                    .into(),
            ));
        }
        let torch = Torch::get(py)?;
        let compute = torch.current_stream(py, call.device)?;
        let compute_object = if args.allocate_on_comm_stream {
            let current = torch.current_stream_object(py, call.device)?;
            torch.set_stream(&comm)?;
            Some(current)
        } else {
            None
        };
        let streams = Streams {
            compute,
            launch: call.comm,
            async_finish: args.async_finish,
            comm,
            compute_object,
        };
        // SAFETY: torch's streams and events of the buffer's GPU, whose context is bound.
        unsafe { call.order.enter(compute, call.comm, previous) }?;
        Ok(streams)
    }

    /// Orders a low-latency call: on the communication stream after the current one, or on
    /// the current stream itself with `return_recv_hook` (as DeepEP).
    pub(crate) fn low_latency(
        call: &Call,
        comm: Bound<'py, PyAny>,
        async_finish: bool,
        return_recv_hook: bool,
    ) -> Result<Self, Error> {
        if async_finish && return_recv_hook {
            return Err(Error::Invalid(
                "async_finish and return_recv_hook cannot both be set (as in DeepEP)".into(),
            ));
        }
        let compute = Torch::get(comm.py())?.current_stream(comm.py(), call.device)?;
        let launch = if return_recv_hook { compute } else { call.comm };
        // SAFETY: as in `normal`.
        unsafe { call.order.enter(compute, launch, None) }?;
        Ok(Streams {
            compute,
            launch,
            async_finish,
            comm,
            compute_object: None,
        })
    }

    /// Ends a call whose kernels are queued: with `async_finish` the event for the caller
    /// (every tensor of the call marked as used by the communication stream, and by the
    /// compute stream when the outputs were allocated on the other); else the compute
    /// stream waits for the call.
    pub(crate) fn finish(
        mut self,
        call: &Call,
        tensors: &[&Bound<'py, PyAny>],
    ) -> Result<Option<Event>, Error> {
        let py = self.comm.py();
        let compute_object = self.compute_object.take();
        if let Some(current) = &compute_object {
            Torch::get(py)?.set_stream(current)?;
        }
        if !self.async_finish {
            // SAFETY: as in `normal`.
            unsafe { call.order.join(self.compute, self.launch) }?;
            return Ok(None);
        }
        let event = new_event(call.buffer.world().context())?;
        // SAFETY: a new event; the launch stream of the buffer's context.
        unsafe { record(event.cu_event(), self.launch) }?;
        let record_stream = intern!(py, "record_stream");
        for tensor in tensors.iter().filter(|t| !t.is_none()) {
            tensor.call_method1(record_stream, (&self.comm,))?;
            if let Some(current) = &compute_object {
                tensor.call_method1(record_stream, (current,))?;
            }
        }
        Ok(Some(Event {
            event,
            device: call.device,
            shared: Some(call.weak()),
            _tensors: Some(PyTuple::new(py, tensors)?.unbind()),
        }))
    }
}

impl Drop for Streams<'_> {
    /// A call that failed before `finish` still gives torch its current stream back.
    fn drop(&mut self) {
        if let Some(current) = self.compute_object.take()
            && let Ok(torch) = Torch::get(current.py())
        {
            let _ = torch.set_stream(&current);
        }
    }
}
