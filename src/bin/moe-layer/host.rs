//! The host half of the MoE layer, all of it CPU-tested: its shape and the checks on it (run
//! before NVSHMEM starts, so a bad shape launches nothing), the command line, the weights and
//! tokens made from seeds (every rank can make every expert, and any rank's tokens), the
//! router's top-k, and the f32 reference the GPU's output is checked against.

use half::bf16;
use nvshmem_tutorial::kernels::contract::{FP8_GROUP, MAX_LL_EXPERTS, MAX_LL_HIDDEN, MAX_TOPK};

/// T: the most tokens a rank sends in one low-latency call (Python's LL_TOKENS, DeepEP's decode
/// shape). Every (local expert, source rank) pair owns T rows of the received layout.
pub(crate) const MAX_TOKENS: usize = 128;
/// Largest expert FFN size: keeps every GEMM dimension and stride far inside cuBLAS's i32.
pub(crate) const MAX_FFN: usize = 16384;

/// The layer's sizes (scripts/moe_model.py's `Shape`, `SMALL` by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Tokens per rank and call (at most MAX_TOKENS).
    pub(crate) tokens: usize,
    pub(crate) hidden: usize,
    /// Experts in all, split evenly over the ranks.
    pub(crate) experts: usize,
    pub(crate) top_k: usize,
    /// The expert MLP's intermediate size.
    pub(crate) ffn: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            tokens: 64,
            hidden: 1024,
            experts: 16,
            top_k: 4,
            ffn: 256,
        }
    }
}

impl Shape {
    /// Every rule the layer and the buffer's low-latency mode put on the shape at `ranks` ranks,
    /// checked on the host before anything starts.
    pub(crate) fn check(&self, ranks: usize) -> Result<(), String> {
        let Shape {
            tokens,
            hidden,
            experts,
            top_k,
            ffn,
        } = *self;
        if ranks == 0 {
            return Err("no ranks: run under torchrun (WORLD_SIZE >= 1)".into());
        }
        if experts == 0 || !experts.is_multiple_of(ranks) {
            return Err(format!(
                "{experts} experts cannot be split evenly over {ranks} ranks: pass --experts with \
                 a positive multiple of {ranks}, or run on a number of ranks that divides \
                 {experts}"
            ));
        }
        if experts > MAX_LL_EXPERTS {
            return Err(format!(
                "{experts} experts: low-latency mode takes at most {MAX_LL_EXPERTS}"
            ));
        }
        if top_k == 0 || top_k > experts || top_k > MAX_TOPK {
            return Err(format!(
                "--top-k {top_k}: each token needs 1 to min({experts} experts, {MAX_TOPK}) \
                 distinct experts"
            ));
        }
        if tokens == 0 || tokens > MAX_TOKENS {
            return Err(format!(
                "--tokens {tokens}: each rank sends 1 to {MAX_TOKENS} tokens per call (the \
                 buffer's slots hold T = {MAX_TOKENS} per expert and rank)"
            ));
        }
        if hidden == 0 || !hidden.is_multiple_of(FP8_GROUP) || hidden > MAX_LL_HIDDEN {
            return Err(format!(
                "--hidden {hidden}: low-latency mode takes a multiple of {FP8_GROUP} up to \
                 {MAX_LL_HIDDEN}"
            ));
        }
        if ffn == 0 || ffn > MAX_FFN {
            return Err(format!(
                "--ffn {ffn}: the expert FFN size must be 1 to {MAX_FFN}"
            ));
        }
        Ok(())
    }

    pub(crate) fn local_experts(&self, ranks: usize) -> usize {
        self.experts / ranks
    }
}

/// The command line: the shape, and a seed (default: the job's, fresh every run).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Args {
    pub(crate) shape: Shape,
    pub(crate) seed: Option<u64>,
}

pub(crate) const USAGE: &str = "takes --tokens N (per rank, <= 128), --hidden N, --experts N, \
                                --top-k N, --ffn N and --seed N";

