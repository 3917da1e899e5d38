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
use nvshmem_tutorial::buffer::heap_bytes;
use nvshmem_tutorial::config::DEFAULT_TIMEOUT_MS;
use nvshmem_tutorial::symmetric_memory::SYMMETRIC_SIZE_VAR;
use nvshmem_tutorial::{
    BufferError, BufferOptions, ElemType, LlCombineInputs, LlDispatchInputs, LlDispatchOptions,
    LlDispatchOutputs, LlHandle, LlLayout, NvshmemBuffer, Phases, View,
    get_low_latency_rdma_size_hint,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

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
        buffer.clean_low_latency_buffer(
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

// ---- what a case is -----------------------------------------------------------------------

/// The format of dispatched rows, and of their fp8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Precision {
    Bf16,
    /// fp8 e4m3, one f32 scale per 128 channels (amax / 448).
    Fp8,
    /// The same, each scale rounded up to a power of two.
    Fp8RoundScale,
    /// Power-of-two scales stored as their exponent byte, four to an int32 (UE8M0).
    Fp8Ue8m0,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// Random distinct experts per token, about 1 in 10 entries -1.
    Random,
    /// As `Random`, but the last rank has no tokens (with one rank: nobody sends anything).
    LastRankSilent,
    /// Every token picks among rank 0's experts only: with T tokens, their slots fill up.
    AllToRankZero,
    /// As `Random`, plus one entry past the last expert that only the GPU sees.
    BadExpertId,
    /// Every token names expert 0 twice: 2 x T tokens for its T slots. The GPU keeps T, drops
    /// the rest (the call still completes) and reports it.
    ExpertTwice,
}

/// One dispatch and one combine.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    hidden: usize,
    /// Tokens each rank sends (at most MAX_TOKENS).
    num_tokens: usize,
    precision: Precision,
    routing: Routing,
    /// Each call as two launches, send then receive (DeepEP's `return_recv_hook`).
    split: bool,
    /// The combine reads the expert results from the buffer's staging rows.
    zero_copy: bool,
}

impl Case {
    fn options(&self, layout: &LlLayout) -> LlDispatchOptions {
        use Precision::*;
        LlDispatchOptions {
            num_max_dispatch_tokens_per_rank: layout.max_tokens,
            num_experts: layout.num_experts,
            use_fp8: self.precision != Bf16,
            round_scale: matches!(self.precision, Fp8RoundScale | Fp8Ue8m0),
            use_ue8m0: self.precision == Fp8Ue8m0,
        }
    }
}

fn cases() -> Vec<Case> {
    use Precision::*;
    let base = Case {
        name: "bf16",
        hidden: LARGE_HIDDEN,
        num_tokens: 50,
        precision: Bf16,
        routing: Routing::Random,
        split: false,
        zero_copy: false,
    };
    vec![
        base,
        Case {
            name: "fp8, T tokens",
            precision: Fp8,
            num_tokens: MAX_TOKENS,
            ..base
        },
        Case {
            name: "fp8, round_scale",
            precision: Fp8RoundScale,
            ..base
        },
        Case {
            name: "fp8, UE8M0 scales",
            precision: Fp8Ue8m0,
            ..base
        },
        Case {
            name: "bf16, receive hook (send, then receive)",
            split: true,
            ..base
        },
        Case {
            name: "fp8, receive hook",
            precision: Fp8,
            split: true,
            ..base
        },
        Case {
            name: "bf16, zero-copy combine",
            zero_copy: true,
            ..base
        },
        Case {
            name: "the last rank sends nothing",
            routing: Routing::LastRankSilent,
            ..base
        },
        Case {
            name: "every token to rank 0's experts (full slots)",
            num_tokens: MAX_TOKENS,
            routing: Routing::AllToRankZero,
            ..base
        },
        Case {
            name: "an expert id out of range (found on the GPU)",
            routing: Routing::BadExpertId,
            ..base
        },
        Case {
            name: "one expert named twice per token: T slots overflow (found on the GPU)",
            num_tokens: MAX_TOKENS,
            routing: Routing::ExpertTwice,
            ..base
        },
        Case {
            name: "hidden 2048, UE8M0, receive hook, zero copy",
            hidden: SMALL_HIDDEN,
            precision: Fp8Ue8m0,
            split: true,
            zero_copy: true,
            ..base
        },
    ]
}

