//! What can go wrong in the buffer, each with what to do about it.

use ch04_collectives::{CollError, DeviceFailure};
use kernels::contract::{Failure, MAX_LL_RANKS};

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
    /// A dispatch's handle delivers more rows than its outputs hold: `num_worst_tokens` below
    /// what this rank received (found on the GPU; the call completed without the extra rows).
    #[error(
        "dispatch: this rank received {needed} tokens (across nodes also: forwarded to its \
         node), but num_worst_tokens = {num_worst_tokens} rows were allocated for them: the rows \
         past {num_worst_tokens} (from rank {first_rank}'s tokens on) were dropped, and a \
         combine with this handle leaves them out. Pass num_worst_tokens >= {needed}: at least \
         the most tokens a rank can receive or forward, the sum of every rank's num_tokens \
         (num_tokens x num_ranks when all ranks have as many), or 0 to size the outputs from \
         the notify step"
    )]
    RecvOverflow {
        first_rank: u64,
        needed: u64,
        num_worst_tokens: u64,
    },
    /// The notify step's counts and routing disagree (found on the GPU; the call went by the
    /// routing).
    #[error(
        "dispatch: num_tokens_per_rank[{rank}] = {given}, but is_token_in_rank sends {counted} \
         tokens to rank {rank}: pass the num_tokens_per_rank and is_token_in_rank of one \
         get_dispatch_layout call (this dispatch followed is_token_in_rank)"
    )]
    CountsMismatch { rank: u64, counted: u64, given: i64 },
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

    /// Whether this is a wrong argument (found by a plan, or recorded by a kernel), after which
    /// the buffer stays usable; otherwise a kernel failed, a wait timed out, or the buffer is
    /// gone. The first kind is what Python's `InvalidArgumentError` is for.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::Invalid { .. }
                | Self::BufferTooSmall { .. }
                | Self::BadExpert { .. }
                | Self::BadHandle { .. }
                | Self::SlotsFull { .. }
                | Self::RecvOverflow { .. }
                | Self::CountsMismatch { .. }
        )
    }

    /// A failed CUDA driver call, named by what it was doing: `.map_err(BufferError::cuda(..))`.
    pub fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| CollError::Cuda { what, source }.into()
    }
}

/// The last normal-mode kernel a buffer launched: its operation and channel count, which
/// name a ring failure's block.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LastRingCall {
    pub op: &'static str,
    pub num_channels: usize,
}

/// A rank as a low-latency failure names it, with its node: the kernels record a rank of
/// another node as MAX_LL_RANKS + rank (`failure_rank` in low_latency.cuh), past every member
/// of the node's communicator, which maps the others back to world ranks.
fn ll_rank(pe: u64, node_pes: usize) -> String {
    let rank = pe.checked_sub(MAX_LL_RANKS as u64).unwrap_or(pe);
    format!("rank {rank} (node {})", rank / node_pes.max(1) as u64)
}

/// Chapter 4's failure record, with the kinds the buffer's kernels add named: who waited
/// (rank, peer, channel, side, operation) for what, and the two causes told apart as far as
/// the record can: a peer that never arrived (dead or stalled) or ranks that disagree.
pub(crate) fn describe(error: CollError, last: LastRingCall, node_pes: usize) -> BufferError {
    let CollError::Device(failure) = &error else {
        return error.into();
    };
    let f = failure;
    let ring = |side: &str, what: &str| {
        let channel = match last.num_channels {
            0 => String::new(),
            c => format!(", channel {} ({side})", f.block as usize % c),
        };
        BufferError::Ring(format!(
            "rank {}: {} (call {}, block {}{channel}): timed out after {} ms: {what} (peer rank \
             {}, counter {} expected, {} seen). Rank {} is dead or stalled (a crash, a \
             checkpoint save, a compilation), or the ranks' calls disagree (different handles \
             or configs). The buffer is unusable from here on: destroy it and create a new one",
            f.me, last.op, f.call, f.block, f.timeout_ms, f.pe, f.expected, f.seen, f.pe
        ))
    };
    match f.kind {
        Failure::RingSpace => ring(
            "sender",
            "waited for ring space that the receiver never freed",
        ),
        Failure::RingData => ring("receiver", "waited for tokens that never came"),
        Failure::LlDispatch | Failure::LlCombine | Failure::LlBarrier => ll_timeout(f, node_pes),
        Failure::NotifyRows => BufferError::Ring(format!(
            "rank {}: internode notify (call {} of this buffer), block {}: timed out after {} ms \
             waiting for the rail row of {}, the rank with its local index on that node (its \
             signal reached {} of {}): it never arrived at this call, so it is dead or stalled \
             (a crash, a checkpoint save, a compilation), or it skipped a call. The buffer is \
             unusable from here on: destroy it and create a new one",
            f.me,
            f.call,
            f.block,
            f.timeout_ms,
            ll_rank(f.pe, node_pes),
            f.seen,
            f.expected,
        )),
        Failure::RdmaSpace
        | Failure::RdmaData
        | Failure::CombineRdmaSpace
        | Failure::CombineRdmaData
        | Failure::CombineNvlSpace
        | Failure::CombineNvlData => internode_timeout(f, node_pes),
        Failure::CrossNodePointer => BufferError::Ring(format!(
            "rank {}: a low-latency kernel asked for a peer pointer to {}, which is not on its \
             node of {node_pes} ranks {:?}: a route bug (across nodes only NVSHMEM's RMA calls \
             may reach a rank). The call's data is incomplete: destroy the buffer",
            f.me,
            ll_rank(f.pe, node_pes),
            f.expected..f.expected + f.seen,
        )),
        _ => error.into(),
    }
}

