// The host/device contract's argument structs, part: The buffer's normal mode on one node (chapter 7): layout, notify, dispatch, combine.
// kernels/contract/defs.rs holds the limits and failure kinds and includes the parts in
// contract.cuh's order.

contract_structs! {
    fn buffer_structs;

    /// Bad input found on the device, kept apart from the communicator's failure record: the
    /// buffer stays usable, and the host raises it once and clears it.
    struct InputError {
        /// local device u64: the first writer claims it
        claim: u64 => "unsigned long long*",
        /// host-mapped [INPUT_ERROR_WORDS] u64: kind (written last), token, value, limit
        words: u64 => "uint64_t*",
    }

    /// Normal mode's layout step (`moe_layout` in buffer/layout.cu): local, one thread per token.
    struct LayoutArgs {
        /// local [num_tokens, num_topk] global expert ids or -1
        topk_idx: u64 => "const int64_t*",
        /// local [n_pes], zeroed before launch: the kernel adds into it
        num_tokens_per_rank: u64 => "int*",
        /// local [n_pes / node_pes], zeroed before launch, or null (one node: no per-node counts)
        num_tokens_per_rdma_rank: u64 => "int*",
        /// local [num_experts], zeroed before launch
        num_tokens_per_expert: u64 => "int*",
        /// local [num_tokens, n_pes], written: the routing
        is_token_in_rank: u64 => "bool*",
        /// where an expert id outside [-1, num_experts) is recorded (BAD_EXPERT)
        bad_input: InputError => "InputError",
        num_tokens: i32 => "int",
        num_topk: i32 => "int",
        num_experts: i32 => "int",
        n_pes: i32 => "int",
        node_pes: i32 => "int",
    }

    /// The notify step's first kernel (`moe_notify_prepare` in buffer/notify.cu): block d counts
    /// the tokens going to rank d, per channel, into this rank's row.
    struct NotifyPrepareArgs {
        /// local [num_tokens, n_pes]: the routing
        is_token_in_rank: u64 => "const bool*",
        /// local [n_pes]: only compared with what the routing sends (COUNTS_MISMATCH)
        num_tokens_per_rank: u64 => "const int*",
        /// local [num_experts]: copied into the row
        num_tokens_per_expert: u64 => "const int*",
        /// local [n_pes, num_channels], written (handle 1)
        channel_prefix_matrix: u64 => "int*",
        /// symmetric [n_pes + num_experts + n_pes * num_channels]: this rank's row of the all-gather
        row: u64 => "int*",
        /// where num_tokens_per_rank that disagrees with the routing is recorded (COUNTS_MISMATCH)
        bad_input: InputError => "InputError",
        num_tokens: i32 => "int",
        n_pes: i32 => "int",
        num_channels: i32 => "int",
        num_experts: i32 => "int",
    }

    /// The notify step's last kernel (`moe_notify_finish` in buffer/notify.cu, one block): this
    /// rank's receive side from every rank's row.
    struct NotifyFinishArgs {
        /// symmetric [n_pes][n_pes + num_experts + n_pes * num_channels], read here only: the
        /// all-gather's output, every rank's row
        rows: u64 => "const int*",
        /// local [n_pes, n_pes], written (handle 0)
        rank_prefix_matrix: u64 => "int*",
        /// local [n_pes, num_channels], written (handle 2)
        recv_channel_prefix_matrix: u64 => "int*",
        /// host-mapped i32 [1 + num_experts / n_pes]: [0] rows to receive (written last), [1 + e]
        /// local expert e's rows rounded up to expert_alignment
        counts: u64 => "int*",
        n_pes: i32 => "int",
        my_pe: i32 => "int",
        num_channels: i32 => "int",
        num_experts: i32 => "int",
        expert_alignment: i32 => "int",
    }

    /// Where one token's parts sit in a dispatch ring slot: [row: hidden_bytes][src_idx: i32]
    /// [pad: i32][topk_idx: i64 x K][topk_weights: f32 x K][scales: f32 x S], the row and the
    /// metadata each 16-byte aligned; `bytes` is the whole slot.
    struct DispatchSlot {
        hidden_bytes: i32 => "int",
        num_topk: i32 => "int",
        num_scales: i32 => "int",
        bytes: i32 => "int",
    }

    /// Normal-mode dispatch (`moe_scatter` in buffer/dispatch.cu).
    struct ScatterArgs {
        /// local [num_tokens, hidden_bytes] (bf16 or fp8 rows)
        x: u64 => "const uint8_t*",
        /// local f32, scale k of token t at t * scale_token_stride + k * scale_hidden_stride; null for bf16
        x_scales: u64 => "const float*",
        scale_token_stride: i64 => "int64_t",
        scale_hidden_stride: i64 => "int64_t",
        /// local [num_tokens, num_topk] global expert ids or -1; null: no top-k
        topk_idx: u64 => "const int64_t*",
        /// local [num_tokens, num_topk]; null with topk_idx
        topk_weights: u64 => "const float*",
        /// local [num_tokens, n_pes]
        is_token_in_rank: u64 => "const bool*",
        /// local [n_pes, num_channels]: tokens to PE d in channels 0..c (handle 1)
        channel_prefix_matrix: u64 => "const int*",
        /// local [num_tokens, n_pes], written: position in ring (c, d), -1 if not sent (handle 5)
        send_head: u64 => "int*",
        /// [n_pes, n_pes]: column my_pe used (handle 0)
        rank_prefix_matrix: u64 => "const int*",
        /// [n_pes, num_channels]: channel c's start among PE s's tokens (handle 2)
        recv_channel_prefix_matrix: u64 => "const int*",
        /// local [num_recv_rows, hidden_bytes]
        recv_x: u64 => "uint8_t*",
        /// local [num_recv_rows, num_scales] or null
        recv_x_scales: u64 => "float*",
        /// local [num_recv_rows]
        recv_src_idx: u64 => "int*",
        /// local [num_recv_rows, num_topk] (local expert ids or -1) or null
        recv_topk_idx: u64 => "int64_t*",
        /// local [num_recv_rows, num_topk] or null
        recv_topk_weights: u64 => "float*",
        /// symmetric: ring (c, s) at ((c * n_pes + s) * ring_tokens) slots
        nvl: u64 => "uint8_t*",
        /// symmetric [MAX_CHANNELS][MAX_PES]
        tails: u64 => "uint64_t*",
        /// symmetric [MAX_CHANNELS][MAX_PES]
        heads: u64 => "uint64_t*",
        /// local [MAX_CHANNELS][MAX_PES]
        sent: u64 => "uint64_t*",
        /// local [MAX_CHANNELS][MAX_PES]
        received: u64 => "uint64_t*",
        /// where a handle that delivers more than num_recv_rows rows is recorded (RECV_OVERFLOW)
        bad_input: InputError => "InputError",
        slot: DispatchSlot => "DispatchSlot",
        num_tokens: i32 => "int",
        num_experts: i32 => "int",
        num_channels: i32 => "int",
        ring_tokens: i32 => "int",
        num_recv_rows: i32 => "int",
    }

    /// Normal-mode combine (`moe_gather` in buffer/combine.cu).
    struct GatherArgs {
        /// local bf16 [num_recv_rows, hidden_bytes]: results for the tokens dispatch delivered here
        x: u64 => "const uint8_t*",
        /// local [num_recv_rows, num_topk] or null
        topk_weights: u64 => "const float*",
        /// local bf16 [num_tokens, hidden_bytes] or null
        bias0: u64 => "const uint8_t*",
        /// local bf16 [num_tokens, hidden_bytes] or null
        bias1: u64 => "const uint8_t*",
        /// handle 0
        rank_prefix_matrix: u64 => "const int*",
        /// handle 2
        recv_channel_prefix_matrix: u64 => "const int*",
        /// handle 5, [num_tokens, n_pes]
        send_head: u64 => "const int*",
        /// local bf16 [num_tokens, hidden_bytes]
        combined_x: u64 => "uint8_t*",
        /// local [num_tokens, num_topk] or null
        combined_topk_weights: u64 => "float*",
        /// symmetric: combine ring (c, s), slot = [row: hidden_bytes][weights: f32 x K]
        nvl: u64 => "uint8_t*",
        tails: u64 => "uint64_t*",
        heads: u64 => "uint64_t*",
        sent: u64 => "uint64_t*",
        received: u64 => "uint64_t*",
        /// where a handle that delivered more than num_recv_rows rows is recorded (RECV_OVERFLOW)
        bad_input: InputError => "InputError",
        num_tokens: i32 => "int",
        hidden_bytes: i32 => "int",
        num_topk: i32 => "int",
        num_channels: i32 => "int",
        ring_tokens: i32 => "int",
        slot_bytes: i32 => "int",
        /// rows of x and topk_weights: rows past them are never read
        num_recv_rows: i32 => "int",
    }
}
