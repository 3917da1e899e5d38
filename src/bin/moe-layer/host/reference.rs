//! The router's top-k on the host, and the f32 reference the GPU's output is checked against.

use super::*;

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
    use half::bf16;

    use super::*;

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
