//! Mode sharing (issue 32, design step 9; benchmarks/notes/buffer_internode_normal.md 2.9): a
//! buffer made with `low_latency_mode=True` whose ranks span nodes serves normal mode's calls
//! across nodes and the low-latency calls in the same `num_rdma_bytes`, as DeepEP's does
//! (`tests/test_internode.py --test-ll-compatibility` runs the normal checks, then
//! `clean_low_latency_buffer`, then the low-latency test, on one buffer).
//!
//! # Who keeps what in the shared bytes
//!
//! ```text
//! rdma region  [0, CONTROL_BYTES)    low latency's count and barrier words: the only state it
//!                                    keeps from one call to the next. Normal mode never
//!                                    writes them (its rings start after them).
//!              [CONTROL_BYTES, ..)   low latency: halves 0 and 1 and the combine's staging;
//!                                    normal mode: per channel and node a staging and a
//!                                    landing ring. Live only while a call runs, in both modes.
//! notify area  after the rdma region normal mode's signals, tickets, rail rows and ring
//!                                    counters (they only grow): what it keeps between calls.
//!                                    Low latency never writes it.
//! nvl region   num_nvl_bytes         normal mode's NVL rings; low latency never writes it.
//! ```
//!
//! Neither mode's lasting state lies in bytes the other writes (the tests compute both
//! layouts' byte ranges at 4-64 ranks and check it), so no counter or signal can be read
//! stale or overwritten. What the two share is bytes live only during a call, so a switch is
//! safe once no rank still reads or writes the other mode's part of them:
//! - **low latency, then normal**: nothing to call. Every normal call across nodes begins with
//!   `internode_notify` (the full one, or the cached one before a cached dispatch and before
//!   every combine), a barrier over all ranks; each rank enters it after its low-latency calls
//!   in stream order, and a finished receive waited for every put into this rank. A normal call
//!   while a receive hook is pending is refused: the peers' puts into this rank may still land.
//! - **normal, then low latency**: `clean_low_latency_buffer` first, as DeepEP requires. Its
//!   barrier proves that every rank finished its normal call (a rank finishes only after the
//!   puts into it landed and it forwarded them), and low-latency calls have no entry barrier of
//!   their own: without it a rank's first low-latency puts could land in a peer's landing ring
//!   while that peer still forwards from it. A low-latency call after a normal one without the
//!   clean is refused, naming it.
//! - normal then normal, and low latency then low latency: as on a buffer of one mode.
//!
//! The switch is in stream order, on each rank: the clean (or the normal call) must follow the
//! other mode's last call on this rank, which it does when both run on the same stream or the
//! normal call's `previous_event` follows the low-latency calls. The host sees eager calls
//! only: a CUDA graph of low-latency calls replayed after normal calls needs the clean too.
//! What a caller keeps in the region between calls (`get_next_low_latency_combine_buffer`'s
//! rows, `get_local_buffer_tensor` views of it) does not survive a normal call.
//!
//! # Sizes
//! One region serves both, so it needs what each needs: the larger of the two hints
//! (`rdma_size_hint_for_both_modes`). Each call checks its own part and names its hint when
//! `num_rdma_bytes` is too small.

#[cfg(test)]
mod tests;

use crate::config::MAX_NORMAL_RANKS;
use crate::error::BufferError;
use crate::low_latency::phases::PendingReceive;
use crate::spec::BufferSpec;

/// Which mode used the shared rdma region last, as the host saw its calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RdmaUser {
    /// Nobody since the buffer was made or `clean_low_latency_buffer` ran.
    #[default]
    Clean,
    /// A normal call across nodes (its notify).
    Normal,
    /// A low-latency dispatch or combine.
    LowLatency,
}

/// Whether `spec`'s buffer serves both modes in one rdma region: a low-latency buffer whose
/// ranks span nodes, up to MAX_NORMAL_RANKS (it has the internode notify's area).
pub fn shares_rdma(spec: &BufferSpec) -> bool {
    spec.options.low_latency_mode && spec.notify_area().is_some()
}

/// `num_rdma_bytes` for a buffer of both modes: the larger of normal mode's hint
/// (`Config::get_buffer_size_hints_for_nodes(..).1`) and low latency's
/// (`get_low_latency_rdma_size_hint`), as both lay out their parts from the region's start.
pub fn rdma_size_hint_for_both_modes(
    normal_rdma_bytes: usize,
    low_latency_rdma_bytes: usize,
) -> usize {
    normal_rdma_bytes
        .max(low_latency_rdma_bytes)
        .next_multiple_of(128)
}

/// `Err` (for `what`, a normal call across nodes) unless it may run while `pending` waits for
/// its receive (nothing may, on a buffer that shares its rdma region); `Ok` holds the region's
/// user after it.
pub fn before_normal(
    what: &'static str,
    spec: &BufferSpec,
    pending: Option<PendingReceive>,
) -> Result<RdmaUser, BufferError> {
    match pending {
        Some(pending) if shares_rdma(spec) => Err(BufferError::invalid(
            what,
            format!(
                "a {} send is waiting for its receive hook, and its peers' rows land in the \
                 num_rdma_bytes that normal calls across nodes share with low-latency mode: call \
                 the hook first",
                pending.op
            ),
        )),
        _ => Ok(RdmaUser::Normal),
    }
}

/// `Err` (for `what`, a low-latency dispatch or combine's send) unless it may run after
/// `last`; `Ok` holds the region's user after it.
pub fn before_low_latency(
    what: &'static str,
    spec: &BufferSpec,
    last: RdmaUser,
) -> Result<RdmaUser, BufferError> {
    if last == RdmaUser::Normal && shares_rdma(spec) {
        return Err(BufferError::invalid(
            what,
            format!(
                "this buffer's last call was a normal dispatch or combine across nodes, whose \
                 rings share num_rdma_bytes with the low-latency region: call \
                 clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts) \
                 on every rank first, as DeepEP requires (its barrier proves that no rank still \
                 reads them; normal calls across nodes on a low-latency buffer run up to \
                 MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS} ranks)"
            ),
        ));
    }
    Ok(RdmaUser::LowLatency)
}

/// The message for a normal call across nodes on a low-latency buffer of more than
/// MAX_NORMAL_RANKS ranks (it has its low-latency calls only), or `None`.
pub fn too_many_ranks_for_normal(spec: &BufferSpec) -> Option<String> {
    (spec.options.low_latency_mode && spec.spans_nodes() && spec.n_pes > MAX_NORMAL_RANKS).then(
        || {
            format!(
                "this low-latency buffer has {} ranks: normal calls across nodes run up to \
                 MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS} ranks (DeepEP's EP16-EP64), so at more a \
                 low-latency buffer serves its low-latency calls only",
                spec.n_pes
            )
        },
    )
}
