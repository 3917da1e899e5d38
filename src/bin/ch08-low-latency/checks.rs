//! The host reference: every output of a round trip checked, and the fp8 recipe.

use super::*;

/// The checks of one round trip, each named after its case, and how much it moved.
pub(crate) struct Checks {
    pub(crate) me: usize,
    pub(crate) case: Case,
    pub(crate) layout: LlShape,
    pub(crate) tally: Tally,
    pub(crate) num_tokens_sent: usize,
    pub(crate) num_rows_received: usize,
}

impl Checks {
    pub(crate) fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        let name = self.case.name;
        self.tally
            .check(self.me, ok, || format!("{name}: {}", what()));
    }

    pub(crate) fn report(&self, into: &mut Tally) {
        println!(
            "pe {}: {}: {} tokens sent, {} rows received; {} checks passed, {} failed",
            self.me,
            self.case.name,
            self.num_tokens_sent,
            self.num_rows_received,
            self.tally.passed,
            self.tally.failed
        );
        into.passed += self.tally.passed;
        into.failed += self.tally.failed;
    }
}

impl Checks {
    /// Bad input only the GPU can see is recorded by the kernel and raised by the next
    /// `check()` (or the next call), once: an expert id past the last (both calls see it), an
    /// expert named twice (the dispatch's slots overflow). Only those cases plant any.
    pub(crate) fn input_record(
        &mut self,
        buffer: &NvshmemBuffer<&World>,
        call: &str,
    ) -> Result<(), BufferError> {
        let expected = match (self.case.routing, call) {
            (Routing::BadExpertId, _) => {
                format!("topk_idx[0] holds expert {}", bad_expert_id(&self.layout))
            }
            (Routing::ExpertTwice, "dispatch") => "must not name one expert twice".into(),
            _ => return buffer.check(),
        };
        // check() sees what finished kernels recorded: let this call's finish first.
        let stream = buffer.world().stream();
        stream
            .synchronize()
            .map_err(BufferError::cuda("synchronising"))?;
        let what = format!("{}: {call}", self.case.name);
        self.tally
            .expect_error(self.me, &what, buffer.check(), &expected);
        self.check(buffer.check().is_ok(), || {
            format!("{call}: the bad input was raised twice")
        });
        Ok(())
    }

    /// Each source's wait, in cycles, was added to the 1 it started from.
    /// `cumulative_local_expert_recv_stats` grew from `before` by the tokens each local expert
    /// received.
    pub(crate) fn stats_grew(&mut self, all: &[Tokens], before: &[i32], stats: &[i32]) {
        let (me, l) = (self.me, self.layout.num_local_experts());
        let want: Vec<i32> = (0..l)
            .map(|e| {
                let received: usize = all.iter().map(|s| kept(&s.tokens_for(me * l + e))).sum();
                before[e] + received as i32
            })
            .collect();
        self.check(stats == want, || {
            format!("cumulative_local_expert_recv_stats {stats:?}, expected {want:?}")
        });
    }

    pub(crate) fn cost_grew(&mut self, call: &str, cost: &[i64]) {
        self.check(cost.iter().all(|&c| c > 1), || {
            format!("{call} wait cost per source {cost:?}")
        });
    }

