//! Which algorithm runs a call, and with how many blocks: pure functions of the call's size,
//! the PE count and the GPU, so the whole choice is testable without a GPU.

use crate::config::{COLL_THREADS, MAX_BLOCKS, SYNC_THREADS};
use crate::error::CollError;

/// The collectives of this chapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    SyncAll,
    Broadcast,
    AllGather,
    ReduceScatter,
    AllReduce,
    AllToAll,
    AllToAllV,
}

impl Collective {
    pub fn name(self) -> &'static str {
        match self {
            Self::SyncAll => "sync_all",
            Self::Broadcast => "broadcast",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllReduce => "all_reduce",
            Self::AllToAll => "all_to_all",
            Self::AllToAllV => "all_to_all_v",
        }
    }

    /// The algorithms that implement it, fastest-for-small first.
    pub fn algorithms(self) -> &'static [Algorithm] {
        use Algorithm::*;
        match self {
            Self::SyncAll => &[Signal],
            Self::Broadcast => &[OneShot, ScatterGather, ScatterGatherUnits],
            Self::AllGather => &[OneShot, Direct, Ring],
            Self::ReduceScatter => &[OneShot, Pull],
            Self::AllReduce => &[OneShot, TwoShot, RsAg],
            Self::AllToAll => &[OneShot, Direct],
            Self::AllToAllV => &[Direct],
        }
    }

    /// Bytes each PE sends to one peer when the call's size (nccl-tests' definition, see
    /// [`SIZE_TABLE`]) is `size_bytes`: what an LL slot must hold, and what a block count is
    /// scaled by.
    pub fn per_peer_bytes(self, size_bytes: usize, n_pes: usize) -> usize {
        match self {
            Self::AllGather | Self::ReduceScatter | Self::AllToAll | Self::AllToAllV => {
                size_bytes / n_pes.max(1)
            }
            Self::SyncAll | Self::Broadcast | Self::AllReduce => size_bytes,
        }
    }
}

