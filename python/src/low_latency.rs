//! Low-latency mode's arguments, outputs and receive hook as the binding builds them
//! (buffer.rs makes the calls): DeepEP's low-latency handle from Python, each call's inputs,
//! the outputs of a dispatch (planned or allocated, torch.rs `Outputs`), and [`ReceiveHook`],
//! the callable a call with `return_recv_hook` returns, which a call's end ([`finish`]) makes.

use std::sync::Weak;

use cudarc::driver::sys;
use nvshmem_tutorial::kernels::contract::FP8_GROUP;
use nvshmem_tutorial::{
    ElemType, LlCombineInputs, LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs, LlHandle,
    Phases, View,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::Error;
use crate::events::{Event, Streams};
use crate::normal::handle_items;
use crate::shared::{Call, Shared};
use crate::torch::{Outputs, Tensor, optional_view};

/// UE8M0 scales are packed four to an int32.
const UE8M0_PER_INT: usize = 4;

/// DeepEP's low-latency handle as a dispatch returns it: (recv_src_info, recv_layout_range,
/// num_max_dispatch_tokens_per_rank, hidden, num_experts). The two tensors are read only
/// by the calls that use them.
pub(crate) struct PyLlHandle<'py> {
    src_info: Bound<'py, PyAny>,
    layout_range: Bound<'py, PyAny>,
    pub max_tokens: usize,
    pub hidden: usize,
    pub num_experts: usize,
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyLlHandle<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let what = "low_latency_dispatch returned (recv_src_info, recv_layout_range, \
                    num_max_dispatch_tokens_per_rank, hidden, num_experts)";
        let [src_info, layout_range, t, hidden, e] = handle_items::<5>(obj, what)?;
        Ok(Self {
            src_info,
            layout_range,
            max_tokens: t.extract()?,
            hidden: hidden.extract()?,
            num_experts: e.extract()?,
        })
    }
}

impl<'py> PyLlHandle<'py> {
    /// The handle as the plans take it, and its two tensors.
    pub(crate) fn read(&self, device: i32) -> PyResult<(LlHandle, [Bound<'py, PyAny>; 2])> {
        let src_info: Tensor<'py> = self.src_info.extract()?;
        let layout_range: Tensor<'py> = self.layout_range.extract()?;
        let handle = LlHandle {
            src_info: src_info.view("handle[0] (src_info)", device)?,
            layout_range: layout_range.view("handle[1] (layout_range)", device)?,
            num_max_dispatch_tokens_per_rank: self.max_tokens,
            hidden: self.hidden,
            num_experts: self.num_experts,
        };
        Ok((handle, [src_info.obj, layout_range.obj]))
    }
}

/// A low-latency dispatch's inputs: `x` and `topk_idx`, and the `stats` tensors that were
/// given (cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats).
pub(crate) fn dispatch_inputs(
    device: i32,
    (x, topk_idx): (&Tensor<'_>, &Tensor<'_>),
    stats: (&Option<Tensor<'_>>, &Option<Tensor<'_>>),
) -> Result<LlDispatchInputs, Error> {
    Ok(LlDispatchInputs {
        x: x.view("x", device)?,
        topk_idx: topk_idx.view("topk_idx", device)?,
        cumulative_local_expert_recv_stats: optional_view(
            stats.0,
            "cumulative_local_expert_recv_stats",
            device,
        )?,
        dispatch_wait_recv_cost_stats: optional_view(
            stats.1,
            "dispatch_wait_recv_cost_stats",
            device,
        )?,
    })
}

/// A low-latency combine's inputs, and `x` as the tensor it reads: none with `zero_copy`
/// (the staging rows are combined), else the one given, as rows.
pub(crate) fn combine_inputs<'py>(
    device: i32,
    (x, zero_copy): (Option<Bound<'py, PyAny>>, bool),
    (topk_idx, topk_weights): (&Tensor<'_>, &Tensor<'_>),
    wait_cost: &Option<Tensor<'_>>,
) -> Result<(Option<Tensor<'py>>, LlCombineInputs), Error> {
    let x: Option<Tensor<'py>> = match (zero_copy, x) {
        (true, _) => None,
        (false, Some(x)) => Some(x.extract()?),
        (false, None) => {
            return Err(Error::Invalid(
                "low_latency_combine: x is needed unless zero_copy=True".into(),
            ));
        }
    };
    let inputs = LlCombineInputs {
        x: x.as_ref().map(|x| x.rows("x", device)).transpose()?,
        topk_idx: topk_idx.view("topk_idx", device)?,
        topk_weights: topk_weights.view("topk_weights", device)?,
        combine_wait_recv_cost_stats: optional_view(
            wait_cost,
            "combine_wait_recv_cost_stats",
            device,
        )?,
    };
    Ok((x, inputs))
}