/// Round trip `pair` of the run of many: every option in turn, at the small hidden size.
fn pair_case(pair: usize) -> Case {
    use Precision::*;
    Case {
        name: "pair",
        hidden: SMALL_HIDDEN,
        num_tokens: 1 + pair * 13 % MAX_TOKENS,
        precision: [Bf16, Fp8, Fp8RoundScale, Fp8Ue8m0][pair % 4],
        routing: if pair % 7 == 3 {
            Routing::LastRankSilent
        } else {
            Routing::Random
        },
        split: pair % 3 == 1,
        zero_copy: pair % 5 == 2,
    }
}

fn bad_expert_id(layout: &LlLayout) -> i64 {
    layout.num_experts as i64 + 3
}

// ---- the data -----------------------------------------------------------------------------

/// One rank's tokens and routing, reproducible by every rank from (seed, rank).
struct Tokens {
    x: Vec<bf16>,           // [num_tokens, hidden]
    topk_idx: Vec<i64>,     // [num_tokens, NUM_TOPK], global expert ids or -1
    topk_weights: Vec<f32>, // [num_tokens, NUM_TOPK]
    num_tokens: usize,
    hidden: usize,
}

/// Channel `c` of token `t` on `rank`: a small integer times a power of two, exact in bf16,
/// that changes with the rank, the token, the channel and the call (the seed); the power of
/// two changes per 128-channel group, so every fp8 group has a scale of its own.
fn x_value(seed: u64, rank: usize, t: usize, c: usize) -> f32 {
    let small = ((seed % 61) as usize + rank * 7 + t * 3 + c) % 61;
    let exponent = ((rank + t + c / 128) % 5) as i32 - 2;
    (small as f32 - 30.0) * 2f32.powi(exponent)
}

impl Tokens {
    fn new(case: &Case, seed: u64, rank: usize, layout: &LlLayout) -> Self {
        let hidden = layout.hidden;
        let silent = case.routing == Routing::LastRankSilent && rank == layout.num_ranks - 1;
        let num_tokens = if silent { 0 } else { case.num_tokens };
        let x = (0..num_tokens * hidden)
            .map(|i| bf16::from_f32(x_value(seed, rank, i / hidden, i % hidden)))
            .collect();
        let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64 + 1).wrapping_mul(0x2545_F491));
        let choices = if case.routing == Routing::AllToRankZero {
            EXPERTS_PER_RANK
        } else {
            layout.num_experts
        };
        let mut topk_idx = Vec::with_capacity(num_tokens * NUM_TOPK);
        for _ in 0..num_tokens {
            let mut chosen: Vec<i64> = Vec::with_capacity(NUM_TOPK);
            while chosen.len() < NUM_TOPK {
                let e = rng.random_range(0..choices) as i64;
                if rng.random_ratio(1, 10) {
                    chosen.push(-1);
                } else if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            topk_idx.extend(chosen);
        }
        if case.routing == Routing::BadExpertId && num_tokens > 0 {
            topk_idx[0] = bad_expert_id(layout);
        }
        if case.routing == Routing::ExpertTwice {
            for t in 0..num_tokens {
                topk_idx[t * NUM_TOPK..][..2].fill(0);
            }
        }
        let topk_weights = (0..num_tokens * NUM_TOPK)
            .map(|_| rng.random_range(0.5f32..2.0))
            .collect();
        Self {
            x,
            topk_idx,
            topk_weights,
            num_tokens,
            hidden,
        }
    }

    fn row(&self, t: usize) -> &[bf16] {
        &self.x[t * self.hidden..(t + 1) * self.hidden]
    }

    /// The tokens that chose global expert `g`, ascending, once per choice.
    fn tokens_for(&self, g: usize) -> Vec<usize> {
        (0..self.num_tokens * NUM_TOPK)
            .filter(|&j| self.topk_idx[j] == g as i64)
            .map(|j| j / NUM_TOPK)
            .collect()
    }
}

