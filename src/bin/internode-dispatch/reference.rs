//! The host reference of internode-dispatch's checks, from the global routing alone (pure, and
//! CPU-tested below): what each rank receives and forwards in the dispatch and its heads, and
//! what the combine gives back, summed in the kernel's order (bitwise) and flat (exactly, for
//! the tolerance).

use half::bf16;
use nvshmem_tutorial::internode::{Job, channel_range};

// ---- the dispatch -----------------------------------------------------------------------------

/// Experts per rank and whether token t of rank s goes to rank r (any of its top-k there).
pub(crate) fn goes_to(job: &Job, s: usize, t: usize, r: usize) -> bool {
    let l = (job.num_experts / job.n_pes) as i64;
    job.routing[s][t]
        .iter()
        .any(|&e| e >= 0 && e / l == r as i64)
}

/// Bit l: token t of rank s goes to rank l of node k.
pub(crate) fn in_node_mask(job: &Job, s: usize, t: usize, k: usize) -> i32 {
    let g = job.node_pes;
    (0..g).fold(0, |m, l| m | (goes_to(job, s, t, k * g + l) as i32) << l)
}

/// Column j of token t's row on rank s: small integers, exact in bf16, that name the row.
pub(crate) fn payload(s: usize, t: usize, j: usize) -> bf16 {
    let v = match j {
        0 => s,
        1 => t % 256,
        2 => t / 256,
        _ => (s * 37 + t * 11 + j) % 200,
    };
    bf16::from_f32(v as f32)
}

/// fp8 calls: byte j of token t's row on rank s (the buffer moves fp8 rows as bytes, so any
/// byte will do; NaN patterns included), naming the row as `payload` does.
pub(crate) fn fp8_payload(s: usize, t: usize, j: usize) -> u8 {
    let v = match j {
        0 => s,
        1 => t % 256,
        2 => t / 256,
        _ => s * 37 + t * 11 + j * 5,
    };
    (v % 256) as u8
}

/// fp8 calls: scale k of token t on rank s, exact in f32 (17 integer bits and 6 fractional
/// ones at 64 ranks of < 1024 tokens), naming (s, t, k).
pub(crate) fn scale(s: usize, t: usize, k: usize) -> f32 {
    (s * 1024 + t) as f32 + k as f32 / 64.0
}

pub(crate) fn weight(s: usize, t: usize, j: usize) -> f32 {
    (1 + (s * 7 + t * 3 + j) % 64) as f32 / 64.0
}

/// What rank `me` receives, in order: (source rank, token), grouped by source rank, then token
/// (channels are contiguous token ranges, so channel order is token order).
pub(crate) fn received(job: &Job, me: usize) -> Vec<(usize, usize)> {
    (0..job.n_pes)
        .flat_map(|s| (0..job.routing[s].len()).map(move |t| (s, t)))
        .filter(|&(s, t)| goes_to(job, s, t, me))
        .collect()
}

