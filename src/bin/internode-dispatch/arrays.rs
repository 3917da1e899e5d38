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

/// The f32 scales [T, S] of rank `me`'s T rows as the GPU gets them: the elements in memory
/// order, the array they are allocated as ([rows, cols] for `DeviceArray::from_host`) and the
/// strides (in elements) of the [T, S] view over it, row major or column major (DeepEP's
/// test's layout: the transpose of an [S, T] array). Column major, the storage is a vector of
/// T x S: as an [S, T] matrix it would be an [S, 0] one on a rank with no tokens, which
/// `from_host` reads as a vector of S and refuses for its 0 elements (the refusal that stopped
/// rank 0, the rank without tokens, at pair 4's cached dispatch, the first column-major call).
pub(crate) struct ScaleStorage {
    pub(crate) host: Vec<f32>,
    pub(crate) shape: (usize, usize),
    pub(crate) strides: [usize; 2],
}

impl ScaleStorage {
    pub(crate) fn new(me: usize, t_count: usize, s: usize, column_major: bool) -> Self {
        if column_major {
            let host: Vec<f32> = (0..s)
                .flat_map(|k| (0..t_count).map(move |t| scale(me, t, k)))
                .collect();
            Self {
                shape: (host.len(), 0),
                host,
                // torch's strides of an empty [S, 0] array's transpose are [1, 1].
                strides: [1, t_count.max(1)],
            }
        } else {
            let host: Vec<f32> = (0..t_count)
                .flat_map(|t| (0..s).map(move |k| scale(me, t, k)))
                .collect();
            Self {
                host,
                shape: (t_count, s),
                strides: [s, 1],
            }
        }
    }
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
        let storage = ScaleStorage::new(me, t_count, s, column_major);
        let (rows, cols) = storage.shape;
        let scales = DeviceArray::from_host(stream, &storage.host, rows, cols)?;
        let x_scales = View {
            strides: storage.strides,
            ..View::matrix(scales.view().ptr, t_count, s, ElemType::F32)
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

#[cfg(test)]
mod tests {
    use nvshmem_tutorial::typed::host_shape;

    use super::*;
    use crate::internode_case::Case;
    use crate::{HIDDEN, cached_of, fp8_of};

    /// Every rank's fp8 scales of every fp8 call of the loop (the full dispatches, pairs 2-3 of
    /// every 4, and the cached ones, pairs 4 of every 8) at N = 2, 4, 8 in every node size:
    /// their storage is an array `DeviceArray::from_host` allocates (host_shape is its rule),
    /// and the [T, S] view over it reads scale(me, t, k) at (t, k). Pair 4 at 2 nodes of 1 is
    /// the GPU failure of 2026-11-27: rank 0 has no tokens there (whatever the seed), and its
    /// column-major scales were an [S, 0] matrix, refused before its cached notify, so rank 1
    /// waited for rank 0's row until its timeout.
    #[test]
    fn every_rank_of_every_fp8_call_gets_scales_it_can_allocate() {
        let case = Case::new(0x5eed, 2, 1, 4);
        assert!(case.job.routing[0].is_empty() && !case.job.routing[1].is_empty());
        assert_eq!(cached_of(4), Some(Some(true)));
        for (n, g) in [(2, 1), (4, 1), (4, 2), (8, 1), (8, 2), (8, 4)] {
            for i in 0..48 {
                let cached = cached_of(i).flatten();
                for column_major in [fp8_of(i), cached].into_iter().flatten() {
                    for seed in 0..4u64 {
                        let case = Case::new(seed ^ (i as u64 + 7), n, g, i);
                        for me in 0..n {
                            let t_count = case.job.routing[me].len();
                            let s = HIDDEN[i % HIDDEN.len()] / 128;
                            let st = ScaleStorage::new(me, t_count, s, column_major);
                            let (rows, cols) = st.shape;
                            let shape = host_shape(st.host.len(), rows, cols);
                            assert!(
                                shape.is_ok(),
                                "pair {i}, rank {me} of {n} in nodes of {g}, {t_count} tokens, \
                                 column major {column_major}: {shape:?}"
                            );
                            assert_eq!(st.host.len(), t_count * s);
                            let [a, b] = st.strides;
                            for (t, k) in (0..t_count).flat_map(|t| (0..s).map(move |k| (t, k))) {
                                let got = st.host[t * a + k * b];
                                assert_eq!(got.to_bits(), scale(me, t, k).to_bits());
                            }
                        }
                    }
                }
            }
        }
    }
}
