// Chapter 8: low-latency dispatch. The send phase casts each token once and stores it into the
// slots of its top-k experts on their ranks; the receive phase packs every expert's rows (the
// layout and the protocol's NOTES: low_latency.cuh).
#include "low_latency.cuh"

namespace nvshmem_tutorial {

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

// Where a token's copy for one of its experts goes. A peer's expert gets a message in its
// slot (header, row, scales together, so the scales travel as 16-byte vectors with the row);
// an expert of this rank gets its final packed row directly, with no slot and no receive copy:
// this rank's own run comes first in every expert's packed rows, so a slot index is already a
// packed row.
struct Destination {
    uint8_t* row;   // where the row's bytes go
    void* scales;   // message: its f32 scales; own rank: this row's column in recv_scales
    bool local;
};

// Scale c of a row into the packed receive layout, column-major ([e][c][rows], DeepEP's
// TMA-friendly layout): f32, or with use_ue8m0 the exponent byte, four per int32
// ([e][c / 4][rows][4]). `column` is recv_scales' element for (e, c = 0, this row).
__device__ __forceinline__ void store_packed_scale(void* column, int c, int rows_per_expert, bool ue8m0, float value) {
    if (ue8m0) {
        static_cast<uint8_t*>(column)[(static_cast<int64_t>(c / 4) * rows_per_expert) * 4 + c % 4] =
            static_cast<uint8_t>(__float_as_uint(value) >> 23);
    } else {
        static_cast<float*>(column)[static_cast<int64_t>(c) * rows_per_expert] = value;
    }
}

// ANCHOR: dispatch_send
// Send phase: block b takes tokens b, b + grid, ...; for each, its top-k destinations get a
// slot each, and the block streams the token (cast once, from registers) into every slot.
__device__ __forceinline__ void dispatch_send(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    __shared__ Destination dst[MAX_TOPK];
    __shared__ float row_scales[MAX_LL_HIDDEN / 128];
    const int n = ws.n_pes, me = ws.my_pe;
    const int L = a.num_experts / n, K = a.num_topk, T = a.max_tokens;
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int row_bytes = a.use_fp8 ? a.hidden : a.hidden * 2;
    const int num_scales = a.use_fp8 ? a.hidden / 128 : 0;
    const int rows_per_expert = n * T;
    const int lane = threadIdx.x % 32;
    const int units = a.hidden / 16;  // 16 channels each: 32 bytes in, 16 (fp8) or 32 out
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
    // One 16-channel unit of the row to every destination: 16 fp8 bytes, its group's scale
    // kept for later (one lane in 8), or 32 bf16 bytes.
    auto store_fp8 = [&](int u, const uint4& packed, float scale_inv) {
        for (int i = 0; i < K; ++i) {
            if (dst[i].row != nullptr) *reinterpret_cast<uint4*>(dst[i].row + u * 16) = packed;
        }
        if (lane % 8 == 0) row_scales[u / 8] = scale_inv;
    };
    auto store_bf16 = [&](int u, const uint4& lo, const uint4& hi) {
        for (int i = 0; i < K; ++i) {
            if (dst[i].row == nullptr) continue;
            uint4* out = reinterpret_cast<uint4*>(dst[i].row + u * 32);
            out[0] = lo;
            out[1] = hi;
        }
    };
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
        __syncthreads();  // the previous token's destinations and scales are no longer read
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
            Destination d{nullptr, nullptr, false};
            if (valid_expert(a.bad_input, e, a.num_experts, t)) {
                const int i = atomicAdd(a.state->slots + e, 1);
                const int pe = static_cast<int>(e / L);
                const int local = static_cast<int>(e % L);
                if (i >= T) {
                    // Only a token naming one expert twice can get here (N <= T): the run of
                    // T slots is full. Counted as sent, so the call completes; raised later.
                    moe::record_input_error(a.bad_input, SLOTS_FULL, t, static_cast<uint64_t>(e), T);
                } else if (pe == me) {
                    const int64_t packed = static_cast<int64_t>(local) * rows_per_expert + i;
                    a.recv_src_info[packed] = t;
                    d.row = a.recv_x + packed * row_bytes;
                    d.local = true;
                    if (num_scales > 0) {
                        d.scales = a.use_ue8m0
                                       ? static_cast<void*>(static_cast<uint8_t*>(a.recv_scales) +
                                                            (static_cast<int64_t>(local) * (num_scales / 4) * rows_per_expert + i) * 4)
                                       : static_cast<void*>(static_cast<float*>(a.recv_scales) +
                                                            static_cast<int64_t>(local) * num_scales * rows_per_expert + i);
                    }
                } else {
                    uint8_t* slot = peer(ws, a.region.data[h] + ((static_cast<int64_t>(local) * n + me) * T + i) * msg_bytes, pe);
                    *reinterpret_cast<int4*>(slot) = make_int4(t, 0, 0, 0);
                    d.row = slot + 16;
                    d.scales = slot + 16 + a.hidden;
                }
            }
            dst[threadIdx.x] = d;
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
            __syncthreads();  // row_scales complete
            // The scales: 16-byte vectors into a message (its padding takes a partial last
            // vector), one column entry each into this rank's packed layout.
            const int vectors = (num_scales + 3) / 4;
            for (int j = threadIdx.x; j < K * num_scales; j += blockDim.x) {
                const Destination& d = dst[j / num_scales];
                const int c = j % num_scales;
                if (d.row == nullptr) continue;
                if (d.local) {
                    store_packed_scale(d.scales, c, rows_per_expert, a.use_ue8m0, row_scales[c]);
                } else if (c < vectors) {
                    uint4 v;
                    v.x = __float_as_uint(row_scales[4 * c]);
                    v.y = 4 * c + 1 < num_scales ? __float_as_uint(row_scales[4 * c + 1]) : 0u;
                    v.z = 4 * c + 2 < num_scales ? __float_as_uint(row_scales[4 * c + 2]) : 0u;
                    v.w = 4 * c + 3 < num_scales ? __float_as_uint(row_scales[4 * c + 3]) : 0u;
                    reinterpret_cast<uint4*>(d.scales)[c] = v;
                }
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
// Receive phase. Every local expert's packed rows are runs by source in ring order from this
// rank: its own run first (written by the send phase, in place), then rank me + 1's, and so on.
// The work is one unit per (local expert, remote source), spread over every block (1, 2 or 4
// groups of warps per block, as few as cover the units in one pass: DeepEP's warp groups). A
// unit waits for the count words of its source and the sources before it in that order (its
// first row is their sum), then its warps copy whole rows, with their scales.
__device__ __forceinline__ void dispatch_recv(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    constexpr int kMaxGroups = 4;
    __shared__ int counts[kMaxGroups][MAX_PES];  // the group's expert's counts, by position
    __shared__ int all_came[kMaxGroups];
    const int n = ws.n_pes, me = ws.my_pe, L = a.num_experts / n, T = a.max_tokens;
    const int positions = n > 1 ? n - 1 : 1;  // units per expert: the remote sources (or, alone, our own)
    const int units = positions * L;
    int groups = 1;
    while (groups < kMaxGroups && groups * static_cast<int>(gridDim.x) < units) groups *= 2;
    const int group_threads = blockDim.x / groups, group = threadIdx.x / group_threads;
    const int tid = threadIdx.x % group_threads, lane = tid % 32, warp = tid / 32, warps = group_threads / 32;
    int* seen = counts[group];
    // Named barrier 1 + group: the group's threads only (barrier 0 is __syncthreads).
    auto group_sync = [&] { asm volatile("bar.sync %0, %1;" ::"r"(group + 1), "r"(group_threads) : "memory"); };
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int row_bytes = a.use_fp8 ? a.hidden : a.hidden * 2;
    const int num_scales = a.use_fp8 ? a.hidden / 128 : 0;
    const int rows_per_expert = n * T;
    for (int u = blockIdx.x + group * gridDim.x; u < units; u += gridDim.x * groups) {
        const int e = u % L;
        const int p = n > 1 ? 1 + u / L : 0;  // the unit's position in the ring order
        const int s = (me + p) % n;
        group_sync();  // the previous unit's counts are no longer read
        if (tid == 0) all_came[group] = 1;
        group_sync();
        if (tid <= p) {
            const int source = (me + tid) % n;
            const long long start = clock64();
            uint64_t word = 0;
            if (!wait_at_least(ws, a.region.counts[h] + source * L + e, k << 32, WAIT_LL_DISPATCH, source, k, &word))
                all_came[group] = 0;
            seen[tid] = min(static_cast<int>(word & 0xffffffffu), T);
            // Each source's wait counted once per expert: by its own unit, ours by the last.
            if (a.wait_recv_cost != nullptr && (tid == p || (tid == 0 && p == n - 1)))
                atomicAdd(reinterpret_cast<unsigned long long*>(a.wait_recv_cost + source), static_cast<unsigned long long>(clock64() - start));
        }
        group_sync();
        if (!all_came[group]) return;
        int begin = 0;
        for (int j = 0; j < p; ++j) begin += seen[j];
        const int count = seen[p];
        if (tid == 0) {
            a.recv_layout_range[e * n + s] = (static_cast<int64_t>(begin) << 32) | count;
            if (p == n - 1) {  // the last run: the expert's total, and our own run's range
                a.recv_count[e] = begin + count;
                if (a.cumulative_recv_stats != nullptr) a.cumulative_recv_stats[e] += begin + count;
                if (n > 1) a.recv_layout_range[e * n + me] = seen[0];
            }
        }
        if (p == 0) continue;  // our own rows are in place
        // The header's token and the row's scales are loaded before the row, so their latency
        // overlaps its first round of loads. Rounds of 8 vectors per lane: 16 (one round for a
        // 7 KB row) measured no faster in v5 and makes the kernel spill registers.
        const uint8_t* run = a.region.data[h] + (static_cast<int64_t>(e) * n + s) * T * msg_bytes;
        for (int i = warp; i < count; i += warps) {
            const uint8_t* m = run + static_cast<int64_t>(i) * msg_bytes;
            const int64_t packed = static_cast<int64_t>(e) * rows_per_expert + begin + i;
            const int token = lane == 0 ? __ldcg(reinterpret_cast<const int*>(m)) : 0;
            const float* scales = reinterpret_cast<const float*>(m + 16 + row_bytes);
            const float scale0 = lane < num_scales ? __ldcg(scales + lane) : 0.0f;
            const float scale1 = lane + 32 < num_scales ? __ldcg(scales + lane + 32) : 0.0f;
            warp_copy<true, 8>(a.recv_x + packed * row_bytes, m + 16, row_bytes, lane);
            if (lane == 0) a.recv_src_info[packed] = token;
            if (num_scales == 0) continue;
            void* column = a.use_ue8m0 ? static_cast<void*>(static_cast<uint8_t*>(a.recv_scales) +
                                                            (static_cast<int64_t>(e) * (num_scales / 4) * rows_per_expert + begin + i) * 4)
                                       : static_cast<void*>(static_cast<float*>(a.recv_scales) +
                                                            static_cast<int64_t>(e) * num_scales * rows_per_expert + begin + i);
            if (lane < num_scales) store_packed_scale(column, lane, rows_per_expert, a.use_ue8m0, scale0);
            if (lane + 32 < num_scales) store_packed_scale(column, lane + 32, rows_per_expert, a.use_ue8m0, scale1);
            for (int c = lane + 64; c < num_scales; c += 32)  // hidden > 8192: the rest
                store_packed_scale(column, c, rows_per_expert, a.use_ue8m0, __ldcg(scales + c));
        }
    }
}
// ANCHOR_END: dispatch_recv

__global__ void __launch_bounds__(LL_THREADS) dispatch(Workspace ws, LlDispatchArgs args, int phases) {
    run_call(ws, args, phases, dispatch_send, dispatch_recv);
}

}  // namespace nvshmem_tutorial