/// A low-latency dispatch's outputs, DeepEP's shapes: recv_x [L, R x T, H] (fp8 e4m3 with
/// use_fp8, else bf16); the scales' storage [L, H / 128, R x T] f32, or with use_ue8m0
/// [L, H / 512, R x T] int32 (buffer.py returns its transpose, column-major as DeepEP's);
/// recv_count [L] i32; recv_src_info [L, R x T] i32; recv_layout_range [L, R] i64. The Rust
/// views see the 3-D ones as the matrices of their rows.
pub(crate) fn dispatch_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    options: &LlDispatchOptions,
    (num_ranks, hidden): (usize, usize),
) -> PyResult<([Bound<'py, PyAny>; 5], LlDispatchOutputs)> {
    // Saturating: a shape this large is refused by the plan, which must see it first.
    let l = options.num_experts / num_ranks;
    let slots = num_ranks.saturating_mul(options.num_max_dispatch_tokens_per_rank);
    let recv_elem = if options.use_fp8 {
        ElemType::Fp8E4m3
    } else {
        ElemType::Bf16
    };
    let (recv_x, recv_x_view) = make.make(py, &[l, slots, hidden], recv_elem)?;
    let (groups, scale_elem) = if options.use_ue8m0 {
        (hidden / (FP8_GROUP * UE8M0_PER_INT), ElemType::I32)
    } else {
        (hidden / FP8_GROUP, ElemType::F32)
    };
    let (scales, scales_view) =
        make.make_if(py, options.use_fp8, &[l, groups, slots], scale_elem)?;
    let (count, count_view) = make.make(py, &[l], ElemType::I32)?;
    let (src_info, src_info_view) = make.make(py, &[l, slots], ElemType::I32)?;
    let (range, range_view) = make.make(py, &[l, num_ranks], ElemType::I64)?;
    let views = LlDispatchOutputs {
        recv_x: recv_x_view,
        recv_x_scales: scales_view,
        recv_src_info: src_info_view,
        recv_layout_range: range_view,
        recv_count: count_view,
    };
    Ok(([recv_x, scales, count, src_info, range], views))
}

/// Which halves of a low-latency call a launch runs: the send alone with
/// `return_recv_hook` (the hook runs the receive), else both.
pub(crate) fn phases(return_recv_hook: bool) -> Phases {
    if return_recv_hook {
        Phases::Send
    } else {
        Phases::SendAndReceive
    }
}

/// Ends a low-latency call whose send `streams` launched: with `return_recv_hook` the hook
/// that runs its `receive` half (keeping `used` alive), and the call's event
/// (`Streams::finish`).
pub(crate) fn finish<'py>(
    py: Python<'py>,
    call: &Call,
    streams: Streams<'py>,
    (receive, return_recv_hook): (Receive, bool),
    used: &[&Bound<'py, PyAny>],
) -> Result<(Option<ReceiveHook>, Option<Event>), Error> {
    let hook = return_recv_hook
        .then(|| ReceiveHook::new(py, call, streams.launch, receive, used))
        .transpose()?;
    let event = streams.finish(call, used)?;
    Ok((hook, event))
}

/// The receive half of a low-latency call, as its send left it.
pub(crate) enum Receive {
    Dispatch(LlDispatchInputs, LlDispatchOutputs, LlDispatchOptions),
    Combine(LlCombineInputs, LlHandle, View),
}

/// What a low-latency call with `return_recv_hook` returns (DeepEP's `hook`): calling it
/// launches the receive half on the stream the send ran on, then reads the buffer's error
/// record. It keeps the call's tensors alive until it is dropped.
#[pyclass(module = "nvshmem_tutorial._native", frozen)]
pub struct ReceiveHook {
    shared: Weak<Shared>,
    stream: u64,
    receive: Receive,
    _tensors: Py<PyTuple>,
}

impl ReceiveHook {
    /// The hook of `call`, whose send ran on `stream` over `tensors`.
    pub(crate) fn new(
        py: Python<'_>,
        call: &Call,
        stream: u64,
        receive: Receive,
        tensors: &[&Bound<'_, PyAny>],
    ) -> PyResult<Self> {
        Ok(Self {
            shared: call.weak(),
            stream,
            receive,
            _tensors: PyTuple::new(py, tensors)?.unbind(),
        })
    }
}

#[pymethods]
impl ReceiveHook {
    fn __call__(&self) -> PyResult<()> {
        let call = Call::enter(&self.shared)?;
        let stream = self.stream as usize as sys::CUstream;
        // SAFETY: the views describe tensors this hook keeps alive, on the buffer's GPU
        // (checked when the send was made); the stream is the one the send ran on.
        match &self.receive {
            Receive::Dispatch(inputs, outputs, options) => unsafe {
                let receive = Phases::Receive;
                call.buffer
                    .low_latency_dispatch_raw(inputs, outputs, options, receive, stream)
            },
            Receive::Combine(inputs, handle, out) => unsafe {
                let receive = Phases::Receive;
                call.buffer
                    .low_latency_combine_raw(inputs, handle, out, receive, stream)
            },
        }
        .map_err(Error::from)?;
        Ok(call.check()?)
    }
}
