//! Chapter 8: low-latency mode. Dispatch and combine for decoding: fixed slots instead of a
//! count exchange, device-side call numbers instead of host state, so one dispatch and one
//! combine can be captured in a CUDA graph and replayed with new data
//! (kernels/cuda/buffer/low_latency.cuh has the protocol and its NOTES; ll_dispatch.cu and
//! ll_combine.cu the kernels).
//!
//! # The low-latency region (num_rdma_bytes), as size formulas
//!
//! With T = num_max_dispatch_tokens_per_rank, H = hidden, R = ranks, E = experts, L = E / R,
//! and P = the region's bytes after the control words, split in three 256-byte aligned parts:
//!
//! ```text
//! control   CONTROL_BYTES:
//!             flags  [2][MAX_PES] u64        the last combine each source finished, per half
//!             counts [2][MAX_EXPERTS] u64    counts[h][s * L + e]: (dispatch call << 32) |
//!                                            tokens from s for expert e
//! half 0    P / 3 >= E x T x (16 + 2H)       dispatch slots (a bf16 message is the largest),
//! half 1    P / 3                            or combine rows of 2H: call k uses half k & 1
//! staging   P / 3 >= L x (R x T) x 2H        the zero-copy combine input
//! ```
//!
//! The parts sit where the region's size puts them, not where a call's shape would: calls of
//! different shapes then use the same halves, so one that follows another of a different
//! shape cannot write over rows a peer is still reading (the NOTES' reuse argument holds for
//! any sequence of shapes). A shape fits when E x T x (16 + 2H) <= P / 3, which is what
//! `get_low_latency_rdma_size_hint` asks for.

//!
//! `dispatch.rs` and `combine.rs` hold the two calls; this module what they share: the
//! layout, the checks, the one-call-in-flight rule and the launch.

mod combine;
mod dispatch;

pub use combine::{LlCombineInputs, LlHandle};
pub use dispatch::{LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs};

use std::ops::Deref;
use std::sync::OnceLock;

use ch01_bootstrap::World;
use cudarc::driver::{DevicePtr, sys};

use crate::buffer::{NvshmemBuffer, arg};
use crate::error::BufferError;
use crate::view::{ElemType, View};
use ch04_collectives::config::MAX_PES;
use ch04_collectives::{CollError, LaunchSpec};

/// Most experts (global) a low-latency call takes (`MAX_EXPERTS` in low_latency.cuh).
pub const MAX_EXPERTS: usize = 2048;
/// Most experts per token.
pub const MAX_TOPK: usize = 32;
/// Widest row a low-latency call takes: the send phase stages a row's fp8 scales in shared
/// memory (`MAX_LL_HIDDEN` in low_latency.cuh).
pub const MAX_HIDDEN: usize = 32768;
/// Threads per block of both kernels.
pub const THREADS_PER_BLOCK: u32 = 512;
/// Bytes of the control words at the start of the region.
pub const CONTROL_BYTES: usize = (2 * MAX_PES * 8 + 2 * MAX_EXPERTS * 8).next_multiple_of(256);
/// Most blocks a low-latency launch has (one per SM; `MAX_LL_BLOCKS` in low_latency.cuh): each
/// block keeps its own call count.
pub const MAX_BLOCKS: usize = 256;
/// u64 words of the per-rank device state (`LlState` in low_latency.cuh: calls[MAX_BLOCKS],
/// finish[MAX_PES], slots[MAX_EXPERTS]).
pub(crate) const STATE_WORDS: usize = (8 * MAX_BLOCKS + 4 * MAX_PES + 4 * MAX_EXPERTS).div_ceil(8);

/// The two kernels, each one symbol launched with a phase argument; their mangled names are
/// looked up once, not on every call.
pub(crate) static DISPATCH_KERNEL: Kernel =
    Kernel::new("buffer/ll_dispatch", "nvshmem_tutorial::dispatch");
