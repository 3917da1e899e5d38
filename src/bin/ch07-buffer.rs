//! Chapter 7's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch07-buffer
//! ```
//!
//! A mixture-of-experts layer's communication on every rank: the layout of random top-k
//! routing (with -1 entries), dispatch (bf16 and fp8, with and without top-k, fresh and with
//! a cached handle, fixed-size outputs), combine (with weights and biases), 200 dispatch and
//! combine pairs in a row with new routing and no cleanup, then the mistakes. Every result is
//! checked against a host reference built from every rank's inputs (each rank can rebuild
//! every other's from the shared seed). Ends `N passed, M failed`.

use std::process::ExitCode;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::Tally;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use nvshmem_tutorial::{
    BufferOptions, CombineInputs, CombineOutputs, Config, DispatchInputs, DispatchOutputs,
    ElemType, Handle, LayoutOutputs, NotifyInputs, NotifyOutputs, NvshmemBuffer, View,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

type AnyError = Box<dyn std::error::Error>;

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
        let mut topk_idx = Vec::with_capacity(num_tokens * NUM_TOPK);
        for _ in 0..num_tokens {
            let mut chosen: Vec<i64> = Vec::new();
            while chosen.len() < NUM_TOPK {
                let e = if skew {
                    rng.random_range(0..EXPERTS_PER_RANK) as i64
                } else {
                    rng.random_range(0..num_experts) as i64
                };
                let e = if rng.random_ratio(1, 10) { -1 } else { e };
                if e < 0 || !chosen.contains(&e) {
                    chosen.push(e)
                }
            }
            topk_idx.extend(chosen);
        }
        let topk_weights = (0..num_tokens * NUM_TOPK)
            .map(|_| rng.random_range(0.5f32..2.0))
            .collect();
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

/// Device memory a case allocates (cudarc frees it when dropped).
struct Alloc<'s>(&'s std::sync::Arc<CudaStream>);

impl Alloc<'_> {
    fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, AnyError> {
        Ok(self.0.clone_htod(host)?)
    }
    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>, AnyError> {
        Ok(self.0.alloc_zeros::<T>(len.max(1))?)
    }
    fn ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        slice.device_ptr(self.0).0
    }
}

fn run() -> Result<bool, AnyError> {
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let num_experts = EXPERTS_PER_RANK * n;
    let config = Config::new(24, 8, 256, 6, 128)?; // DeepEP test_intranode.py's
    let num_nvl_bytes = config.get_nvl_buffer_size_hint(HIDDEN * 2, n);
    // ANCHOR: create
    let buffer = NvshmemBuffer::new(&world, BufferOptions::normal(num_nvl_bytes))?;
    // ANCHOR_END: create
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
            &buffer,
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
    let mut ok = true;
    for pair in 0..200u64 {
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
        check_round_trip(&buffer, &mut quiet, &all, &config, "pair")?;
        ok &= quiet.failed == 0;
    }
    tally.check(me, ok, || {
        "200 dispatch/combine pairs in a row: a result was wrong".into()
    });
    check_mistakes(&buffer, &mut tally, &config)?;
    Ok(tally.finish(&world)?)
}

