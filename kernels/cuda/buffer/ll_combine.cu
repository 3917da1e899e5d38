// Chapter 8: low-latency combine. The send phase stores every expert result into its token's
// rank; the receive phase sums each token's results with its top-k weights (the layout and
// the protocol's NOTES: low_latency.cuh).
#include "low_latency.cuh"

// Vectors of a row each thread of combine's receive sums at once (NVCC_FLAGS can set it for an
// A/B; benchmarks/notes/buffer.md).
#ifndef LL_COMBINE_VECTORS_PER_THREAD
#define LL_COMBINE_VECTORS_PER_THREAD 2
#endif

namespace nvshmem_tutorial {

__device__ __forceinline__ int global_warp() { return blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE; }
__device__ __forceinline__ int num_global_warps() { return gridDim.x * (blockDim.x / WARP_SIZE); }

// Exclusive prefix sum of `data[0..n)` in shared memory, in place; returns the total. Every
// thread of the block calls it.
__device__ inline int block_exclusive_scan(int* data, int n) {
    __shared__ int warp_sums[WARP_SIZE];  // one per warp: at most 32 warps a block
    __shared__ int total;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int begin = min(n, static_cast<int>(threadIdx.x) * per), end = min(n, begin + per);
    int sum = 0;
    for (int i = begin; i < end; ++i) sum += data[i];
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int inclusive = sum;
    for (int d = 1; d < WARP_SIZE; d *= 2) {
        const int v = __shfl_up_sync(ALL_LANES, inclusive, d);
        if (lane >= d) inclusive += v;
    }
    if (lane == WARP_SIZE - 1) warp_sums[warp] = inclusive;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int w = 0; w < static_cast<int>(blockDim.x / WARP_SIZE); ++w) {
            const int s = warp_sums[w];
            warp_sums[w] = run;
            run += s;
        }
        total = run;
    }
    __syncthreads();
    int run = warp_sums[warp] + inclusive - sum;
    for (int i = begin; i < end; ++i) {
        const int v = data[i];
        data[i] = run;
        run += v;
    }
    __syncthreads();
    return total;
}

// The largest i in [0, n) with prefix[i] <= value (prefix ascending, prefix[0] = 0).
__device__ __forceinline__ int find_run(const int* prefix, int n, int value) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= value) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Waits for every (source, expert) count word of call k in half h, a thread each, the
// source's wait cycles added to `cost[s]` (block 0 only). The block learns whether every word came.
__device__ __forceinline__ bool wait_all_sources(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k, Failure what,
                                                 int64_t* cost) {
    __shared__ int all_came;
    if (threadIdx.x == 0) all_came = 1;
    __syncthreads();
    const int L = a.num_experts / a.topo.num_ranks;
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) {
        const int s = j / L;
        const long long start = clock64();
        if (!wait_at_least(ws, a.region.counts[h] + j, k << 32, what, failure_rank(a.topo, s), k)) all_came = 0;
        if (cost != nullptr && blockIdx.x == 0)
            atomicAdd(reinterpret_cast<unsigned long long*>(cost + s), static_cast<unsigned long long>(clock64() - start));
    }
    __syncthreads();
    return all_came;
}

// Packed rows of a call as runs in shared memory: run (local expert e, source s) is rows
// [begin, begin + count) of expert e, indexed [s * L + e]; the experts' rows follow each other
// over the call, expert e's from first_row[e]. Combine's send walks the handle's rows this way,
// every warp of the grid taking rows of any expert.
struct PackedRuns {
    int* begin;
    int* count;
    int* first_row;  // [L + 1]
    int L, n;

    // The shared arrays of this kernel (one call per kernel).
    __device__ static PackedRuns of_kernel(int L, int n) {
        __shared__ int begin[MAX_LL_EXPERTS], count[MAX_LL_EXPERTS], first_row[MAX_LL_EXPERTS + 1];
        return PackedRuns{begin, count, first_row, L, n};
    }

    // After every thread filled begin and count (and the block synchronised): each expert's
    // first row over the call. Returns the call's rows.
    __device__ int index_experts() {
        for (int e = threadIdx.x; e < L; e += blockDim.x) {
            int rows = 0;
            for (int s = 0; s < n; ++s) rows += count[s * L + e];
            first_row[e] = rows;
        }
        __syncthreads();
        const int total = block_exclusive_scan(first_row, L);
        if (threadIdx.x == 0) first_row[L] = total;
        __syncthreads();
        return total;
    }

