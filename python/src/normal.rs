//! Normal mode's arguments and outputs as the binding builds them (buffer.rs makes the calls):
//! DeepEP's intranode handle from Python, a dispatch's inputs, and each call's outputs,
//! planned or allocated (torch.rs, `Outputs`), with the shapes and dtypes DeepEP returns.

use nvshmem_tutorial::{
    CombineInputs, CombineOutputs, DispatchInputs, DispatchOutputs, ElemType, Handle,
    LayoutOutputs, NotifyInputs, NotifyOutputs, View,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::Error;
use crate::torch::{Outputs, Tensor, optional_view};

/// DeepEP's intranode handle as a dispatch returns it: (rank_prefix_matrix,
/// channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank,
/// send_head).
pub(crate) struct PyHandle<'py>(pub [Tensor<'py>; 6]);

const HANDLE_NAMES: [&str; 6] = [
    "handle[0] (rank_prefix_matrix)",
    "handle[1] (channel_prefix_matrix)",
    "handle[2] (recv_channel_prefix_matrix)",
    "handle[3] (recv_src_idx)",
    "handle[4] (is_token_in_rank)",
    "handle[5] (send_head)",
];

/// The items of `obj` if it is a tuple of `N`, else the error naming what a handle is.
pub(crate) fn handle_items<'a, 'py, const N: usize>(
    obj: Borrowed<'a, 'py, PyAny>,
    what: &str,
) -> PyResult<[Bound<'py, PyAny>; N]> {
    let items: Option<[Bound<'py, PyAny>; N]> = obj
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == N)
        .map(|t| std::array::from_fn(|i| t.get_item(i).expect("index below the length")));
    items.ok_or_else(|| {
        let len = obj
            .len()
            .map_or_else(|_| "no items".into(), |n| format!("{n} items"));
        Error::Invalid(format!(
            "handle must be the {N}-tuple {what}, got a {} of {len}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
        .into()
    })
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyHandle<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let what = "a dispatch returned (rank_prefix_matrix, channel_prefix_matrix, \
                    recv_channel_prefix_matrix, recv_src_idx, is_token_in_rank, send_head)";
        let [a, b, c, d, e, f] = handle_items::<6>(obj, what)?;
        Ok(Self([
            a.extract()?,
            b.extract()?,
            c.extract()?,
            d.extract()?,
            e.extract()?,
            f.extract()?,
        ]))
    }
}

impl<'py> PyHandle<'py> {
    pub(crate) fn views(&self, device: i32) -> Result<Handle, Error> {
        let view = |i: usize| self.0[i].view(HANDLE_NAMES[i], device);
        Ok(Handle {
            rank_prefix_matrix: view(0)?,
            channel_prefix_matrix: view(1)?,
            recv_channel_prefix_matrix: view(2)?,
            recv_src_idx: view(3)?,
            is_token_in_rank: view(4)?,
            send_head: view(5)?,
        })
    }

    pub(crate) fn tensors(&self) -> impl Iterator<Item = &Bound<'py, PyAny>> {
        self.0.iter().map(|t| &t.obj)
    }
}

/// A fresh dispatch's routing, from get_dispatch_layout: (num_tokens_per_rank,
/// is_token_in_rank, num_tokens_per_expert), each needed.
pub(crate) struct Layout<'py>(pub [Tensor<'py>; 3]);

impl<'a, 'py> FromPyObject<'a, 'py> for Layout<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let given: (
            Option<Tensor<'py>>,
            Option<Tensor<'py>>,
            Option<Tensor<'py>>,
        ) = obj.extract()?;
        match given {
            (Some(per_rank), Some(in_rank), Some(per_expert)) => {
                Ok(Self([per_rank, in_rank, per_expert]))
            }
            _ => Err(Error::Invalid(
                "dispatch without a handle needs num_tokens_per_rank, is_token_in_rank and \
                 num_tokens_per_expert (from get_dispatch_layout)"
                    .into(),
            )
            .into()),
        }
    }
}

