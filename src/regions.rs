//! The buffer's memory regions, as size formulas. The buffer is one symmetric allocation: chapter
//! 4's communicator (flags and LL scratch) first, then the buffer's regions:
//!
//! ```text
//! control  4 x MAX_CHANNELS x MAX_PES x u64     ring counters: dispatch tail, dispatch head,
//!                                               combine tail, combine head (moe.cuh)
//! rows     (1 + MAX_PES) x ROW_CAPACITY x i32   the notify step's row, then everyone's
//!          ROW_CAPACITY = MAX_PES + MAX_EXPERTS + MAX_PES x MAX_CHANNELS
//! nvl      num_nvl_bytes                        the rings: ring (c, s) of a PE holds
//!                                               ring_tokens slots from PE s in channel c:
//!                                               num_channels x n_pes x ring_tokens x slot bytes
//! rdma     num_rdma_bytes                       the low-latency slots (chapter 8)
//! notify   NotifyArea::bytes (normal mode across nodes only, else nothing): the internode
//!          notify's signals, node tickets, rail rows and their staging (src/internode_notify/)
//! ```
//!
//! A dispatch slot is a token row then its metadata; a combine slot a result row then its
//! top-k weights (below). Every region starts at a multiple of 256 bytes.

use ch04_collectives::config::MAX_PES;
use kernels::contract::{DISPATCH_SLOT_HEADER_BYTES, DispatchSlot, MAX_CHANNELS};

/// Most experts (global) of a normal-mode call: the notify rows are sized for it (DeepEP allows
/// 1024 per rank at 8 ranks).
pub const MAX_EXPERTS: usize = 8192;

fn align16(bytes: usize) -> usize {
    bytes.next_multiple_of(16)
}

// ANCHOR: slots
/// One dispatch slot: `[row: hidden_bytes][src_idx: i32][pad: i32][topk_idx: i64 x K]
/// [topk_weights: f32 x K][scales: f32 x S]`, each part 16-byte aligned. `DispatchSlot` is in
/// the host/device contract; the kernels find the parts from it (`slot_meta` and the rest in
/// dispatch.cu).
pub fn dispatch_slot(hidden_bytes: usize, num_topk: usize, num_scales: usize) -> DispatchSlot {
    let meta = DISPATCH_SLOT_HEADER_BYTES + 12 * num_topk + 4 * num_scales;
    let bytes = align16(hidden_bytes) + align16(meta);
    DispatchSlot {
        hidden_bytes: hidden_bytes as i32,
        num_topk: num_topk as i32,
        num_scales: num_scales as i32,
        bytes: bytes as i32,
    }
}

/// One combine slot: `[row: hidden_bytes bf16][topk_weights: f32 x K]`, 16-byte aligned.
pub fn combine_slot_bytes(hidden_bytes: usize, num_topk: usize) -> usize {
    align16(hidden_bytes) + align16(4 * num_topk)
}

/// Bytes of the rings for `num_channels` channels of `ring_tokens` slots of `slot_bytes`.
pub fn ring_bytes(
    num_channels: usize,
    n_pes: usize,
    ring_tokens: usize,
    slot_bytes: usize,
) -> usize {
    num_channels * n_pes * ring_tokens * slot_bytes
}
// ANCHOR_END: slots

/// The original tokens channel c owns: equal contiguous shares (moe.cuh's channel_range).
pub fn channel_range(num_tokens: usize, num_channels: usize, c: usize) -> (usize, usize) {
    let per = num_tokens.div_ceil(num_channels);
    let begin = (per * c).min(num_tokens);
    (begin, (begin + per).min(num_tokens))
}

/// i32 of one notify row: tokens per rank, per expert, per (rank, channel) prefix.
pub fn row_ints(n_pes: usize, num_experts: usize, num_channels: usize) -> usize {
    n_pes + num_experts + n_pes * num_channels
}

const ROW_CAPACITY: usize = MAX_PES + MAX_EXPERTS + MAX_PES * MAX_CHANNELS;
const COUNTERS: usize = MAX_CHANNELS * MAX_PES;

