// Chapter 8: low-latency combine. The send phase stores every expert result into its token's
// rank; the receive phase sums each token's results with its top-k weights (the layout and
// the protocol's NOTES: low_latency.cuh).
#include "low_latency.cuh"

namespace nvshmem_tutorial {

struct LlCombineArgs {
    const uint8_t* x;                  // [L][n_pes * T][hidden] bf16 (or the staging region)
    const int* src_info;               // [L][n_pes * T]
    const int64_t* layout_range;       // [L][n_pes]
    const int64_t* topk_idx;           // [N][K]
    const float* topk_weights;         // [N][K]
    uint8_t* out;                      // [N][hidden] bf16
    int64_t* wait_recv_cost;           // [n_pes] or null
    LlRegion region;
    LlState* state;
    moe::InputError bad_input;
    int num_tokens, hidden, num_topk, num_experts, max_tokens;
};

// ANCHOR: combine_send
// Send phase: every warp of the grid takes packed rows; row i of local expert e goes back to
// the source rank s it came from, into s's slot (global expert, source token).
__device__ __forceinline__ void combine_send(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k) {
    const int n = ws.n_pes, me = ws.my_pe, L = a.num_experts / n, T = a.max_tokens;
    PackedRuns runs = PackedRuns::of_kernel(L, n);  // from the handle's layout_range
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) {
        const int e = j / n, s = j % n;  // layout_range is [L][n_pes]
        const int64_t range = __ldg(a.layout_range + j);
        runs.begin[s * L + e] = static_cast<int>(range >> 32);
        runs.count[s * L + e] = static_cast<int>(range & 0xffffffff);
    }
    __syncthreads();
    const int total_rows = runs.index_experts();
    const int row_bytes = a.hidden * 2;
    const int lane = threadIdx.x % 32;
    for (int g = global_warp(); g < total_rows; g += num_global_warps()) {
        int e, i, s;
        runs.locate(g, &e, &i, &s);
        const int64_t packed = static_cast<int64_t>(e) * n * T + i;
        const int t = __ldg(a.src_info + packed);
        if (s < 0 || t < 0 || t >= T) {
            if (lane == 0) a.bad_input.record(moe::BAD_HANDLE, packed, static_cast<uint64_t>(t), T);
            continue;  // s's flag still rises: completion counts blocks, not rows
        }
        uint8_t* slot = peer(ws, a.region.data[h] + (static_cast<int64_t>(me * L + e) * T + t) * row_bytes, s);
        warp_copy_deep<false>(slot, a.x + packed * row_bytes, row_bytes, lane);
    }
    finish_sends(ws, a.state, [&](int pe) {
        if (threadIdx.x == 0) st_release_sys(peer(ws, a.region.flags[h] + me, pe), k);
    });
}
// ANCHOR_END: combine_send

// ANCHOR: combine_recv
// Receive phase: token t's result is the sum over its top-k of weight x the row its expert
// sent back, in fp32, rounded to bf16 once.
__device__ __forceinline__ void combine_recv(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k) {
    __shared__ int expert[MAX_TOPK];
    __shared__ float weight[MAX_TOPK];
    if (!wait_all_sources(ws, a.region, h, k, WAIT_LL_COMBINE, a.wait_recv_cost)) return;
    const int K = a.num_topk, T = a.max_tokens;
    const int vectors = a.hidden / 8;  // 8 bf16 per 16 bytes
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
        __syncthreads();
        if (threadIdx.x < K) {
            const int64_t e = __ldg(a.topk_idx + t * K + threadIdx.x);
            const bool ok = valid_expert(a.bad_input, e, a.num_experts, t);
            expert[threadIdx.x] = ok ? static_cast<int>(e) : -1;
            weight[threadIdx.x] = __ldg(a.topk_weights + t * K + threadIdx.x);
        }
        __syncthreads();
        for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            // Up to 8 experts' rows loaded before any is summed: one memory latency per 8.
            for (int first = 0; first < K; first += 8) {
                uint4 raw[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int i = first + j;
                    if (i < K && expert[i] >= 0) {
                        const uint4* src = reinterpret_cast<const uint4*>(
                            a.region.data[h] + (static_cast<int64_t>(expert[i]) * T + t) * a.hidden * 2);
                        raw[j] = __ldcg(src + v);
                    }
                }
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int i = first + j;
                    if (i >= K || expert[i] < 0) continue;
                    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const float2 f = __bfloat1622float2(pairs[c]);
                        acc[2 * c] += weight[i] * f.x;
                        acc[2 * c + 1] += weight[i] * f.y;
                    }
                }
            }
            uint4 out;
            auto* pairs = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
            for (int j = 0; j < 4; ++j) pairs[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
            reinterpret_cast<uint4*>(a.out + static_cast<int64_t>(t) * a.hidden * 2)[v] = out;
        }
    }
}
// ANCHOR_END: combine_recv

__global__ void __launch_bounds__(512) combine(Workspace ws, LlCombineArgs args, int phases) {
    run_call(ws, args, phases, combine_send, combine_recv);
}

}  // namespace nvshmem_tutorial