impl Layout<'_> {
    /// The notify step's inputs.
    pub(crate) fn views(
        &self,
        device: i32,
        expert_alignment: usize,
    ) -> Result<NotifyInputs, Error> {
        let [per_rank, in_rank, per_expert] = &self.0;
        Ok(NotifyInputs {
            num_tokens_per_rank: per_rank.view("num_tokens_per_rank", device)?,
            num_tokens_per_expert: per_expert.view("num_tokens_per_expert", device)?,
            is_token_in_rank: in_rank.view("is_token_in_rank", device)?,
            expert_alignment,
        })
    }
}

/// get_dispatch_layout's tensors: per rank, per expert, routing; and per node, if made.
pub(crate) type LayoutTensors<'py> = ([Bound<'py, PyAny>; 3], Option<Bound<'py, PyAny>>);

/// get_dispatch_layout's outputs: tokens per rank [R] i32, per node [R / G] i32 (several
/// nodes only), per expert [E] i32, and the routing [N, R] bool.
pub(crate) fn layout_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    (num_ranks, num_nodes, num_experts, num_tokens): (usize, usize, usize, usize),
) -> PyResult<(LayoutTensors<'py>, LayoutOutputs)> {
    let per_rank = (&[num_ranks][..], ElemType::I32);
    let per_expert = (&[num_experts][..], ElemType::I32);
    let (tensors, views) = make.make_all(
        py,
        [
            per_rank,
            per_expert,
            (&[num_tokens, num_ranks], ElemType::Bool),
        ],
    )?;
    let per_node = (num_nodes > 1)
        .then(|| make.make(py, &[num_nodes], ElemType::I32))
        .transpose()?;
    let per_node_view = per_node.as_ref().map(|(_, view)| *view);
    Ok((
        (tensors, per_node.map(|(tensor, _)| tensor)),
        LayoutOutputs {
            num_tokens_per_rank: views[0],
            num_tokens_per_rdma_rank: per_node_view,
            num_tokens_per_expert: views[1],
            is_token_in_rank: views[2],
        },
    ))
}

