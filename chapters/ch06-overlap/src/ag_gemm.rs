//! All-gather + GEMM, two ways: serial (chapter 4's all-gather, then one GEMM) and overlapped
//! (a put with a signal per chunk on a communication stream; on the compute stream, the GEMM
//! of each chunk after a stream wait on its signal).

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::{CollectivesConfig, Communicator};
use std::cell::Cell;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::{Gemm, OverlapError, Signals, TpPlan};

/// One all-gather + GEMM layer's buffers and streams (collective: every PE makes it with the
/// same plan, and calls it in the same order).
pub struct AgGemm<W: Deref<Target = World>> {
    plan: TpPlan,
    comm: Communicator<W>,
    /// This PE's input rows, [rows, K] bf16: write them here before a call.
    shard: SymmetricBuffer<W, u8>,
    /// Every PE's rows in PE order, [N x rows, K] bf16: where the puts land.
    gathered: SymmetricBuffer<W, u8>,
    /// Word s * chunks + c: chunk c of PE s has landed here.
    signals: Signals<W>,
    gemm: Gemm,
    shard_ready: CudaEvent,
    /// The peers' chunks' GEMMs when `side_gemms` is on: a stream of their own, so that they
    /// may start on the SMs our own rows' GEMM frees in its last wave.
    side: Arc<CudaStream>,
    side_gemm: Gemm,
    side_done: CudaEvent,
    side_gemms: Cell<bool>,
}