// ANCHOR: round_trip
/// Layout, notify, dispatch, cached dispatch, combine for one routing; every output checked.
fn check_round_trip(
    buffer: &NvshmemBuffer<&World>,
    tally: &mut Tally,
    all: &[Tokens],
    config: &Config,
    case: &str,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let cs = stream.cu_stream();
    let a = Alloc(stream);
    let mine = &all[me];
    let num_experts = EXPERTS_PER_RANK * n;
    let (t_count, c) = (mine.num_tokens, config.num_channels());

    let x = a.upload(&mine.x)?;
    let topk_idx = a.upload(&mine.topk_idx)?;
    let topk_weights = a.upload(&mine.topk_weights)?;
    let per_rank = a.zeros::<i32>(n)?;
    let per_expert = a.zeros::<i32>(num_experts)?;
    let in_rank = a.zeros::<bool>(t_count * n)?;
    let layout = LayoutOutputs {
        num_tokens_per_rank: View::vector(a.ptr(&per_rank), n, ElemType::I32),
        num_tokens_per_expert: View::vector(a.ptr(&per_expert), num_experts, ElemType::I32),
        is_token_in_rank: View::matrix(a.ptr(&in_rank), t_count, n, ElemType::Bool),
    };
    let topk_view = View::matrix(a.ptr(&topk_idx), t_count, NUM_TOPK, ElemType::I64);
    // SAFETY (every buffer call below): the views describe the allocations just made.
    unsafe { buffer.get_dispatch_layout_raw(&topk_view, num_experts, &layout, cs)? };
    let expected_per_rank: Vec<i32> = (0..n)
        .map(|r| (0..t_count).filter(|&t| mine.goes_to(t, r)).count() as i32)
        .collect();
    tally.check(
        me,
        stream.clone_dtoh(&per_rank)? == expected_per_rank,
        || format!("{case}: num_tokens_per_rank"),
    );

    let rpm = a.zeros::<i32>(n * n)?;
    let cpm = a.zeros::<i32>(n * c)?;
    let rcpm = a.zeros::<i32>(n * c)?;
    let notify_out = NotifyOutputs {
        rank_prefix_matrix: View::matrix(a.ptr(&rpm), n, n, ElemType::I32),
        channel_prefix_matrix: View::matrix(a.ptr(&cpm), n, c, ElemType::I32),
        recv_channel_prefix_matrix: View::matrix(a.ptr(&rcpm), n, c, ElemType::I32),
    };
    let notify_in = NotifyInputs {
        num_tokens_per_rank: layout.num_tokens_per_rank,
        num_tokens_per_expert: layout.num_tokens_per_expert,
        is_token_in_rank: layout.is_token_in_rank,
        expert_alignment: 1,
    };
    let counts =
        unsafe { buffer.notify_raw(&notify_in, &notify_out, config, true, cs)? }.expect("waited");

    // The host reference: rows from rank 0, then 1, ..., each in token order.
    let received: Vec<(usize, usize)> = (0..n)
        .flat_map(|s| {
            (0..all[s].num_tokens)
                .filter(move |&t| all[s].goes_to(t, me))
                .map(move |t| (s, t))
        })
        .collect();
    tally.check(me, counts.num_recv_tokens == received.len(), || {
        format!(
            "{case}: notify says {} tokens, expected {}",
            counts.num_recv_tokens,
            received.len()
        )
    });
    let rows = received.len();
    let recv_x = a.zeros::<bf16>(rows * HIDDEN)?;
    let recv_src_idx = a.zeros::<i32>(rows)?;
    let recv_topk_idx = a.zeros::<i64>(rows * NUM_TOPK)?;
    let recv_topk_weights = a.zeros::<f32>(rows * NUM_TOPK)?;
    let send_head = a.zeros::<i32>(t_count * n)?;
    let handle = Handle {
        rank_prefix_matrix: notify_out.rank_prefix_matrix,
        channel_prefix_matrix: notify_out.channel_prefix_matrix,
        recv_channel_prefix_matrix: notify_out.recv_channel_prefix_matrix,
        recv_src_idx: View::vector(a.ptr(&recv_src_idx), rows, ElemType::I32),
        is_token_in_rank: layout.is_token_in_rank,
        send_head: View::matrix(a.ptr(&send_head), t_count, n, ElemType::I32),
    };
    let inputs = DispatchInputs {
        x: View::matrix(a.ptr(&x), t_count, HIDDEN, ElemType::Bf16),
        x_scales: None,
        topk_idx: Some(topk_view),
        topk_weights: Some(View::matrix(
            a.ptr(&topk_weights),
            t_count,
            NUM_TOPK,
            ElemType::F32,
        )),
        num_experts,
    };
    let outputs = DispatchOutputs {
        recv_x: View::matrix(a.ptr(&recv_x), rows, HIDDEN, ElemType::Bf16),
        recv_x_scales: None,
        recv_topk_idx: Some(View::matrix(
            a.ptr(&recv_topk_idx),
            rows,
            NUM_TOPK,
            ElemType::I64,
        )),
        recv_topk_weights: Some(View::matrix(
            a.ptr(&recv_topk_weights),
            rows,
            NUM_TOPK,
            ElemType::F32,
        )),
    };
    unsafe { buffer.dispatch_raw(&inputs, &handle, &outputs, config, cs)? };
    let got_x = stream.clone_dtoh(&recv_x)?;
    let got_src = stream.clone_dtoh(&recv_src_idx)?;
    let got_idx = stream.clone_dtoh(&recv_topk_idx)?;
    let got_w = stream.clone_dtoh(&recv_topk_weights)?;
    buffer.check()?;
    let mut wrong = 0;
    for (row, &(s, t)) in received.iter().enumerate() {
        wrong += usize::from(
            got_x[row * HIDDEN..(row + 1) * HIDDEN] != all[s].x[t * HIDDEN..(t + 1) * HIDDEN]
                || got_src[row] != t as i32,
        );
        for k in 0..NUM_TOPK {
            let e = all[s].topk_idx[t * NUM_TOPK + k];
            let local = e >= 0 && e as usize / EXPERTS_PER_RANK == me;
            let (want_idx, want_w) = if local {
                (
                    e - (me * EXPERTS_PER_RANK) as i64,
                    all[s].topk_weights[t * NUM_TOPK + k],
                )
            } else {
                (-1, 0.0)
            };
            wrong += usize::from(
                got_idx[row * NUM_TOPK + k] != want_idx || got_w[row * NUM_TOPK + k] != want_w,
            );
        }
    }
    tally.check(me, wrong == 0, || {
        format!("{case}: dispatch: {wrong} rows or top-k entries wrong")
    });

    // Cached: the handle instead of the notify step; the same rows again.
    let again = a.zeros::<bf16>(rows * HIDDEN)?;
    let cached_in = DispatchInputs {
        topk_idx: None,
        topk_weights: None,
        ..inputs
    };
    let cached_out = DispatchOutputs {
        recv_x: View::matrix(a.ptr(&again), rows, HIDDEN, ElemType::Bf16),
        recv_topk_idx: None,
        recv_topk_weights: None,
        ..outputs
    };
    unsafe { buffer.dispatch_raw(&cached_in, &handle, &cached_out, config, cs)? };
    tally.check(me, stream.clone_dtoh(&again)? == got_x, || {
        format!("{case}: cached dispatch differs")
    });

    // Combine: each rank sends back what it received (an identity expert), plus a bias;
    // the token's rank gets bias + x * (ranks it went to), summed in fp32 in rank order.
    let bias: Vec<bf16> = (0..t_count * HIDDEN)
        .map(|i| bf16::from_f32((i % 7) as f32))
        .collect();
    let bias_dev = a.upload(&bias)?;
    let combined = a.zeros::<bf16>(t_count * HIDDEN)?;
    let combined_w = a.zeros::<f32>(t_count * NUM_TOPK)?;
    let combine_in = CombineInputs {
        x: outputs.recv_x,
        topk_weights: outputs.recv_topk_weights,
        bias: [
            Some(View::matrix(
                a.ptr(&bias_dev),
                t_count,
                HIDDEN,
                ElemType::Bf16,
            )),
            None,
        ],
    };
    let combine_out = CombineOutputs {
        combined_x: View::matrix(a.ptr(&combined), t_count, HIDDEN, ElemType::Bf16),
        combined_topk_weights: Some(View::matrix(
            a.ptr(&combined_w),
            t_count,
            NUM_TOPK,
            ElemType::F32,
        )),
    };
    unsafe { buffer.combine_raw(&combine_in, &handle, &combine_out, config, cs)? };
    let got = stream.clone_dtoh(&combined)?;
    let got_w = stream.clone_dtoh(&combined_w)?;
    buffer.check()?;
    let mut wrong = 0;
    for t in 0..t_count {
        let ranks = (0..n).filter(|&r| mine.goes_to(t, r)).count();
        for h in 0..HIDDEN {
            let value = mine.x[t * HIDDEN + h].to_f32();
            let sum = (0..ranks).fold(bias[t * HIDDEN + h].to_f32(), |acc, _| acc + value);
            wrong += usize::from(got[t * HIDDEN + h] != bf16::from_f32(sum));
        }
        for k in 0..NUM_TOPK {
            let e = mine.topk_idx[t * NUM_TOPK + k];
            let want = if e >= 0 {
                mine.topk_weights[t * NUM_TOPK + k]
            } else {
                0.0
            };
            wrong += usize::from(got_w[t * NUM_TOPK + k] != want);
        }
    }
    tally.check(me, wrong == 0, || {
        format!("{case}: combine: {wrong} values wrong")
    });
    Ok(())
}
// ANCHOR_END: round_trip

