//! Chapter 8's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch08-low-latency
//! ```
//!
//! Low-latency dispatch and combine (the decoding path: fixed slots, no count exchange) on
//! every rank: bf16 and fp8 (plain, power-of-two and UE8M0 scales), in one launch and split at
//! the receive hook, a zero-copy combine, a rank that sends nothing, every token to one rank's
//! experts (full slots), every token to one expert, hidden 2048, 4096 and 7168, an expert id
//! only the GPU can see is wrong, 50 round trips in a row with no cleaning (`--pairs N` for
//! more), the mistakes the host refuses, and `clean_low_latency_buffer`. On virtual nodes
//! (`NVSHMEM_TUTORIAL_NODE_PES=G`) the same checks run with the ranks of other nodes reached
//! by NVSHMEM puts only. Every rank
//! rebuilds every other rank's tokens and routing from the job's seed, so it checks what it
//! received, and what combine gave back, against a host reference without exchanging
//! anything. Ends `N passed, M failed`.

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::World;
use ch01_bootstrap::checks::{POISON_BYTE, Tally, poison};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use half::bf16;
use nvshmem_tutorial::buffer::heap_bytes;
use nvshmem_tutorial::{
    BufferError, BufferOptions, DeviceArray, ElemType, Element, Fp8E4m3, LlCombineInputs,
    LlDispatchInputs, LlDispatchOptions, LlDispatchOutputs, LlDispatched, LlHandle, LlRecvTokens,
    LlShape, LlStats, NvshmemBuffer, Phases, TopK, View, get_low_latency_rdma_size_hint,
};
use rand::{SeedableRng, rngs::StdRng};

mod cases;
mod checks;
mod device;
mod guards;
#[path = "../shared/heap.rs"]
mod heap;
mod mistakes;
#[path = "../shared/mod.rs"]
mod shared;

use cases::*;
use checks::*;
use device::*;
use mistakes::*;
use shared::{AnyError, routing, soak};

/// T: the most tokens a rank sends in one call; every (local expert, source rank) pair owns T
/// slots on the expert's rank.
const MAX_TOKENS: usize = 64;
/// The buffer is sized for the larger hidden size; calls of the smaller one fit in it too.
const LARGE_HIDDEN: usize = 7168;
const MID_HIDDEN: usize = 4096;
const SMALL_HIDDEN: usize = 2048;
const EXPERTS_PER_RANK: usize = 8;
/// Distinct experts per token (every run has at least 8 experts), about 1 in 10 left at -1.
const NUM_TOPK: usize = 8;
const NUM_PAIRS: usize = 50;
/// A bf16 result may differ from the fp32 sum by half a unit in the last place (2^-8 of the
/// value), plus a little for a different fp32 summation (FMA on the GPU).
const BF16_ROUNDING: f32 = 1.0 / 256.0 + 1e-5;
fn main() -> ExitCode {
    ch01_bootstrap::checks::exit_code("ch08-low-latency", run())
}

fn run() -> Result<bool, AnyError> {
    let args = soak::soak_args()?;
    heap::size_the_heap(heap_for)?;
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let num_experts = EXPERTS_PER_RANK * n;
    // ANCHOR: create
    let num_rdma_bytes = get_low_latency_rdma_size_hint(MAX_TOKENS, LARGE_HIDDEN, n, num_experts);
    let options = args.apply(BufferOptions::low_latency(num_rdma_bytes));
    let mut buffer = NvshmemBuffer::new(&world, options)?;
    // ANCHOR_END: create
    buffer.set_poison_outputs(true); // what no kernel wrote shows as 0xFF bytes
    // Virtual nodes (NVSHMEM_TUTORIAL_NODE_PES): ranks of other nodes are reached by NVSHMEM
    // puts only; on one host those still cross NVLink, so this checks the route, not speed.
    let g = buffer.spec().node_pes;
    if me == 0 {
        println!(
            "topology: {n} rank(s) in {} node(s) of {g}: peer stores inside a node, NVSHMEM \
             puts across",
            n / g
        );
    }
    let mut tally = Tally::default();
    let seed = world.job_seed();
    let case_seed = |i: u64| seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);

    let mut hidden = LARGE_HIDDEN;
    let mut next =
        |buffer: &mut NvshmemBuffer<&World>, case: &Case, seed: u64| -> Result<Checks, AnyError> {
            if case.hidden != hidden {
                // Not needed by the protocol (the halves sit where the region's size puts them,
                // whatever the shape); kept so that a failure shows in the case that caused it.
                world.barrier_all()?;
                hidden = case.hidden;
            }
            round_trip(buffer, case, seed)
        };
    for (i, case) in cases().iter().enumerate() {
        next(&mut buffer, case, case_seed(i as u64))?.report(&mut tally);
    }

    // Many calls in a row, token counts, formats, phases and routing changing every time,
    // nothing cleaned in between: the device call numbers and the two halves carry it all.
    let mut pairs = Tally::default();
    let num_pairs = args.pairs.unwrap_or(NUM_PAIRS);
    let progress = soak::Progress::new(me, "round trips", num_pairs);
    for pair in 0..num_pairs {
        let checks = next(&mut buffer, &pair_case(pair), case_seed(1000 + pair as u64))?;
        pairs.passed += checks.tally.passed;
        pairs.failed += checks.tally.failed;
        progress.done(pair + 1);
    }
    println!(
        "pe {me}: {num_pairs} round trips in a row, no cleaning: {} checks passed, {} failed",
        pairs.passed, pairs.failed
    );
    tally.check(me, pairs.failed == 0, || {
        format!("{num_pairs} round trips in a row: a result was wrong")
    });

    check_mistakes(&buffer, &mut tally)?;
    guards::check_bad_handle(&mut buffer, &mut tally)?;
    // Nothing the refused calls did may show in the next call.
    let after = Case {
        name: "after the refused calls",
        ..pair_case(1)
    };
    next(&mut buffer, &after, case_seed(2000))?.report(&mut tally);

    // ANCHOR: clean
    // Collective: every rank zeroes its control words and call count between two barriers.
    buffer.clean_low_latency_buffer(MAX_TOKENS, SMALL_HIDDEN, num_experts)?;
    // ANCHOR_END: clean
    let after = Case {
        name: "after clean_low_latency_buffer",
        ..pair_case(3)
    };
    next(&mut buffer, &after, case_seed(2001))?.report(&mut tally);
    if let Some(count) = args.create_destroy {
        soak::create_destroy(&world, count, options, &mut tally)?;
    }
    Ok(tally.finish(&world)?)
}

