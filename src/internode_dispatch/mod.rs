//! Normal mode's dispatch across nodes (issue 32, step 4; kernels/cuda/buffer/internode_dispatch.cu,
//! design: benchmarks/notes/buffer_internode_normal.md 2.6 and 7). After the full internode
//! notify (handle positions 1-6 and the host's counts), one launch of 2C blocks moves every
//! token once to each destination node, to the rank with our local index there (its RDMA
//! rings: put-with-signal per chunk), which forwards it to the node's ranks (NVL rings, peer
//! pointers inside the node). bf16 rows, or fp8 bytes with their scales (step 6: DeepEP's
//! strided `x_scales`, received row major), with or without top-k; with a full dispatch's
//! handle, the cached dispatch (step 7, `cached`); outputs of the notify's counts or of
//! `num_worst_tokens` (step 8), and a dispatch and combine pair for CUDA graphs
//! (`crate::internode_pair`).
//!
//! This module holds the call's types and the launch; `plan` every check and the argument
//! struct; `cached` the cached dispatch's types, plan and launch.

use std::ops::Deref;

use ch01_bootstrap::World;
use ch04_collectives::LaunchSpec;
use cudarc::driver::sys;
use kernels::contract::{CHANNEL_THREADS, InternodeDispatchArgs, MAX_CHANNELS};

use crate::buffer::NvshmemBuffer;
use crate::config::Config;
use crate::dispatch::DispatchInputs;
use crate::error::BufferError;
use crate::internode_notify::{InternodeHandle, InternodeNotifyCall};
use crate::view::View;

/// What the internode dispatch fills. M = rows received (`InternodeRecvCounts::num_recv_tokens`),
/// M_r = rows forwarded (`num_rdma_recv_tokens`), T tokens, N nodes of G ranks, K top-k. Or, as
/// DeepEP's `num_worst_tokens` W, M = M_r = W fixed before the call (the notify without `wait`:
/// no host sync, so a CUDA graph can hold the call; `crate::internode_pair` checks such a pair):
/// rows past those received keep their contents but for `recv_topk_idx` (-1), and a call that
/// delivers or forwards more rows than the outputs hold drops the rest and records
/// `BufferError::RecvOverflow`.
#[derive(Debug, Clone, Copy)]
pub struct InternodeDispatchOutputs {
    /// [M, H] of x's dtype (bf16, or fp8 e4m3 bytes): rows grouped by source rank, then
    /// channel, then token (DeepEP's order).
    pub recv_x: View,
    /// [M, S] of x_scales' dtype (f32 or int32), row major, with fp8 x only: each row's scales.
    pub recv_x_scales: Option<View>,
    /// [M, K] i64 local expert ids (-1: another rank's), with top-k only.
    pub recv_topk_idx: Option<View>,
    /// [M, K] f32 (0 where -1), with top-k only.
    pub recv_topk_weights: Option<View>,
    /// [M, 2] i32, handle 7: each row's source node and the ranks of our node it went to (a bit
    /// per local index): DeepEP's `SourceMeta` bytes at nodes of 8.
    pub recv_src_meta: View,
    /// [T, N] i32, handle 8: token t's index in its channel's stream to node k, -1 if not sent.
    pub send_rdma_head: View,
    /// [M_r, G] i32, handle 9: forwarded row j's index in its channel's stream to local rank l,
    /// -1 if not sent there (rows by source node, channel, position, as handles 3-4 count them).
    pub send_nvl_head: View,
}

/// A checked internode dispatch: the kernel's arguments and its channels (grid 2C).
#[derive(Debug, Clone, Copy)]
pub struct InternodeDispatchPlan {
    pub args: InternodeDispatchArgs,
    pub num_channels: usize,
}

mod cached;
#[cfg(test)]
mod cached_tests;
mod plan;
#[cfg(test)]
pub(crate) mod tests;

