//! Chapter 7's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch07-buffer
//! ```
//!
//! A mixture-of-experts layer's communication on every rank, through the buffer's typed layer
//! (src/typed.rs): the layout of random top-k routing (with -1 entries), dispatch (bf16 with
//! top-k and the notify step; then bf16 and fp8 with the cached handle), combine (with
//! weights and a bias), 200 dispatch and combine pairs in a row with new routing and no
//! cleanup, then mistakes a live buffer refuses (src/bad_inputs.rs has the whole table, on
//! the CPU) and the guards only the GPU can make (ch07-buffer/guards.rs, on the raw layer: a
//! num_worst_tokens below what arrives, counts that disagree with the routing). Outputs are
//! poisoned before every call. Every result is checked against a host reference built from
//! every rank's inputs (each rank can rebuild every other's from the shared seed). Ends
//! `N passed, M failed`.

use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::CudaStream;
use half::bf16;
use nvshmem_tutorial::kernels::contract::FP8_GROUP;
use nvshmem_tutorial::{
    BufferOptions, Config, DeviceArray, Element, Fp8E4m3, LayoutOutputs, NvshmemBuffer, RecvTokens,
    Tokens as TokenRows, TopK, View,
};
use rand::{SeedableRng, rngs::StdRng};

#[path = "ch07-buffer/guards.rs"]
mod guards;
#[path = "shared/mod.rs"]
mod shared;

use shared::{AnyError, routing, soak};

const HIDDEN: usize = 2048;
const NUM_TOPK: usize = 8;
const EXPERTS_PER_RANK: usize = 8;

fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch07-buffer", run())
}

/// One rank's tokens and routing, reproducible by every rank from (seed, rank).
struct Tokens {
    x: Vec<bf16>,           // [num_tokens, HIDDEN]
    topk_idx: Vec<i64>,     // [num_tokens, NUM_TOPK], global ids or -1
    topk_weights: Vec<f32>, // [num_tokens, NUM_TOPK]
    num_tokens: usize,
}

impl Tokens {
    fn new(seed: u64, rank: usize, num_tokens: usize, num_experts: usize, skew: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9));
        let x = (0..num_tokens * HIDDEN)
            .map(|i| bf16::from_f32(((i % 61) as f32 - 30.0) / 8.0 + rank as f32))
            .collect();
        let choices = if skew { EXPERTS_PER_RANK } else { num_experts };
        let topk_idx = routing::random_topk(&mut rng, num_tokens, NUM_TOPK, choices);
        let topk_weights = routing::random_weights(&mut rng, num_tokens * NUM_TOPK);
        Self {
            x,
            topk_idx,
            topk_weights,
            num_tokens,
        }
    }

    fn goes_to(&self, t: usize, rank: usize) -> bool {
        self.topk_idx[t * NUM_TOPK..(t + 1) * NUM_TOPK]
            .iter()
            .any(|&e| e >= 0 && e as usize / EXPERTS_PER_RANK == rank)
    }
}

fn upload<T: Element>(
    stream: &Arc<CudaStream>,
    host: &[T],
    rows: usize,
    cols: usize,
) -> Result<DeviceArray<T>, AnyError> {
    Ok(DeviceArray::from_host(stream, host, rows, cols)?)
}

