//! Chapter 8's runnable step:
//!
//! ```text
//! torchrun --standalone --nproc_per_node=N --no-python target/release/ch08-low-latency
//! ```
//!
//! Low-latency dispatch and combine (the decoding path: fixed slots, no count exchange) on
//! every rank: bf16 and fp8 (plain, power-of-two and UE8M0 scales), in one launch and split at
//! the receive hook, a zero-copy combine, a rank that sends nothing, every token to one rank's
//! experts (full slots), an expert id only the GPU can see is wrong, 50 round trips in a row
//! with no cleaning, the mistakes the host refuses, and `clean_low_latency_buffer`. Every rank
//! rebuilds every other rank's tokens and routing from the job's seed, so it checks what it
//! received, and what combine gave back, against a host reference without exchanging
//! anything. Ends `N passed, M failed`.

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Arc;

use ch01_bootstrap::checks::{POISON_BYTE, Tally, poison};
use ch01_bootstrap::{LaunchEnv, World};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use half::bf16;
use nvshmem_tutorial::DEFAULT_TIMEOUT_MS;
use nvshmem_tutorial::buffer::heap_bytes;
use nvshmem_tutorial::symmetric_memory::SYMMETRIC_SIZE_VAR;
use nvshmem_tutorial::{
    BufferError, BufferOptions, ElemType, LlCombineInputs, LlDispatchInputs, LlDispatchOptions,
    LlDispatchOutputs, LlHandle, LlShape, NvshmemBuffer, Phases, View,
    get_low_latency_rdma_size_hint,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

mod cases;
mod checks;
mod device;
mod mistakes;

use cases::*;
use checks::*;
use device::*;
use mistakes::*;

type AnyError = Box<dyn std::error::Error>;

/// T: the most tokens a rank sends in one call; every (local expert, source rank) pair owns T
/// slots on the expert's rank.
const MAX_TOKENS: usize = 64;
/// The buffer is sized for the larger hidden size; calls of the smaller one fit in it too.
const LARGE_HIDDEN: usize = 7168;
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
    size_the_heap()?;
    let world = World::from_env()?;
    let (me, n) = (world.my_pe(), world.n_pes());
    let num_experts = EXPERTS_PER_RANK * n;
    // ANCHOR: create
    let num_rdma_bytes = get_low_latency_rdma_size_hint(MAX_TOKENS, LARGE_HIDDEN, n, num_experts);
    let buffer = NvshmemBuffer::new(
        &world,
        BufferOptions {
            num_nvl_bytes: 0,
            num_rdma_bytes,
            low_latency_mode: true,
            timeout_ms: DEFAULT_TIMEOUT_MS,
        },
    )?;
    // ANCHOR_END: create
    let mut tally = Tally::default();
    let seed = world.job_seed();
    let case_seed = |i: u64| seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);

    let mut hidden = LARGE_HIDDEN;
    let mut next = |case: &Case, seed: u64| -> Result<Checks, AnyError> {
        if case.hidden != hidden {
            // Not needed by the protocol (the halves sit where the region's size puts them,
            // whatever the shape); kept so that a failure shows in the case that caused it.
            world.barrier_all()?;
            hidden = case.hidden;
        }
        round_trip(&buffer, case, seed)
    };
    for (i, case) in cases().iter().enumerate() {
        next(case, case_seed(i as u64))?.report(&mut tally);
    }

    // Many calls in a row, token counts, formats, phases and routing changing every time,
    // nothing cleaned in between: the device call numbers and the two halves carry it all.
    let mut pairs = Tally::default();
    for pair in 0..NUM_PAIRS {
        let checks = next(&pair_case(pair), case_seed(1000 + pair as u64))?;
        pairs.passed += checks.tally.passed;
        pairs.failed += checks.tally.failed;
    }
    println!(
        "pe {me}: {NUM_PAIRS} round trips in a row, no cleaning: {} checks passed, {} failed",
        pairs.passed, pairs.failed
    );
    tally.check(me, pairs.failed == 0, || {
        format!("{NUM_PAIRS} round trips in a row: a result was wrong")
    });

    check_mistakes(&buffer, &mut tally)?;
    // Nothing the refused calls did may show in the next call.
    let after = Case {
        name: "after the refused calls",
        ..pair_case(1)
    };
    next(&after, case_seed(2000))?.report(&mut tally);

    // ANCHOR: clean
    // Collective: every rank zeroes its control words and call count between two barriers.
    // SAFETY: the world's stream, live for the whole run.
    unsafe {
        buffer.clean_low_latency_buffer_raw(
            MAX_TOKENS,
            SMALL_HIDDEN,
            num_experts,
            world.stream().cu_stream(),
        )
    }?;
    // ANCHOR_END: clean
    let after = Case {
        name: "after clean_low_latency_buffer",
        ..pair_case(3)
    };
    next(&after, case_seed(2001))?.report(&mut tally);
    Ok(tally.finish(&world)?)
}

