//! The layout step and the notify step: from each token's experts, who gets what; then every
//! rank tells every other how many tokens to expect, through chapter 4's all-gather.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;

use crate::buffer::{NvshmemBuffer, arg};
use crate::config::{Config, MAX_EXPERTS};
use crate::error::BufferError;
use crate::layout::{Regions, row_ints};
use crate::view::{ElemType, View};
use kernels::contract::MAX_TOPK;

/// What `get_dispatch_layout` fills: tokens per rank [R] i32, per expert [E] i32, and the
/// routing [N, R] bool.
#[derive(Debug, Clone, Copy)]
pub struct LayoutOutputs {
    pub num_tokens_per_rank: View,
    pub num_tokens_per_expert: View,
    pub is_token_in_rank: View,
}

/// The notify step's inputs: the layout of this rank's tokens.
#[derive(Debug, Clone, Copy)]
pub struct NotifyInputs {
    pub num_tokens_per_rank: View,
    pub num_tokens_per_expert: View,
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

fn cuda_error(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> BufferError {
    move |source| ch04_collectives::CollError::Cuda { what, source }.into()
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: get_dispatch_layout
    /// From `topk_idx` [N, K] i64 (global expert ids, -1 for none): how many tokens go to
    /// each rank and expert, and which ranks each token goes to. Local: no communication.
    /// An id outside -1..num_experts is reported by the next `check()` (every dispatch makes
    /// one), as `BufferError::BadExpert`.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU:
    /// nothing on the host can check a device address, and the kernels write the outputs.
    pub unsafe fn get_dispatch_layout(
        &self,
        topk_idx: &View,
        num_experts: usize,
        out: &LayoutOutputs,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        const WHAT: &str = "get_dispatch_layout";
        self.check()?;
        let n = self.world().n_pes();
        if num_experts == 0 || !num_experts.is_multiple_of(n) || num_experts > MAX_EXPERTS {
            return Err(BufferError::invalid(
                WHAT,
                format!(
                    "num_experts = {num_experts} must be a positive multiple of the {n} ranks, at most {MAX_EXPERTS}"
                ),
            ));
        }
        topk_idx.expect(WHAT, "topk_idx", ElemType::I64, &[None, None])?;
        let (num_tokens, num_topk) = (topk_idx.rows(), topk_idx.cols());
        if num_topk > MAX_TOPK {
            return Err(BufferError::invalid(
                WHAT,
                format!("{num_topk} experts per token; at most {MAX_TOPK}"),
            ));
        }
        out.num_tokens_per_rank
            .expect(WHAT, "num_tokens_per_rank", ElemType::I32, &[Some(n)])?;
        out.num_tokens_per_expert.expect(
            WHAT,
            "num_tokens_per_expert",
            ElemType::I32,
            &[Some(num_experts)],
        )?;
        out.is_token_in_rank.expect(
            WHAT,
            "is_token_in_rank",
            ElemType::Bool,
            &[Some(num_tokens), Some(n)],
        )?;
        for (view, bytes) in [
            (&out.num_tokens_per_rank, n * 4),
            (&out.num_tokens_per_expert, num_experts * 4),
        ] {
            // SAFETY: the views were checked to hold these many bytes.
            unsafe { cudarc::driver::result::memset_d8_async(view.ptr, 0, bytes, stream) }
                .map_err(cuda_error("zeroing the layout counts"))?;
        }
        let spec = LaunchSpec {
            kernel: "moe_layout",
            num_blocks: num_tokens
                .div_ceil(256)
                .clamp(1, self.kernels.num_sms() as usize) as u32,
            threads_per_block: 256,
            shared_mem_bytes: ((n + num_experts) * 4) as u32,
        };
        let (num_tokens, num_topk, num_experts, n) = (
            num_tokens as i32,
            num_topk as i32,
            num_experts as i32,
            n as i32,
        );
        let input_error = self.input_error_args();
        self.launch(
            spec,
            stream,
            &mut [
                arg(&topk_idx.ptr),
                arg(&num_tokens),
                arg(&num_topk),
                arg(&num_experts),
                arg(&n),
                arg(&out.num_tokens_per_rank.ptr),
                arg(&out.num_tokens_per_expert.ptr),
                arg(&out.is_token_in_rank.ptr),
                arg(&input_error),
            ],
        )
    }
    // ANCHOR_END: get_dispatch_layout

    // ANCHOR: notify
    /// The notify step, on `stream`: this rank's per-channel counts, one all-gather of every
    /// rank's row (chapter 4, one LL traversal), then this rank's prefix sums into the three
    /// matrices of the handle. With `wait`, blocks (bounded) until the counts reached the
    /// host and returns them: what a dispatch needs to size its outputs. Without (the
    /// fixed-size `num_worst_tokens` path, CUDA graphs), returns at once.
    ///
    /// # Safety
    /// Every [`View`] must describe live memory of its shape and type on this PE's GPU:
    /// nothing on the host can check a device address, and the kernels write the outputs.
    pub unsafe fn notify(
        &self,
        inputs: &NotifyInputs,
        outputs: &NotifyOutputs,
        config: &Config,
        wait: bool,
        stream: sys::CUstream,
    ) -> Result<Option<RecvCounts>, BufferError> {
        const WHAT: &str = "dispatch";
        self.check()?;
        let n = self.world().n_pes();
        config.check_for_launch(n)?;
        let c = config.num_channels();
        let num_experts = inputs.num_tokens_per_expert.rows();
        let num_tokens = inputs.is_token_in_rank.rows();
        if num_experts == 0 || !num_experts.is_multiple_of(n) || num_experts > MAX_EXPERTS {
            return Err(BufferError::invalid(
                WHAT,
                format!(
                    "num_tokens_per_expert has {num_experts} entries: a positive multiple of the {n} ranks, at most {MAX_EXPERTS}"
                ),
            ));
        }
        inputs.num_tokens_per_rank.expect(
            WHAT,
            "num_tokens_per_rank",
            ElemType::I32,
            &[Some(n)],
        )?;
        inputs.num_tokens_per_expert.expect(
            WHAT,
            "num_tokens_per_expert",
            ElemType::I32,
            &[None],
        )?;
        inputs.is_token_in_rank.expect(
            WHAT,
            "is_token_in_rank",
            ElemType::Bool,
            &[None, Some(n)],
        )?;
        outputs.rank_prefix_matrix.expect(
            WHAT,
            "rank_prefix_matrix",
            ElemType::I32,
            &[Some(n), Some(n)],
        )?;
        outputs.channel_prefix_matrix.expect(
            WHAT,
            "channel_prefix_matrix",
            ElemType::I32,
            &[Some(n), Some(c)],
        )?;
        outputs.recv_channel_prefix_matrix.expect(
            WHAT,
            "recv_channel_prefix_matrix",
            ElemType::I32,
            &[Some(n), Some(c)],
        )?;
        if inputs.expert_alignment == 0 {
            return Err(BufferError::invalid(
                WHAT,
                "expert_alignment must be at least 1",
            ));
        }
        let my_row = self.base + Regions::my_row() as u64;
        let rows = self.base + Regions::gathered_rows() as u64;
        let row_bytes = row_ints(n, num_experts, c) * 4;
        let (ni, ci, ei, ti) = (n as i32, c as i32, num_experts as i32, num_tokens as i32);
        let prepare = LaunchSpec {
            kernel: "moe_notify_prepare",
            num_blocks: n as u32,
            threads_per_block: 256,
            shared_mem_bytes: 0,
        };
        self.launch(
            prepare,
            stream,
            &mut [
                arg(&inputs.is_token_in_rank.ptr),
                arg(&ti),
                arg(&ni),
                arg(&ci),
                arg(&ei),
                arg(&inputs.num_tokens_per_rank.ptr),
                arg(&inputs.num_tokens_per_expert.ptr),
                arg(&outputs.channel_prefix_matrix.ptr),
                arg(&my_row),
            ],
        )?;
        self.comm
            .all_gather_raw(rows, my_row, row_bytes, None, stream)?;
        if wait {
            self.counts.write_i32(0, -1); // the kernel writes the total last: -1 = not yet
        }
        let (me, align, counts) = (
            self.world().my_pe() as i32,
            inputs.expert_alignment as i32,
            self.counts.device_ptr(),
        );
        let finish = LaunchSpec {
            kernel: "moe_notify_finish",
            num_blocks: 1,
            threads_per_block: 256,
            shared_mem_bytes: 0,
        };
        self.launch(
            finish,
            stream,
            &mut [
                arg(&rows),
                arg(&ni),
                arg(&me),
                arg(&ci),
                arg(&ei),
                arg(&align),
                arg(&outputs.rank_prefix_matrix.ptr),
                arg(&outputs.recv_channel_prefix_matrix.ptr),
                arg(&counts),
            ],
        )?;
        if !wait {
            return Ok(None);
        }
        self.wait_for_counts(num_experts / n).map(Some)
    }
    // ANCHOR_END: notify

    /// Spins (bounded) on the host-mapped total the notify kernel writes last.
    fn wait_for_counts(&self, num_local_experts: usize) -> Result<RecvCounts, BufferError> {
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(self.options.timeout_ms);
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
            if std::time::Instant::now() > deadline {
                return Err(BufferError::NotifyTimeout {
                    me: self.world().my_pe(),
                    timeout_ms: self.options.timeout_ms,
                });
            }
            std::hint::spin_loop();
        }
    }
}
