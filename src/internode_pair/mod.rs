//! A dispatch and combine pair across nodes that a CUDA graph can hold (issue 32, step 8). A
//! graph replays launches with the arguments of its capture and nothing on the host runs in
//! between, so no argument may depend on a call's counts and no call may wait for the GPU:
//! the full notify runs without its host wait, every output is sized by `num_worst_tokens`
//! (DeepEP's rule: its graphs need it too), and the combine takes the dispatch's handle as it
//! stands on the device. `plan_internode_pair` checks all of that on the CPU before anything
//! launches; `internode_pair_raw` issues the four launches (notify, dispatch, the combine's
//! cached notify, combine) with no host sync, so a stream capture around it records the pair
//! (the GPU test `internode-dispatch` captures one and replays it). A model with experts
//! between the two captures `internode_notify_raw` (no wait), `internode_dispatch_raw`, its
//! own kernels and `internode_combine_raw` the same way: this plan is the checklist.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;

use crate::buffer::NvshmemBuffer;
use crate::combine::{CombineInputs, CombineOutputs};
use crate::config::Config;
use crate::dispatch::DispatchInputs;
use crate::error::BufferError;
use crate::internode_combine::{
    InternodeCombineCall, InternodeCombineHandle, InternodeCombinePlan, plan_internode_combine,
};
use crate::internode_dispatch::{
    InternodeDispatchOutputs, InternodeDispatchPlan, plan_internode_dispatch,
};
use crate::internode_notify::{
    InternodeHandle, InternodeNotifyCall, InternodeNotifyInputs, InternodeNotifyPlan,
    plan_internode_notify,
};
use crate::spec::BufferSpec;

const WHAT: &str = "internode_pair";

#[cfg(test)]
mod tests;

/// One pair's views: DeepEP's `num_worst_tokens` W, the layout (the full notify's inputs,
/// routing included), handle positions 1-6 (written by the notify), the dispatch's inputs and
/// its outputs of W rows each (recv_x, its scales and top-k, recv_src_meta, send_nvl_head;
/// handle 7-9 among them), and the combine's: `combine.x` [W, H] bf16, a row per received row
/// (rows past those received are not read), and what it fills.
#[derive(Debug, Clone, Copy)]
pub struct InternodePair {
    pub num_worst_tokens: usize,
    pub layout: InternodeNotifyInputs,
    pub handle: InternodeHandle,
    pub dispatch: DispatchInputs,
    pub received: InternodeDispatchOutputs,
    pub combine: CombineInputs,
    pub combined: CombineOutputs,
}

impl InternodePair {
    /// The combine's call: its inputs, the dispatch's handle (routing, positions 1-6, heads),
    /// its outputs.
    pub fn combine_call(&self) -> InternodeCombineCall {
        InternodeCombineCall {
            inputs: self.combine,
            handle: InternodeCombineHandle {
                is_token_in_rank: self.layout.is_token_in_rank,
                prefixes: self.handle,
                send_rdma_head: self.received.send_rdma_head,
                send_nvl_head: self.received.send_nvl_head,
            },
            outputs: self.combined,
        }
    }
}

/// The pair's four launches, checked: none reads a count on the host.
#[derive(Debug, Clone, Copy)]
pub struct InternodePairPlan {
    /// The full notify (handle positions 1-6 and the host-mapped counts nobody waits for).
    pub notify: InternodeNotifyPlan,
    pub dispatch: InternodeDispatchPlan,
    /// The combine's cached notify (its entry barrier).
    pub barrier: InternodeNotifyPlan,
    pub combine: InternodeCombinePlan,
}

/// The pair's outputs and the combine's x of `worst` rows each (DeepEP's sizes), at most
/// i32::MAX.
fn check_worst(worst: usize, pair: &InternodePair) -> Result<(), BufferError> {
    if worst > i32::MAX as usize {
        return Err(BufferError::invalid(
            WHAT,
            format!("num_worst_tokens = {worst}: at most {} rows", i32::MAX),
        ));
    }
    let r = &pair.received;
    let sized = [
        ("recv_x", r.recv_x.rows()),
        ("recv_src_meta", r.recv_src_meta.rows()),
        ("send_nvl_head", r.send_nvl_head.rows()),
        ("the combine's x", pair.combine.x.rows()),
    ];
    for (name, rows) in sized {
        if rows != worst {
            return Err(BufferError::invalid(
                WHAT,
                format!(
                    "{name} has {rows} rows but num_worst_tokens = {worst}: in a pair every \
                     output is sized to it (recv_x, its scales and top-k, recv_src_meta, \
                     send_nvl_head, as DeepEP's) and the combine's x sends back a row per row of \
                     recv_x (rows past those received are not read)"
                ),
            ));
        }
    }
    Ok(())
}