/// How a collective moves its bytes (chapter 4 explains each with a figure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The barrier: every PE announces the call and waits for everyone's announcement.
    Signal,
    /// LL lines (data and flag in one 8-byte store) straight into every receiver's scratch:
    /// one link traversal, no barrier, half of every line is flag. Small messages.
    OneShot,
    /// Reduce-scatter then all-gather, both through peer pointers. Large all-reduce.
    TwoShot,
    /// After every PE entered the call, stores straight into every peer's symmetric output,
    /// then one ticket per block. Large messages.
    Direct,
    /// n - 1 steps, each PE forwarding one block to its successor.
    Ring,
    /// Broadcast as scatter, then all-gather: no PE sends much more than the message. Its
    /// pipeline runs in units of a whole block, each signalling its own steps.
    ScatterGather,
    /// The same pipeline in units of 4 warps (4 per block, on at most
    /// [`BROADCAST_UNIT_BLOCKS`] blocks): each unit waits for its own steps only, so the first
    /// steps are shorter. Broadcasts from [`BROADCAST_UNITS_FROM`] to [`BROADCAST_UNITS_UP_TO`] at more than 2 PEs.
    ScatterGatherUnits,
    /// Each PE reads its chunk from every peer's symmetric input and sums it.
    Pull,
    /// All-reduce as two launches: the two-shot's reduce-scatter into this PE's chunk of the
    /// output, then the direct all-gather of the chunks. Largest all-reduce.
    RsAg,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Self::Signal => "signal",
            Self::OneShot => "one_shot",
            Self::TwoShot => "two_shot",
            Self::Direct => "direct",
            Self::Ring => "ring",
            Self::ScatterGather => "scatter_gather",
            Self::ScatterGatherUnits => "scatter_gather_units",
            Self::Pull => "pull",
            Self::RsAg => "rs_ag",
        }
    }

    /// Every algorithm, in the order messages list them.
    pub const ALL: [Self; 9] = [
        Self::Signal,
        Self::OneShot,
        Self::TwoShot,
        Self::Direct,
        Self::Ring,
        Self::ScatterGather,
        Self::ScatterGatherUnits,
        Self::Pull,
        Self::RsAg,
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

// ANCHOR: size_table
/// The algorithm each collective uses up to a size, measured on 2x H200 with
/// `ch04-coll-bench` (benchmarks/results/coll_h200_2gpu.csv; the benchmark prints this table
/// next to what it measured). Sizes follow nccl-tests: all-reduce and broadcast count the
/// buffer, all-gather its output, reduce-scatter its input, all-to-all one PE's input.
/// Above the last row of a collective, its last algorithm.
pub const SIZE_TABLE: &[(Collective, usize, Algorithm)] = &[
    (Collective::Broadcast, 256 << 10, Algorithm::OneShot),
    (Collective::Broadcast, usize::MAX, Algorithm::ScatterGather),
    (Collective::AllGather, 1 << 20, Algorithm::OneShot),
    (Collective::AllGather, usize::MAX, Algorithm::Direct),
    (Collective::ReduceScatter, 1 << 20, Algorithm::OneShot),
    (Collective::ReduceScatter, usize::MAX, Algorithm::Pull),
    (Collective::AllReduce, 256 << 10, Algorithm::OneShot),
    // Above 32 MiB, two launches (reduce-scatter, then all-gather into every peer): measured
    // against the two-shot on 4x H100 (benchmarks/notes/collectives.md, "rs_ag").
    (Collective::AllReduce, 32 << 20, Algorithm::TwoShot),
    (Collective::AllReduce, usize::MAX, Algorithm::RsAg),
    (Collective::AllToAll, 1 << 20, Algorithm::OneShot),
    (Collective::AllToAll, usize::MAX, Algorithm::Direct),
    (Collective::AllToAllV, usize::MAX, Algorithm::Direct),
    (Collective::SyncAll, usize::MAX, Algorithm::Signal),
];

/// Where the PE count changes the table's choice: from this size up to
/// [`BROADCAST_UNITS_UP_TO`], at more than 2 PEs, the broadcast's pipeline runs in 4-warp units
/// on [`BROADCAST_UNIT_BLOCKS`] blocks instead of whole blocks (`scatter_gather_units`).
/// Measured on 4x H100 at N = 4 against the block pipeline, both in one run
/// (benchmarks/results/broadcast_units_rule_h100_4gpu_2026-11-27.csv): 3-4% faster at 4 MiB,
/// 9-10% at 16 MiB, level at 64 MiB, 1-2% slower at 256 MiB, 15% slower at 1 MiB. At 2 PEs
/// there is no forwarder, and the block pipeline stays.
pub const BROADCAST_UNITS_FROM: usize = 4 << 20;
/// The largest broadcast that runs in units (above it the block pipeline's fewer, longer steps
/// win by 1-2%).
pub const BROADCAST_UNITS_UP_TO: usize = 64 << 20;
// ANCHOR_END: size_table

/// The blocks the 4-warp units run on (4 units each, one done word per unit in the root's row
/// of MAX_BLOCKS): the grid of the measured variant, 256 units.
pub const BROADCAST_UNIT_BLOCKS: u32 = 64;

/// The table's choice for a call of `size_bytes`, falling back to the next algorithm when the
/// LL scratch (`ll_max_bytes` per peer) cannot hold it; then the PE count's rule
/// ([`BROADCAST_UNITS_FROM`] to [`BROADCAST_UNITS_UP_TO`]).
pub fn choose(
    collective: Collective,
    size_bytes: usize,
    n_pes: usize,
    ll_max_bytes: usize,
) -> Algorithm {
    let chosen = SIZE_TABLE
        .iter()
        .find(|(c, up_to, _)| *c == collective && size_bytes <= *up_to)
        .map(|&(_, _, algorithm)| algorithm)
        .unwrap_or(*collective.algorithms().last().unwrap());
    let chosen = if chosen == Algorithm::OneShot
        && collective.per_peer_bytes(size_bytes, n_pes) > ll_max_bytes
    {
        collective.algorithms()[1]
    } else {
        chosen
    };
    if chosen == Algorithm::ScatterGather
        && n_pes > 2
        && (BROADCAST_UNITS_FROM..=BROADCAST_UNITS_UP_TO).contains(&size_bytes)
    {
        Algorithm::ScatterGatherUnits
    } else {
        chosen
    }
}

/// One launch: the kernel, its grid and block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub collective: Collective,
    pub algorithm: Algorithm,
    pub kernel: &'static str,
    /// A second kernel, launched right after `kernel` with the same grid and arguments, as
    /// a call of its own (rs_ag's all-gather).
    pub then: Option<&'static str>,
    pub num_blocks: u32,
    pub threads_per_block: u32,
}

