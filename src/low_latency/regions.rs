//! The low-latency region: its parts as size formulas (the kernels address them through
//! `LlRegion`, kernels/contract/defs.rs), and the shape checks every call shares.
//!
//! # The low-latency region (num_rdma_bytes), as size formulas
//!
//! With T = num_max_dispatch_tokens_per_rank, H = hidden, R = ranks, E = experts, L = E / R,
//! and P = the region's bytes after the control words, split in three 256-byte aligned parts:
//!
//! ```text
//! control   CONTROL_BYTES:
//!             counts  [2][MAX_LL_EXPERTS] u64   counts[h][s * L + e]: (call << 32) | rows
//!                                             from s for expert e (the signal after the data)
//!             barrier [MAX_LL_RANKS] u64       the barriers each rank entered (never zeroed)
//! half 0    P / 3: R areas of area_bytes =    area s: what s sends us (dispatch messages or
//! half 1    (P / 3 / R) & !255 >= A           combine rows), or what we stage for s on
//!                                             another node; call k uses half k & 1
//! staging   P / 3 >= L x (R x T) x 2H        the zero-copy combine input
//!
//! A = align256(L x T x (16 + 2H)): L runs of T slots, a bf16 message the largest
//! ```
//!
//! The parts and the areas sit where the region's size (and the rank count) put them, not
//! where a call's shape would: calls of different shapes then use the same areas, so one that
//! follows another of a different shape cannot write over rows a peer is still reading, nor
//! over a run a put is still reading (the NOTES' reuse argument holds for any sequence of
//! shapes). A shape fits when R x A <= P / 3 and E x T x 2H <= P / 3, which is what
//! `get_low_latency_rdma_size_hint` asks for. Every term is linear in R or independent of it,
//! so the formula holds at every rank count up to MAX_LL_RANKS (CPU-tested at 16, 64, 256).

// The limits are the contract's (kernels/contract/defs.rs): MAX_LL_EXPERTS experts (global)
// per call, MAX_TOPK per token, rows up to MAX_LL_HIDDEN wide (the send phase stages a row's
// fp8 scales in shared memory), and MAX_LL_RANKS ranks (the barrier words).
use kernels::contract::{
    FP8_GROUP, LL_MSG_HEADER_BYTES, MAX_LL_EXPERTS, MAX_LL_HIDDEN, MAX_LL_RANKS,
};

use crate::checks;
use crate::error::BufferError;

/// Bytes of the count words: the part of the control that `clean_low_latency_buffer` zeroes.
pub const COUNTS_BYTES: usize = 2 * MAX_LL_EXPERTS * 8;
/// Bytes of the control words at the start of the region: the count words, then the barrier
/// words.
pub const CONTROL_BYTES: usize = (COUNTS_BYTES + MAX_LL_RANKS * 8).next_multiple_of(256);

fn align256(bytes: usize) -> usize {
    bytes.next_multiple_of(256)
}

// ANCHOR: shape
/// The shape of a low-latency call and what it needs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlShape {
    pub max_tokens: usize,
    pub hidden: usize,
    pub num_ranks: usize,
    pub num_experts: usize,
}

impl LlShape {
    pub fn num_local_experts(&self) -> usize {
        self.num_experts / self.num_ranks
    }
    /// A dispatch message: header, row, fp8 scales, 16-byte aligned (as in ll_dispatch.cu).
    pub fn dispatch_msg_bytes(&self, use_fp8: bool) -> usize {
        (LL_MSG_HEADER_BYTES
            + if use_fp8 {
                self.hidden + self.hidden / FP8_GROUP * 4
            } else {
                self.hidden * 2
            })
        .next_multiple_of(16)
    }
    /// One rank's area: L runs of T messages at their largest (bf16), or of T rows of 2H.
    pub fn area_bytes(&self) -> usize {
        align256(self.num_local_experts() * self.max_tokens * self.dispatch_msg_bytes(false))
    }
    /// Each of the three parts: R areas (a half), or the staging's E x T rows of 2H.
    pub fn part_bytes(&self) -> usize {
        (self.num_ranks * self.area_bytes()).max(align256(
            self.num_experts * self.max_tokens * self.hidden * 2,
        ))
    }
    /// Bytes of num_rdma_bytes the shape needs: `get_low_latency_rdma_size_hint`.
    pub fn total_bytes(&self) -> usize {
        CONTROL_BYTES + 3 * self.part_bytes()
    }
}

/// The parts of a region of `num_rdma_bytes`: the same for every call of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlRegions {
    pub part_bytes: usize,
}

impl LlRegions {
    pub fn new(num_rdma_bytes: usize) -> Self {
        Self {
            part_bytes: (num_rdma_bytes.saturating_sub(CONTROL_BYTES) / 3) & !255,
        }
    }
    pub fn half(&self, h: usize) -> usize {
        CONTROL_BYTES + h * self.part_bytes
    }
    pub fn staging(&self) -> usize {
        self.half(2)
    }
}
// ANCHOR_END: shape