/// Handle 8 of source `me`: token t's index in its channel's stream to node k, or -1.
pub(crate) fn send_rdma_head(job: &Job, me: usize) -> Vec<i32> {
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
pub(crate) fn forwarded(job: &Job, me: usize) -> Vec<(usize, i32)> {
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

// ---- the combine ------------------------------------------------------------------------------

/// Column j of what rank r's experts return for token t of rank s: 8 significant bits (exact
/// in bf16) at scales 1, 1/4 and 1/16, either sign, different on every rank, so that sums of
/// a few of them need more bits than bf16 has: they round, and their order shows.
pub(crate) fn expert_out(r: usize, s: usize, t: usize, j: usize) -> bf16 {
    let h = r * 131 + s * 31 + t * 7 + j * 3;
    let mantissa = (128 + h % 128) as f32 / 128.0; // [1, 2), 8 bits
    let scale = [1.0, 0.25, 0.0625][(h / 128 + r) % 3];
    let sign = if (h / 384).is_multiple_of(2) {
        1.0
    } else {
        -1.0
    };
    bf16::from_f32(sign * mantissa * scale)
}

/// Top-k weight j that rank r sends back for token t of rank s: sixteenths in (0, 1], exact,
/// so any sum of a few of them is exact in fp32 and names the ranks summed.
pub(crate) fn combine_weight(r: usize, s: usize, t: usize, j: usize) -> f32 {
    (1 + (r * 3 + s * 5 + t + j) % 16) as f32 / 16.0
}

/// Column j of bias `which` (0 or 1) for token t: quarters and eighths, exact in bf16.
pub(crate) fn bias(which: usize, t: usize, j: usize) -> bf16 {
    let v = if which == 0 {
        ((t * 5 + j) % 17) as f32 / 4.0 - 2.0
    } else {
        ((t * 3 + j * 7) % 23) as f32 / 8.0 - 1.375
    };
    bf16::from_f32(v)
}

/// The ranks token t of rank `me` went to, by node (node order, then member order).
fn ranks_by_node(job: &Job, me: usize, t: usize) -> Vec<Vec<usize>> {
    let g = job.node_pes;
    (0..job.n_pes / g)
        .map(|k| {
            (k * g..(k + 1) * g)
                .filter(|&r| goes_to(job, me, t, r))
                .collect()
        })
        .collect()
}

// ANCHOR: two_level
/// Token t of rank `me` combined, as the kernel sums it: each node's rows in member order from
/// 0 in fp32, rounded to bf16 (the forwarder); then 0 + bias0 + bias1 + the node sums in node
/// order in fp32, rounded once (home). `biases`: which of the two the call adds.
pub(crate) fn two_level(
    job: &Job,
    me: usize,
    t: usize,
    hidden: usize,
    biases: [bool; 2],
) -> Vec<bf16> {
    let nodes = ranks_by_node(job, me, t);
    (0..hidden)
        .map(|j| {
            let mut acc = 0.0f32;
            for (which, _) in biases.iter().enumerate().filter(|&(_, &on)| on) {
                acc += bias(which, t, j).to_f32();
            }
            for ranks in nodes.iter().filter(|r| !r.is_empty()) {
                let node_sum = ranks
                    .iter()
                    .fold(0.0f32, |sum, &r| sum + expert_out(r, me, t, j).to_f32());
                acc += bf16::from_f32(node_sum).to_f32();
            }
            bf16::from_f32(acc)
        })
        .collect()
}
// ANCHOR_END: two_level

/// The same row summed flat and exactly (f64: every term is a short dyadic), with each
/// element's magnitude, the sum of its terms' absolute values.
pub(crate) fn flat(
    job: &Job,
    me: usize,
    t: usize,
    hidden: usize,
    biases: [bool; 2],
) -> Vec<(f64, f64)> {
    let ranks: Vec<usize> = (0..job.n_pes).filter(|&r| goes_to(job, me, t, r)).collect();
    (0..hidden)
        .map(|j| {
            let terms = (0..2)
                .filter(|&which| biases[which])
                .map(|which| bias(which, t, j))
                .chain(ranks.iter().map(|&r| expert_out(r, me, t, j)))
                .map(|v| f64::from(v.to_f32()));
            terms.fold((0.0, 0.0), |(sum, size), v| (sum + v, size + v.abs()))
        })
        .collect()
}

/// How far a combined element may be from the exact sum, as a share of its magnitude: bf16
/// rounds to 8 significant bits (at most 2^-8 of a value off), and a row that crosses nodes is
/// rounded twice (each node's sum at the forwarder, the total at home); fp32's own error adds
/// under 2^-20 of the magnitude at these sizes.
pub(crate) const TOLERANCE: f64 = 1.0 / 128.0 + 1.0 / (1 << 20) as f64;

/// Top-k weight j of token t of rank `me` combined: the ranks' weights by node (member order)
/// and then over nodes, in fp32 (exact for these weights in any order).
pub(crate) fn combined_weight(job: &Job, me: usize, t: usize, j: usize) -> f32 {
    ranks_by_node(job, me, t)
        .iter()
        .map(|ranks| {
            ranks
                .iter()
                .fold(0.0f32, |sum, &r| sum + combine_weight(r, me, t, j))
        })
        .fold(0.0f32, |sum, node| sum + node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::internode_case::Case;
    use crate::{RDMA_CHUNKS, combine_config};
    use nvshmem_tutorial::Config;
    use nvshmem_tutorial::internode::flat as notify_flat;

    /// Every call's RDMA ring fits the regions sized for the hint's (chunk 6: 132 slots), the
    /// dispatch's and the combine's.
    #[test]
    fn every_calls_rdma_ring_fits_the_regions() {
        for i in 0..2 * RDMA_CHUNKS.len() * 5 {
            let combine = combine_config(24, i).unwrap();
            for chunk in RDMA_CHUNKS {
                let config = Config::new(128, 8, 256, chunk, 128).unwrap();
                assert!(
                    config.num_max_rdma_chunked_recv_tokens <= 132,
                    "chunk {chunk}"
                );
            }
            assert!(combine.num_max_rdma_chunked_recv_tokens <= 132);
            assert_ne!(
                combine.num_max_rdma_chunked_send_tokens,
                RDMA_CHUNKS[(i / 5) % RDMA_CHUNKS.len()],
                "call {i}: the combine's chunk is not its dispatch's"
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
                    let want = notify_flat(job, me);
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

    /// The reference rounds as the kernel's `__float2bfloat16_rn`: to nearest, ties to even.
    #[test]
    fn bf16_rounds_to_nearest_even_as_the_kernel() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to 1 (even); 1 + 3 x 2^-8 to 1 + 2^-6.
        assert_eq!(bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
        assert_eq!(bf16::from_f32(1.0 + 3.0 / 256.0).to_f32(), 1.0 + 1.0 / 64.0);
        assert_eq!(
            bf16::from_f32(-(1.0 + 3.0 / 256.0)).to_f32(),
            -(1.0 + 1.0 / 64.0)
        );
        // Just above halfway rounds up.
        assert_eq!(
            bf16::from_f32(1.0 + 1.0 / 256.0 + 1.0 / 65536.0).to_f32(),
            1.0 + 1.0 / 128.0
        );
    }

    /// The kernel's order agrees with the flat exact sum within TOLERANCE everywhere, and the
    /// rounding it does is real: on topologies with several ranks per token, some elements
    /// differ from the flat sum rounded once, so the bitwise check sees the order.
    #[test]
    fn the_two_level_sum_is_within_the_tolerance_of_the_flat_one() {
        let mut differs = 0;
        for (n, g) in [(2, 1), (4, 2), (8, 4), (8, 2), (8, 1)] {
            for i in 0..6 {
                let case = Case::new(i as u64 * 17 + n as u64, n, g, i);
                let job = &case.job;
                let biases = [i % 2 == 1, i % 3 == 0];
                for me in 0..n {
                    for t in 0..job.routing[me].len().min(40) {
                        let got = two_level(job, me, t, 64, biases);
                        for (j, &(sum, size)) in flat(job, me, t, 64, biases).iter().enumerate() {
                            let v = f64::from(got[j].to_f32());
                            assert!(
                                (v - sum).abs() <= TOLERANCE * size,
                                "n {n} g {g} me {me} t {t} j {j}: {v} vs {sum} ({size})"
                            );
                            differs += usize::from(got[j] != bf16::from_f64(sum));
                        }
                    }
                }
            }
        }
        assert!(differs > 1000, "only {differs} elements show the order");
    }

    /// A token sent to no rank combines to its biases alone; its weights to 0.
    #[test]
    fn a_token_sent_nowhere_is_its_biases() {
        let case = Case::new(5, 4, 2, 0);
        let mut job = case.job;
        job.routing[1][0] = vec![-1; job.routing[1][0].len()];
        let row = two_level(&job, 1, 0, 16, [true, true]);
        for (j, v) in row.iter().enumerate() {
            let want = bf16::from_f32(bias(0, 0, j).to_f32() + bias(1, 0, j).to_f32());
            assert_eq!(*v, want);
        }
        assert_eq!(
            two_level(&job, 1, 0, 16, [false, false]),
            vec![bf16::ZERO; 16]
        );
        assert_eq!(combined_weight(&job, 1, 0, 3), 0.0);
    }

    /// fp8 calls' data names its row exactly: every scale of up to 64 ranks of < 1024 tokens
    /// and 64 scales is exact in f32 and distinct, and bytes 0-2 of a row give (rank, token).
    #[test]
    fn fp8_rows_and_scales_name_their_token() {
        let mut seen = std::collections::HashSet::new();
        for s in (0..64).step_by(7) {
            for t in (0..1024).step_by(37) {
                for k in 0..64 {
                    let v = scale(s, t, k);
                    assert_eq!(f64::from(v), (s * 1024 + t) as f64 + k as f64 / 64.0);
                    assert!(seen.insert(v.to_bits()), "({s}, {t}, {k})");
                }
                let bytes = [0, 1, 2].map(|j| usize::from(fp8_payload(s, t, j)));
                assert_eq!((bytes[0], bytes[1] + 256 * bytes[2]), (s, t));
            }
        }
    }
}
