//! Chapter 8: low-latency mode. Dispatch and combine for decoding: fixed slots instead of a
//! count exchange, device-side call numbers instead of host state, so one dispatch and one
//! combine can be captured in a CUDA graph and replayed with new data
//! (kernels/cuda/buffer/low_latency.cuh has the protocol and its NOTES; ll_dispatch.cu and
//! ll_combine.cu the kernels).
//!
//! `layout.rs` holds the region's layout (its size formulas) and the shape checks,
//! `dispatch.rs` and `combine.rs` the two calls, and this module what they share: the kernels,
//! the one-call-in-flight rule and the launch.

mod combine;
mod dispatch;
mod layout;

pub use combine::{LlCombineInputs, LlHandle};
pub use dispatch::{LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs};
pub use layout::{CONTROL_BYTES, LlLayout, LlParts, get_low_latency_rdma_size_hint};
use layout::{check_shape, invalid};

use std::ops::Deref;
use std::sync::OnceLock;

use ch01_bootstrap::World;
use cudarc::driver::{DevicePtr, sys};

use crate::buffer::{NvshmemBuffer, arg};
use crate::error::BufferError;
use crate::view::{ElemType, View};
use ch04_collectives::{CollError, LaunchSpec};
use kernels::contract::{LL_THREADS, LlRegion, LlState};

/// u64 words of the per-rank device state (`LlState` of the contract).
pub(crate) const STATE_WORDS: usize = std::mem::size_of::<LlState>().div_ceil(8);

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
    /// The layout of a call's shape on this buffer, checked: a low-latency buffer, and
    /// (`check_shape`) a shape the kernels take, with `num_topk` experts per token, that fits
    /// in num_rdma_bytes.
    fn ll_layout(
        &self,
        what: &'static str,
        max_tokens: usize,
        hidden: usize,
        num_experts: usize,
        num_topk: usize,
    ) -> Result<LlLayout, BufferError> {
        self.require_low_latency(what)?;
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
            threads_per_block: LL_THREADS,
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
