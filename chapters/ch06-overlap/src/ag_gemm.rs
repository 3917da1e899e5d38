//! All-gather + GEMM, two ways: serial (chapter 4's all-gather, then one GEMM) and overlapped
//! (a put with a signal per chunk on a communication stream; on the compute stream, the GEMM
//! of each chunk after a stream wait on its signal).

use std::cell::Cell;
use std::ops::Deref;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::{CollectivesConfig, Communicator};
use cudarc::driver::{CudaEvent, CudaStream};
use nvshmem_sys::{CMP_GE, SIGNAL_SET};

use crate::{Gemm, OverlapError, TpPlan};

/// One all-gather + GEMM layer's buffers and streams (collective: every PE makes it with the
/// same plan, and calls it in the same order).
pub struct AgGemm<W: Deref<Target = World>> {
    plan: TpPlan,
    comm: Communicator<W>,
    /// This PE's input rows, [rows, K] bf16: write them here before a call.
    shard: SymmetricBuffer<W, u8>,
    /// Every PE's rows in PE order, [N x rows, K] bf16: where the puts land.
    gathered: SymmetricBuffer<W, u8>,
    /// signals[s * chunks + c]: the call number whose chunk c of PE s has landed here.
    signals: SymmetricBuffer<W, u64>,
    comm_stream: Arc<CudaStream>,
    gemm: Gemm,
    /// Calls so far: a signal that reached this call's number is this call's. Signals are
    /// never reset, so a stale one can never pass for a new one.
    calls: Cell<u64>,
    /// A serial call or `compute` ran since the last barrier: a peer may still be reading its
    /// `gathered`, which our next puts overwrite, so the next overlapped call starts with one.
    fence: Cell<bool>,
    shard_ready: CudaEvent,
    puts_done: CudaEvent,
}

