//! Which PEs form a node, which form a rail, and how one PE reaches another: pure functions of
//! the job size and the node size, so every rule of the topology is tested on the CPU.
//!
//! ```text
//! 8 PEs in nodes of G = 4:      local 0   local 1   local 2   local 3
//!                     node 0:    PE 0      PE 1      PE 2      PE 3     <- node team
//!                     node 1:    PE 4      PE 5      PE 6      PE 7
//!                                  ^ rail team 1 = PEs 1 and 5 (the same local index)
//! ```
//!
//! Inside a node every PE may use a peer pointer to every other; between nodes there is none,
//! only NVSHMEM's RMA calls ([`Route`]).

use ch01_bootstrap::World;

use crate::config::{MAX_GROUP, MAX_NODE_PES, NODE_PES_VAR};
use crate::error::InterNodeError;

/// A set of PEs as `nvshmem_team_split_strided` names one: `start`, `start + stride`, ...,
/// `size` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    pub start: usize,
    pub stride: usize,
    pub size: usize,
}

impl Strided {
    /// The world PEs, in team order.
    pub fn members(&self) -> Vec<usize> {
        (0..self.size)
            .map(|i| self.start + i * self.stride)
            .collect()
    }
    /// `pe`'s index in the team, if it is a member.
    pub fn index_of(&self, pe: usize) -> Option<usize> {
        let offset = pe.checked_sub(self.start)?;
        (offset.is_multiple_of(self.stride) && offset / self.stride < self.size)
            .then_some(offset / self.stride)
    }
}

/// How one PE reaches another's symmetric memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The same node: a peer pointer (loads and stores over NVLink), chapter 4's kernels.
    Pointer,
    /// Another node: NVSHMEM's RMA calls only (put, put-with-signal, signal ops).
    Rma,
}

// ANCHOR: layout
/// Nodes of `node_pes` consecutive PEs: PE p is local index p mod G of node p / G, as torchrun
/// numbers ranks node by node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub n_pes: usize,
    /// G, the PEs of one node.
    pub node_pes: usize,
}

impl Layout {
    pub fn num_nodes(&self) -> usize {
        self.n_pes / self.node_pes
    }
    pub fn node_of(&self, pe: usize) -> usize {
        pe / self.node_pes
    }
    pub fn local_of(&self, pe: usize) -> usize {
        pe % self.node_pes
    }
    pub fn pe(&self, node: usize, local: usize) -> usize {
        node * self.node_pes + local
    }
    /// The node team of `node`: its G PEs.
    pub fn node_team(&self, node: usize) -> Strided {
        Strided {
            start: node * self.node_pes,
            stride: 1,
            size: self.node_pes,
        }
    }
    /// The rail team of local index `local`: one PE per node, the same local index on each.
    pub fn rail_team(&self, local: usize) -> Strided {
        Strided {
            start: local,
            stride: self.node_pes,
            size: self.num_nodes(),
        }
    }
    pub fn route(&self, from: usize, to: usize) -> Route {
        if self.node_of(from) == self.node_of(to) {
            Route::Pointer
        } else {
            Route::Rma
        }
    }
}
// ANCHOR_END: layout

impl Layout {
    /// `Err` unless `node_pes` nodes tile `n_pes` within the kernels' limits.
    pub fn new(n_pes: usize, node_pes: usize) -> Result<Self, InterNodeError> {
        let bad = |what: String| Err(InterNodeError::Topology(what));
        if node_pes == 0 || n_pes == 0 || !n_pes.is_multiple_of(node_pes) {
            return bad(format!(
                "nodes of {node_pes} PEs do not tile a job of {n_pes} PEs"
            ));
        }
        if node_pes > MAX_NODE_PES {
            return bad(format!(
                "nodes of {node_pes} PEs: a node's communicator spans at most {MAX_NODE_PES} \
                 (one NVLink domain); set {NODE_PES_VAR} to a smaller divisor"
            ));
        }
        if n_pes / node_pes > MAX_GROUP {
            return bad(format!(
                "{} nodes: a rail spans at most {MAX_GROUP} (kernels/contract/defs.rs MAX_GROUP)",
                n_pes / node_pes
            ));
        }
        Ok(Self { n_pes, node_pes })
    }

    /// This job's layout as the environment gives it, without NVSHMEM calls: nodes of torchrun's
    /// LOCAL_WORLD_SIZE PEs (else NVSHMEM's node team), cut smaller by NVSHMEM_TUTORIAL_NODE_PES
    /// when it is set ([`resolve_node_pes`]).
    pub fn from_env(world: &World) -> Result<Self, InterNodeError> {
        let env = std::env::var(NODE_PES_VAR).ok();
        let torchrun_node = std::env::var("LOCAL_WORLD_SIZE")
            .ok()
            .and_then(|v| v.trim().parse().ok());
        let node_pes = resolve_node_pes(
            env.as_deref(),
            torchrun_node,
            world.node_size(),
            world.n_pes(),
        )?;
        Self::new(world.n_pes(), node_pes)
    }

    /// One line for logs: `2 nodes x 4 PEs`.
    pub fn describe(&self) -> String {
        format!("{} node(s) x {} PE(s)", self.num_nodes(), self.node_pes)
    }

