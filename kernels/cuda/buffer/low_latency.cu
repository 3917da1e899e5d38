// Chapter 8: low-latency dispatch and combine, for decoding.
//
// A decoding step moves few tokens (tens to hundreds per rank), so its cost is latency: kernel
// launches, round trips, fences. Normal mode (intranode.cu) first exchanges counts (the notify
// step) so that every token lands in its final row; here nothing is exchanged before the data.
// Every (local expert, source rank) pair owns a fixed run of num_max_dispatch_tokens_per_rank
// (T) slots on the expert's rank, big enough for the worst case, so a sender can write a token
// the moment it has cast it. Counts travel after the data, one row per (source, destination).
// Shapes are fixed by (T, hidden, num_experts) alone, which is what lets a CUDA graph capture
// a dispatch and a combine once and replay them with new data.
//
// Layout of the low-latency region (host mirror with the size formulas: src/low_latency.rs):
//
//   control  (fixed offsets, whatever the call's shape)
//     flags[2][MAX_PES]    u64   flags[h][s]: the last LL call whose data PE s finished
//                                 writing into half h of our region
//     counts[2][MAX_EXPERTS]  i32   counts[h][s * L + e]: tokens PE s sent our local expert e
//   half[2]   a third each of the rest of the region, at offsets fixed by the region's size
//             (so calls of different shapes share them), each >= E x T x (16 + 2 x hidden)
//             (E = num_experts, L = E / n_pes local experts, msg_bytes the call's message)
//     dispatch: slot (e, s, i) at ((e * n_pes + s) * T + i) * msg_bytes:
//                 [src token: i32, pad x 3][row: hidden bf16 or fp8][scales: f32 x hidden/128]
//     combine:  row (global expert g, token t) at (g * T + t) * 2 * hidden: the bf16 result
//   staging   the last third: L x (n_pes x T) x hidden bf16, get_next_low_latency_combine_buffer
//
// ANCHOR: ll_notes
// NOTES on the protocol (the subtle part):
// - Calls are numbered on the device (LlState::calls, the last finished call), never from the
//   host, so a graph replay is a new call. Dispatches and combines share one count: call k
//   uses half k & 1 of every rank's region, dispatch or combine.
// - Reuse of a half needs no cleaning: call k writes into a peer's half h only after its own
//   call k - 1 received from every peer (stream order), and that peer sent call k - 1 only
//   after it had finished reading call k - 2, the last user of half h. Every call is a full
//   exchange (every rank signals every rank, zero tokens included), which is what makes this
//   chain hold.
// - Flags only grow (they hold the call number), so a stale flag never passes for a new one.
// - Who signals: the data to one destination comes from many blocks. Each block fences its
//   stores, then adds its message count to LlState::finish[d]; the block whose add completes
//   the total (every block counts the total from topk_idx itself) writes the count row and
//   raises the flag. The fence-then-atomic in the writers and atomic-then-fence in the last
//   block carry the writers' stores to the flag's release (the pattern of threadFenceReduction
//   and of DeepEP's per-expert finish counters).
// - Slots are handed out by atomics on LlState::slots, in the order tokens reach them (as in
//   DeepEP); the last block for a destination reads and zeroes its experts' counters in one
//   atomicExch, which is also the reset for the next call.
// ANCHOR_END: ll_notes
#include <cuda_fp8.h>

#include "moe.cuh"

