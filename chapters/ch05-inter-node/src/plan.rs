//! The hierarchical algorithms as plans: lists of steps, each inside a node (chapter 4's
//! kernels over the node's communicator, or NVSHMEM's node team), across nodes (NVSHMEM RMA
//! over this PE's rail, or NVSHMEM's rail team), or local (a copy, a permutation). A plan is a
//! pure function of the layout, this PE and the call's size, so the CPU tests run every plan
//! on host vectors (`model.rs`) against the references, check that the members of every node
//! and every rail make the same calls in the same order, and that only node steps, whose
//! group never leaves the node, are given peer pointers.

use crate::config::InterNodeConfig;
use crate::error::InterNodeError;
use crate::layout::Layout;

mod algorithms;
pub use algorithms::{all_gather, all_reduce, all_to_all_v, broadcast, reduce_scatter};

/// A buffer a step reads or writes: the caller's two, or the topology's two stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    Input,
    Out,
    StageA,
    StageB,
}

// ANCHOR: scope
/// Who takes part in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every PE of this PE's node: peer pointers, chapter 4's kernels.
    Node,
    /// Every PE of this PE's rail (one per node): NVSHMEM's RMA calls only.
    Rail,
    /// This PE alone.
    Local,
}
// ANCHOR_END: scope

// ANCHOR: step
/// One step of a plan. Counts are elements of the call's type, sizes bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// out[count] = the node's sum of input[local x count ..][.. count], local = this PE's index.
    NodeReduceScatter { out: Buf, input: Buf, count: usize },
    /// out[count] = the node's sum of input[count].
    NodeAllReduce { out: Buf, input: Buf, count: usize },
    /// out[G][num_bytes] = every node PE's input[num_bytes], in local order.
    NodeAllGather {
        out: Buf,
        input: Buf,
        num_bytes: usize,
    },
    /// out[num_bytes] = local PE `root`'s input.
    NodeBroadcast {
        out: Buf,
        input: Buf,
        num_bytes: usize,
        root: usize,
    },
    /// out[count] = the rail's sum (in node order) of input[node x count ..][.. count].
    RailReduceScatter { out: Buf, input: Buf, count: usize },
    /// out[count] = the rail's sum of input[count], in node order.
    RailAllReduce { out: Buf, input: Buf, count: usize },
    /// out[N][num_bytes] = every rail PE's input[num_bytes], in node order.
    RailAllGather {
        out: Buf,
        input: Buf,
        num_bytes: usize,
    },
    /// out[num_bytes] = node `root`'s input, over this rail.
    RailBroadcast {
        out: Buf,
        input: Buf,
        num_bytes: usize,
        root: usize,
    },
    /// The all-to-all-v's crossing: each node's rows, in one put, to this PE's rail partner
    /// there (into the rail group's landing slots).
    A2avSend {
        input: Buf,
        row_bytes: usize,
        in_rows: usize,
    },
    /// ... and inside the node: every PE pulls its rows from the node's landing slots.
    A2avForward {
        out: Buf,
        row_bytes: usize,
        out_rows: usize,
    },
    /// All-to-all-v inside a node (one node: chapter 4's kernel).
    NodeAllToAllV {
        out: Buf,
        input: Buf,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
    },
    /// All-to-all-v over the rail (nodes of one PE: the RMA kernel).
    RailAllToAllV {
        out: Buf,
        input: Buf,
        row_bytes: usize,
        in_rows: usize,
        out_rows: usize,
    },
    /// out[j][i] = input[i][j] for blocks of block_bytes; input is [outer][inner] blocks.
    Permute {
        out: Buf,
        input: Buf,
        outer: usize,
        inner: usize,
        block_bytes: usize,
    },
    /// out[..num_bytes] = input[..num_bytes].
    Copy {
        out: Buf,
        input: Buf,
        num_bytes: usize,
    },
    /// buf[offset..offset + num_bytes] = 0.
    Zero {
        buf: Buf,
        offset: usize,
        num_bytes: usize,
    },
}
// ANCHOR_END: step

impl Step {
    pub fn scope(&self) -> Scope {
        use Step::*;
        match self {
            NodeReduceScatter { .. } | NodeAllReduce { .. } | NodeAllGather { .. } => Scope::Node,
            NodeBroadcast { .. } | A2avForward { .. } | NodeAllToAllV { .. } => Scope::Node,
            RailReduceScatter { .. } | RailAllReduce { .. } | RailAllGather { .. } => Scope::Rail,
            RailBroadcast { .. } | A2avSend { .. } | RailAllToAllV { .. } => Scope::Rail,
            Permute { .. } | Copy { .. } | Zero { .. } => Scope::Local,
        }
    }

