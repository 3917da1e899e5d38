//! Views of made-up device addresses for the CPU tests of plans (`bad_inputs`,
//! `low_latency::topology_tests`): a plan checks shapes, dtypes and alignment, and never
//! touches the memory. And `assert_mentions`, how every CPU test checks an error's message, and
//! `assert_route_rules`, the across-nodes kernels' source check.

use crate::internode_notify::InternodeHandle;
use crate::view::{ElemType, View};

/// Distinct made-up device addresses, 256-byte aligned, 256 MiB apart (room for any view the
/// tests make, so no two overlap).
pub(crate) fn at(i: u64) -> u64 {
    0x1_0000_0000 + i * 0x1000_0000
}

/// A row-major `rows` x `cols` matrix at address `i`.
pub(crate) fn matrix(i: u64, rows: usize, cols: usize, elem: ElemType) -> View {
    View::matrix(at(i), rows, cols, elem)
}

/// A vector of `len` at address `i`.
pub(crate) fn vector(i: u64, len: usize, elem: ElemType) -> View {
    View::vector(at(i), len, elem)
}

/// The internode handle's six prefix arrays for `n` ranks in `nodes` nodes and `c` channels,
/// at addresses 5 to 10.
pub(crate) fn internode_handle(n: usize, nodes: usize, c: usize) -> InternodeHandle {
    InternodeHandle {
        rdma_channel_prefix_matrix: matrix(5, nodes, c, ElemType::I32),
        gbl_channel_prefix_matrix: matrix(6, n, c, ElemType::I32),
        recv_rdma_channel_prefix_matrix: matrix(7, nodes, c, ElemType::I32),
        recv_rdma_rank_prefix_sum: vector(8, nodes, ElemType::I32),
        recv_gbl_channel_prefix_matrix: matrix(9, n, c, ElemType::I32),
        recv_gbl_rank_prefix_sum: vector(10, n, ElemType::I32),
    }
}

/// Fails the test unless `text` contains every one of `parts`, naming the first one missing.
#[track_caller]
pub(crate) fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

/// The route rules of the buffer across nodes (DESIGN.md, across nodes), on a kernel's source
/// `file` (comment lines removed, which it returns for further checks): no peer pointer but
/// through node_peer (no nvshmem_ptr, no peer_delta), no fence, quiet, barrier or trap, and
/// every NVSHMEM call one of `allowed` (put-with-signal and signal ops).
#[track_caller]
pub(crate) fn assert_route_rules(file: &str, source: &str, allowed: &[&str]) -> String {
    let code: String = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for banned in [
        "nvshmem_ptr",
        "peer_delta",
        "nvshmem_quiet",
        "nvshmem_fence",
        "__trap",
        "nvshmem_barrier",
    ] {
        assert!(!code.contains(banned), "{file} uses {banned}");
    }
    let remote: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("nvshmem") && *word != "nvshmem_tutorial")
        .collect();
    assert!(!remote.is_empty(), "{file} reaches no other node");
    for word in &remote {
        assert!(
            allowed.contains(word),
            "{file}: {word}: across nodes only put-with-signal and signal ops"
        );
    }
    code
}
