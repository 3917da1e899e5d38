//! Views of made-up device addresses for the CPU tests of plans (`bad_inputs`,
//! `low_latency::topology_tests`): a plan checks shapes, dtypes and alignment, and never
//! touches the memory. And `assert_mentions`, how every CPU test checks an error's message.

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

/// Fails the test unless `text` contains every one of `parts`, naming the first one missing.
#[track_caller]
pub(crate) fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}
