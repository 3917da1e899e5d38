//! The arrays of one dispatch of internode-dispatch's loop on the GPU: rows that say where
//! they came from (bf16, or fp8 bytes with f32 scales in either layout), top-k, and the
//! outputs, poisoned.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{
    DeviceArray, DispatchInputs, ElemType, Fp8E4m3, InternodeDispatchOutputs, View,
};

use crate::internode_case::POISON;
use crate::reference::{fp8_payload, payload, scale, weight};
use crate::shared::AnyError;

/// What a dispatch call sends: rows of `hidden` columns, top-k of K or none, and bf16 or fp8.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub(crate) hidden: usize,
    pub(crate) num_topk: Option<usize>,
    /// fp8 bytes with f32 scales [T, hidden / 128]: `Some(column_major)` says how the scales lie
    /// (DeepEP's test passes column-major ones); None: bf16.
    pub(crate) fp8: Option<bool>,
}

impl Format {
    pub(crate) fn num_scales(&self) -> usize {
        self.fp8.map_or(0, |_| self.hidden / 128)
    }
}

/// The rows a dispatch sends and receives: bf16 ([x, recv_x]), or fp8 bytes with their scales.
pub(crate) enum Rows {
    Bf16(Box<[DeviceArray<bf16>; 2]>),
    Fp8(Box<Fp8Rows>),
}

/// fp8 rows: the bytes, their scales and what receives them.
pub(crate) struct Fp8Rows {
    x: DeviceArray<Fp8E4m3>,
    /// [T, S] as a [T, S] or (column-major) an [S, T] array: `x_scales` is the view.
    _scales: DeviceArray<f32>,
    x_scales: View,
    pub(crate) recv_x: DeviceArray<Fp8E4m3>,
    pub(crate) recv_x_scales: DeviceArray<f32>,
}

impl Rows {
    /// Rank `me`'s rows of `t_count` tokens in format `f`, and outputs of `m` rows poisoned.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        me: usize,
        t_count: usize,
        f: &Format,
        m: usize,
    ) -> Result<Self, AnyError> {
        let hidden = f.hidden;
        let Some(column_major) = f.fp8 else {
            let rows: Vec<bf16> = (0..t_count)
                .flat_map(|t| (0..hidden).map(move |j| payload(me, t, j)))
                .collect();
            let poison = vec![bf16::from_bits(u16::MAX); m * hidden];
            return Ok(Self::Bf16(Box::new([
                DeviceArray::from_host(stream, &rows, t_count, hidden)?,
                DeviceArray::from_host(stream, &poison, m, hidden)?,
            ])));
        };
        let s = f.num_scales();
        let bytes: Vec<Fp8E4m3> = (0..t_count)
            .flat_map(|t| (0..hidden).map(move |j| Fp8E4m3(fp8_payload(me, t, j))))
            .collect();
        let (scales, x_scales) = if column_major {
            let host: Vec<f32> = (0..s)
                .flat_map(|k| (0..t_count).map(move |t| scale(me, t, k)))
                .collect();
            let a = DeviceArray::from_host(stream, &host, s, t_count)?;
            let view = View {
                strides: [1, t_count.max(1)],
                ..View::matrix(a.view().ptr, t_count, s, ElemType::F32)
            };
            (a, view)
        } else {
            let host: Vec<f32> = (0..t_count)
                .flat_map(|t| (0..s).map(move |k| scale(me, t, k)))
                .collect();
            let a = DeviceArray::from_host(stream, &host, t_count, s)?;
            let view = a.view();
            (a, view)
        };
        Ok(Self::Fp8(Box::new(Fp8Rows {
            x: DeviceArray::from_host(stream, &bytes, t_count, hidden)?,
            _scales: scales,
            x_scales,
            recv_x: DeviceArray::from_host(stream, &vec![Fp8E4m3(0xFF); m * hidden], m, hidden)?,
            recv_x_scales: DeviceArray::from_host(stream, &vec![f32::NAN; m * s], m, s)?,
        })))
    }

    /// (x, x_scales) for the inputs.
    pub(crate) fn x(&self) -> (View, Option<View>) {
        match self {
            Self::Bf16(a) => (a[0].view(), None),
            Self::Fp8(f) => (f.x.view(), Some(f.x_scales)),
        }
    }

    /// (recv_x, recv_x_scales) for the outputs.
    pub(crate) fn recv_x(&self) -> (View, Option<View>) {
        match self {
            Self::Bf16(a) => (a[1].view(), None),
            Self::Fp8(f) => (f.recv_x.view(), Some(f.recv_x_scales.view())),
        }
    }
}

