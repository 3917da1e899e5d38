//! The notify step (kernels/cuda/buffer/notify.cu): every rank tells every other how many
//! tokens to expect, per channel and per expert, through chapter 4's all-gather; then each
//! rank's prefix sums give the first three matrices of the handle.

use std::ops::Deref;
use std::time::{Duration, Instant};

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;
use kernels::contract::{InputError, NOTIFY_THREADS};

use crate::buffer::{Blocks, NvshmemBuffer, arg};
use crate::checks;
use crate::config::Config;
use crate::error::BufferError;
use crate::regions::row_ints;
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

/// The notify step's inputs: the layout of this rank's tokens (`get_dispatch_layout`'s).
#[derive(Debug, Clone, Copy)]
pub struct NotifyInputs {
    /// [R] i32. Only compared, on the GPU, with what `is_token_in_rank` sends to each rank (a
    /// difference is `BufferError::CountsMismatch` at the next check): the routing decides
    /// every count the dispatch relies on.
    pub num_tokens_per_rank: View,
    /// [E] i32: summed over ranks into the tokens per local expert the host gets back, and
    /// used for nothing else.
    pub num_tokens_per_expert: View,
    /// [N, R] bool: which ranks each token goes to.
    pub is_token_in_rank: View,
    pub expert_alignment: usize,
}

/// The notify step's outputs: the first three elements of the handle.
#[derive(Debug, Clone, Copy)]
pub struct NotifyOutputs {
    pub rank_prefix_matrix: View,
    pub channel_prefix_matrix: View,
    pub recv_channel_prefix_matrix: View,
}

/// What this rank will receive, from the notify step's host-mapped counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvCounts {
    pub num_recv_tokens: usize,
    /// Tokens per local expert, each rounded up to `expert_alignment`.
    pub per_local_expert: Vec<i32>,
}

/// A checked notify step: `moe_notify_prepare` (one block per destination), the all-gather
/// of every rank's row, `moe_notify_finish` (one block).
#[derive(Debug, Clone, Copy)]
pub struct NotifyPlan {
    pub inputs: NotifyInputs,
    pub outputs: NotifyOutputs,
    pub num_tokens: i32,
    pub n_pes: i32,
    pub my_pe: i32,
    pub num_channels: i32,
    pub num_experts: i32,
    pub expert_alignment: i32,
    /// This rank's row and everyone's (symmetric), and a row's bytes.
    pub my_row: u64,
    pub rows: u64,
    pub row_bytes: usize,
    pub num_local_experts: usize,
    /// Where `moe_notify_prepare` records num_tokens_per_rank that disagrees with the routing.
    pub input_error: InputError,
}

