//! One dispatch of internode-dispatch's loop: the full notify, the dispatch of rows that say
//! where they came from, and every output against the reference (`reference.rs`). What it
//! leaves on the GPU (the layout, the handle, the outputs) is the combine's input.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{
    DeviceArray, DispatchInputs, InternodeDispatchOutputs, InternodeNotifyCall, NvshmemBuffer,
};

use crate::internode_case::{Case, HandleArrays, LayoutArrays, POISON, host_layout, notify};
use crate::reference::{forwarded, in_node_mask, payload, received, send_rdma_head, weight};
use crate::shared::AnyError;

/// The dispatch's arrays of one call on the GPU, outputs poisoned.
pub(crate) struct Arrays {
    x: DeviceArray<bf16>,
    topk_idx: Option<DeviceArray<i64>>,
    topk_weights: Option<DeviceArray<f32>>,
    recv_x: DeviceArray<bf16>,
    recv_topk_idx: Option<DeviceArray<i64>>,
    recv_topk_weights: Option<DeviceArray<f32>>,
    recv_src_meta: DeviceArray<i32>,
    pub(crate) send_rdma_head: DeviceArray<i32>,
    pub(crate) send_nvl_head: DeviceArray<i32>,
}

impl Arrays {
    fn new(
        stream: &Arc<CudaStream>,
        job: &Job,
        me: usize,
        hidden: usize,
        num_topk: Option<usize>,
        (m, m_r): (usize, usize),
    ) -> Result<Self, AnyError> {
        let (g, nodes) = (job.node_pes, job.n_pes / job.node_pes);
        let tokens = &job.routing[me];
        let t_count = tokens.len();
        let rows: Vec<bf16> = (0..t_count)
            .flat_map(|t| (0..hidden).map(move |j| payload(me, t, j)))
            .collect();
        let poison_i32 = |rows: usize, cols: usize| {
            DeviceArray::from_host(stream, &vec![POISON; rows * cols], rows, cols)
        };
        let (mut topk_idx, mut topk_weights, mut recv_topk_idx, mut recv_topk_weights) =
            (None, None, None, None);
        if let Some(k) = num_topk {
            let ids: Vec<i64> = tokens.iter().flatten().copied().collect();
            let weights: Vec<f32> = (0..t_count * k).map(|i| weight(me, i / k, i % k)).collect();
            topk_idx = Some(DeviceArray::from_host(stream, &ids, t_count, k)?);
            topk_weights = Some(DeviceArray::from_host(stream, &weights, t_count, k)?);
            recv_topk_idx = Some(DeviceArray::from_host(stream, &vec![-7777; m * k], m, k)?);
            recv_topk_weights = Some(DeviceArray::from_host(
                stream,
                &vec![f32::NAN; m * k],
                m,
                k,
            )?);
        }
        Ok(Self {
            x: DeviceArray::from_host(stream, &rows, t_count, hidden)?,
            topk_idx,
            topk_weights,
            recv_x: DeviceArray::from_host(
                stream,
                &vec![bf16::from_bits(u16::MAX); m * hidden],
                m,
                hidden,
            )?,
            recv_topk_idx,
            recv_topk_weights,
            recv_src_meta: poison_i32(m, 2)?,
            send_rdma_head: poison_i32(t_count, nodes)?,
            send_nvl_head: poison_i32(m_r, g)?,
        })
    }

    fn outputs(&self) -> InternodeDispatchOutputs {
        InternodeDispatchOutputs {
            recv_x: self.recv_x.view(),
            recv_topk_idx: self.recv_topk_idx.as_ref().map(DeviceArray::view),
            recv_topk_weights: self.recv_topk_weights.as_ref().map(DeviceArray::view),
            recv_src_meta: self.recv_src_meta.view(),
            send_rdma_head: self.send_rdma_head.view(),
            send_nvl_head: self.send_nvl_head.view(),
        }
    }
}

/// What a dispatch leaves for its combine: the routing (handle 0), positions 1-6, the outputs
/// (heads 8 and 9 among them), the rows received and whether it ran with top-k.
pub(crate) struct Dispatched {
    pub(crate) layout: LayoutArrays,
    pub(crate) handle: HandleArrays,
    pub(crate) arrays: Arrays,
    pub(crate) num_recv_tokens: usize,
    pub(crate) num_topk: Option<usize>,
}

