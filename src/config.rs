//! DeepEP's `Config` (the same fields, defaults, checks and per-rank-count defaults), the
//! buffer's own limits, and the size hints that tell a caller how many bytes to ask for.

use crate::error::BufferError;
use crate::regions::{combine_slot_bytes, dispatch_slot};
use kernels::contract::{FP8_GROUP, MAX_TOPK};

/// `Buffer.num_sms` before `set_num_sms`: DeepEP's default.
pub const DEFAULT_NUM_SMS: u32 = 20;
/// The limits the kernels share (the host/device contract, `kernels/contract/defs.rs`):
/// `MAX_CHANNELS` channels (num_sms / 2) the ring counters are sized for, `CHANNEL_THREADS`
/// threads per dispatch or combine block (32 warps, split among the peers), `WINDOW_TOKENS`
/// tokens a dispatch sender publishes at once (a ring must hold at least this).
pub use kernels::contract::{CHANNEL_THREADS, MAX_CHANNELS, WINDOW_TOKENS};

/// Most ranks of a normal-mode buffer once it crosses nodes (DeepEP's internode range,
/// EP16-EP64). Until then (issue 32) normal mode runs inside one node, at most chapter 4's
/// `MAX_PES` ranks, and refuses more than one node naming both limits (`BufferOptions::check`).
/// Low-latency mode's limit is the contract's `MAX_LL_RANKS` (256): its arrays are on the device.
pub const MAX_NORMAL_RANKS: usize = 64;

/// How many SMs (and so channels) a dispatch or combine uses, and the ring sizes. Fields as
/// DeepEP's `Config(num_sms, num_max_nvl_chunked_send_tokens, num_max_nvl_chunked_recv_tokens,
/// num_max_rdma_chunked_send_tokens, num_max_rdma_chunked_recv_tokens)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub num_sms: u32,
    /// DeepEP's sender chunk. Our senders publish every 32 tokens in dispatch (a warp's
    /// ballot) and every 16 rows in combine (`COMBINE_WINDOW`, measured), so this only has to
    /// be valid.
    pub num_max_nvl_chunked_send_tokens: u32,
    /// Slots of each (channel, peer) ring.
    pub num_max_nvl_chunked_recv_tokens: u32,
    pub num_max_rdma_chunked_send_tokens: u32,
    pub num_max_rdma_chunked_recv_tokens: u32,
}

impl Config {
    /// DeepEP's checks (config.hpp), then ours: rings of at least one publishing window.
    pub fn new(
        num_sms: u32,
        nvl_send: u32,
        nvl_recv: u32,
        rdma_send: u32,
        rdma_recv: u32,
    ) -> Result<Self, BufferError> {
        let invalid = |what: String| Err(BufferError::invalid("Config", what));
        if nvl_send == 0 || nvl_recv == 0 || rdma_send == 0 || rdma_recv == 0 {
            return invalid("every chunk size must be positive".into());
        }
        if nvl_send >= nvl_recv {
            return invalid(format!(
                "num_max_nvl_chunked_send_tokens ({nvl_send}) must be smaller than \
                 num_max_nvl_chunked_recv_tokens ({nvl_recv})"
            ));
        }
        let rdma_recv = rdma_recv.div_ceil(rdma_send) * rdma_send;
        if rdma_send >= rdma_recv || rdma_send > rdma_recv / 2 {
            return invalid(format!(
                "num_max_rdma_chunked_send_tokens ({rdma_send}) must be at most half of \
                 num_max_rdma_chunked_recv_tokens ({rdma_recv})"
            ));
        }
        Ok(Self {
            num_sms,
            num_max_nvl_chunked_send_tokens: nvl_send,
            num_max_nvl_chunked_recv_tokens: nvl_recv,
            num_max_rdma_chunked_send_tokens: rdma_send,
            num_max_rdma_chunked_recv_tokens: rdma_recv,
        })
    }

    /// What a dispatch or combine with this config needs, before anything is launched.
    pub fn check_for_launch(&self, n_pes: usize) -> Result<(), BufferError> {
        let invalid = |what: String| Err(BufferError::invalid("Config", what));
        if self.num_sms < 2 || !self.num_sms.is_multiple_of(2) {
            return invalid(format!(
                "num_sms = {} must be even and at least 2 (one sending and one receiving SM \
                 per channel)",
                self.num_sms
            ));
        }
        if self.num_channels() > MAX_CHANNELS {
            return invalid(format!(
                "num_sms = {} is more than {} channels",
                self.num_sms, MAX_CHANNELS
            ));
        }
        if self.num_max_nvl_chunked_recv_tokens < WINDOW_TOKENS {
            return invalid(format!(
                "num_max_nvl_chunked_recv_tokens = {} is below {WINDOW_TOKENS}: a ring must \
                 hold one window of tokens",
                self.num_max_nvl_chunked_recv_tokens
            ));
        }
        if (CHANNEL_THREADS / 32) < n_pes as u32 {
            return invalid(format!(
                "{n_pes} PEs need more than {} warps per block",
                CHANNEL_THREADS / 32
            ));
        }
        Ok(())
    }