impl LlRegions {
    /// Bytes between two areas of a half on `num_ranks` ranks: the same for every call.
    pub fn area_bytes(&self, num_ranks: usize) -> usize {
        (self.part_bytes / num_ranks.max(1)) & !255
    }
    /// Half h's count words, from the region's start.
    pub fn counts(h: usize) -> usize {
        h * MAX_LL_EXPERTS * 8
    }
    /// The barrier words, after the count words.
    pub fn barrier() -> usize {
        COUNTS_BYTES
    }
}

/// DeepEP's `Buffer.get_low_latency_rdma_size_hint`: the num_rdma_bytes a low-latency buffer
/// needs for this shape (bf16 dispatch, the largest), rounded up to 128 bytes. One that also
/// serves normal calls across nodes needs the larger of this and normal mode's rdma hint
/// (`mode_sharing::rdma_size_hint_for_both_modes`).
pub fn get_low_latency_rdma_size_hint(
    num_max_dispatch_tokens_per_rank: usize,
    hidden: usize,
    num_ranks: usize,
    num_experts: usize,
) -> usize {
    LlShape {
        max_tokens: num_max_dispatch_tokens_per_rank,
        hidden,
        num_ranks: num_ranks.max(1),
        num_experts,
    }
    .total_bytes()
    .next_multiple_of(128)
}

pub(crate) fn invalid(what: &'static str, message: String) -> BufferError {
    BufferError::invalid(what, message)
}