/// The full notify and the dispatch of `case`, every output checked: what it left, and whether
/// every check held.
pub(crate) fn dispatch_and_check(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    hidden: usize,
    with_topk: bool,
    tally: &mut Tally,
) -> Result<(Dispatched, bool), AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let (n, g) = (job.n_pes, job.node_pes);
    let layout = LayoutArrays::new(stream, &host_layout(job, me), n)?;
    let handle_arrays = HandleArrays::new(stream, n, n / g, job.num_channels)?;
    let handle = handle_arrays.handle();
    let full = InternodeNotifyCall::Full(layout.inputs(case.expert_alignment));
    let counts =
        notify(buffer, &full, &handle, &case.config)?.ok_or("the notify returned no counts")?;
    let num_topk = job
        .routing
        .iter()
        .flatten()
        .map(Vec::len)
        .next()
        .unwrap_or(1);
    let topk = with_topk.then_some(num_topk);
    let shape = (counts.num_recv_tokens, counts.num_rdma_recv_tokens);
    let arrays = Arrays::new(stream, job, me, hidden, topk, shape)?;
    let inputs = DispatchInputs {
        x: arrays.x.view(),
        x_scales: None,
        topk_idx: arrays.topk_idx.as_ref().map(DeviceArray::view),
        topk_weights: arrays.topk_weights.as_ref().map(DeviceArray::view),
        num_experts: job.num_experts,
    };
    let routing = layout.is_token_in_rank.view();
    // SAFETY: every view is a live array of this GPU, kept alive until the stream is
    // synchronised below; the world's stream belongs to the buffer's context.
    unsafe {
        buffer.internode_dispatch_raw(
            &inputs,
            routing,
            &handle,
            &arrays.outputs(),
            &case.config,
            stream.cu_stream(),
        )
    }?;
    stream
        .synchronize()
        .map_err(nvshmem_tutorial::BufferError::cuda(
            "synchronising after the dispatch",
        ))?;
    let before = tally.failed;
    let record = buffer.check();
    tally.check(me, record.is_ok(), || {
        format!("{}: the failure record: {record:?}", case.describe())
    });
    let recv_gbl_rank_prefix_sum = handle_arrays.to_host(stream)?.swap_remove(5);
    check_received(job, me, &arrays, &recv_gbl_rank_prefix_sum, stream, tally)?;
    check_heads(job, me, &arrays, stream, tally)?;
    if tally.failed > before {
        eprintln!(
            "pe {me}: {} (hidden {hidden}, top-k {with_topk})",
            case.describe()
        );
    }
    let dispatched = Dispatched {
        layout,
        handle: handle_arrays,
        arrays,
        num_recv_tokens: counts.num_recv_tokens,
        num_topk: topk,
    };
    Ok((dispatched, tally.failed == before))
}

/// recv_x, recv_src_meta and the top-k against the reference rows, and the order against
/// handle 6 (rows of source s between its prefix sums).
fn check_received(
    job: &Job,
    me: usize,
    arrays: &Arrays,
    recv_gbl_rank_prefix_sum: &[i32],
    stream: &Arc<CudaStream>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let want = received(job, me);
    let hidden = arrays.recv_x.view().cols();
    let recv_x = arrays.recv_x.to_host(stream)?;
    let meta = arrays.recv_src_meta.to_host(stream)?;
    let g = job.node_pes;
    let rows_ok = want.len() * hidden == recv_x.len()
        && want.iter().enumerate().all(|(r, &(s, t))| {
            (0..hidden).all(|j| recv_x[r * hidden + j].to_bits() == payload(s, t, j).to_bits())
        });
    tally.check(me, rows_ok, || {
        format!(
            "recv_x: not the {} rows of the reference, in order",
            want.len()
        )
    });
    let order_ok = want.iter().enumerate().all(|(r, &(s, _))| {
        let first = if s > 0 {
            recv_gbl_rank_prefix_sum[s - 1]
        } else {
            0
        } as usize;
        (first..recv_gbl_rank_prefix_sum[s] as usize).contains(&r)
    });
    tally.check(me, order_ok, || {
        "rows outside their source's range of handle 6".into()
    });
    let meta_ok = want.iter().enumerate().all(|(r, &(s, t))| {
        meta[2 * r] == (s / g) as i32 && meta[2 * r + 1] == in_node_mask(job, s, t, me / g)
    });
    tally.check(me, meta_ok, || {
        "recv_src_meta differs from (source node, in-node mask)".into()
    });
    if let (Some(idx), Some(w)) = (&arrays.recv_topk_idx, &arrays.recv_topk_weights) {
        let (idx, w) = (idx.to_host(stream)?, w.to_host(stream)?);
        let l = (job.num_experts / job.n_pes) as i64;
        let k = idx.len() / want.len().max(1);
        let topk_ok = want.iter().enumerate().all(|(r, &(s, t))| {
            (0..k).all(|j| {
                let e = job.routing[s][t][j];
                let local = e >= 0 && e / l == me as i64;
                let (want_id, want_w) = if local {
                    (e - me as i64 * l, weight(s, t, j))
                } else {
                    (-1, 0.0)
                };
                idx[r * k + j] == want_id && w[r * k + j].to_bits() == want_w.to_bits()
            })
        });
        tally.check(me, topk_ok, || {
            "recv_topk_idx / recv_topk_weights differ".into()
        });
    }
    Ok(())
}

/// send_rdma_head exactly; send_nvl_head -1 exactly where the row skips a rank of the node,
/// and per (channel, rank) the indices a permutation of 0..count.
fn check_heads(
    job: &Job,
    me: usize,
    arrays: &Arrays,
    stream: &Arc<CudaStream>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let rdma = arrays.send_rdma_head.to_host(stream)?;
    tally.check(me, rdma == send_rdma_head(job, me), || {
        "send_rdma_head differs".into()
    });
    let nvl = arrays.send_nvl_head.to_host(stream)?;
    let rows = forwarded(job, me);
    let g = job.node_pes;
    let mut streams = vec![Vec::new(); job.num_channels * g];
    let mut ok = nvl.len() == rows.len() * g;
    if ok {
        for (j, &(c, mask)) in rows.iter().enumerate() {
            for l in 0..g {
                let at = nvl[j * g + l];
                if mask >> l & 1 == 0 {
                    ok &= at == -1;
                } else {
                    streams[c * g + l].push(at);
                }
            }
        }
    }
    for s in &mut streams {
        s.sort_unstable();
        ok &= s.iter().enumerate().all(|(i, &at)| at == i as i32);
    }
    tally.check(me, ok, || {
        "send_nvl_head: not -1 off the mask and a permutation per stream".into()
    });
    Ok(())
}
