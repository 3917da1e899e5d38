//! Normal mode across nodes (issue 32; the design is benchmarks/notes/buffer_internode_normal.md):
//! the notify step's arithmetic on the host, before any kernel. `internode_notify` will move
//! counts in two levels: each rank sends one **rail row** per destination node to its rail peer
//! there (the rank with its own local index), then each rank reads the rail rows its node's
//! forwarders received. This module is that exchange as plain Rust (`two_level`), and DeepEP's
//! definitions of the handle's positions computed flat from the global routing (`flat`); the
//! tests hold one against the other on every layout of up to 64 ranks, and the kernel's GPU test
//! will hold its outputs against `flat`.

/// Tokens of channel `c` among `num_tokens` split over `num_channels`: DeepEP's
/// `get_channel_task_range` (ceil-sized contiguous ranges, the last ones possibly empty).
pub fn channel_range(num_tokens: usize, num_channels: usize, c: usize) -> std::ops::Range<usize> {
    let per = num_tokens.div_ceil(num_channels);
    (c * per).min(num_tokens)..((c + 1) * per).min(num_tokens)
}

/// The job: `n_pes` ranks in nodes of `node_pes`, `num_experts` experts (L = E / n per rank),
/// `num_channels` channels, and each rank's routing: `routing[s][t]` the expert ids of rank s's
/// token t (-1 for none).
pub struct Job {
    pub n_pes: usize,
    pub node_pes: usize,
    pub num_experts: usize,
    pub num_channels: usize,
    pub routing: Vec<Vec<Vec<i64>>>,
}

/// What a rank's notify step ends with: DeepEP's handle positions 1-6 and the host counts.
/// Prefixes are inclusive (element i counts 0..=i) except `recv_gbl_channel_prefix_matrix`,
/// which holds the first receive row of (source rank, channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notified {
    /// [N][C]: tokens to node k in channels 0..=c (send side).
    pub rdma_channel_prefix_matrix: Vec<Vec<i32>>,
    /// [n][C]: tokens to rank r in channels 0..=c (send side).
    pub gbl_channel_prefix_matrix: Vec<Vec<i32>>,
    /// [N][C]: tokens this rank forwards from source node b, channels 0..=c.
    pub recv_rdma_channel_prefix_matrix: Vec<Vec<i32>>,
    /// [N]: tokens this rank forwards from source nodes 0..=b.
    pub recv_rdma_rank_prefix_sum: Vec<i32>,
    /// [n][C]: this rank's first receive row of source rank s's channel c (rows by source
    /// rank, then channel, then token).
    pub recv_gbl_channel_prefix_matrix: Vec<Vec<i32>>,
    /// [n]: tokens this rank receives from source ranks 0..=s.
    pub recv_gbl_rank_prefix_sum: Vec<i32>,
    /// [L]: rows for each local expert.
    pub num_recv_tokens_per_expert: Vec<i32>,
}

impl Job {
    fn num_nodes(&self) -> usize {
        self.n_pes / self.node_pes
    }
    fn experts_per_rank(&self) -> usize {
        self.num_experts / self.n_pes
    }
    /// Whether rank s's token t goes to rank r (one of its experts lives there).
    fn to_rank(&self, s: usize, t: usize, r: usize) -> bool {
        let l = self.experts_per_rank() as i64;
        self.routing[s][t]
            .iter()
            .any(|&e| e >= 0 && e / l == r as i64)
    }
    fn to_node(&self, s: usize, t: usize, k: usize) -> bool {
        (k * self.node_pes..(k + 1) * self.node_pes).any(|r| self.to_rank(s, t, r))
    }
    /// Tokens of rank s in channels 0..=c for which `hit(t)`, for every c.
    fn channel_prefix(&self, s: usize, hit: impl Fn(usize) -> bool) -> Vec<i32> {
        let num_tokens = self.routing[s].len();
        let mut sum = 0;
        (0..self.num_channels)
            .map(|c| {
                sum += channel_range(num_tokens, self.num_channels, c)
                    .filter(|&t| hit(t))
                    .count() as i32;
                sum
            })
            .collect()
    }
}

fn inclusive(counts: impl IntoIterator<Item = i32>) -> Vec<i32> {
    let mut sum = 0;
    counts
        .into_iter()
        .map(|x| {
            sum += x;
            sum
        })
        .collect()
}

