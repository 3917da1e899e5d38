// Chapter 8: low-latency dispatch. The send phase casts each token once and stores it into the
// slots of its top-k experts on their ranks; the receive phase packs every expert's rows (the
// layout and the protocol's NOTES: low_latency.cuh).
#include "low_latency.cuh"

namespace nvshmem_tutorial {

// Rounded up to a vector: every slot, and so every row in it, must be 16-byte aligned for
// the vector copies (an fp8 message of hidden = FP8_GROUP x k carries 4k bytes of scales).
__host__ __device__ constexpr int dispatch_msg_bytes(int hidden, bool fp8) {
    return round_up_to_vector(LL_MSG_HEADER_BYTES + (fp8 ? hidden + hidden / FP8_GROUP * int(sizeof(float))
                                                         : hidden * int(sizeof(__nv_bfloat16))));
}

// What the send phase derives from its arguments, computed once at its top and handed to its
// helpers (rather than each re-reading `ws`: after a store through a pointer the compiler
// reads `ws` from memory again, and the kernel is at its register limit).
struct DispatchShape {
    int n, me;            // PEs, and this one
    int L, T;             // local experts per PE, slots per (expert, source)
    int msg_bytes;        // one message: header, row, scales, vector-aligned
    int row_bytes;        // a row as it travels: fp8 (one byte a channel) or bf16
    int num_scales;       // per row: one per FP8_GROUP channels in fp8, none in bf16
    int rows_per_expert;  // packed rows of one local expert: n x T
};

__device__ __forceinline__ DispatchShape dispatch_shape(const LlDispatchArgs& a) {
    const int n = a.topo.num_ranks, T = a.max_tokens;
    return DispatchShape{n,
                         a.topo.rank,
                         a.num_experts / n,
                         T,
                         dispatch_msg_bytes(a.hidden, a.use_fp8),
                         a.use_fp8 ? a.hidden : a.hidden * int(sizeof(__nv_bfloat16)),
                         a.use_fp8 ? a.hidden / FP8_GROUP : 0,
                         n * T};
}

// ---- dispatch -----------------------------------------------------------------------------

// The send phase's grain: 16 channels of a row, one lane's share of a cast. In: 32 bf16 bytes
// (two vectors); out: 16 fp8 bytes (one vector), or the same 32 bf16 bytes.
constexpr int UNIT_CHANNELS = 16;
constexpr int UNIT_BF16_BYTES = UNIT_CHANNELS * int(sizeof(__nv_bfloat16));
constexpr int UNIT_FP8_BYTES = UNIT_CHANNELS * int(sizeof(__nv_fp8_storage_t));
static_assert(UNIT_FP8_BYTES == VECTOR_BYTES && UNIT_BF16_BYTES == 2 * VECTOR_BYTES, "a unit is whole vectors");
// Lanes whose units share one fp8 scale: the amax is reduced across them.
constexpr int UNITS_PER_GROUP = FP8_GROUP / UNIT_CHANNELS;

// e4m3's largest finite value: a group's amax is scaled onto it.
constexpr float FP8_E4M3_MAX = 448.0f;
// The smallest amax a group is scaled by: an all-zero group stays finite.
constexpr float AMAX_FLOOR = 1e-4f;
// The f32 fields, to read a scale's power of two off its bits (round_scale, UE8M0).
constexpr int F32_MANTISSA_BITS = 23;
constexpr uint32_t F32_MANTISSA_MASK = (1u << F32_MANTISSA_BITS) - 1;
constexpr uint32_t F32_EXPONENT_MASK = 0xff;
constexpr int F32_EXPONENT_BIAS = 127;

// ANCHOR: cast
// 16 channels of a bf16 row (32 bytes) to fp8 e4m3 with one scale per 128 channels, DeepEP's
// recipe: amax over the 128 channels (8 lanes, at least 1e-4), scale = 448 / amax, rounded
// to a power of two with round_scale. Returns the 16 fp8 bytes; *scale_inv is what the
// receiver multiplies by. Every lane of the warp must call it (8-lane shuffles).
__device__ __forceinline__ uint4 cast_fp8(const float (&v)[UNIT_CHANNELS], bool round_scale, float* scale_inv) {
    float amax = AMAX_FLOOR;
#pragma unroll
    for (int j = 0; j < UNIT_CHANNELS; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
    for (int d = 1; d < UNITS_PER_GROUP; d *= 2) amax = fmaxf(amax, __shfl_xor_sync(ALL_LANES, amax, d));
    // DeepEP's arithmetic, to the bit: amax x (1 / 448) for the stored scale, 448 / amax to cast.
    constexpr float kInvMax = 1.0f / FP8_E4M3_MAX;
    float scale;
    if (round_scale) {
        const float x = amax * kInvMax;
        const uint32_t bits = __float_as_uint(x);
        const int exponent = static_cast<int>((bits >> F32_MANTISSA_BITS) & F32_EXPONENT_MASK) - F32_EXPONENT_BIAS +
                             ((bits & F32_MANTISSA_MASK) != 0);
        scale = __uint_as_float(static_cast<uint32_t>(F32_EXPONENT_BIAS - exponent) << F32_MANTISSA_BITS);
        *scale_inv = __uint_as_float(static_cast<uint32_t>(F32_EXPONENT_BIAS + exponent) << F32_MANTISSA_BITS);
    } else {
        scale = FP8_E4M3_MAX / amax;
        *scale_inv = amax * kInvMax;
    }
    uint4 out;
    auto* pairs = reinterpret_cast<__nv_fp8x2_storage_t*>(&out);
#pragma unroll
    for (int j = 0; j < UNIT_CHANNELS; j += 2) {
        pairs[j / 2] = __nv_cvt_float2_to_fp8x2(make_float2(v[j] * scale, v[j + 1] * scale), __NV_SATFINITE, __NV_E4M3);
    }
    return out;
}
// ANCHOR_END: cast

// One unit of bf16 (two vectors at p) as 16 floats.
__device__ __forceinline__ void load_bf16_unit(const uint8_t* p, float (&v)[UNIT_CHANNELS]) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    const auto* ha = reinterpret_cast<const __nv_bfloat162*>(&a);
    const auto* hb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int j = 0; j < BF16_PER_VECTOR / 2; ++j) {
        const float2 fa = __bfloat1622float2(ha[j]), fb = __bfloat1622float2(hb[j]);
        v[2 * j] = fa.x;
        v[2 * j + 1] = fa.y;
        v[BF16_PER_VECTOR + 2 * j] = fb.x;
        v[BF16_PER_VECTOR + 2 * j + 1] = fb.y;
    }
}

