//! What low-latency dispatch and combine share at launch: their kernels (one symbol each,
//! launched with a phase argument), the launch itself with the one-call-in-flight state, and
//! DeepEP's two helpers on the region (`get_next_low_latency_combine_buffer`,
//! `clean_low_latency_buffer`).

use std::ops::Deref;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;

use ch01_bootstrap::World;
use ch04_collectives::{CollError, LaunchSpec};
use cudarc::driver::sys;
use kernels::contract::{LL_THREADS, LlBarrierArgs};

use crate::buffer::{Blocks, NvshmemBuffer, arg};
use crate::error::BufferError;
use crate::low_latency::phases::{PendingReceive, Phases};
use crate::low_latency::regions::{COUNTS_BYTES, LlShape, check_shape, invalid};
use crate::mode_sharing::{RdmaUser, before_low_latency};
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

/// A checked low-latency call: the kernel's argument struct, the phases to run, and the send
/// left waiting for its receive after the launch.
#[derive(Debug, Clone, Copy)]
pub struct LlPlan<A> {
    pub args: A,
    pub phases: Phases,
    pub pending_after: Option<PendingReceive>,
}

/// The argument struct of a low-latency kernel: `$args { the call's own fields, }` and the
/// fields both kernels take (kernels/contract/defs.rs), filled here once: the buffer's region,
/// state and error record from `spec`, the call's size from its checked `shape` and
/// `(num_tokens, num_topk)`. A macro, because the two structs are the contract's, with no
/// type in common.
macro_rules! ll_args {
    ($args:ident { $($own:tt)* }, $spec:expr, $shape:expr, ($num_tokens:expr, $num_topk:expr)) => {
        $args {
            $($own)*
            region: $spec.ll_region(),
            topo: $spec.ll_topology(),
            state: $spec.ll_state,
            bad_input: $spec.input_error,
            num_tokens: $num_tokens as i32,
            hidden: $shape.hidden as i32,
            num_topk: $num_topk as i32,
            num_experts: $shape.num_experts as i32,
            max_tokens: $shape.max_tokens as i32,
        }
    };
}
pub(crate) use ll_args;

/// The two kernels, each one symbol launched with a phase argument; their mangled names are
/// looked up once, not on every call.
pub(crate) static DISPATCH_KERNEL: Kernel = Kernel::new(
    "buffer/ll_dispatch",
    "nvshmem_tutorial::dispatch",
    "low_latency_dispatch",
);
pub(crate) static COMBINE_KERNEL: Kernel = Kernel::new(
    "buffer/ll_combine",
    "nvshmem_tutorial::combine",
    "low_latency_combine",
);
/// The barrier across nodes (`clean_low_latency_buffer` when the ranks span several).
pub(crate) static BARRIER_KERNEL: Kernel = Kernel::new(
    "buffer/ll_barrier",
    "nvshmem_tutorial::ll_barrier",
    "clean_low_latency_buffer",
);

/// A C++ kernel by module and `namespace::name`, its symbol found on first use, and the call
/// (DeepEP's name) that launches it.
pub(crate) struct Kernel {
    module: &'static str,
    name: &'static str,
    call: &'static str,
    symbol: OnceLock<&'static str>,
}

