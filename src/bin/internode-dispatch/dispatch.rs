//! One dispatch of internode-dispatch's loop: the full notify, the dispatch of rows that say
//! where they came from, and every output against the reference (`reference.rs`). What it
//! leaves on the GPU (the layout, the handle, the outputs) is the combine's input.

use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use nvshmem_tutorial::internode::Job;
use nvshmem_tutorial::{
    BufferError, DispatchInputs, InternodeDispatchOutputs, InternodeNotifyCall, NvshmemBuffer,
};

pub(crate) use crate::arrays::{Arrays, Format, Rows};
use crate::internode_case::{Case, HandleArrays, LayoutArrays, host_layout, notify};
use crate::reference::{
    forwarded, fp8_payload, in_node_mask, payload, received, scale, send_rdma_head, weight,
};
use crate::shared::AnyError;

/// One dispatch call of the loop: rows of `hidden` columns, with top-k or not, fp8 (`Some`: how
/// its scales lie) or bf16, and outputs of the notify's counts (`worst` None: the host waits
/// for them) or of `num_worst_tokens` rows (the notify without its wait).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) hidden: usize,
    pub(crate) with_topk: bool,
    pub(crate) fp8: Option<bool>,
    pub(crate) worst: Option<usize>,
}

/// What a dispatch leaves for its combine: the routing (handle 0), positions 1-6, the outputs
/// (heads 8 and 9 among them), their rows, the notify's count when the host waited for it,
/// and the call.
pub(crate) struct Dispatched {
    pub(crate) layout: LayoutArrays,
    pub(crate) handle: HandleArrays,
    pub(crate) arrays: Arrays,
    /// Rows of the outputs: the notify's count, or num_worst_tokens.
    pub(crate) num_rows: usize,
    pub(crate) counted: Option<usize>,
    pub(crate) num_topk: Option<usize>,
    pub(crate) call: Call,
}

impl Dispatched {
    /// The rows the notify counted for this rank: the host's count, or (num_worst_tokens: the
    /// host never waited) handle 6's last entry as the notify wrote it on the GPU.
    pub(crate) fn notify_count(&self, stream: &Arc<CudaStream>) -> Result<usize, AnyError> {
        if let Some(counted) = self.counted {
            return Ok(counted);
        }
        let prefix = self.handle.to_host(stream)?.swap_remove(5);
        Ok(prefix.last().copied().unwrap_or(0).max(0) as usize)
    }

    /// The dispatch's inputs and outputs.
    pub(crate) fn views(&self, num_experts: usize) -> (DispatchInputs, InternodeDispatchOutputs) {
        (self.arrays.inputs(num_experts), self.arrays.outputs())
    }
}

/// The arrays of `case`'s dispatch `call` on the GPU, outputs poisoned: with the notify's
/// counts, the full notify first (collective, the host waits for the counts); with
/// num_worst_tokens nothing launches.
pub(crate) fn prepare(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    call: Call,
) -> Result<Dispatched, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let (n, g) = (job.n_pes, job.node_pes);
    let layout = LayoutArrays::new(stream, &host_layout(job, me), n)?;
    let handle = HandleArrays::new(stream, n, n / g, job.num_channels)?;
    let counts = match call.worst {
        Some(_) => None,
        None => {
            let full = InternodeNotifyCall::Full(layout.inputs(case.expert_alignment));
            let counts = notify(buffer, &full, &handle.handle(), &case.config)?;
            Some(counts.ok_or("the notify returned no counts")?)
        }
    };
    let shape = counts
        .as_ref()
        .map_or((call.worst.unwrap_or(0), call.worst.unwrap_or(0)), |c| {
            (c.num_recv_tokens, c.num_rdma_recv_tokens)
        });
    let num_topk = job
        .routing
        .iter()
        .flatten()
        .map(Vec::len)
        .next()
        .unwrap_or(1);
    let format = Format {
        hidden: call.hidden,
        num_topk: call.with_topk.then_some(num_topk),
        fp8: call.fp8,
    };
    Ok(Dispatched {
        arrays: Arrays::new(stream, job, me, &format, shape)?,
        layout,
        handle,
        num_rows: shape.0,
        counted: counts.map(|c| c.num_recv_tokens),
        num_topk: format.num_topk,
        call,
    })
}

/// The dispatch of `d` (with num_worst_tokens the full notify first, without its wait), on the
/// world's stream (collective), synchronised.
pub(crate) fn launch(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
) -> Result<(), AnyError> {
    let stream = buffer.world().stream();
    let handle = d.handle.handle();
    let routing = d.layout.is_token_in_rank.view();
    let (inputs, outputs) = d.views(case.job.num_experts);
    // SAFETY: every view is a live array of this GPU, kept alive until the stream is
    // synchronised below; the world's stream belongs to the buffer's context.
    unsafe {
        if d.call.worst.is_some() {
            let full = InternodeNotifyCall::Full(d.layout.inputs(case.expert_alignment));
            let s = stream.cu_stream();
            buffer.internode_notify_raw(&full, &handle, &case.config, false, s)?;
        }
        buffer.internode_dispatch_raw(
            &inputs,
            routing,
            &handle,
            &outputs,
            &case.config,
            stream.cu_stream(),
        )
    }?;
    stream
        .synchronize()
        .map_err(BufferError::cuda("synchronising after the dispatch"))?;
    Ok(())
}

