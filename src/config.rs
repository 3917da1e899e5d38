//! DeepEP's `Config` (the same fields, defaults, checks and per-rank-count defaults), the
//! buffer's own limits, and the size hints that tell a caller how many bytes to ask for.

use crate::error::BufferError;
use crate::low_latency::regions::CONTROL_BYTES;
use crate::regions::{combine_slot_bytes, dispatch_slot};
use kernels::contract::{FP8_GROUP, MAX_PES, MAX_TOPK};

/// `Buffer.num_sms` before `set_num_sms`: DeepEP's default.
pub const DEFAULT_NUM_SMS: u32 = 20;
/// The limits the kernels share (the host/device contract, `kernels/contract/defs.rs`):
/// `MAX_CHANNELS` channels (num_sms / 2) the ring counters are sized for, `CHANNEL_THREADS`
/// threads per dispatch or combine block (32 warps, split among the peers), `WINDOW_TOKENS`
/// tokens a dispatch sender publishes at once (a ring must hold at least this).
pub use kernels::contract::{CHANNEL_THREADS, MAX_CHANNELS, WINDOW_TOKENS};

/// Most ranks of a normal-mode buffer once it crosses nodes (DeepEP's internode range,
/// EP16-EP64): the contract's, since the internode notify sizes shared arrays by it. Inside one
/// node normal mode runs at most chapter 4's `MAX_PES` ranks (`BufferOptions::check_nodes`).
/// Low-latency mode's limit is the contract's `MAX_LL_RANKS` (256): its arrays are on the device.
pub use kernels::contract::MAX_NORMAL_RANKS;

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
        if num_ranks > MAX_PES {
            // Across nodes, on DeepEP's assumption of nodes of 8 (get_buffer_size_hints_for_nodes
            // takes the node size).
            let hints = self.internode_hints(hidden_bytes, num_ranks.div_ceil(MAX_PES), MAX_PES);
            return hints.0;
        }
        let hidden = hidden_bytes / 2; // DeepEP's callers pass H * max(element size, 2)
        let scales = hidden.div_ceil(FP8_GROUP);
        let dispatch = dispatch_slot(hidden_bytes, MAX_TOPK, scales).bytes as usize;
        let slot = dispatch.max(combine_slot_bytes(hidden * 2, MAX_TOPK));
        (self.num_channels() * num_ranks * self.num_max_nvl_chunked_recv_tokens as usize * slot)
            .next_multiple_of(128)
    }
    // ANCHOR_END: nvl_hint

    /// `num_rdma_bytes` for normal mode across nodes on DeepEP's assumption of nodes of
    /// `MAX_PES` = 8 ranks (its signature has no node size): 0 on one node, as DeepEP's; ranks
    /// past a multiple of 8 get the next multiple's size. `get_buffer_size_hints_for_nodes`
    /// takes the node size.
    pub fn get_rdma_buffer_size_hint(&self, hidden_bytes: usize, num_ranks: usize) -> usize {
        let node_pes = num_ranks.clamp(1, MAX_PES);
        self.internode_hints(hidden_bytes, num_ranks.div_ceil(node_pes), node_pes)
            .1
    }

    /// (num_nvl_bytes, num_rdma_bytes) for normal mode on nodes of `node_pes` ranks. Across
    /// nodes: per channel and local rank an NVL ring of `num_max_nvl_chunked_recv_tokens`
    /// slots; the low-latency control words (the two modes share the RDMA region) and, per
    /// channel and node, a staging and a landing ring of `num_max_rdma_chunked_recv_tokens`
    /// slots (`internode_slot_bytes` for up to MAX_TOPK experts and fp8 scales). On one node:
    /// the intranode hint and 0. A low-latency buffer that serves normal calls too needs the
    /// larger of this rdma hint and `get_low_latency_rdma_size_hint`
    /// (`mode_sharing::rdma_size_hint_for_both_modes`: the two share the region).
    pub fn get_buffer_size_hints_for_nodes(
        &self,
        hidden_bytes: usize,
        num_ranks: usize,
        node_pes: usize,
    ) -> Result<(usize, usize), BufferError> {
        let num_nodes = check_nodes(num_ranks, node_pes)?;
        Ok(self.internode_hints(hidden_bytes, num_nodes, node_pes))
    }

    /// (num_nvl_bytes, num_rdma_bytes) of normal mode across `num_nodes` nodes of `node_pes`.
    fn internode_hints(
        &self,
        hidden_bytes: usize,
        num_nodes: usize,
        node_pes: usize,
    ) -> (usize, usize) {
        if num_nodes <= 1 {
            return (self.get_nvl_buffer_size_hint(hidden_bytes, node_pes), 0);
        }
        let hidden = hidden_bytes / 2; // DeepEP's callers pass H * max(element size, 2)
        let slot = internode_slot_bytes(hidden, hidden * 2, MAX_TOPK, hidden.div_ceil(FP8_GROUP));
        let c = self.num_channels();
        let rdma = CONTROL_BYTES
            + 2 * c * num_nodes * self.num_max_rdma_chunked_recv_tokens as usize * slot;
        let nvl = c * node_pes * self.num_max_nvl_chunked_recv_tokens as usize * slot;
        (nvl.next_multiple_of(128), rdma.next_multiple_of(128))
    }
}

