// The host/device contract's argument structs, part: The buffer's low-latency mode (chapter 8).
// kernels/contract/defs.rs holds the limits and failure kinds and includes the parts in
// contract.cuh's order.

contract_structs! {
    fn low_latency_structs;

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
}
