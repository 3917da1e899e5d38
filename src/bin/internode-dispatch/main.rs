//! Issue 32, step 4's GPU test: the two-level dispatch across nodes (`internode_dispatch`)
//! against a pure reference, on virtual nodes of G ranks:
//!
//! ```text
//! NVSHMEM_TUTORIAL_NODE_PES=G torchrun --standalone --nproc_per_node=N --no-python \
//!     target/release/internode-dispatch [--pairs CALLS] [--timeout-ms MS]
//! ```
//!
//! Each call (`--pairs`, default 1,000) draws fresh routing for every rank (internode-notify's
//! cases: a rank with no tokens, nodes that get nothing, channels and experts changing), runs
//! the full notify, then the dispatch of bf16 rows that say where they came from (source
//! rank, token), without top-k on even calls and with it on odd ones, hidden changing, and
//! compares every output with the reference below, computed from the global routing alone:
//! the rows each rank receives in DeepEP's order (by source rank, then token: the order check,
//! also against handle position 6), their source meta (handle 7), local top-k ids and weights,
//! `send_rdma_head` (handle 8) exactly, and `send_nvl_head` (handle 9) as -1 exactly where a
//! rank of the node is not a destination and a permutation of each NVL stream's indices
//! elsewhere (the forwarder meets chunks of different nodes in any order, as DeepEP's does).
//! The buffer's failure record is read after every call: a route through a peer pointer to
//! another node (CROSS_NODE_POINTER) or a timeout fails the check. On one node it checks that
//! the buffer is refused. Ends `N passed, M failed`.

use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::buffer::{heap_bytes, node_pes_from_env};
use nvshmem_tutorial::internode::{Job, channel_range};
use nvshmem_tutorial::{
    BufferOptions, Config, DeviceArray, DispatchInputs, InternodeDispatchOutputs,
    InternodeNotifyCall, NvshmemBuffer,
};

#[path = "../shared/heap.rs"]
mod heap;
#[allow(dead_code)] // the notify's program reads positions 1-6 back; this one reads none
#[path = "../shared/internode.rs"]
mod internode_case;
#[allow(dead_code)] // routing's weights are for the dispatch programs
#[path = "../shared/mod.rs"]
mod shared;

use internode_case::{
    Case, HandleArrays, LayoutArrays, POISON, host_layout, notify, refused_on_one_node,
};
use shared::{AnyError, soak};

const NUM_CALLS: usize = 1000;
/// bf16 columns of a row, by call.
const HIDDEN: [usize; 3] = [128, 512, 2048];
/// num_max_rdma_chunked_send_tokens, by call (5 calls each, across the channel counts).
const RDMA_CHUNKS: [u32; 4] = [6, 4, 8, 5];

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("internode-dispatch", run())
}

/// (num_nvl_bytes, num_rdma_bytes) for every case on `n` ranks in any node size: the hints of
/// the cases' rings at their most channels (64) and the widest row.
fn region_bytes(n: usize) -> (usize, usize) {
    let config = Config::new(128, 8, 256, 6, 128).expect("a valid config");
    (1..=8.min(n))
        .filter(|&g| n.is_multiple_of(g) && g < n)
        .filter_map(|g| {
            config
                .get_buffer_size_hints_for_nodes(2 * HIDDEN[2], n, g)
                .ok()
        })
        .fold((1 << 20, 1 << 20), |(a, b), (nvl, rdma)| {
            (a.max(nvl), b.max(rdma))
        })
}