/// Offsets of the buffer's regions inside its part of the allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regions {
    pub num_nvl_bytes: usize,
    pub num_rdma_bytes: usize,
    /// Bytes of the internode notify's area after the rdma region (`NotifyArea::bytes`), 0 for
    /// a buffer on one node or in low-latency mode: every other region keeps its offset.
    pub notify_area_bytes: usize,
}

impl Regions {
    pub const CONTROL_BYTES: usize = 4 * COUNTERS * 8;
    pub const ROWS_BYTES: usize = (1 + MAX_PES) * ROW_CAPACITY * 4;

    /// Counters `which` (0 dispatch tail, 1 dispatch head, 2 combine tail, 3 combine head).
    pub fn counters(which: usize) -> usize {
        which * COUNTERS * 8
    }
    pub fn my_row() -> usize {
        Self::CONTROL_BYTES.next_multiple_of(256)
    }
    pub fn gathered_rows() -> usize {
        Self::my_row() + (ROW_CAPACITY * 4).next_multiple_of(256)
    }
    pub fn nvl() -> usize {
        (Self::my_row() + Self::ROWS_BYTES).next_multiple_of(256) + 256
    }
    pub fn rdma(&self) -> usize {
        Self::nvl() + self.num_nvl_bytes.next_multiple_of(256)
    }
    /// The internode notify's area (when `notify_area_bytes` > 0).
    pub fn notify_area(&self) -> usize {
        self.rdma() + self.num_rdma_bytes.next_multiple_of(256)
    }
    /// Bytes the buffer adds to the communicator's allocation.
    pub fn total(&self) -> usize {
        match self.notify_area_bytes {
            0 => self.rdma() + self.num_rdma_bytes,
            bytes => self.notify_area() + bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_in_order_and_aligned() {
        let r = Regions {
            num_nvl_bytes: 1000,
            num_rdma_bytes: 77,
            notify_area_bytes: 0,
        };
        assert!(Regions::my_row() >= Regions::CONTROL_BYTES);
        assert!(Regions::gathered_rows() >= Regions::my_row() + ROW_CAPACITY * 4);
        assert!(Regions::nvl() >= Regions::gathered_rows() + MAX_PES * ROW_CAPACITY * 4);
        assert_eq!(r.rdma() - Regions::nvl(), 1024);
        for offset in [
            Regions::my_row(),
            Regions::gathered_rows(),
            Regions::nvl(),
            r.rdma(),
        ] {
            assert_eq!(offset % 256, 0, "{offset}");
        }
        assert_eq!(r.total(), r.rdma() + 77);
        // The internode notify's area comes last: every other offset stays where it was.
        let with_area = Regions {
            notify_area_bytes: 4096,
            ..r
        };
        assert_eq!(with_area.rdma(), r.rdma());
        assert_eq!(with_area.notify_area() % 256, 0);
        assert!(with_area.notify_area() >= r.total());
        assert_eq!(with_area.total(), with_area.notify_area() + 4096);
    }

    #[test]
    fn slots_hold_their_parts() {
        // bf16 7168 with top-8: 14336 + align16(8 + 96) = 14448.
        assert_eq!(dispatch_slot(14336, 8, 0).bytes, 14448);
        // fp8 7168 with top-8 and 56 scales: 7168 + align16(8 + 96 + 224) = 7504.
        assert_eq!(dispatch_slot(7168, 8, 56).bytes, 7504);
        assert_eq!(combine_slot_bytes(14336, 8), 14368);
    }

    #[test]
    fn channels_cover_every_token_once() {
        for (n, c) in [(0, 3), (1, 12), (4096, 12), (4097, 12), (5, 12)] {
            let mut next = 0;
            for i in 0..c {
                let (b, e) = channel_range(n, c, i);
                assert!(b <= e);
                if b < e {
                    assert_eq!(b, next);
                    next = e;
                }
            }
            assert_eq!(next, n);
        }
    }
}