fn run() -> Result<bool, AnyError> {
    let args = soak::soak_args()?;
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let num_experts = EXPERTS_PER_RANK * n;
    let config = Config::new(24, 8, 256, 6, 128)?; // DeepEP test_intranode.py's
    let num_nvl_bytes = config.get_nvl_buffer_size_hint(HIDDEN * 2, n);
    // ANCHOR: create
    let options = args.apply(BufferOptions::normal(num_nvl_bytes));
    let mut buffer = NvshmemBuffer::new(&world, options)?;
    // ANCHOR_END: create
    buffer.set_poison_outputs(true); // what no kernel wrote shows as 0xFF bytes
    // A PE that shares its GPU with others (a folded run) has room for fewer blocks.
    let config = Config::new(config.num_sms.min(buffer.max_num_sms()?), 8, 256, 6, 128)?;
    let mut tally = Tally::default();
    let seed = world.job_seed();
    for (case, (num_tokens, skew)) in [(1000usize, false), (4096, false), (0, false), (777, true)]
        .into_iter()
        .enumerate()
    {
        let all: Vec<Tokens> = (0..n)
            .map(|r| {
                Tokens::new(
                    seed + case as u64,
                    r,
                    if num_tokens == 0 && r == 0 {
                        0
                    } else {
                        num_tokens.max(1)
                    },
                    num_experts,
                    skew,
                )
            })
            .collect();
        check_round_trip(
            &mut buffer,
            &mut tally,
            &all,
            &config,
            &format!(
                "case {case} ({num_tokens} tokens{})",
                if skew { ", all to rank 0" } else { "" }
            ),
        )?;
    }
    // Many pairs in a row, routing changing every time, no cleanup in between.
    let num_pairs = args.pairs.unwrap_or(200);
    println!("pe {me}: running {num_pairs} dispatch/combine pairs in a row");
    let mut ok = true;
    let progress = soak::Progress::new(me, "pairs", num_pairs);
    for pair in 0..num_pairs as u64 {
        let all: Vec<Tokens> = (0..n)
            .map(|r| {
                Tokens::new(
                    seed ^ (pair << 20),
                    r,
                    64 + (pair as usize * 7) % 200,
                    num_experts,
                    false,
                )
            })
            .collect();
        let mut quiet = Tally::default();
        check_round_trip(&mut buffer, &mut quiet, &all, &config, "pair")?;
        ok &= quiet.failed == 0;
        progress.done(pair as usize + 1);
    }
    tally.check(me, ok, || {
        format!("{num_pairs} dispatch/combine pairs in a row: a result was wrong")
    });
    if let Some(count) = args.create_destroy {
        soak::create_destroy(&world, count, options, &mut tally)?;
    }
    check_mistakes(&mut buffer, &mut tally)?;
    guards::check_device_guards(&mut buffer, &mut tally, &config, seed)?;
    Ok(tally.finish(&world)?)
}

/// Layout, dispatch (notify included), cached dispatch and combine for one routing, on the
/// typed layer; every output checked against the host reference.
fn check_round_trip(
    buffer: &mut NvshmemBuffer<&World>,
    tally: &mut Tally,
    all: &[Tokens],
    config: &Config,
    case: &str,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let mine = &all[me];
    let num_tokens = mine.num_tokens;
    let num_experts = EXPERTS_PER_RANK * n;

    // ANCHOR: round_trip
    let x = upload(&stream, &mine.x, num_tokens, HIDDEN)?;
    let topk_idx = upload(&stream, &mine.topk_idx, num_tokens, NUM_TOPK)?;
    let topk_weights = upload(&stream, &mine.topk_weights, num_tokens, NUM_TOPK)?;
    let layout = buffer.get_dispatch_layout(&topk_idx, num_experts)?;
    let topk = TopK {
        idx: &topk_idx,
        weights: &topk_weights,
    };
    let got = buffer.dispatch(TokenRows::Bf16(&x), Some(topk), &layout, 1, config)?;
    let again = buffer.dispatch_cached(TokenRows::Bf16(&x), &got.handle, config)?;
    // Combine: each rank sends back what it received (an identity expert) with a bias.
    let bias: Vec<bf16> = (0..num_tokens * HIDDEN)
        .map(|i| bf16::from_f32((i % 7) as f32))
        .collect();
    let bias_dev = upload(&stream, &bias, num_tokens, HIDDEN)?;
    let RecvTokens::Bf16(recv_x) = &got.x else {
        unreachable!("bf16 in, bf16 out")
    };
    let (combined, combined_w) = buffer.combine(
        recv_x,
        got.topk_weights.as_ref(),
        [Some(&bias_dev), None],
        &got.handle,
        config,
    )?;
    buffer.check()?;
    // ANCHOR_END: round_trip

    let expected_per_rank: Vec<i32> = (0..n)
        .map(|r| (0..num_tokens).filter(|&t| mine.goes_to(t, r)).count() as i32)
        .collect();
    let per_rank = layout.num_tokens_per_rank.to_host(&stream)?;
    tally.check(me, per_rank == expected_per_rank, || {
        format!("{case}: num_tokens_per_rank {per_rank:?}, expected {expected_per_rank:?}")
    });
    let received = received_rows(all, me);
    let rows = check_dispatch(tally, all, &received, me, case, &stream, &got)?;
    let RecvTokens::Bf16(again) = again else {
        unreachable!("bf16 in, bf16 out")
    };
    tally.check(me, again.to_host(&stream)? == rows, || {
        format!("{case}: cached dispatch differs")
    });
    // fp8 rows and their scales with the same handle: bytes and scales arrive as sent.
    let (x8, scales) = fp8_rows(me, num_tokens);
    let x8 = upload(&stream, &x8, num_tokens, HIDDEN)?;
    let scales = upload(&stream, &scales, num_tokens, HIDDEN / FP8_GROUP)?;
    let got8 = buffer.dispatch_cached(TokenRows::Fp8(&x8, &scales), &got.handle, config)?;
    let RecvTokens::Fp8(got8, got_scales) = got8 else {
        unreachable!("fp8 in, fp8 out")
    };
    let (got8, got_scales) = (got8.to_host(&stream)?, got_scales.to_host(&stream)?);
    let (mut want8, mut want_scales) = (Vec::new(), Vec::new());
    let sent: Vec<_> = (0..n).map(|s| fp8_rows(s, all[s].num_tokens)).collect();
    let groups = HIDDEN / FP8_GROUP;
    for &(s, t) in &received {
        want8.extend_from_slice(&sent[s].0[t * HIDDEN..(t + 1) * HIDDEN]);
        want_scales.extend_from_slice(&sent[s].1[t * groups..(t + 1) * groups]);
    }
    tally.check(me, got8 == want8 && got_scales == want_scales, || {
        format!("{case}: fp8 dispatch: rows or scales differ")
    });
    let combined = combined.to_host(&stream)?;
    let combined_w = combined_w.expect("with weights").to_host(&stream)?;
    let wrong = combine_errors(mine, n, &bias, &combined, &combined_w);
    tally.check(me, wrong == 0, || {
        format!("{case}: combine: {wrong} values wrong")
    });
    Ok(())
}

