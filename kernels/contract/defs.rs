// What the host (Rust) and the kernels (CUDA) share: limits, failure kinds and the argument
// structs the kernels take by value. The one definition of each; `contract.cuh` is generated
// from it (kernels/contract/macros.rs says how, and how the layouts are checked).

contract! {
    constants {
        // ---- chapter 4: the communicator ----
        /// Most PEs one communicator spans (its flag arrays are sized for it): one NVLink domain.
        MAX_PES: usize = 8 => "int";
        /// Most blocks one collective launches: the per-block ticket and epoch arrays are sized for it.
        MAX_BLOCKS: usize = 256 => "int";
        /// Steps one call may number in its tickets: ticket = epoch x STEPS_PER_EPOCH + step.
        STEPS_PER_EPOCH: u64 = 64 => "uint64_t";
        /// Threads per block of every collective but the barrier.
        COLL_THREADS: u32 = 512 => "int";
        /// Word of the local call state that says this PE failed (0 or 1).
        STATE_FAILED: usize = 2 => "int";
        /// First of the MAX_BLOCKS words of the local call state: the last finished call of each block slot.
        STATE_EPOCHS: usize = 4 => "int";
        /// u64 words of the local call state.
        STATE_WORDS: usize = STATE_EPOCHS + MAX_BLOCKS => "int";
        /// u64 words of the failure record: failed, pe, expected, seen, kind, block, call, unused.
        FAILURE_WORDS: usize = 8 => "int";

        // ---- chapter 7: the buffer's normal mode ----
        /// Most channels (num_sms / 2) the ring counters are sized for.
        MAX_CHANNELS: usize = 64 => "int";
        /// Threads per block of dispatch and combine (the most: a PE sharing its GPU may launch fewer).
        CHANNEL_THREADS: u32 = 1024 => "int";
        /// Tokens one dispatch ballot covers (one lane each): the window a sender publishes.
        WINDOW_TOKENS: u32 = 32 => "int";
        /// Most experts per token.
        MAX_TOPK: usize = 32 => "int";
        /// Channels of a row that share one fp8 scale (normal and low-latency mode).
        FP8_GROUP: usize = 128 => "int";
        /// Bytes before a dispatch slot's top-k ids: [src_idx: i32][pad: i32] (8-aligns the i64 ids).
        DISPATCH_SLOT_HEADER_BYTES: usize = 8 => "int";
        /// Threads per block of the layout step (`moe_layout`): one token per thread.
        LAYOUT_THREADS: u32 = 256 => "int";
        /// Threads per block of both notify kernels (`moe_notify_prepare`, `moe_notify_finish`).
        NOTIFY_THREADS: u32 = 256 => "int";
        /// u64 words of the input-error record: kind, token, value, limit.
        INPUT_ERROR_WORDS: usize = 4 => "int";

        // ---- chapter 8: low-latency mode ----
        /// Threads per block of low-latency dispatch and combine.
        LL_THREADS: u32 = 512 => "int";
        /// Most blocks of a low-latency launch (one per SM): LlState keeps a call count per block.
        MAX_LL_BLOCKS: usize = 256 => "int";
        /// Most ranks of a low-latency buffer, across nodes (DeepEP publishes EP256): the
        /// finish counters, the barrier words and the receive phase's per-source counts are sized
        /// for it. Chapter 4's MAX_PES stays what one node (one NVLink domain) may hold.
        MAX_LL_RANKS: usize = 256 => "int";
        /// Most experts in low-latency mode: LlState counts slots per expert.
        MAX_LL_EXPERTS: usize = 2048 => "int";
        /// Largest hidden size in low-latency mode: a row's fp8 scales are staged in shared memory.
        MAX_LL_HIDDEN: usize = 32768 => "int";
        /// Bytes before a low-latency dispatch message's row: [src token: i32][pad: i32 x 3]
        /// (16 keeps the row 16-byte aligned for vector copies).
        LL_MSG_HEADER_BYTES: usize = 16 => "int";
        /// UE8M0 scales (exponent bytes) packed into one i32 of `recv_x_scales`: hidden must be a
        /// multiple of FP8_GROUP x UE8M0_PER_INT.
        UE8M0_PER_INT: usize = 4 => "int";
        /// `phases` of a low-latency launch: the send half, the receive half, or both (3).
        PHASE_SEND: i32 = 1 => "int";
        PHASE_RECV: i32 = 2 => "int";

        // ---- chapter 5: RMA groups (PEs that reach each other only by NVSHMEM's RMA calls) ----
        /// Most members of one RMA group: the nodes of a rail, or the PEs of a flat call.
        MAX_GROUP: usize = 64 => "int";
        /// Most blocks of one RMA launch: tickets are kept per block.
        MAX_RMA_BLOCKS: usize = 32 => "int";
        /// Steps of one RMA call that raise tickets of their own (reduce-scatter then all-gather).
        RMA_STEPS: usize = 2 => "int";
        /// Threads per block of the RMA kernels (NVSHMEM's block-scoped puts copy with all of them).
        RMA_THREADS: u32 = 512 => "int";

        // ---- the buffer across nodes: normal mode (issue 32) ----
        /// Most ranks of a normal-mode buffer across nodes (DeepEP's internode range, EP16-EP64).
        MAX_NORMAL_RANKS: usize = 64 => "int";
        /// Most nodes of a normal-mode buffer (chapter 5's MAX_GROUP: a rail is an RMA group).
        MAX_NODES: usize = MAX_GROUP => "int";
        /// Blocks of `internode_notify`: block 0 receives, block 1 + k builds the rail row for node k.
        MAX_NOTIFY_BLOCKS: usize = 1 + MAX_NODES => "int";
        /// Threads per block of `internode_notify`.
        INTERNODE_NOTIFY_THREADS: u32 = 256 => "int";
        /// Most chunks of one RDMA ring (num_max_rdma_chunked_recv_tokens / _send_tokens): the
        /// dispatch keeps a signal word per chunk of each ring (internode_dispatch.cu, NOTES).
        MAX_RDMA_CHUNKS: usize = 32 => "int";
        /// Most blocks of `internode_dispatch` (two per channel): it counts calls per block.
        MAX_DISPATCH_BLOCKS: usize = 2 * MAX_CHANNELS => "int";
        /// Warps of an `internode_dispatch` sender block that copy tokens into the RDMA rings; the
        /// block's other warps receive from the NVL rings.
        RDMA_SENDER_WARPS: usize = 8 => "int";
        /// Warps of an `internode_combine` block 2c that send rows back into the NVL sub-rings
        /// (a group per forwarder of the node); the block's other warps are the home receivers.
        COMBINE_SENDER_WARPS: usize = 8 => "int";
        /// Rows an `internode_combine` NVL sender publishes at once (at most: a sub-ring also
        /// holds a forwarder's chunk beside them, internode_combine.cu NOTES).
        COMBINE_NVL_WINDOW: usize = 16 => "int";
    }

    failures {
        /// a peer never entered the call
        Ready = 1 => WAIT_READY;
        /// a peer's block never finished writing into our buffers
        Done = 2 => WAIT_DONE;
        /// a peer's LL lines never came
        Ll = 3 => WAIT_LL;
        /// a peer's row of all-to-all-v counts never came
        Counts = 4 => WAIT_COUNTS;
        /// a PE's all-to-all-v splits are negative or exceed its input
        BadSplits = 5 => BAD_SPLITS;
        /// a PE would receive more all-to-all-v rows than its output holds
        OutputTooSmall = 6 => OUT_TOO_SMALL;
        /// a dispatch or combine sender waited for ring space the receiver never freed
        RingSpace = 7 => WAIT_RING_SPACE;
        /// a dispatch or combine receiver waited for tokens that never came
        RingData = 8 => WAIT_RING_DATA;
        /// topk_idx held a value outside [-1, num_experts)
        BadExpert = 9 => BAD_EXPERT;
        /// a low-latency dispatch waited for a rank's counts
        LlDispatch = 10 => WAIT_LL_DISPATCH;
        /// a low-latency combine waited for a rank's results
        LlCombine = 11 => WAIT_LL_COMBINE;
        /// a low-latency handle's row named no source, or a token >= T
        BadHandle = 12 => BAD_HANDLE;
        /// a low-latency expert got more than T tokens from one rank
        SlotsFull = 13 => SLOTS_FULL;
        /// a rank received more tokens than its dispatch outputs hold (num_worst_tokens too small)
        RecvOverflow = 14 => RECV_OVERFLOW;
        /// num_tokens_per_rank disagreed with the tokens is_token_in_rank sends
        CountsMismatch = 15 => COUNTS_MISMATCH;
        /// a low-latency kernel asked for a peer pointer to a rank of another node (a route bug:
        /// across nodes only NVSHMEM's RMA calls may reach a rank)
        CrossNodePointer = 16 => CROSS_NODE_POINTER;
        /// a rank never reached a low-latency buffer's barrier (clean_low_latency_buffer across nodes)
        LlBarrier = 17 => WAIT_LL_BARRIER;
        /// a PE of another node never entered the call (chapter 5's RMA groups)
        RemoteReady = 20 => WAIT_REMOTE_READY;
        /// a PE of another node entered the call but its data never arrived
        RemoteData = 21 => WAIT_REMOTE_DATA;
        /// a PE would send one node more all-to-all-v rows than the receiver's slot holds
        SlotOverflow = 22 => SLOT_OVERFLOW;
        /// a rank's notify rail row (or its cached notify's signal) never came from another node
        NotifyRows = 23 => WAIT_NOTIFY_ROWS;
        /// num_tokens_per_rdma_rank disagreed with the tokens is_token_in_rank sends to a node
        NodeCountsMismatch = 24 => NODE_COUNTS_MISMATCH;
        /// a cached notify's handle: its channel prefixes disagree with its is_token_in_rank
        HandleMismatch = 25 => HANDLE_MISMATCH;
        /// an internode dispatch sender waited for RDMA ring space its rail peer never freed
        RdmaSpace = 26 => WAIT_RDMA_SPACE;
        /// an internode dispatch forwarder waited for a chunk its rail peer never sent
        RdmaData = 27 => WAIT_RDMA_DATA;
        /// an internode combine forwarder waited for RDMA ring space its rail peer's home
        /// receivers never freed
        CombineRdmaSpace = 28 => WAIT_COMBINE_RDMA_SPACE;
        /// an internode combine home receiver waited for a chunk its rail peer's forwarder never sent
        CombineRdmaData = 29 => WAIT_COMBINE_RDMA_DATA;
        /// an internode combine NVL sender waited for sub-ring space a forwarder of its node never freed
        CombineNvlSpace = 30 => WAIT_COMBINE_NVL_SPACE;
        /// an internode combine forwarder waited for rows a member of its node never sent
        CombineNvlData = 31 => WAIT_COMBINE_NVL_DATA;
    }

    /// The communicator as every chapter-4 kernel receives it (by value, first argument).
    struct Workspace {
        /// local device [STATE_WORDS] u64: failed at STATE_FAILED, epochs per block slot from STATE_EPOCHS
        state: u64 => "uint64_t*",
        /// host-mapped [FAILURE_WORDS] u64: failed, pe, expected, seen, kind, block, call, -
        error: u64 => "uint64_t*",
        /// symmetric [MAX_PES] u64: ready[p] = the last call PE p announced
        ready: u64 => "uint64_t*",
        /// symmetric [MAX_PES][MAX_BLOCKS] u64: tickets, by writer and block
        done: u64 => "uint64_t*",
        /// symmetric [2][MAX_PES][MAX_PES] u64: (epoch << 32 | rows), by parity and sender
        counts: u64 => "uint64_t*",
        /// symmetric [2][n_pes][ll_slot_bytes]: LL lines, by parity and sender
        ll: u64 => "uint8_t*",
        /// bytes of one LL slot: twice the largest LL payload
        ll_slot_bytes: u64 => "uint64_t",
        /// bound on every wait, in SM clock cycles
        timeout_cycles: i64 => "long long",
        my_pe: i32 => "int",
        n_pes: i32 => "int",
        /// peer_delta[p] = nvshmem_ptr(x, p) - x for any symmetric x (0 for us and past n_pes)
        peer_delta: [i64; MAX_PES] => "int64_t" "[MAX_PES]",
    }

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

    /// Per-rank device state of low-latency mode (local memory, zeroed at creation).
    struct LlState {
        /// calls[b]: the last low-latency call block b finished
        calls: [u64; MAX_LL_BLOCKS] => "unsigned long long" "[MAX_LL_BLOCKS]",
        /// blocks done writing to each rank in the current call
        finish: [u32; MAX_LL_RANKS] => "unsigned int" "[MAX_LL_RANKS]",
        /// tokens sent to each global expert in the current dispatch
        slots: [i32; MAX_LL_EXPERTS] => "int" "[MAX_LL_EXPERTS]",
    }

    /// One half of every rank's low-latency region and the control words, as this rank
    /// addresses its own copy.
    struct LlRegion {
        /// symmetric: half h, area x (what rank x sends us, or what we stage for x) at x * area_bytes
        data: [u64; 2] => "uint8_t*" "[2]",
        /// symmetric [2][MAX_LL_EXPERTS] u64: counts[h][s * L + e] = (call << 32) | rows, written by s only
        counts: [u64; 2] => "uint64_t*" "[2]",
        /// bytes between two areas of a half: set by the region's size, the same for every call
        area_bytes: u64 => "uint64_t",
    }

    /// Where a low-latency call's ranks live: world ranks in nodes of node_pes consecutive
    /// ranks (chapter 5's topology). Ranks of this node are reached through peer pointers
    /// (the communicator's members, node_start + i), any other only through NVSHMEM's RMA calls.
    struct LlTopology {
        rank: i32 => "int",
        num_ranks: i32 => "int",
        node_start: i32 => "int",
        node_pes: i32 => "int",
    }

    /// The barrier of a low-latency buffer that spans nodes (`ll_barrier` in buffer/ll_barrier.cu).
    struct LlBarrierArgs {
        /// symmetric [MAX_LL_RANKS] u64: words[s] = the barriers rank s entered (signal adds)
        words: u64 => "uint64_t*",
        /// barriers this rank has entered, this one included
        target: u64 => "uint64_t",
        topo: LlTopology => "LlTopology",
    }

    /// Low-latency dispatch.
    struct LlDispatchArgs {
        /// [N][hidden] bf16
        x: u64 => "const uint8_t*",
        /// [N][K] global expert ids or -1
        topk_idx: u64 => "const int64_t*",
        /// [L][n_pes * T][hidden] fp8 or bf16
        recv_x: u64 => "uint8_t*",
        /// fp8: f32 [L][hidden/128][n_pes * T]; ue8m0: u8 [L][hidden/512][n_pes * T][4]
        recv_scales: u64 => "void*",
        /// [L][n_pes * T]
        recv_src_info: u64 => "int*",
        /// [L][n_pes]: (begin << 32) | count
        recv_layout_range: u64 => "int64_t*",
        /// [L]
        recv_count: u64 => "int*",
        /// [L] or null
        cumulative_recv_stats: u64 => "int*",
        /// [n_pes] or null: cycles spent waiting per source
        wait_recv_cost: u64 => "int64_t*",
        region: LlRegion => "LlRegion",
        topo: LlTopology => "LlTopology",
        state: u64 => "LlState*",
        bad_input: InputError => "InputError",
        num_tokens: i32 => "int",
        hidden: i32 => "int",
        num_topk: i32 => "int",
        num_experts: i32 => "int",
        max_tokens: i32 => "int",
        use_fp8: i32 => "int",
        round_scale: i32 => "int",
        use_ue8m0: i32 => "int",
    }

    /// Low-latency combine.
    struct LlCombineArgs {
        /// [L][n_pes * T][hidden] bf16 (or the staging region)
        x: u64 => "const uint8_t*",
        /// [L][n_pes * T]
        src_info: u64 => "const int*",
        /// [L][n_pes]
        layout_range: u64 => "const int64_t*",
        /// [N][K]
        topk_idx: u64 => "const int64_t*",
        /// [N][K]
        topk_weights: u64 => "const float*",
        /// [N][hidden] bf16
        out: u64 => "uint8_t*",
        /// [n_pes] or null
        wait_recv_cost: u64 => "int64_t*",
        region: LlRegion => "LlRegion",
        topo: LlTopology => "LlTopology",
        state: u64 => "LlState*",
        bad_input: InputError => "InputError",
        num_tokens: i32 => "int",
        hidden: i32 => "int",
        num_topk: i32 => "int",
        num_experts: i32 => "int",
        max_tokens: i32 => "int",
    }

    /// A group of PEs that reach each other through NVSHMEM's RMA calls only (chapter 5: the
    /// PEs of a rail, one per node, or every PE for the flat algorithms): member i is world PE
    /// start + i x stride. Every chapter-5 kernel that crosses nodes receives it by value.
    struct RmaWorkspace {
        /// local device [STATE_WORDS] u64: failed at STATE_FAILED, epochs per block slot from STATE_EPOCHS
        state: u64 => "uint64_t*",
        /// host-mapped [FAILURE_WORDS] u64: the failure record, naming world PEs
        error: u64 => "uint64_t*",
        /// symmetric [MAX_GROUP] u64: ready[i] = the calls member i entered (signal adds)
        ready: u64 => "uint64_t*",
        /// symmetric [RMA_STEPS][MAX_GROUP][MAX_RMA_BLOCKS] u64: tickets, by step, sender and block
        done: u64 => "uint64_t*",
        /// symmetric [MAX_GROUP][MAX_GROUP] u64: all-to-all-v rows of counts, by sender then destination PE
        counts: u64 => "uint64_t*",
        /// symmetric [scratch_bytes]: where reduce-scatter parts and all-to-all-v rows land
        scratch: u64 => "uint8_t*",
        scratch_bytes: u64 => "uint64_t",
        /// bound on every wait, in SM clock cycles
        timeout_cycles: i64 => "long long",
        /// member i is world PE start + i * stride
        start: i32 => "int",
        stride: i32 => "int",
        size: i32 => "int",
        /// this PE's member index
        me: i32 => "int",
    }

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
    /// [weights: f32 x K], padded to 16 bytes (`slot.bytes`).
    struct InternodeDispatchArgs {
        /// local [num_tokens, hidden_bytes] (bf16 rows)
        x: u64 => "const uint8_t*",
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
        /// local [num_recv_rows, 2] i32: source node, in-node mask (handle 7, 8 bytes a row)
        recv_src_meta: u64 => "int*",
        /// local [num_recv_rows, num_topk] (local expert ids or -1) or null
        recv_topk_idx: u64 => "int64_t*",
        /// local [num_recv_rows, num_topk] or null
        recv_topk_weights: u64 => "float*",
        /// local [num_tokens, N] i32 (handle 8), written: index in the channel's stream to node k, or -1
        send_rdma_head: u64 => "int*",
        /// local [num_forwarded_rows, G] i32 (handle 9), written: index in NVL stream (c, l'), or -1
        send_nvl_head: u64 => "int*",
        /// local [MAX_DISPATCH_BLOCKS] u64: the dispatches each block finished
        calls: u64 => "uint64_t*",
        /// symmetric: NVL ring (c, l) at slot (c G + l) R_n, on the receiver
        nvl: u64 => "uint8_t*",
        /// chapter 7's dispatch counters, [MAX_CHANNELS][MAX_PES] by node member
        nvl_counters: NvlCounters => "NvlCounters",
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