/// The shape checks every low-latency call shares: DeepEP's, plus our limits.
pub fn check_shape(
    what: &'static str,
    shape: &LlShape,
    num_topk: usize,
    num_rdma_bytes: usize,
) -> Result<(), BufferError> {
    let LlShape {
        max_tokens,
        hidden,
        num_ranks,
        num_experts,
    } = *shape;
    if max_tokens == 0 {
        return Err(invalid(
            what,
            "num_max_dispatch_tokens_per_rank must be positive".into(),
        ));
    }
    checks::num_experts(what, "num_experts", num_experts, num_ranks, MAX_LL_EXPERTS)?;
    if hidden == 0 || !hidden.is_multiple_of(FP8_GROUP) || hidden > MAX_LL_HIDDEN {
        return Err(invalid(
            what,
            format!(
                "hidden = {hidden} is not supported: the kernels take any multiple of \
                 {FP8_GROUP} (one fp8 scale per {FP8_GROUP} channels) up to {MAX_LL_HIDDEN}, \
                 e.g. 2048, 2560, 4096, 5120, 6144, 7168, 8192"
            ),
        ));
    }
    checks::num_topk(what, num_topk)?;
    if num_ranks > MAX_LL_RANKS {
        return Err(invalid(
            what,
            format!(
                "{num_ranks} ranks: low-latency mode runs up to MAX_LL_RANKS = {MAX_LL_RANKS}                  ranks (kernels/contract/defs.rs)"
            ),
        ));
    }
    let needed = get_low_latency_rdma_size_hint(max_tokens, hidden, num_ranks, num_experts);
    if num_rdma_bytes < needed {
        return Err(invalid(
            what,
            format!(
                "the buffer's num_rdma_bytes = {num_rdma_bytes} is smaller than the {needed} this \
                 shape needs (T = {max_tokens}, hidden = {hidden}, {num_ranks} ranks, \
                 {num_experts} experts): create the buffer with num_rdma_bytes = \
                 Buffer.get_low_latency_rdma_size_hint({max_tokens}, {hidden}, {num_ranks}, \
                 {num_experts})"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_parts_are_ordered_aligned_and_large_enough() {
        let layout = LlShape {
            max_tokens: 128,
            hidden: 7168,
            num_ranks: 2,
            num_experts: 288,
        };
        assert_eq!(layout.dispatch_msg_bytes(false), 16 + 14336);
        assert_eq!(layout.dispatch_msg_bytes(true), 16 + 7168 + 56 * 4);
        // hidden = 128 x 3: 12 bytes of scales, padded so that the next slot stays aligned.
        let odd = LlShape {
            hidden: 384,
            ..layout
        };
        assert_eq!(
            odd.dispatch_msg_bytes(true),
            (16 + 384 + 12usize).next_multiple_of(16)
        );
        // A half holds every bf16 message and every combine row.
        assert!(layout.part_bytes() >= 288 * 128 * (16 + 14336));
        let hint = get_low_latency_rdma_size_hint(128, 7168, 2, 288);
        assert_eq!(hint, layout.total_bytes().next_multiple_of(128));
        // In a region of the hint's size, every part holds what the shape needs.
        let parts = LlRegions::new(hint);
        assert!(parts.part_bytes >= layout.part_bytes());
        assert!(parts.area_bytes(2) >= layout.area_bytes());
        assert!(parts.staging() + parts.part_bytes <= hint);
        for offset in [parts.half(0), parts.half(1), parts.staging()] {
            assert_eq!(offset % 256, 0);
        }
        assert!(LlRegions::counts(1) + MAX_LL_EXPERTS * 8 <= CONTROL_BYTES);
        // A smaller shape in the same region uses the same parts.
        let small = LlShape {
            hidden: 2048,
            ..layout
        };
        assert!(small.part_bytes() <= parts.part_bytes);
        assert!(small.area_bytes() <= parts.area_bytes(2));
    }

    /// The shapes of the rank counts low-latency mode promises, up to MAX_LL_RANKS: DeepEP's
    /// decode shape (T = 128, hidden 7168) at 2 to 256 ranks, with few and with the most experts.
    fn shapes_up_to_the_limit() -> Vec<LlShape> {
        let mut shapes = Vec::new();
        for num_ranks in [1, 2, 8, 16, 32, 64, 128, 256] {
            for experts_per_rank in [1, 8, MAX_LL_EXPERTS / num_ranks] {
                for (max_tokens, hidden) in [(128, 7168), (1, 128), (256, MAX_LL_HIDDEN)] {
                    shapes.push(LlShape {
                        max_tokens,
                        hidden,
                        num_ranks,
                        num_experts: experts_per_rank * num_ranks,
                    });
                }
            }
        }
        shapes
    }

    #[test]
    fn the_hint_holds_every_area_and_the_staging_at_every_rank_count_up_to_256() {
        for shape in shapes_up_to_the_limit() {
            let hint = get_low_latency_rdma_size_hint(
                shape.max_tokens,
                shape.hidden,
                shape.num_ranks,
                shape.num_experts,
            );
            let parts = LlRegions::new(hint);
            let n = shape.num_ranks;
            let area = parts.area_bytes(n);
            // Every rank's area, in both halves, fits in its half and holds the largest run.
            assert!(area >= shape.area_bytes(), "{shape:?}");
            assert!(n * area <= parts.part_bytes, "{shape:?}");
            assert_eq!(area % 256, 0);
            // The last run's last bf16 message ends inside the last area.
            let l = shape.num_local_experts();
            let last_message_end = (n - 1) * area
                + ((l - 1) * shape.max_tokens + shape.max_tokens - 1)
                    * shape.dispatch_msg_bytes(false)
                + shape.dispatch_msg_bytes(false);
            assert!(last_message_end <= parts.part_bytes, "{shape:?}");
            // The staging holds L x (R x T) bf16 rows; the parts end inside the region.
            assert!(l * n * shape.max_tokens * shape.hidden * 2 <= parts.part_bytes);
            assert!(parts.staging() + parts.part_bytes <= hint, "{shape:?}");
            assert!(CONTROL_BYTES >= LlRegions::barrier() + MAX_LL_RANKS * 8);
            assert!(
                check_shape("dispatch", &shape, 8, hint).is_ok(),
                "{shape:?}"
            );
            assert!(check_shape("dispatch", &shape, 8, hint - 128).is_err());
        }
    }

    #[test]
    fn at_a_fixed_expert_count_the_hint_does_not_grow_with_the_ranks() {
        // DeepEP's decode shape: R areas of L runs are E runs whatever R (the control words
        // are sized for MAX_LL_RANKS once), so EP16 and EP256 ask for the same bytes.
        let hint = |n| get_low_latency_rdma_size_hint(128, 7168, n, 256);
        for n in [2, 8, 16, 32, 64, 128, 256] {
            assert_eq!(hint(n), hint(16), "{n} ranks");
        }
        // 1,410.9 MB (benchmarks/notes/buffer_internode.md, section 5.7), DeepEP's 1,908.4.
        assert!(
            (1_410_000_000..1_412_000_000).contains(&hint(256)),
            "{}",
            hint(256)
        );
        // Past the limit, the error names it.
        let past = LlShape {
            max_tokens: 128,
            hidden: 7168,
            num_ranks: MAX_LL_RANKS + 1,
            num_experts: MAX_LL_RANKS + 1,
        };
        let error = check_shape("dispatch", &past, 8, usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(error.contains("MAX_LL_RANKS = 256"), "{error}");
    }

    #[test]
    fn shapes_outside_the_kernels_limits_are_refused_with_the_limit() {
        let layout = |hidden| LlShape {
            max_tokens: 128,
            hidden,
            num_ranks: 2,
            num_experts: 288,
        };
        let room = |hidden| get_low_latency_rdma_size_hint(128, hidden, 2, 288);
        assert!(check_shape("dispatch", &layout(MAX_LL_HIDDEN), 8, room(MAX_LL_HIDDEN)).is_ok());
        for hidden in [0, 2000, MAX_LL_HIDDEN + 128] {
            let error = check_shape("dispatch", &layout(hidden), 8, room(hidden))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("multiple of 128") && error.contains("up to 32768"),
                "{error}"
            );
        }
    }
}
