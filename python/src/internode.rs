//! Normal mode across nodes as the binding builds it (buffer.rs makes the calls; issue 32,
//! benchmarks/notes/buffer_internode_normal.md 2.10): DeepEP's 10-tuple internode handle from
//! Python, a fresh dispatch's layout, and the notify's and the dispatch's outputs, planned or
//! allocated (torch.rs, `Outputs`), with the shapes and dtypes DeepEP returns.
//!
//! Where ours differ from DeepEP's tensors (buffer.py's `Buffer.internode_dispatch` says it to
//! the user too): position 7, `recv_src_meta`, is made here as [M, 2] int32 ({source node,
//! in-node mask}) and buffer.py returns it as DeepEP's [M, 8] uint8 (the same bytes at nodes
//! of 8, a `.view`); position 9, `send_nvl_head`, is [M_r, G] (G ranks per node, DeepEP's 8)
//! and keeps its -1 entries (DeepEP rewrites them in place before a combine).

use nvshmem_tutorial::{
    DispatchInputs, ElemType, InternodeCachedHandle, InternodeCombineHandle,
    InternodeDispatchOutputs, InternodeHandle, InternodeNotifyInputs, View,
};
use pyo3::prelude::*;

use crate::errors::Error;
use crate::normal::handle_items;
use crate::torch::{Outputs, Tensor};

/// DeepEP's internode handle as a dispatch returns it (DeepEP's order):
/// (is_token_in_rank, rdma_channel_prefix_matrix, gbl_channel_prefix_matrix,
/// recv_rdma_channel_prefix_matrix, recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix,
/// recv_gbl_rank_prefix_sum, recv_src_meta, send_rdma_head, send_nvl_head). Position 7 is kept
/// as given: the combine does not read it, and a cached dispatch reads it as [M, 2] int32 (its
/// rows are the rows the handle delivers; buffer.py views DeepEP's uint8 bytes so).
pub(crate) struct PyInternodeHandle<'py> {
    pub tensors: [Tensor<'py>; 9],
    pub recv_src_meta: Bound<'py, PyAny>,
}

/// The names of the tensors of `PyInternodeHandle::tensors` (positions 0-6, 8, 9).
const HANDLE_NAMES: [&str; 9] = [
    "handle[0] (is_token_in_rank)",
    "handle[1] (rdma_channel_prefix_matrix)",
    "handle[2] (gbl_channel_prefix_matrix)",
    "handle[3] (recv_rdma_channel_prefix_matrix)",
    "handle[4] (recv_rdma_rank_prefix_sum)",
    "handle[5] (recv_gbl_channel_prefix_matrix)",
    "handle[6] (recv_gbl_rank_prefix_sum)",
    "handle[8] (send_rdma_head)",
    "handle[9] (send_nvl_head)",
];

impl<'a, 'py> FromPyObject<'a, 'py> for PyInternodeHandle<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let what = "an internode dispatch returned (is_token_in_rank, rdma_channel_prefix_matrix, \
                    gbl_channel_prefix_matrix, recv_rdma_channel_prefix_matrix, \
                    recv_rdma_rank_prefix_sum, recv_gbl_channel_prefix_matrix, \
                    recv_gbl_rank_prefix_sum, recv_src_meta, send_rdma_head, send_nvl_head)";
        let [a, b, c, d, e, f, g, meta, h, i] = handle_items::<10>(obj, what)?;
        Ok(Self {
            tensors: [
                a.extract()?,
                b.extract()?,
                c.extract()?,
                d.extract()?,
                e.extract()?,
                f.extract()?,
                g.extract()?,
                h.extract()?,
                i.extract()?,
            ],
            recv_src_meta: meta,
        })
    }
}

impl<'py> PyInternodeHandle<'py> {
    /// Positions 1-6.
    pub(crate) fn prefixes(&self, device: i32) -> Result<InternodeHandle, Error> {
        let view = |i: usize| self.tensors[i].view(HANDLE_NAMES[i], device);
        Ok(InternodeHandle {
            rdma_channel_prefix_matrix: view(1)?,
            gbl_channel_prefix_matrix: view(2)?,
            recv_rdma_channel_prefix_matrix: view(3)?,
            recv_rdma_rank_prefix_sum: view(4)?,
            recv_gbl_channel_prefix_matrix: view(5)?,
            recv_gbl_rank_prefix_sum: view(6)?,
        })
    }