pub use cached::{
    InternodeCachedDispatchCall, InternodeCachedHandle, plan_internode_cached_dispatch,
};
pub use plan::plan_internode_dispatch;
pub(crate) use plan::{fits, rdma_ring, rdma_rings};

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: internode_dispatch
    /// The dispatch across nodes after a full `internode_notify_raw` with the same routing
    /// (`is_token_in_rank`, handle position 0) and `handle` (positions 1-6 it wrote), on
    /// `stream`. Collective: every rank makes the same calls in the same order.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`: the views are live device memory of this GPU, `stream` a
    /// live stream of this buffer's context, and the notify before it ran on the same stream.
    pub unsafe fn internode_dispatch_raw(
        &self,
        inputs: &DispatchInputs,
        is_token_in_rank: View,
        handle: &InternodeHandle,
        outputs: &InternodeDispatchOutputs,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_internode_dispatch(
            &self.spec,
            config,
            inputs,
            is_token_in_rank,
            handle,
            outputs,
        )?;
        // SAFETY: a checked plan; the caller vouches for the views and stream.
        unsafe {
            self.launch_internode(
                "internode_dispatch",
                config,
                plan.num_channels,
                &plan.args,
                stream,
            )
        }
    }
    // ANCHOR_END: internode_dispatch

    /// A call with a handle (a cached dispatch, or a combine): `check_resident` first, so that
    /// every rank refuses before the barrier alike, then the cached notify over the handle's
    /// `is_token_in_rank` and positions 1-6 (the entry barrier, as DeepEP's `cached_notify`),
    /// then `kernel` on its checked `args`.
    ///
    /// # Safety
    /// As `launch_internode`; `args` were planned for this buffer, `config` and this handle.
    pub(crate) unsafe fn launch_after_cached_notify<A>(
        &self,
        kernel: &'static str,
        (is_token_in_rank, prefixes): (View, &InternodeHandle),
        config: &Config,
        (num_channels, args): (usize, &A),
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check_resident(kernel, config, num_channels)?;
        let barrier = InternodeNotifyCall::Cached { is_token_in_rank };
        // SAFETY: forwarded to the caller; the notify plans the same buffer, config, handle and
        // routing the kernel's plan accepted.
        unsafe { self.internode_notify_raw(&barrier, prefixes, config, false, stream) }?;
        // SAFETY: forwarded to the caller.
        unsafe { self.launch_internode(kernel, config, num_channels, args, stream) }
    }

    /// Launches the internode dispatch or combine (`kernel`) on `num_channels` channels: 2C
    /// blocks of CHANNEL_THREADS, after `check_resident`.
    ///
    /// # Safety
    /// As `launch_resident`: `args` is the kernel's checked argument struct.
    pub(crate) unsafe fn launch_internode<A>(
        &self,
        kernel: &'static str,
        config: &Config,
        num_channels: usize,
        args: &A,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check_resident(kernel, config, num_channels)?;
        let spec = LaunchSpec {
            kernel,
            num_blocks: 2 * num_channels as u32,
            threads_per_block: CHANNEL_THREADS,
            shared_mem_bytes: 0,
        };
        // SAFETY: forwarded to the caller.
        unsafe { self.launch_resident(spec, args, stream) }
    }

    /// `Err` for `kernel` unless this PE keeps all 2C blocks of `num_channels` channels resident
    /// (senders, forwarders and receivers wait for each other). Public for callers that run the
    /// full notify and the dispatch as two calls: checked before the notify, every rank refuses
    /// alike and none waits for the others (the Python binding does).
    pub fn check_resident(
        &self,
        kernel: &'static str,
        config: &Config,
        num_channels: usize,
    ) -> Result<(), BufferError> {
        let max = self.internode_max_num_sms()?;
        if 2 * num_channels as u32 > max {
            return Err(BufferError::invalid(
                kernel,
                format!(
                    "Config.num_sms = {}: this PE can keep at most {max} blocks of the internode \
                     dispatch and combine resident (every block waits for others); use \
                     internode_max_num_sms()",
                    config.num_sms
                ),
            ));
        }
        Ok(())
    }

    /// The largest `Config::num_sms` (even) whose internode dispatch and combine grids, 2C
    /// blocks of CHANNEL_THREADS all resident, this PE can launch: the GPU's SMs with one PE
    /// per GPU, its share under MPS.
    pub fn internode_max_num_sms(&self) -> Result<u32, BufferError> {
        let mut most = 2 * MAX_CHANNELS as u32;
        for kernel in ["internode_dispatch", "internode_combine"] {
            most = most.min(self.kernels.max_co_resident(kernel, CHANNEL_THREADS, 0)?);
        }
        Ok(most & !1)
    }
}
