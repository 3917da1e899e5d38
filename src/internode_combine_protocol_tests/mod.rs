//! The internode combine's two ring stages (kernels/cuda/buffer/internode_combine.cu, NOTES;
//! benchmarks/notes/buffer_internode_normal.md section 8), run as a model: one channel, every
//! rank an NVL sender, a forwarder and a home receiver, over several combines with fresh
//! routing, under random interleavings of the senders' windows, the forwarders' chunks, the
//! home receivers' rounds, the puts' deliveries and the heads' returns (puts and signal ops land
//! in any order, each put's signal after its own data). Every write into a sub-ring, staging or
//! landing slot is checked against the read still owed on it, every read against the piece or
//! sum it expects there (which member or forwarder, which call, which home rank and token). No
//! position is reset between calls, as in the kernel; the cached notify before each combine is
//! a barrier over every rank. A state where nothing can move before the call is done is a
//! deadlock, and fails.
//!
//! Mutations must fail, which shows the model sees what it checks: one tail counted by ADD
//! instead of a word per chunk, heads returned by SET, NVL senders that do not wait for
//! sub-ring space, a sender window that leaves no room for a forwarder's chunk in the sub-ring,
//! an RDMA ring below a round of tokens plus a chunk, NVL senders that block on one stream at a
//! time (each starting at its own node), and, with the chunk changing between calls, no
//! rounding to the call's chunk at its start.

mod model;

use rand::Rng;
use rand::rngs::StdRng;

use crate::internode_dispatch_protocol_tests::harness::{self, assert_all_pass, assert_each_fails};
use model::Model;

/// Which protocol the model runs: the kernel's, or one with a part changed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Protocol {
    /// A signal word per RDMA ring chunk, set by that chunk's one put (else one tail word that
    /// every put adds its chunk's span to).
    chunk_words: bool,
    /// Heads go back by ADD (else by SET of the home receiver's count).
    head_add: bool,
    /// NVL senders take any stream with space (else one stream at a time, in node order from
    /// their own node, waiting on it).
    nvl_poll: bool,
    /// NVL senders wait for sub-ring space before a window.
    nvl_space_wait: bool,
    /// Tokens of one home receivers' round, positions of an RDMA chunk, slots of an RDMA ring,
    /// of an NVL sub-ring, rows of an NVL sender's window.
    round: usize,
    chunk: usize,
    ring: usize,
    sub_ring: usize,
    window: usize,
    /// The chunk of odd calls, when the config changes between calls (0: it does not).
    odd_chunk: usize,
    /// Both ends round their RDMA position up to the call's chunk at its start, the home
    /// receiver returning the skipped positions to the head.
    round_at_start: bool,
}

/// The kernel's protocol at the plan's floors: R_r = round + c_r, a window of S - c_r.
const KERNEL: Protocol = Protocol {
    chunk_words: true,
    head_add: true,
    nvl_poll: true,
    nvl_space_wait: true,
    round: 4,
    chunk: 2,
    ring: 6,
    sub_ring: 4,
    window: 2,
    odd_chunk: 0,
    round_at_start: true,
};

/// The config's chunk changing between calls (2 on even calls, 4 on odd), as a tuning loop
/// does over one buffer: rings a whole number of both, at least a round plus the larger.
const CHANGING: Protocol = Protocol {
    round: 4,
    chunk: 2,
    ring: 8,
    sub_ring: 6,
    window: 2,
    odd_chunk: 4,
    ..KERNEL
};

/// Random routing: `calls` combines of up to 24 tokens per home rank (enough that a stream
/// outlasts an RDMA ring and a sub-ring, which the blocking senders' deadlock needs), each
/// sent (in the dispatch) to a random set of ranks: some to none, some to every rank.
fn routing(rng: &mut StdRng, calls: usize, n: usize) -> Vec<Vec<Vec<u64>>> {
    (0..calls)
        .map(|_| {
            (0..n)
                .map(|_| {
                    let tokens = rng.random_range(0..=24);
                    (0..tokens)
                        .map(|_| match rng.random_range(0..8) {
                            0 => 0,
                            1 => (1u64 << n) - 1,
                            _ => rng.random_range(0..1u64 << n),
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Runs 300 random routings and interleavings on n ranks in nodes of g; the first violation,
/// if any.
fn run(n: usize, g: usize, protocol: Protocol) -> Result<(), String> {
    harness::run(300, |rng| Model::new(n, g, routing(rng, 5, n), protocol))
}

/// Words per RDMA ring in the model (the kernel's MAX_RDMA_CHUNKS).
const MAX_CHUNKS: usize = 8;

const TOPOLOGIES: [(usize, usize); 5] = [(4, 2), (4, 1), (6, 3), (6, 2), (6, 1)];

#[test]
fn every_slot_is_read_once_as_written_and_every_stage_drains() {
    let wider = Protocol {
        round: 3,
        chunk: 3,
        ring: 6,
        sub_ring: 5,
        window: 2,
        ..KERNEL
    };
    assert_all_pass(&[KERNEL, wider, CHANGING], &TOPOLOGIES, run);
}

#[test]
fn the_model_fails_without_each_part_of_the_protocol() {
    let mutate = |what: &'static str, base: Protocol, change: fn(&mut Protocol)| {
        let mut protocol = base;
        change(&mut protocol);
        (what, protocol)
    };
    #[rustfmt::skip]
    let mutations = [
        mutate("one tail by ADD", KERNEL, |p| p.chunk_words = false),
        mutate("heads by SET", KERNEL, |p| p.head_add = false),
        mutate("no sub-ring space wait", KERNEL, |p| p.nvl_space_wait = false),
        mutate("a window that fills the sub-ring", KERNEL, |p| p.window = p.sub_ring),
        mutate("an RDMA ring below a round plus a chunk", KERNEL, |p| p.ring = p.round),
        mutate("senders blocking on one stream at a time", KERNEL, |p| p.nvl_poll = false),
        mutate("the chunk changing, no rounding at a call's start", CHANGING, |p| p.round_at_start = false),
    ];
    assert_each_fails(&mutations, &TOPOLOGIES, run);
}