    /// What the combine reads: positions 0-6, 8 and 9.
    pub(crate) fn combine_views(&self, device: i32) -> Result<InternodeCombineHandle, Error> {
        let view = |i: usize| self.tensors[i].view(HANDLE_NAMES[i], device);
        Ok(InternodeCombineHandle {
            is_token_in_rank: view(0)?,
            prefixes: self.prefixes(device)?,
            send_rdma_head: view(7)?,
            send_nvl_head: view(8)?,
        })
    }

    /// What a cached dispatch reads: positions 0-6 and 7 (as [M, 2] int32).
    pub(crate) fn cached_views(&self, device: i32) -> Result<InternodeCachedHandle, Error> {
        let meta: Tensor<'py> = self.recv_src_meta.extract()?;
        Ok(InternodeCachedHandle {
            is_token_in_rank: self.tensors[0].view(HANDLE_NAMES[0], device)?,
            prefixes: self.prefixes(device)?,
            recv_src_meta: meta.view("handle[7] (recv_src_meta)", device)?,
        })
    }

    /// Every tensor of the handle (an async call keeps them alive).
    pub(crate) fn objects(&self) -> impl Iterator<Item = &Bound<'py, PyAny>> {
        let tensors = self.tensors.iter().map(|t| &t.obj);
        tensors.chain(std::iter::once(&self.recv_src_meta))
    }
}

/// A fresh internode dispatch's routing, from get_dispatch_layout: (num_tokens_per_rank,
/// num_tokens_per_rdma_rank, is_token_in_rank, num_tokens_per_expert), each needed.
pub(crate) struct InternodeLayout<'py>(pub [Tensor<'py>; 4]);

impl<'a, 'py> FromPyObject<'a, 'py> for InternodeLayout<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        type Given<'py> = (
            Option<Tensor<'py>>,
            Option<Tensor<'py>>,
            Option<Tensor<'py>>,
            Option<Tensor<'py>>,
        );
        match obj.extract::<Given<'py>>()? {
            (Some(per_rank), Some(per_node), Some(in_rank), Some(per_expert)) => {
                Ok(Self([per_rank, per_node, in_rank, per_expert]))
            }
            _ => Err(Error::Invalid(
                "an internode dispatch without a handle needs num_tokens_per_rank, \
                 num_tokens_per_rdma_rank, is_token_in_rank and num_tokens_per_expert (from \
                 get_dispatch_layout)"
                    .into(),
            )
            .into()),
        }
    }
}

impl InternodeLayout<'_> {
    /// The full notify's inputs.
    pub(crate) fn views(
        &self,
        device: i32,
        expert_alignment: usize,
    ) -> Result<InternodeNotifyInputs, Error> {
        let [per_rank, per_node, in_rank, per_expert] = &self.0;
        Ok(InternodeNotifyInputs {
            num_tokens_per_rank: per_rank.view("num_tokens_per_rank", device)?,
            num_tokens_per_rdma_rank: per_node.view("num_tokens_per_rdma_rank", device)?,
            num_tokens_per_expert: per_expert.view("num_tokens_per_expert", device)?,
            is_token_in_rank: in_rank.view("is_token_in_rank", device)?,
            expert_alignment,
        })
    }
}