pub(crate) static COMBINE_KERNEL: Kernel =
    Kernel::new("buffer/ll_combine", "nvshmem_tutorial::combine");

/// A C++ kernel by module and `namespace::name`, its symbol found on first use.
pub(crate) struct Kernel {
    module: &'static str,
    name: &'static str,
    symbol: OnceLock<&'static str>,
}

impl Kernel {
    const fn new(module: &'static str, name: &'static str) -> Self {
        Self {
            module,
            name,
            symbol: OnceLock::new(),
        }
    }
    fn symbol(&self) -> Result<&'static str, BufferError> {
        if let Some(symbol) = self.symbol.get() {
            return Ok(symbol);
        }
        let symbol = kernels::kernel_symbol(self.module, self.name).map_err(CollError::from)?;
        Ok(self.symbol.get_or_init(|| symbol))
    }
}

fn align256(bytes: usize) -> usize {
    bytes.next_multiple_of(256)
}

// ANCHOR: layout
/// The shape of a low-latency call and what it needs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlLayout {
    pub max_tokens: usize,
    pub hidden: usize,
    pub num_ranks: usize,
    pub num_experts: usize,
}

impl LlLayout {
    pub fn num_local_experts(&self) -> usize {
        self.num_experts / self.num_ranks
    }
    /// One dispatch message: a 16-byte header (the source token), the row, fp8 scales.
    /// One dispatch message: a 16-byte header, the row, the fp8 scales; rounded up to 16
    /// bytes so that every slot is 16-byte aligned (`dispatch_msg_bytes` in ll_dispatch.cu).
    pub fn dispatch_msg_bytes(&self, use_fp8: bool) -> usize {
        (16 + if use_fp8 {
            self.hidden + self.hidden / 128 * 4
        } else {
            self.hidden * 2
        })
        .next_multiple_of(16)
    }
    /// What a half must hold: every (expert, source, slot) message at its largest (bf16);
    /// that also covers the combine rows (E x T x 2H) and the staging (L x R x T x 2H).
    pub fn half_bytes(&self) -> usize {
        align256(self.num_experts * self.max_tokens * self.dispatch_msg_bytes(false))
    }
    /// Bytes of num_rdma_bytes the shape needs: `get_low_latency_rdma_size_hint`.
    pub fn total_bytes(&self) -> usize {
        CONTROL_BYTES + 3 * self.half_bytes()
    }
}

/// The parts of a region of `num_rdma_bytes`: the same for every call of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlParts {
    pub part_bytes: usize,
}

impl LlParts {
    pub fn new(num_rdma_bytes: usize) -> Self {
        Self {
            part_bytes: (num_rdma_bytes.saturating_sub(CONTROL_BYTES) / 3) & !255,
        }
    }
    pub fn flags(h: usize) -> usize {
        h * MAX_PES * 8
    }
    pub fn counts(h: usize) -> usize {
        2 * MAX_PES * 8 + h * MAX_EXPERTS * 8
    }
    pub fn half(&self, h: usize) -> usize {
        CONTROL_BYTES + h * self.part_bytes
    }
    pub fn staging(&self) -> usize {
        self.half(2)
    }
}
// ANCHOR_END: layout

/// DeepEP's `Buffer.get_low_latency_rdma_size_hint`: the num_rdma_bytes a low-latency buffer
/// needs for this shape (bf16 dispatch, the largest), rounded up to 128 bytes.
pub fn get_low_latency_rdma_size_hint(
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_ranks: usize,
    num_experts: usize,
) -> usize {
    LlLayout {
        max_tokens: num_max_dispatch_tokens_per_rank,
        hidden,
        num_ranks: num_ranks.max(1),
        num_experts,
    }
    .total_bytes()
    .next_multiple_of(128)
}

/// A send phase waiting for its receive: which call, of which shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingReceive {
    pub op: &'static str,
    pub shape: LlLayout,
}