namespace nvshmem_tutorial {

using namespace coll;

constexpr int PHASE_SEND = 1;
constexpr int PHASE_RECV = 2;
constexpr int MAX_EXPERTS = 2048;  // host mirror: low_latency::MAX_EXPERTS
constexpr int MAX_TOPK = 32;
// Failure kinds beyond chapter 7's (error record word 4). Host mirror: src/error.rs.
constexpr uint64_t WAIT_LL_DISPATCH = 10;
constexpr uint64_t WAIT_LL_COMBINE = 11;

// Per-rank device state (local memory, zeroed at creation). Host mirror: LlState in
// src/low_latency.rs (its size).
struct LlState {
    unsigned long long calls;      // last finished LL call
    unsigned int arrived;          // blocks of the current call past their receive phase
    unsigned int finish[MAX_PES];  // messages written to each PE in the current call
    int slots[MAX_EXPERTS];        // tokens sent to each global expert in the current dispatch
};

// One half of every rank's region and the control words, as this rank addresses its own copy.
struct LlRegion {
    uint8_t* data[2];
    int* counts[2];
    uint64_t* flags[2];
};

struct LlDispatchArgs {
    const uint8_t* x;             // [N][hidden] bf16
    const int64_t* topk_idx;      // [N][K] global expert ids or -1
    uint8_t* recv_x;              // [L][n_pes * T][hidden] fp8 or bf16
    void* recv_scales;            // fp8: f32 [L][hidden/128][n_pes * T]; ue8m0: u8 [L][hidden/512][n_pes * T][4]
    int* recv_src_info;           // [L][n_pes * T]
    int64_t* recv_layout_range;   // [L][n_pes]: (begin << 32) | count
    int* recv_count;              // [L]
    int* cumulative_recv_stats;   // [L] or null
    int64_t* wait_recv_cost;      // [n_pes] or null: cycles spent waiting per source
    LlRegion region;
    LlState* state;
    moe::InputError bad_input;
    int num_tokens, hidden, num_topk, num_experts, max_tokens;
    int use_fp8, round_scale, use_ue8m0;
};

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

__host__ __device__ constexpr int dispatch_msg_bytes(int hidden, bool fp8) {
    return 16 + (fp8 ? hidden + hidden / 128 * 4 : hidden * 2);
}

__device__ __forceinline__ int global_warp() { return blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; }
__device__ __forceinline__ int num_global_warps() { return gridDim.x * (blockDim.x / 32); }

// Exclusive prefix sum of `data[0..n)` in shared memory, in place; returns the total. Every
// thread of the block calls it.
__device__ int block_exclusive_scan(int* data, int n) {
    __shared__ int warp_sums[32];
    __shared__ int total;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int begin = min(n, static_cast<int>(threadIdx.x) * per), end = min(n, begin + per);
    int sum = 0;
    for (int i = begin; i < end; ++i) sum += data[i];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = sum;
    for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
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

// Copies `num_bytes` (a multiple of 16) with the 32 lanes of a warp, 8 loads in flight per
// lane before the first store: a decode-sized row is a few such rounds, so the copy costs a
// few memory latencies rather than one per 512 bytes. `kCoherent` reads through L2 only
// (data a peer wrote during this kernel); otherwise through the read-only path (inputs).
template <bool kCoherent>
__device__ __forceinline__ void warp_copy_deep(uint8_t* dst, const uint8_t* src, int num_bytes, int lane) {
    constexpr int kDepth = 8;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const int n = num_bytes / 16;
    for (int base = 0; base < n; base += 32 * kDepth) {
        uint4 v[kDepth];
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = base + j * 32 + lane;
            if (i < n) v[j] = kCoherent ? __ldcg(s + i) : __ldg(s + i);
        }
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = base + j * 32 + lane;
            if (i < n) d[i] = v[j];
        }
    }
}

// Thread s < n_pes waits for PE s's flag of call k in half h; adds the cycles it waited to
// `cost[s]` (block 0 only). The block learns whether every flag came.
__device__ __forceinline__ bool wait_all_sources(const Workspace& ws, const LlRegion& region, int h, uint64_t k, uint64_t what,
                                 int64_t* cost) {
    __shared__ int all_came;
    if (threadIdx.x == 0) all_came = 1;
    __syncthreads();
    const int s = threadIdx.x;
    if (s < ws.n_pes) {
        const long long start = clock64();
        if (!wait_at_least(ws, region.flags[h] + s, k, static_cast<Wait>(what), s, k)) all_came = 0;
        if (cost != nullptr && blockIdx.x == 0)
            atomicAdd(reinterpret_cast<unsigned long long*>(cost + s), static_cast<unsigned long long>(clock64() - start));
    }
    __syncthreads();
    return all_came;
}