/// What rank `me` receives, in order: (source rank, token) from rank 0, then 1, ..., each
/// in token order.
fn received_rows(all: &[Tokens], me: usize) -> Vec<(usize, usize)> {
    (0..all.len())
        .flat_map(|s| {
            (0..all[s].num_tokens)
                .filter(move |&t| all[s].goes_to(t, me))
                .map(move |t| (s, t))
        })
        .collect()
}

/// fp8 rows [num_tokens, HIDDEN] and f32 scales [num_tokens, HIDDEN / FP8_GROUP] of rank
/// `rank`: bytes and values that name their rank, token and position.
fn fp8_rows(rank: usize, num_tokens: usize) -> (Vec<Fp8E4m3>, Vec<f32>) {
    let x = (0..num_tokens * HIDDEN)
        .map(|i| Fp8E4m3((rank * 31 + i * 7 % 251) as u8))
        .collect();
    let scales = (0..num_tokens * HIDDEN / FP8_GROUP)
        .map(|i| (rank * 100_000 + i) as f32)
        .collect();
    (x, scales)
}

/// The received rows against the host reference: the rows, their source indices, their top-k
/// restricted to this rank. Returns the rows received.
fn check_dispatch(
    tally: &mut Tally,
    all: &[Tokens],
    received: &[(usize, usize)],
    me: usize,
    case: &str,
    stream: &Arc<CudaStream>,
    got: &nvshmem_tutorial::Dispatched,
) -> Result<Vec<bf16>, AnyError> {
    let rows = got.x.rows();
    tally.check(me, rows == received.len(), || {
        format!(
            "{case}: received {rows} tokens, expected {}",
            received.len()
        )
    });
    let RecvTokens::Bf16(recv_x) = &got.x else {
        unreachable!("bf16 in, bf16 out")
    };
    let got_x = recv_x.to_host(stream)?;
    let got_src = got.handle.recv_src_idx.to_host(stream)?;
    let got_idx = got.topk_idx.as_ref().expect("with top-k").to_host(stream)?;
    let got_w = got
        .topk_weights
        .as_ref()
        .expect("with top-k")
        .to_host(stream)?;
    let mut wrong = usize::from(rows != received.len());
    for (row, &(s, t)) in received.iter().enumerate().take(rows) {
        let want_x = &all[s].x[t * HIDDEN..(t + 1) * HIDDEN];
        wrong += usize::from(&got_x[row * HIDDEN..(row + 1) * HIDDEN] != want_x);
        wrong += usize::from(got_src[row] != t as i32);
        for k in 0..NUM_TOPK {
            let e = all[s].topk_idx[t * NUM_TOPK + k];
            let local = e >= 0 && e as usize / EXPERTS_PER_RANK == me;
            let (want_idx, want_w) = if local {
                let w = all[s].topk_weights[t * NUM_TOPK + k];
                (e - (me * EXPERTS_PER_RANK) as i64, w)
            } else {
                (-1, 0.0)
            };
            let i = row * NUM_TOPK + k;
            wrong += usize::from(got_idx[i] != want_idx || got_w[i] != want_w);
        }
    }
    tally.check(me, wrong == 0, || {
        format!("{case}: dispatch: {wrong} rows or top-k entries wrong")
    });
    Ok(got_x)
}