/// The dispatch of `case` as `call`, every output checked: what it left, and whether every
/// check held.
pub(crate) fn dispatch_and_check(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    call: Call,
    tally: &mut Tally,
) -> Result<(Dispatched, bool), AnyError> {
    let dispatched = prepare(buffer, case, call)?;
    launch(buffer, case, &dispatched)?;
    let ok = check_dispatched(buffer, case, &dispatched, tally)?;
    Ok((dispatched, ok))
}

/// Every output of the dispatch `d` left against the reference, the failure record first:
/// whether all held.
pub(crate) fn check_dispatched(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    d: &Dispatched,
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let world = buffer.world();
    let (me, stream) = (world.my_pe(), world.stream());
    let job = &case.job;
    let before = tally.failed;
    let record = buffer.check();
    tally.check(me, record.is_ok(), || {
        format!("{}: the failure record: {record:?}", case.describe())
    });
    let recv_gbl_rank_prefix_sum = d.handle.to_host(stream)?.swap_remove(5);
    check_received(job, me, d, &recv_gbl_rank_prefix_sum, stream, tally)?;
    check_heads(job, me, &d.arrays, stream, tally)?;
    if tally.failed > before {
        eprintln!("pe {me}: {} ({:?})", case.describe(), d.call);
    }
    Ok(tally.failed == before)
}

/// recv_x, recv_src_meta and the top-k against the reference rows, and the order against
/// handle 6 (rows of source s between its prefix sums); with num_worst_tokens, recv_topk_idx
/// -1 on every row past those received.
fn check_received(
    job: &Job,
    me: usize,
    d: &Dispatched,
    recv_gbl_rank_prefix_sum: &[i32],
    stream: &Arc<CudaStream>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let arrays = &d.arrays;
    let want = received(job, me);
    check_rows(&want, me, &arrays.rows, stream, tally)?;
    let meta = arrays.recv_src_meta.to_host(stream)?;
    let g = job.node_pes;
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
        let k = d.num_topk.unwrap_or(1);
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
        if d.call.worst.is_some() {
            let past = &idx[(want.len() * k).min(idx.len())..];
            tally.check(me, past.iter().all(|&e| e == -1), || {
                format!(
                    "recv_topk_idx: not -1 on the {} rows past those received",
                    past.len() / k
                )
            });
        }
    }
    Ok(())
}

/// recv_x against the reference rows `want` (source, token), in order, and with fp8 the
/// scales, all exactly (bf16 values by their bits, fp8 as bytes, scales by their bits). The
/// outputs may hold more rows (num_worst_tokens): those past `want` are not compared.
pub(crate) fn check_rows(
    want: &[(usize, usize)],
    me: usize,
    rows: &Rows,
    stream: &Arc<CudaStream>,
    tally: &mut Tally,
) -> Result<(), AnyError> {
    let hidden = rows.recv_x().0.cols();
    let rows_ok = match rows {
        Rows::Bf16(a) => {
            let got = a[1].to_host(stream)?;
            want.len() * hidden <= got.len()
                && want.iter().enumerate().all(|(r, &(s, t))| {
                    (0..hidden).all(|j| got[r * hidden + j].to_bits() == payload(s, t, j).to_bits())
                })
        }
        Rows::Fp8(f) => {
            let got = f.recv_x.to_host(stream)?;
            want.len() * hidden <= got.len()
                && want.iter().enumerate().all(|(r, &(s, t))| {
                    (0..hidden).all(|j| got[r * hidden + j].0 == fp8_payload(s, t, j))
                })
        }
    };
    tally.check(me, rows_ok, || {
        format!(
            "recv_x: not the {} rows of the reference, in order",
            want.len()
        )
    });
    if let Rows::Fp8(f) = rows {
        let got = f.recv_x_scales.to_host(stream)?;
        let k_count = f.recv_x_scales.view().cols();
        let ok = want.len() * k_count <= got.len()
            && want.iter().enumerate().all(|(r, &(s, t))| {
                (0..k_count).all(|k| got[r * k_count + k].to_bits() == scale(s, t, k).to_bits())
            });
        tally.check(me, ok, || {
            "recv_x_scales: not the rows' scales, in order".into()
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
    let mut ok = nvl.len() >= rows.len() * g; // num_worst_tokens: rows past are not read
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