/// How many of `chosen` an expert keeps from one source: its run holds T slots.
fn kept(chosen: &[usize]) -> usize {
    chosen.len().min(MAX_TOKENS)
}

/// Whether `part` is a sub-multiset of `whole` (both ascending).
fn is_part_of(part: &[usize], whole: &[usize]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|p| rest.any(|w| w == p))
}

/// What each expert "computes": the row it received times a gain of its own, a power of two
/// (exact in bf16), so that a row combined from the wrong expert shows.
fn expert_gain(global_expert: usize) -> f32 {
    [1.0, 2.0, 0.5][global_expert % 3]
}

// ---- device memory ------------------------------------------------------------------------

/// Device memory of one round trip (cudarc frees it when dropped).
struct Gpu<'s>(&'s Arc<CudaStream>);

impl Gpu<'_> {
    fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, AnyError> {
        if host.is_empty() {
            // A rank without tokens still passes (zero-row) views: give them an address.
            return Ok(self.0.alloc_zeros::<T>(1)?);
        }
        Ok(self.0.clone_htod(host)?)
    }

    /// `len` elements of POISON_BYTE: what nothing wrote stays recognisable.
    fn poisoned<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>, AnyError> {
        let len = len.max(1);
        // SAFETY: uninitialised device memory of `len` elements, filled next on this stream.
        let slice = unsafe { self.0.alloc::<T>(len) }?;
        unsafe { poison(self.ptr(&slice), len * size_of::<T>(), self.0) }?;
        Ok(slice)
    }

    fn ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        slice.device_ptr(self.0).0
    }

    fn vector<T>(&self, slice: &CudaSlice<T>, elem: ElemType) -> View {
        View::vector(self.ptr(slice), slice.len(), elem)
    }
}

/// A dispatch's outputs on the device, poisoned before the call. The 3-D tensors of DeepEP
/// flattened to 2-D, as bytes where the element type depends on the precision.
struct RecvBuffers {
    /// [L x n x T, hidden] fp8 or bf16.
    x: CudaSlice<u8>,
    /// fp8: f32 [L x hidden/128, n x T]; UE8M0: i32 [L x hidden/512, n x T].
    scales: CudaSlice<u8>,
    /// [L, n x T] i32: each row's token on its source rank.
    src_info: CudaSlice<i32>,
    /// [L, n] i64: (begin << 32) | count of each source rank's rows.
    layout_range: CudaSlice<i64>,
    /// [L] i32: valid rows per local expert.
    count: CudaSlice<i32>,
}

/// The same, copied to the host.
struct Received {
    x: Vec<u8>,
    scales: Vec<u8>,
    src_info: Vec<i32>,
    layout_range: Vec<i64>,
    count: Vec<i32>,
}

/// recv_x_scales' element type and rows per local expert (none for bf16).
fn scale_shape(precision: Precision, hidden: usize) -> Option<(ElemType, usize)> {
    match precision {
        Precision::Bf16 => None,
        Precision::Fp8 | Precision::Fp8RoundScale => Some((ElemType::F32, hidden / 128)),
        Precision::Fp8Ue8m0 => Some((ElemType::I32, hidden / 512)),
    }
}

fn row_bytes(precision: Precision, hidden: usize) -> usize {
    if precision == Precision::Bf16 {
        hidden * 2
    } else {
        hidden
    }
}

/// Where the scale of channel group `group` (128 channels) of packed row `i` of local expert
/// `e` lies in the scales' bytes: column-major (one column per row), f32 or one exponent byte
/// of four in an int32.
fn scale_bytes(
    precision: Precision,
    layout: &LlLayout,
    e: usize,
    group: usize,
    i: usize,
) -> Range<usize> {
    let rows_per_expert = layout.num_ranks * layout.max_tokens;
    let groups = layout.hidden / 128;
    if precision == Precision::Fp8Ue8m0 {
        let at = ((e * (groups / 4) + group / 4) * rows_per_expert + i) * 4 + group % 4;
        at..at + 1
    } else {
        let at = ((e * groups + group) * rows_per_expert + i) * 4;
        at..at + 4
    }
}