// ANCHOR: heap
/// NVSHMEM sizes its symmetric heap once, at initialisation, from NVSHMEM_SYMMETRIC_SIZE: set
/// it for this program's buffer before the World exists, unless the user chose a size. The
/// margin (as the Python package's) covers NVSHMEM's own allocations and the tally's.
fn size_the_heap() -> Result<(), AnyError> {
    if std::env::var_os(SYMMETRIC_SIZE_VAR).is_some() {
        return Ok(());
    }
    let n = LaunchEnv::from_env()?.world_size;
    let num_rdma_bytes =
        get_low_latency_rdma_size_hint(MAX_TOKENS, LARGE_HIDDEN, n, EXPERTS_PER_RANK * n);
    let num_bytes = heap_bytes(n, 0, num_rdma_bytes);
    // SAFETY: nothing else runs yet: main has started no thread and loaded no library.
    unsafe { std::env::set_var(SYMMETRIC_SIZE_VAR, format!("{}G", (num_bytes >> 30) + 2)) };
    Ok(())
}
// ANCHOR_END: heap

// ANCHOR: hook_split
/// One call in one launch, or split at DeepEP's receive hook: the send launch returns as soon
/// as the tokens are on their way, and the receive launch, issued later, waits for them and
/// unpacks. Between the two the stream (and the SMs) are free for other work: a real model
/// runs its next layer's attention there.
fn in_phases(
    split: bool,
    mut launch: impl FnMut(Phases) -> Result<(), BufferError>,
) -> Result<(), BufferError> {
    if split {
        launch(Phases::Send)?;
        launch(Phases::Receive)
    } else {
        launch(Phases::SendAndReceive)
    }
}
// ANCHOR_END: hook_split