/// Bytes of one slot of normal mode's rings across nodes, which dispatch and combine share:
/// a dispatch slot `[row: row_bytes][src node: i32, in-node mask: u32][top-k ids: i32 x K]
/// [weights: f32 x K][scales: f32 x S]` and a combine slot `[row: bf16 x hidden][weights: f32
/// x K]`, each part 16-byte aligned. The forwarder copies a slot on verbatim.
pub fn internode_slot_bytes(
    hidden: usize,
    row_bytes: usize,
    num_topk: usize,
    num_scales: usize,
) -> usize {
    let combine = (2 * hidden).next_multiple_of(16) + (4 * num_topk).next_multiple_of(16);
    internode_dispatch_slot_bytes(row_bytes, num_topk, num_scales).max(combine)
}

/// A dispatch slot across nodes: [row][src node: i32][in-node mask: u32][top-k ids: i32 x K]
/// [weights: f32 x K][scales: f32 x S], row and metadata each 16-aligned (InternodeDispatchArgs).
pub fn internode_dispatch_slot_bytes(
    row_bytes: usize,
    num_topk: usize,
    num_scales: usize,
) -> usize {
    row_bytes.next_multiple_of(16) + (8 + 8 * num_topk + 4 * num_scales).next_multiple_of(16)
}

/// The number of nodes of `num_ranks` in nodes of `node_pes`, or what is wrong with them.
fn check_nodes(num_ranks: usize, node_pes: usize) -> Result<usize, BufferError> {
    let invalid = |what: String| Err(BufferError::invalid("Config", what));
    if node_pes == 0 || node_pes > MAX_PES || !num_ranks.is_multiple_of(node_pes) {
        return invalid(format!(
            "{num_ranks} ranks in nodes of {node_pes}: a node holds 1 to MAX_PES = {MAX_PES} \
             ranks and the ranks fill whole nodes"
        ));
    }
    if num_ranks / node_pes > 1 && num_ranks > MAX_NORMAL_RANKS {
        return invalid(format!(
            "{num_ranks} ranks: normal mode across nodes holds at most MAX_NORMAL_RANKS = \
             {MAX_NORMAL_RANKS}"
        ));
    }
    Ok(num_ranks / node_pes)
}

/// DeepEP's default dispatch configs by rank count (buffer.py), with `num_sms` SMs: NVL send
/// and receive chunks, RDMA send chunk (its RDMA receive ring is 128 throughout).
pub fn dispatch_config(num_ranks: usize, num_sms: u32) -> Result<Config, BufferError> {
    let (send, recv, rdma_send) = match num_ranks {
        2 => (24, 256, 6),
        4 | 8 => (6, 256, 6),
        16 => (36, 288, 20),
        24 | 32 | 48 | 64 => (32, 288, 8),
        other => return Err(unsupported_ranks("get_dispatch_config", other)),
    };
    Config::new(num_sms, send, recv, rdma_send, 128)
}

/// DeepEP's default combine configs by rank count.
pub fn combine_config(num_ranks: usize, num_sms: u32) -> Result<Config, BufferError> {
    let (send, recv, rdma_send) = match num_ranks {
        2 => (10, 256, 6),
        4 => (9, 256, 6),
        8 => (4, 256, 6),
        16 => (4, 288, 12),
        24 | 32 | 48 | 64 => (1, 288, 8),
        other => return Err(unsupported_ranks("get_combine_config", other)),
    };
    Config::new(num_sms, send, recv, rdma_send, 128)
}