/// Rank `me`'s notify outputs, by DeepEP's definitions over the global routing.
pub fn flat(job: &Job, me: usize) -> Notified {
    let (n, g, nodes, l) = (
        job.n_pes,
        job.node_pes,
        job.num_nodes(),
        job.experts_per_rank(),
    );
    let (my_node, my_local) = (me / g, me % g);
    let rdma_channel_prefix_matrix = (0..nodes)
        .map(|k| job.channel_prefix(me, |t| job.to_node(me, t, k)))
        .collect();
    let gbl_channel_prefix_matrix = (0..n)
        .map(|r| job.channel_prefix(me, |t| job.to_rank(me, t, r)))
        .collect();
    // Forwarded: from the rail peer on node b, its tokens bound for our node.
    let recv_rdma_channel_prefix_matrix: Vec<Vec<i32>> = (0..nodes)
        .map(|b| {
            job.channel_prefix(b * g + my_local, |t| {
                job.to_node(b * g + my_local, t, my_node)
            })
        })
        .collect();
    // Received: from every rank, its tokens bound for us, by channel.
    let per_channel: Vec<Vec<i32>> = (0..n)
        .map(|s| job.channel_prefix(s, |t| job.to_rank(s, t, me)))
        .collect();
    let num_recv_tokens_per_expert = (0..l)
        .map(|e| {
            let expert = (me * l + e) as i64;
            job.routing
                .iter()
                .flatten()
                .map(|ids| ids.iter().filter(|&&id| id == expert).count() as i32)
                .sum()
        })
        .collect();
    assemble(
        [rdma_channel_prefix_matrix, gbl_channel_prefix_matrix],
        recv_rdma_channel_prefix_matrix,
        per_channel.iter().map(Vec::as_slice),
        num_recv_tokens_per_expert,
    )
}

/// A rank's outputs from what it computed: the send side's two matrices, the channel
/// prefixes of what it forwards (by source node) and of what it receives (by source rank), and
/// its per-expert counts. Receive rows go by source rank, then channel, then token.
fn assemble<'a>(
    [rdma_channel_prefix_matrix, gbl_channel_prefix_matrix]: [Vec<Vec<i32>>; 2],
    recv_rdma_channel_prefix_matrix: Vec<Vec<i32>>,
    received: impl Iterator<Item = &'a [i32]>,
    num_recv_tokens_per_expert: Vec<i32>,
) -> Notified {
    let last = |prefix: &[i32]| prefix.last().copied().unwrap_or(0);
    let recv_rdma_rank_prefix_sum =
        inclusive(recv_rdma_channel_prefix_matrix.iter().map(|p| last(p)));
    let (mut recv_gbl_rank_prefix_sum, mut recv_gbl_channel_prefix_matrix) =
        (Vec::new(), Vec::new());
    let mut before = 0;
    for prefix in received {
        let starts =
            std::iter::once(0).chain(prefix.iter().copied().take(prefix.len().saturating_sub(1)));
        recv_gbl_channel_prefix_matrix.push(starts.map(|x| before + x).collect());
        before += last(prefix);
        recv_gbl_rank_prefix_sum.push(before);
    }
    Notified {
        rdma_channel_prefix_matrix,
        gbl_channel_prefix_matrix,
        recv_rdma_channel_prefix_matrix,
        recv_rdma_rank_prefix_sum,
        recv_gbl_channel_prefix_matrix,
        recv_gbl_rank_prefix_sum,
        num_recv_tokens_per_expert,
    }
}

/// The rail row rank `s` sends to node `k` (to its rail peer k G + s mod G), i32 words:
/// [tokens to each rank of k: G][tokens per expert of k: G L][tokens to k: 1]
/// [node channel prefix: C][rank channel prefixes: G C].
pub fn rail_row(job: &Job, s: usize, k: usize) -> Vec<i32> {
    let (g, l, c) = (job.node_pes, job.experts_per_rank(), job.num_channels);
    let ranks = k * g..(k + 1) * g;
    let tokens = 0..job.routing[s].len();
    let mut row = Vec::with_capacity(rail_row_words(g, l, c));
    row.extend(
        ranks
            .clone()
            .map(|r| tokens.clone().filter(|&t| job.to_rank(s, t, r)).count() as i32),
    );
    row.extend((k * g * l..(k + 1) * g * l).map(|expert| {
        let ids = job.routing[s].iter().flatten();
        ids.filter(|&&id| id == expert as i64).count() as i32
    }));
    row.push(tokens.filter(|&t| job.to_node(s, t, k)).count() as i32);
    row.extend(job.channel_prefix(s, |t| job.to_node(s, t, k)));
    for r in ranks {
        row.extend(job.channel_prefix(s, |t| job.to_rank(s, t, r)));
    }
    row
}

/// Words of one rail row (`rail_row`): G + G L + 1 + C + G C.
pub fn rail_row_words(node_pes: usize, experts_per_rank: usize, num_channels: usize) -> usize {
    node_pes + node_pes * experts_per_rank + 1 + num_channels + node_pes * num_channels
}

