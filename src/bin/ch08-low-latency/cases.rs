//! What a case is: the format, the routing, and every rank's tokens, rebuilt by every rank
//! from the job's seed.

use super::*;

/// The format of dispatched rows, and of their fp8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    Bf16,
    /// fp8 e4m3, one f32 scale per 128 channels (amax / 448).
    Fp8,
    /// The same, each scale rounded up to a power of two.
    Fp8RoundScale,
    /// Power-of-two scales stored as their exponent byte, four to an int32 (UE8M0).
    Fp8Ue8m0,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routing {
    /// Random distinct experts per token, about 1 in 10 entries -1.
    Random,
    /// As `Random`, but the last rank has no tokens (with one rank: nobody sends anything).
    LastRankSilent,
    /// Every token picks among rank 0's experts only: with T tokens, their slots fill up.
    AllToRankZero,
    /// As `Random`, plus one entry past the last expert that only the GPU sees.
    BadExpertId,
    /// Every token names expert 0 twice: 2 x T tokens for its T slots. The GPU keeps T, drops
    /// the rest (the call still completes) and reports it.
    ExpertTwice,
    /// Every token of every rank goes to one expert (the last rank's last: on virtual nodes,
    /// another node's for most ranks) and nowhere else: its other entries are -1.
    OneExpert,
}

/// One dispatch and one combine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) hidden: usize,
    /// Tokens each rank sends (at most MAX_TOKENS).
    pub(crate) num_tokens: usize,
    pub(crate) precision: Precision,
    pub(crate) routing: Routing,
    /// Each call as two launches, send then receive (DeepEP's `return_recv_hook`).
    pub(crate) split: bool,
    /// The combine reads the expert results from the buffer's staging rows.
    pub(crate) zero_copy: bool,
}

impl Case {
    pub(crate) fn options(&self, layout: &LlShape) -> LlDispatchOptions {
        use Precision::*;
        LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: layout.max_tokens,
            num_experts: layout.num_experts,
            use_fp8: self.precision != Bf16,
            round_scale: matches!(self.precision, Fp8RoundScale | Fp8Ue8m0),
            use_ue8m0: self.precision == Fp8Ue8m0,
        }
    }
}

pub(crate) fn cases() -> Vec<Case> {
    use Precision::*;
    let base = Case {
        name: "bf16",
        hidden: LARGE_HIDDEN,
        num_tokens: 50,
        precision: Bf16,
        routing: Routing::Random,
        split: false,
        zero_copy: false,
    };
    vec![
        base,
        Case {
            name: "fp8, T tokens",
            precision: Fp8,
            num_tokens: MAX_TOKENS,
            ..base
        },
        Case {
            name: "fp8, round_scale",
            precision: Fp8RoundScale,
            ..base
        },
        Case {
            name: "fp8, UE8M0 scales",
            precision: Fp8Ue8m0,
            ..base
        },
        Case {
            name: "bf16, receive hook (send, then receive)",
            split: true,
            ..base
        },
        Case {
            name: "fp8, receive hook",
            precision: Fp8,
            split: true,
            ..base
        },
        Case {
            name: "bf16, zero-copy combine",
            zero_copy: true,
            ..base
        },
        Case {
            name: "the last rank sends nothing",
            routing: Routing::LastRankSilent,
            ..base
        },
        Case {
            name: "every token to rank 0's experts (full slots)",
            num_tokens: MAX_TOKENS,
            routing: Routing::AllToRankZero,
            ..base
        },
        Case {
            name: "an expert id out of range (found on the GPU)",
            routing: Routing::BadExpertId,
            ..base
        },
        Case {
            name: "one expert named twice per token: T slots overflow (found on the GPU)",
            num_tokens: MAX_TOKENS,
            routing: Routing::ExpertTwice,
            ..base
        },
        Case {
            name: "every token to one expert (the last rank's last), the rest -1",
            num_tokens: MAX_TOKENS,
            precision: Fp8,
            routing: Routing::OneExpert,
            ..base
        },
        Case {
            name: "hidden 4096, fp8, receive hook",
            hidden: MID_HIDDEN,
            precision: Fp8,
            split: true,
            ..base
        },
        Case {
            name: "hidden 2048, UE8M0, receive hook, zero copy",
            hidden: SMALL_HIDDEN,
            precision: Fp8Ue8m0,
            split: true,
            zero_copy: true,
            ..base
        },
    ]
}