impl Kernel {
    const fn new(module: &'static str, name: &'static str, call: &'static str) -> Self {
        Self {
            module,
            name,
            call,
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

/// The shape of a low-latency call on the buffer of `spec`, checked (`check_shape`): a
/// low-latency buffer, and a shape the kernels take, with `num_topk` experts per token, that
/// fits in its num_rdma_bytes.
pub fn ll_shape(
    spec: &BufferSpec,
    what: &'static str,
    max_tokens: usize,
    hidden: usize,
    num_experts: usize,
    num_topk: usize,
) -> Result<LlShape, BufferError> {
    if !spec.options.low_latency_mode {
        return Err(invalid(
            what,
            "this buffer was made without low_latency_mode: create it with \
             low_latency_mode=True and num_rdma_bytes = get_low_latency_rdma_size_hint(...)"
                .into(),
        ));
    }
    let shape = LlShape {
        max_tokens,
        hidden,
        num_ranks: spec.n_pes,
        num_experts,
    };
    check_shape(what, &shape, num_topk, spec.options.num_rdma_bytes)?;
    Ok(shape)
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    /// A low-latency call: the error records, except before a receive (the send is out: the
    /// call must complete on this rank, whatever they say); then `plan` checks the call after
    /// the send now waiting for its receive; then the launch (one block per SM of this PE, the
    /// workspace, the argument struct and the phases) and what is pending after it.
    ///
    /// # Safety
    /// As `NvshmemBuffer::launch`: the plan's views are live on this GPU, `stream` is live.
    pub(crate) unsafe fn ll_launch<A>(
        &self,
        kernel: &Kernel,
        phases: Phases,
        stream: sys::CUstream,
        plan: impl FnOnce(Option<PendingReceive>) -> Result<LlPlan<A>, BufferError>,
    ) -> Result<(), BufferError> {
        // A send after a normal call across nodes needs the clean between (src/mode_sharing/);
        // a receive continues its send.
        let mut user = RdmaUser::LowLatency;
        if phases != Phases::Receive {
            self.check()?;
            user = before_low_latency(kernel.call, &self.spec, *self.rdma_user())?;
        }
        let pending = *self.ll_pending();
        let plan = plan(pending)?;
        let spec = LaunchSpec {
            kernel: kernel.symbol()?,
            num_blocks: self.kernels.num_sms(),
            threads_per_block: LL_THREADS,
            shared_mem_bytes: 0,
        };
        let ws = self.workspace();
        let phases = plan.phases as i32;
        let args = &mut [arg(&ws), arg(&plan.args), arg(&phases)];
        // SAFETY: forwarded to the caller.
        unsafe { self.launch(spec, Blocks::MayWait, stream, args) }?;
        *self.ll_pending() = plan.pending_after;
        *self.rdma_user() = user;
        Ok(())
    }

    /// The send waiting for its receive, under its lock.
    pub(crate) fn ll_pending(&self) -> std::sync::MutexGuard<'_, Option<PendingReceive>> {
        self.ll_receive_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The shared rdma region's last user, under its lock (src/mode_sharing/).
    pub(crate) fn rdma_user(&self) -> std::sync::MutexGuard<'_, RdmaUser> {
        self.rdma_user.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// DeepEP's `get_next_low_latency_combine_buffer`: the staging rows a zero-copy combine
    /// reads, [L x R x T, H] bf16 (a view of this rank's region; fill it, then combine with
    /// `x: None`). The view is valid while the buffer lives: typed.rs ties it to a borrow.
    pub fn next_low_latency_combine_buffer_raw(
        &self,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
    ) -> Result<View, BufferError> {
        const WHAT: &str = "get_next_low_latency_combine_buffer";
        let t = num_max_dispatch_tokens_per_rank;
        ll_shape(&self.spec, WHAT, t, hidden, num_experts, 0)?;
        Ok(View::matrix(
            self.spec.ll_staging(),
            num_experts * t,
            hidden,
            ElemType::Bf16,
        ))
    }

    /// DeepEP's `clean_low_latency_buffer` (collective): zeroes the count words and the
    /// call count on every rank, between two barriers. Between low-latency calls the protocol
    /// never needs it (count words only grow, nothing is left to clean between calls). After a
    /// normal call across nodes on this buffer it is required, as DeepEP's: its first barrier
    /// proves that no rank still uses the rings that share the region (src/mode_sharing/), and
    /// the next low-latency call is refused without it. It does not revive a buffer whose
    /// kernel timed out (that failure is the communicator's, and final): destroy such a buffer.
    ///
    /// # Safety
    /// `stream` must be a live stream of this buffer's context.
    pub unsafe fn clean_low_latency_buffer_raw(
        &self,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "clean_low_latency_buffer";
        let t = num_max_dispatch_tokens_per_rank;
        ll_shape(&self.spec, WHAT, t, hidden, num_experts, 0)?;
        // SAFETY: forwarded to the caller.
        unsafe { self.ll_barrier(stream) }?;
        let (region, state) = (self.spec.local_region(true).0, self.spec.ll_state);
        let what = "zeroing the low-latency count words";
        // SAFETY: the count words of this rank's region (not the barrier's words after them)
        // and its state, both device memory of this context; the stream orders the memsets
        // between the two barriers.
        unsafe {
            self.memset_zero(region, COUNTS_BYTES, stream, what)?;
            self.memset_zero(state, crate::buffer::LL_STATE_WORDS * 8, stream, what)?;
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.ll_barrier(stream) }?;
        *self.ll_pending() = None;
        *self.rdma_user() = RdmaUser::Clean;
        Ok(())
    }

    /// A barrier of every rank of the buffer, in stream order: chapter 4's signal barrier
    /// when they share one node (as before there were nodes), else `ll_barrier`, which
    /// crosses nodes with NVSHMEM's signal ops only.
    ///
    /// # Safety
    /// `stream` must be a live stream of this buffer's context.
    unsafe fn ll_barrier(&self, stream: sys::CUstream) -> Result<(), BufferError> {
        if self.spec.node_pes == self.spec.n_pes {
            return Ok(self.comm.sync_all_raw(stream)?);
        }
        let args = LlBarrierArgs {
            words: self.spec.ll_barrier_words(),
            target: self.ll_barriers.fetch_add(1, Ordering::Relaxed) + 1,
            topo: self.spec.ll_topology(),
        };
        let spec = LaunchSpec {
            kernel: BARRIER_KERNEL.symbol()?,
            num_blocks: 1,
            threads_per_block: LL_THREADS,
            shared_mem_bytes: 0,
        };
        let ws = self.workspace();
        // SAFETY: the barrier kernel's parameters, in order; its words are this buffer's.
        unsafe { self.launch(spec, Blocks::MayWait, stream, &mut [arg(&ws), arg(&args)]) }
    }
}
