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

    // The argument structs, by concern, in this order in contract.cuh (later parts use
    // earlier ones: the internode structs hold DispatchSlot, LlTopology, InputError).
    parts [collectives_structs, buffer_structs, low_latency_structs, internode_structs]
}

include!("collectives.rs");
include!("buffer.rs");
include!("low_latency.rs");
include!("internode.rs");