/// Wrong values of a combine whose experts are the identity: each token's rank gets bias +
/// x x (ranks it went to), summed in fp32 in rank order and rounded once; the weights come
/// back summed (0 where the expert was -1).
fn combine_errors(mine: &Tokens, n: usize, bias: &[bf16], got: &[bf16], got_w: &[f32]) -> usize {
    let mut wrong = 0;
    for t in 0..mine.num_tokens {
        let ranks = (0..n).filter(|&r| mine.goes_to(t, r)).count();
        for h in 0..HIDDEN {
            let value = mine.x[t * HIDDEN + h].to_f32();
            let sum = (0..ranks).fold(bias[t * HIDDEN + h].to_f32(), |acc, _| acc + value);
            wrong += usize::from(got[t * HIDDEN + h] != bf16::from_f32(sum));
        }
        for k in 0..NUM_TOPK {
            let i = t * NUM_TOPK + k;
            let want = if mine.topk_idx[i] >= 0 {
                mine.topk_weights[i]
            } else {
                0.0
            };
            wrong += usize::from(got_w[i] != want);
        }
    }
    wrong
}

/// Each is an error before anything is launched (the whole table of bad inputs is
/// src/bad_inputs.rs, on the CPU; these go through a live buffer).
fn check_mistakes(buffer: &mut NvshmemBuffer<&World>, tally: &mut Tally) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let int32_topk = upload(&stream, &[0i32; 16 * NUM_TOPK], 16, NUM_TOPK)?;
    let counts = upload(&stream, &[0i32; 64], 64, 0)?;
    let routing = upload(&stream, &vec![false; 16 * n], 16, n)?;
    let layout = LayoutOutputs {
        num_tokens_per_rank: View::vector(counts.view().ptr, n, counts.view().elem),
        num_tokens_per_rdma_rank: None,
        num_tokens_per_expert: View::vector(
            counts.view().ptr,
            EXPERTS_PER_RANK * n,
            counts.view().elem,
        ),
        is_token_in_rank: routing.view(),
    };
    // SAFETY: the views describe the arrays above; each call is refused before it writes.
    let result = unsafe {
        buffer.get_dispatch_layout_raw(
            &int32_topk.view(),
            EXPERTS_PER_RANK * n,
            &layout,
            stream.cu_stream(),
        )
    };
    tally.expect_error(me, "int32 topk_idx", result, "topk_idx must be int64");
    let topk = upload(&stream, &[0i64; 16 * NUM_TOPK], 16, NUM_TOPK)?;
    let result = buffer.get_dispatch_layout(&topk, 0).map(drop);
    tally.expect_error(me, "no experts", result, "positive multiple");
    let odd = Config::new(23, 8, 256, 6, 128)?;
    tally.expect_error(me, "odd num_sms", odd.check_for_launch(n), "must be even");
    let options = BufferOptions {
        num_rdma_bytes: 1 << 20,
        ..BufferOptions::normal(1 << 20)
    };
    tally.expect_error(
        me,
        "num_rdma_bytes outside low-latency mode",
        options.check(n),
        "inter-node",
    );
    Ok(())
}