/// Element type of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Bf16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            Self::Bf16 => 2,
            Self::F32 => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        }
    }
}

/// Bytes each block of a bandwidth algorithm should move per peer: enough 16-byte stores per
/// thread to keep the link busy, few enough that small messages still spread over many SMs.
const BYTES_PER_BLOCK: usize = 16 << 10;

/// The launch for `collective` by `algorithm` at `size_bytes`, or why it cannot run.
/// `dtype` is needed by reductions only.
pub fn plan(
    collective: Collective,
    algorithm: Algorithm,
    size_bytes: usize,
    n_pes: usize,
    dtype: Option<DType>,
    ll_max_bytes: usize,
    num_sms: u32,
) -> Result<Plan, CollError> {
    if !collective.algorithms().contains(&algorithm) {
        return Err(CollError::AlgorithmNotApplicable {
            collective: collective.name(),
            algorithm: algorithm.name(),
            why: format!(
                "{} is implemented by {}",
                collective.name(),
                collective
                    .algorithms()
                    .iter()
                    .map(|a| a.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    let per_peer = collective.per_peer_bytes(size_bytes, n_pes);
    if algorithm == Algorithm::OneShot && per_peer > ll_max_bytes {
        return Err(CollError::AlgorithmNotApplicable {
            collective: collective.name(),
            algorithm: algorithm.name(),
            why: format!(
                "it sends {per_peer} bytes per peer and the LL scratch holds {ll_max_bytes} \
                 (CollectivesConfig::ll_max_bytes)"
            ),
        });
    }
    let max_blocks = num_sms.clamp(1, MAX_BLOCKS as u32);
    let (num_blocks, threads_per_block) = match algorithm {
        Algorithm::Signal => (1, SYNC_THREADS),
        // One 8-byte payload word per thread and peer.
        Algorithm::OneShot => (
            per_peer
                .div_ceil(8)
                .div_ceil(COLL_THREADS as usize)
                .clamp(1, max_blocks as usize) as u32,
            COLL_THREADS,
        ),
        _ => {
            let blocks = per_peer
                .div_ceil(BYTES_PER_BLOCK)
                .clamp(1, max_blocks as usize) as u32;
            if algorithm == Algorithm::ScatterGatherUnits {
                (blocks.min(BROADCAST_UNIT_BLOCKS), COLL_THREADS)
            } else {
                (blocks, COLL_THREADS)
            }
        }
    };
    Ok(Plan {
        collective,
        algorithm,
        kernel: kernel_name(collective, algorithm, dtype),
        then: match (algorithm, dtype) {
            (Algorithm::RsAg, Some(DType::F32)) => Some("coll_all_reduce_ag_f32"),
            (Algorithm::RsAg, _) => Some("coll_all_reduce_ag_bf16"),
            _ => None,
        },
        num_blocks,
        threads_per_block,
    })
}

/// The `extern "C"` kernel of `kernels/cuda/coll_*.cu` that runs it.
fn kernel_name(collective: Collective, algorithm: Algorithm, dtype: Option<DType>) -> &'static str {
    use Algorithm as A;
    use Collective as C;
    let f32 = dtype == Some(DType::F32);
    match (collective, algorithm) {
        (C::SyncAll, _) => "coll_sync_all",
        (C::Broadcast, A::OneShot) => "coll_broadcast_ll",
        (C::Broadcast, A::ScatterGatherUnits) => "coll_broadcast_scatter_units",
        (C::Broadcast, _) => "coll_broadcast_scatter",
        (C::AllGather, A::OneShot) => "coll_all_gather_ll",
        (C::AllGather, A::Ring) => "coll_all_gather_ring",
        (C::AllGather, _) => "coll_all_gather_direct",
        (C::AllToAll, A::OneShot) => "coll_all_to_all_ll",
        (C::AllToAll, _) => "coll_all_to_all_direct",
        (C::AllToAllV, _) => "coll_all_to_all_v",
        (C::ReduceScatter, A::OneShot) if f32 => "coll_reduce_scatter_ll_f32",
        (C::ReduceScatter, A::OneShot) => "coll_reduce_scatter_ll_bf16",
        (C::ReduceScatter, _) if f32 => "coll_reduce_scatter_pull_f32",
        (C::ReduceScatter, _) => "coll_reduce_scatter_pull_bf16",
        (C::AllReduce, A::OneShot) if f32 => "coll_all_reduce_one_shot_f32",
        (C::AllReduce, A::OneShot) => "coll_all_reduce_one_shot_bf16",
        (C::AllReduce, A::RsAg) if f32 => "coll_all_reduce_rs_f32",
        (C::AllReduce, A::RsAg) => "coll_all_reduce_rs_bf16",
        (C::AllReduce, _) if f32 => "coll_all_reduce_two_shot_f32",
        (C::AllReduce, _) => "coll_all_reduce_two_shot_bf16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_collective_has_a_table_row_and_every_row_names_one_of_its_algorithms() {
        for c in [
            Collective::SyncAll,
            Collective::Broadcast,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllReduce,
            Collective::AllToAll,
            Collective::AllToAllV,
        ] {
            let rows: Vec<_> = SIZE_TABLE.iter().filter(|r| r.0 == c).collect();
            assert!(
                rows.last().is_some_and(|r| r.1 == usize::MAX),
                "{c:?} has no final row"
            );
            for row in rows {
                assert!(c.algorithms().contains(&row.2), "{row:?}");
            }
        }
    }

    #[test]
    fn ll_falls_back_when_the_scratch_is_too_small() {
        assert_eq!(
            choose(Collective::AllReduce, 1024, 2, 512 << 10),
            Algorithm::OneShot
        );
        assert_eq!(
            choose(Collective::AllReduce, 1024, 2, 512),
            Algorithm::TwoShot
        );
        assert_eq!(
            choose(Collective::AllReduce, 32 << 20, 2, 512 << 10),
            Algorithm::TwoShot
        );
        assert_eq!(
            choose(Collective::AllReduce, (32 << 20) + 4, 2, 512 << 10),
            Algorithm::RsAg
        );
        let err = plan(
            Collective::AllReduce,
            Algorithm::OneShot,
            1 << 20,
            2,
            Some(DType::F32),
            512 << 10,
            132,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("1048576 bytes per peer") && err.contains("ll_max_bytes"),
            "{err}"
        );
    }

    #[test]
    fn broadcast_runs_in_units_from_4_to_64_mib_at_more_than_2_pes() {
        use Algorithm::{ScatterGather, ScatterGatherUnits};
        let ll = 512 << 10;
        let bcast = |size, n| choose(Collective::Broadcast, size, n, ll);
        for n in [3, 4, 8] {
            assert_eq!(bcast(BROADCAST_UNITS_FROM, n), ScatterGatherUnits);
            assert_eq!(bcast(BROADCAST_UNITS_UP_TO, n), ScatterGatherUnits);
            assert_eq!(bcast(BROADCAST_UNITS_UP_TO + 1, n), ScatterGather);
            assert_eq!(bcast(256 << 20, n), ScatterGather);
            assert_eq!(bcast(BROADCAST_UNITS_FROM - 1, n), ScatterGather);
            assert_eq!(bcast(1 << 20, n), ScatterGather);
            assert_eq!(bcast(1 << 10, n), Algorithm::OneShot);
        }
        for size in [1 << 20, BROADCAST_UNITS_FROM, 256 << 20] {
            assert_eq!(bcast(size, 2), ScatterGather);
        }
        // The LL fallback lands on the block pipeline below the rule's size.
        assert_eq!(
            choose(Collective::Broadcast, 1 << 10, 4, 512),
            ScatterGather
        );
        assert_eq!(
            choose(Collective::AllGather, 256 << 20, 8, ll),
            Algorithm::Direct
        );
        // The units run on at most BROADCAST_UNIT_BLOCKS blocks (4 units each: one done word
        // per unit in the root's row of MAX_BLOCKS), the block pipeline's grid is unchanged.
        assert!(BROADCAST_UNIT_BLOCKS as usize * 4 <= MAX_BLOCKS);
        let grid = |a, size| plan(Collective::Broadcast, a, size, 4, None, ll, 132).unwrap();
        let units = grid(ScatterGatherUnits, 256 << 20);
        assert_eq!(
            (units.kernel, units.num_blocks, units.threads_per_block),
            ("coll_broadcast_scatter_units", 64, COLL_THREADS)
        );
        let blocks = grid(ScatterGather, 256 << 20);
        assert_eq!(
            (blocks.kernel, blocks.num_blocks),
            ("coll_broadcast_scatter", 132)
        );
        assert_eq!(grid(ScatterGatherUnits, 100 << 10).num_blocks, 7);
        assert_eq!(grid(ScatterGather, 100 << 10).num_blocks, 7);
        assert_eq!(
            Algorithm::from_name("scatter_gather_units"),
            Some(ScatterGatherUnits)
        );
    }

    #[test]
    fn wrong_algorithm_names_the_right_ones() {
        let err = plan(
            Collective::AllReduce,
            Algorithm::Ring,
            1024,
            2,
            Some(DType::F32),
            1 << 20,
            132,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("one_shot, two_shot, rs_ag"), "{err}");
    }

    #[test]
    fn grids_stay_within_the_gpu_and_the_flag_array() {
        for size in [0usize, 1, 1000, 1 << 20, 1 << 30] {
            for &(c, _, a) in SIZE_TABLE {
                if let Ok(p) = plan(c, a, size, 8, Some(DType::Bf16), 1 << 40, 132) {
                    assert!((1..=132).contains(&p.num_blocks), "{p:?}");
                }
            }
        }
        let p = plan(
            Collective::AllGather,
            Algorithm::Direct,
            1 << 30,
            2,
            None,
            0,
            1000,
        )
        .unwrap();
        assert_eq!(p.num_blocks, MAX_BLOCKS as u32);
        assert_eq!(
            plan(
                Collective::AllReduce,
                Algorithm::TwoShot,
                4,
                2,
                Some(DType::F32),
                0,
                132
            )
            .unwrap()
            .kernel,
            "coll_all_reduce_two_shot_f32"
        );
    }

    #[test]
    fn rs_ag_is_two_launches_of_one_grid_and_the_rest_are_one() {
        for (dtype, rs, ag) in [
            (
                DType::F32,
                "coll_all_reduce_rs_f32",
                "coll_all_reduce_ag_f32",
            ),
            (
                DType::Bf16,
                "coll_all_reduce_rs_bf16",
                "coll_all_reduce_ag_bf16",
            ),
        ] {
            let p = plan(
                Collective::AllReduce,
                Algorithm::RsAg,
                256 << 20,
                4,
                Some(dtype),
                0,
                132,
            )
            .unwrap();
            assert_eq!((p.kernel, p.then), (rs, Some(ag)));
            let two_shot = plan(
                Collective::AllReduce,
                Algorithm::TwoShot,
                256 << 20,
                4,
                Some(dtype),
                0,
                132,
            )
            .unwrap();
            assert_eq!(p.num_blocks, two_shot.num_blocks);
        }
        for &(c, _, a) in SIZE_TABLE {
            if a != Algorithm::RsAg {
                let p = plan(c, a, 1 << 20, 4, Some(DType::F32), 1 << 40, 132).unwrap();
                assert_eq!(p.then, None, "{p:?}");
            }
        }
        assert_eq!(Algorithm::from_name("rs_ag"), Some(Algorithm::RsAg));
    }
}