/// Round trip `pair` of the run of many: every option in turn, at the small hidden size.
pub(crate) fn pair_case(pair: usize) -> Case {
    use Precision::*;
    Case {
        name: "pair",
        hidden: SMALL_HIDDEN,
        num_tokens: 1 + pair * 13 % MAX_TOKENS,
        precision: [Bf16, Fp8, Fp8RoundScale, Fp8Ue8m0][pair % 4],
        routing: if pair % 7 == 3 {
            Routing::LastRankSilent
        } else {
            Routing::Random
        },
        split: pair % 3 == 1,
        zero_copy: pair % 5 == 2,
    }
}

pub(crate) fn bad_expert_id(layout: &LlShape) -> i64 {
    layout.num_experts as i64 + 3
}

// ---- the data -----------------------------------------------------------------------------

/// One rank's tokens and routing, reproducible by every rank from (seed, rank).
pub(crate) struct Tokens {
    pub(crate) x: Vec<bf16>,           // [num_tokens, hidden]
    pub(crate) topk_idx: Vec<i64>,     // [num_tokens, NUM_TOPK], global expert ids or -1
    pub(crate) topk_weights: Vec<f32>, // [num_tokens, NUM_TOPK]
    pub(crate) num_tokens: usize,
    pub(crate) hidden: usize,
}

/// Channel `c` of token `t` on `rank`: a small integer times a power of two, exact in bf16,
/// that changes with the rank, the token, the channel and the call (the seed); the power of
/// two changes per 128-channel group, so every fp8 group has a scale of its own.
pub(crate) fn x_value(seed: u64, rank: usize, t: usize, c: usize) -> f32 {
    let small = ((seed % 61) as usize + rank * 7 + t * 3 + c) % 61;
    let exponent = ((rank + t + c / 128) % 5) as i32 - 2;
    (small as f32 - 30.0) * 2f32.powi(exponent)
}

impl Tokens {
    pub(crate) fn new(case: &Case, seed: u64, rank: usize, layout: &LlShape) -> Self {
        let hidden = layout.hidden;
        let silent = case.routing == Routing::LastRankSilent && rank == layout.num_ranks - 1;
        let num_tokens = if silent { 0 } else { case.num_tokens };
        let x = (0..num_tokens * hidden)
            .map(|i| bf16::from_f32(x_value(seed, rank, i / hidden, i % hidden)))
            .collect();
        let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64 + 1).wrapping_mul(0x2545_F491));
        let choices = if case.routing == Routing::AllToRankZero {
            EXPERTS_PER_RANK
        } else {
            layout.num_experts
        };
        let mut topk_idx = routing::random_topk(&mut rng, num_tokens, NUM_TOPK, choices);
        if case.routing == Routing::BadExpertId && num_tokens > 0 {
            topk_idx[0] = bad_expert_id(layout);
        }
        if case.routing == Routing::ExpertTwice {
            for t in 0..num_tokens {
                topk_idx[t * NUM_TOPK..][..2].fill(0);
            }
        }
        if case.routing == Routing::OneExpert {
            for t in 0..num_tokens {
                topk_idx[t * NUM_TOPK..][..NUM_TOPK].fill(-1);
                topk_idx[t * NUM_TOPK] = layout.num_experts as i64 - 1;
            }
        }
        let topk_weights = routing::random_weights(&mut rng, num_tokens * NUM_TOPK);
        Self {
            x,
            topk_idx,
            topk_weights,
            num_tokens,
            hidden,
        }
    }

    pub(crate) fn row(&self, t: usize) -> &[bf16] {
        &self.x[t * self.hidden..(t + 1) * self.hidden]
    }

    /// The tokens that chose global expert `g`, ascending, once per choice.
    pub(crate) fn tokens_for(&self, g: usize) -> Vec<usize> {
        (0..self.num_tokens * NUM_TOPK)
            .filter(|&j| self.topk_idx[j] == g as i64)
            .map(|j| j / NUM_TOPK)
            .collect()
    }
}

/// How many of `chosen` an expert keeps from one source: its run holds T slots.
pub(crate) fn kept(chosen: &[usize]) -> usize {
    chosen.len().min(MAX_TOKENS)
}

/// Whether `part` is a sub-multiset of `whole` (both ascending).
pub(crate) fn is_part_of(part: &[usize], whole: &[usize]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|p| rest.any(|w| w == p))
}

/// What each expert "computes": the row it received times a gain of its own, a power of two
/// (exact in bf16), so that a row combined from the wrong expert shows.
pub(crate) fn expert_gain(global_expert: usize) -> f32 {
    [1.0, 2.0, 0.5][global_expert % 3]
}

// ---- device memory ------------------------------------------------------------------------
