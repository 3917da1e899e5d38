//! Weights and tokens made from seeds: every rank can make every expert, and any rank's tokens.

use half::bf16;

use super::*;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
