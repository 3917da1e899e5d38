//! What can go wrong in the buffer, each with what to do about it.

use ch04_collectives::CollError;
use kernels::contract::Failure;

#[derive(Debug, thiserror::Error)]
pub enum BufferError {
    /// A wrong argument, found before anything was launched.
    #[error("{what}: {message}")]
    Invalid { what: &'static str, message: String },
    #[error(
        "{what} needs num_nvl_bytes >= {needed} ({rings}) but this buffer has {have}. Create \
         the buffer with num_nvl_bytes = Config.get_nvl_buffer_size_hint(hidden_bytes, \
         num_ranks) or more"
    )]
    BufferTooSmall {
        what: &'static str,
        needed: usize,
        have: usize,
        rings: String,
    },
    /// Bad input only the GPU could see (an expert id out of range): the buffer stays usable.
    #[error(
        "topk_idx[{token}] holds expert {value}, outside -1..{num_experts}: every entry must be \
         -1 (no expert) or a global expert id below num_experts"
    )]
    BadExpert {
        token: u64,
        value: i64,
        num_experts: u64,
    },
    /// A low-latency combine's handle that does not belong to its data (found on the GPU).
    #[error(
        "low_latency_combine: packed row {row} of the handle names source token {token}, \
         outside 0..{max_tokens} or outside every source's range: pass the handle of the \
         dispatch whose results x holds"
    )]
    BadHandle {
        row: u64,
        token: i64,
        max_tokens: u64,
    },
    /// More tokens for one expert than its run of T slots holds (found on the GPU).
    #[error(
        "low_latency_dispatch: token {token} was the {max_tokens}+1-th for expert {expert} from \
         this rank: a run holds num_max_dispatch_tokens_per_rank = {max_tokens} slots, so a \
         token's top-k must not name one expert twice (the extra copies were dropped)"
    )]
    SlotsFull {
        token: u64,
        expert: u64,
        max_tokens: u64,
    },
    #[error(
        "rank {me}: {}",
        if *started {
            format!(
                "timed out after {timeout_ms} ms waiting for the notify step's counts (the \
                 peers' rows of tokens per rank and expert): a peer never arrived (dead or \
                 stalled), or the ranks disagree on num_experts or the config"
            )
        } else {
            format!(
                "the notify step's kernels did not start within 10 x {timeout_ms} ms of being \
                 queued: earlier work on the stream never finished"
            )
        }
    )]
    NotifyTimeout {
        me: usize,
        timeout_ms: u64,
        started: bool,
    },
    #[error("{0}")]
    Ring(String),
    #[error("the buffer was destroyed; create a new one")]
    Destroyed,
    #[error(transparent)]
    Coll(#[from] CollError),
}

impl BufferError {
    pub fn invalid(what: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            message: message.into(),
        }
    }

    /// A failed CUDA driver call, named by what it was doing: `.map_err(BufferError::cuda(..))`.
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| CollError::Cuda { what, source }.into()
    }
}

/// Chapter 4's failure record, with the kinds the buffer's kernels add named.
pub(crate) fn describe(error: CollError) -> BufferError {
    let CollError::Device(failure) = &error else {
        return error.into();
    };
    let what = match failure.kind {
        Failure::RingSpace => "a sender waited for ring space that the receiver never freed",
        Failure::RingData => "a receiver waited for tokens that never came",
        Failure::LlDispatch | Failure::LlCombine => {
            // Dispatch waits for a count word, (call << 32) | tokens; combine for a flag that
            // holds the call itself.
            let (op, flag_call) = if failure.kind == Failure::LlDispatch {
                ("dispatch", failure.seen >> 32)
            } else {
                ("combine", failure.seen)
            };
            return BufferError::Ring(format!(
                "rank {}: low-latency {op} (call {} of this buffer, slot half {}), block {}: timed \
                 out after {} ms waiting for rank {}'s tokens for this rank's experts (its flag \
                 holds call {flag_call}). Did every rank make the same low-latency calls with the \
                 same num_max_dispatch_tokens_per_rank, hidden and num_experts, and call every \
                 receive hook? The buffer is unusable from here on: destroy it and create a new \
                 one",
                failure.me,
                failure.call,
                failure.call & 1,
                failure.block,
                failure.timeout_ms,
                failure.pe,
            ));
        }
        _ => return error.into(),
    };
    BufferError::Ring(format!(
        "rank {}: call {}, block {}: timed out after {} ms: {what} (peer rank {}, counter \
         {} expected, {} seen). Did every rank make the same dispatch/combine calls with \
         matching handles? The buffer is unusable from here on: destroy it and create a new one",
        failure.me,
        failure.call,
        failure.block,
        failure.timeout_ms,
        failure.pe,
        failure.expected,
        failure.seen
    ))
}