impl Args {
    pub(crate) fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut out = Args::default();
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let value = |it: &mut dyn Iterator<Item = String>| -> Result<u64, String> {
                let v = it.next().ok_or(format!("{flag} needs a value ({USAGE})"))?;
                v.parse()
                    .map_err(|_| format!("{flag} {v}: not a non-negative integer"))
            };
            let as_size = |v: u64| usize::try_from(v).map_err(|_| format!("{flag} {v}: too large"));
            let shape = &mut out.shape;
            match flag.as_str() {
                "--tokens" => shape.tokens = as_size(value(&mut it)?)?,
                "--hidden" => shape.hidden = as_size(value(&mut it)?)?,
                "--experts" => shape.experts = as_size(value(&mut it)?)?,
                "--top-k" => shape.top_k = as_size(value(&mut it)?)?,
                "--ffn" => shape.ffn = as_size(value(&mut it)?)?,
                "--seed" => out.seed = Some(value(&mut it)?),
                other => return Err(format!("unknown argument {other:?} ({USAGE})")),
            }
        }
        Ok(out)
    }
}

// ---- weights and tokens from seeds ---------------------------------------------------------

/// Which matrix a seed makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Matrix {
    Gate = 0,
    Up = 1,
    Down = 2,
}

/// A seed of its own for every (purpose, index, part), so that each expert's matrices come out
/// the same on every rank, whatever else that rank makes.
fn derive(seed: u64, purpose: u64, index: u64, part: u64) -> u64 {
    splitmix(splitmix(splitmix(seed ^ purpose) ^ index) ^ part)
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub(crate) fn expert_seed(seed: u64, expert: usize, which: Matrix) -> u64 {
    derive(seed, 1, expert as u64, which as u64)
}
pub(crate) fn router_seed(seed: u64) -> u64 {
    derive(seed, 2, 0, 0)
}
pub(crate) fn token_seed(seed: u64, rank: usize, step: usize) -> u64 {
    derive(seed, 3, rank as u64, step as u64)
}

/// `len` values uniform in [-scale, scale) from a xorshift (as chapter 6's `random_bf16`),
/// rounded to bf16: the GPU and the host reference multiply the same numbers.
pub(crate) fn uniform_bf16(seed: u64, len: usize, scale: f32) -> Vec<bf16> {
    let mut state = splitmix(seed) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            bf16::from_f32((2.0 * unit - 1.0) * scale)
        })
        .collect()
}

/// The scale of a uniform [-s, s) of variance 1 / fan_in (as randn / sqrt(fan_in) in Python):
/// every GEMM's outputs keep about the variance of its inputs.
pub(crate) fn scale_for(fan_in: usize) -> f32 {
    (3.0 / fan_in as f32).sqrt()
}

/// The router [hidden, experts].
pub(crate) fn router(seed: u64, shape: &Shape) -> Vec<bf16> {
    let len = shape.hidden * shape.experts;
    uniform_bf16(router_seed(seed), len, scale_for(shape.hidden))
}

/// Expert `e`'s matrix `which`: gate and up [hidden, ffn], down [ffn, hidden].
pub(crate) fn expert_matrix(seed: u64, shape: &Shape, e: usize, which: Matrix) -> Vec<bf16> {
    let fan_in = match which {
        Matrix::Gate | Matrix::Up => shape.hidden,
        Matrix::Down => shape.ffn,
    };
    let len = shape.hidden * shape.ffn;
    uniform_bf16(expert_seed(seed, e, which), len, scale_for(fan_in))
}

/// Rank `rank`'s tokens of step `step` [tokens, hidden], variance 1.
pub(crate) fn tokens(seed: u64, shape: &Shape, rank: usize, step: usize) -> Vec<bf16> {
    let len = shape.tokens * shape.hidden;
    uniform_bf16(token_seed(seed, rank, step), len, scale_for(1))
}

pub(crate) fn to_f32(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

// ---- the router's top-k --------------------------------------------------------------------

/// What the router chose for each token: global expert ids [N, K] (best first) and their
/// weights [N, K] (softmax over all experts, the k kept renormalised to sum to 1: Python's
/// `MoeLayer.route`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Choice {
    pub(crate) idx: Vec<i64>,
    pub(crate) weights: Vec<f32>,
}