/// The full notify's outputs, handle positions 1-6, all int32: [N, C], [n, C], [N, C], [N],
/// [n, C], [n] for n ranks in N nodes and C channels.
pub(crate) fn notify_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    (num_ranks, num_nodes, num_channels): (usize, usize, usize),
) -> PyResult<([Bound<'py, PyAny>; 6], InternodeHandle)> {
    let (nodes_c, ranks_c): (&[usize], &[usize]) =
        (&[num_nodes, num_channels], &[num_ranks, num_channels]);
    let (tensors, [a, b, c, d, e, f]) = make.make_all(
        py,
        [
            (nodes_c, ElemType::I32),
            (ranks_c, ElemType::I32),
            (nodes_c, ElemType::I32),
            (&[num_nodes], ElemType::I32),
            (ranks_c, ElemType::I32),
            (&[num_ranks], ElemType::I32),
        ],
    )?;
    let views = InternodeHandle {
        rdma_channel_prefix_matrix: a,
        gbl_channel_prefix_matrix: b,
        recv_rdma_channel_prefix_matrix: c,
        recv_rdma_rank_prefix_sum: d,
        recv_gbl_channel_prefix_matrix: e,
        recv_gbl_rank_prefix_sum: f,
    };
    Ok((tensors, views))
}

/// The internode dispatch's outputs for `rows` received and `forwarded` forwarded rows, T
/// tokens, N nodes of G ranks, in this order: recv_x [rows, H] of x's dtype, recv_x_scales
/// [rows, S] of x_scales' dtype (with fp8 x), recv_topk_idx [rows, K] i64 and
/// recv_topk_weights [rows, K] f32 (with top-k), recv_src_meta [rows, 2] i32, send_rdma_head
/// [T, N] i32 and send_nvl_head [forwarded, G] i32.
pub(crate) fn dispatch_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    inputs: &DispatchInputs,
    (rows, forwarded): (usize, usize),
    (num_tokens, num_nodes, node_pes): (usize, usize, usize),
) -> PyResult<([Bound<'py, PyAny>; 7], InternodeDispatchOutputs)> {
    let ([recv_x, recv_scales], (recv_x_view, scales_view)) =
        recv_x_outputs(py, make, inputs, rows)?;
    let topk = inputs.topk_idx.map(|i| i.cols());
    let topk_shape = [rows, topk.unwrap_or(0)];
    let (idx, idx_view) = make.make_if(py, topk.is_some(), &topk_shape, ElemType::I64)?;
    let (weights, weights_view) = make.make_if(py, topk.is_some(), &topk_shape, ElemType::F32)?;
    let ([meta, rdma_head, nvl_head], [meta_view, rdma_head_view, nvl_head_view]) = make.make_all(
        py,
        [
            (&[rows, 2][..], ElemType::I32),
            (&[num_tokens, num_nodes], ElemType::I32),
            (&[forwarded, node_pes], ElemType::I32),
        ],
    )?;
    let views = InternodeDispatchOutputs {
        recv_x: recv_x_view,
        recv_x_scales: scales_view,
        recv_topk_idx: idx_view,
        recv_topk_weights: weights_view,
        recv_src_meta: meta_view,
        send_rdma_head: rdma_head_view,
        send_nvl_head: nvl_head_view,
    };
    let tensors = [recv_x, recv_scales, idx, weights, meta, rdma_head, nvl_head];
    Ok((tensors, views))
}

/// recv_x and recv_x_scales: the tensors (the second None without scales) and their views.
pub(crate) type RecvX<'py> = ([Bound<'py, PyAny>; 2], (View, Option<View>));

/// recv_x [rows, H] of x's dtype and, with fp8 x, recv_x_scales [rows, S] of x_scales' dtype
/// (row major): what a cached dispatch fills, and the first two outputs of a full one.
pub(crate) fn recv_x_outputs<'py>(
    py: Python<'py>,
    make: &Outputs<'_>,
    inputs: &DispatchInputs,
    rows: usize,
) -> PyResult<RecvX<'py>> {
    let (x, scales) = (&inputs.x, &inputs.x_scales);
    let (recv_x, recv_x_view) = make.make(py, &[rows, x.cols()], x.elem)?;
    let scale_shape = [rows, scales.map_or(0, |s| s.cols())];
    let scale_elem = scales.map_or(ElemType::F32, |s| s.elem);
    let (recv_scales, scales_view) =
        make.make_if(py, scales.is_some(), &scale_shape, scale_elem)?;
    Ok(([recv_x, recv_scales], (recv_x_view, scales_view)))
}