impl<W: Deref<Target = World> + Clone> AgGemm<W> {
    /// Collective.
    pub fn new(world: W, plan: TpPlan) -> Result<Self, OverlapError> {
        if plan.n_pes != world.n_pes() {
            return Err(OverlapError::invalid(
                "AgGemm",
                format!(
                    "the plan is for {} PEs, the job has {}",
                    plan.n_pes,
                    world.n_pes()
                ),
            ));
        }
        let ctx = world.context().clone();
        let gemm = Gemm::new(world.stream().clone())?;
        let comm_stream = ctx
            .new_stream()
            .map_err(OverlapError::cuda("creating the communication stream"))?;
        let event = || {
            ctx.new_event(None)
                .map_err(OverlapError::cuda("creating an event"))
        };
        let (shard_ready, puts_done) = (event()?, event()?);
        let shard = SymmetricBuffer::new(world.clone(), plan.rows * plan.k * 2)?;
        let gathered = SymmetricBuffer::new(world.clone(), plan.gathered_bytes())?;
        let signals = SymmetricBuffer::<W, u64>::new(world.clone(), plan.num_signals())?;
        signals.fill_bytes(0)?;
        let comm = Communicator::new(world.clone(), CollectivesConfig::default())?;
        world.barrier_all()?; // every PE's signals are zero before anyone puts
        Ok(Self {
            plan,
            comm,
            shard,
            gathered,
            signals,
            comm_stream,
            gemm,
            calls: Cell::new(0),
            fence: Cell::new(false),
            shard_ready,
            puts_done,
        })
    }

    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }
    pub fn world(&self) -> &World {
        self.comm.world()
    }
    /// This PE's input rows, [rows, K] bf16, in symmetric memory.
    pub fn shard(&self) -> &SymmetricBuffer<W, u8> {
        &self.shard
    }

    /// Byte address of row `row` of the gathered input.
    fn gathered_row(&self, row: usize) -> u64 {
        self.gathered.device_ptr() + (row * self.plan.k * 2) as u64
    }

    // ANCHOR: serial
    /// `y = all_gather(shard) @ w`, one step after the other, on the world's stream. `w` is
    /// [K, cols] bf16, `y` [N x rows, cols] bf16.
    ///
    /// # Safety
    /// `w` and `y` must be device memory of this PE's context of those shapes.
    pub unsafe fn serial(&self, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let stream = self.world().stream().cu_stream();
        let shard_bytes = p.rows * p.k * 2;
        let (gathered, shard) = (self.gathered.device_ptr(), self.shard.device_ptr());
        self.fence.set(true);
        self.comm
            .all_gather_raw(gathered, shard, shard_bytes, None, stream)?;
        // SAFETY: the caller's; gathered holds [N x rows, K].
        unsafe {
            self.gemm
                .bf16((p.n_pes * p.rows, p.cols, p.k), gathered, w, y, p.cols)
        }
    }
    // ANCHOR_END: serial

    // ANCHOR: overlapped
    /// The same result, overlapped: the communication stream puts each chunk of our shard to
    /// every peer with a signal; the world's stream multiplies our own rows at once, then each
    /// peer's chunk as soon as its signal says it has landed.
    ///
    /// # Safety
    /// As `serial`.
    pub unsafe fn overlapped(&self, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = self.plan;
        let (me, n) = (self.world().my_pe(), p.n_pes);
        let call = self.calls.get() + 1;
        self.calls.set(call);
        let compute = self.world().stream();
        self.fence_if_needed();
        self.shard_ready
            .record(compute)
            .map_err(OverlapError::cuda("recording an event"))?;
        self.comm_stream
            .wait(&self.shard_ready)
            .map_err(OverlapError::cuda("waiting for the shard"))?;
        self.put_chunks(me, call)?;
        let cr = p.chunk_rows();
        let y_row = |row: usize| y + (row * p.cols * 2) as u64;
        // Our own rows need no communication.
        // SAFETY: the caller's; the shard holds [rows, K].
        unsafe {
            let own = (p.rows, p.cols, p.k);
            self.gemm
                .bf16(own, self.shard.device_ptr(), w, y_row(me * p.rows), p.cols)?;
        }
        // Everyone sends to me + 1 first, so PE me - 1's chunks arrive here first.
        for step in 1..n {
            let src = (me + n - step) % n;
            for c in 0..p.chunks {
                let row = src * p.rows + c * cr;
                self.wait_signal(src * p.chunks + c, call)?;
                // SAFETY: the signal says rows row..row + cr of `gathered` have landed.
                unsafe {
                    self.gemm.bf16(
                        (cr, p.cols, p.k),
                        self.gathered_row(row),
                        w,
                        y_row(row),
                        p.cols,
                    )?;
                }
            }
        }
        self.finish()
    }
    // ANCHOR_END: overlapped

    // ANCHOR: put_chunks
    /// On the communication stream: each chunk of our shard to every peer's `gathered`, at our
    /// rows, with the chunk's signal set to this call's number once the data is there.
    fn put_chunks(&self, me: usize, call: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let n = p.n_pes;
        let chunk_bytes = p.chunk_rows() * p.k * 2;
        let nvshmem = self.world().nvshmem();
        let stream = self.comm_stream.cu_stream() as _;
        for step in 1..n {
            let dst_pe = (me + step) % n;
            for c in 0..p.chunks {
                let dst = self.gathered_row(me * p.rows + c * p.chunk_rows());
                let src = self.shard.device_ptr() + (c * chunk_bytes) as u64;
                let signal = self.signals.device_ptr() + ((me * p.chunks + c) * 8) as u64;
                // SAFETY: NVSHMEM is initialised; dst and signal are symmetric addresses of
                // live allocations (the same on every PE), src is our shard; every range
                // stays inside its allocation (the plan's sizes).
                unsafe {
                    (nvshmem.putmem_signal_nbi_on_stream)(
                        dst as _,
                        src as _,
                        chunk_bytes,
                        signal as _,
                        call,
                        SIGNAL_SET,
                        dst_pe as i32,
                        stream,
                    )
                };
            }
        }
        Ok(())
    }
    // ANCHOR_END: put_chunks

    /// After a serial call or `compute`, which end without a barrier: the world's stream waits
    /// for every PE, so that no peer still reads the `gathered` our puts are about to land in.
    fn fence_if_needed(&self) {
        if self.fence.replace(false) {
            let stream = self.world().stream().cu_stream() as _;
            // SAFETY: NVSHMEM is initialised; this only enqueues work on a live stream.
            unsafe { (self.world().nvshmem().barrier_all_on_stream)(stream) };
        }
    }

    /// Stalls the world's stream until signal `index` reaches call number `call`.
    fn wait_signal(&self, index: usize, call: u64) -> Result<(), OverlapError> {
        let signal = self.signals.device_ptr() + (index * 8) as u64;
        let stream = self.world().stream().cu_stream() as _;
        // SAFETY: a u64 signal word of this PE's symmetric allocation.
        unsafe {
            (self.world().nvshmem().signal_wait_until_on_stream)(signal as _, CMP_GE, call, stream)
        };
        Ok(())
    }

    // ANCHOR: finish
    /// The call's end: the world's stream waits for our puts to complete (the shard may be
    /// rewritten after), then for every PE (a peer's next call must not land in `gathered`
    /// while our GEMMs still read it).
    fn finish(&self) -> Result<(), OverlapError> {
        let nvshmem = self.world().nvshmem();
        // SAFETY: NVSHMEM is initialised; both calls only enqueue work on live streams.
        unsafe { (nvshmem.quiet_on_stream)(self.comm_stream.cu_stream() as _) };
        self.puts_done
            .record(&self.comm_stream)
            .map_err(OverlapError::cuda("recording an event"))?;
        let compute = self.world().stream();
        compute
            .wait(&self.puts_done)
            .map_err(OverlapError::cuda("joining the streams"))?;
        // SAFETY: as above.
        unsafe { (nvshmem.barrier_all_on_stream)(compute.cu_stream() as _) };
        Ok(())
    }
    // ANCHOR_END: finish

    /// The communication alone, as `overlapped` does it (puts, signals, waits; no GEMM): the
    /// benchmark's comm time.
    pub fn communicate(&self) -> Result<(), OverlapError> {
        let p = self.plan;
        let (me, n) = (self.world().my_pe(), p.n_pes);
        let call = self.calls.get() + 1;
        self.calls.set(call);
        self.fence_if_needed();
        self.shard_ready
            .record(self.world().stream())
            .map_err(OverlapError::cuda("recording an event"))?;
        self.comm_stream
            .wait(&self.shard_ready)
            .map_err(OverlapError::cuda("waiting for the shard"))?;
        self.put_chunks(me, call)?;
        for step in 1..n {
            let src = (me + n - step) % n;
            for c in 0..p.chunks {
                self.wait_signal(src * p.chunks + c, call)?;
            }
        }
        self.finish()
    }

    /// The GEMM alone, over the gathered input as it is: the benchmark's compute time.
    ///
    /// # Safety
    /// As `serial`.
    pub unsafe fn compute(&self, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let gathered = self.gathered.device_ptr();
        self.fence.set(true);
        // SAFETY: the caller's.
        unsafe {
            self.gemm
                .bf16((p.n_pes * p.rows, p.cols, p.k), gathered, w, y, p.cols)
        }
    }
}