/// A low-latency kernel's timeout: which call, which rank, and whether that rank never came
/// or came with other sizes.
fn ll_timeout(f: &DeviceFailure, node_pes: usize) -> BufferError {
    // Every low-latency word is (call << 32) | rows; the barrier's counts barriers.
    let (op, word_call) = match f.kind {
        Failure::LlDispatch => ("dispatch", f.seen >> 32),
        Failure::LlCombine => ("combine", f.seen >> 32),
        _ => ("barrier (clean_low_latency_buffer)", f.seen),
    };
    let rank = ll_rank(f.pe, node_pes);
    let cause = if word_call < f.call {
        format!(
            "{rank} never arrived at this call: it is dead or stalled (a crash, a \
             checkpoint save, a compilation), or it skipped a call or a receive hook"
        )
    } else {
        "its count word arrived but not its tokens: the ranks disagree on \
         num_max_dispatch_tokens_per_rank, hidden or num_experts"
            .into()
    };
    BufferError::Ring(format!(
        "rank {}: low-latency {op} (call {} of this buffer, slot half {}), block {}: \
         timed out after {} ms waiting for {rank} (its word holds call {word_call}): \
         {cause}. The buffer is unusable from here on: destroy it and create a new one",
        f.me,
        f.call,
        f.call & 1,
        f.block,
        f.timeout_ms,
    ))
}

/// An internode dispatch or combine timeout: the side that waited, for what, on which rank.
fn internode_timeout(f: &DeviceFailure, node_pes: usize) -> BufferError {
    let (op, side, what) = match f.kind {
        Failure::RdmaSpace => (
            "dispatch",
            "sender",
            "waited for space in its ring to the rail peer, whose forwarder never freed it",
        ),
        Failure::RdmaData => (
            "dispatch",
            "forwarder",
            "waited for a chunk the rail peer never sent",
        ),
        Failure::CombineRdmaSpace => (
            "combine",
            "forwarder",
            "waited for space in its ring to the rail peer, whose home receivers never \
             freed it",
        ),
        Failure::CombineRdmaData => (
            "combine",
            "home receiver",
            "waited for a chunk of sums the rail peer's forwarder never sent",
        ),
        Failure::CombineNvlSpace => (
            "combine",
            "NVL sender",
            "waited for sub-ring space the node member's forwarder never freed",
        ),
        _ => (
            "combine",
            "forwarder",
            "waited for rows the node member never sent back",
        ),
    };
    BufferError::Ring(format!(
        "rank {}: internode {op} (call {} of this buffer), block {} (channel {}, \
         {side}): timed out after {} ms: {what}: {} (position {} expected, {} seen). It \
         is dead or stalled (a crash, a checkpoint save, a compilation), or the ranks' \
         calls disagree (handles or configs). The buffer is unusable from here on: \
         destroy it and create a new one",
        f.me,
        f.call,
        f.block,
        f.block / 2,
        f.timeout_ms,
        ll_rank(f.pe, node_pes),
        f.expected,
        f.seen,
    ))
}

impl BufferError {
    /// The input-error record's words [kind, token, value, limit] as the error they report.
    /// Every kind is named; a kind this build does not know is an error naming its number.
    pub(crate) fn from_input_record([kind, token, value, limit]: [u64; 4]) -> BufferError {
        match Failure::from_code(kind) {
            Ok(Failure::BadHandle) => BufferError::BadHandle {
                row: token,
                token: value as i32 as i64,
                max_tokens: limit,
            },
            Ok(Failure::SlotsFull) => BufferError::SlotsFull {
                token,
                expert: value,
                max_tokens: limit,
            },
            Ok(Failure::BadExpert) => BufferError::BadExpert {
                token,
                value: value as i64,
                num_experts: limit,
            },
            Ok(Failure::RecvOverflow) => BufferError::RecvOverflow {
                first_rank: token,
                needed: value,
                num_worst_tokens: limit,
            },
            Ok(Failure::CountsMismatch) => BufferError::CountsMismatch {
                rank: token,
                counted: value,
                given: limit as i64,
            },
            Ok(Failure::NodeCountsMismatch) => BufferError::invalid(
                "internode_notify",
                format!(
                    "num_tokens_per_rdma_rank[{token}] = {}, but is_token_in_rank sends {value} \
                     tokens to node {token} (NODE_COUNTS_MISMATCH): pass the num_tokens_per_rdma_rank \
                     and is_token_in_rank of one get_dispatch_layout call (the step followed \
                     is_token_in_rank)",
                    limit as i64
                ),
            ),
            Ok(Failure::HandleMismatch) => BufferError::invalid(
                "internode_notify (cached)",
                format!(
                    "the handle's send-side channel prefixes for {token} (a rank, or num_ranks + a \
                     node) hold {} where its is_token_in_rank gives {value} (HANDLE_MISMATCH): pass \
                     the handle one dispatch returned, unchanged",
                    limit as i64
                ),
            ),
            // The communicators' failures, which the kernels never write to this record.
            Ok(other) => BufferError::invalid(
                "input",
                format!(
                    "the kernels recorded {} ({}) as bad input",
                    other.meaning(),
                    other.device_name()
                ),
            ),
            Err(code) => BufferError::invalid(
                "input",
                format!(
                    "the input-error record holds kind {code}, which this build does not know: \
                     were the kernels built from another kernels/contract/defs.rs?"
                ),
            ),
        }
    }
}

