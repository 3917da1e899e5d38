//! The safe layer's low-latency calls: dispatch and combine over typed arrays, split at the
//! receive hook ([`Pending`]), and the zero-copy combine's staging rows ([`StagingRows`]).

use std::ops::Deref;

use ch01_bootstrap::World;
use half::bf16;
use kernels::contract::FP8_GROUP;

use super::{DeviceArray, Fp8E4m3, TopK, view_of};
use crate::buffer::NvshmemBuffer;
use crate::error::BufferError;
use crate::low_latency::{
    LlCombineInputs, LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs, LlHandle, Phases,
};
use crate::view::{ElemType, View};

/// Low-latency dispatch's received rows: [L x R x T, H] bf16, or fp8 with its scales (f32
/// [L x H/128, R x T], or UE8M0 exponents packed four to an i32 [L x H/512, R x T]).
pub enum LlRecvTokens {
    Bf16(DeviceArray<bf16>),
    Fp8(DeviceArray<Fp8E4m3>, DeviceArray<f32>),
    Fp8Ue8m0(DeviceArray<Fp8E4m3>, DeviceArray<i32>),
}

/// DeepEP's low-latency handle, owned: where each received row came from, and the shape.
pub struct LlDispatchHandle {
    pub src_info: DeviceArray<i32>,
    pub layout_range: DeviceArray<i64>,
    pub num_max_dispatch_tokens_per_rank: usize,
    pub hidden: usize,
    pub num_experts: usize,
}

impl LlDispatchHandle {
    fn views(&self) -> LlHandle {
        LlHandle {
            src_info: self.src_info.view(),
            layout_range: self.layout_range.view(),
            num_max_dispatch_tokens_per_rank: self.num_max_dispatch_tokens_per_rank,
            hidden: self.hidden,
            num_experts: self.num_experts,
        }
    }
}

/// A low-latency dispatch's results: rows per local expert (the first `recv_count[e]` of
/// expert e's R x T are valid), and the handle a combine needs.
pub struct LlDispatched {
    pub x: LlRecvTokens,
    pub recv_count: DeviceArray<i32>,
    pub handle: LlDispatchHandle,
}

/// The optional statistics DeepEP's low-latency calls add to.
#[derive(Default)]
pub struct LlStats<'a> {
    /// [L] i32: tokens each local expert received, summed over calls.
    pub cumulative_local_expert_recv_stats: Option<&'a mut DeviceArray<i32>>,
    /// [R] i64: SM cycles spent waiting for each source rank.
    pub wait_recv_cost_stats: Option<&'a mut DeviceArray<i64>>,
}

/// The receive half of a low-latency call, run on the buffer that ran its send.
type Receive<'a, W, R> = Box<dyn FnOnce(&NvshmemBuffer<W>) -> Result<R, BufferError> + 'a>;

/// A low-latency call whose send has run and whose receive has not: it holds the buffer, so
/// nothing else runs on it until [`Pending::receive`] (DeepEP's receive hook).
pub struct Pending<'a, W: Deref<Target = World>, R> {
    buffer: &'a mut NvshmemBuffer<W>,
    receive: Receive<'a, W, R>,
}

impl<W: Deref<Target = World>, R> Pending<'_, W, R> {
    /// Runs the receive half and returns the call's results.
    pub fn receive(self) -> Result<R, BufferError> {
        (self.receive)(self.buffer)
    }
}

/// The zero-copy combine's staging rows in the buffer's own memory, [L x R x T, H] bf16;
/// they borrow the buffer, so they cannot outlive it.
pub struct StagingRows<'a, W: Deref<Target = World>> {
    buffer: &'a mut NvshmemBuffer<W>,
    view: View,
}

impl<W: Deref<Target = World>> StagingRows<'_, W> {
    /// Fills the rows from `src`, of the same shape (stream-ordered).
    pub fn copy_from(&mut self, src: &DeviceArray<bf16>) -> Result<(), BufferError> {
        let v = &self.view;
        src.view.expect(
            "StagingRows::copy_from",
            "src",
            ElemType::Bf16,
            &[Some(v.rows()), Some(v.cols())],
        )?;
        let stream = self.buffer.world().stream();
        // SAFETY: both are [rows, cols] bf16 on this GPU (checked); the staging rows live as
        // long as the buffer this borrows; stream-ordered.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                v.ptr,
                src.view.ptr,
                v.rows() * v.cols() * 2,
                stream.cu_stream(),
            )
        }
        .map_err(BufferError::cuda("copying into the staging rows"))
    }
}

// ---- the calls ------------------------------------------------------------------------------