// After this block wrote `mine[d]` messages to each PE d (of `total[d]` from every block):
// the block that completes PE d's total publishes it. `publish(d)` runs on the whole block
// (count rows); then thread 0 raises d's flag to k. A PE nobody writes to (total 0) is
// published by block d % gridDim.x.
template <typename Publish>
__device__ __forceinline__ void finish_sends(const Workspace& ws, LlState* state, const LlRegion& region, int h, uint64_t k,
                             const int* mine, const int* total, Publish publish) {
    __shared__ int last[MAX_PES];
    __threadfence_system();
    __syncthreads();
    const int d = threadIdx.x;
    if (d < ws.n_pes) {
        bool is_last = false;
        if (mine[d] > 0) {
            const unsigned int before = atomicAdd(state->finish + d, static_cast<unsigned int>(mine[d]));
            is_last = before + mine[d] == static_cast<unsigned int>(total[d]);
            if (is_last) {
                state->finish[d] = 0;  // every add of this call is in: reset for the next
                __threadfence();       // acquire what the other blocks fenced before their adds
            }
        } else {
            is_last = total[d] == 0 && d % gridDim.x == blockIdx.x;
        }
        last[d] = is_last;
    }
    __syncthreads();
    for (int p = 0; p < ws.n_pes; ++p) {
        if (!last[p]) continue;
        publish(p);
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) st_release_sys(peer(ws, region.flags[h] + ws.my_pe, p), k);
    }
}

// The last block of a call to finish its receive phase closes the call.
__device__ __forceinline__ void end_ll_call(LlState* state, uint64_t k) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&state->arrived, 1u) == gridDim.x - 1) {
            state->arrived = 0;
            *reinterpret_cast<volatile unsigned long long*>(&state->calls) = k;
        }
    }
}

__device__ __forceinline__ bool valid_expert(const moe::InputError& bad, int64_t e, int num_experts, int token) {
    if (e >= 0 && e < num_experts) return true;
    if (e != -1) bad.record(moe::BAD_EXPERT, token, static_cast<uint64_t>(e), num_experts);
    return false;
}

// ---- dispatch -----------------------------------------------------------------------------

// ANCHOR: cast
// 16 channels of a bf16 row (32 bytes) to fp8 e4m3 with one scale per 128 channels, DeepEP's
// recipe: amax over the 128 channels (8 lanes, at least 1e-4), scale = 448 / amax, rounded
// to a power of two with round_scale. Returns the 16 fp8 bytes; *scale_inv is what the
// receiver multiplies by. Every lane of the warp must call it (8-lane shuffles).
__device__ __forceinline__ uint4 cast_fp8(const float (&v)[16], bool round_scale, float* scale_inv) {
    float amax = 1e-4f;
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
    for (int d = 1; d < 8; d *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    // DeepEP's arithmetic, to the bit: amax x (1 / 448) for the stored scale, 448 / amax to cast.
    constexpr float kInv448 = 1.0f / 448.0f;
    float scale;
    if (round_scale) {
        const float x = amax * kInv448;
        const uint32_t bits = __float_as_uint(x);
        const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0);
        scale = __uint_as_float(static_cast<uint32_t>(127 - exponent) << 23);
        *scale_inv = __uint_as_float(static_cast<uint32_t>(127 + exponent) << 23);
    } else {
        scale = 448.0f / amax;
        *scale_inv = amax * kInv448;
    }
    uint4 out;
    auto* pairs = reinterpret_cast<__nv_fp8x2_storage_t*>(&out);
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
        pairs[j / 2] = __nv_cvt_float2_to_fp8x2(make_float2(v[j] * scale, v[j + 1] * scale), __NV_SATFINITE, __NV_E4M3);
    }
    return out;
}
// ANCHOR_END: cast

__device__ __forceinline__ void load_bf16x16(const uint8_t* p, float (&v)[16]) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    const auto* ha = reinterpret_cast<const __nv_bfloat162*>(&a);
    const auto* hb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 fa = __bfloat1622float2(ha[j]), fb = __bfloat1622float2(hb[j]);
        v[2 * j] = fa.x;
        v[2 * j + 1] = fa.y;
        v[8 + 2 * j] = fb.x;
        v[8 + 2 * j + 1] = fb.y;
    }
}

