//! The notify step (kernels/cuda/buffer/notify.cu): every rank tells every other how many
//! tokens to expect, per channel and per expert, through chapter 4's all-gather; then each
//! rank's prefix sums give the first three matrices of the handle.

use std::ops::Deref;
use std::time::{Duration, Instant};

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;
use kernels::contract::{NOTIFY_THREADS, NotifyFinishArgs, NotifyPrepareArgs};

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
/// of every rank's row (`prepare.row`, `row_bytes` each) into `finish.rows`,
/// `moe_notify_finish` (one block).
#[derive(Debug, Clone, Copy)]
pub struct NotifyPlan {
    pub prepare: NotifyPrepareArgs,
    /// `counts` is 0: the buffer's host-mapped counts, filled at launch.
    pub finish: NotifyFinishArgs,
    pub row_bytes: usize,
    pub num_local_experts: usize,
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
    let (n_pes, num_channels) = (n as i32, c as i32);
    Ok(NotifyPlan {
        prepare: NotifyPrepareArgs {
            is_token_in_rank: inputs.is_token_in_rank.ptr,
            num_tokens_per_rank: inputs.num_tokens_per_rank.ptr,
            num_tokens_per_expert: inputs.num_tokens_per_expert.ptr,
            channel_prefix_matrix: outputs.channel_prefix_matrix.ptr,
            row: my_row,
            bad_input: spec.input_error,
            num_tokens: inputs.is_token_in_rank.rows() as i32,
            n_pes,
            num_channels,
            num_experts: num_experts as i32,
        },
        finish: NotifyFinishArgs {
            rows,
            rank_prefix_matrix: outputs.rank_prefix_matrix.ptr,
            recv_channel_prefix_matrix: outputs.recv_channel_prefix_matrix.ptr,
            counts: 0, // the buffer's host-mapped counts, filled at launch
            n_pes,
            my_pe: spec.my_pe as i32,
            num_channels,
            num_experts: num_experts as i32,
            expert_alignment: inputs.expert_alignment as i32,
        },
        row_bytes: row_ints(n, num_experts, c) * 4,
        num_local_experts: num_experts / n,
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
        let prepare = notify_kernel("moe_notify_prepare", p.prepare.n_pes as u32);
        // SAFETY: a checked plan; the caller vouches for the views and the stream. Each block
        // counts one destination on its own.
        unsafe { self.launch(prepare, Blocks::Independent, stream, &mut [arg(&p.prepare)]) }?;
        let (rows, my_row) = (p.finish.rows, p.prepare.row);
        self.comm
            .all_gather_raw(rows, my_row, p.row_bytes, None, stream)?;
        let finish = NotifyFinishArgs {
            counts: self.counts.device_ptr(),
            ..p.finish
        };
        let one_block = notify_kernel("moe_notify_finish", 1);
        // SAFETY: as above.
        unsafe { self.launch(one_block, Blocks::MayWait, stream, &mut [arg(&finish)]) }?;
        if !wait {
            return Ok(None);
        }
        self.wait_for_counts(p.num_local_experts).map(Some)
    }
    // ANCHOR_END: notify

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
