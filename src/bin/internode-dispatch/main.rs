//! Issue 32, steps 4-8's GPU test: the two-level dispatch and combine across nodes
//! (`internode_dispatch`, `internode_combine`) against a pure reference, on virtual nodes of G
//! ranks:
//!
//! ```text
//! NVSHMEM_TUTORIAL_NODE_PES=G torchrun --standalone --nproc_per_node=N --no-python \
//!     target/release/internode-dispatch [--pairs CALLS] [--timeout-ms MS]
//! ```
//!
//! Each pair (`--pairs`, default 1,000) draws fresh routing for every rank (internode-notify's
//! cases: a rank with no tokens, nodes that get nothing, channels and experts changing), runs
//! the full notify, then the dispatch of rows that say where they came from (source rank,
//! token), without top-k on even calls and with it on odd ones, hidden 128 / 512 / 2048, bf16
//! or (pairs 2-3 of every 4) fp8 bytes with f32 scales, row or column major (`fp8_of`), the
//! scales checked exactly,
//! and compares every output with the reference (`reference.rs`), computed from the global
//! routing alone: the rows each rank receives in DeepEP's order (by source rank, then token:
//! the order check, also against handle position 6), their source meta (handle 7), local top-k
//! ids and weights, `send_rdma_head` (handle 8) exactly, and `send_nvl_head` (handle 9) as -1
//! exactly where a rank of the node is not a destination and a permutation of each NVL
//! stream's indices elsewhere (the forwarder meets chunks of different nodes in any order).
//! Pairs 5 of every 6 size the dispatch's outputs by num_worst_tokens (the sum of every rank's
//! tokens; the notify without its host wait), the rows past those received checked -1 in
//! recv_topk_idx, the combine reading that handle.
//! On pairs 0 of every 4 a cached dispatch follows with that handle (`cached_of`: bf16, or
//! fp8 with column-major scales), its rows checked and handle positions 7-9 unchanged.
//! Then the combine with that handle (its cached notify first), with its own RDMA chunk, the
//! biases changing (none, bias0, bias1, both) and top-k weights when the dispatch had them:
//! every rank sends back, for each row it received, values that differ by rank, and
//! combined_x must equal the kernel's order bit for bit (each node's rows in member order from
//! 0 in fp32, rounded to bf16; then bias0 + bias1 + the node sums in node order, rounded once)
//! and lie within 2^-7 of the exact flat sum's magnitude (`reference::TOLERANCE`: two bf16
//! roundings on a path across nodes); the weights exactly. The buffer's failure record is read
//! after every call: a route through a peer pointer to another node (CROSS_NODE_POINTER) or a
//! timeout fails the check. After the loop, the combine's refusals and one more pair, a
//! dispatch with num_worst_tokens below what some ranks receive or forward (RECV_OVERFLOW on
//! exactly those), and one pair captured in a CUDA graph and replayed twice. On one
//! node it checks that the buffer is refused. Ends `N passed, M failed`.

use std::process::ExitCode;

use ch01_bootstrap::checks::Tally;
use nvshmem_tutorial::{BufferError, Config, NvshmemBuffer};

mod arrays;
mod cached;
mod combine;
mod dispatch;
mod graph;
mod reference;

#[path = "../shared/heap.rs"]
mod heap;
#[allow(dead_code)] // the notify's program reads positions 1-6 back; this one reads none
#[path = "../shared/internode.rs"]
mod internode_case;
#[allow(dead_code)] // routing's weights are for the dispatch programs
#[path = "../shared/mod.rs"]
mod shared;

use internode_case::{Case, Program};
use shared::AnyError;

const NUM_CALLS: usize = 1000;
/// bf16 columns of a row, by call.
pub(crate) const HIDDEN: [usize; 3] = [128, 512, 2048];
/// num_max_rdma_chunked_send_tokens, by call (5 calls each, across the channel counts).
const RDMA_CHUNKS: [u32; 4] = [6, 4, 8, 5];

fn main() -> ExitCode {
    internode_case::main("internode-dispatch", region_bytes, checks)
}

/// Whether pair i's dispatch sends fp8 rows with scales (pairs 2 and 3 of every 4, so with and
/// without top-k), and then how the scales lie: row major on pairs 2-3 of every 8, column major
/// (DeepEP's test's layout) on 6-7. The combine stays bf16 (as DeepEP's).
pub(crate) fn fp8_of(i: usize) -> Option<bool> {
    (i % 4 >= 2).then_some(i % 8 >= 4)
}

/// Whether pair i runs a cached dispatch between its dispatch and combine (pairs 0 of every 4:
/// bf16 without top-k), and its rows: bf16 on pairs 0 of every 8, fp8 with column-major scales
/// on pairs 4 of every 8 (the handle does not depend on the rows' format).
pub(crate) fn cached_of(i: usize) -> Option<Option<bool>> {
    i.is_multiple_of(4).then_some((i % 8 == 4).then_some(true))
}

/// Call i's dispatch config: the RDMA chunk changes between calls (as DeepEP's tuning loop
/// changes it over one buffer), so a call starts its chunks on its own grid, the forwarder
/// returning the skipped positions to the head. Rings of 128 rounded up to the chunk (at most
/// the hint's 132).
pub(crate) fn dispatch_config(num_sms: u32, i: usize) -> Result<Config, BufferError> {
    Config::new(
        num_sms,
        8,
        256,
        RDMA_CHUNKS[(i / 5) % RDMA_CHUNKS.len()],
        128,
    )
}