fn run() -> Result<bool, AnyError> {
    let args = soak::soak_args()?;
    heap::size_the_heap(|n| {
        let (nvl, rdma) = region_bytes(n);
        heap_bytes(n, nvl, rdma)
    })?;
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let (nvl, rdma) = region_bytes(n);
    let options = args.apply(BufferOptions {
        num_rdma_bytes: rdma,
        ..BufferOptions::normal(nvl)
    });
    let mut tally = Tally::default();
    let g = node_pes_from_env(&world)?;
    if g == n {
        return refused_on_one_node(&world, options, "internode_dispatch");
    }
    let buffer = NvshmemBuffer::new(&world, options)?;
    if me == 0 {
        println!(
            "topology: {n} rank(s) in {} node(s) of {g}: each token once per node by \
             put-with-signal to the rail peer, forwarded inside the node through peer pointers",
            n / g
        );
    }
    let seed = world.job_seed();
    let num_calls = args.pairs.unwrap_or(NUM_CALLS);
    let mut calls = Tally::default();
    let max_num_sms = buffer.internode_max_num_sms()?;
    for i in 0..num_calls {
        let mut case = Case::new(
            seed ^ (i as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            n,
            g,
            i,
        );
        // The RDMA chunk changes between calls (as DeepEP's tuning loop changes it over one
        // buffer): a call then starts its chunks on its own grid, the forwarder returning the
        // skipped positions to the head. Rings of 128 rounded up to the chunk (at most the
        // hint's 132).
        let rdma_chunk = RDMA_CHUNKS[(i / 5) % RDMA_CHUNKS.len()];
        case.config = Config::new(case.config.num_sms, 8, 256, rdma_chunk, 128)?;
        // Every block of the dispatch must be resident: a PE with a share of a GPU gets fewer.
        if case.config.num_sms > max_num_sms {
            case.config.num_sms = max_num_sms;
            case.job.num_channels = case.config.num_channels();
        }
        let (hidden, with_topk) = (HIDDEN[i % HIDDEN.len()], i % 2 == 1);
        if !dispatch_and_check(&buffer, &case, hidden, with_topk, &mut calls)? {
            eprintln!(
                "pe {me}: call {i} ({}, hidden {hidden}, top-k {with_topk}, RDMA chunk \
                 {rdma_chunk}) differed from the reference",
                case.describe()
            );
        }
    }
    println!(
        "pe {me}: {num_calls} dispatches: {} checks passed, {} failed",
        calls.passed, calls.failed
    );
    tally.passed += calls.passed;
    tally.failed += calls.failed;
    drop(buffer);
    Ok(tally.finish(&world)?)
}

// ---- the reference ----------------------------------------------------------------------------

/// Experts per rank and whether token t of rank s goes to rank r (any of its top-k there).
fn goes_to(job: &Job, s: usize, t: usize, r: usize) -> bool {
    let l = (job.num_experts / job.n_pes) as i64;
    job.routing[s][t]
        .iter()
        .any(|&e| e >= 0 && e / l == r as i64)
}

/// Bit l: token t of rank s goes to rank l of node k.
fn in_node_mask(job: &Job, s: usize, t: usize, k: usize) -> i32 {
    let g = job.node_pes;
    (0..g).fold(0, |m, l| m | (goes_to(job, s, t, k * g + l) as i32) << l)
}

/// Column j of token t's row on rank s: small integers, exact in bf16, that name the row.
fn payload(s: usize, t: usize, j: usize) -> bf16 {
    let v = match j {
        0 => s,
        1 => t % 256,
        2 => t / 256,
        _ => (s * 37 + t * 11 + j) % 200,
    };
    bf16::from_f32(v as f32)
}

fn weight(s: usize, t: usize, j: usize) -> f32 {
    (1 + (s * 7 + t * 3 + j) % 64) as f32 / 64.0
}

/// What rank `me` receives, in order: (source rank, token), grouped by source rank, then token
/// (channels are contiguous token ranges, so channel order is token order).
fn received(job: &Job, me: usize) -> Vec<(usize, usize)> {
    (0..job.n_pes)
        .flat_map(|s| (0..job.routing[s].len()).map(move |t| (s, t)))
        .filter(|&(s, t)| goes_to(job, s, t, me))
        .collect()
}

/// Handle 8 of source `me`: token t's index in its channel's stream to node k, or -1.
fn send_rdma_head(job: &Job, me: usize) -> Vec<i32> {
    let (t_count, nodes) = (job.routing[me].len(), job.n_pes / job.node_pes);
    let mut head = vec![-1; t_count * nodes];
    for c in 0..job.num_channels {
        for k in 0..nodes {
            let mut next = 0;
            for t in channel_range(t_count, job.num_channels, c) {
                if in_node_mask(job, me, t, k) != 0 {
                    head[t * nodes + k] = next;
                    next += 1;
                }
            }
        }
    }
    head
}

/// The rows forwarder `me` forwards, in handle 3-4's order (source node, channel, token): each
/// one's channel and in-node mask.
fn forwarded(job: &Job, me: usize) -> Vec<(usize, i32)> {
    let (g, nodes) = (job.node_pes, job.n_pes / job.node_pes);
    let mut rows = Vec::new();
    for b in 0..nodes {
        let s = b * g + me % g;
        for c in 0..job.num_channels {
            for t in channel_range(job.routing[s].len(), job.num_channels, c) {
                let mask = in_node_mask(job, s, t, me / g);
                if mask != 0 {
                    rows.push((c, mask));
                }
            }
        }
    }
    rows
}

// ---- one call ---------------------------------------------------------------------------------

/// The dispatch's arrays of one call on the GPU, outputs poisoned.
struct Arrays {
    x: DeviceArray<bf16>,
    topk_idx: Option<DeviceArray<i64>>,
    topk_weights: Option<DeviceArray<f32>>,
    recv_x: DeviceArray<bf16>,
    recv_topk_idx: Option<DeviceArray<i64>>,
    recv_topk_weights: Option<DeviceArray<f32>>,
    recv_src_meta: DeviceArray<i32>,
    send_rdma_head: DeviceArray<i32>,
    send_nvl_head: DeviceArray<i32>,
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

/// The full notify and the dispatch of `case`, every output checked. Whether all held.
fn dispatch_and_check(
    buffer: &NvshmemBuffer<&World>,
    case: &Case,
    hidden: usize,
    with_topk: bool,
    tally: &mut Tally,
) -> Result<bool, AnyError> {
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
    Ok(tally.failed == before)
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

#[cfg(test)]
mod tests {
    use super::*;
    use nvshmem_tutorial::internode::flat;

    /// Every call's RDMA ring fits the regions sized for the hint's (chunk 6: 132 slots).
    #[test]
    fn every_calls_rdma_ring_fits_the_regions() {
        for chunk in RDMA_CHUNKS {
            let config = Config::new(128, 8, 256, chunk, 128).unwrap();
            assert!(
                config.num_max_rdma_chunked_recv_tokens <= 132,
                "chunk {chunk}"
            );
        }
    }

    /// The reference agrees with `flat` (DeepEP's definitions, which the notify is checked
    /// against): every rank receives handle 6's rows, forwards handle 4's, and its tokens'
    /// heads count handle 1's, on every topology the script runs.
    #[test]
    fn the_reference_agrees_with_the_notifys() {
        for (n, g) in [(2, 1), (4, 2), (4, 1), (8, 4), (8, 2), (8, 1)] {
            for i in 0..12 {
                let case = Case::new(i as u64 * 91 + n as u64, n, g, i);
                let job = &case.job;
                for me in 0..n {
                    let want = flat(job, me);
                    assert_eq!(
                        received(job, me).len() as i32,
                        *want.recv_gbl_rank_prefix_sum.last().unwrap()
                    );
                    assert_eq!(
                        forwarded(job, me).len() as i32,
                        *want.recv_rdma_rank_prefix_sum.last().unwrap()
                    );
                    let nodes = n / g;
                    let heads = send_rdma_head(job, me);
                    for k in 0..nodes {
                        let sent = heads
                            .iter()
                            .skip(k)
                            .step_by(nodes)
                            .filter(|&&h| h >= 0)
                            .count();
                        assert_eq!(
                            sent as i32,
                            *want.rdma_channel_prefix_matrix[k].last().unwrap()
                        );
                    }
                }
            }
        }
    }
}