    // Row g of the call: its expert, its row within the expert, and the source whose run
    // holds it (-1 if none does: a handle that does not match its data).
    __device__ void locate(int g, int* e, int* i, int* s) const {
        *e = find_run(first_row, L + 1, g);
        *i = g - first_row[*e];
        *s = -1;
        for (int p = 0; p < n; ++p) {
            if (*i >= begin[p * L + *e] && *i < begin[p * L + *e] + count[p * L + *e]) *s = p;
        }
    }
};

// ANCHOR: combine_send
// Send phase: every warp of the grid takes packed rows; row i of local expert e goes back to
// the source rank s it came from, at its place j in run (e, s), the slot the token took in
// dispatch (token-ordered, so s finds it from its topk_idx): into our area of s's half
// (same node), or of our idle half, from where the run leaves as one put (another node).
__device__ __forceinline__ void combine_send(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k) {
    const int n = a.topo.num_ranks, me = a.topo.rank, L = a.num_experts / n, T = a.max_tokens;
    PackedRuns runs = PackedRuns::of_kernel(L, n);  // from the handle's layout_range
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) {
        const int e = j / n, s = j % n;  // layout_range is [L][n_pes]
        const int64_t range = __ldg(a.layout_range + j);
        runs.begin[s * L + e] = static_cast<int>(range >> 32);
        runs.count[s * L + e] = static_cast<int>(range & 0xffffffff);
    }
    __syncthreads();
    const int total_rows = runs.index_experts();
    const int row_bytes = a.hidden * int(sizeof(__nv_bfloat16));
    const int lane = threadIdx.x % WARP_SIZE;
    for (int g = global_warp(); g < total_rows; g += num_global_warps()) {
        int e, i, s;
        runs.locate(g, &e, &i, &s);
        const int64_t packed = static_cast<int64_t>(e) * n * T + i;
        const int t = __ldg(a.src_info + packed);
        const int j = s < 0 ? -1 : i - runs.begin[s * L + e];  // the row's place in its run
        if (s < 0 || t < 0 || t >= T || j >= T) {
            if (lane == 0) moe::record_input_error(a.bad_input, BAD_HANDLE, packed, static_cast<uint64_t>(t), T);
            continue;  // s's words still come: completion counts blocks, not rows
        }
        // Same node: the row's slot is its token, where s reads it without token_slots.
        // Another node: its place in the run, which leaves as one put.
        const bool near = same_node(a.topo, s);
        const uint64_t offset = (static_cast<uint64_t>(e) * T + (near ? t : j)) * row_bytes;
        uint8_t* row = near ? node_peer(ws, a.topo, area(a.region, h, me) + offset, s) : area(a.region, h ^ 1, s) + offset;
        if (row != nullptr) warp_copy<false>(row, a.x + packed * row_bytes, row_bytes, lane);
    }
    const int warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    auto count = [&](int s, int e) { return min(max(runs.count[s * L + e], 0), T); };
    finish_sends(ws, a.topo, a.region, a.state, h, L, k, count, [&](int s) {
        // Another node: our runs for s, a put-with-signal each, a warp each.
        for (int e = warp; e < L; e += warps) {
            publish_run(ws, a.topo, a.region, h, s, e, L, (k << 32) | static_cast<uint32_t>(count(s, e)),
                        static_cast<uint64_t>(e) * T * row_bytes, static_cast<size_t>(count(s, e)) * row_bytes, lane);
        }
    });
}
// ANCHOR_END: combine_send

// Where token t's rows wait, into slot[]: a same-node expert's at slot t, another node's at
// its place in the run (token_slots, a scan of the tokens before t: run only when needed).
// expert[] holds the token's checked ids; every thread of the block calls it.
__device__ __forceinline__ void row_slots(const LlCombineArgs& a, int t, int K, int L, const int* expert, int* slot) {
    bool remote = false;  // the same for every thread: shared values
    for (int i = 0; i < K; ++i) remote |= expert[i] >= 0 && !same_node(a.topo, expert[i] / L);
    if (remote) token_slots(a.topk_idx, t, K, expert, slot);
    if (threadIdx.x < K && expert[threadIdx.x] >= 0 && same_node(a.topo, expert[threadIdx.x] / L)) slot[threadIdx.x] = t;
    __syncthreads();
}

