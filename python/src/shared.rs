//! What a `BufferCore` shares with the objects it hands out (the events of `async_finish`,
//! the receive hooks of low-latency mode): the Rust buffer and its stream-ordering event.
//!
//! Who owns it: the package's state (state.rs), as an `Owned` entry under the freeing rule.
//! The `BufferCore`, its events and hooks hold a `Weak`, and the token that keeps the memory
//! alive is held by the `BufferCore` and by every region view (buffer.rs). So `destroy()` (or
//! the garbage collector) only releases the buffer; its memory is freed collectively at the
//! next collect point, once no view over it is left on any rank.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use ch01_bootstrap::World;
use nvshmem_tutorial::{BufferError, NvshmemBuffer};

use crate::errors::Error;
use crate::streams::StreamOrder;

pub(crate) struct Shared {
    pub buffer: NvshmemBuffer<Arc<World>>,
    pub order: StreamOrder,
    /// This PE's GPU (torch's device index).
    pub device: i32,
    /// The buffer's communication stream (a torch Stream the Python `Buffer` holds).
    pub comm: u64,
    destroyed: AtomicBool,
    /// A call is running: calls of one buffer must not overlap (its rings, counts and
    /// low-latency state assume one call at a time, as DeepEP's do).
    busy: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        buffer: NvshmemBuffer<Arc<World>>,
        device: i32,
        comm: u64,
    ) -> Result<Self, Error> {
        Ok(Self {
            order: StreamOrder::new(buffer.world().context())?,
            buffer,
            device,
            comm,
            destroyed: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        })
    }

    /// Marks the buffer destroyed: every later call raises.
    pub(crate) fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::Release);
    }

    /// What the buffer's error records hold, as the exception for it.
    pub(crate) fn check(&self) -> Result<(), Error> {
        Ok(self.buffer.check()?)
    }
}

/// A running call of a buffer; dropping it ends the call.
pub(crate) struct Call(Arc<Shared>);

impl Call {
    /// Starts a call of the buffer `shared` points at: `Err` once the buffer was destroyed,
    /// or while another call of it runs (on another thread). Binds the buffer's CUDA context
    /// to this thread.
    pub(crate) fn enter(shared: &Weak<Shared>) -> Result<Self, Error> {
        let shared = shared.upgrade().ok_or(BufferError::Destroyed)?;
        if shared.destroyed.load(Ordering::Acquire) {
            return Err(BufferError::Destroyed.into());
        }
        if shared.busy.swap(true, Ordering::Acquire) {
            return Err(Error::Invalid(
                "another call of this buffer is running on another thread: calls of one \
                 buffer must not overlap"
                    .into(),
            ));
        }
        let call = Call(shared);
        call.buffer
            .world()
            .context()
            .bind_to_thread()
            .map_err(Error::cuda("binding the buffer's CUDA context"))?;
        Ok(call)
    }

    /// What the objects a call hands out (events, hooks) keep of the buffer.
    pub(crate) fn weak(&self) -> Weak<Shared> {
        Arc::downgrade(&self.0)
    }
}

impl Deref for Call {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}