/// The notify step's outputs, the first three matrices of the handle: [R, R], [R, C] and
/// [R, C] i32 for `num_channels` channels.
pub(crate) fn notify_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    num_ranks: usize,
    num_channels: usize,
) -> PyResult<([Bound<'py, PyAny>; 3], NotifyOutputs)> {
    let channels: &[usize] = &[num_ranks, num_channels];
    let (tensors, [ranks, sent, received]) = make.make_all(
        py,
        [
            (&[num_ranks, num_ranks], ElemType::I32),
            (channels, ElemType::I32),
            (channels, ElemType::I32),
        ],
    )?;
    let views = NotifyOutputs {
        rank_prefix_matrix: ranks,
        channel_prefix_matrix: sent,
        recv_channel_prefix_matrix: received,
    };
    Ok((tensors, views))
}

/// A dispatch's inputs: `x` and its scales, with a fresh dispatch's `topk` (topk_idx,
/// topk_weights) over `num_experts` experts (a cached one has neither, and 0).
pub(crate) fn dispatch_inputs(
    device: i32,
    (x, x_scales): (&Tensor<'_>, &Option<Tensor<'_>>),
    topk: (&Option<Tensor<'_>>, &Option<Tensor<'_>>),
    num_experts: usize,
) -> Result<DispatchInputs, Error> {
    Ok(DispatchInputs {
        x: x.view("x", device)?,
        x_scales: optional_view(x_scales, "x_scales", device)?,
        topk_idx: optional_view(topk.0, "topk_idx", device)?,
        topk_weights: optional_view(topk.1, "topk_weights", device)?,
        num_experts,
    })
}

/// A combine's inputs, intranode or across nodes: `x` (a row per row the dispatch delivered),
/// its top-k weights and the two optional biases.
pub(crate) fn combine_inputs(
    device: i32,
    x: &Tensor<'_>,
    topk_weights: &Option<Tensor<'_>>,
    bias: (&Option<Tensor<'_>>, &Option<Tensor<'_>>),
) -> Result<CombineInputs, Error> {
    Ok(CombineInputs {
        x: x.view("x", device)?,
        topk_weights: optional_view(topk_weights, "topk_weights", device)?,
        bias: [
            optional_view(bias.0, "bias[0]", device)?,
            optional_view(bias.1, "bias[1]", device)?,
        ],
    })
}

/// A dispatch's outputs for `rows` received rows: recv_x [rows, H] of x's dtype,
/// recv_x_scales [rows, S] of x_scales' dtype (with scales), recv_topk_idx [rows, K] i64
/// and recv_topk_weights [rows, K] f32 (with top-k).
pub(crate) fn dispatch_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    inputs: &DispatchInputs,
    rows: usize,
) -> PyResult<([Bound<'py, PyAny>; 4], DispatchOutputs)> {
    let (x, scales) = (&inputs.x, &inputs.x_scales);
    let (recv_x, recv_x_view) = make.make(py, &[rows, x.cols()], x.elem)?;
    let scale_shape = [rows, scales.map_or(0, |s| s.cols())];
    let scale_elem = scales.map_or(ElemType::F32, |s| s.elem);
    let (recv_scales, scales_view) =
        make.make_if(py, scales.is_some(), &scale_shape, scale_elem)?;
    let topk = inputs.topk_idx.map(|i| i.cols());
    let topk_shape = [rows, topk.unwrap_or(0)];
    let (idx, idx_view) = make.make_if(py, topk.is_some(), &topk_shape, ElemType::I64)?;
    let (weights, weights_view) = make.make_if(py, topk.is_some(), &topk_shape, ElemType::F32)?;
    let views = DispatchOutputs {
        recv_x: recv_x_view,
        recv_x_scales: scales_view,
        recv_topk_idx: idx_view,
        recv_topk_weights: weights_view,
    };
    Ok(([recv_x, recv_scales, idx, weights], views))
}

/// The last two matrices of a fresh dispatch's handle: recv_src_idx [rows] i32 and
/// send_head [num_tokens, R] i32.
pub(crate) fn handle_rest<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    rows: usize,
    (num_tokens, num_ranks): (usize, usize),
) -> PyResult<([Bound<'py, PyAny>; 2], [View; 2])> {
    let specs = [
        (&[rows][..], ElemType::I32),
        (&[num_tokens, num_ranks], ElemType::I32),
    ];
    make.make_all(py, specs)
}

/// The handle of a fresh dispatch: the notify step's matrices, the routing it was given,
/// and `rest` (`handle_rest`).
pub(crate) fn fresh_handle(
    notify: &NotifyOutputs,
    is_token_in_rank: View,
    rest: [View; 2],
) -> Handle {
    Handle {
        rank_prefix_matrix: notify.rank_prefix_matrix,
        channel_prefix_matrix: notify.channel_prefix_matrix,
        recv_channel_prefix_matrix: notify.recv_channel_prefix_matrix,
        recv_src_idx: rest[0],
        is_token_in_rank,
        send_head: rest[1],
    }
}

/// A combine's outputs: combined_x [N, H] bf16, and combined_topk_weights [N, K] f32 when
/// `num_topk` is given.
pub(crate) fn combine_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    (num_tokens, hidden): (usize, usize),
    num_topk: Option<usize>,
) -> PyResult<([Bound<'py, PyAny>; 2], CombineOutputs)> {
    let (combined, combined_view) = make.make(py, &[num_tokens, hidden], ElemType::Bf16)?;
    let shape = [num_tokens, num_topk.unwrap_or(0)];
    let (weights, weights_view) = make.make_if(py, num_topk.is_some(), &shape, ElemType::F32)?;
    let views = CombineOutputs {
        combined_x: combined_view,
        combined_topk_weights: weights_view,
    };
    Ok(([combined, weights], views))
}