impl RecvBuffers {
    fn new(gpu: &Gpu, layout: &LlLayout, precision: Precision) -> Result<Self, AnyError> {
        let (l, rows_per_expert) = (
            layout.num_local_experts(),
            layout.num_ranks * layout.max_tokens,
        );
        let scale_len = scale_shape(precision, layout.hidden)
            .map_or(0, |(_, per_expert)| l * per_expert * rows_per_expert * 4);
        Ok(Self {
            x: gpu.poisoned(l * rows_per_expert * row_bytes(precision, layout.hidden))?,
            scales: gpu.poisoned(scale_len)?,
            src_info: gpu.poisoned(l * rows_per_expert)?,
            layout_range: gpu.poisoned(l * layout.num_ranks)?,
            count: gpu.poisoned(l)?,
        })
    }

    fn views(&self, gpu: &Gpu, layout: &LlLayout, precision: Precision) -> LlDispatchOutputs {
        let (l, n) = (layout.num_local_experts(), layout.num_ranks);
        let rows_per_expert = n * layout.max_tokens;
        let recv_elem = if precision == Precision::Bf16 {
            ElemType::Bf16
        } else {
            ElemType::Fp8E4m3
        };
        LlDispatchOutputs {
            recv_x: View::matrix(
                gpu.ptr(&self.x),
                l * rows_per_expert,
                layout.hidden,
                recv_elem,
            ),
            recv_x_scales: scale_shape(precision, layout.hidden).map(|(elem, per_expert)| {
                View::matrix(gpu.ptr(&self.scales), l * per_expert, rows_per_expert, elem)
            }),
            recv_src_info: View::matrix(gpu.ptr(&self.src_info), l, rows_per_expert, ElemType::I32),
            recv_layout_range: View::matrix(gpu.ptr(&self.layout_range), l, n, ElemType::I64),
            recv_count: View::vector(gpu.ptr(&self.count), l, ElemType::I32),
        }
    }

    fn to_host(&self, stream: &Arc<CudaStream>) -> Result<Received, AnyError> {
        Ok(Received {
            x: stream.clone_dtoh(&self.x)?,
            scales: stream.clone_dtoh(&self.scales)?,
            src_info: stream.clone_dtoh(&self.src_info)?,
            layout_range: stream.clone_dtoh(&self.layout_range)?,
            count: stream.clone_dtoh(&self.count)?,
        })
    }
}

// ---- one round trip -----------------------------------------------------------------------

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

/// The checks of one round trip, each named after its case, and how much it moved.
struct Checks {
    me: usize,
    case: Case,
    layout: LlLayout,
    tally: Tally,
    num_tokens_sent: usize,
    num_rows_received: usize,
}

impl Checks {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        let name = self.case.name;
        self.tally
            .check(self.me, ok, || format!("{name}: {}", what()));
    }

    fn report(&self, into: &mut Tally) {
        println!(
            "pe {}: {}: {} tokens sent, {} rows received; {} checks passed, {} failed",
            self.me,
            self.case.name,
            self.num_tokens_sent,
            self.num_rows_received,
            self.tally.passed,
            self.tally.failed
        );
        into.passed += self.tally.passed;
        into.failed += self.tally.failed;
    }
}

