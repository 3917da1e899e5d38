// Chapter 7: the layout step. From each token's top-k expert ids, on this PE alone: how many
// tokens go to each rank and to each expert, and which ranks each token goes to. A token
// counts once per rank however many of its experts live there; -1 means "no expert".
#include "moe.cuh"

using namespace moe;

// A token's ranks are one bit each of a 32-bit mask; the plan refuses more ranks.
static_assert(MAX_LAYOUT_RANKS <= 32, "moe_layout's rank mask is a uint32_t");

// ANCHOR: layout
// topk_idx: local int64 [num_tokens, num_topk]; num_tokens_per_rank: local int32 [n_pes],
// num_tokens_per_expert: local int32 [num_experts], both zeroed before launch;
// is_token_in_rank: local bool [num_tokens, n_pes]. One thread per token; per-block counts
// in shared memory (n_pes + num_experts ints), then one atomic per block and counter.
// A bad expert id is an input error, not a failure of the buffer: it goes to `input_error`
// (see record_input_error) and the host raises it at its next check.
extern "C" __global__ void __launch_bounds__(LAYOUT_THREADS) moe_layout(const int64_t* topk_idx, int num_tokens, int num_topk,
                                                                        int num_experts, int n, int* num_tokens_per_rank,
                                                                        int* num_tokens_per_expert, bool* is_token_in_rank,
                                                                        InputError input_error) {
    extern __shared__ int shared_counts[];  // [n + num_experts]
    const int experts_per_rank = num_experts / n;
    int* rank_counts = shared_counts;
    int* expert_counts = shared_counts + n;
    for (int i = threadIdx.x; i < n + num_experts; i += blockDim.x) shared_counts[i] = 0;
    __syncthreads();
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < num_tokens; t += gridDim.x * blockDim.x) {
        uint32_t ranks = 0;
        for (int k = 0; k < num_topk; ++k) {
            const int64_t expert = topk_idx[int64_t(t) * num_topk + k];
            if (expert < -1 || expert >= num_experts) {
                record_input_error(input_error, BAD_EXPERT, t, uint64_t(expert), num_experts);
                continue;
            }
            if (expert < 0) continue;
            ranks |= 1u << (expert / experts_per_rank);
            atomicAdd(&expert_counts[expert], 1);
        }
        for (int r = 0; r < n; ++r) {
            const bool in_rank = (ranks >> r) & 1;
            is_token_in_rank[int64_t(t) * n + r] = in_rank;
            if (in_rank) atomicAdd(&rank_counts[r], 1);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n + num_experts; i += blockDim.x) {
        const int count = shared_counts[i];
        if (count == 0) continue;
        atomicAdd(i < n ? &num_tokens_per_rank[i] : &num_tokens_per_expert[i - n], count);
    }
}
// ANCHOR_END: layout