// Token t's output: the sum over its top-k of weight x the row its expert sent back, in fp32,
// rounded to bf16 once. Each thread sums kVectorsPerThread vectors of the row (blockDim.x apart)
// with every row's loads issued first: at hidden 7168 (896 vectors) and 512 threads, one memory
// round per token instead of two.
__device__ __forceinline__ void sum_token(const LlCombineArgs& a, int h, int t, const int* expert, const int* slot,
                                          const float* weight) {
    const int K = a.num_topk, T = a.max_tokens, L = a.num_experts / a.topo.num_ranks;
    const int vectors = a.hidden / BF16_PER_VECTOR;
    constexpr int kRowsInFlight = 8;  // experts' rows loaded before any is summed
    constexpr int kVectorsPerThread = LL_COMBINE_VECTORS_PER_THREAD;
    for (int v0 = threadIdx.x; v0 < vectors; v0 += kVectorsPerThread * blockDim.x) {
        float acc[kVectorsPerThread][BF16_PER_VECTOR] = {};
        for (int first = 0; first < K; first += kRowsInFlight) {
            uint4 raw[kVectorsPerThread][kRowsInFlight];
#pragma unroll
            for (int j = 0; j < kRowsInFlight; ++j) {
                const int i = first + j;
                if (i < K && expert[i] >= 0 && slot[i] < T) {
                    const uint4* src = reinterpret_cast<const uint4*>(
                        area(a.region, h, expert[i] / L) +
                        (static_cast<uint64_t>(expert[i] % L) * T + slot[i]) * a.hidden * int(sizeof(__nv_bfloat16)));
#pragma unroll
                    for (int u = 0; u < kVectorsPerThread; ++u) {
                        const int v = v0 + u * blockDim.x;
                        if (v < vectors) raw[u][j] = __ldcg(src + v);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < kRowsInFlight; ++j) {
                const int i = first + j;
                if (i >= K || expert[i] < 0 || slot[i] >= T) continue;  // none, or dropped (a full run)
#pragma unroll
                for (int u = 0; u < kVectorsPerThread; ++u) {
                    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[u][j]);
#pragma unroll
                    for (int c = 0; c < BF16_PER_VECTOR / 2; ++c) {
                        const float2 f = __bfloat1622float2(pairs[c]);
                        acc[u][2 * c] += weight[i] * f.x;
                        acc[u][2 * c + 1] += weight[i] * f.y;
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kVectorsPerThread; ++u) {
            const int v = v0 + u * blockDim.x;
            if (v >= vectors) continue;
            uint4 out;
            auto* pairs = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
            for (int j = 0; j < BF16_PER_VECTOR / 2; ++j) pairs[j] = __floats2bfloat162_rn(acc[u][2 * j], acc[u][2 * j + 1]);
            reinterpret_cast<uint4*>(a.out + static_cast<int64_t>(t) * a.hidden * int(sizeof(__nv_bfloat16)))[v] = out;
        }
    }
}

// ANCHOR: combine_recv
// Receive phase: block b takes tokens b, b + G, ...; each token's rows are found
// (row_slots) and summed with its top-k weights (sum_token).
__device__ __forceinline__ void combine_recv(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k) {
    __shared__ int expert[MAX_TOPK], slot[MAX_TOPK];
    __shared__ float weight[MAX_TOPK];
    if (!wait_all_sources(ws, a, h, k, WAIT_LL_COMBINE, a.wait_recv_cost)) return;
    const int K = a.num_topk, L = a.num_experts / a.topo.num_ranks;
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
        __syncthreads();
        if (threadIdx.x < K) {
            const int64_t e = __ldg(a.topk_idx + t * K + threadIdx.x);
            const bool ok = valid_expert(a.bad_input, e, a.num_experts, t);
            expert[threadIdx.x] = ok ? static_cast<int>(e) : -1;
            weight[threadIdx.x] = __ldg(a.topk_weights + t * K + threadIdx.x);
        }
        __syncthreads();
        row_slots(a, t, K, L, expert, slot);  // where each row waits in its area
        sum_token(a, h, t, expert, slot, weight);
    }
}
// ANCHOR_END: combine_recv

__global__ void __launch_bounds__(LL_THREADS) combine(Workspace ws, LlCombineArgs args, int phases) {
    run_call(ws, args, phases, combine_send, combine_recv);
}

}  // namespace nvshmem_tutorial