/// Dispatch then combine for `case`; every output checked against the host reference.
fn round_trip(buffer: &NvshmemBuffer<&World>, case: &Case, seed: u64) -> Result<Checks, AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let cs = stream.cu_stream();
    let gpu = Gpu(stream);
    let layout = LlLayout {
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
        unsafe { buffer.low_latency_dispatch(&inputs, &outputs, &options, phases, cs) }
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
            buffer.next_low_latency_combine_buffer(MAX_TOKENS, hidden, layout.num_experts)?;
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
        unsafe { buffer.low_latency_combine(&combine_inputs, &handle, &out, phases, cs) }
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

impl Checks {
    /// Bad input only the GPU can see is recorded by the kernel and raised by the next
    /// `check()` (or the next call), once: an expert id past the last (both calls see it), an
    /// expert named twice (the dispatch's slots overflow). Only those cases plant any.
    fn input_record(
        &mut self,
        buffer: &NvshmemBuffer<&World>,
        call: &str,
    ) -> Result<(), BufferError> {
        let expected = match (self.case.routing, call) {
            (Routing::BadExpertId, _) => {
                format!("topk_idx[0] holds expert {}", bad_expert_id(&self.layout))
            }
            (Routing::ExpertTwice, "dispatch") => "must not name one expert twice".into(),
            _ => return buffer.check(),
        };
        let what = format!("{}: {call}", self.case.name);
        self.tally
            .expect_error(self.me, &what, buffer.check(), &expected);
        self.check(buffer.check().is_ok(), || {
            format!("{call}: the bad input was raised twice")
        });
        Ok(())
    }

    /// Each source's wait, in cycles, was added to the 1 it started from.
    fn cost_grew(&mut self, call: &str, cost: &[i64]) {
        self.check(cost.iter().all(|&c| c > 1), || {
            format!("{call} wait cost per source {cost:?}")
        });
    }

    // ANCHOR: check_dispatch
    /// Every local expert's outputs: its count, its per-source ranges in source order, each
    /// valid row (which token, from whom, its data and scales), and poison past them.
    fn dispatch(&mut self, all: &[Tokens], got: &Received) {
        let (n, l) = (self.layout.num_ranks, self.layout.num_local_experts());
        let rows_per_expert = n * self.layout.max_tokens;
        let (mut counts, mut ranges, mut rows, mut scales, mut poison) = (0, 0, 0, 0, 0);
        for e in 0..l {
            let want: Vec<Vec<usize>> = all.iter().map(|s| s.tokens_for(self.me * l + e)).collect();
            let total: usize = want.iter().map(|tokens| kept(tokens)).sum();
            counts += usize::from(got.count[e] != total as i32);
            let mut begin = 0;
            for (s, tokens) in want.iter().enumerate() {
                let range = ((begin as i64) << 32) | kept(tokens) as i64;
                ranges += usize::from(got.layout_range[e * n + s] != range);
                // Source s's rows: its tokens, each as often as it chose e, in any order (and
                // with more than T, any T of them).
                let mut seen = Vec::with_capacity(kept(tokens));
                for i in begin..begin + kept(tokens) {
                    let t = got.src_info[e * rows_per_expert + i];
                    if t < 0 || t as usize >= all[s].num_tokens {
                        rows += 1;
                        continue;
                    }
                    seen.push(t as usize);
                    let (row_ok, scales_ok) = self.row(got, e, i, all[s].row(t as usize));
                    rows += usize::from(!row_ok);
                    scales += usize::from(!scales_ok);
                }
                seen.sort_unstable();
                rows += usize::from(!is_part_of(&seen, tokens));
                begin += kept(tokens);
            }
            poison += self.count_unwritten_wrong(got, e, total);
        }
        self.check(counts == 0, || {
            format!("recv_count: {counts} experts wrong")
        });
        self.check(ranges == 0, || {
            format!("recv_layout_range: {ranges} (expert, source) ranges wrong")
        });
        self.check(rows == 0, || {
            format!("{rows} received rows wrong (source token or data)")
        });
        if self.case.precision != Precision::Bf16 {
            self.check(scales == 0, || {
                format!("{scales} rows with a wrong fp8 scale")
            });
        }
        self.check(poison == 0, || {
            format!("{poison} bytes past the valid rows were written")
        });
    }
    // ANCHOR_END: check_dispatch

    /// Whether packed row `i` of local expert `e` holds `want` (bf16: bit for bit; fp8:
    /// within e4m3 rounding, with the scale it came with), and whether its scales follow
    /// DeepEP's recipe exactly.
    fn row(&self, got: &Received, e: usize, i: usize, want: &[bf16]) -> (bool, bool) {
        let (precision, layout) = (self.case.precision, &self.layout);
        let row_len = row_bytes(precision, layout.hidden);
        let row = &got.x[(e * layout.num_ranks * layout.max_tokens + i) * row_len..][..row_len];
        if precision == Precision::Bf16 {
            let ok = row
                .chunks_exact(2)
                .zip(want)
                .all(|(b, w)| u16::from_le_bytes([b[0], b[1]]) == w.to_bits());
            return (ok, true);
        }
        let (mut row_ok, mut scales_ok) = (true, true);
        let groups = row.chunks_exact(128).zip(want.chunks_exact(128));
        for (group, (bytes, values)) in groups.enumerate() {
            let at = scale_bytes(precision, layout, e, group, i);
            let scale = match precision {
                Precision::Fp8Ue8m0 => f32::from_bits(u32::from(got.scales[at.start]) << 23),
                _ => f32::from_le_bytes(got.scales[at].try_into().expect("4 bytes")),
            };
            let round_scale = precision != Precision::Fp8;
            scales_ok &= scale.to_bits() == expected_scale(values, round_scale).to_bits();
            for (&b, w) in bytes.iter().zip(values) {
                let (have, want) = (e4m3_to_f32(b) * scale, w.to_f32());
                // Half a unit in the last place of e4m3 (3 mantissa bits) is at most 1/16 of
                // the value; below the normal range, half the step 2^-9, times the scale.
                let close = (have - want).abs() <= want.abs() / 16.0 * 1.0001 + scale / 1024.0;
                row_ok &= close;
            }
        }
        (row_ok, scales_ok)
    }

    /// Bytes past expert `e`'s first `valid` rows that are no longer poison: every output was
    /// filled with POISON_BYTE before the call, and only valid rows may be written.
    fn count_unwritten_wrong(&self, got: &Received, e: usize, valid: usize) -> usize {
        let (precision, layout) = (self.case.precision, &self.layout);
        let rows_per_expert = layout.num_ranks * layout.max_tokens;
        let row_len = row_bytes(precision, layout.hidden);
        let unwritten = valid.min(rows_per_expert)..rows_per_expert;
        let src_info = &got.src_info[e * rows_per_expert..][unwritten.clone()];
        let mut wrong = src_info.iter().filter(|&&t| t != -1).count();
        let x = &got.x[(e * rows_per_expert + unwritten.start) * row_len..]
            [..unwritten.len() * row_len];
        wrong += x.iter().filter(|&&b| b != POISON_BYTE).count();
        if precision != Precision::Bf16 {
            for group in 0..layout.hidden / 128 {
                for i in unwritten.clone() {
                    let at = scale_bytes(precision, layout, e, group, i);
                    wrong += got.scales[at].iter().filter(|&&b| b != POISON_BYTE).count();
                }
            }
        }
        wrong
    }

    // ANCHOR: check_combine
    /// Token t's result: the sum over its valid top-k choices of weight x (its row times the
    /// expert's gain), in fp32, rounded to bf16 once. A token that chose no expert gets zeros.
    fn combine(&mut self, mine: &Tokens, got: &[bf16]) {
        if self.case.routing == Routing::ExpertTwice {
            // A token whose copies were all dropped has no row coming back (its result is
            // undefined), and only the expert's rank knows which tokens those are.
            return;
        }
        let hidden = self.layout.hidden;
        let experts = 0..self.layout.num_experts as i64;
        let mut wrong = 0;
        for t in 0..mine.num_tokens {
            let choices: Vec<(f32, f32)> = (t * NUM_TOPK..(t + 1) * NUM_TOPK)
                .filter(|&j| experts.contains(&mine.topk_idx[j]))
                .map(|j| (mine.topk_weights[j], expert_gain(mine.topk_idx[j] as usize)))
                .collect();
            for (have, x) in got[t * hidden..(t + 1) * hidden].iter().zip(mine.row(t)) {
                let x = x.to_f32();
                let want = choices
                    .iter()
                    .fold(0.0f32, |acc, &(weight, gain)| acc + weight * (x * gain));
                let close = (have.to_f32() - want).abs() <= want.abs() * BF16_ROUNDING;
                wrong += usize::from(!close);
            }
        }
        let total = mine.num_tokens * hidden;
        self.check(wrong == 0, || {
            format!("combine: {wrong} of {total} values off by more than bf16 rounding")
        });
    }
    // ANCHOR_END: check_combine
}

// ANCHOR: fp8_reference
/// DeepEP's recipe for one group of 128 channels: amax = max(|x|, 1e-4), and the receiver's
/// multiplier amax / 448 (448 is e4m3's largest value), rounded up to a power of two with
/// round_scale (so the scale is exact in UE8M0, a bare exponent).
fn expected_scale(group: &[bf16], round_scale: bool) -> f32 {
    let amax = group.iter().fold(1e-4f32, |m, v| m.max(v.to_f32().abs()));
    let scale = amax * (1.0f32 / 448.0); // DeepEP's arithmetic: amax x f32(1/448)
    if !round_scale {
        return scale;
    }
    let bits = scale.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127 + i32::from(bits & 0x7f_ffff != 0);
    f32::from_bits(((127 + exponent) as u32) << 23)
}

/// An fp8 e4m3 (`float8_e4m3fn`) byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
/// infinities, 0x7f/0xff are NaN.
fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (i32::from((byte >> 3) & 0xf), f32::from(byte & 7));
    let magnitude = match exponent {
        15 if mantissa == 7.0 => f32::NAN,
        0 => mantissa / 8.0 * 2f32.powi(-6),
        _ => (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7),
    };
    sign * magnitude
}
// ANCHOR_END: fp8_reference