    pub fn num_channels(&self) -> usize {
        self.num_sms as usize / 2
    }

    // ANCHOR: nvl_hint
    /// Bytes of `num_nvl_bytes` a dispatch or combine of rows of `hidden_bytes` needs with
    /// this config on `num_ranks` PEs: channels x ranks x ring slots x the largest slot
    /// (regions.rs has the slot formulas), for up to MAX_TOPK experts per token and fp8 scales.
    pub fn get_nvl_buffer_size_hint(&self, hidden_bytes: usize, num_ranks: usize) -> usize {
        let hidden = hidden_bytes / 2; // DeepEP's callers pass H * max(element size, 2)
        let scales = hidden.div_ceil(FP8_GROUP);
        let dispatch = dispatch_slot(hidden_bytes, MAX_TOPK, scales).bytes as usize;
        let slot = dispatch.max(combine_slot_bytes(hidden * 2, MAX_TOPK));
        (self.num_channels() * num_ranks * self.num_max_nvl_chunked_recv_tokens as usize * slot)
            .next_multiple_of(128)
    }
    // ANCHOR_END: nvl_hint

    /// Inter-node bytes: none inside one node (DeepEP returns 0 up to 8 ranks too).
    pub fn get_rdma_buffer_size_hint(&self, _hidden_bytes: usize, num_ranks: usize) -> usize {
        if num_ranks <= 8 { 0 } else { usize::MAX }
    }
}

/// DeepEP's default dispatch configs by rank count (buffer.py), with `num_sms` SMs.
pub fn dispatch_config(num_ranks: usize, num_sms: u32) -> Result<Config, BufferError> {
    let (send, recv) = match num_ranks {
        2 => (24, 256),
        4 | 8 => (6, 256),
        other => return Err(unsupported_ranks(other)),
    };
    Config::new(num_sms, send, recv, 6, 128)
}

/// DeepEP's default combine configs by rank count.
pub fn combine_config(num_ranks: usize, num_sms: u32) -> Result<Config, BufferError> {
    let (send, recv) = match num_ranks {
        2 => (10, 256),
        4 => (9, 256),
        8 => (4, 256),
        other => return Err(unsupported_ranks(other)),
    };
    Config::new(num_sms, send, recv, 6, 128)
}

fn unsupported_ranks(num_ranks: usize) -> BufferError {
    BufferError::invalid(
        "get_dispatch_config",
        format!(
            "Unsupported number of EP ranks: {num_ranks} (this buffer runs 2, 4 or 8 ranks of one node)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepep_checks_and_defaults() {
        assert!(Config::new(24, 8, 256, 6, 128).is_ok());
        assert!(
            Config::new(24, 256, 256, 6, 128)
                .unwrap_err()
                .to_string()
                .contains("smaller than")
        );
        let c = Config::new(20, 6, 256, 6, 256).unwrap();
        assert_eq!(c.num_max_rdma_chunked_recv_tokens, 258); // aligned up to the send chunk
        assert_eq!(
            dispatch_config(8, 24)
                .unwrap()
                .num_max_nvl_chunked_send_tokens,
            6
        );
        assert_eq!(
            combine_config(2, 24)
                .unwrap()
                .num_max_nvl_chunked_send_tokens,
            10
        );
        assert!(
            dispatch_config(16, 24)
                .unwrap_err()
                .to_string()
                .contains("Unsupported number of EP ranks: 16")
        );
    }

    #[test]
    fn launch_checks_name_the_field() {
        for (num_sms, ring, message) in [(23, 256, "must be even"), (24, 16, "below 32")] {
            let error = Config::new(num_sms, 8, ring, 6, 128)
                .unwrap()
                .check_for_launch(8)
                .unwrap_err()
                .to_string();
            assert!(error.contains(message), "{error}");
        }
        let good = Config::new(24, 8, 256, 6, 128).unwrap();
        assert!(good.check_for_launch(8).is_ok());
    }

    #[test]
    fn the_hint_covers_deepeps_test() {
        // tests/test_intranode.py: Config(24, 8, 256), hidden 7168 bf16, 8 ranks, 2e9 bytes.
        let hint = Config::new(24, 8, 256, 6, 128)
            .unwrap()
            .get_nvl_buffer_size_hint(7168 * 2, 8);
        assert!(
            hint < 2_000_000_000 && hint > 12 * 8 * 256 * 7168 * 2,
            "{hint}"
        );
    }
}