/// Which halves of a call a launch runs: both (the call returns with the data received),
/// or the send now and the receive later (`return_recv_hook`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phases {
    SendAndReceive = 3,
    Send = 1,
    Receive = 2,
}

/// `LlRegion` of low_latency.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LlRegion {
    data: [u64; 2],
    counts: [u64; 2],
    flags: [u64; 2],
}

fn invalid(what: &'static str, message: String) -> BufferError {
    BufferError::invalid(what, message)
}

/// The shape checks every low-latency call shares: DeepEP's, plus our limits.
fn check_shape(
    what: &'static str,
    layout: &LlLayout,
    num_topk: usize,
    num_rdma_bytes: usize,
) -> Result<(), BufferError> {
    let LlLayout {
        max_tokens,
        hidden,
        num_ranks,
        num_experts,
    } = *layout;
    if max_tokens == 0 {
        return Err(invalid(
            what,
            "num_max_dispatch_tokens_per_rank must be positive".into(),
        ));
    }
    if num_experts == 0 || !num_experts.is_multiple_of(num_ranks) || num_experts > MAX_EXPERTS {
        return Err(invalid(
            what,
            format!(
                "num_experts = {num_experts} must be a positive multiple of the {num_ranks} \
                 ranks and at most {MAX_EXPERTS}"
            ),
        ));
    }
    if hidden == 0 || !hidden.is_multiple_of(128) || hidden > MAX_HIDDEN {
        return Err(invalid(
            what,
            format!(
                "hidden = {hidden} is not supported: the kernels take any multiple of 128 (one \
                 fp8 scale per 128 channels) up to {MAX_HIDDEN}, e.g. 2048, 2560, 4096, 5120, \
                 6144, 7168, 8192"
            ),
        ));
    }
    if num_topk > MAX_TOPK {
        return Err(invalid(
            what,
            format!("top-k = {num_topk}: at most {MAX_TOPK} experts per token"),
        ));
    }
    let needed = get_low_latency_rdma_size_hint(max_tokens, hidden, num_ranks, num_experts);
    if num_rdma_bytes < needed {
        return Err(invalid(
            what,
            format!(
                "the buffer's num_rdma_bytes = {num_rdma_bytes} is smaller than the {needed} this \
                 shape needs (T = {max_tokens}, hidden = {hidden}, {num_ranks} ranks, \
                 {num_experts} experts): create the buffer with num_rdma_bytes = \
                 Buffer.get_low_latency_rdma_size_hint({max_tokens}, {hidden}, {num_ranks}, \
                 {num_experts})"
            ),
        ));
    }
    Ok(())
}