    // ANCHOR: check_dispatch
    /// Every local expert's outputs: its count, its per-source ranges in ring order from this
    /// rank (its own run first, then rank me + 1's, ...), each valid row (which token, from
    /// whom, its data and scales), and poison past them.
    pub(crate) fn dispatch(&mut self, all: &[Tokens], got: &Received) {
        let (n, l) = (self.layout.num_ranks, self.layout.num_local_experts());
        let rows_per_expert = n * self.layout.max_tokens;
        let (mut counts, mut ranges, mut rows, mut scales, mut poison) = (0, 0, 0, 0, 0);
        for e in 0..l {
            let want: Vec<Vec<usize>> = all.iter().map(|s| s.tokens_for(self.me * l + e)).collect();
            let total: usize = want.iter().map(|tokens| kept(tokens)).sum();
            counts += usize::from(got.count[e] != total as i32);
            let mut begin = 0;
            for s in (0..n).map(|p| (self.me + p) % n) {
                let tokens = &want[s];
                let range = ((begin as i64) << 32) | kept(tokens) as i64;
                ranges += usize::from(got.layout_range[e * n + s] != range);
                // Source s's rows: its tokens, each as often as it chose e, in any order (and
                // with more than T, any T of them).
                let mut seen = Vec::with_capacity(kept(tokens));
                for i in begin..begin + kept(tokens) {
                    let t = got.src_info[e * rows_per_expert + i];
                    if t < 0 || t as usize >= all[s].num_tokens {
                        rows += 1;
                        continue;
                    }
                    seen.push(t as usize);
                    let (row_ok, scales_ok) = self.row(got, e, i, all[s].row(t as usize));
                    rows += usize::from(!row_ok);
                    scales += usize::from(!scales_ok);
                }
                seen.sort_unstable();
                rows += usize::from(!is_part_of(&seen, tokens));
                begin += kept(tokens);
            }
            poison += self.count_unwritten_wrong(got, e, total);
        }
        self.check(counts == 0, || {
            format!("recv_count: {counts} experts wrong")
        });
        self.check(ranges == 0, || {
            format!("recv_layout_range: {ranges} (expert, source) ranges wrong")
        });
        self.check(rows == 0, || {
            format!("{rows} received rows wrong (source token or data)")
        });
        if self.case.precision != Precision::Bf16 {
            self.check(scales == 0, || {
                format!("{scales} rows with a wrong fp8 scale")
            });
        }
        self.check(poison == 0, || {
            format!("{poison} bytes past the valid rows were written")
        });
    }
    // ANCHOR_END: check_dispatch

    /// Whether packed row `i` of local expert `e` holds `want` (bf16: bit for bit; fp8:
    /// within e4m3 rounding, with the scale it came with), and whether its scales follow
    /// DeepEP's recipe exactly.
    pub(crate) fn row(&self, got: &Received, e: usize, i: usize, want: &[bf16]) -> (bool, bool) {
        let (precision, layout) = (self.case.precision, &self.layout);
        let row_len = row_bytes(precision, layout.hidden);
        let row = &got.x[(e * layout.num_ranks * layout.max_tokens + i) * row_len..][..row_len];
        if precision == Precision::Bf16 {
            let ok = row
                .chunks_exact(2)
                .zip(want)
                .all(|(b, w)| u16::from_le_bytes([b[0], b[1]]) == w.to_bits());
            return (ok, true);
        }
        let (mut row_ok, mut scales_ok) = (true, true);
        let groups = row.chunks_exact(128).zip(want.chunks_exact(128));
        for (group, (bytes, values)) in groups.enumerate() {
            let at = scale_bytes(precision, layout, e, group, i);
            let scale = match precision {
                Precision::Fp8Ue8m0 => f32::from_bits(u32::from(got.scales[at.start]) << 23),
                _ => f32::from_le_bytes(got.scales[at].try_into().expect("4 bytes")),
            };
            let round_scale = precision != Precision::Fp8;
            scales_ok &= scale.to_bits() == expected_scale(values, round_scale).to_bits();
            for (&b, w) in bytes.iter().zip(values) {
                let (have, want) = (e4m3_to_f32(b) * scale, w.to_f32());
                // Half a unit in the last place of e4m3 (3 mantissa bits) is at most 1/16 of
                // the value; below the normal range, half the step 2^-9, times the scale.
                let close = (have - want).abs() <= want.abs() / 16.0 * 1.0001 + scale / 1024.0;
                row_ok &= close;
            }
        }
        (row_ok, scales_ok)
    }

    /// Bytes past expert `e`'s first `valid` rows that are no longer poison: every output was
    /// filled with POISON_BYTE before the call, and only valid rows may be written.
    pub(crate) fn count_unwritten_wrong(&self, got: &Received, e: usize, valid: usize) -> usize {
        let (precision, layout) = (self.case.precision, &self.layout);
        let rows_per_expert = layout.num_ranks * layout.max_tokens;
        let row_len = row_bytes(precision, layout.hidden);
        let unwritten = valid.min(rows_per_expert)..rows_per_expert;
        let src_info = &got.src_info[e * rows_per_expert..][unwritten.clone()];
        let mut wrong = src_info.iter().filter(|&&t| t != -1).count();
        let x = &got.x[(e * rows_per_expert + unwritten.start) * row_len..]
            [..unwritten.len() * row_len];
        wrong += x.iter().filter(|&&b| b != POISON_BYTE).count();
        if precision != Precision::Bf16 {
            for group in 0..layout.hidden / 128 {
                for i in unwritten.clone() {
                    let at = scale_bytes(precision, layout, e, group, i);
                    wrong += got.scales[at].iter().filter(|&&b| b != POISON_BYTE).count();
                }
            }
        }
        wrong
    }