// ANCHOR: dispatch_send
// Send phase: block b takes tokens b, b + grid, ...; for each, its top-k destinations get a
// slot each, and the block streams the token (cast once, from registers) into every slot.
__device__ __forceinline__ void dispatch_send(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    __shared__ int total[MAX_PES], mine[MAX_PES];
    __shared__ uint8_t* msg[MAX_TOPK];
    const int n = ws.n_pes, me = ws.my_pe;
    const int L = a.num_experts / n, K = a.num_topk, T = a.max_tokens;
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    if (threadIdx.x < n) total[threadIdx.x] = mine[threadIdx.x] = 0;
    __syncthreads();
    // Every block counts the messages to each PE: whichever block completes a PE's count must
    // know the total.
    const int lane = threadIdx.x % 32;
    for (int base = threadIdx.x - lane; base < a.num_tokens * K; base += blockDim.x) {
        const int j = base + lane;
        int pe = -1;
        if (j < a.num_tokens * K) {
            const int64_t e = __ldg(a.topk_idx + j);
            if (valid_expert(a.bad_input, e, a.num_experts, j / K)) pe = static_cast<int>(e / L);
        }
        for (int d = 0; d < n; ++d) {  // one shared atomic per warp and PE, not per entry
            const unsigned int lanes = __ballot_sync(0xffffffffu, pe == d);
            if (lane == 0 && lanes != 0) atomicAdd(total + d, __popc(lanes));
        }
    }
    const int units = a.hidden / 16;  // 16 channels each: 32 bytes in, 16 (fp8) or 32 out
    // One 16-channel unit of the row to every destination slot: 16 fp8 bytes (+ the group's
    // scale from one lane in 8) or 32 bf16 bytes.
    auto store_fp8 = [&](int u, const uint4& packed, float scale_inv) {
        for (int i = 0; i < K; ++i) {
            uint8_t* slot = msg[i];
            if (slot == nullptr) continue;
            *reinterpret_cast<uint4*>(slot + 16 + u * 16) = packed;
            if (lane % 8 == 0) reinterpret_cast<float*>(slot + 16 + a.hidden)[u / 8] = scale_inv;
        }
    };
    auto store_bf16 = [&](int u, const uint4& lo, const uint4& hi) {
        for (int i = 0; i < K; ++i) {
            if (msg[i] == nullptr) continue;
            uint4* dst = reinterpret_cast<uint4*>(msg[i] + 16 + u * 32);
            dst[0] = lo;
            dst[1] = hi;
        }
    };
    auto cast_unit = [&](const uint8_t* row, int u, float* scale_inv) {
        float v[16];
        if (u < units) {
            load_bf16x16(row + u * 32, v);
        } else {
#pragma unroll
            for (int j = 0; j < 16; ++j) v[j] = 0.0f;
        }
        return cast_fp8(v, a.round_scale, scale_inv);  // every lane: 8-lane shuffles
    };
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
        __syncthreads();  // the previous token's slots are no longer read
        const uint8_t* row = a.x + static_cast<int64_t>(t) * a.hidden * 2;
        // Each thread's first unit is loaded (and cast) while threads < K take slots: the
        // two memory round trips overlap instead of following each other.
        const int u0 = threadIdx.x;
        uint4 first_lo = make_uint4(0, 0, 0, 0), first_hi = first_lo;
        float first_scale = 0.0f;
        if (a.use_fp8) {
            first_lo = cast_unit(row, u0, &first_scale);
        } else if (u0 < units) {
            first_lo = __ldg(reinterpret_cast<const uint4*>(row + u0 * 32));
            first_hi = __ldg(reinterpret_cast<const uint4*>(row + u0 * 32) + 1);
        }
        if (threadIdx.x < K) {
            const int64_t e = __ldg(a.topk_idx + t * K + threadIdx.x);
            uint8_t* slot = nullptr;
            if (e >= 0 && e < a.num_experts) {
                const int i = atomicAdd(a.state->slots + e, 1);
                const int pe = static_cast<int>(e / L);
                const int local = static_cast<int>(e % L);
                if (i < T) {
                    slot = peer(ws, a.region.data[h] + ((static_cast<int64_t>(local) * n + me) * T + i) * msg_bytes, pe);
                    *reinterpret_cast<int4*>(slot) = make_int4(t, 0, 0, 0);
                } else {
                    // Only a token naming one expert twice can get here (N <= T): the run of
                    // T slots is full. Counted as sent, so the call completes; raised later.
                    a.bad_input.record(moe::SLOTS_FULL, t, static_cast<uint64_t>(e), T);
                }
                atomicAdd(mine + pe, 1);
            }
            msg[threadIdx.x] = slot;
        }
        __syncthreads();
        if (a.use_fp8) {
            if (u0 < units) store_fp8(u0, first_lo, first_scale);
            // The rest of a long row; the whole warp runs every iteration (shuffles).
            for (int base = threadIdx.x - lane + blockDim.x; base < units; base += blockDim.x) {
                float scale_inv;
                const uint4 packed = cast_unit(row, base + lane, &scale_inv);
                if (base + lane < units) store_fp8(base + lane, packed, scale_inv);
            }
        } else {
            if (u0 < units) store_bf16(u0, first_lo, first_hi);
            for (int u = u0 + blockDim.x; u < units; u += blockDim.x) {
                const uint4* src = reinterpret_cast<const uint4*>(row + u * 32);
                store_bf16(u, __ldg(src), __ldg(src + 1));
            }
        }
    }
    __syncthreads();
    finish_sends(ws, a.state, a.region, h, k, mine, total, [&](int pe) {
        // The count row of PE pe's experts, read and reset in one step.
        int* row = peer(ws, a.region.counts[h] + me * L, pe);
        for (int e = threadIdx.x; e < L; e += blockDim.x) row[e] = min(atomicExch(a.state->slots + pe * L + e, 0), T);
    });
}
// ANCHOR_END: dispatch_send