/// The experts' results for combine: packed row i of local expert e (global g) holds the
/// token the handle names, times expert_gain(g). Rows the handle does not name stay NaN, so a
/// combine that reads one shows it.
fn expert_results(layout: &LlLayout, me: usize, all: &[Tokens], got: &Received) -> Vec<bf16> {
    let (n, l, hidden) = (layout.num_ranks, layout.num_local_experts(), layout.hidden);
    let rows_per_expert = n * layout.max_tokens;
    let mut results = vec![bf16::NAN; l * rows_per_expert * hidden];
    for e in 0..l {
        let gain = expert_gain(me * l + e);
        for (s, tokens) in all.iter().enumerate() {
            let range = got.layout_range[e * n + s];
            let (begin, count) = ((range >> 32) as usize, (range & 0xffff_ffff) as usize);
            for i in begin..(begin + count).min(rows_per_expert) {
                let t = got.src_info[e * rows_per_expert + i];
                if t < 0 || t as usize >= tokens.num_tokens {
                    continue; // the dispatch check has counted it
                }
                let row = &mut results[(e * rows_per_expert + i) * hidden..][..hidden];
                for (r, x) in row.iter_mut().zip(tokens.row(t as usize)) {
                    *r = bf16::from_f32(x.to_f32() * gain);
                }
            }
        }
    }
    results
}

