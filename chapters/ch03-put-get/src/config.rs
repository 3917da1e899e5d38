//! Tunables and limits of chapter 3, in one place.

/// How long any in-kernel wait for another PE may spin before it gives up and reports.
/// Generous: a peer that is merely slow to launch (first-use JIT, a busy host) must not trip
/// it; a peer that never comes must not hang the job.
pub const WAIT_TIMEOUT_MS: u64 = 10_000;

/// Threads per block of the chapter's device variants, launched one block per SM
/// (`LaunchShape::one_per_sm`): a shape that moves a few MiB at close to link speed (the
/// benchmark tunes it).
pub const THREADS_PER_BLOCK: u32 = 256;

/// Largest block CUDA allows.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// Message sizes of the example, in u32 words: a few bytes that only the first thread, warp
/// or block carries, and an odd size no part count divides (~4 MB).
pub const EXAMPLE_SIZES_WORDS: [usize; 2] = [3, 1_000_003];
/// Where in the destination the example writes: not at 0, so an offset that is ignored or
/// applied twice shows up as poison where data should be.
pub const EXAMPLE_DST_OFFSET_WORDS: usize = 7;