/// Each is an error before anything is launched.
fn check_mistakes(
    buffer: &NvshmemBuffer<&World>,
    tally: &mut Tally,
    config: &Config,
) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let a = Alloc(stream);
    let topk = a.zeros::<i32>(16 * NUM_TOPK)?;
    let counts = a.zeros::<i32>(64)?;
    let routing = a.zeros::<bool>(16 * n)?;
    let layout = LayoutOutputs {
        num_tokens_per_rank: View::vector(a.ptr(&counts), n, ElemType::I32),
        num_tokens_per_expert: View::vector(a.ptr(&counts), EXPERTS_PER_RANK * n, ElemType::I32),
        is_token_in_rank: View::matrix(a.ptr(&routing), 16, n, ElemType::Bool),
    };
    let int32_topk = View::matrix(a.ptr(&topk), 16, NUM_TOPK, ElemType::I32);
    let cs = stream.cu_stream();
    // SAFETY: the views describe the allocations above; each call is refused before it writes.
    let result =
        unsafe { buffer.get_dispatch_layout_raw(&int32_topk, EXPERTS_PER_RANK * n, &layout, cs) };
    tally.expect_error(me, "int32 topk_idx", result, "topk_idx must be int64");
    let i64_topk = View {
        elem: ElemType::I64,
        ..int32_topk
    };
    let result = unsafe { buffer.get_dispatch_layout_raw(&i64_topk, 0, &layout, cs) };
    tally.expect_error(me, "no experts", result, "positive multiple");
    let odd = Config::new(23, 8, 256, 6, 128)?;
    tally.expect_error(me, "odd num_sms", odd.check_for_launch(n), "must be even");
    let hint = config.get_nvl_buffer_size_hint(HIDDEN * 2, n);
    tally.expect_error(
        me,
        "num_rdma_bytes outside low-latency mode",
        BufferOptions {
            num_rdma_bytes: 1 << 20,
            ..BufferOptions::normal(hint)
        }
        .check(n),
        "inter-node",
    );
    Ok(())
}