/// What a low-latency dispatch launch needs: its views, made once for the send and again for
/// the receive.
struct LlDispatchCall {
    inputs: LlDispatchInputs,
    outputs: LlDispatchOutputs,
    options: LlDispatchOptions,
}

impl<W: Deref<Target = World>> NvshmemBuffer<W> {
    fn ll_dispatch_outputs(
        &self,
        hidden: usize,
        options: &LlDispatchOptions,
    ) -> Result<LlDispatched, BufferError> {
        let (n, t) = (
            self.world().n_pes(),
            options.num_max_dispatch_tokens_per_rank,
        );
        let l = options.num_experts / n.max(1);
        let rows = l * n * t;
        let x = match (options.use_fp8, options.use_ue8m0) {
            (false, _) => LlRecvTokens::Bf16(self.output(rows, hidden)?),
            (true, false) => LlRecvTokens::Fp8(
                self.output(rows, hidden)?,
                self.output(l * hidden / FP8_GROUP, n * t)?,
            ),
            (true, true) => LlRecvTokens::Fp8Ue8m0(
                self.output(rows, hidden)?,
                self.output(l * hidden / (4 * FP8_GROUP), n * t)?,
            ),
        };
        Ok(LlDispatched {
            x,
            recv_count: self.output(l, 0)?,
            handle: LlDispatchHandle {
                src_info: self.output(l, n * t)?,
                layout_range: self.output(l, n)?,
                num_max_dispatch_tokens_per_rank: t,
                hidden,
                num_experts: options.num_experts,
            },
        })
    }

    fn ll_dispatch_call(
        x: &DeviceArray<bf16>,
        topk_idx: &DeviceArray<i64>,
        stats: &LlStats<'_>,
        out: &LlDispatched,
        options: LlDispatchOptions,
    ) -> LlDispatchCall {
        let (recv_x, recv_x_scales) = match &out.x {
            LlRecvTokens::Bf16(x) => (x.view(), None),
            LlRecvTokens::Fp8(x, s) => (x.view(), Some(s.view())),
            LlRecvTokens::Fp8Ue8m0(x, s) => (x.view(), Some(s.view())),
        };
        LlDispatchCall {
            inputs: LlDispatchInputs {
                x: x.view(),
                topk_idx: topk_idx.view(),
                cumulative_local_expert_recv_stats: stats
                    .cumulative_local_expert_recv_stats
                    .as_ref()
                    .map(|a| a.view()),
                dispatch_wait_recv_cost_stats: stats
                    .wait_recv_cost_stats
                    .as_ref()
                    .map(|a| a.view()),
            },
            outputs: LlDispatchOutputs {
                recv_x,
                recv_x_scales,
                recv_src_info: out.handle.src_info.view(),
                recv_layout_range: out.handle.layout_range.view(),
                recv_count: out.recv_count.view(),
            },
            options,
        }
    }

    fn run_ll_dispatch(&self, call: &LlDispatchCall, phases: Phases) -> Result<(), BufferError> {
        let stream = self.stream();
        // SAFETY: typed arrays of this GPU, kept alive by the caller's borrows for the call;
        // the world's stream.
        unsafe {
            self.low_latency_dispatch_raw(
                &call.inputs,
                &call.outputs,
                &call.options,
                phases,
                stream.cu_stream(),
            )
        }
    }

    // ANCHOR: typed_ll_dispatch
    /// DeepEP's `low_latency_dispatch` in one launch: `x` [N, H] bf16 (N <= T) to the slots
    /// of its `topk_idx` [N, K] experts, received packed per local expert.
    pub fn low_latency_dispatch(
        &mut self,
        x: &DeviceArray<bf16>,
        topk_idx: &DeviceArray<i64>,
        stats: LlStats<'_>,
        options: LlDispatchOptions,
    ) -> Result<LlDispatched, BufferError> {
        let out = self.ll_dispatch_outputs(x.cols(), &options)?;
        let call = Self::ll_dispatch_call(x, topk_idx, &stats, &out, options);
        self.run_ll_dispatch(&call, Phases::SendAndReceive)?;
        Ok(out)
    }

