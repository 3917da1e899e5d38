// The host/device contract's argument structs, part: The buffer's normal mode across nodes (issue 32): notify, dispatch, combine.
// kernels/contract/defs.rs holds the limits and failure kinds and includes the parts in
// contract.cuh's order.

contract_structs! {
    fn internode_structs;

    /// Per-rank device state of `internode_notify` (local memory, zeroed at creation). Each
    /// block counts calls in its own word, so no block of a launch can see another's update.
    struct InternodeNotifyState {
        /// calls[b]: the internode notifies block b finished, cached ones included
        calls: [u64; MAX_NOTIFY_BLOCKS] => "unsigned long long" "[MAX_NOTIFY_BLOCKS]",
        /// row_calls[b]: those of them that sent rail rows (not cached): their parity picks the rows
        row_calls: [u64; MAX_NOTIFY_BLOCKS] => "unsigned long long" "[MAX_NOTIFY_BLOCKS]",
    }

    /// Normal mode's notify across nodes (`internode_notify` in buffer/internode_notify.cu):
    /// DeepEP's handle positions 1-6 and the host's counts, through rail rows (one per
    /// destination node, to the rank with our local index there) and a node-level read.
    struct InternodeNotifyArgs {
        /// local [num_tokens, n] bool: the routing (handle 0)
        is_token_in_rank: u64 => "const bool*",
        /// local [n] i32, or null (cached): only compared with the routing
        num_tokens_per_rank: u64 => "const int*",
        /// local [N] i32, or null (cached): only compared with the routing
        num_tokens_per_rdma_rank: u64 => "const int*",
        /// local [num_experts] i32, or null (cached)
        num_tokens_per_expert: u64 => "const int*",
        /// local [N, C] i32, handle 1: written, or read by a cached notify
        rdma_channel_prefix_matrix: u64 => "int*",
        /// local [n, C] i32, handle 2: written, or read by a cached notify
        gbl_channel_prefix_matrix: u64 => "int*",
        /// local [N, C] i32, handle 3 (written; not by a cached notify)
        recv_rdma_channel_prefix_matrix: u64 => "int*",
        /// local [N] i32, handle 4
        recv_rdma_rank_prefix_sum: u64 => "int*",
        /// local [n, C] i32, handle 5
        recv_gbl_channel_prefix_matrix: u64 => "int*",
        /// local [n] i32, handle 6
        recv_gbl_rank_prefix_sum: u64 => "int*",
        /// host-mapped i32 [2 + L]: [0] rows to receive (written last), [1 + e] local expert e's
        /// rows rounded up to expert_alignment, [1 + L] rows this rank forwards
        counts: u64 => "int*",
        /// symmetric [3][MAX_NODES] u64: [p][b] = the rows of parity p from node b's rail peer,
        /// [2][b] = its cached notifies' signals
        signals: u64 => "uint64_t*",
        /// symmetric [MAX_PES] u64: tickets[l] = the notifies node member l has every row of
        tickets: u64 => "uint64_t*",
        /// symmetric i32 [2][N][row_stride]: rows[p][b], the rail row from node b (parity p)
        rows: u64 => "int*",
        /// symmetric i32 [2][N][row_stride]: staging[p][k], our row for node k, read by the put
        staging: u64 => "int*",
        /// local
        state: u64 => "InternodeNotifyState*",
        bad_input: InputError => "InputError",
        topo: LlTopology => "LlTopology",
        /// i32 between two rows: at least the longest row's words, a multiple of 4
        row_stride: i32 => "int",
        num_tokens: i32 => "int",
        num_channels: i32 => "int",
        num_experts: i32 => "int",
        expert_alignment: i32 => "int",
        /// 1: the cached flavour (the barrier and the handle's check, no rows)
        cached: i32 => "int",
    }

    /// The RDMA rings of normal mode across nodes, which the internode dispatch and combine share
    /// (buffer/internode.cuh): landing ring (c, b), what our rail peer on node b sends us, at slot
    /// (c N + b) R_r; staging ring (c, k), what we put to node k, at slot C N R_r + (c N + k) R_r;
    /// and their words. Positions run on from one op into the next (both write ring (c, b) from
    /// the same rail peer).
    struct RdmaRings {
        /// symmetric: the rings, in num_rdma_bytes after the low-latency control words
        base: u64 => "uint8_t*",
        /// symmetric [MAX_CHANNELS][N][MAX_RDMA_CHUNKS] u64: the chunk words, set by each chunk's put
        chunk_words: u64 => "uint64_t*",
        /// symmetric [MAX_CHANNELS][N] u64: positions node k's rail peer consumed of our ring (c, k)
        /// (its signal adds; our own node: our release stores)
        heads: u64 => "uint64_t*",
        /// local [MAX_CHANNELS][N] u64: our next position in our ring to node k (chunk-aligned
        /// between calls): the dispatch's sender, the combine's forwarder
        sent: u64 => "uint64_t*",
        /// local [MAX_CHANNELS][N] u64: our next position in landing ring (c, b): the dispatch's
        /// forwarder, the combine's home receivers
        received: u64 => "uint64_t*",
        /// R_r, c_r
        ring_tokens: i32 => "int",
        chunk_tokens: i32 => "int",
    }

    /// The four position words of a set of NVL rings, each an array of u64 indexed as the
    /// struct that holds them says: how far the sender wrote (tails, symmetric: stored on the
    /// receiver's side), how far the receiver read (heads, symmetric: stored on the sender's
    /// side), and each side's own next position between calls (sent, received: local).
    struct NvlCounters {
        tails: u64 => "uint64_t*",
        heads: u64 => "uint64_t*",
        sent: u64 => "uint64_t*",
        received: u64 => "uint64_t*",
    }

    /// Normal mode's dispatch across nodes (`internode_dispatch` in
    /// buffer/internode_dispatch.cu): each token once to each destination node's rail peer
    /// (RDMA rings, put-with-signal), which forwards it to the node's ranks (NVL rings, stores).
    /// A ring slot: [row: a16(hidden_bytes)][src node: i32][in-node mask: u32][top-k ids: i32 x K]
    /// [weights: f32 x K][scales: 4 bytes x S], padded to 16 bytes (`slot.bytes`).
    struct InternodeDispatchArgs {
        /// local [num_tokens, hidden_bytes]: bf16 rows, or fp8 e4m3 bytes with x_scales
        x: u64 => "const uint8_t*",
        /// local 4-byte words (f32, or int32 UE8M0: copied as opaque words), scale k of token t at
        /// t * scale_token_stride + k * scale_hidden_stride; null for bf16
        x_scales: u64 => "const float*",
        scale_token_stride: i64 => "int64_t",
        scale_hidden_stride: i64 => "int64_t",
        /// local [num_tokens, num_topk] global expert ids or -1; null: no top-k
        topk_idx: u64 => "const int64_t*",
        /// local [num_tokens, num_topk]; null with topk_idx
        topk_weights: u64 => "const float*",
        /// local [num_tokens, n] bool (handle 0)
        is_token_in_rank: u64 => "const bool*",
        /// local [N, C] i32 (handle 3): rows this rank forwards from node b in channels 0..=c
        recv_rdma_channel_prefix_matrix: u64 => "const int*",
        /// local [N] i32 (handle 4): rows this rank forwards from nodes 0..=b
        recv_rdma_rank_prefix_sum: u64 => "const int*",
        /// local [n, C] i32 (handle 5): the first received row of rank s's channel c
        recv_gbl_channel_prefix_matrix: u64 => "const int*",
        /// local [n] i32 (handle 6): rows received from ranks 0..=s
        recv_gbl_rank_prefix_sum: u64 => "const int*",
        /// local [num_recv_rows, hidden_bytes]
        recv_x: u64 => "uint8_t*",
        /// local [num_recv_rows, num_scales] row-major 4-byte words, or null (bf16)
        recv_x_scales: u64 => "float*",
        /// local [num_recv_rows, 2] i32: source node, in-node mask (handle 7, 8 bytes a row); null
        /// in a cached dispatch (not written)
        recv_src_meta: u64 => "int*",
        /// local [num_recv_rows, num_topk] (local expert ids or -1; -1 on rows past those
        /// received) or null
        recv_topk_idx: u64 => "int64_t*",
        /// local [num_recv_rows, num_topk] or null
        recv_topk_weights: u64 => "float*",
        /// local [num_tokens, N] i32 (handle 8), written: index in the channel's stream to node k, or
        /// -1; null in a cached dispatch
        send_rdma_head: u64 => "int*",
        /// local [num_forwarded_rows, G] i32 (handle 9), written: index in NVL stream (c, l'), or -1;
        /// null in a cached dispatch
        send_nvl_head: u64 => "int*",
        /// local [MAX_DISPATCH_BLOCKS] u64: the dispatches each block finished
        calls: u64 => "uint64_t*",
        /// symmetric: NVL ring (c, l) at slot (c G + l) R_n, on the receiver
        nvl: u64 => "uint8_t*",
        /// chapter 7's dispatch counters, [MAX_CHANNELS][MAX_PES] by node member
        nvl_counters: NvlCounters => "NvlCounters",
        /// where outputs smaller than the handle's rows are recorded (RECV_OVERFLOW: num_worst_tokens)
        bad_input: InputError => "InputError",
        rings: RdmaRings => "RdmaRings",
        topo: LlTopology => "LlTopology",
        slot: DispatchSlot => "DispatchSlot",
        num_tokens: i32 => "int",
        num_experts: i32 => "int",
        num_channels: i32 => "int",
        /// R_n
        nvl_ring_tokens: i32 => "int",
        num_recv_rows: i32 => "int",
        num_forwarded_rows: i32 => "int",
    }

    /// Normal mode's combine across nodes (`internode_combine` in buffer/internode_combine.cu):
    /// the dispatch backwards. Each rank's rows go back to the forwarder they came through (NVL
    /// sub-rings, stores), which sums a token's rows of its node and sends the sum once to the
    /// token's rank (the dispatch's RDMA rings and words, put-with-signal), which adds the nodes'
    /// sums and the biases. Both rings' slots: [row: a16(hidden_bytes) bf16][weights: f32 x K],
    /// padded to 16 bytes (`slot_bytes`).
    struct InternodeCombineArgs {
        /// local [num_recv_rows, hidden_bytes] bf16: a row per row the dispatch delivered here
        x: u64 => "const uint8_t*",
        /// local [num_recv_rows, num_topk] f32, or null (no weights)
        topk_weights: u64 => "const float*",
        /// local [num_tokens, hidden_bytes] bf16, or null
        bias0: u64 => "const uint8_t*",
        bias1: u64 => "const uint8_t*",
        /// local [N, C] i32 (handle 1): our tokens to node k in channels 0..=c
        rdma_channel_prefix_matrix: u64 => "const int*",
        /// local [N, C] i32 (handle 3): rows we forwarded from node b in channels 0..=c
        recv_rdma_channel_prefix_matrix: u64 => "const int*",
        /// local [N] i32 (handle 4): rows we forwarded from nodes 0..=b
        recv_rdma_rank_prefix_sum: u64 => "const int*",
        /// local [n, C] i32 (handle 5): our first received row of rank s's channel c
        recv_gbl_channel_prefix_matrix: u64 => "const int*",
        /// local [n] i32 (handle 6): rows we received from ranks 0..=s
        recv_gbl_rank_prefix_sum: u64 => "const int*",
        /// local [num_tokens, N] i32 (handle 8): token t's index in its channel's stream to node k, or -1
        send_rdma_head: u64 => "const int*",
        /// local [num_forwarded_rows, G] i32 (handle 9): -1 where forwarded row j skipped member l'
        /// (the combine reads only which entries are -1)
        send_nvl_head: u64 => "const int*",
        /// local [num_tokens, hidden_bytes] bf16, written
        combined_x: u64 => "uint8_t*",
        /// local [num_tokens, num_topk] f32, written; null without topk_weights
        combined_topk_weights: u64 => "float*",
        /// local [MAX_DISPATCH_BLOCKS] u64: the combines each block finished
        calls: u64 => "uint64_t*",
        /// symmetric: NVL sub-ring (c, l', k) at slot ((c G + l') N + k) nvl_sub_ring_tokens, on
        /// the forwarder: what member l' sends back for node k
        nvl: u64 => "uint8_t*",
        /// [MAX_CHANNELS][MAX_NORMAL_RANKS] by (member, node) = l N + k: tails on the forwarder
        /// (from member l), heads on the sender (from forwarder l)
        nvl_counters: NvlCounters => "NvlCounters",
        /// where a handle naming more rows than x or send_nvl_head hold is recorded (RECV_OVERFLOW)
        bad_input: InputError => "InputError",
        /// the dispatch's rings and words: the combine's positions run on from the dispatch's
        rings: RdmaRings => "RdmaRings",
        topo: LlTopology => "LlTopology",
        num_tokens: i32 => "int",
        hidden_bytes: i32 => "int",
        num_topk: i32 => "int",
        slot_bytes: i32 => "int",
        num_channels: i32 => "int",
        /// a sub-ring's slots floor(R_n / N) and an NVL sender's window
        nvl_sub_ring_tokens: i32 => "int",
        nvl_window_tokens: i32 => "int",
        /// rows of x (M) and of send_nvl_head (M_r): rows past them are never read
        num_recv_rows: i32 => "int",
        num_forwarded_rows: i32 => "int",
    }
}
