//! What the internode protocol models share, the dispatch's (here) and the combine's
//! (`internode_combine_protocol_tests`): random schedules run to their end, one random move at
//! a time with a deadlock when none can move, the call's RDMA chunk and its word, head returns
//! in flight, and the two tests' loops (every protocol passes, every mutation fails).

use std::fmt::Debug;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A protocol model under one schedule: calls one after another, a barrier between two.
pub(crate) trait Schedule {
    /// The call in progress (to move on) and how many calls there are.
    fn calls(&mut self) -> (&mut usize, usize);
    /// Whether every rank finished the call in progress.
    fn call_done(&self) -> bool;
    /// The start of the call in progress, after the barrier before it.
    fn start_call(&mut self);
    /// One random move of the call in progress, Ok(true); Err at a violation or a deadlock.
    fn one_move(&mut self, rng: &mut StdRng) -> Result<bool, String>;

    /// One random move, on to the next call first if this one is done; Ok(false) once every
    /// call is done.
    fn step(&mut self, rng: &mut StdRng) -> Result<bool, String> {
        while self.call_done() {
            let (call, calls) = self.calls();
            *call += 1;
            if *call == calls {
                return Ok(false);
            }
            self.start_call();
        }
        self.one_move(rng)
    }
}

/// Runs `schedules` seeds: each makes a model from its generator (`make`: the routing, then the
/// model), then steps it to the end with the same generator. The first violation, if any.
pub(crate) fn run<M: Schedule>(
    schedules: u64,
    make: impl Fn(&mut StdRng) -> M,
) -> Result<(), String> {
    for seed in 0..schedules {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = make(&mut rng);
        while model
            .step(&mut rng)
            .map_err(|e| format!("seed {seed}: {e}"))?
        {}
    }
    Ok(())
}

/// Every protocol passes on every topology (n ranks in nodes of g) under `run_one`.
pub(crate) fn assert_all_pass<P: Debug + Copy>(
    protocols: &[P],
    topologies: &[(usize, usize)],
    run_one: impl Fn(usize, usize, P) -> Result<(), String>,
) {
    for &protocol in protocols {
        for &(n, g) in topologies {
            run_one(n, g, protocol)
                .unwrap_or_else(|e| panic!("{n} in nodes of {g}, {protocol:?}: {e}"));
        }
    }
}

/// Every mutation (what it changes, the protocol) fails on some topology under `run_one`: the
/// model sees what it checks.
pub(crate) fn assert_each_fails<P: Copy>(
    mutations: &[(&str, P)],
    topologies: &[(usize, usize)],
    run_one: impl Fn(usize, usize, P) -> Result<(), String>,
) {
    for &(what, protocol) in mutations {
        let failed = topologies
            .iter()
            .any(|&(n, g)| run_one(n, g, protocol).is_err());
        assert!(failed, "{what}: no schedule of the model found the hazard");
    }
}

/// Tries `moves` in a random order until one moves (Ok(true)); when none can, a deadlock,
/// which `stuck` describes.
pub(crate) fn one_move<M>(
    mut moves: Vec<M>,
    rng: &mut StdRng,
    mut try_move: impl FnMut(M, &mut StdRng) -> Result<bool, String>,
    stuck: impl FnOnce() -> String,
) -> Result<bool, String> {
    while !moves.is_empty() {
        let chosen = moves.swap_remove(rng.random_range(0..moves.len()));
        if try_move(chosen, rng)? {
            return Ok(true);
        }
    }
    Err(stuck())
}

/// The RDMA chunk of call `call`: `chunk`, or `odd_chunk` on odd calls when the config changes
/// between calls (odd_chunk > 0), as a tuning loop does over one buffer.
pub(crate) fn call_chunk(chunk: usize, odd_chunk: usize, call: usize) -> usize {
    if odd_chunk > 0 && call % 2 == 1 {
        odd_chunk
    } else {
        chunk
    }
}

/// The word of the chunk at position p of a ring of `ring` slots in chunks of `chunk`.
pub(crate) fn word_index(p: u64, chunk: usize, ring: usize) -> usize {
    (p as usize / chunk) % (ring / chunk)
}

/// A head's return in flight to rank `to`, for its ring to node `node`: the positions its
/// reader consumed (ADD), or (mutated) the reader's count (SET).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadOp {
    pub(crate) to: usize,
    pub(crate) node: usize,
    pub(crate) value: u64,
}

impl HeadOp {
    /// Lands on `heads[to][node]` (the writer is a `role`): by ADD, or (`add` false) by SET,
    /// which must never move the head back (a writer that needs the slots it freed would wait
    /// forever).
    pub(crate) fn land(self, heads: &mut [Vec<u64>], add: bool, role: &str) -> Result<(), String> {
        let head = &mut heads[self.to][self.node];
        if add {
            *head += self.value;
        } else if self.value < *head {
            return Err(format!(
                "{role} {}'s head for node {} goes back from {} to {}: slots it had freed look \
                 busy again, and a {role} that needs them waits forever",
                self.to, self.node, *head, self.value
            ));
        } else {
            *head = self.value;
        }
        Ok(())
    }
}