/// The dispatch's arrays of one call on the GPU, outputs poisoned.
pub(crate) struct Arrays {
    pub(crate) rows: Rows,
    topk_idx: Option<DeviceArray<i64>>,
    topk_weights: Option<DeviceArray<f32>>,
    pub(crate) recv_topk_idx: Option<DeviceArray<i64>>,
    pub(crate) recv_topk_weights: Option<DeviceArray<f32>>,
    pub(crate) recv_src_meta: DeviceArray<i32>,
    pub(crate) send_rdma_head: DeviceArray<i32>,
    pub(crate) send_nvl_head: DeviceArray<i32>,
}

impl Arrays {
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        job: &Job,
        me: usize,
        f: &Format,
        (m, m_r): (usize, usize),
    ) -> Result<Self, AnyError> {
        let (g, nodes) = (job.node_pes, job.n_pes / job.node_pes);
        let tokens = &job.routing[me];
        let t_count = tokens.len();
        let poison_i32 = |rows: usize, cols: usize| {
            DeviceArray::from_host(stream, &vec![POISON; rows * cols], rows, cols)
        };
        let (mut topk_idx, mut topk_weights, mut recv_topk_idx, mut recv_topk_weights) =
            (None, None, None, None);
        if let Some(k) = f.num_topk {
            let ids: Vec<i64> = tokens.iter().flatten().copied().collect();
            let weights: Vec<f32> = (0..t_count * k).map(|i| weight(me, i / k, i % k)).collect();
            topk_idx = Some(DeviceArray::from_host(stream, &ids, t_count, k)?);
            topk_weights = Some(DeviceArray::from_host(stream, &weights, t_count, k)?);
            recv_topk_idx = Some(DeviceArray::from_host(stream, &vec![-7777; m * k], m, k)?);
            let nan = vec![f32::NAN; m * k];
            recv_topk_weights = Some(DeviceArray::from_host(stream, &nan, m, k)?);
        }
        Ok(Self {
            rows: Rows::new(stream, me, t_count, f, m)?,
            topk_idx,
            topk_weights,
            recv_topk_idx,
            recv_topk_weights,
            recv_src_meta: poison_i32(m, 2)?,
            send_rdma_head: poison_i32(t_count, nodes)?,
            send_nvl_head: poison_i32(m_r, g)?,
        })
    }

    pub(crate) fn outputs(&self) -> InternodeDispatchOutputs {
        let (recv_x, recv_x_scales) = self.rows.recv_x();
        InternodeDispatchOutputs {
            recv_x,
            recv_x_scales,
            recv_topk_idx: self.recv_topk_idx.as_ref().map(DeviceArray::view),
            recv_topk_weights: self.recv_topk_weights.as_ref().map(DeviceArray::view),
            recv_src_meta: self.recv_src_meta.view(),
            send_rdma_head: self.send_rdma_head.view(),
            send_nvl_head: self.send_nvl_head.view(),
        }
    }

    pub(crate) fn inputs(&self, num_experts: usize) -> DispatchInputs {
        let (x, x_scales) = self.rows.x();
        DispatchInputs {
            x,
            x_scales,
            topk_idx: self.topk_idx.as_ref().map(DeviceArray::view),
            topk_weights: self.topk_weights.as_ref().map(DeviceArray::view),
            num_experts,
        }
    }
}
