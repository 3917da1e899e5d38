// Chapter 7: the layout step. From each token's top-k expert ids, on this PE alone: how many
// tokens go to each rank, to each node and to each expert, and which ranks each token goes to.
// A token counts once per rank (and once per node) however many of its experts live there;
// -1 means "no expert".
#include "moe.cuh"

using namespace moe;

// ANCHOR: layout
// topk_idx: local int64 [num_tokens, num_topk]; num_tokens_per_rank: local int32 [n_pes],
// num_tokens_per_rdma_rank: local int32 [n_pes / node_pes] or null (one node),
// num_tokens_per_expert: local int32 [num_experts], all zeroed before launch;
// is_token_in_rank: local bool [num_tokens, n_pes]. One thread per token; per-block counts
// in shared memory (ranks, experts, nodes), then one atomic per block and counter.
// A bad expert id is an input error, not a failure of the buffer: it goes to `input_error`
// (see record_input_error) and the host raises it at its next check.
extern "C" __global__ void __launch_bounds__(LAYOUT_THREADS)
    moe_layout(const int64_t* topk_idx, int num_tokens, int num_topk, int num_experts, int n, int node_pes,
               int* num_tokens_per_rank, int* num_tokens_per_rdma_rank, int* num_tokens_per_expert,
               bool* is_token_in_rank, InputError input_error) {
    extern __shared__ int shared_counts[];  // [n + num_experts + num_nodes]
    const int experts_per_rank = num_experts / n;
    const int num_nodes = num_tokens_per_rdma_rank ? n / node_pes : 0;
    const int num_counts = n + num_experts + num_nodes;
    int* rank_counts = shared_counts;
    int* expert_counts = shared_counts + n;
    int* node_counts = expert_counts + num_experts;
    for (int i = threadIdx.x; i < num_counts; i += blockDim.x) shared_counts[i] = 0;
    __syncthreads();
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < num_tokens; t += gridDim.x * blockDim.x) {
        const int64_t* ids = topk_idx + int64_t(t) * num_topk;
        bool* in_rank = is_token_in_rank + int64_t(t) * n;
        for (int r = 0; r < n; ++r) in_rank[r] = false;
        for (int k = 0; k < num_topk; ++k) {
            const int64_t expert = ids[k];
            if (expert < -1 || expert >= num_experts) {
                record_input_error(input_error, BAD_EXPERT, t, uint64_t(expert), num_experts);
                continue;
            }
            if (expert < 0) continue;
            atomicAdd(&expert_counts[expert], 1);
            // A rank (and a node) counts at the first of the token's experts there: no mask, so
            // any number of ranks (K <= MAX_TOPK earlier ids to compare, not n bits).
            const int rank = int(expert) / experts_per_rank;
            bool rank_seen = false, node_seen = false;
            for (int j = 0; j < k; ++j) {
                const int64_t earlier = ids[j];
                if (earlier < 0 || earlier >= num_experts) continue;
                const int earlier_rank = int(earlier) / experts_per_rank;
                rank_seen |= earlier_rank == rank;
                node_seen |= num_nodes > 0 && earlier_rank / node_pes == rank / node_pes;
            }
            if (rank_seen) continue;
            in_rank[rank] = true;
            atomicAdd(&rank_counts[rank], 1);
            if (num_nodes > 0 && !node_seen) atomicAdd(&node_counts[rank / node_pes], 1);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
        const int count = shared_counts[i];
        if (count == 0) continue;
        int* global = i < n ? &num_tokens_per_rank[i]
                      : i < n + num_experts ? &num_tokens_per_expert[i - n]
                                            : &num_tokens_per_rdma_rank[i - n - num_experts];
        atomicAdd(global, count);
    }
}
// ANCHOR_END: layout