// ANCHOR: plan_internode_pair
/// Checks `pair` for a CUDA graph under the dispatch's and the combine's configs, and plans its
/// four launches: every check of each call, and what a capture needs besides: outputs of
/// `num_worst_tokens` rows, the combine's x of as many, both configs on the same channels (the
/// handle's columns). Nothing in the plan depends on a count the GPU computes.
pub fn plan_internode_pair(
    spec: &BufferSpec,
    (dispatch_config, combine_config): (&Config, &Config),
    pair: &InternodePair,
) -> Result<InternodePairPlan, BufferError> {
    let worst = pair.num_worst_tokens;
    if worst == 0 {
        return Err(BufferError::invalid(
            WHAT,
            "num_worst_tokens = 0: a pair in a CUDA graph cannot wait on the host for the \
             notify's counts to size its outputs; size every output to num_worst_tokens (at \
             least the most rows a rank can receive or forward: the sum of every rank's tokens)",
        ));
    }
    if dispatch_config.num_sms != combine_config.num_sms {
        return Err(BufferError::invalid(
            WHAT,
            format!(
                "the combine's Config.num_sms = {} but the dispatch's is {}: the combine reads \
                 the handle the dispatch's channels made; give both configs the same num_sms",
                combine_config.num_sms, dispatch_config.num_sms
            ),
        ));
    }
    check_worst(worst, pair)?;
    let full = InternodeNotifyCall::Full(pair.layout);
    let cached = InternodeNotifyCall::Cached {
        is_token_in_rank: pair.layout.is_token_in_rank,
    };
    let routing = pair.layout.is_token_in_rank;
    Ok(InternodePairPlan {
        notify: plan_internode_notify(spec, dispatch_config, &full, &pair.handle)?,
        dispatch: plan_internode_dispatch(
            spec,
            dispatch_config,
            &pair.dispatch,
            routing,
            &pair.handle,
            &pair.received,
        )?,
        barrier: plan_internode_notify(spec, combine_config, &cached, &pair.handle)?,
        combine: plan_internode_combine(spec, combine_config, &pair.combine_call())?,
    })
}
// ANCHOR_END: plan_internode_pair

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: internode_pair
    /// The dispatch and combine of `pair` on `stream` with no host sync (see
    /// `plan_internode_pair`): the full notify without its wait, the dispatch into outputs of
    /// `num_worst_tokens` rows, the combine (its cached notify first). Under a stream capture
    /// it records the pair into a graph; eagerly it is the same calls. Collective.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`: the views are live device memory of this GPU (for as long
    /// as a graph that holds the pair is replayed), `stream` a live stream of this buffer's
    /// context.
    pub unsafe fn internode_pair_raw(
        &self,
        pair: &InternodePair,
        configs: (&Config, &Config),
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_internode_pair(&self.spec, configs, pair)?;
        self.check_resident("internode_dispatch", configs.0, plan.dispatch.num_channels)?;
        self.check_resident("internode_combine", configs.1, plan.combine.num_channels)?;
        let full = InternodeNotifyCall::Full(pair.layout);
        // SAFETY: the caller vouches for the views and the stream; every call was planned
        // above, so none is refused after another launched.
        unsafe {
            self.internode_notify_raw(&full, &pair.handle, configs.0, false, stream)?;
            let routing = pair.layout.is_token_in_rank;
            let (inputs, outputs) = (&pair.dispatch, &pair.received);
            self.internode_dispatch_raw(inputs, routing, &pair.handle, outputs, configs.0, stream)?;
            self.internode_combine_raw(&pair.combine_call(), configs.1, stream)
        }
    }
    // ANCHOR_END: internode_pair
}