#[cfg(test)]
mod input_record_tests {
    use super::BufferError;
    use crate::test_views::assert_mentions;
    use kernels::contract::Failure;

    /// The input-error record as a kernel leaves it: [kind, token, value, limit].
    fn record(kind: Failure, token: u64, value: u64, limit: u64) -> [u64; 4] {
        [kind as u64, token, value, limit]
    }

    #[test]
    fn a_dispatch_past_num_worst_tokens_names_it_and_the_rows_needed() {
        let e = BufferError::from_input_record(record(Failure::RecvOverflow, 1, 250, 100));
        assert!(matches!(
            e,
            BufferError::RecvOverflow {
                first_rank: 1,
                needed: 250,
                num_worst_tokens: 100
            }
        ));
        let text = e.to_string();
        assert_mentions(
            &text,
            &[
                "received 250 tokens",
                "forwarded to its node",
                "num_worst_tokens = 100 rows",
                "from rank 1's tokens on",
                "Pass num_worst_tokens >= 250",
            ],
        );
    }

    #[test]
    fn counts_that_disagree_with_the_routing_name_the_rank_and_both_numbers() {
        let e = BufferError::from_input_record(record(Failure::CountsMismatch, 2, 5, 7));
        let text = e.to_string();
        assert!(
            text.contains("num_tokens_per_rank[2] = 7")
                && text.contains("is_token_in_rank sends 5 tokens to rank 2")
                && text.contains("get_dispatch_layout"),
            "{text}"
        );
        // The kernel stores the caller's count sign-extended: a negative one reads back as such.
        let e = BufferError::from_input_record(record(Failure::CountsMismatch, 0, 3, -4i64 as u64));
        assert!(e.to_string().contains("num_tokens_per_rank[0] = -4"), "{e}");
    }

    #[test]
    fn the_internode_notifys_input_errors_name_the_node_or_entry_and_both_numbers() {
        let text = BufferError::from_input_record(record(Failure::NodeCountsMismatch, 1, 40, 41))
            .to_string();
        assert_mentions(
            &text,
            &[
                "num_tokens_per_rdma_rank[1] = 41",
                "sends 40 tokens to node 1",
                "get_dispatch_layout",
            ],
        );
        let text =
            BufferError::from_input_record(record(Failure::HandleMismatch, 9, 12, 13)).to_string();
        assert_mentions(
            &text,
            &["prefixes for 9", "hold 13", "gives 12", "unchanged"],
        );
    }

    #[test]
    fn every_kind_reads_back_as_itself_and_input_kinds_leave_the_buffer_usable() {
        let input_kinds = [
            Failure::BadExpert,
            Failure::BadHandle,
            Failure::SlotsFull,
            Failure::RecvOverflow,
            Failure::CountsMismatch,
        ];
        for &kind in Failure::ALL {
            assert_eq!(Failure::from_code(kind as u64), Ok(kind));
            let e = BufferError::from_input_record(record(kind, 1, 2, 3));
            let text = e.to_string();
            assert!(!text.contains("does not know"), "{kind:?}: {text}");
            assert!(e.is_invalid_input(), "{kind:?}: {text}");
            // Input kinds have messages of their own; kinds the kernels never write to this
            // record still say what they are.
            let own_message = input_kinds.contains(&kind);
            assert_eq!(
                text.contains(kind.device_name()),
                !own_message,
                "{kind:?}: {text}"
            );
        }
        assert_eq!(Failure::RecvOverflow.device_name(), "RECV_OVERFLOW");
        assert_eq!(Failure::CountsMismatch.device_name(), "COUNTS_MISMATCH");
        let unknown = BufferError::from_input_record([999, 0, 0, 0]).to_string();
        assert!(unknown.contains("kind 999"), "{unknown}");
    }
}
