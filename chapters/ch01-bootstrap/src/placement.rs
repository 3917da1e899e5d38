//! Is NVSHMEM's view of this process torchrun's?
//!
//! torchrun says where a process stands (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE);
//! NVSHMEM finds out for itself (`nvshmem_my_pe`, and its node team `NVSHMEMX_TEAM_NODE`, the
//! PEs whose host name hashes alike). The two agree on a cluster with one torchrun agent per
//! host. They legitimately differ when several agents share a host (`torchrun --nnodes=2`
//! twice on one machine, chapter 5's two-agent launch): each agent's processes are a node for
//! torchrun, but NVSHMEM's node team spans the whole host. Chapter 5 calls such a torchrun node
//! a *virtual node*. [`check_placement`] accepts both and refuses anything else.

use crate::LaunchEnv;

/// Set by `scripts/fold_pes.sh`, which moves LOCAL_RANK to the GPU ordinal when several PEs
/// share a GPU: torchrun's own local rank.
pub const FOLD_LOCAL_RANK_VAR: &str = "FOLD_LOCAL_RANK";

/// torchrun's rank of this process on its node: `FOLD_LOCAL_RANK` when fold_pes.sh set it,
/// else LOCAL_RANK (`env.local_rank`). `lookup` reads the environment (a map in tests).
pub fn torchrun_local_rank(env: &LaunchEnv, lookup: impl Fn(&str) -> Option<String>) -> usize {
    lookup(FOLD_LOCAL_RANK_VAR)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(env.local_rank)
}

/// NVSHMEM's account of this PE: `World::my_pe`, `n_pes`, `node_pe`, `node_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvshmemPlace {
    pub my_pe: usize,
    pub n_pes: usize,
    /// This PE's index in NVSHMEM's node team (the PEs of its host).
    pub node_pe: usize,
    pub node_size: usize,
}

// ANCHOR: placement
/// How torchrun's nodes sit in NVSHMEM's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// torchrun's node is NVSHMEM's node team: one agent per host.
    SameNode,
    /// `per_host` torchrun nodes (agents) share one host, and NVSHMEM's node team spans
    /// them all: each agent's processes are a virtual node of `LOCAL_WORLD_SIZE` PEs, PEs
    /// `k * LOCAL_WORLD_SIZE ..` of the host, numbered consecutively by torchrun.
    VirtualNodes { per_host: usize },
}

/// `Ok` with how the two views relate when NVSHMEM's PE number and job size are torchrun's
/// rank and world size, and NVSHMEM's node team is either torchrun's node or a whole number
/// of torchrun nodes lined up in rank order; otherwise `Err` naming the numbers that
/// disagree. `local_rank` is torchrun's ([`torchrun_local_rank`]).
pub fn check_placement(
    env: &LaunchEnv,
    local_rank: usize,
    place: NvshmemPlace,
) -> Result<Placement, String> {
    let (rank, lws) = (env.rank, env.local_world_size);
    if place.my_pe != rank || place.n_pes != env.world_size {
        return Err(format!(
            "NVSHMEM says pe {} of {}, torchrun says RANK {rank} of WORLD_SIZE {}",
            place.my_pe, place.n_pes, env.world_size
        ));
    }
    if place.node_size == lws && place.node_pe == local_rank {
        return Ok(Placement::SameNode);
    }
    // Several agents on one host: NVSHMEM's node is k whole torchrun nodes, and this
    // process sits at its local rank inside one of them, which torchrun numbered
    // consecutively (rank = first rank of the agent + local rank).
    let whole = lws > 0 && place.node_size > lws && place.node_size.is_multiple_of(lws);
    if whole && place.node_pe % lws == local_rank && rank % lws == local_rank {
        return Ok(Placement::VirtualNodes {
            per_host: place.node_size / lws,
        });
    }
    Err(format!(
        "NVSHMEM's node team puts this PE at {} of {} on its host, but torchrun says LOCAL_RANK \
         {local_rank} of LOCAL_WORLD_SIZE {lws} (RANK {rank}): neither the same node nor whole \
         torchrun nodes sharing one host (agents of unequal --nproc_per_node, or ranks not \
         numbered node by node)",
        place.node_pe, place.node_size
    ))
}
// ANCHOR_END: placement

#[cfg(test)]
mod tests {
    use super::*;

    fn env(rank: usize, world_size: usize, local_rank: usize, lws: usize) -> LaunchEnv {
        let vars = [
            ("RANK", rank.to_string()),
            ("WORLD_SIZE", world_size.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("LOCAL_WORLD_SIZE", lws.to_string()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", "29500".into()),
        ];
        LaunchEnv::from_lookup(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        })
        .unwrap()
    }

    fn place(my_pe: usize, n_pes: usize, node_pe: usize, node_size: usize) -> NvshmemPlace {
        NvshmemPlace {
            my_pe,
            n_pes,
            node_pe,
            node_size,
        }
    }

    #[test]
    fn one_agent_per_host_is_the_same_node() {
        // Two hosts of 4: rank 5 is local rank 1 of the second.
        let placement = check_placement(&env(5, 8, 1, 4), 1, place(5, 8, 1, 4));
        assert_eq!(placement, Ok(Placement::SameNode));
    }

    #[test]
    fn two_agents_on_one_host_are_virtual_nodes() {
        // torchrun --nnodes=2 --nproc_per_node=2 twice on one host: NVSHMEM's node holds 4.
        for rank in 0..4 {
            let placement = check_placement(
                &env(rank, 4, rank % 2, 2),
                rank % 2,
                place(rank, 4, rank, 4),
            );
            assert_eq!(
                placement,
                Ok(Placement::VirtualNodes { per_host: 2 }),
                "rank {rank}"
            );
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_numbers() {
        let wrong_rank = check_placement(&env(1, 4, 1, 4), 1, place(2, 4, 2, 4)).unwrap_err();
        assert!(
            wrong_rank.contains("pe 2 of 4") && wrong_rank.contains("RANK 1"),
            "{wrong_rank}"
        );
        // A host of 3 PEs cannot hold whole nodes of 2.
        let uneven = check_placement(&env(1, 3, 1, 2), 1, place(1, 3, 1, 3)).unwrap_err();
        assert!(uneven.contains("LOCAL_WORLD_SIZE 2"), "{uneven}");
        // Local rank 0 of its agent but at position 1 of its half of the host.
        let shifted = check_placement(&env(2, 4, 0, 2), 0, place(2, 4, 3, 4)).unwrap_err();
        assert!(shifted.contains("3 of 4"), "{shifted}");
    }

    #[test]
    fn folded_runs_keep_torchruns_local_rank() {
        let e = env(3, 4, 0, 4);
        assert_eq!(torchrun_local_rank(&e, |_| Some("3".into())), 3);
        assert_eq!(torchrun_local_rank(&e, |_| None), 0);
    }
}