fn unsupported_ranks(what: &'static str, num_ranks: usize) -> BufferError {
    let why = if num_ranks > MAX_NORMAL_RANKS {
        format!(
            "normal mode holds at most MAX_NORMAL_RANKS = {MAX_NORMAL_RANKS} (DeepEP's tables go \
             to 160)"
        )
    } else {
        "DeepEP's tables have 2, 4, 8, 16, 24, 32, 48 and 64 up to our limit; pass a Config".into()
    };
    BufferError::invalid(
        what,
        format!("Unsupported number of EP ranks: {num_ranks} ({why})"),
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
        for (n, error) in [(12, "pass a Config"), (96, "MAX_NORMAL_RANKS = 64")] {
            let e = dispatch_config(n, 24).unwrap_err().to_string();
            assert!(
                e.contains(&format!("Unsupported number of EP ranks: {n}")) && e.contains(error),
                "{e}"
            );
        }
    }

    /// DeepEP 567632d's tables (deep_ep/buffer.py get_dispatch_config / get_combine_config)
    /// up to our MAX_NORMAL_RANKS, a row per rank count: (nvl send, nvl recv, rdma send) for the
    /// dispatch, then for the combine; rdma recv is 128, rounded up to the send chunk as
    /// DeepEP's Config does.
    #[test]
    fn the_config_tables_are_deepeps_up_to_64_ranks() {
        let table = [
            (16, (36, 288, 20), (4, 288, 12)),
            (24, (32, 288, 8), (1, 288, 8)),
            (32, (32, 288, 8), (1, 288, 8)),
            (48, (32, 288, 8), (1, 288, 8)),
            (64, (32, 288, 8), (1, 288, 8)),
        ];
        for (n, dispatch, combine) in table {
            for (make, (send, recv, rdma_send)) in [
                (dispatch_config as fn(usize, u32) -> _, dispatch),
                (combine_config, combine),
            ] {
                let c = make(n, 24).unwrap();
                assert_eq!(
                    (
                        c.num_max_nvl_chunked_send_tokens,
                        c.num_max_nvl_chunked_recv_tokens,
                        c.num_max_rdma_chunked_send_tokens
                    ),
                    (send, recv, rdma_send),
                    "{n} ranks"
                );
                assert_eq!(
                    c.num_max_rdma_chunked_recv_tokens,
                    128_u32.div_ceil(rdma_send) * rdma_send
                );
            }
        }
    }

    /// DeepEP's internode hints (csrc/config.hpp, nodes of 8): 128 top-k ids of 8 bytes, 128
    /// weights and 128 scales per slot, an 8-byte source meta and a 16-byte tail per RDMA slot.
    /// (num_nvl_bytes, num_rdma_bytes), as ours.
    fn deepep_hints(c: &Config, hidden_bytes: usize, num_ranks: usize) -> (usize, usize) {
        let (ch, n, g) = (c.num_channels(), num_ranks / 8, 8);
        let (rr, rn) = (
            c.num_max_rdma_chunked_recv_tokens as usize,
            c.num_max_nvl_chunked_recv_tokens as usize,
        );
        let per_slot = 8 + 128 * 8 + 128 * 4 + 128 * 4;
        let rdma = ch * n * (8 * 2 + 2) * 2 * 4 + ch * n * rr * (hidden_bytes + per_slot + 16) * 2;
        let nvl = ch * g * (2 * n + 3) * 4 + ch * g * rn * (hidden_bytes + per_slot);
        (nvl.next_multiple_of(128), rdma.next_multiple_of(128))
    }

    /// The design's worked numbers (benchmarks/notes/buffer_internode_normal.md, section 3):
    /// DeepEP's test config (24 SMs, R_n = 512, R_r = 128), H = 7168, in MB of 10^6 bytes.
    #[test]
    fn internode_hints_hold_the_designs_numbers_and_fit_in_deepeps() {
        let h = 7168;
        assert_eq!(internode_slot_bytes(h, 2 * h, 8, 0), 14_416); // a bf16 call at K = 8
        assert_eq!(internode_slot_bytes(h, h, 8, h / 128), 14_368); // fp8: the combine slot wins
        assert_eq!(internode_slot_bytes(h, 2 * h, 32, h / 128), 14_832); // the hint's
        let c = Config::new(24, 8, 512, 16, 128).unwrap();
        let mb = |bytes: usize| (bytes as f64 / 1e4).round() / 100.0;
        for (n, g, rdma, nvl) in [
            (16, 8, 91.16, 729.02),
            (16, 4, 182.29, 364.51),
            (64, 8, 364.55, 729.02),
        ] {
            let (got_nvl, got_rdma) = c.get_buffer_size_hints_for_nodes(2 * h, n, g).unwrap();
            assert_eq!(
                (mb(got_rdma), mb(got_nvl)),
                (rdma, nvl),
                "EP{n} in nodes of {g}"
            );
        }
        // DeepEP's signature assumes nodes of 8; one node needs no RDMA bytes, as DeepEP's.
        assert_eq!(c.get_rdma_buffer_size_hint(2 * h, 8), 0);
        for n in [8, 16] {
            assert_eq!(
                (
                    c.get_nvl_buffer_size_hint(2 * h, n),
                    c.get_rdma_buffer_size_hint(2 * h, n)
                ),
                c.get_buffer_size_hints_for_nodes(2 * h, n, 8).unwrap()
            );
        }
        // A buffer sized by DeepEP's hints at nodes of 8 holds ours, for every table entry.
        for n in [16, 24, 32, 48, 64] {
            for c in [
                dispatch_config(n, 24).unwrap(),
                combine_config(n, 24).unwrap(),
                c,
            ] {
                let (nvl, rdma) = deepep_hints(&c, 2 * h, n);
                let (ours_nvl, ours_rdma) = c.get_buffer_size_hints_for_nodes(2 * h, n, 8).unwrap();
                assert!(
                    ours_rdma <= rdma && ours_nvl <= nvl,
                    "EP{n}: {c:?}: ours {ours_nvl} / {ours_rdma}, DeepEP {nvl} / {rdma}"
                );
            }
        }
        for (n, g, error) in [
            (16, 3, "whole nodes"),
            (16, 16, "MAX_PES = 8"),
            (128, 8, "MAX_NORMAL_RANKS = 64"),
        ] {
            let e = c
                .get_buffer_size_hints_for_nodes(2 * h, n, g)
                .unwrap_err()
                .to_string();
            assert!(e.contains(error), "{n} in nodes of {g}: {e}");
        }
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