/// Rank `me`'s notify outputs through the two-level exchange: the send side from its own
/// routing; the forwarder side from the N rail rows it received (one from the rank with its
/// local index on each node); the receive side from the G x N rail rows its node's forwarders
/// received, read in (source node, forwarder) order, that is, by source rank.
pub fn two_level(job: &Job, me: usize) -> Notified {
    let (g, nodes, l, c) = (
        job.node_pes,
        job.num_nodes(),
        job.experts_per_rank(),
        job.num_channels,
    );
    let (my_node, my_local) = (me / g, me % g);
    // Offsets inside a rail row.
    let (per_expert, node_prefix, rank_prefix) = (g, g + g * l + 1, g + g * l + 1 + c);
    // What forwarder f holds after the rail exchange: rows[b] came from rank b G + f % G.
    let received = |f: usize| -> Vec<Vec<i32>> {
        (0..nodes)
            .map(|b| rail_row(job, b * g + f % g, f / g))
            .collect()
    };

    let mine: Vec<Vec<i32>> = (0..nodes).map(|k| rail_row(job, me, k)).collect();
    let rdma_channel_prefix_matrix = mine
        .iter()
        .map(|row| row[node_prefix..node_prefix + c].to_vec())
        .collect();
    let gbl_channel_prefix_matrix = (0..job.n_pes)
        .map(|r| {
            let at = rank_prefix + (r % g) * c;
            mine[r / g][at..at + c].to_vec()
        })
        .collect();

    let forwarded = received(me);
    let recv_rdma_channel_prefix_matrix: Vec<Vec<i32>> = forwarded
        .iter()
        .map(|row| row[node_prefix..node_prefix + c].to_vec())
        .collect();

    // The node's forwarders' rows, by source rank s = b G + l (read through node_peer).
    let node_rows: Vec<Vec<i32>> = (0..job.n_pes)
        .map(|s| received(my_node * g + s % g).swap_remove(s / g))
        .collect();
    let to_me = rank_prefix + my_local * c;
    let num_recv_tokens_per_expert = (0..l)
        .map(|e| {
            node_rows
                .iter()
                .map(|row| row[per_expert + my_local * l + e])
                .sum()
        })
        .collect();
    assemble(
        [rdma_channel_prefix_matrix, gbl_channel_prefix_matrix],
        recv_rdma_channel_prefix_matrix,
        node_rows.iter().map(|row| &row[to_me..to_me + c]),
        num_recv_tokens_per_expert,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random routing: each rank its own token count (0 included), top-k distinct experts with
    /// some -1, and a bias towards a few nodes so that some (rank, node) pairs get nothing.
    fn job(n: usize, g: usize, num_experts: usize, num_channels: usize, seed: u64) -> Job {
        let mut rng = StdRng::seed_from_u64(seed);
        let routing = (0..n)
            .map(|s| {
                let num_tokens = if s == 1 { 0 } else { rng.random_range(1..300) };
                (0..num_tokens)
                    .map(|_| {
                        let mut ids: Vec<i64> = Vec::new();
                        while ids.len() < 8 {
                            let e = rng.random_range(
                                -1..(num_experts as i64 / 2 + num_experts as i64 / 4),
                            );
                            if e < 0 || !ids.contains(&e) {
                                ids.push(e);
                            }
                        }
                        ids
                    })
                    .collect()
            })
            .collect();
        Job {
            n_pes: n,
            node_pes: g,
            num_experts,
            num_channels,
            routing,
        }
    }

    #[test]
    fn channel_ranges_tile_the_tokens_as_deepeps() {
        for (num_tokens, num_channels) in [(0, 4), (1, 4), (4096, 12), (100, 12), (7, 64)] {
            let ranges: Vec<_> = (0..num_channels)
                .map(|c| channel_range(num_tokens, num_channels, c))
                .collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[num_channels - 1].end, num_tokens);
            assert!(
                ranges.windows(2).all(|w| w[0].end == w[1].start),
                "{num_tokens} / {num_channels}"
            );
            assert!(
                ranges
                    .iter()
                    .all(|r| r.len() <= num_tokens.div_ceil(num_channels))
            );
        }
    }

    /// The two-level exchange gives every rank exactly what DeepEP's definitions give, on every
    /// node size from 1 to 8 at 8, 16 and 64 ranks (the last one sampled).
    #[test]
    fn the_two_level_notify_gives_deepeps_positions_on_every_layout() {
        for (n, seed) in [(8, 1), (16, 2), (64, 3)] {
            for g in [8, 4, 2, 1] {
                let job = job(n, g, 4 * n, 12, seed * 10 + g as u64);
                let ranks: Vec<usize> = if n > 16 {
                    vec![0, 1, g - 1, n / 2 + 3, n - 1]
                } else {
                    (0..n).collect()
                };
                for me in ranks {
                    let want = flat(&job, me);
                    assert_eq!(two_level(&job, me), want, "n {n}, nodes of {g}, rank {me}");
                    // Sanity: what we receive is what everybody sends us.
                    let total: i32 = (0..n)
                        .map(|s| {
                            (0..job.routing[s].len())
                                .filter(|&t| job.to_rank(s, t, me))
                                .count() as i32
                        })
                        .sum();
                    assert_eq!(*want.recv_gbl_rank_prefix_sum.last().unwrap(), total);
                    // A rail row's totals agree with its channel prefixes' last words.
                    let (l, c) = (4, 12);
                    for k in 0..n / g {
                        let row = rail_row(&job, me, k);
                        assert_eq!(row.len(), rail_row_words(g, l, c));
                        let (to_node, node_prefix) = (g + g * l, g + g * l + 1);
                        assert_eq!(row[to_node], row[node_prefix + c - 1]);
                        for local in 0..g {
                            assert_eq!(row[local], row[node_prefix + c + local * c + c - 1]);
                        }
                    }
                }
            }
        }
    }
}