/// The top `k` of each row of `scores` [N, experts]; ties go to the lower expert id. NaN
/// scores do not panic (they sort as the largest; the router check then fails).
pub(crate) fn top_k(scores: &[f32], experts: usize, k: usize) -> Choice {
    let mut out = Choice {
        idx: Vec::with_capacity(scores.len() / experts.max(1) * k),
        weights: Vec::with_capacity(scores.len() / experts.max(1) * k),
    };
    for row in scores.chunks(experts.max(1)) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        order.truncate(k);
        // softmax over all experts, then renormalised over the k: the max cancels, and so
        // does the softmax's denominator: exp(s - max) over the k, divided by their sum.
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = order.iter().map(|&e| (row[e] - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        out.idx.extend(order.iter().map(|&e| e as i64));
        out.weights.extend(exps.iter().map(|w| w / sum));
    }
    out
}

// ---- the f32 reference ---------------------------------------------------------------------

/// `x` [n, k] @ `w` [k, m], row-major f32.
pub(crate) fn matmul(x: &[f32], w: &[f32], (n, k, m): (usize, usize, usize)) -> Vec<f32> {
    let mut y = vec![0f32; n * m];
    for (x_row, y_row) in x.chunks(k).zip(y.chunks_mut(m)) {
        for (&xv, w_row) in x_row.iter().zip(w.chunks(m)) {
            for (acc, &wv) in y_row.iter_mut().zip(w_row) {
                *acc += xv * wv;
            }
        }
    }
    y
}

pub(crate) fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// One expert's matrices in f32: gate, up [hidden, ffn], down [ffn, hidden].
pub(crate) struct ExpertF32 {
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) down: Vec<f32>,
}

impl ExpertF32 {
    pub(crate) fn new(seed: u64, shape: &Shape, e: usize) -> Self {
        let m = |which| to_f32(&expert_matrix(seed, shape, e, which));
        Self {
            gate: m(Matrix::Gate),
            up: m(Matrix::Up),
            down: m(Matrix::Down),
        }
    }

    /// down(SiLU(x @ gate) * (x @ up)) of one row `x` [hidden].
    pub(crate) fn forward(&self, x: &[f32], (hidden, ffn): (usize, usize)) -> Vec<f32> {
        let g = matmul(x, &self.gate, (1, hidden, ffn));
        let u = matmul(x, &self.up, (1, hidden, ffn));
        let h: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        matmul(&h, &self.down, (1, ffn, hidden))
    }
}

/// The layer on this rank's tokens without communication: each token [hidden] through each
/// expert the router chose, weighted and summed, in f32 (`x` [N, hidden]).
pub(crate) fn reference(
    x: &[f32],
    routing: &Choice,
    experts: &[ExpertF32],
    shape: &Shape,
) -> Vec<f32> {
    let (hidden, k) = (shape.hidden, shape.top_k);
    let mut out = vec![0f32; x.len()];
    for (t, (row, out_row)) in x.chunks(hidden).zip(out.chunks_mut(hidden)).enumerate() {
        for j in 0..k {
            let (e, w) = (routing.idx[t * k + j], routing.weights[t * k + j]);
            let y = experts[e as usize].forward(row, (hidden, shape.ffn));
            for (o, v) in out_row.iter_mut().zip(y) {
                *o += w * v;
            }
        }
    }
    out
}

