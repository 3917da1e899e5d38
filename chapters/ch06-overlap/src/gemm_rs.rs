//! GEMM + reduce-scatter, two ways: serial (one GEMM, then chapter 4's reduce-scatter) and
//! overlapped (the GEMM of one peer's rows at a time, each piece put to that peer with a signal
//! as soon as it is computed; each PE sums the partials once they have all landed).

use std::ops::Deref;

use ch01_bootstrap::World;
use ch02_symmetric_memory::SymmetricBuffer;
use ch04_collectives::{CollectivesConfig, Communicator, DType};
use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr};
use half::bf16;

use crate::{Gemm, OverlapError, Signals, TpPlan};

/// One GEMM + reduce-scatter layer's buffers and streams (collective, as `AgGemm`).
pub struct GemmRs<W: Deref<Target = World>> {
    plan: TpPlan,
    comm: Communicator<W>,
    /// Our partial products for every PE's rows, [N x rows, cols] bf16: what the puts read
    /// (symmetric: the serial path's reduce-scatter reads it too).
    partial: SymmetricBuffer<W, u8>,
    /// landing[p]: PE p's partial product for our rows, [N, rows, cols] bf16. The serial path's
    /// reduce-scatter writes its result in slot 0.
    landing: SymmetricBuffer<W, u8>,
    /// Word p * chunks + c: chunk c of PE p's partial has landed here.
    signals: Signals<W>,
    /// N ones (at `ones_ptr`): the sum of the partials is the GEMM ones[1, N] @ landing[N,
    /// rows x cols].
    _ones: CudaSlice<bf16>,
    ones_ptr: u64,
    gemm: Gemm,
    /// One per piece: recorded after its GEMM, waited for by the communication stream.
    computed: Vec<CudaEvent>,
}