    // ANCHOR: check_combine
    /// Token t's result: the sum over its valid top-k choices of weight x (its row times the
    /// expert's gain), in fp32, rounded to bf16 once. A token that chose no expert gets zeros.
    pub(crate) fn combine(&mut self, mine: &Tokens, got: &[bf16]) {
        if self.case.routing == Routing::ExpertTwice {
            // A token whose copies were all dropped has no row coming back (its result is
            // undefined), and only the expert's rank knows which tokens those are.
            return;
        }
        let hidden = self.layout.hidden;
        let experts = 0..self.layout.num_experts as i64;
        let mut wrong = 0;
        for t in 0..mine.num_tokens {
            let choices: Vec<(f32, f32)> = (t * NUM_TOPK..(t + 1) * NUM_TOPK)
                .filter(|&j| experts.contains(&mine.topk_idx[j]))
                .map(|j| (mine.topk_weights[j], expert_gain(mine.topk_idx[j] as usize)))
                .collect();
            for (have, x) in got[t * hidden..(t + 1) * hidden].iter().zip(mine.row(t)) {
                let x = x.to_f32();
                let want = choices
                    .iter()
                    .fold(0.0f32, |acc, &(weight, gain)| acc + weight * (x * gain));
                let close = (have.to_f32() - want).abs() <= want.abs() * BF16_ROUNDING;
                wrong += usize::from(!close);
            }
        }
        let total = mine.num_tokens * hidden;
        self.check(wrong == 0, || {
            format!("combine: {wrong} of {total} values off by more than bf16 rounding")
        });
    }
    // ANCHOR_END: check_combine
}

// ANCHOR: fp8_reference
/// DeepEP's recipe for one group of 128 channels: amax = max(|x|, 1e-4), and the receiver's
/// multiplier amax / 448 (448 is e4m3's largest value), rounded up to a power of two with
/// round_scale (so the scale is exact in UE8M0, a bare exponent).
pub(crate) fn expected_scale(group: &[bf16], round_scale: bool) -> f32 {
    let amax = group.iter().fold(1e-4f32, |m, v| m.max(v.to_f32().abs()));
    let scale = amax * (1.0f32 / 448.0); // DeepEP's arithmetic: amax x f32(1/448)
    if !round_scale {
        return scale;
    }
    let bits = scale.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127 + i32::from(bits & 0x7f_ffff != 0);
    f32::from_bits(((127 + exponent) as u32) << 23)
}

/// An fp8 e4m3 (`float8_e4m3fn`) byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
/// infinities, 0x7f/0xff are NaN.
pub(crate) fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (i32::from((byte >> 3) & 0xf), f32::from(byte & 7));
    let magnitude = match exponent {
        15 if mantissa == 7.0 => f32::NAN,
        0 => mantissa / 8.0 * 2f32.powi(-6),
        _ => (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7),
    };
    sign * magnitude
}
// ANCHOR_END: fp8_reference

/// The experts' results for combine: packed row i of local expert e (global g) holds the
/// token the handle names, times expert_gain(g). Rows the handle does not name stay NaN, so a
/// combine that reads one shows it.
pub(crate) fn expert_results(
    layout: &LlShape,
    me: usize,
    all: &[Tokens],
    got: &Received,
) -> Vec<bf16> {
    let (n, l, hidden) = (layout.num_ranks, layout.num_local_experts(), layout.hidden);
    let rows_per_expert = n * layout.max_tokens;
    let mut results = vec![bf16::NAN; l * rows_per_expert * hidden];
    for e in 0..l {
        let gain = expert_gain(me * l + e);
        for (s, tokens) in all.iter().enumerate() {
            let range = got.layout_range[e * n + s];
            let (begin, count) = ((range >> 32) as usize, (range & 0xffff_ffff) as usize);
            for i in begin..(begin + count).min(rows_per_expert) {
                let t = got.src_info[e * rows_per_expert + i];
                if t < 0 || t as usize >= tokens.num_tokens {
                    continue; // the dispatch check has counted it
                }
                let row = &mut results[(e * rows_per_expert + i) * hidden..][..hidden];
                for (r, x) in row.iter_mut().zip(tokens.row(t as usize)) {
                    *r = bf16::from_f32(x.to_f32() * gain);
                }
            }
        }
    }
    results
}

