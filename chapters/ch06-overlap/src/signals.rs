//! What both layers' overlapped calls share: a communication stream beside the world's, signal
//! words that carry call numbers, and how a call begins and ends.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use cudarc::driver::{CudaEvent, CudaStream};
use nvshmem_sys::{CMP_GE, SIGNAL_SET};

use crate::OverlapError;

/// A communication stream and `n` signal words (collective: every PE makes it with the same
/// `n`, and runs the same calls in the same order).
pub struct Signals<W: Deref<Target = World>> {
    world: W,
    /// words[i]: the number of the last call whose piece i has landed here.
    words: SymmetricBuffer<W, u64>,
    comm_stream: Arc<CudaStream>,
    /// Calls so far: a signal that reached this call's number is this call's. Signals are
    /// never reset, so a stale one can never pass for a new one.
    calls: Cell<u64>,
    /// A serial call ran since the last barrier (serial calls end without one): a peer may still
    /// read what our next puts overwrite, so the next overlapped call starts with a barrier.
    fence: Cell<bool>,
    puts_done: CudaEvent,
}

impl<W: Deref<Target = World> + Clone> Signals<W> {
    /// Collective.
    pub fn new(world: W, n: usize) -> Result<Self, OverlapError> {
        let ctx = world.context().clone();
        let comm_stream = ctx
            .new_stream()
            .map_err(OverlapError::cuda("creating the communication stream"))?;
        let puts_done = ctx
            .new_event(None)
            .map_err(OverlapError::cuda("creating an event"))?;
        let words = SymmetricBuffer::<W, u64>::new(world.clone(), n)?;
        words.fill_bytes(0)?;
        world.barrier_all()?; // every PE's words are zero before anyone puts
        Ok(Self {
            world,
            words,
            comm_stream,
            calls: Cell::new(0),
            fence: Cell::new(false),
            puts_done,
        })
    }

    /// A serial call ran: the next overlapped call starts with a barrier.
    pub fn after_serial(&self) {
        self.fence.set(true);
    }

    // ANCHOR: begin
    /// Starts an overlapped call and returns its number; first a barrier on the world's stream
    /// if a serial call ran since the last overlapped one.
    pub fn begin(&self) -> u64 {
        if self.fence.replace(false) {
            let stream = self.world.stream().cu_stream() as _;
            // SAFETY: NVSHMEM is initialised; this only enqueues work on a live stream.
            unsafe { (self.world.nvshmem().barrier_all_on_stream)(stream) };
        }
        let call = self.calls.get() + 1;
        self.calls.set(call);
        call
    }
    // ANCHOR_END: begin

    /// `event` recorded on the world's stream, and the communication stream waits for it: what
    /// the world's stream wrote so far, the puts enqueued after may read.
    pub fn hand_over(&self, event: &CudaEvent) -> Result<(), OverlapError> {
        event
            .record(self.world.stream())
            .map_err(OverlapError::cuda("recording an event"))?;
        self.comm_stream
            .wait(event)
            .map_err(OverlapError::cuda("waiting for an event"))
    }

    // ANCHOR: put
    /// On the communication stream: `bytes` at `src` (this GPU) to the symmetric address `dst`
    /// on `pe`, then word `index` there set to `call` once the data has landed.
    pub fn put(&self, dst: u64, src: u64, bytes: usize, index: usize, call: u64, pe: usize) {
        let word = self.words.device_ptr() + (index * 8) as u64;
        let stream = self.comm_stream.cu_stream() as _;
        let put = self.world.nvshmem().putmem_signal_nbi_on_stream;
        // SAFETY: NVSHMEM is initialised; the callers keep dst inside a live symmetric
        // allocation and src inside this GPU's memory (their plans' sizes); the word is ours.
        unsafe {
            put(
                dst as _, src as _, bytes, word as _, call, SIGNAL_SET, pe as i32, stream,
            )
        };
    }

    /// Stalls the world's stream until word `index` reaches call number `call`.
    pub fn wait(&self, index: usize, call: u64) {
        self.wait_on(self.world.stream(), index, call)
    }

    /// Stalls `stream` (of this PE's context) until word `index` reaches call number `call`.
    pub fn wait_on(&self, stream: &CudaStream, index: usize, call: u64) {
        let word = self.words.device_ptr() + (index * 8) as u64;
        let stream = stream.cu_stream() as _;
        // SAFETY: a u64 word of this PE's symmetric allocation; only enqueues a wait.
        unsafe {
            (self.world.nvshmem().signal_wait_until_on_stream)(word as _, CMP_GE, call, stream)
        };
    }
    // ANCHOR_END: put

    // ANCHOR: finish
    /// The call's end: the world's stream waits for our puts to complete (their sources may be
    /// rewritten after), then for every PE (a peer's next call must not land in our buffers
    /// while our GEMMs still read them).
    pub fn finish(&self) -> Result<(), OverlapError> {
        let nvshmem = self.world.nvshmem();
        // SAFETY: NVSHMEM is initialised; both calls only enqueue work on live streams.
        unsafe { (nvshmem.quiet_on_stream)(self.comm_stream.cu_stream() as _) };
        self.puts_done
            .record(&self.comm_stream)
            .map_err(OverlapError::cuda("recording an event"))?;
        let compute = self.world.stream();
        compute
            .wait(&self.puts_done)
            .map_err(OverlapError::cuda("joining the streams"))?;
        // SAFETY: as above.
        unsafe { (nvshmem.barrier_all_on_stream)(compute.cu_stream() as _) };
        Ok(())
    }
    // ANCHOR_END: finish
}