// ---- mistakes -----------------------------------------------------------------------------

// ANCHOR: mistakes
/// Each is refused on the host before anything is launched, with a message that names the
/// problem. Every rank makes the same mistakes, so no rank waits for another.
fn check_mistakes(buffer: &NvshmemBuffer<&World>, tally: &mut Tally) -> Result<(), AnyError> {
    let world = buffer.world();
    let (me, n) = (world.my_pe(), world.n_pes());
    let stream = world.stream();
    let cs = stream.cu_stream();
    let gpu = Gpu(stream);
    // The shape of the calls before and after: the one real call below keeps it.
    let (t, hidden) = (MAX_TOKENS, SMALL_HIDDEN);
    let layout = LlLayout {
        max_tokens: t,
        hidden,
        num_ranks: n,
        num_experts: EXPERTS_PER_RANK * n,
    };
    let l = layout.num_local_experts();
    let too_many = t + 1;
    // Memory enough for every view below (poison: topk_idx all -1, no expert).
    let x = gpu.poisoned::<bf16>(too_many * hidden)?;
    let topk_idx = gpu.poisoned::<i64>(too_many * NUM_TOPK)?;
    let topk_weights = gpu.poisoned::<f32>(too_many * NUM_TOPK)?;
    let out = gpu.poisoned::<bf16>(too_many * hidden)?;
    let recv = RecvBuffers::new(&gpu, &layout, Precision::Bf16)?;
    let outputs = recv.views(&gpu, &layout, Precision::Bf16);
    let options = LlDispatchOptions {
        num_max_dispatch_tokens_per_rank: t,
        num_experts: layout.num_experts,
        use_fp8: false,
        round_scale: false,
        use_ue8m0: false,
    };
    let inputs = |num_tokens: usize, hidden: usize| LlDispatchInputs {
        x: View::matrix(gpu.ptr(&x), num_tokens, hidden, ElemType::Bf16),
        topk_idx: View::matrix(gpu.ptr(&topk_idx), num_tokens, NUM_TOPK, ElemType::I64),
        cumulative_local_expert_recv_stats: None,
        dispatch_wait_recv_cost_stats: None,
    };
    // SAFETY (both): every view describes memory allocated above.
    let dispatch = |inputs: LlDispatchInputs, options: LlDispatchOptions, phases| unsafe {
        buffer.low_latency_dispatch(&inputs, &outputs, &options, phases, cs)
    };
    let combine = |num_tokens: usize, handle: &LlHandle, phases| unsafe {
        let inputs = LlCombineInputs {
            x: None,
            topk_idx: View::matrix(gpu.ptr(&topk_idx), num_tokens, NUM_TOPK, ElemType::I64),
            topk_weights: View::matrix(gpu.ptr(&topk_weights), num_tokens, NUM_TOPK, ElemType::F32),
            combine_wait_recv_cost_stats: None,
        };
        let out = View::matrix(gpu.ptr(&out), num_tokens, hidden, ElemType::Bf16);
        buffer.low_latency_combine(&inputs, handle, &out, phases, cs)
    };
    let handle = LlHandle {
        src_info: outputs.recv_src_info,
        layout_range: outputs.recv_layout_range,
        num_max_dispatch_tokens_per_rank: t,
        hidden,
        num_experts: layout.num_experts,
    };
    let one_launch = Phases::SendAndReceive;

    let mut refused = Vec::new();
    let mut expect = |what: &str, result: Result<(), BufferError>, key: &str| {
        refused.push(tally.expect_error(me, what, result, key));
    };
    expect(
        "more tokens than T",
        dispatch(inputs(too_many, hidden), options, one_launch),
        "more than num_max_dispatch_tokens_per_rank",
    );
    expect(
        "hidden not a multiple of 128",
        dispatch(inputs(4, hidden - 48), options, one_launch),
        "multiple of 128",
    );
    let larger_t = LlDispatchOptions {
        num_max_dispatch_tokens_per_rank: 64 * t,
        ..options
    };
    expect(
        "a T the buffer was not sized for",
        dispatch(inputs(t, hidden), larger_t, one_launch),
        "num_rdma_bytes",
    );
    let ue8m0_unrounded = LlDispatchOptions {
        use_fp8: true,
        round_scale: false,
        use_ue8m0: true,
        ..options
    };
    expect(
        "use_ue8m0 without round_scale",
        dispatch(inputs(t, hidden), ue8m0_unrounded, one_launch),
        "use_ue8m0 needs",
    );
    expect(
        "combine: more tokens than the handle's T",
        combine(too_many, &handle, one_launch),
        "more than the handle's",
    );
    let half_t = LlHandle {
        src_info: View::matrix(handle.src_info.ptr, l, n * t / 2, ElemType::I32),
        ..handle
    };
    expect(
        "combine: a handle of another shape",
        combine(t, &half_t, one_launch),
        "does not match",
    );
    expect(
        "a receive hook with no send before it",
        dispatch(inputs(0, hidden), options, Phases::Receive),
        "no send phase is waiting",
    );
    // One call in flight: after a send, nothing but its receive. (A real call, of no tokens.)
    dispatch(inputs(0, hidden), options, Phases::Send)?;
    expect(
        "a dispatch while a receive hook is pending",
        dispatch(inputs(0, hidden), options, one_launch),
        "has not been called: call it first",
    );
    expect(
        "a combine while a receive hook is pending",
        combine(0, &handle, Phases::Send),
        "has not been called: call it first",
    );
    dispatch(inputs(0, hidden), options, Phases::Receive)?;
    stream.synchronize()?;
    buffer.check()?;
    for message in refused {
        println!("pe {me}: refused: {message}");
    }
    Ok(())
}
// ANCHOR_END: mistakes
