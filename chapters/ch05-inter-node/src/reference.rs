//! What each collective must produce, computed on the host from every PE's input, with
//! chapter 4's references where the order of a sum does not matter and the hierarchical order
//! where it does.

use ch04_collectives::DType;
use ch04_collectives::reference::{HostElement, sum};

use crate::layout::Layout;

/// Element types of the reductions, as the host reads and writes them.
pub trait Element:
    HostElement + Default + cudarc::driver::ValidAsZeroBits + cudarc::driver::DeviceRepr
{
    const SIZE: usize;
    const DTYPE: DType;
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
    fn to_bytes(values: &[Self]) -> Vec<u8>;
}

impl Element for f32 {
    const SIZE: usize = 4;
    const DTYPE: DType = DType::F32;
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

impl Element for half::bf16 {
    const SIZE: usize = 2;
    const DTYPE: DType = DType::Bf16;
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
            .collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
}

// ANCHOR: hier_sum
/// The hierarchical sum of elements [begin, begin + count): each node sums its PEs in local
/// order (fp32, rounded once to T, as the node's reduce-scatter leaves it), then the nodes'
/// sums are summed in node order (fp32, rounded once). In bf16 this rounds twice where the
/// flat sum rounds once, so each algorithm is checked against its own order.
pub fn hier_sum<T: HostElement>(
    inputs: &[Vec<T>],
    layout: &Layout,
    begin: usize,
    count: usize,
) -> Vec<T> {
    let partials: Vec<Vec<T>> = (0..layout.num_nodes())
        .map(|node| {
            let members: Vec<Vec<T>> = layout
                .node_team(node)
                .members()
                .into_iter()
                .map(|pe| inputs[pe][begin..begin + count].to_vec())
                .collect();
            sum(&members, 0, count)
        })
        .collect();
    sum(&partials, 0, count)
}
// ANCHOR_END: hier_sum

/// Hierarchical all-reduce: the hierarchical sum of every element.
pub fn hier_all_reduce<T: HostElement>(inputs: &[Vec<T>], layout: &Layout, count: usize) -> Vec<T> {
    hier_sum(inputs, layout, 0, count)
}

/// Hierarchical reduce-scatter as seen by PE `me`: the hierarchical sum of chunk `me`.
pub fn hier_reduce_scatter<T: HostElement>(
    inputs: &[Vec<T>],
    layout: &Layout,
    me: usize,
    count: usize,
) -> Vec<T> {
    hier_sum(inputs, layout, me * count, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hierarchical_sum_rounds_per_node_then_once_more() {
        // bf16 has 8 significant bits: 256 + 1 rounds to 256, 1 + 1 is exact.
        let values = [256.0f32, 1.0, 1.0, 1.0];
        let inputs: Vec<Vec<half::bf16>> = values
            .iter()
            .map(|&v| vec![half::bf16::from_f32(v)])
            .collect();
        let two_nodes = Layout::new(4, 2).unwrap();
        // Node 0: 256 + 1 = 257 -> 256; node 1: 2; then 256 + 2 = 258.
        assert_eq!(hier_all_reduce(&inputs, &two_nodes, 1)[0].to_f32(), 258.0);
        // One node: 259 in fp32, rounded once to 260 (bf16 steps of 2 above 256).
        assert_eq!(
            hier_all_reduce(&inputs, &Layout::new(4, 4).unwrap(), 1)[0].to_f32(),
            260.0
        );
    }

    #[test]
    fn elements_round_trip_through_bytes() {
        let values = [1.5f32, -2.25];
        assert_eq!(f32::from_bytes(&f32::to_bytes(&values)), values);
        let b = [half::bf16::from_f32(3.0)];
        assert_eq!(half::bf16::from_bytes(&half::bf16::to_bytes(&b)), b);
    }
}