// Unit u of `row` cast to fp8 (zeros past the row's `units`); every lane calls it.
__device__ __forceinline__ uint4 cast_unit(const LlDispatchArgs& a, const uint8_t* row, int u, int units, float* scale_inv) {
    float v[UNIT_CHANNELS];
    if (u < units) {
        load_bf16_unit(row + u * UNIT_BF16_BYTES, v);
    } else {
#pragma unroll
        for (int j = 0; j < UNIT_CHANNELS; ++j) v[j] = 0.0f;
    }
    return cast_fp8(v, a.round_scale, scale_inv);  // every lane: 8-lane shuffles
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
// TMA-friendly layout): f32, or with use_ue8m0 the exponent byte, UE8M0_PER_INT per int32
// ([e][c / 4][rows][4]). `column` is recv_scales' element for (e, c = 0, this row).
__device__ __forceinline__ void store_packed_scale(void* column, int c, int rows_per_expert, bool ue8m0, float value) {
    if (ue8m0) {
        static_cast<uint8_t*>(column)[(static_cast<int64_t>(c / UE8M0_PER_INT) * rows_per_expert) * UE8M0_PER_INT +
                                      c % UE8M0_PER_INT] = static_cast<uint8_t>(__float_as_uint(value) >> F32_MANTISSA_BITS);
    } else {
        static_cast<float*>(column)[static_cast<int64_t>(c) * rows_per_expert] = value;
    }
}

// ANCHOR: dispatch_destination
// Token t's destination for expert e (checked, -1 for none) at slot i (token_slots), for one
// thread: the expert's counter counts it, then the destination is the peer's message slot
// (its header written here), our staging for a rank of another node, or, for an expert of
// this rank, the packed output row itself. No destination for -1 or a full run.
__device__ __forceinline__ Destination claim_destination(const Workspace& ws, const LlDispatchArgs& a, const DispatchShape& sh,
                                                         int h, int t, int e, int i) {
    const int L = sh.L, T = sh.T, num_scales = sh.num_scales, rows_per_expert = sh.rows_per_expert;
    Destination d{nullptr, nullptr, false};
    if (e < 0) return d;
    atomicAdd(a.state->slots + e, 1);  // the run's length, which the publisher sends
    const int pe = e / L;
    const int local = e % L;
    if (i >= T) {
        // Only a token naming one expert twice can get here (N <= T): the run of T slots
        // is full. Counted as sent, so the call completes; raised later.
        moe::record_input_error(a.bad_input, SLOTS_FULL, t, static_cast<uint64_t>(e), T);
    } else if (pe == sh.me) {
        const int64_t packed = static_cast<int64_t>(local) * rows_per_expert + i;
        a.recv_src_info[packed] = t;
        d.row = a.recv_x + packed * sh.row_bytes;
        d.local = true;
        if (num_scales > 0) {
            d.scales = a.use_ue8m0 ? static_cast<void*>(static_cast<uint8_t*>(a.recv_scales) +
                                                        (static_cast<int64_t>(local) * (num_scales / UE8M0_PER_INT) * rows_per_expert + i) *
                                                            UE8M0_PER_INT)
                                   : static_cast<void*>(static_cast<float*>(a.recv_scales) +
                                                        static_cast<int64_t>(local) * num_scales * rows_per_expert + i);
        }
    } else {
        // Our area of the peer's half h (same node), or area pe of our idle half, from where
        // the run leaves as one put (another node): the same offset either way.
        const uint64_t offset = (static_cast<uint64_t>(local) * T + i) * sh.msg_bytes;
        uint8_t* slot = same_node(a.topo, pe) ? node_peer(ws, a.topo, area(a.region, h, sh.me) + offset, pe)
                                              : area(a.region, h ^ 1, pe) + offset;
        if (slot == nullptr) return d;  // a route bug, recorded by node_peer
        *reinterpret_cast<int4*>(slot) = make_int4(t, 0, 0, 0);
        d.row = slot + LL_MSG_HEADER_BYTES;
        d.scales = slot + LL_MSG_HEADER_BYTES + a.hidden;
    }
    return d;
}
// ANCHOR_END: dispatch_destination

// ANCHOR: dispatch_fp8
// An fp8 row to every destination, after each thread cast its first unit (`first`): every
// warp walks the rest 16 channels a lane, casts each unit once and stores the same 16 bytes
// to all K destinations; each group's scale is kept in `row_scales` (one lane in 8).
__device__ __forceinline__ void send_fp8_row(const LlDispatchArgs& a, const Destination (&dst)[MAX_TOPK], float* row_scales,
                                             const uint8_t* row, int K, int lane, int units, const uint4& first,
                                             float first_scale) {
    auto store = [&](int u, const uint4& packed, float scale_inv) {
        for (int i = 0; i < K; ++i) {
            if (dst[i].row != nullptr) *reinterpret_cast<uint4*>(dst[i].row + u * UNIT_FP8_BYTES) = packed;
        }
        if (lane % UNITS_PER_GROUP == 0) row_scales[u / UNITS_PER_GROUP] = scale_inv;
    };
    const int u0 = threadIdx.x;
    if (u0 < units) store(u0, first, first_scale);
    // The rest of a long row; the whole warp runs every iteration (shuffles).
    for (int base = threadIdx.x - lane + blockDim.x; base < units; base += blockDim.x) {
        float scale_inv;
        const uint4 packed = cast_unit(a, row, base + lane, units, &scale_inv);
        if (base + lane < units) store(base + lane, packed, scale_inv);
    }
}

// After send_fp8_row (and a barrier): the row's scales, as 16-byte vectors into a message (its
// padding takes a partial last vector), one column entry each into this rank's packed layout.
__device__ __forceinline__ void send_scales(const LlDispatchArgs& a, const DispatchShape& sh, const Destination (&dst)[MAX_TOPK],
                                            const float* row_scales) {
    constexpr int F32_PER_VECTOR = VECTOR_BYTES / int(sizeof(float));
    const int K = a.num_topk, num_scales = sh.num_scales, rows_per_expert = sh.rows_per_expert;
    const int vectors = (num_scales + F32_PER_VECTOR - 1) / F32_PER_VECTOR;
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
}
// ANCHOR_END: dispatch_fp8

// A bf16 row to every destination: each thread copies 32 bytes at a time to all K, starting
// with the unit it loaded first (`lo`, `hi`).
__device__ __forceinline__ void send_bf16_row(const LlDispatchArgs& a, const Destination (&dst)[MAX_TOPK], const uint8_t* row,
                                              int K, int units, const uint4& lo, const uint4& hi) {
    auto store = [&](int u, const uint4& first_vector, const uint4& second_vector) {
        for (int i = 0; i < K; ++i) {
            if (dst[i].row == nullptr) continue;
            uint4* out = reinterpret_cast<uint4*>(dst[i].row + u * UNIT_BF16_BYTES);
            out[0] = first_vector;
            out[1] = second_vector;
        }
    };
    const int u0 = threadIdx.x;
    if (u0 < units) store(u0, lo, hi);
    for (int u = u0 + blockDim.x; u < units; u += blockDim.x) {
        const uint4* src = reinterpret_cast<const uint4*>(row + u * UNIT_BF16_BYTES);
        store(u, __ldg(src), __ldg(src + 1));
    }
}

// ANCHOR: dispatch_send
// Send phase: block b takes tokens b, b + grid, ...; for each, its top-k destinations get a
// slot each, and the block streams the token (cast once, from registers) into every slot.
__device__ __forceinline__ void dispatch_send(const Workspace& ws, const LlDispatchArgs& a, int h, uint64_t k) {
    __shared__ Destination dst[MAX_TOPK];
    __shared__ int experts[MAX_TOPK], slots[MAX_TOPK];
    __shared__ float row_scales[MAX_LL_HIDDEN / FP8_GROUP];
    const DispatchShape sh = dispatch_shape(a);
    const int K = a.num_topk, lane = threadIdx.x % WARP_SIZE;
    const int units = a.hidden / UNIT_CHANNELS;
    for (int t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
        __syncthreads();  // the previous token's destinations and scales are no longer read
        const uint8_t* row = a.x + static_cast<int64_t>(t) * a.hidden * int(sizeof(__nv_bfloat16));
        // Each thread's first unit is loaded (and cast) while threads < K take slots: the
        // two memory round trips overlap instead of following each other.
        const int u0 = threadIdx.x;
        uint4 first_lo = make_uint4(0, 0, 0, 0), first_hi = first_lo;
        float first_scale = 0.0f;
        if (a.use_fp8) {
            first_lo = cast_unit(a, row, u0, units, &first_scale);
        } else if (u0 < units) {
            first_lo = __ldg(reinterpret_cast<const uint4*>(row + u0 * UNIT_BF16_BYTES));
            first_hi = __ldg(reinterpret_cast<const uint4*>(row + u0 * UNIT_BF16_BYTES) + 1);
        }
        if (threadIdx.x < K) {
            const int64_t e = __ldg(a.topk_idx + t * K + threadIdx.x);
            experts[threadIdx.x] = valid_expert(a.bad_input, e, a.num_experts, t) ? static_cast<int>(e) : -1;
        }
        __syncthreads();
        token_slots(a.topk_idx, t, K, experts, slots);
        if (threadIdx.x < K) dst[threadIdx.x] = claim_destination(ws, a, sh, h, t, experts[threadIdx.x], slots[threadIdx.x]);
        __syncthreads();
        if (a.use_fp8) {
            send_fp8_row(a, dst, row_scales, row, K, lane, units, first_lo, first_scale);
            __syncthreads();  // row_scales complete
            send_scales(a, sh, dst, row_scales);
        } else {
            send_bf16_row(a, dst, row, K, units, first_lo, first_hi);
        }
    }
    const int warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    finish_sends(
        ws, a.topo, a.region, a.state, h, sh.L, k,
        // Each of rank d's counters is read and reset in one step.
        [&](int d, int e) { return min(atomicExch(a.state->slots + d * sh.L + e, 0), sh.T); },
        [&](int d) {  // another node: rank d's experts' runs, a put-with-signal each, a warp each
            for (int e = warp; e < sh.L; e += warps) {
                int count = lane == 0 ? min(atomicExch(a.state->slots + d * sh.L + e, 0), sh.T) : 0;
                count = __shfl_sync(ALL_LANES, count, 0);
                publish_run(ws, a.topo, a.region, h, d, e, sh.L, (k << 32) | static_cast<uint32_t>(count),
                            static_cast<uint64_t>(e) * sh.T * sh.msg_bytes, static_cast<size_t>(count) * sh.msg_bytes, lane);
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
    __shared__ int counts[kMaxGroups][MAX_LL_RANKS];  // the group's expert's counts, by position
    __shared__ int all_came[kMaxGroups];
    const int n = a.topo.num_ranks, me = a.topo.rank, L = a.num_experts / n, T = a.max_tokens;
    const int positions = n > 1 ? n - 1 : 1;  // units per expert: the remote sources (or, alone, our own)
    const int units = positions * L;
    int groups = 1;
    while (groups < kMaxGroups && groups * static_cast<int>(gridDim.x) < units) groups *= 2;
    const int group_threads = blockDim.x / groups, group = threadIdx.x / group_threads;
    const int tid = threadIdx.x % group_threads, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, warps = group_threads / WARP_SIZE;
    int* seen = counts[group];
    // Named barrier 1 + group: the group's threads only (barrier 0 is __syncthreads).
    auto group_sync = [&] { named_barrier_sync(group + 1, group_threads); };
    const int msg_bytes = dispatch_msg_bytes(a.hidden, a.use_fp8);
    const int row_bytes = a.use_fp8 ? a.hidden : a.hidden * int(sizeof(__nv_bfloat16));
    const int num_scales = a.use_fp8 ? a.hidden / FP8_GROUP : 0;
    const int rows_per_expert = n * T;
    for (int u = blockIdx.x + group * gridDim.x; u < units; u += gridDim.x * groups) {
        const int e = u % L;
        const int p = n > 1 ? 1 + u / L : 0;  // the unit's position in the ring order
        const int s = (me + p) % n;
        group_sync();  // the previous unit's counts are no longer read
        if (tid == 0) all_came[group] = 1;
        group_sync();
        // The sources up to p, a thread each (a loop past the group's threads: 256 ranks).
        for (int j = tid; j <= p; j += group_threads) {
            const int source = (me + j) % n;
            const long long start = clock64();
            uint64_t word = 0;
            if (!wait_at_least(ws, a.region.counts[h] + source * L + e, k << 32, WAIT_LL_DISPATCH, failure_rank(a.topo, source), k,
                               &word))
                all_came[group] = 0;
            seen[j] = min(static_cast<int>(word & 0xffffffffu), T);
            // Each source's wait counted once per expert: by its own unit, ours by the last.
            if (a.wait_recv_cost != nullptr && (j == p || (j == 0 && p == n - 1)))
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
        // ANCHOR_END: dispatch_recv
        // ANCHOR: dispatch_recv_copy
        if (p == 0) continue;  // our own rows are in place
        // The header's token and the row's scales are loaded before the row, so their latency
        // overlaps its first round of loads. Rounds of 8 vectors per lane: 16 (one round for a
        // 7 KB row) measured no faster (benchmarks/notes/buffer.md) and makes the kernel spill
        // registers.
        const uint8_t* run = area(a.region, h, s) + static_cast<uint64_t>(e) * T * msg_bytes;
        for (int i = warp; i < count; i += warps) {
            const uint8_t* m = run + static_cast<int64_t>(i) * msg_bytes;
            const int64_t packed = static_cast<int64_t>(e) * rows_per_expert + begin + i;
            const int token = lane == 0 ? __ldcg(reinterpret_cast<const int*>(m)) : 0;
            const float* scales = reinterpret_cast<const float*>(m + LL_MSG_HEADER_BYTES + row_bytes);
            const float scale0 = lane < num_scales ? __ldcg(scales + lane) : 0.0f;
            const float scale1 = lane + WARP_SIZE < num_scales ? __ldcg(scales + lane + WARP_SIZE) : 0.0f;
            warp_copy<true, 8>(a.recv_x + packed * row_bytes, m + LL_MSG_HEADER_BYTES, row_bytes, lane);
            if (lane == 0) a.recv_src_info[packed] = token;
            if (num_scales == 0) continue;
            void* column = a.use_ue8m0 ? static_cast<void*>(static_cast<uint8_t*>(a.recv_scales) +
                                                            (static_cast<int64_t>(e) * (num_scales / UE8M0_PER_INT) * rows_per_expert + begin + i) *
                                                                UE8M0_PER_INT)
                                       : static_cast<void*>(static_cast<float*>(a.recv_scales) +
                                                            static_cast<int64_t>(e) * num_scales * rows_per_expert + begin + i);
            if (lane < num_scales) store_packed_scale(column, lane, rows_per_expert, a.use_ue8m0, scale0);
            if (lane + WARP_SIZE < num_scales) store_packed_scale(column, lane + WARP_SIZE, rows_per_expert, a.use_ue8m0, scale1);
            for (int c = lane + 2 * WARP_SIZE; c < num_scales; c += WARP_SIZE)  // hidden > 8192: the rest
                store_packed_scale(column, c, rows_per_expert, a.use_ue8m0, __ldcg(scales + c));
        }
        // ANCHOR_END: dispatch_recv_copy
    }
}

__global__ void __launch_bounds__(LL_THREADS) dispatch(Workspace ws, LlDispatchArgs args, int phases) {
    run_call(ws, args, phases, dispatch_send, dispatch_recv);
}

}  // namespace nvshmem_tutorial
