//! The cached dispatch across nodes (issue 32, step 7; DeepEP's `internode_dispatch` with
//! `handle=`, its `cached_mode`): the handle of an earlier full dispatch gives every count and
//! position, so nothing is recomputed on the host or exchanged. The cached notify (the entry
//! barrier, and a check of handle positions 1-2 against the routing) runs first, then the same
//! kernel with the handle's outputs left alone (null: send_rdma_head, send_nvl_head,
//! recv_src_meta are read by the combine, never rewritten). As DeepEP's, without top-k.

use std::ops::Deref;

use ch01_bootstrap::World;
use cudarc::driver::sys;

use super::InternodeDispatchPlan;
use super::plan::{Written, check_recv_x, dispatch_args};
use crate::buffer::NvshmemBuffer;
use crate::config::Config;
use crate::dispatch::{DispatchInputs, check_inputs};
use crate::error::BufferError;
use crate::internode_notify::{InternodeHandle, check_call};
use crate::spec::BufferSpec;
use crate::view::{ElemType, View};

const WHAT: &str = "internode_cached_dispatch";

/// What a cached dispatch reads of an earlier full dispatch's handle (DeepEP's 10-tuple, 2.10).
#[derive(Debug, Clone, Copy)]
pub struct InternodeCachedHandle {
    /// [T, n] bool, position 0: the routing (the cached notify checks positions 1-2 against it).
    pub is_token_in_rank: View,
    /// Positions 1-6, as the full notify wrote them.
    pub prefixes: InternodeHandle,
    /// [M, 2] i32, position 7: only its rows are read (M, the rows the handle delivers, as
    /// DeepEP's `recv_src_meta.size(0)`).
    pub recv_src_meta: View,
}

/// One cached dispatch's views: x (and its scales) of the handle's T tokens, without top-k,
/// the handle, and what it fills: `recv_x` [M, H] of x's dtype, `recv_x_scales` [M, S] with fp8.
#[derive(Debug, Clone, Copy)]
pub struct InternodeCachedDispatchCall {
    pub inputs: DispatchInputs,
    pub handle: InternodeCachedHandle,
    pub recv_x: View,
    pub recv_x_scales: Option<View>,
}

// ANCHOR: plan_internode_cached_dispatch
/// Checks a cached dispatch for `config` and plans it: the full dispatch's checks of the buffer,
/// the routing, positions 1-6 and x (bf16, or fp8 with its scales; the row format may differ
/// from the handle's dispatch), no top-k, and `recv_x` of the handle's M rows.
pub fn plan_internode_cached_dispatch(
    spec: &BufferSpec,
    config: &Config,
    call: &InternodeCachedDispatchCall,
) -> Result<InternodeDispatchPlan, BufferError> {
    let handle = &call.handle;
    let checked = check_call(
        WHAT,
        spec,
        config,
        &handle.prefixes,
        handle.is_token_in_rank,
    )?;
    let inputs = &call.inputs;
    if inputs.topk_idx.is_some() || inputs.topk_weights.is_some() {
        return Err(BufferError::invalid(
            WHAT,
            "a cached dispatch takes no topk_idx or topk_weights (as DeepEP's, which asserts \
             them None with a handle): the top-k came with the full dispatch that made the \
             handle; pass None, or dispatch without the handle",
        ));
    }
    let f = check_inputs(WHAT, inputs, checked.num_tokens, checked.n)?;
    let meta = &handle.recv_src_meta;
    meta.expect(WHAT, "recv_src_meta", ElemType::I32, &[None, Some(2)])?;
    let rows = check_recv_x(WHAT, &call.recv_x, &call.recv_x_scales, &f)?;
    if rows != meta.rows() {
        return Err(BufferError::invalid(
            WHAT,
            format!(
                "recv_x has {rows} rows but the handle delivers {} (recv_src_meta's rows): a \
                 cached dispatch receives its handle's rows; allocate recv_x as the full \
                 dispatch's",
                meta.rows()
            ),
        ));
    }
    let written = Written {
        rows,
        forwarded: 0,
        recv_x: call.recv_x.ptr,
        recv_x_scales: call.recv_x_scales.map_or(0, |v| v.ptr),
        recv_topk: (0, 0),
        recv_src_meta: 0,
        send_rdma_head: 0,
        send_nvl_head: 0,
    };
    let routing = (handle.is_token_in_rank, &handle.prefixes);
    let args = dispatch_args(spec, config, (&checked, &f), inputs, routing, &written)?;
    Ok(InternodeDispatchPlan {
        args,
        num_channels: checked.c,
    })
}
// ANCHOR_END: plan_internode_cached_dispatch

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    // ANCHOR: internode_cached_dispatch
    /// The cached dispatch of `call` on `stream` (see `plan_internode_cached_dispatch`): the
    /// cached notify (the entry barrier, as DeepEP's `cached_notify` before a cached dispatch),
    /// then the dispatch with the handle's positions. No host wait: the outputs' rows are the
    /// handle's. Collective: every rank makes the same calls in the same order.
    ///
    /// # Safety
    /// As `get_dispatch_layout_raw`: the views are live device memory of this GPU, `stream` a
    /// live stream of this buffer's context, and the handle is a full dispatch's (on this
    /// buffer, with the same channels), finished on this stream.
    pub unsafe fn internode_cached_dispatch_raw(
        &self,
        call: &InternodeCachedDispatchCall,
        config: &Config,
        stream: sys::CUstream,
    ) -> Result<(), BufferError> {
        self.check()?;
        let plan = plan_internode_cached_dispatch(&self.spec, config, call)?;
        let handle = (call.handle.is_token_in_rank, &call.handle.prefixes);
        let planned = (plan.num_channels, &plan.args);
        // SAFETY: a checked plan for this handle; the caller vouches for the views and stream.
        unsafe {
            self.launch_after_cached_notify("internode_dispatch", handle, config, planned, stream)
        }
    }
    // ANCHOR_END: internode_cached_dispatch
}