    /// The same, split at DeepEP's receive hook: this runs the send and returns at once; the
    /// [`Pending`] it returns holds the buffer (and the inputs) until its `receive()`.
    pub fn low_latency_dispatch_send<'a>(
        &'a mut self,
        x: &'a DeviceArray<bf16>,
        topk_idx: &'a DeviceArray<i64>,
        stats: LlStats<'a>,
        options: LlDispatchOptions,
    ) -> Result<Pending<'a, W, LlDispatched>, BufferError> {
        let out = self.ll_dispatch_outputs(x.cols(), &options)?;
        let call = Self::ll_dispatch_call(x, topk_idx, &stats, &out, options);
        self.run_ll_dispatch(&call, Phases::Send)?;
        Ok(Pending {
            buffer: self,
            receive: Box::new(move |buffer: &NvshmemBuffer<W>| {
                let _inputs_alive = (x, topk_idx, stats);
                buffer.run_ll_dispatch(&call, Phases::Receive)?;
                Ok(out)
            }),
        })
    }
    // ANCHOR_END: typed_ll_dispatch

    fn ll_combine_call(
        &self,
        x: Option<&DeviceArray<bf16>>,
        topk: TopK<'_>,
        wait_recv_cost_stats: Option<&DeviceArray<i64>>,
        handle: &LlDispatchHandle,
    ) -> Result<(LlCombineInputs, LlHandle, DeviceArray<bf16>), BufferError> {
        let out = self.output::<bf16>(topk.idx.rows(), handle.hidden)?;
        let inputs = LlCombineInputs {
            x: view_of(x),
            topk_idx: topk.idx.view(),
            topk_weights: topk.weights.view(),
            combine_wait_recv_cost_stats: view_of(wait_recv_cost_stats),
        };
        Ok((inputs, handle.views(), out))
    }

    fn run_ll_combine(
        &self,
        inputs: &LlCombineInputs,
        handle: &LlHandle,
        out: &DeviceArray<bf16>,
        phases: Phases,
    ) -> Result<(), BufferError> {
        let stream = self.stream();
        // SAFETY: typed arrays of this GPU, kept alive by the caller's borrows for the call;
        // the world's stream.
        unsafe {
            self.low_latency_combine_raw(inputs, handle, &out.view(), phases, stream.cu_stream())
        }
    }

    /// DeepEP's `low_latency_combine` in one launch: the experts' results `x` [L x R x T, H]
    /// (or, with `None`, the staging rows: zero copy) back to their tokens' ranks, summed with
    /// `topk`'s weights into [N, H] bf16.
    pub fn low_latency_combine(
        &mut self,
        x: Option<&DeviceArray<bf16>>,
        topk: TopK<'_>,
        wait_recv_cost_stats: Option<&mut DeviceArray<i64>>,
        handle: &LlDispatchHandle,
    ) -> Result<DeviceArray<bf16>, BufferError> {
        let (inputs, views, out) =
            self.ll_combine_call(x, topk, wait_recv_cost_stats.as_deref(), handle)?;
        self.run_ll_combine(&inputs, &views, &out, Phases::SendAndReceive)?;
        Ok(out)
    }

    /// The same, split at the receive hook (see `low_latency_dispatch_send`).
    pub fn low_latency_combine_send<'a>(
        &'a mut self,
        x: Option<&'a DeviceArray<bf16>>,
        topk: TopK<'a>,
        wait_recv_cost_stats: Option<&'a mut DeviceArray<i64>>,
        handle: &'a LlDispatchHandle,
    ) -> Result<Pending<'a, W, DeviceArray<bf16>>, BufferError> {
        let (inputs, views, out) =
            self.ll_combine_call(x, topk, wait_recv_cost_stats.as_deref(), handle)?;
        self.run_ll_combine(&inputs, &views, &out, Phases::Send)?;
        Ok(Pending {
            buffer: self,
            receive: Box::new(move |buffer: &NvshmemBuffer<W>| {
                let _inputs_alive = (x, topk, wait_recv_cost_stats, handle);
                buffer.run_ll_combine(&inputs, &views, &out, Phases::Receive)?;
                Ok(out)
            }),
        })
    }

    /// DeepEP's `get_next_low_latency_combine_buffer`: the staging rows a zero-copy combine
    /// (`x: None`) reads, for calls of `handle`'s shape.
    pub fn next_low_latency_combine_buffer(
        &mut self,
        handle: &LlDispatchHandle,
    ) -> Result<StagingRows<'_, W>, BufferError> {
        let view = self.next_low_latency_combine_buffer_raw(
            handle.num_max_dispatch_tokens_per_rank,
            handle.hidden,
            handle.num_experts,
        )?;
        Ok(StagingRows { buffer: self, view })
    }

    /// DeepEP's `clean_low_latency_buffer` (collective), on the world's stream.
    pub fn clean_low_latency_buffer(
        &mut self,
        num_max_dispatch_tokens_per_rank: usize,
        hidden: usize,
        num_experts: usize,
    ) -> Result<(), BufferError> {
        let stream = self.stream();
        // SAFETY: the world's stream.
        unsafe {
            self.clean_low_latency_buffer_raw(
                num_max_dispatch_tokens_per_rank,
                hidden,
                num_experts,
                stream.cu_stream(),
            )
        }
    }
}
