//! Random routing for chapters 7 and 8's programs (in `shared`, which both include): every
//! rank can rebuild every other rank's routing from the seed, so each checks what it received
//! against a host reference without exchanging anything.

use rand::{Rng, rngs::StdRng};

/// `num_tokens` rows of `num_topk` distinct expert ids drawn from `0..choices`, about one in
/// ten left at -1 (no expert).
pub(crate) fn random_topk(
    rng: &mut StdRng,
    num_tokens: usize,
    num_topk: usize,
    choices: usize,
) -> Vec<i64> {
    let mut topk_idx = Vec::with_capacity(num_tokens * num_topk);
    for _ in 0..num_tokens {
        let mut chosen: Vec<i64> = Vec::with_capacity(num_topk);
        while chosen.len() < num_topk {
            let e = rng.random_range(0..choices) as i64;
            if rng.random_ratio(1, 10) {
                chosen.push(-1);
            } else if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        topk_idx.extend(chosen);
    }
    topk_idx
}

/// `len` top-k weights in [0.5, 2).
pub(crate) fn random_weights(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(0.5f32..2.0)).collect()
}
