//! Who gets a peer pointer: the rule that keeps every cross-node path on NVSHMEM's RMA calls,
//! and the CPU tests that prove it holds.
//!
//! A topology hands out exactly two kinds of reach. Its node communicator (chapter 4's
//! `Communicator::with_members`) asks NVSHMEM for a pointer (`nvshmem_ptr`) to each PE of
//! [`pointer_peers`] and no other, and its kernels index only those. Its RMA groups (the
//! rail, the world) hold a strided set of PE numbers and this PE's own memory: the kernels of
//! `kernels/cuda/rma_*.cu` reach other PEs by `nvshmemx_putmem_signal_nbi_block` and
//! `nvshmemx_signal_op` alone. In virtual-node mode the PEs of other virtual nodes sit on the
//! same host and `nvshmem_ptr` *would* return a pointer to them; it is never asked.

use crate::layout::{Layout, Strided};

// ANCHOR: pointer_peers
/// The PEs whose memory `me` reaches through a pointer: those of its node, in local order.
/// The node's communicator is made over exactly these.
pub fn pointer_peers(layout: &Layout, me: usize) -> Vec<usize> {
    layout.node_team(layout.node_of(me)).members()
}
// ANCHOR_END: pointer_peers

/// This PE's rail as an RMA group: one PE per node, the same local index on each.
pub fn rail_group(layout: &Layout, me: usize) -> Strided {
    layout.rail_team(layout.local_of(me))
}

/// Every PE as one RMA group: the flat algorithms.
pub fn world_group(layout: &Layout) -> Strided {
    Strided {
        start: 0,
        stride: 1,
        size: layout.n_pes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Route;
    use crate::plan::{self, Scope};

    fn layouts() -> Vec<Layout> {
        [
            (1, 1),
            (2, 1),
            (2, 2),
            (4, 2),
            (8, 4),
            (8, 2),
            (8, 1),
            (16, 8),
            (64, 8),
            (64, 1),
        ]
        .iter()
        .map(|&(n, g)| Layout::new(n, g).unwrap())
        .collect()
    }

    // ANCHOR: no_cross_node_pointer
    #[test]
    fn no_cross_node_pair_is_ever_given_a_pointer() {
        for layout in layouts() {
            for me in 0..layout.n_pes {
                // What the node communicator asks NVSHMEM (chapter 4's member_deltas, the
                // function Communicator::with_members calls with nvshmem_ptr): every PE it
                // asks about must be on this PE's node.
                let translate = |ptr: u64, pe: usize| {
                    assert_eq!(
                        layout.route(me, pe),
                        Route::Pointer,
                        "pe {me} asked for pe {pe}"
                    );
                    ptr + 0x1000 * pe as u64
                };
                let peers = pointer_peers(&layout, me);
                ch04_collectives::workspace::member_deltas(&peers, me, 1 << 40, translate).unwrap();
                // Every PE of an RMA group other than this one is on another node.
                for pe in rail_group(&layout, me).members() {
                    assert!(pe == me || layout.route(me, pe) == Route::Rma);
                }
            }
        }
    }
    // ANCHOR_END: no_cross_node_pointer

    #[test]
    fn every_step_that_crosses_nodes_is_a_rail_step() {
        // A node step's group is a node; a rail step's group is a rail. The model (model.rs)
        // runs them so; here: every step of every plan is one or the other, or local.
        for layout in layouts() {
            for me in 0..layout.n_pes {
                let plans = [
                    plan::all_reduce(&layout, 1001, 2),
                    plan::reduce_scatter(&layout, 7, 4),
                    plan::all_gather(&layout, 100),
                    plan::broadcast(&layout, me, 100, layout.n_pes - 1),
                    plan::all_to_all_v(&layout, 8, 16, 16),
                ];
                for step in plans.iter().flat_map(|p| &p.steps) {
                    let group = match step.scope() {
                        Scope::Node => pointer_peers(&layout, me),
                        Scope::Rail => rail_group(&layout, me).members(),
                        Scope::Local => vec![me],
                    };
                    let crosses = group.iter().any(|&pe| layout.route(me, pe) == Route::Rma);
                    assert!(
                        !crosses || step.scope() == Scope::Rail,
                        "{step:?} on {layout:?}"
                    );
                }
            }
        }
    }

    /// The source of a kernel file without its comments.
    fn code_of(source: &str) -> String {
        source
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    }

    // ANCHOR: kernels_never_name_a_peer_pointer
    #[test]
    fn the_cross_node_kernels_never_name_a_peer_pointer() {
        let sources = [
            ("rma.cuh", include_str!("../../../kernels/cuda/rma.cuh")),
            (
                "rma_coll.cu",
                include_str!("../../../kernels/cuda/rma_coll.cu"),
            ),
            (
                "rma_a2av.cu",
                include_str!("../../../kernels/cuda/rma_a2av.cu"),
            ),
        ];
        for (file, source) in sources {
            let code = code_of(source);
            for forbidden in [
                "nvshmem_ptr",
                "peer(",
                "peer_delta",
                "const Workspace&",
                " Workspace ws",
            ] {
                assert!(!code.contains(forbidden), "{file} uses `{forbidden}`");
            }
            assert!(code.contains("nvshmemx_putmem_signal_nbi_block") || file != "rma.cuh");
        }
        // The group the kernels receive holds no address of another PE.
        let header = kernels::contract::c_header();
        let start = header.find("struct RmaWorkspace {").unwrap();
        let rma_workspace = &header[start..start + header[start..].find("};").unwrap()];
        assert!(!rma_workspace.contains("peer"), "{rma_workspace}");
    }
    // ANCHOR_END: kernels_never_name_a_peer_pointer
}