/// Call i's combine config: the same channels, another RDMA chunk than its dispatch's (two
/// steps on in RDMA_CHUNKS), as DeepEP's separate dispatch and combine configs.
pub(crate) fn combine_config(num_sms: u32, i: usize) -> Result<Config, BufferError> {
    Config::new(
        num_sms,
        8,
        256,
        RDMA_CHUNKS[(i / 5 + 2) % RDMA_CHUNKS.len()],
        128,
    )
}

/// (num_nvl_bytes, num_rdma_bytes) for every case on `n` ranks in any node size: the hints of
/// the cases' rings at their most channels (64) and the widest row.
fn region_bytes(n: usize) -> (usize, usize) {
    let config = Config::new(128, 8, 256, 6, 128).expect("a valid config");
    (1..=8.min(n))
        .filter(|&g| n.is_multiple_of(g) && g < n)
        .filter_map(|g| {
            config
                .get_buffer_size_hints_for_nodes(2 * HIDDEN[2], n, g)
                .ok()
        })
        .fold((1 << 20, 1 << 20), |(a, b), (nvl, rdma)| {
            (a.max(nvl), b.max(rdma))
        })
}

/// The pairs, then the combine's refusals with a live handle and one more pair (the buffer
/// still works).
fn checks(program: &Program, tally: &mut Tally) -> Result<(), AnyError> {
    let max_num_sms = program.buffer.internode_max_num_sms()?;
    program.announce(
        "each token once per node by put-with-signal to the rail peer, forwarded inside the node \
         through peer pointers; combined back the same way, summed per node first",
    );
    let (buffer, g) = (&program.buffer, program.node_pes);
    let (me, n, seed) = (program.me, program.n, program.seed);
    let num_calls = program.calls.unwrap_or(NUM_CALLS);
    let case_of = |i: usize| -> Result<Case, BufferError> {
        let mut case = Case::new(
            seed ^ (i as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            n,
            g,
            i,
        );
        // Every block must be resident: a PE with a share of a GPU gets fewer.
        case.config = dispatch_config(case.config.num_sms.min(max_num_sms), i)?;
        case.job.num_channels = case.config.num_channels();
        Ok(case)
    };
    let mut pairs = Tally::default();
    for i in 0..num_calls {
        pair(buffer, &case_of(i)?, i, &mut pairs)?;
    }
    println!(
        "pe {me}: {num_calls} dispatch and combine pairs: {} checks passed, {} failed",
        pairs.passed, pairs.failed
    );
    tally.passed += pairs.passed;
    tally.failed += pairs.failed;
    let case = case_of(1)?;
    let call = dispatch::Call {
        hidden: HIDDEN[0],
        with_topk: true,
        fp8: None,
        worst: None,
    };
    let (dispatched, _) = dispatch::dispatch_and_check(buffer, &case, call, tally)?;
    let config = combine_config(case.config.num_sms, 1)?;
    combine::check_refusals(buffer, &case, &dispatched, &config, HIDDEN[0], tally)?;
    drop(dispatched);
    let ok = pair(buffer, &case_of(num_calls + 1)?, num_calls + 1, tally)?;
    tally.check(me, ok, || {
        "the pair after the refused combines differed".into()
    });
    // num_worst_tokens below what some ranks receive or forward, then a pair in a CUDA graph.
    graph::overflow(buffer, &case_of(num_calls + 2)?, tally)?;
    let case = case_of(num_calls + 3)?;
    let config = combine_config(case.config.num_sms, num_calls + 3)?;
    graph::capture_and_replay(buffer, &case, &config, tally)
}

/// Pair i: the notify and dispatch of `case`, then its combine, every output checked. Whether
/// all held.
fn pair(
    buffer: &NvshmemBuffer<&ch01_bootstrap::World>,
    case: &Case,
    i: usize,
    tally: &mut Tally,
) -> Result<bool, AnyError> {
    let (hidden, with_topk, fp8) = (HIDDEN[i % HIDDEN.len()], i % 2 == 1, fp8_of(i));
    let worst = (i % 6 == 5).then(|| graph::total_tokens(case));
    let call = dispatch::Call {
        hidden,
        with_topk,
        fp8,
        worst,
    };
    let (dispatched, dispatch_ok) = dispatch::dispatch_and_check(buffer, case, call, tally)?;
    let config = combine_config(case.config.num_sms, i)?;
    // Pairs 0 of every 4 (bf16 without top-k, as DeepEP's test's cached calls): a cached
    // dispatch with the handle, under the combine's config (another RDMA chunk), bf16 or fp8.
    let cached_ok = match cached_of(i) {
        Some(fp8) => {
            cached::cached_and_check(buffer, case, &dispatched, &config, (hidden, fp8), tally)?
        }
        None => true,
    };
    let biases = [i % 4 == 1 || i % 4 == 3, i % 4 >= 2];
    let combine_ok =
        combine::combine_and_check(buffer, case, &dispatched, &config, (hidden, biases), tally)?;
    let dispatch_ok = dispatch_ok && cached_ok;
    if !(dispatch_ok && combine_ok) {
        eprintln!(
            "pe {}: pair {i} ({}): {call:?}, RDMA chunks {} / {}, biases {biases:?}: dispatch \
             (and cached) {dispatch_ok}, combine {combine_ok}",
            buffer.world().my_pe(),
            case.describe(),
            case.config.num_max_rdma_chunked_send_tokens,
            config.num_max_rdma_chunked_send_tokens,
        );
    }
    Ok(dispatch_ok && combine_ok)
}
