//! What each collective must produce, computed on the host from every PE's input. Every PE
//! can rebuild every other PE's input from (seed, pe), so the check needs no communication.

/// Test data that shows where it came from: element `index` of PE `pe`'s input.
pub fn pattern_byte(pe: usize, index: usize, seed: u32) -> u8 {
    kernels::pattern_word(pe, index as u64, seed) as u8
}

/// A value exactly representable in f32 (a multiple of 1/64 in [-15.6, 15.6]), different
/// for every (pe, index).
pub fn pattern_value(pe: usize, index: usize, seed: u32) -> f32 {
    (kernels::pattern_word(pe, index as u64, seed) % 2001) as f32 / 64.0 - 15.625
}

/// Element types of the reductions, on the host.
pub trait HostElement: Copy + PartialEq + std::fmt::Debug {
    fn from_f32(value: f32) -> Self;
    fn to_f32(self) -> f32;
}
impl HostElement for f32 {
    fn from_f32(value: f32) -> Self {
        value
    }
    fn to_f32(self) -> f32 {
        self
    }
}
impl HostElement for half::bf16 {
    fn from_f32(value: f32) -> Self {
        half::bf16::from_f32(value)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// Broadcast: the root's input.
pub fn broadcast<T: Clone>(inputs: &[Vec<T>], root: usize) -> Vec<T> {
    inputs[root].clone()
}

/// All-gather: every PE's input, in PE order.
pub fn all_gather<T: Clone>(inputs: &[Vec<T>]) -> Vec<T> {
    inputs.concat()
}

/// All-to-all as seen by PE `me`: block `me` of every PE's input, in PE order.
pub fn all_to_all<T: Clone>(inputs: &[Vec<T>], me: usize, count: usize) -> Vec<T> {
    inputs
        .iter()
        .flat_map(|input| input[me * count..(me + 1) * count].to_vec())
        .collect()
}

// ANCHOR: sum
/// Element-wise sum over PEs of elements [begin, begin + count), in fp32, in PE order, then
/// rounded once to T: the order and precision every kernel uses, so results match exactly.
pub fn sum<T: HostElement>(inputs: &[Vec<T>], begin: usize, count: usize) -> Vec<T> {
    (begin..begin + count)
        .map(|i| {
            T::from_f32(
                inputs
                    .iter()
                    .fold(0.0f32, |acc, input| acc + input[i].to_f32()),
            )
        })
        .collect()
}
// ANCHOR_END: sum

/// All-reduce: the sum of every element.
pub fn all_reduce<T: HostElement>(inputs: &[Vec<T>], count: usize) -> Vec<T> {
    sum(inputs, 0, count)
}

/// Reduce-scatter as seen by PE `me`: the sum of chunk `me`.
pub fn reduce_scatter<T: HostElement>(inputs: &[Vec<T>], me: usize, count: usize) -> Vec<T> {
    sum(inputs, me * count, count)
}

/// All-to-all-v as seen by PE `me`, with `splits[p][q]` rows from p to q: the received rows
/// (PE order), the count from each PE and where each PE's rows start.
pub fn all_to_all_v<T: Clone>(
    inputs: &[Vec<T>],
    splits: &[Vec<usize>],
    me: usize,
    row_len: usize,
) -> (Vec<T>, Vec<i64>, Vec<i64>) {
    let mut out = Vec::new();
    let (mut counts, mut offsets) = (Vec::new(), Vec::new());
    for (p, input) in inputs.iter().enumerate() {
        let first_row: usize = splits[p][..me].iter().sum();
        let rows = splits[p][me];
        offsets.push((out.len() / row_len.max(1)) as i64);
        counts.push(rows as i64);
        out.extend_from_slice(&input[first_row * row_len..(first_row + rows) * row_len]);
    }
    (out, counts, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_on_three_pes() {
        let inputs = vec![vec![1u8, 2, 3], vec![4, 5, 6], vec![7, 8, 9]];
        assert_eq!(all_gather(&inputs), (1..=9).collect::<Vec<u8>>());
        assert_eq!(broadcast(&inputs, 1), vec![4, 5, 6]);
        assert_eq!(all_to_all(&inputs, 2, 1), vec![3, 6, 9]);
        let values: Vec<Vec<f32>> = inputs
            .iter()
            .map(|v| v.iter().map(|&b| b as f32).collect())
            .collect();
        assert_eq!(all_reduce(&values, 3), vec![12.0, 15.0, 18.0]);
        assert_eq!(reduce_scatter(&values, 1, 1), vec![15.0]);
    }

    #[test]
    fn sums_round_once_in_pe_order() {
        // 256 + 1 + 1 in bf16 steps would round twice; in fp32 then once it is 258.
        let inputs: Vec<Vec<half::bf16>> = [256.0f32, 1.0, 1.0]
            .iter()
            .map(|&v| vec![half::bf16::from_f32(v)])
            .collect();
        assert_eq!(sum(&inputs, 0, 1)[0].to_f32(), 258.0);
    }

    #[test]
    fn all_to_all_v_groups_rows_by_sender() {
        // 2 PEs, rows of 2: PE 0 sends 1 row to 0 and 2 to 1; PE 1 sends 0 to 0 and 1 to 1.
        let inputs = vec![vec![1, 1, 2, 2, 3, 3], vec![4, 4]];
        let splits = vec![vec![1, 2], vec![0, 1]];
        let (out, counts, offsets) = all_to_all_v(&inputs, &splits, 1, 2);
        assert_eq!(out, vec![2, 2, 3, 3, 4, 4]);
        assert_eq!((counts, offsets), (vec![2, 1], vec![0, 2]));
    }

    #[test]
    fn patterns_differ_by_pe_and_index() {
        assert_ne!(pattern_value(0, 5, 1), pattern_value(1, 5, 1));
        assert_ne!(pattern_value(0, 5, 1), pattern_value(0, 6, 1));
        let v = pattern_value(3, 77, 9);
        assert_eq!(v, (v * 64.0).round() / 64.0);
    }
}