// ANCHOR: dispatch_recv
// Receive phase: wait for every source's flag, then pack: local expert e's rows are source
// 0's tokens, then source 1's, ...; every warp of the grid copies rows of the whole call.
__device__ __forceinline__ void dispatch_recv(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    __shared__ int begin[MAX_EXPERTS];       // [s * L + e]: first packed row of (e, s)
    __shared__ int count[MAX_EXPERTS];       // [s * L + e]
    __shared__ int first_row[MAX_EXPERTS + 1];  // [e]: rows of experts before e, over the whole call
    const int n = ws.n_pes, L = a.num_experts / n, T = a.max_tokens;
    if (!wait_all_sources(ws, a.region, h, k, WAIT_LL_DISPATCH, a.wait_recv_cost)) return;
    const int* counts = a.region.counts[h];
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) count[j] = __ldcg(counts + j);
    __syncthreads();
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
        int run = 0;
        for (int s = 0; s < n; ++s) {
            begin[s * L + e] = run;
            run += count[s * L + e];
        }
        first_row[e] = run;
    }
    __syncthreads();
    const int total_rows = block_exclusive_scan(first_row, L);
    if (threadIdx.x == 0) first_row[L] = total_rows;
    __syncthreads();
    const int rows_per_expert = n * T;
    for (int e = blockIdx.x; e < L; e += gridDim.x) {
        const int s = threadIdx.x;
        if (s < n) a.recv_layout_range[e * n + s] = (static_cast<int64_t>(begin[s * L + e]) << 32) | count[s * L + e];
        if (threadIdx.x == 0) {
            const int got = first_row[e + 1] - first_row[e];
            a.recv_count[e] = got;
            if (a.cumulative_recv_stats != nullptr) a.cumulative_recv_stats[e] += got;
        }
    }
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int row_bytes = a.use_fp8 ? a.hidden : a.hidden * 2;
    const int num_scales = a.use_fp8 ? a.hidden / 128 : 0;
    const int lane = threadIdx.x % 32;
    for (int g = global_warp(); g < total_rows; g += num_global_warps()) {
        const int e = find_run(first_row, L + 1, g);
        const int i = g - first_row[e];  // packed row within expert e
        int s = 0;
        while (s + 1 < n && begin[(s + 1) * L + e] <= i) ++s;
        const int slot = i - begin[s * L + e];
        const uint8_t* m = a.region.data[h] + ((static_cast<int64_t>(e) * n + s) * T + slot) * msg_bytes;
        const int64_t packed = static_cast<int64_t>(e) * rows_per_expert + i;
        if (lane == 0) a.recv_src_info[packed] = __ldcg(reinterpret_cast<const int*>(m));
        warp_copy_deep<true>(a.recv_x + packed * row_bytes, m + 16, row_bytes, lane);
        const float* scales = reinterpret_cast<const float*>(m + 16 + row_bytes);
        for (int c = lane; c < num_scales; c += 32) {
            const float scale = __ldcg(scales + c);
            if (a.use_ue8m0) {
                // Packed 4 per int32, column-major over tokens: DeepEP's TMA-friendly layout.
                auto* out = static_cast<uint8_t*>(a.recv_scales);
                out[((static_cast<int64_t>(e) * (num_scales / 4) + c / 4) * rows_per_expert + i) * 4 + c % 4] =
                    static_cast<uint8_t>(__float_as_uint(scale) >> 23);
            } else {
                auto* out = static_cast<float*>(a.recv_scales);
                out[(static_cast<int64_t>(e) * num_scales + c) * rows_per_expert + i] = scale;
            }
        }
    }
}
// ANCHOR_END: dispatch_recv