/// Dispatch then combine for `case`; every output checked against the host reference.
fn round_trip(buffer: &NvshmemBuffer<&World>, case: &Case, seed: u64) -> Result<Checks, AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let cs = stream.cu_stream();
    let gpu = Gpu(stream);
    let layout = LlShape {
        max_tokens: MAX_TOKENS,
        hidden: case.hidden,
        num_ranks: n,
        num_experts: EXPERTS_PER_RANK * n,
    };
    let (l, hidden) = (layout.num_local_experts(), layout.hidden);
    let all: Vec<Tokens> = (0..n)
        .map(|rank| Tokens::new(case, seed, rank, &layout))
        .collect();
    let mine = &all[me];
    let num_tokens = mine.num_tokens;
    let mut checks = Checks {
        me,
        case: *case,
        layout,
        tally: Tally::default(),
        num_tokens_sent: num_tokens,
        num_rows_received: 0,
    };

    // The optional statistics are added to: start them from values that are not zero.
    let stats_before: Vec<i32> = (0..l as i32).map(|e| 1000 + e).collect();
    let recv_stats = gpu.upload(&stats_before)?;
    let dispatch_cost = gpu.upload(&vec![1i64; n])?;
    let combine_cost = gpu.upload(&vec![1i64; n])?;

    // ANCHOR: dispatch_call
    let x = gpu.upload(&mine.x)?;
    let topk_idx = gpu.upload(&mine.topk_idx)?;
    let inputs = LlDispatchInputs {
        x: View::matrix(gpu.ptr(&x), num_tokens, hidden, ElemType::Bf16),
        topk_idx: View::matrix(gpu.ptr(&topk_idx), num_tokens, NUM_TOPK, ElemType::I64),
        cumulative_local_expert_recv_stats: Some(gpu.vector(&recv_stats, ElemType::I32)),
        dispatch_wait_recv_cost_stats: Some(gpu.vector(&dispatch_cost, ElemType::I64)),
    };
    // Shapes fixed by (T, hidden, experts) whatever the routing: L x n x T rows, of which
    // the first recv_count[e] of expert e's n x T are valid.
    let recv = RecvBuffers::new(&gpu, &layout, case.precision)?;
    let outputs = recv.views(&gpu, &layout, case.precision);
    let options = case.options(&layout);
    in_phases(case.split, |phases| {
        // SAFETY: the views describe the allocations above, alive past the synchronise below.
        unsafe { buffer.low_latency_dispatch_raw(&inputs, &outputs, &options, phases, cs) }
    })?;
    stream.synchronize()?;
    // ANCHOR_END: dispatch_call
    checks.input_record(buffer, "dispatch")?;
    let got = recv.to_host(stream)?;
    checks.dispatch(&all, &got);
    let stats = stream.clone_dtoh(&recv_stats)?;
    let want: Vec<i32> = (0..l)
        .map(|e| {
            let received: usize = all.iter().map(|s| kept(&s.tokens_for(me * l + e))).sum();
            stats_before[e] + received as i32
        })
        .collect();
    checks.check(stats == want, || {
        format!("cumulative_local_expert_recv_stats {stats:?}, expected {want:?}")
    });
    checks.cost_grew("dispatch", &stream.clone_dtoh(&dispatch_cost)?);

    // The experts' results, in the rows the handle describes.
    let results = gpu.upload(&expert_results(&layout, me, &all, &got))?;
    let topk_weights = gpu.upload(&mine.topk_weights)?;
    let combined = gpu.poisoned::<bf16>(num_tokens * hidden)?;
    // ANCHOR: combine_call
    // The handle is the dispatch's own outputs: where each row came from.
    let handle = LlHandle {
        src_info: outputs.recv_src_info,
        layout_range: outputs.recv_layout_range,
        num_max_dispatch_tokens_per_rank: MAX_TOKENS,
        hidden,
        num_experts: layout.num_experts,
    };
    let x = if case.zero_copy {
        // Zero copy: the results go into the buffer's own staging rows (a real expert would
        // write its output there; here a device copy), so combine sends from there instead
        // of copying them in first.
        let staging =
            buffer.next_low_latency_combine_buffer_raw(MAX_TOKENS, hidden, layout.num_experts)?;
        // SAFETY: both are [L x n x T, hidden] bf16 on this GPU; stream-ordered.
        unsafe {
            let (dst, src, num_bytes) = (staging.ptr, gpu.ptr(&results), results.len() * 2);
            cudarc::driver::result::memcpy_dtod_async(dst, src, num_bytes, cs)
        }?;
        None
    } else {
        let rows = l * n * MAX_TOKENS;
        Some(View::matrix(
            gpu.ptr(&results),
            rows,
            hidden,
            ElemType::Bf16,
        ))
    };
    let combine_inputs = LlCombineInputs {
        x,
        topk_idx: inputs.topk_idx,
        topk_weights: View::matrix(gpu.ptr(&topk_weights), num_tokens, NUM_TOPK, ElemType::F32),
        combine_wait_recv_cost_stats: Some(gpu.vector(&combine_cost, ElemType::I64)),
    };
    let out = View::matrix(gpu.ptr(&combined), num_tokens, hidden, ElemType::Bf16);
    in_phases(case.split, |phases| {
        // SAFETY: as for the dispatch.
        unsafe { buffer.low_latency_combine_raw(&combine_inputs, &handle, &out, phases, cs) }
    })?;
    stream.synchronize()?;
    // ANCHOR_END: combine_call
    checks.input_record(buffer, "combine")?;
    checks.combine(mine, &stream.clone_dtoh(&combined)?);
    checks.cost_grew("combine", &stream.clone_dtoh(&combine_cost)?);
    checks.num_rows_received = got.count.iter().map(|&c| c.max(0) as usize).sum();
    Ok(checks)
}

// ---- the host reference -------------------------------------------------------------------