fn optional_vector(
    what: &'static str,
    name: &str,
    view: &Option<View>,
    elem: ElemType,
    len: usize,
) -> Result<u64, BufferError> {
    match view {
        Some(v) => {
            v.expect(what, name, elem, &[Some(len)])?;
            Ok(v.ptr)
        }
        None => Ok(0),
    }
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// The layout of a call's shape on this buffer, checked (`check_shape`): a shape the
    /// kernels take, with `num_topk` experts per token, that fits in num_rdma_bytes.
    fn ll_layout(
        &self,
        what: &'static str,
        max_tokens: usize,
        hidden: usize,
        num_experts: usize,
        num_topk: usize,
    ) -> Result<LlLayout, BufferError> {
        let layout = LlLayout {
            max_tokens,
            hidden,
            num_ranks: self.world().n_pes(),
            num_experts,
        };
        check_shape(what, &layout, num_topk, self.options.num_rdma_bytes)?;
        Ok(layout)
    }

    /// What every low-latency call checks first: the mode, and (except before a receive,
    /// whose send is out, so the call must complete on this rank) the buffer's error records.
    fn begin_ll_call(&self, what: &'static str, phases: Phases) -> Result<(), BufferError> {
        self.require_low_latency(what)?;
        if phases != Phases::Receive {
            self.check()?;
        }
        Ok(())
    }

    fn require_low_latency(&self, what: &'static str) -> Result<(), BufferError> {
        if !self.options.low_latency_mode {
            return Err(invalid(
                what,
                "this buffer was made without low_latency_mode: create it with \
                 low_latency_mode=True and num_rdma_bytes = get_low_latency_rdma_size_hint(...)"
                    .into(),
            ));
        }
        Ok(())
    }

    fn ll_parts(&self) -> LlParts {
        LlParts::new(self.options.num_rdma_bytes)
    }

    fn ll_region(&self) -> LlRegion {
        let (base, _) = self.local_region(true);
        let parts = self.ll_parts();
        let at = |offset: usize| base + offset as u64;
        LlRegion {
            data: [at(parts.half(0)), at(parts.half(1))],
            counts: [at(LlParts::counts(0)), at(LlParts::counts(1))],
            flags: [at(LlParts::flags(0)), at(LlParts::flags(1))],
        }
    }

    fn ll_state(&self) -> u64 {
        let (ptr, _) = self.ll_state.device_ptr(self.world().stream());
        ptr
    }

    /// One call in flight: a send phase's receive must run before the next call starts, be of
    /// the same operation and shape, and follow a send (the kernels number calls on the
    /// device, so a second send would reuse the first one's call number and slots).
    fn check_phases(
        &self,
        what: &'static str,
        phases: Phases,
        shape: &LlLayout,
    ) -> Result<(), BufferError> {
        let pending = *self
            .ll_receive_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let this = PendingReceive {
            op: what,
            shape: *shape,
        };
        match (phases, pending) {
            (Phases::Receive, None) => Err(invalid(
                what,
                "no send phase is waiting for this receive: call each receive hook once".into(),
            )),
            (Phases::Receive, Some(sent)) if sent != this => Err(invalid(
                what,
                format!(
                    "this receive does not match the pending send ({} of {:?}): call the hook \
                     that call returned",
                    sent.op, sent.shape
                ),
            )),
            (Phases::Send | Phases::SendAndReceive, Some(sent)) => Err(invalid(
                what,
                format!(
                    "the receive hook of the previous {} has not been called: call it first \
                     (one low-latency call in flight per buffer)",
                    sent.op
                ),
            )),
            _ => Ok(()),
        }
    }

    fn ll_launch<A>(
        &self,
        kernel: &Kernel,
        args: &A,
        phases: Phases,
        pending: PendingReceive,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let spec = LaunchSpec {
            kernel: kernel.symbol()?,
            num_blocks: self.kernels.num_sms(),
            threads_per_block: THREADS_PER_BLOCK,
            shared_mem_bytes: 0,
        };
        let ws = self.workspace();
        let code = phases as i32;
        self.launch(spec, stream, &mut [arg(&ws), arg(args), arg(&code)])?;
        *self
            .ll_receive_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = (phases == Phases::Send).then_some(pending);
        Ok(())
    }

    /// DeepEP's `get_next_low_latency_combine_buffer`: the staging rows a zero-copy combine
    /// reads, [L x R x T, H] bf16 (a view of this rank's region; fill it, then combine with
    /// `x: None`).
    pub fn next_low_latency_combine_buffer(
        &self,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
    ) -> Result<View, BufferError> {
        const WHAT: &str = "get_next_low_latency_combine_buffer";
        self.require_low_latency(WHAT)?;
        self.ll_layout(
            WHAT,
            num_max_dispatch_tokens_per_rank,
            hidden,
            num_experts,
            0,
        )?;
        let rows = num_experts * num_max_dispatch_tokens_per_rank;
        Ok(View::matrix(
            self.local_region(true).0 + self.ll_parts().staging() as u64,
            rows,
            hidden,
            ElemType::Bf16,
        ))
    }

    /// DeepEP's `clean_low_latency_buffer` (collective): zeroes the control words and the
    /// call count on every rank, between two barriers. The protocol never needs it (flags
    /// only grow, nothing is left to clean between calls); it exists for DeepEP's API and
    /// as a known starting point. It does not revive a buffer whose kernel timed out (that
    /// failure is the communicator's, and final): destroy such a buffer.
    ///
    /// # Safety
    /// `stream` must be a live stream of this buffer's CUDA context.
    pub unsafe fn clean_low_latency_buffer(
        &self,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "clean_low_latency_buffer";
        self.require_low_latency(WHAT)?;
        self.ll_layout(
            WHAT,
            num_max_dispatch_tokens_per_rank,
            hidden,
            num_experts,
            0,
        )?;
        self.comm.sync_all_raw(stream)?;
        let cuda = |e| {
            BufferError::from(CollError::Cuda {
                what: "zeroing the low-latency control words",
                source: e,
            })
        };
        // SAFETY: the control words of this rank's region and its state, both device memory
        // of this context; the stream orders the memsets between the two barriers.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.local_region(true).0,
                0,
                CONTROL_BYTES,
                stream,
            )
            .map_err(cuda)?;
            cudarc::driver::result::memset_d8_async(self.ll_state(), 0, STATE_WORDS * 8, stream)
                .map_err(cuda)?;
        }
        self.comm.sync_all_raw(stream)?;
        *self
            .ll_receive_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_parts_are_ordered_aligned_and_large_enough() {
        let layout = LlLayout {
            max_tokens: 128,
            hidden: 7168,
            num_ranks: 2,
            num_experts: 288,
        };
        assert_eq!(layout.dispatch_msg_bytes(false), 16 + 14336);
        assert_eq!(layout.dispatch_msg_bytes(true), 16 + 7168 + 56 * 4);
        // hidden = 128 x 3: 12 bytes of scales, padded so that the next slot stays aligned.
        let odd = LlLayout {
            hidden: 384,
            ..layout
        };
        assert_eq!(
            odd.dispatch_msg_bytes(true),
            (16 + 384 + 12usize).next_multiple_of(16)
        );
        // A half holds every bf16 message and every combine row.
        assert!(layout.half_bytes() >= 288 * 128 * (16 + 14336));
        let hint = get_low_latency_rdma_size_hint(128, 7168, 2, 288);
        assert_eq!(hint, layout.total_bytes().next_multiple_of(128));
        // In a region of the hint's size, every part holds what the shape needs.
        let parts = LlParts::new(hint);
        assert!(parts.part_bytes >= layout.half_bytes());
        assert!(parts.staging() + parts.part_bytes <= hint);
        for offset in [parts.half(0), parts.half(1), parts.staging()] {
            assert_eq!(offset % 256, 0);
        }
        assert!(LlParts::counts(1) + MAX_EXPERTS * 8 <= CONTROL_BYTES);
        // A smaller shape in the same region uses the same parts.
        let small = LlLayout {
            hidden: 2048,
            ..layout
        };
        assert!(small.half_bytes() <= parts.part_bytes);
    }

    #[test]
    fn shapes_outside_the_kernels_limits_are_refused_with_the_limit() {
        let layout = |hidden| LlLayout {
            max_tokens: 128,
            hidden,
            num_ranks: 2,
            num_experts: 288,
        };
        let room = |hidden| get_low_latency_rdma_size_hint(128, hidden, 2, 288);
        assert!(check_shape("dispatch", &layout(MAX_HIDDEN), 8, room(MAX_HIDDEN)).is_ok());
        for hidden in [0, 2000, MAX_HIDDEN + 128] {
            let error = check_shape("dispatch", &layout(hidden), 8, room(hidden))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("multiple of 128") && error.contains("up to 32768"),
                "{error}"
            );
        }
    }

    #[test]
    fn state_words_cover_the_kernel_state() {
        // calls (8 x MAX_BLOCKS) + finish (4 x MAX_PES) + slots (4 x MAX_EXPERTS)
        const { assert!(STATE_WORDS * 8 >= 8 * MAX_BLOCKS + 4 * MAX_PES + 4 * MAX_EXPERTS) };
    }
}
