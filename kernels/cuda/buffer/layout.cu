// Chapter 7: the layout step. From each token's top-k expert ids, on this PE alone: how many
// tokens go to each rank, to each node and to each expert, and which ranks each token goes to.
// A token counts once per rank (and once per node) however many of its experts live there;
// -1 means "no expert".
#include "moe.cuh"

using namespace moe;

// ANCHOR: layout
// LayoutArgs (contract.cuh) says what each pointer holds; the counts are zeroed before launch.
// One thread per token; per-block counts in shared memory (ranks, experts, nodes), then one
// atomic per block and counter. A bad expert id is an input error, not a failure of the
// buffer: it goes to `a.bad_input` (see record_input_error) and the host raises it at its
// next check.
extern "C" __global__ void __launch_bounds__(LAYOUT_THREADS) moe_layout(const __grid_constant__ LayoutArgs a) {
    extern __shared__ int shared_counts[];  // [n + num_experts + num_nodes]
    const int n = a.n_pes;
    const int experts_per_rank = a.num_experts / n;
    const int num_nodes = a.num_tokens_per_rdma_rank ? n / a.node_pes : 0;
    const int num_counts = n + a.num_experts + num_nodes;
    int* rank_counts = shared_counts;
    int* expert_counts = shared_counts + n;
    int* node_counts = expert_counts + a.num_experts;
    for (int i = threadIdx.x; i < num_counts; i += blockDim.x) shared_counts[i] = 0;
    __syncthreads();
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < a.num_tokens; t += gridDim.x * blockDim.x) {
        const int64_t* ids = a.topk_idx + int64_t(t) * a.num_topk;
        bool* in_rank = a.is_token_in_rank + int64_t(t) * n;
        for (int r = 0; r < n; ++r) in_rank[r] = false;
        for (int k = 0; k < a.num_topk; ++k) {
            const int64_t expert = ids[k];
            if (expert < -1 || expert >= a.num_experts) {
                record_input_error(a.bad_input, BAD_EXPERT, t, uint64_t(expert), a.num_experts);
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
                if (earlier < 0 || earlier >= a.num_experts) continue;
                const int earlier_rank = int(earlier) / experts_per_rank;
                rank_seen |= earlier_rank == rank;
                node_seen |= num_nodes > 0 && earlier_rank / a.node_pes == rank / a.node_pes;
            }
            if (rank_seen) continue;
            in_rank[rank] = true;
            atomicAdd(&rank_counts[rank], 1);
            if (num_nodes > 0 && !node_seen) atomicAdd(&node_counts[rank / a.node_pes], 1);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < num_counts; i += blockDim.x) {
        const int count = shared_counts[i];
        if (count == 0) continue;
        int* global = i < n ? &a.num_tokens_per_rank[i]
                      : i < n + a.num_experts ? &a.num_tokens_per_expert[i - n]
                                            : &a.num_tokens_per_rdma_rank[i - n - a.num_experts];
        atomicAdd(global, count);
    }
}
// ANCHOR_END: layout