// ---- mistakes -----------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// A bf16 dispatch's outputs as a correct kernel leaves them, built from the routing alone:
    /// each local expert's rows in ring order from `me`, each source's first T choices in token
    /// order, poison past them.
    fn correct_outputs(me: usize, all: &[Tokens], shape: &LlShape) -> Received {
        let (n, l, hidden) = (shape.num_ranks, shape.num_local_experts(), shape.hidden);
        let rows_per_expert = n * shape.max_tokens;
        let mut got = Received {
            x: vec![POISON_BYTE; l * rows_per_expert * hidden * 2],
            scales: Vec::new(),
            src_info: vec![-1; l * rows_per_expert],
            layout_range: vec![0; l * n],
            count: vec![0; l],
        };
        for e in 0..l {
            let mut begin = 0;
            for s in (0..n).map(|p| (me + p) % n) {
                let tokens = all[s].tokens_for(me * l + e);
                let kept_tokens = &tokens[..kept(&tokens)];
                got.layout_range[e * n + s] = ((begin as i64) << 32) | kept_tokens.len() as i64;
                for (i, &t) in kept_tokens.iter().enumerate() {
                    let row = e * rows_per_expert + begin + i;
                    got.src_info[row] = t as i32;
                    let bytes = all[s].row(t).iter().flat_map(|v| v.to_le_bytes());
                    let at = row * hidden * 2;
                    got.x[at..at + hidden * 2]
                        .iter_mut()
                        .zip(bytes)
                        .for_each(|(b, v)| *b = v);
                }
                begin += kept_tokens.len();
            }
            got.count[e] = begin as i32;
        }
        got
    }

    /// One way a kernel's output could be wrong, applied to a correct one.
    type Spoil = Box<dyn Fn(&mut Received)>;

    fn checked(me: usize, all: &[Tokens], shape: LlShape, got: &Received) -> Tally {
        let mut checks = Checks {
            me,
            case: pair_case(0),
            layout: shape,
            tally: Tally::default(),
            num_tokens_sent: 0,
            num_rows_received: 0,
        };
        checks.dispatch(all, got);
        checks.tally
    }

    /// The host reference passes a correct dispatch and fails each way a kernel could be wrong:
    /// a row's data, a row's source token, a range, a count, a store past the valid rows.
    #[test]
    fn the_dispatch_check_passes_a_correct_output_and_catches_each_mistake() {
        for n in [1, 2, 8] {
            let shape = LlShape {
                max_tokens: MAX_TOKENS,
                hidden: SMALL_HIDDEN,
                num_ranks: n,
                num_experts: EXPERTS_PER_RANK * n,
            };
            let case = pair_case(0);
            let all: Vec<Tokens> = (0..n).map(|r| Tokens::new(&case, 7, r, &shape)).collect();
            let me = n - 1;
            let good = correct_outputs(me, &all, &shape);
            assert_eq!(
                checked(me, &all, shape, &good).failed,
                0,
                "n = {n}: a correct output failed"
            );
            let rows = n * MAX_TOKENS;
            let first = (0..rows)
                .find(|&i| good.src_info[i] >= 0)
                .expect("expert 0 received a row");
            let mistakes: [(&str, Spoil); 5] = [
                (
                    "a row's data",
                    Box::new(move |g| g.x[first * SMALL_HIDDEN * 2 + 1] ^= 0x40),
                ),
                (
                    "a row's source token",
                    Box::new(move |g| g.src_info[first] += 1),
                ),
                ("a range", Box::new(|g| g.layout_range[0] += 1)),
                ("a count", Box::new(|g| g.count[0] += 1)),
                (
                    "a store past the rows",
                    Box::new(move |g| {
                        let past = g.count[0] as usize; // expert 0's first row past its valid ones
                        g.x[past * SMALL_HIDDEN * 2] = 0;
                    }),
                ),
            ];
            for (what, spoil) in mistakes {
                let mut bad = correct_outputs(me, &all, &shape);
                spoil(&mut bad);
                assert!(
                    checked(me, &all, shape, &bad).failed > 0,
                    "n = {n}: {what} was not caught"
                );
            }
        }
    }
}
