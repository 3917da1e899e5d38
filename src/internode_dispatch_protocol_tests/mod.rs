//! The internode dispatch's RDMA stage (kernels/cuda/buffer/internode_dispatch.cu, NOTES;
//! benchmarks/notes/buffer_internode_normal.md section 7), run as a model: one channel, every
//! rank a sender and a forwarder, over several dispatches with fresh routing, under random
//! interleavings of the senders' windows, the forwarders' chunks, the puts' deliveries and the
//! heads' returns (puts and signal ops land in any order, each put's signal after its own
//! data). Every slot write is checked against the read still owed on it, every forwarder read
//! against the token it expects there. Nothing is reset between calls, as in the kernel; the
//! full notify between two dispatches is a barrier over every rank.
//!
//! Mutations must fail, which shows the model sees what it checks: one tail counted by ADD
//! instead of a word per chunk, heads returned by SET, no wait for space, a ring smaller
//! than a window plus a chunk, and (the chunk changing between calls, as a tuning loop does)
//! no rounding to the call's chunk at its start (a chunk then crosses the ring's end, which
//! the kernel's one contiguous put per chunk cannot).

pub(crate) mod harness;
mod model;

use rand::Rng;
use rand::rngs::StdRng;

use harness::{assert_all_pass, assert_each_fails};
use model::Model;

/// Which protocol the model runs: the kernel's, or one with a part changed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Protocol {
    /// A signal word per ring chunk, set by that chunk's one put (else one tail word that
    /// every put adds its tokens to).
    chunk_words: bool,
    /// Heads go back by ADD (else by SET of the forwarder's count).
    head_add: bool,
    /// The sender waits for the head before it writes a slot.
    space_wait: bool,
    /// Tokens one sender window covers, positions of a chunk, slots of a ring.
    window: usize,
    chunk: usize,
    ring: usize,
    /// The chunk of odd calls, when the config changes between calls (0: it does not).
    odd_chunk: usize,
    /// Both ends round their position up to the call's chunk at its start, the forwarder
    /// returning the skipped positions to the head (else a chunk may start off its grid).
    round_at_start: bool,
}

const KERNEL: Protocol = Protocol {
    chunk_words: true,
    head_add: true,
    space_wait: true,
    window: 4,
    chunk: 2,
    ring: 6, // window + chunk: the plan's floor
    odd_chunk: 0,
    round_at_start: true,
};

/// Random routing: `calls` dispatches of up to 12 tokens per rank, each to a random set of
/// nodes (some to none, some to every node).
fn routing(rng: &mut StdRng, calls: usize, n: usize, nodes: usize) -> Vec<Vec<Vec<u64>>> {
    (0..calls)
        .map(|_| {
            (0..n)
                .map(|_| {
                    let tokens = rng.random_range(0..=12);
                    (0..tokens)
                        .map(|_| rng.random_range(0..1u64 << nodes))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The config's chunk changing between calls (2 on even calls, 4 on odd; the ring a whole
/// number of both and at least a window plus the larger), as a tuning loop like DeepEP's
/// test_internode.py does over one buffer.
const CHANGING: Protocol = Protocol {
    window: 4,
    chunk: 2,
    ring: 8,
    odd_chunk: 4,
    ..KERNEL
};

/// Runs `schedules` random routings and interleavings on n ranks in nodes of g; the first
/// violation, if any.
fn run(n: usize, g: usize, protocol: Protocol, schedules: u64) -> Result<(), String> {
    harness::run(schedules, |rng| {
        Model::new(n, g, routing(rng, 5, n, n / g), protocol)
    })
}

/// Words per ring in the model (the kernel's MAX_RDMA_CHUNKS).
const MAX_CHUNKS: usize = 8;

const TOPOLOGIES: [(usize, usize); 4] = [(4, 2), (4, 1), (6, 3), (6, 2)];

#[test]
fn every_slot_is_read_once_as_written_and_the_rings_drain() {
    let wider = Protocol {
        window: 4,
        chunk: 4,
        ring: 8,
        ..KERNEL
    };
    assert_all_pass(&[KERNEL, wider, CHANGING], &TOPOLOGIES, |n, g, p| {
        run(n, g, p, 300)
    });
}

#[test]
fn the_model_fails_without_each_part_of_the_protocol() {
    let mutations = [
        (
            "one tail by ADD",
            Protocol {
                chunk_words: false,
                ..KERNEL
            },
        ),
        (
            "heads by SET",
            Protocol {
                head_add: false,
                ..KERNEL
            },
        ),
        (
            "no space wait",
            Protocol {
                space_wait: false,
                ..KERNEL
            },
        ),
        (
            "a ring below a window plus a chunk",
            Protocol { ring: 4, ..KERNEL },
        ),
        (
            "the chunk changing, no rounding at a call's start",
            Protocol {
                round_at_start: false,
                ..CHANGING
            },
        ),
    ];
    assert_each_fails(&mutations, &TOPOLOGIES, |n, g, p| run(n, g, p, 300));
}