__global__ void __launch_bounds__(512) dispatch(Workspace ws, LlDispatchArgs args, int phases) {
    const uint64_t k = ld_volatile(reinterpret_cast<const uint64_t*>(&args.state->calls)) + 1;
    const int h = static_cast<int>(k & 1);
    if (phases & PHASE_SEND) dispatch_send(ws, args, h, k);
    if (phases & PHASE_RECV) {
        dispatch_recv(ws, args, h, k);
        end_ll_call(args.state, k);
    }
}

// ---- combine ------------------------------------------------------------------------------

// Per (local expert, source) runs of this rank's packed rows, from the handle's layout_range.
struct PackedRuns {
    int* begin;      // [s * L + e]
    int* count;      // [s * L + e]
    int* first_row;  // [L + 1]
};

// ANCHOR: combine_send
// Send phase: every warp of the grid takes packed rows; row i of local expert e goes back to
// the source rank s it came from, into s's slot (global expert, source token).
__device__ __forceinline__ void combine_send(const Workspace& ws, const LlCombineArgs& a, int h, uint64_t k) {
    __shared__ int begin[MAX_EXPERTS], count[MAX_EXPERTS], first_row[MAX_EXPERTS + 1];
    __shared__ int total[MAX_PES], mine[MAX_PES];
    const int n = ws.n_pes, me = ws.my_pe, L = a.num_experts / n, T = a.max_tokens;
    if (threadIdx.x < n) total[threadIdx.x] = mine[threadIdx.x] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < a.num_experts; j += blockDim.x) {
        const int e = j / n, s = j % n;  // layout_range is [L][n_pes]
        const int64_t range = __ldg(a.layout_range + j);
        begin[s * L + e] = static_cast<int>(range >> 32);
        count[s * L + e] = static_cast<int>(range & 0xffffffff);
        atomicAdd(total + s, static_cast<int>(range & 0xffffffff));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
        int rows = 0;
        for (int s = 0; s < n; ++s) rows += count[s * L + e];
        first_row[e] = rows;
    }
    __syncthreads();
    const int total_rows = block_exclusive_scan(first_row, L);
    if (threadIdx.x == 0) first_row[L] = total_rows;
    __syncthreads();
    const int row_bytes = a.hidden * 2;
    const int lane = threadIdx.x % 32;
    for (int g = global_warp(); g < total_rows; g += num_global_warps()) {
        const int e = find_run(first_row, L + 1, g);
        const int i = g - first_row[e];
        int s = -1;
        for (int p = 0; p < n; ++p) {
            if (i >= begin[p * L + e] && i < begin[p * L + e] + count[p * L + e]) s = p;
        }
        const int64_t packed = static_cast<int64_t>(e) * n * T + i;
        const int t = __ldg(a.src_info + packed);
        if (s < 0 || t < 0 || t >= T) {
            if (lane == 0) {
                a.bad_input.record(moe::BAD_HANDLE, packed, static_cast<uint64_t>(t), T);
                if (s >= 0) atomicAdd(mine + s, 1);  // counted, so that s's flag still rises
            }
            continue;
        }
        uint8_t* slot = peer(ws, a.region.data[h] + (static_cast<int64_t>(me * L + e) * T + t) * row_bytes, s);
        warp_copy_deep<false>(slot, a.x + packed * row_bytes, row_bytes, lane);
        if (lane == 0) atomicAdd(mine + s, 1);
    }
    __syncthreads();
    finish_sends(ws, a.state, a.region, h, k, mine, total, [](int) {});
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
    const uint64_t k = ld_volatile(reinterpret_cast<const uint64_t*>(&args.state->calls)) + 1;
    const int h = static_cast<int>(k & 1);
    if (phases & PHASE_SEND) combine_send(ws, args, h, k);
    if (phases & PHASE_RECV) {
        combine_recv(ws, args, h, k);
        end_ll_call(args.state, k);
    }
}

}  // namespace nvshmem_tutorial
