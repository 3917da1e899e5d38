//! The layer's shape and the command line, checked before NVSHMEM starts (a bad shape
//! launches nothing).

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
}