    /// (buffer, bytes from its start) for every buffer the step touches, with the call's
    /// element size `elem` and the layout: what the stages must hold.
    pub fn extents(&self, layout: &Layout, elem: usize) -> Vec<(Buf, usize)> {
        let (g, n) = (layout.node_pes, layout.num_nodes());
        use Step::*;
        match *self {
            NodeReduceScatter { out, input, count } => {
                vec![(out, count * elem), (input, g * count * elem)]
            }
            NodeAllReduce { out, input, count } | RailAllReduce { out, input, count } => {
                vec![(out, count * elem), (input, count * elem)]
            }
            NodeAllGather {
                out,
                input,
                num_bytes,
            } => vec![(out, g * num_bytes), (input, num_bytes)],
            NodeBroadcast {
                out,
                input,
                num_bytes,
                ..
            }
            | RailBroadcast {
                out,
                input,
                num_bytes,
                ..
            } => {
                vec![(out, num_bytes), (input, num_bytes)]
            }
            RailReduceScatter { out, input, count } => {
                vec![(out, count * elem), (input, n * count * elem)]
            }
            RailAllGather {
                out,
                input,
                num_bytes,
            } => vec![(out, n * num_bytes), (input, num_bytes)],
            A2avSend {
                input,
                row_bytes,
                in_rows,
            } => vec![(input, in_rows * row_bytes)],
            A2avForward {
                out,
                row_bytes,
                out_rows,
            } => vec![(out, out_rows * row_bytes)],
            NodeAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            }
            | RailAllToAllV {
                out,
                input,
                row_bytes,
                in_rows,
                out_rows,
            } => {
                vec![(out, out_rows * row_bytes), (input, in_rows * row_bytes)]
            }
            Permute {
                out,
                input,
                outer,
                inner,
                block_bytes,
            } => {
                vec![
                    (out, outer * inner * block_bytes),
                    (input, outer * inner * block_bytes),
                ]
            }
            Copy {
                out,
                input,
                num_bytes,
            } => vec![(out, num_bytes), (input, num_bytes)],
            Zero {
                buf,
                offset,
                num_bytes,
            } => vec![(buf, offset + num_bytes)],
        }
    }

    /// Landing space a rail step needs in the rail group's scratch: one slot per node.
    pub fn rail_scratch(&self, layout: &Layout, elem: usize) -> usize {
        let n = layout.num_nodes();
        match *self {
            Step::RailReduceScatter { count, .. } => n * round16(count * elem),
            Step::RailAllReduce { count, .. } => n * round16(first_part_bytes(count * elem, n)),
            _ => 0,
        }
    }
}

/// Bytes rounded up to 16: the RMA kernels keep every slot 16-byte aligned.
pub fn round16(num_bytes: usize) -> usize {
    num_bytes.next_multiple_of(16)
}

/// The longest of `parts` parts of `num_bytes` as the kernels cut them (coll_common.cuh's
/// part_bounds: equal, 16-byte rounded, the last one shorter).
pub fn first_part_bytes(num_bytes: usize, parts: usize) -> usize {
    let per_part = num_bytes.div_ceil(16).div_ceil(parts.max(1)) * 16;
    per_part.min(num_bytes)
}

/// The steps of one call on one PE, and the stage bytes they need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub collective: &'static str,
    pub steps: Vec<Step>,
    /// Bytes of stage A and stage B the steps touch.
    pub stage_bytes: [usize; 2],
    /// Landing space of the rail group the steps need.
    pub rail_scratch_bytes: usize,
}

impl Plan {
    fn new(collective: &'static str, layout: &Layout, elem: usize, steps: Vec<Step>) -> Self {
        let mut stage_bytes = [0; 2];
        let mut rail_scratch_bytes = 0;
        for step in &steps {
            for (buf, end) in step.extents(layout, elem) {
                match buf {
                    Buf::StageA => stage_bytes[0] = stage_bytes[0].max(end),
                    Buf::StageB => stage_bytes[1] = stage_bytes[1].max(end),
                    _ => {}
                }
            }
            rail_scratch_bytes = rail_scratch_bytes.max(step.rail_scratch(layout, elem));
        }
        Self {
            collective,
            steps,
            stage_bytes,
            rail_scratch_bytes,
        }
    }

    /// `Err` naming the config field to raise when the stages or the rail's scratch are too
    /// small for this call.
    pub fn check_fits(&self, config: &InterNodeConfig) -> Result<(), InterNodeError> {
        let too_large = |what, field, need, have| InterNodeError::TooLarge {
            collective: self.collective,
            what,
            field,
            need,
            have,
        };
        let stage = self.stage_bytes[0].max(self.stage_bytes[1]);
        if stage > config.stage_bytes {
            return Err(too_large(
                "staging",
                "stage_bytes",
                stage,
                config.stage_bytes,
            ));
        }
        if self.rail_scratch_bytes > config.rail_scratch_bytes {
            let (need, have) = (self.rail_scratch_bytes, config.rail_scratch_bytes);
            return Err(too_large(
                "landing space across nodes",
                "rail_scratch_bytes",
                need,
                have,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_cut_as_the_kernels_cut_them() {
        assert_eq!(first_part_bytes(1000, 4), 256);
        assert_eq!(first_part_bytes(10, 4), 10);
        assert_eq!(first_part_bytes(64, 4), 16);
        assert_eq!(round16(17), 32);
    }

    #[test]
    fn all_reduce_pads_only_when_the_node_does_not_divide_the_count() {
        let layout = Layout::new(8, 4).unwrap();
        let even = all_reduce(&layout, 1024, 2);
        assert_eq!(even.steps.len(), 3);
        assert_eq!(even.stage_bytes, [0, 512]);
        let odd = all_reduce(&layout, 1001, 2);
        assert_eq!(odd.steps.len(), 6);
        assert_eq!(odd.stage_bytes, [4 * 251 * 2, 251 * 2]);
        assert!(all_reduce(&layout, 0, 2).steps.is_empty());
    }

    #[test]
    fn plans_that_do_not_fit_name_the_field_to_raise() {
        let layout = Layout::new(8, 2).unwrap();
        let config = InterNodeConfig {
            stage_bytes: 1 << 10,
            ..InterNodeConfig::default()
        };
        let err = all_gather(&layout, 1 << 10)
            .check_fits(&config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("stage_bytes") && err.contains("8192"), "{err}");
        let config = InterNodeConfig {
            rail_scratch_bytes: 64,
            ..InterNodeConfig::default()
        };
        let err = reduce_scatter(&layout, 100, 4)
            .check_fits(&config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rail_scratch_bytes"), "{err}");
    }
}