    /// `pe (node k, local l)`: how error messages name a PE.
    pub fn name(&self, pe: usize) -> String {
        format!(
            "pe {pe} (node {}, local {})",
            self.node_of(pe),
            self.local_of(pe)
        )
    }
}

// ANCHOR: resolve_node_pes
/// G, the PEs of one node: torchrun's node (`LOCAL_WORLD_SIZE`) when torchrun says, else
/// NVSHMEM's node team; smaller when `NVSHMEM_TUTORIAL_NODE_PES` (`env_value`) asks, which
/// must divide it. A node must lie inside NVSHMEM's node (the PEs its peer pointers reach).
pub fn resolve_node_pes(
    env_value: Option<&str>,
    torchrun_node: Option<usize>,
    nvshmem_node: usize,
    n_pes: usize,
) -> Result<usize, InterNodeError> {
    let bad = |what: String| Err(InterNodeError::Topology(what));
    let (node, source) = match torchrun_node {
        Some(lws) => (lws, "LOCAL_WORLD_SIZE"),
        None => (nvshmem_node, "NVSHMEM's node team"),
    };
    if node == 0 || nvshmem_node == 0 || !nvshmem_node.is_multiple_of(node) {
        return bad(format!(
            "{source} is {node} PEs, which does not divide NVSHMEM's node team of \
             {nvshmem_node} PEs (the PEs that share a host)"
        ));
    }
    let Some(text) = env_value else {
        return Ok(node);
    };
    let divisors: Vec<String> = (1..=node)
        .filter(|d| node.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    match text.trim().parse::<usize>() {
        Ok(g) if g > 0 && node.is_multiple_of(g) && n_pes.is_multiple_of(g) => Ok(g),
        _ => bad(format!(
            "{NODE_PES_VAR}={text:?} must be a number of PEs that divides the node size {node} \
             ({source}): one of {}",
            divisors.join(", ")
        )),
    }
}
// ANCHOR_END: resolve_node_pes

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_rails_tile_the_job() {
        for (n, g) in [
            (1, 1),
            (2, 1),
            (2, 2),
            (4, 2),
            (8, 4),
            (8, 2),
            (16, 8),
            (64, 1),
        ] {
            let layout = Layout::new(n, g).unwrap();
            let mut seen_in_nodes = vec![0; n];
            let mut seen_in_rails = vec![0; n];
            for node in 0..layout.num_nodes() {
                for pe in layout.node_team(node).members() {
                    seen_in_nodes[pe] += 1;
                    assert_eq!(layout.node_of(pe), node);
                }
            }
            for local in 0..g {
                let rail = layout.rail_team(local);
                for (k, pe) in rail.members().into_iter().enumerate() {
                    seen_in_rails[pe] += 1;
                    assert_eq!((layout.node_of(pe), layout.local_of(pe)), (k, local));
                    assert_eq!(rail.index_of(pe), Some(k));
                }
            }
            assert!(
                seen_in_nodes.iter().chain(&seen_in_rails).all(|&c| c == 1),
                "{n}/{g}"
            );
        }
    }

    #[test]
    fn routes_use_pointers_inside_a_node_only() {
        let layout = Layout::new(8, 2).unwrap();
        assert_eq!(layout.route(2, 3), Route::Pointer);
        assert_eq!(layout.route(3, 4), Route::Rma);
        assert_eq!(layout.route(0, 6), Route::Rma);
        for a in 0..8 {
            for b in layout.rail_team(layout.local_of(a)).members() {
                // Rail partners are on other nodes (or are a itself).
                assert!(a == b || layout.route(a, b) == Route::Rma);
            }
        }
        assert_eq!(layout.name(5), "pe 5 (node 2, local 1)");
        assert_eq!(
            Strided {
                start: 1,
                stride: 4,
                size: 2
            }
            .index_of(3),
            None
        );
    }

    #[test]
    fn bad_layouts_are_refused_with_the_reason() {
        let err = |n, g| Layout::new(n, g).unwrap_err().to_string();
        assert!(err(6, 4).contains("do not tile"));
        assert!(err(16, 16).contains("at most 8"));
        assert!(err(130, 2).contains("at most 64"));
    }

    #[test]
    fn the_node_size_comes_from_torchrun_then_nvshmem_and_shrinks_by_the_variable() {
        assert_eq!(resolve_node_pes(None, Some(4), 8, 8).unwrap(), 4);
        assert_eq!(resolve_node_pes(None, None, 8, 16).unwrap(), 8);
        assert_eq!(resolve_node_pes(Some("2"), Some(4), 8, 8).unwrap(), 2);
        assert_eq!(resolve_node_pes(Some(" 1 "), None, 2, 2).unwrap(), 1);
        for bad in ["3", "0", "8", "two", ""] {
            let err = resolve_node_pes(Some(bad), Some(4), 4, 4)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(NODE_PES_VAR) && err.contains("one of 1, 2, 4"),
                "{bad}: {err}"
            );
        }
        // torchrun's node must lie inside NVSHMEM's.
        let err = resolve_node_pes(None, Some(3), 4, 12)
            .unwrap_err()
            .to_string();
        assert!(err.contains("LOCAL_WORLD_SIZE is 3"), "{err}");
    }
}
