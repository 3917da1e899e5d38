//! The five hierarchical algorithms as plans (`super::Plan`): each a pure function of the
//! layout, this PE and the call's size.

use super::{Buf, Plan, Step};
use crate::layout::Layout;

// ANCHOR: plan_all_reduce
/// All-reduce of `count` elements of `elem` bytes: reduce-scatter inside the node, all-reduce
/// of each PE's chunk across its rail, all-gather inside the node. Each PE sends count / G
/// elements across nodes instead of count. When G does not divide the count, the chunks are
/// padded: the input goes through stage A, zero-filled past its end.
pub fn all_reduce(layout: &Layout, count: usize, elem: usize) -> Plan {
    use {Buf::*, Step::*};
    let (g, n) = (layout.node_pes, layout.num_nodes());
    let steps = if count == 0 {
        vec![]
    } else if n == 1 {
        vec![NodeAllReduce {
            out: Out,
            input: Input,
            count,
        }]
    } else if g == 1 {
        vec![RailAllReduce {
            out: Out,
            input: Input,
            count,
        }]
    } else if count.is_multiple_of(g) {
        let chunk = count / g;
        vec![
            NodeReduceScatter {
                out: StageB,
                input: Input,
                count: chunk,
            },
            RailAllReduce {
                out: StageB,
                input: StageB,
                count: chunk,
            },
            NodeAllGather {
                out: Out,
                input: StageB,
                num_bytes: chunk * elem,
            },
        ]
        // ANCHOR_END: plan_all_reduce
    } else {
        let chunk = count.div_ceil(g);
        let (bytes, padded) = (count * elem, g * chunk * elem);
        vec![
            Copy {
                out: StageA,
                input: Input,
                num_bytes: bytes,
            },
            Zero {
                buf: StageA,
                offset: bytes,
                num_bytes: padded - bytes,
            },
            NodeReduceScatter {
                out: StageB,
                input: StageA,
                count: chunk,
            },
            RailAllReduce {
                out: StageB,
                input: StageB,
                count: chunk,
            },
            NodeAllGather {
                out: StageA,
                input: StageB,
                num_bytes: chunk * elem,
            },
            Copy {
                out: Out,
                input: StageA,
                num_bytes: bytes,
            },
        ]
    };
    Plan::new("all_reduce", layout, elem, steps)
}

// ANCHOR: plan_all_gather
/// All-gather of `num_bytes` per PE: across the rail first (each PE gets the blocks of its
/// rail, [node][bytes]), then inside the node (every PE gets its node's rails,
/// [local][node][bytes]), then a local permutation into PE order, [node][local][bytes].
pub fn all_gather(layout: &Layout, num_bytes: usize) -> Plan {
    use {Buf::*, Step::*};
    let (g, n) = (layout.node_pes, layout.num_nodes());
    let steps = if num_bytes == 0 {
        vec![]
    } else if n == 1 {
        vec![NodeAllGather {
            out: Out,
            input: Input,
            num_bytes,
        }]
    } else if g == 1 {
        vec![RailAllGather {
            out: Out,
            input: Input,
            num_bytes,
        }]
    } else {
        vec![
            RailAllGather {
                out: StageA,
                input: Input,
                num_bytes,
            },
            NodeAllGather {
                out: StageB,
                input: StageA,
                num_bytes: n * num_bytes,
            },
            Permute {
                out: Out,
                input: StageB,
                outer: g,
                inner: n,
                block_bytes: num_bytes,
            },
        ]
    };
    Plan::new("all_gather", layout, 1, steps)
}
// ANCHOR_END: plan_all_gather

// ANCHOR: plan_reduce_scatter
/// Reduce-scatter, `count` elements out per PE from `n_pes x count` in: permute the input so
/// that each node PE's chunks (one per node) are contiguous, reduce-scatter them inside the
/// node, then reduce-scatter across the rail.
pub fn reduce_scatter(layout: &Layout, count: usize, elem: usize) -> Plan {
    use {Buf::*, Step::*};
    let (g, n) = (layout.node_pes, layout.num_nodes());
    let steps = if count == 0 {
        vec![]
    } else if n == 1 {
        vec![NodeReduceScatter {
            out: Out,
            input: Input,
            count,
        }]
    } else if g == 1 {
        vec![RailReduceScatter {
            out: Out,
            input: Input,
            count,
        }]
    } else {
        vec![
            Permute {
                out: StageA,
                input: Input,
                outer: n,
                inner: g,
                block_bytes: count * elem,
            },
            NodeReduceScatter {
                out: StageB,
                input: StageA,
                count: n * count,
            },
            RailReduceScatter {
                out: Out,
                input: StageB,
                count,
            },
        ]
    };
    Plan::new("reduce_scatter", layout, elem, steps)
}
// ANCHOR_END: plan_reduce_scatter

// ANCHOR: plan_broadcast
/// Broadcast from world PE `root`: across the root's rail (one put per node), then inside
/// every node from the PE of that rail. The PEs of the other rails skip the first step.
pub fn broadcast(layout: &Layout, me: usize, num_bytes: usize, root: usize) -> Plan {
    use {Buf::*, Step::*};
    let (g, n) = (layout.node_pes, layout.num_nodes());
    let (root_node, root_local) = (layout.node_of(root), layout.local_of(root));
    let steps = if num_bytes == 0 {
        vec![]
    } else if n == 1 {
        vec![NodeBroadcast {
            out: Out,
            input: Input,
            num_bytes,
            root: root_local,
        }]
    } else if g == 1 {
        vec![RailBroadcast {
            out: Out,
            input: Input,
            num_bytes,
            root: root_node,
        }]
    } else {
        let mut steps = vec![];
        if layout.local_of(me) == root_local {
            steps.push(RailBroadcast {
                out: StageA,
                input: Input,
                num_bytes,
                root: root_node,
            });
        }
        steps.push(NodeBroadcast {
            out: Out,
            input: StageA,
            num_bytes,
            root: root_local,
        });
        steps
    };
    Plan::new("broadcast", layout, 1, steps)
}
// ANCHOR_END: plan_broadcast

/// All-to-all-v of rows of `row_bytes`: each PE's rows for a node cross once, to its rail
/// partner there, which forwards them inside the node. The counts are on the device.
pub fn all_to_all_v(layout: &Layout, row_bytes: usize, in_rows: usize, out_rows: usize) -> Plan {
    use {Buf::*, Step::*};
    let (g, n) = (layout.node_pes, layout.num_nodes());
    let steps = if n == 1 {
        vec![NodeAllToAllV {
            out: Out,
            input: Input,
            row_bytes,
            in_rows,
            out_rows,
        }]
    } else if g == 1 {
        vec![RailAllToAllV {
            out: Out,
            input: Input,
            row_bytes,
            in_rows,
            out_rows,
        }]
    } else {
        vec![
            A2avSend {
                input: Input,
                row_bytes,
                in_rows,
            },
            A2avForward {
                out: Out,
                row_bytes,
                out_rows,
            },
        ]
    };
    Plan::new("all_to_all_v", layout, 1, steps)
}