impl<W: Deref<Target = World> + Clone> GemmRs<W> {
    /// Collective.
    pub fn new(world: W, plan: TpPlan) -> Result<Self, OverlapError> {
        plan.check_job("GemmRs", world.n_pes())?;
        if plan.rows * plan.cols > i32::MAX as usize {
            return Err(OverlapError::invalid(
                "GemmRs",
                "rows x cols must fit cuBLAS's 32-bit sizes (the sum of the partials is one GEMM)",
            ));
        }
        let stream = world.stream().clone();
        let gemm = Gemm::new(stream.clone())?;
        let computed = (0..plan.num_signals())
            .map(|_| world.context().new_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(OverlapError::cuda("creating an event"))?;
        let ones = stream
            .clone_htod(&vec![bf16::ONE; plan.n_pes])
            .map_err(OverlapError::cuda("uploading the ones"))?;
        let ones_ptr = ones.device_ptr(&stream).0;
        let partial = SymmetricBuffer::new(world.clone(), plan.n_pes * plan.rows * plan.cols * 2)?;
        let landing = SymmetricBuffer::new(world.clone(), plan.landing_bytes())?;
        let comm = Communicator::new(world.clone(), CollectivesConfig::default())?;
        let signals = Signals::new(world, plan.num_signals())?;
        Ok(Self {
            plan,
            comm,
            partial,
            landing,
            signals,
            _ones: ones,
            ones_ptr,
            gemm,
            computed,
        })
    }

    pub fn world(&self) -> &World {
        self.comm.world()
    }
    /// Sizes this layer's GEMMs for `sms` SMs (0: all), leaving the rest to the puts
    /// ([`crate::Gemm::set_sm_target`]).
    pub fn set_gemm_sms(&self, sms: usize) -> Result<(), OverlapError> {
        self.gemm.set_sm_target(sms)
    }

    fn bytes_at(buffer: u64, row: usize, row_elems: usize) -> u64 {
        buffer + (row * row_elems * 2) as u64
    }

    // ANCHOR: rs_serial
    /// `y` = rows my_pe x rows .. of the sum over PEs of `x @ w`: one GEMM, then chapter 4's
    /// reduce-scatter, on the world's stream. `x` is [N x rows, K], `w` [K, cols], `y` [rows,
    /// cols], all bf16.
    ///
    /// # Safety
    /// `x`, `w` and `y` must be device memory of this PE's context of those shapes.
    pub unsafe fn serial(&self, x: u64, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let stream = self.world().stream().cu_stream();
        let (partial, out) = (self.partial.device_ptr(), self.landing.device_ptr());
        // SAFETY: the caller's; partial holds [N x rows, cols].
        unsafe {
            self.gemm
                .bf16((p.n_pes * p.rows, p.cols, p.k), x, w, partial, p.cols)?
        };
        let count = p.rows * p.cols;
        self.signals.after_serial();
        self.comm
            .reduce_scatter_raw(out, partial, count, DType::Bf16, None, stream)?;
        // SAFETY: both ranges hold count bf16 on this GPU; ordered on the stream.
        unsafe { cudarc::driver::result::memcpy_dtod_async(y, out, count * 2, stream) }
            .map_err(OverlapError::cuda("copying the result"))
    }
    // ANCHOR_END: rs_serial

    // ANCHOR: rs_overlapped
    /// The same result, overlapped: the GEMM of each peer's rows, piece by piece, each piece
    /// put to that peer with a signal as soon as it is computed; our own rows last, straight
    /// into our landing slot; then, once every peer's pieces are in, the sum.
    ///
    /// # Safety
    /// As `serial`.
    pub unsafe fn overlapped(&self, x: u64, w: u64, y: u64) -> Result<(), OverlapError> {
        let p = self.plan;
        let (me, n, cr) = (self.world().my_pe(), p.n_pes, p.chunk_rows());
        let call = self.signals.begin();
        let (partial, landing) = (self.partial.device_ptr(), self.landing.device_ptr());
        for step in 1..n {
            let dst_pe = (me + step) % n; // PE me + 1 first: it waits on us first
            for c in 0..p.chunks {
                let row = dst_pe * p.rows + c * cr;
                let piece = Self::bytes_at(partial, row, p.cols);
                // SAFETY: the caller's; the piece is rows row..row + cr of partial.
                unsafe {
                    let x_rows = Self::bytes_at(x, row, p.k);
                    self.gemm
                        .bf16((cr, p.cols, p.k), x_rows, w, piece, p.cols)?;
                }
                self.signals
                    .hand_over(&self.computed[dst_pe * p.chunks + c])?;
                let dst = Self::bytes_at(landing, me * p.rows + c * cr, p.cols);
                let index = me * p.chunks + c;
                self.signals
                    .put(dst, piece, cr * p.cols * 2, index, call, dst_pe);
            }
        }
        // SAFETY: the caller's; our own rows go straight into our landing slot.
        unsafe {
            let own = Self::bytes_at(landing, me * p.rows, p.cols);
            let x_rows = Self::bytes_at(x, me * p.rows, p.k);
            self.gemm
                .bf16((p.rows, p.cols, p.k), x_rows, w, own, p.cols)?;
        }
        for step in 1..n {
            let src = (me + n - step) % n;
            for c in 0..p.chunks {
                self.signals.wait(src * p.chunks + c, call);
            }
        }
        let len = p.rows * p.cols;
        // SAFETY: ones [1, N] and landing [N, rows x cols] bf16, y [rows x cols].
        unsafe {
            self.gemm
                .bf16((1, len, n), self.ones_ptr, landing, y, len)?
        };
        self.signals.finish()
    }
    // ANCHOR_END: rs_overlapped

    /// The GEMM alone, every token's rows into the partial buffer: the benchmark's compute
    /// time.
    ///
    /// # Safety
    /// `x` [N x rows, K] and `w` [K, cols] bf16 device memory of this PE's context.
    pub unsafe fn compute(&self, x: u64, w: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let partial = self.partial.device_ptr();
        // SAFETY: the caller's.
        unsafe {
            self.gemm
                .bf16((p.n_pes * p.rows, p.cols, p.k), x, w, partial, p.cols)
        }
    }

    /// The GEMMs of `overlapped` alone (each peer's pieces, then our own rows; no puts, no
    /// waits, no sum): the benchmark's measure of what splitting the GEMM costs by itself.
    ///
    /// # Safety
    /// As `compute`.
    pub unsafe fn compute_split(&self, x: u64, w: u64) -> Result<(), OverlapError> {
        let p = &self.plan;
        let (me, cr) = (self.world().my_pe(), p.chunk_rows());
        let partial = self.partial.device_ptr();
        // SAFETY (each GEMM): the caller's; every piece is a block of x and of partial.
        unsafe {
            for dst_pe in (0..p.n_pes).filter(|&d| d != me) {
                for c in 0..p.chunks {
                    let row = dst_pe * p.rows + c * cr;
                    let (x_rows, piece) = (
                        Self::bytes_at(x, row, p.k),
                        Self::bytes_at(partial, row, p.cols),
                    );
                    self.gemm
                        .bf16((cr, p.cols, p.k), x_rows, w, piece, p.cols)?;
                }
            }
            let row = me * p.rows;
            let (x_rows, own) = (
                Self::bytes_at(x, row, p.k),
                Self::bytes_at(partial, row, p.cols),
            );
            self.gemm
                .bf16((p.rows, p.cols, p.k), x_rows, w, own, p.cols)
        }
    }
}
