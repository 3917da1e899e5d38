//! Tunables and limits of chapter 4, in one place.

/// The limits the kernels share (the host/device contract, `kernels/contract/defs.rs`):
/// `MAX_PES` PEs per communicator (one NVLink domain of a DGX/HGX node), `MAX_BLOCKS` blocks
/// per launch, `STEPS_PER_EPOCH` steps per call, and `COLL_THREADS` threads per block of every
/// collective but the barrier: 512 threads x 132 SMs keep enough 16-byte stores in flight to
/// fill NVLink (chapter 3's benchmark), and the heaviest kernel (two-shot all-reduce, 128
/// registers) still fits one block per SM.
pub use kernels::contract::{COLL_THREADS, MAX_BLOCKS, MAX_PES, STEPS_PER_EPOCH};
/// The barrier is one warp: thread t waits for PE t.
pub const SYNC_THREADS: u32 = 32;

/// Default bound on every in-kernel wait. A peer merely slow to launch must not trip it, a
/// peer that never comes must not hang the job.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Default largest payload one PE sends as LL lines (per peer): the LL scratch holds
/// 2 parities x n_pes senders x 2 x this many bytes per PE (16 MiB at 8 PEs).
pub const DEFAULT_LL_MAX_BYTES: usize = 512 << 10;

/// How one communicator is sized and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectivesConfig {
    /// Largest per-peer payload the LL algorithms accept; sizes the LL scratch.
    pub ll_max_bytes: usize,
    /// Bound on every in-kernel wait, in milliseconds.
    pub timeout_ms: u64,
    /// Bytes to allocate after the communicator's own, in the same symmetric allocation, for
    /// a caller that builds on it (chapter 7's buffer keeps its rings there).
    pub extra_bytes: usize,
}

impl Default for CollectivesConfig {
    fn default() -> Self {
        Self {
            ll_max_bytes: DEFAULT_LL_MAX_BYTES,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            extra_bytes: 0,
        }
    }
}