// ANCHOR: plan_notify
/// Checks a notify step for `config` (its channels) and plans it.
pub fn plan_notify(
    spec: &BufferSpec,
    config: &Config,
    inputs: &NotifyInputs,
    outputs: &NotifyOutputs,
) -> Result<NotifyPlan, BufferError> {
    const WHAT: &str = "dispatch";
    let (n, c) = checks::intranode_call(WHAT, spec, config)?;
    let num_experts = checks::experts_counted(WHAT, &inputs.num_tokens_per_expert, n)?;
    let (r, ch) = (Some(n), Some(c));
    inputs
        .num_tokens_per_rank
        .expect(WHAT, "num_tokens_per_rank", ElemType::I32, &[r])?;
    inputs
        .num_tokens_per_expert
        .expect(WHAT, "num_tokens_per_expert", ElemType::I32, &[None])?;
    inputs
        .is_token_in_rank
        .expect(WHAT, "is_token_in_rank", ElemType::Bool, &[None, r])?;
    let named = [
        (&outputs.rank_prefix_matrix, "rank_prefix_matrix", r),
        (&outputs.channel_prefix_matrix, "channel_prefix_matrix", ch),
        (
            &outputs.recv_channel_prefix_matrix,
            "recv_channel_prefix_matrix",
            ch,
        ),
    ];
    for (view, name, cols) in named {
        view.expect(WHAT, name, ElemType::I32, &[r, cols])?;
    }
    if inputs.expert_alignment == 0 || inputs.expert_alignment > i32::MAX as usize {
        return Err(BufferError::invalid(
            WHAT,
            format!(
                "expert_alignment = {} must be at least 1",
                inputs.expert_alignment
            ),
        ));
    }
    let (my_row, rows) = spec.notify_rows();
    Ok(NotifyPlan {
        inputs: *inputs,
        outputs: *outputs,
        num_tokens: inputs.is_token_in_rank.rows() as i32,
        n_pes: n as i32,
        my_pe: spec.my_pe as i32,
        num_channels: c as i32,
        num_experts: num_experts as i32,
        expert_alignment: inputs.expert_alignment as i32,
        my_row,
        rows,
        row_bytes: row_ints(n, num_experts, c) * 4,
        num_local_experts: num_experts / n,
        input_error: spec.input_error,
    })
}
// ANCHOR_END: plan_notify

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: notify
    /// The notify step, on `stream` (see `plan_notify`). With `wait`, blocks (bounded, from
    /// the moment its first kernel starts) until the counts reached the host and returns them:
    /// what a dispatch needs to size its outputs. Without (the fixed-size `num_worst_tokens`
    /// path, CUDA graphs), returns at once.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`.
    pub unsafe fn notify_raw(
        &self,
        inputs: &NotifyInputs,
        outputs: &NotifyOutputs,
        config: &Config,
        wait: bool,
        stream: sys::CUstream,
    ) -> Result<Option<RecvCounts>, BufferError> {
        self.check()?;
        let p = plan_notify(&self.spec, config, inputs, outputs)?;
        if wait {
            self.counts.write_i32(0, -1); // the kernel writes the total last: -1 = not yet
            // SAFETY: the caller vouches for the stream.
            unsafe { self.mark_started(stream) }?;
        }
        // SAFETY: a checked plan; the caller vouches for the views and the stream.
        unsafe { self.launch_notify_prepare(&p, stream) }?;
        self.comm
            .all_gather_raw(p.rows, p.my_row, p.row_bytes, None, stream)?;
        // SAFETY: as above.
        unsafe { self.launch_notify_finish(&p, stream) }?;
        if !wait {
            return Ok(None);
        }
        self.wait_for_counts(p.num_local_experts).map(Some)
    }
    // ANCHOR_END: notify

    /// `moe_notify_prepare`, one block per destination rank: the kernel's parameters in
    /// order.
    ///
    /// # Safety
    /// `p` comes from `plan_notify`; its views and `stream` are live.
    unsafe fn launch_notify_prepare(
        &self,
        p: &NotifyPlan,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        // SAFETY: the caller's; each block counts one destination on its own.
        unsafe {
            self.launch(
                notify_kernel("moe_notify_prepare", p.n_pes as u32),
                Blocks::Independent,
                stream,
                &mut [
                    arg(&p.inputs.is_token_in_rank.ptr),
                    arg(&p.num_tokens),
                    arg(&p.n_pes),
                    arg(&p.num_channels),
                    arg(&p.num_experts),
                    arg(&p.inputs.num_tokens_per_rank.ptr),
                    arg(&p.inputs.num_tokens_per_expert.ptr),
                    arg(&p.outputs.channel_prefix_matrix.ptr),
                    arg(&p.my_row),
                    arg(&p.input_error),
                ],
            )
        }
    }

    /// `moe_notify_finish`, one block: the handle's prefix matrices and the host's counts.
    ///
    /// # Safety
    /// As `launch_notify_prepare`.
    unsafe fn launch_notify_finish(
        &self,
        p: &NotifyPlan,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        let counts = self.counts.device_ptr();
        // SAFETY: the caller's.
        unsafe {
            self.launch(
                notify_kernel("moe_notify_finish", 1),
                Blocks::MayWait,
                stream,
                &mut [
                    arg(&p.rows),
                    arg(&p.n_pes),
                    arg(&p.my_pe),
                    arg(&p.num_channels),
                    arg(&p.num_experts),
                    arg(&p.expert_alignment),
                    arg(&p.outputs.rank_prefix_matrix.ptr),
                    arg(&p.outputs.recv_channel_prefix_matrix.ptr),
                    arg(&counts),
                ],
            )
        }
    }

    /// Spins on the host-mapped total the notify kernel writes last. The bound counts from
    /// when the step's first kernel started (an event recorded before it), not from when it
    /// was queued: a long queue of compute ahead of it is not a timeout. A queue that does not
    /// reach it within `QUEUE_BOUND` timeouts is one.
    pub(crate) fn wait_for_counts(
        &self,
        num_local_experts: usize,
    ) -> Result<RecvCounts, BufferError> {
        const QUEUE_BOUND: u32 = 10;
        let timeout_ms = self.spec.options.timeout_ms;
        let timeout = Duration::from_millis(timeout_ms);
        let queued = Instant::now();
        let mut started: Option<Instant> = None;
        loop {
            let total = self.counts.read_i32(0);
            if total >= 0 {
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                let per_local_expert = (0..num_local_experts)
                    .map(|e| self.counts.read_i32(1 + e))
                    .collect();
                return Ok(RecvCounts {
                    num_recv_tokens: total as usize,
                    per_local_expert,
                });
            }
            self.check()?; // a kernel that failed will never write the counts
            let now = Instant::now();
            match started {
                None if self.has_started()? => started = Some(now),
                None if now > queued + timeout * QUEUE_BOUND => {
                    return Err(BufferError::NotifyTimeout {
                        me: self.world().my_pe(),
                        timeout_ms,
                        started: false,
                    });
                }
                Some(at) if now > at + timeout => {
                    ch01_bootstrap::world::mark_broken(); // a peer never arrived
                    return Err(BufferError::NotifyTimeout {
                        me: self.world().my_pe(),
                        timeout_ms,
                        started: true,
                    });
                }
                _ => {}
            }
            std::hint::spin_loop();
        }
    }
}

/// A notify kernel's launch shape.
fn notify_kernel(kernel: &'static str, num_blocks: u32) -> LaunchSpec {
    LaunchSpec {
        kernel,
        num_blocks,
        threads_per_block: NOTIFY_THREADS,
        shared_mem_bytes: 0,
    }
}
