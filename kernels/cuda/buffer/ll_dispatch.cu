// Chapter 8: low-latency dispatch. The send phase casts each token once and stores it into the
// slots of its top-k experts on their ranks; the receive phase packs every expert's rows (the
// layout and the protocol's NOTES: low_latency.cuh).
#include "low_latency.cuh"

namespace nvshmem_tutorial {

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

// Rounded up to 16 bytes: every slot, and so every row in it, must be 16-byte aligned for
// the vector copies (an fp8 message of hidden = 128 x k carries 4k bytes of scales).
__host__ __device__ constexpr int dispatch_msg_bytes(int hidden, bool fp8) {
    return (16 + (fp8 ? hidden + hidden / 128 * 4 : hidden * 2) + 15) / 16 * 16;
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
    __shared__ uint8_t* msg[MAX_TOPK];
    const int n = ws.n_pes, me = ws.my_pe;
    const int L = a.num_experts / n, K = a.num_topk, T = a.max_tokens;
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int lane = threadIdx.x % 32;
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
            if (valid_expert(a.bad_input, e, a.num_experts, t)) {
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
    finish_sends(ws, a.state, [&](int pe) {
        // PE pe's experts' count words: each read and reset in one step, sent with the call.
        uint64_t* words = peer(ws, a.region.counts[h] + me * L, pe);
        for (int e = threadIdx.x; e < L; e += blockDim.x) {
            const int count = min(atomicExch(a.state->slots + pe * L + e, 0), T);
            st_release_sys(words + e, (k << 32) | static_cast<uint32_t>(count));
        }
    });
}
// ANCHOR_END: dispatch_send

// ANCHOR: dispatch_recv
// Receive phase: the grid's blocks are split into groups of warps, one local expert each (1,
// 2 or 4 groups per block, as few as cover every expert in one pass: DeepEP's warp groups).
// A group waits for its expert's count word from every source, then the expert's rows are
// source 0's tokens, then source 1's, ... Each warp copies whole rows, with their scales.
__device__ __forceinline__ void dispatch_recv(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    constexpr int kMaxGroups = 4;
    __shared__ int begins[kMaxGroups][MAX_PES + 1];  // the group's expert's rows from source s: [begin[s], begin[s + 1])
    __shared__ int all_came[kMaxGroups];
    const int n = ws.n_pes, L = a.num_experts / n, T = a.max_tokens;
    int groups = 1;
    while (groups < kMaxGroups && groups * static_cast<int>(gridDim.x) < L) groups *= 2;
    const int group_threads = blockDim.x / groups, group = threadIdx.x / group_threads;
    const int tid = threadIdx.x % group_threads, lane = tid % 32, warp = tid / 32, warps = group_threads / 32;
    int* begin = begins[group];
    // Named barrier 1 + group: the group's threads only (barrier 0 is __syncthreads).
    auto group_sync = [&] { asm volatile("bar.sync %0, %1;" ::"r"(group + 1), "r"(group_threads) : "memory"); };
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int row_bytes = a.use_fp8 ? a.hidden : a.hidden * 2;
    const int num_scales = a.use_fp8 ? a.hidden / 128 : 0;
    const int rows_per_expert = n * T;
    auto message = [&](int e, int row) {  // expert e's packed row -> its slot's message
        int s = 0;
        while (row >= begin[s + 1]) ++s;
        return a.region.data[h] + ((static_cast<int64_t>(e) * n + s) * T + row - begin[s]) * msg_bytes;
    };
    for (int e = blockIdx.x * groups + group; e < L; e += gridDim.x * groups) {
        group_sync();  // the previous expert's begin[] is no longer read
        if (tid == 0) all_came[group] = 1;
        group_sync();
        const int s = tid;
        if (s < n) {
            const uint64_t* word = a.region.counts[h] + s * L + e;
            const long long start = clock64();
            int count = 0;
            if (wait_at_least(ws, word, k << 32, static_cast<Wait>(WAIT_LL_DISPATCH), s, k)) {
                count = min(static_cast<int>(ld_volatile(word) & 0xffffffffu), T);
            } else {
                all_came[group] = 0;
            }
            if (a.wait_recv_cost != nullptr)
                atomicAdd(reinterpret_cast<unsigned long long*>(a.wait_recv_cost + s), static_cast<unsigned long long>(clock64() - start));
            begin[s + 1] = count;
        }
        group_sync();
        if (!all_came[group]) return;
        if (tid == 0) {
            begin[0] = 0;
            for (int p = 0; p < n; ++p) begin[p + 1] += begin[p];
        }
        group_sync();
        const int got = begin[n];
        if (s < n) a.recv_layout_range[e * n + s] = (static_cast<int64_t>(begin[s]) << 32) | (begin[s + 1] - begin[s]);
        if (tid == 0) {
            a.recv_count[e] = got;
            if (a.cumulative_recv_stats != nullptr) a.cumulative_recv_stats[e] += got;
        }
        // One round of loads per row: the header's token and the row's scales are loaded with
        // the row (16 vectors per lane in flight), so a row costs one memory latency. The
        // scales go out column-major ([e][c][rows], DeepEP's TMA-friendly layout).
        for (int row = warp; row < got; row += warps) {
            const uint8_t* m = message(e, row);
            const int64_t packed = static_cast<int64_t>(e) * rows_per_expert + row;
            const int token = lane == 0 ? __ldcg(reinterpret_cast<const int*>(m)) : 0;
            const float* scales = reinterpret_cast<const float*>(m + 16 + row_bytes);
            float scale[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) scale[j] = lane + 32 * j < num_scales ? __ldcg(scales + lane + 32 * j) : 0.0f;
            warp_copy_deep<true, 16>(a.recv_x + packed * row_bytes, m + 16, row_bytes, lane);
            if (lane == 0) a.recv_src_info[packed] = token;
            for (int c = lane; c < num_scales; c += 32) {
                const float value = c < 64 ? scale[c / 32] : __ldcg(scales + c);  // hidden > 8192: a second round
                const int64_t i = row;
                if (a.use_ue8m0) {
                    // Packed 4 per int32: byte c % 4 of int (c / 4, row).
                    auto* out = static_cast<uint8_t*>(a.recv_scales);
                    out[((static_cast<int64_t>(e) * (num_scales / 4) + c / 4) * rows_per_expert + i) * 4 + c % 4] =
                        static_cast<uint8_t>(__float_as_uint(value) >> 23);
                } else {
                    auto* out = static_cast<float*>(a.recv_scales);
                    out[(static_cast<int64_t>(e) * num_scales + c) * rows_per_expert + i] = value;
                }
            }
        }
    }
}
// ANCHOR_END: dispatch_recv

__global__ void __launch_bounds__(512) dispatch(Workspace ws, LlDispatchArgs args, int phases) {
    run_call(ws, args, phases, dispatch_send, dispatch_recv);
}

}  // namespace nvshmem_tutorial