impl<W: Deref<Target = World> + Clone> AgGemm<W> {
    /// Collective.
    pub fn new(world: W, plan: TpPlan) -> Result<Self, OverlapError> {
        plan.check_job("AgGemm", world.n_pes())?;
        let gemm = Gemm::new(world.stream().clone())?;
        let shard_ready = world
            .context()
            .new_event(None)
            .map_err(OverlapError::cuda("creating an event"))?;
        let side = world
            .context()
            .new_stream()
            .map_err(OverlapError::cuda("creating the side stream"))?;
        let side_gemm = Gemm::new(side.clone())?;
        let side_done = world
            .context()
            .new_event(None)
            .map_err(OverlapError::cuda("creating an event"))?;
        let shard = SymmetricBuffer::new(world.clone(), plan.rows * plan.k * 2)?;
        let gathered = SymmetricBuffer::new(world.clone(), plan.gathered_bytes())?;
        let comm = Communicator::new(world.clone(), CollectivesConfig::default())?;
        let signals = Signals::new(world, plan.num_signals())?;
        Ok(Self {
            plan,
            comm,
            shard,
            gathered,
            signals,
            gemm,
            shard_ready,
            side,
            side_gemm,
            side_done,
            side_gemms: Cell::new(false),
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

    /// Sizes this layer's GEMMs for `sms` SMs (0: all), leaving the rest to the puts
    /// ([`Gemm::set_sm_target`]).
    pub fn set_gemm_sms(&self, sms: usize) -> Result<(), OverlapError> {
        self.gemm.set_sm_target(sms)?;
        self.side_gemm.set_sm_target(sms)
    }

    /// `on`: `overlapped` runs the peers' chunks' GEMMs on a side stream, beside our own rows'
    /// GEMM instead of after it (the split GEMM's last, partly empty wave is what splitting
    /// costs; a second stream may fill it).
    pub fn set_side_gemms(&self, on: bool) {
        self.side_gemms.set(on);
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
        self.signals.after_serial();
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
        let call = self.signals.begin();
        self.signals.hand_over(&self.shard_ready)?;
        self.put_chunks(me, call);
        let cr = p.chunk_rows();
        let y_row = |row: usize| y + (row * p.cols * 2) as u64;
        // Our own rows need no communication.
        // SAFETY: the caller's; the shard holds [rows, K].
        unsafe {
            let own = (p.rows, p.cols, p.k);
            self.gemm
                .bf16(own, self.shard.device_ptr(), w, y_row(me * p.rows), p.cols)?;
        }
        let (gemm, stream) = self.peers_gemm()?;
        // Everyone sends to me + 1 first, so PE me - 1's chunks arrive here first.
        for step in 1..n {
            let src = (me + n - step) % n;
            for c in 0..p.chunks {
                let row = src * p.rows + c * cr;
                self.signals.wait_on(stream, src * p.chunks + c, call);
                // SAFETY: the signal says rows row..row + cr of `gathered` have landed.
                unsafe {
                    gemm.bf16(
                        (cr, p.cols, p.k),
                        self.gathered_row(row),
                        w,
                        y_row(row),
                        p.cols,
                    )?;
                }
            }
        }
        self.join_side()?;
        self.signals.finish()
    }
    // ANCHOR_END: overlapped

    /// The handle and stream of the peers' chunks' GEMMs: the world's, or with `side_gemms`
    /// the side stream, which first waits for what the world's stream ordered before the call
    /// (the `shard_ready` event, recorded by `hand_over`).
    fn peers_gemm(&self) -> Result<(&Gemm, &CudaStream), OverlapError> {
        if !self.side_gemms.get() {
            return Ok((&self.gemm, self.world().stream()));
        }
        self.side
            .wait(&self.shard_ready)
            .map_err(OverlapError::cuda("waiting for an event"))?;
        Ok((&self.side_gemm, &self.side))
    }

    /// With `side_gemms`: the world's stream waits for the side stream's GEMMs.
    fn join_side(&self) -> Result<(), OverlapError> {
        if !self.side_gemms.get() {
            return Ok(());
        }
        self.side_done
            .record(&self.side)
            .map_err(OverlapError::cuda("recording an event"))?;
        self.world()
            .stream()
            .wait(&self.side_done)
            .map_err(OverlapError::cuda("joining the streams"))
    }

    // ANCHOR: put_chunks
    /// On the communication stream: each chunk of our shard to every peer's `gathered`, at our
    /// rows, with the chunk's signal set to this call's number once the data is there.
    fn put_chunks(&self, me: usize, call: u64) {
        let p = &self.plan;
        let (cr, n) = (p.chunk_rows(), p.n_pes);
        let chunk_bytes = cr * p.k * 2;
        for step in 1..n {
            let dst_pe = (me + step) % n;
            for c in 0..p.chunks {
                let dst = self.gathered_row(me * p.rows + c * cr);
                let src = self.shard.device_ptr() + (c * chunk_bytes) as u64;
                self.signals
                    .put(dst, src, chunk_bytes, me * p.chunks + c, call, dst_pe);
            }
        }
    }
    // ANCHOR_END: put_chunks

    /// The communication alone, as `overlapped` does it (puts, signals, waits; no GEMM): the
    /// benchmark's comm time.
    pub fn communicate(&self) -> Result<(), OverlapError> {
        let p = self.plan;
        let (me, n) = (self.world().my_pe(), p.n_pes);
        let call = self.signals.begin();
        self.signals.hand_over(&self.shard_ready)?;
        self.put_chunks(me, call);
        for step in 1..n {
            let src = (me + n - step) % n;
            for c in 0..p.chunks {
                self.signals.wait(src * p.chunks + c, call);
            }
        }
        self.signals.finish()
    }

    /// The GEMMs of `overlapped` alone (our rows, then every chunk; no puts, no waits): the
    /// benchmark's measure of what splitting the GEMM costs by itself.
    ///
    /// # Safety
    /// As `serial`.
    pub unsafe fn compute_split(&self, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let cr = p.chunk_rows();
        self.signals.after_serial();
        // SAFETY (each GEMM): the caller's; `gathered` holds [N x rows, K].
        unsafe {
            let own = self.world().my_pe() * p.rows;
            let y_own = y + (own * p.cols * 2) as u64;
            self.gemm.bf16(
                (p.rows, p.cols, p.k),
                self.gathered_row(own),
                w,
                y_own,
                p.cols,
            )?;
            for src in (0..p.n_pes).filter(|&s| s != self.world().my_pe()) {
                for c in 0..p.chunks {
                    let row = src * p.rows + c * cr;
                    let y_row = y + (row * p.cols * 2) as u64;
                    self.gemm
                        .bf16((cr, p.cols, p.k), self.gathered_row(row), w, y_row, p.cols)?;
                }
            }
        }
        Ok(())
    }

    /// The GEMM alone, over the gathered input as it is: the benchmark's compute time.
    ///
    /// # Safety
    /// As `serial`.
    pub unsafe fn compute(&self, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let gathered = self.gathered.device_ptr();
        self.signals.after_serial();
        // SAFETY: the caller's.
        unsafe {
            self.gemm
                .bf16((p.n_pes * p.rows, p.cols, p.k), gathered, w, y, p.cols)
        }
    }
}