// ANCHOR: heap
/// The heap this program's buffer needs (shared::heap sets it before the World exists).
fn heap_for(n: usize) -> usize {
    let num_rdma_bytes =
        get_low_latency_rdma_size_hint(MAX_TOKENS, LARGE_HIDDEN, n, EXPERTS_PER_RANK * n);
    heap_bytes(n, 0, num_rdma_bytes)
}
// ANCHOR_END: heap

/// Dispatch then combine for `case` on the typed layer; every output checked against the
/// host reference.
fn round_trip(
    buffer: &mut NvshmemBuffer<&World>,
    case: &Case,
    seed: u64,
) -> Result<Checks, AnyError> {
    let world = buffer.world();
    let (me, n, stream) = (world.my_pe(), world.n_pes(), world.stream().clone());
    let shape = LlShape {
        max_tokens: MAX_TOKENS,
        hidden: case.hidden,
        num_ranks: n,
        num_experts: EXPERTS_PER_RANK * n,
    };
    let (l, hidden) = (shape.num_local_experts(), shape.hidden);
    let all: Vec<Tokens> = (0..n)
        .map(|rank| Tokens::new(case, seed, rank, &shape))
        .collect();
    let mine = &all[me];
    let num_tokens = mine.num_tokens;
    let mut checks = Checks {
        me,
        case: *case,
        layout: shape,
        tally: Tally::default(),
        num_tokens_sent: num_tokens,
        num_rows_received: 0,
    };
    // The optional statistics are added to: start them from values that are not zero.
    let stats_before: Vec<i32> = (0..l as i32).map(|e| 1000 + e).collect();
    let mut recv_stats = DeviceArray::from_host(&stream, &stats_before, l, 0)?;
    let mut dispatch_cost = DeviceArray::from_host(&stream, &vec![1i64; n], n, 0)?;
    let mut combine_cost = DeviceArray::from_host(&stream, &vec![1i64; n], n, 0)?;
    let x = DeviceArray::from_host(&stream, &mine.x, num_tokens, hidden)?;
    let topk_idx = DeviceArray::from_host(&stream, &mine.topk_idx, num_tokens, NUM_TOPK)?;
    let topk_weights = DeviceArray::from_host(&stream, &mine.topk_weights, num_tokens, NUM_TOPK)?;

    // ANCHOR: dispatch_call
    let stats = LlStats {
        cumulative_local_expert_recv_stats: Some(&mut recv_stats),
        wait_recv_cost_stats: Some(&mut dispatch_cost),
    };
    let options = case.options(&shape);
    let dispatched = if case.split {
        // Split at DeepEP's receive hook: the send returns as soon as the tokens are on their
        // way; between it and `receive()` the stream (and the SMs) are free for other work,
        // and the pending call holds the buffer, so nothing else can run on it.
        let pending = buffer.low_latency_dispatch_send(&x, &topk_idx, stats, options)?;
        pending.receive()?
    } else {
        buffer.low_latency_dispatch(&x, &topk_idx, stats, options)?
    };
    // ANCHOR_END: dispatch_call
    checks.input_record(buffer, "dispatch")?;
    let got = Received::from_typed(&dispatched, &stream)?;
    checks.dispatch(&all, &got);
    checks.stats_grew(&all, &stats_before, &recv_stats.to_host(&stream)?);
    checks.cost_grew("dispatch", &dispatch_cost.to_host(&stream)?);

    // The experts' results, in the rows the handle describes.
    let results = expert_results(&shape, me, &all, &got);
    let results = DeviceArray::from_host(&stream, &results, l * n * MAX_TOKENS, hidden)?;
    // ANCHOR: combine_call
    let handle = &dispatched.handle; // where each row came from
    let x = if case.zero_copy {
        // Zero copy: the results go into the buffer's own staging rows (a real expert would
        // write its output there; here a device copy), so combine sends from there instead of
        // copying them in first.
        buffer
            .next_low_latency_combine_buffer(handle)?
            .copy_from(&results)?;
        None
    } else {
        Some(&results)
    };
    let topk = TopK {
        idx: &topk_idx,
        weights: &topk_weights,
    };
    let cost = Some(&mut combine_cost);
    let combined = if case.split {
        buffer
            .low_latency_combine_send(x, topk, cost, handle)?
            .receive()?
    } else {
        buffer.low_latency_combine(x, topk, cost, handle)?
    };
    // ANCHOR_END: combine_call
    checks.input_record(buffer, "combine")?;
    checks.combine(mine, &combined.to_host(&stream)?);
    checks.cost_grew("combine", &combine_cost.to_host(&stream)?);
    checks.num_rows_received = got.count.iter().map(|&c| c.max(0) as usize).sum();
    Ok(checks)
}

// ---- the host reference -------------------------------------------------------------------