/// norm(got - want) / norm(want) (Python's `relative`); NaN anywhere gives NaN, which no
/// `<= limit` passes.
pub(crate) fn relative(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::NAN;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    diff.sqrt() / norm.sqrt().max(1e-12)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn the_default_shape_runs_on_every_rank_count_that_divides_the_experts() {
        let shape = Shape::default();
        for ranks in [1, 2, 4, 8, 16] {
            assert_eq!(shape.check(ranks), Ok(()), "{ranks} ranks");
            assert_eq!(shape.local_experts(ranks) * ranks, 16);
        }
    }

    #[test]
    fn experts_that_do_not_split_over_the_ranks_are_refused_with_the_fix() {
        for ranks in [3, 5, 6, 32] {
            let e = Shape::default().check(ranks).unwrap_err();
            assert!(e.contains("16 experts cannot be split evenly"), "{e}");
            assert!(e.contains(&format!("multiple of {ranks}")), "{e}");
        }
        let e = Shape::default().check(0).unwrap_err();
        assert!(e.contains("torchrun"), "{e}");
    }

    #[test]
    fn every_other_bad_shape_is_refused_naming_its_flag() {
        let bad = |change: fn(&mut Shape), flag: &str| {
            let mut shape = Shape::default();
            change(&mut shape);
            let e = shape.check(2).unwrap_err();
            assert!(e.contains(flag), "{flag}: {e}");
        };
        bad(|s| s.top_k = 0, "--top-k 0");
        bad(|s| s.top_k = 17, "--top-k 17");
        bad(|s| s.tokens = 0, "--tokens 0");
        bad(|s| s.tokens = MAX_TOKENS + 1, "--tokens 129");
        bad(|s| s.hidden = 1000, "--hidden 1000");
        bad(|s| s.hidden = 0, "--hidden 0");
        bad(|s| s.hidden = MAX_LL_HIDDEN + 128, "multiple of 128");
        bad(|s| s.ffn = 0, "--ffn 0");
        bad(|s| s.ffn = MAX_FFN + 1, "--ffn");
        bad(|s| s.experts = 0, "0 experts");
        bad(|s| s.experts = 2 * MAX_LL_EXPERTS, "at most");
        let wide = Shape {
            experts: 64,
            top_k: MAX_TOPK + 1,
            ..Shape::default()
        };
        assert!(wide.check(2).unwrap_err().contains("--top-k 33"));
    }

    #[test]
    fn the_command_line_sets_the_shape_and_refuses_what_it_does_not_know() {
        assert_eq!(args(""), Ok(Args::default()));
        let a = args("--tokens 32 --hidden 2048 --experts 8 --top-k 2 --ffn 512 --seed 7").unwrap();
        let want = Shape {
            tokens: 32,
            hidden: 2048,
            experts: 8,
            top_k: 2,
            ffn: 512,
        };
        assert_eq!((a.shape, a.seed), (want, Some(7)));
        assert!(
            args("--pairs 3")
                .unwrap_err()
                .contains("unknown argument \"--pairs\"")
        );
        assert!(
            args("--experts")
                .unwrap_err()
                .contains("--experts needs a value")
        );
        assert!(
            args("--experts -1")
                .unwrap_err()
                .contains("not a non-negative integer")
        );
        assert!(args("--tokens x").unwrap_err().contains("--tokens x"));
    }

    #[test]
    fn seeds_give_the_same_weights_everywhere_and_different_ones_per_expert_and_matrix() {
        let shape = Shape {
            hidden: 128,
            ffn: 16,
            ..Shape::default()
        };
        let gate3 = expert_matrix(9, &shape, 3, Matrix::Gate);
        assert_eq!(gate3, expert_matrix(9, &shape, 3, Matrix::Gate));
        assert_ne!(gate3, expert_matrix(9, &shape, 4, Matrix::Gate));
        assert_ne!(gate3, expert_matrix(9, &shape, 3, Matrix::Up));
        assert_ne!(gate3, expert_matrix(10, &shape, 3, Matrix::Gate));
        assert_ne!(tokens(9, &shape, 0, 0), tokens(9, &shape, 1, 0));
        assert_ne!(tokens(9, &shape, 0, 0), tokens(9, &shape, 0, 1));
    }

    #[test]
    fn uniform_values_stay_in_range_with_the_variance_asked_for() {
        let v = to_f32(&uniform_bf16(5, 100_000, 2.0));
        assert!(v.iter().all(|x| (-2.0..=2.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((var - 4.0 / 3.0).abs() < 0.02, "{var}"); // s^2 / 3
        assert!((scale_for(3) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn top_k_picks_the_largest_best_first_with_softmax_weights_over_them() {
        let scores = [0.1, 2.0, -1.0, 1.0, 0.5, 2.0];
        let got = top_k(&scores, 6, 3);
        // The tie between experts 1 and 5 goes to the lower id.
        assert_eq!(got.idx, vec![1, 5, 3]);
        let z = 2f32.exp() * 2.0 + 1f32.exp();
        let want = [2f32.exp() / z, 2f32.exp() / z, 1f32.exp() / z];
        for (g, w) in got.weights.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        // Two rows, and large scores stay finite (the max is subtracted first).
        let got = top_k(&[1000.0, 999.0, 0.0, 5.0, 6.0, 7.0], 3, 2);
        assert_eq!(got.idx, vec![0, 1, 2, 1]);
        assert!(got.weights.iter().all(|w| w.is_finite()));
        let sums: Vec<f32> = got.weights.chunks(2).map(|c| c.iter().sum()).collect();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-6), "{sums:?}");
        // NaN does not panic.
        let got = top_k(&[f32::NAN, 1.0, 2.0], 3, 2);
        assert_eq!(got.idx.len(), 2);
    }

    #[test]
    fn the_reference_is_the_weighted_sum_of_each_chosen_expert_written_out() {
        // hidden 2, ffn 1: expert(x) = silu(x . gate) * (x . up) * down.
        let shape = Shape {
            tokens: 1,
            hidden: 2,
            experts: 2,
            top_k: 2,
            ffn: 1,
        };
        let experts = [
            ExpertF32 {
                gate: vec![1.0, 0.0],
                up: vec![0.0, 1.0],
                down: vec![1.0, 2.0],
            },
            ExpertF32 {
                gate: vec![0.5, 0.5],
                up: vec![1.0, 1.0],
                down: vec![-1.0, 0.0],
            },
        ];
        let x = [1.5f32, -2.0];
        let routing = Choice {
            idx: vec![1, 0],
            weights: vec![0.25, 0.75],
        };
        let e0 = silu(1.5) * -2.0;
        let e1 = silu(-0.25) * -0.5;
        let want = [0.75 * e0 - 0.25 * e1, 0.75 * e0 * 2.0];
        let got = reference(&x, &routing, &experts, &shape);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    /// The GPU's rounding, step by step: every GEMM's output, SiLU(gate) * up, the router's
    /// scores and the combined output are bf16 there.
    fn bf16_round(v: Vec<f32>) -> Vec<f32> {
        v.into_iter().map(|x| bf16::from_f32(x).to_f32()).collect()
    }

    #[test]
    fn a_layer_rounded_to_bf16_as_the_gpu_rounds_is_within_the_limit_of_the_f32_reference() {
        let shape = Shape {
            tokens: 8,
            ..Shape::default()
        };
        let (seed, h, f) = (77, shape.hidden, shape.ffn);
        let experts: Vec<ExpertF32> = (0..shape.experts)
            .map(|e| ExpertF32::new(seed, &shape, e))
            .collect();
        let router = to_f32(&router(seed, &shape));
        let x = to_f32(&tokens(seed, &shape, 1, 0));
        let exact = matmul(&x, &router, (shape.tokens, h, shape.experts));
        let scores = bf16_round(exact.clone());
        let router_error = relative(&scores, &exact);
        assert!(router_error < crate::LIMIT / 4.0, "{router_error:e}");
        let choice = top_k(&scores, shape.experts, shape.top_k);
        let mut out = vec![0f32; x.len()];
        for (t, row) in x.chunks(h).enumerate() {
            for j in 0..shape.top_k {
                let e = &experts[choice.idx[t * shape.top_k + j] as usize];
                let g = bf16_round(matmul(row, &e.gate, (1, h, f)));
                let u = bf16_round(matmul(row, &e.up, (1, h, f)));
                let act = bf16_round(g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect());
                let y = bf16_round(matmul(&act, &e.down, (1, f, h)));
                for (o, v) in out[t * h..(t + 1) * h].iter_mut().zip(y) {
                    *o += choice.weights[t * shape.top_k + j] * v;
                }
            }
        }
        let out = bf16_round(out);
        let error = relative(&out, &reference(&x, &choice, &experts, &shape));
        // Inside the limit (3.8e-3 here; the scores' rounding alone gives 1.4e-3), and not so
        // small that it checks nothing.
        assert!(error < crate::LIMIT / 2.0 && error > 1e-4, "{error:e}");
        // The outputs are of the inputs' order (the weights' scales keep the variance).
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / out.len() as f32).sqrt();
        assert!((0.05..5.0).contains(&rms), "{rms}");
    }

    #[test]
    fn matmul_and_relative_error_on_numbers_worked_by_hand() {
        // [2, 3] @ [3, 2]
        let y = matmul(
            &[1., 2., 3., 4., 5., 6.],
            &[1., 0., 0., 1., 1., 1.],
            (2, 3, 2),
        );
        assert_eq!(y, vec![4., 5., 10., 11.]);
        assert_eq!(relative(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((relative(&[3.0, 4.5], &[3.0, 4.0]) - 0.1).abs() < 1e-12);
        assert!(relative(&[f32::NAN, 4.0], &[3.0, 4.0]).is_nan());
        assert!(relative(&[1.0], &[1.0, 2.0]).is_nan());
    }
}
