// Chapter 7: normal-mode dispatch inside one node (`moe_scatter`; its inverse, combine, is
// combine.cu).
//
// Dispatch scatters each token to the PEs that hold any of its experts. It runs 2 x
// num_channels blocks: blocks [0, C) send channel c = blockIdx.x, blocks [C, 2C) receive it,
// and inside a block the warps split into one group per peer. Channel c owns a contiguous
// range of the original tokens, so walking a channel's tokens in order and its rings in order
// keeps every PE's received tokens sorted by (source PE, source token): DeepEP's order.
//
// Tokens for ourselves skip the ring: the sender writes them straight into our outputs.
#include "moe.cuh"

using namespace moe;

// ScatterArgs, the kernel's arguments, and DispatchSlot are the host/device contract:
// kernels/contract/defs.rs.

// A dispatch slot's parts (DispatchSlot in the contract: the row, then the metadata):
//   [src_idx: int32][pad: int32][topk_idx: int64 x K][topk_weights: f32 x K][scales: f32 x S]
__device__ __forceinline__ int slot_meta(const DispatchSlot& s) {
    return (s.hidden_bytes + VECTOR_BYTES - 1) / VECTOR_BYTES * VECTOR_BYTES;
}
__device__ __forceinline__ int slot_topk_idx(const DispatchSlot& s) { return slot_meta(s) + DISPATCH_SLOT_HEADER_BYTES; }
__device__ __forceinline__ int slot_topk_weights(const DispatchSlot& s) {
    return slot_topk_idx(s) + int(sizeof(int64_t)) * s.num_topk;
}
__device__ __forceinline__ int slot_scales(const DispatchSlot& s) { return slot_topk_weights(s) + int(sizeof(float)) * s.num_topk; }

// The high bit of a receiver's shared tail: its wait gave up. The warps skip the copies but
// keep meeting at the group's barriers, so no warp waits at a barrier the others never reach.
constexpr uint64_t TAIL_GAVE_UP = 1ull << 63;

// Scales one lane carries with a token's metadata: lane and lane + WARP_SIZE, so the first
// WARP_SIZE x LANE_SCALES scales of a row (hidden <= 8192 at FP8_GROUP channels a scale) ride
// along with the row; a wider row's rest is copied after it.
constexpr int LANE_SCALES = 2;

// One token's metadata as one lane carries it. It is loaded before the token's row is copied
// and stored after, so its loads ride along with the row's first round trip instead of adding
// round trips of their own after it: at 7168 fp8 bytes a row is only two rounds of loads per
// lane, and the copy is bound by those round trips, not by bandwidth.
struct LaneMeta {
    int src_idx;                // lane 0
    int64_t topk_idx;           // lanes < num_topk
    float topk_weight;          // lanes < num_topk
    float scales[LANE_SCALES];  // scales lane + WARP_SIZE x j
};

// Where one token's metadata goes: a ring slot, or our own outputs.
struct MetaDst {
    int* src_idx;
    int64_t* topk_idx;
    float* topk_weights;
    float* scales;
};

// Token t's metadata from the sender's arrays. `dst_pe` decides which experts are local
// (their ids become 0..L-1, the rest -1 with weight 0).
__device__ __forceinline__ LaneMeta load_meta(const ScatterArgs& a, int t, int dst_pe, int n, int lane) {
    LaneMeta m{t, -1, 0.0f, {0.0f, 0.0f}};
    if (a.topk_idx != nullptr && lane < a.slot.num_topk) {
        const int num_local = a.num_experts / n;
        const int64_t expert = __ldg(a.topk_idx + int64_t(t) * a.slot.num_topk + lane);
        const float weight = __ldg(a.topk_weights + int64_t(t) * a.slot.num_topk + lane);
        const bool local = expert >= int64_t(dst_pe) * num_local && expert < int64_t(dst_pe + 1) * num_local;
        m.topk_idx = local ? expert - int64_t(dst_pe) * num_local : -1;
        m.topk_weight = local ? weight : 0.0f;
    }
    if (a.x_scales != nullptr) {
#pragma unroll
        for (int j = 0; j < LANE_SCALES; ++j) {
            const int k = lane + WARP_SIZE * j;
            if (k < a.slot.num_scales) m.scales[j] = __ldg(a.x_scales + int64_t(t) * a.scale_token_stride + int64_t(k) * a.scale_hidden_stride);
        }
    }
    return m;
}

// The same metadata from a ring slot a peer wrote during this kernel (read through L2).
__device__ __forceinline__ LaneMeta load_slot_meta(const ScatterArgs& a, const uint8_t* slot, bool with_topk,
                                                   bool with_scales, int lane) {
    LaneMeta m{0, -1, 0.0f, {0.0f, 0.0f}};
    if (lane == 0) m.src_idx = __ldcg(reinterpret_cast<const int*>(slot + slot_meta(a.slot)));
    if (with_topk && lane < a.slot.num_topk) {
        m.topk_idx = __ldcg(reinterpret_cast<const long long*>(slot + slot_topk_idx(a.slot)) + lane);
        m.topk_weight = __ldcg(reinterpret_cast<const float*>(slot + slot_topk_weights(a.slot)) + lane);
    }
    if (with_scales) {
#pragma unroll
        for (int j = 0; j < LANE_SCALES; ++j) {
            const int k = lane + WARP_SIZE * j;
            if (k < a.slot.num_scales) m.scales[j] = __ldcg(reinterpret_cast<const float*>(slot + slot_scales(a.slot)) + k);
        }
    }
    return m;
}

// Stores what load_meta / load_slot_meta loaded; scales past the lanes' own are copied here
// with `scale(k)`, one dependent round trip each WARP_SIZE (only rows wider than 8192 have them).
template <typename Scale>
__device__ __forceinline__ void store_meta(const LaneMeta& m, const MetaDst& dst, int num_topk, int num_scales,
                                           bool with_topk, bool with_scales, int lane, Scale scale) {
    if (lane == 0) *dst.src_idx = m.src_idx;
    if (with_topk && lane < num_topk) {
        dst.topk_idx[lane] = m.topk_idx;
        dst.topk_weights[lane] = m.topk_weight;
    }
    if (with_scales) {
#pragma unroll
        for (int j = 0; j < LANE_SCALES; ++j) {
            if (lane + WARP_SIZE * j < num_scales) dst.scales[lane + WARP_SIZE * j] = m.scales[j];
        }
        for (int k = lane + WARP_SIZE * LANE_SCALES; k < num_scales; k += WARP_SIZE) dst.scales[k] = scale(k);
    }
}

// ANCHOR: scatter_send
// Sender of channel c to PE d: walk the channel's tokens 32 at a time; a ballot says which
// go to d and gives each its position in the ring; the group's warps copy them round-robin;
// then one thread publishes the new tail.
__device__ void scatter_send(const Workspace& ws, const ScatterArgs& a, uint64_t epoch, int c, const PeerGroup& g) {
    const int me = ws.my_pe, n = ws.n_pes, d = g.peer, lane = threadIdx.x % WARP_SIZE;
    const bool to_self = d == me;
    int begin, end;
    channel_range(a.num_tokens, a.num_channels, c, &begin, &end);
    const uint64_t base = a.sent[c * MAX_PES + d];
    uint8_t* ring = to_self ? nullptr : peer(ws, a.nvl, d) + int64_t(c * n + me) * a.ring_tokens * a.slot.bytes;
    uint64_t* head = a.heads + c * MAX_PES + d;
    // Our own tokens land in our outputs after those of PEs 0..me-1 and of channels 0..c-1.
    const int self_first = (me > 0 ? a.rank_prefix_matrix[(me - 1) * n + me] : 0) +
                           (c > 0 ? a.channel_prefix_matrix[d * a.num_channels + c - 1] : 0);
    // Writing into d's rings needs d to have entered this call (moe.cuh, NOTES).
    bool alive = to_self || lane != 0 || wait_counter(ws, ws.ready + d, epoch, WAIT_READY, d, epoch);
    alive = __shfl_sync(ALL_LANES, alive, 0);
    uint64_t pos = base;
    for (int w0 = begin; w0 < end; w0 += WINDOW_TOKENS) {
        const int t = w0 + lane;
        const bool selected = t < end && a.is_token_in_rank[int64_t(t) * n + d];
        const uint32_t mask = __ballot_sync(ALL_LANES, selected);
        if (g.member == 0 && t < end) {
            a.send_head[int64_t(t) * n + d] = selected ? int(pos - base) + __popc(mask & lanemask_lt()) : -1;
        }
        const int count = __popc(mask);
        if (count == 0) continue;
        if (!to_self && alive && lane == 0) {
            alive = wait_counter(ws, head, space_needed(pos + count, a.ring_tokens), WAIT_RING_SPACE, d, epoch);
        }
        alive = __shfl_sync(ALL_LANES, alive, 0);
        for (int j = g.member; alive && j < count; j += g.size) {
            const int token = w0 + __fns(mask, 0, j + 1);  // the j-th selected token of the window
            const uint64_t k = pos + j;
            if (to_self && self_first + int64_t(k - base) >= a.num_recv_rows) continue;  // check_recv_rows records it
            const LaneMeta m = load_meta(a, token, d, n, lane);
            uint8_t* row;
            MetaDst dst;
            if (to_self) {
                const int64_t r = self_first + int64_t(k - base);
                row = a.recv_x + r * a.slot.hidden_bytes;
                dst = {a.recv_src_idx + r, a.recv_topk_idx + r * a.slot.num_topk, a.recv_topk_weights + r * a.slot.num_topk,
                       a.recv_x_scales + r * a.slot.num_scales};
            } else {
                row = ring + int64_t(k % a.ring_tokens) * a.slot.bytes;
                dst = {reinterpret_cast<int*>(row + slot_meta(a.slot)), reinterpret_cast<int64_t*>(row + slot_topk_idx(a.slot)),
                       reinterpret_cast<float*>(row + slot_topk_weights(a.slot)), reinterpret_cast<float*>(row + slot_scales(a.slot))};
            }
            warp_copy<false, 4>(row, a.x + int64_t(token) * a.slot.hidden_bytes, a.slot.hidden_bytes, lane);
            store_meta(m, dst, a.slot.num_topk, a.slot.num_scales, a.topk_idx != nullptr, a.x_scales != nullptr, lane,
                       [&](int k) { return a.x_scales[int64_t(token) * a.scale_token_stride + int64_t(k) * a.scale_hidden_stride]; });
        }
        pos += count;
        if (!to_self) {
            g.sync();  // every warp of the group has stored its tokens of this window
            if (g.member == 0 && lane == 0 && alive) st_release_sys(peer(ws, a.tails + c * MAX_PES + me, d), pos);
        }
    }
    if (g.member == 0 && lane == 0) a.sent[c * MAX_PES + d] = pos;
}
// ANCHOR_END: scatter_send

// ANCHOR: scatter_receive
// Receiver of channel c from PE s: wait for the tail to move, copy the new slots into our
// outputs at their final rows, publish the head so the sender may reuse the slots.
__device__ void scatter_receive(const Workspace& ws, const ScatterArgs& a, uint64_t epoch, int c, const PeerGroup& g) {
    __shared__ uint64_t seen_tail[MAX_PES];
    const int me = ws.my_pe, n = ws.n_pes, s = g.peer, lane = threadIdx.x % WARP_SIZE;
    if (s == me) return;  // the sender wrote our own tokens in place
    int first, count;
    rows_from(a.rank_prefix_matrix, a.recv_channel_prefix_matrix, n, me, a.num_channels, s, c, &first, &count);
    const uint64_t base = a.received[c * MAX_PES + s], target = base + count;
    const uint8_t* ring = a.nvl + int64_t(c * n + s) * a.ring_tokens * a.slot.bytes;
    const uint64_t* tail = a.tails + c * MAX_PES + s;
    for (uint64_t head = base; head < target;) {
        if (g.member == 0 && lane == 0) {
            const bool arrived = wait_counter(ws, tail, head + 1, WAIT_RING_DATA, s, epoch);
            seen_tail[s] = arrived ? min(ld_acquire_sys(tail), target) : target;
            if (!arrived) seen_tail[s] |= TAIL_GAVE_UP;
        }
        g.sync();
        const uint64_t seen = seen_tail[s];
        const bool alive = !(seen & TAIL_GAVE_UP);
        const uint64_t new_tail = seen & ~TAIL_GAVE_UP;
        // Slots whose rows lie past our outputs are consumed, not copied (check_recv_rows).
        const uint64_t copy_end = min(new_tail, base + uint64_t(max(0, a.num_recv_rows - first)));
        for (uint64_t k = head + g.member; alive && k < copy_end; k += g.size) {
            const uint8_t* slot = ring + int64_t(k % a.ring_tokens) * a.slot.bytes;
            const int64_t r = first + int64_t(k - base);
            const bool with_topk = a.recv_topk_idx != nullptr, with_scales = a.recv_x_scales != nullptr;
            const LaneMeta m = load_slot_meta(a, slot, with_topk, with_scales, lane);
            warp_copy<true, 4>(a.recv_x + r * a.slot.hidden_bytes, slot, a.slot.hidden_bytes, lane);
            const MetaDst dst{a.recv_src_idx + r, a.recv_topk_idx + r * a.slot.num_topk, a.recv_topk_weights + r * a.slot.num_topk,
                              a.recv_x_scales + r * a.slot.num_scales};
            store_meta(m, dst, a.slot.num_topk, a.slot.num_scales, with_topk, with_scales, lane,
                       [&](int k) { return __ldcg(reinterpret_cast<const float*>(slot + slot_scales(a.slot)) + k); });
        }
        g.sync();  // every slot up to new_tail has been read
        if (g.member == 0 && lane == 0 && alive) st_release_sys(peer(ws, a.heads + c * MAX_PES + me, s), new_tail);
        head = new_tail;
    }
    if (g.member == 0 && lane == 0) a.received[c * MAX_PES + s] = target;
}
// ANCHOR_END: scatter_receive

// Worst-case outputs (num_recv_rows fixed by the caller, for CUDA graphs): the rows past the
// ones received hold no expert. The receiving blocks share the work.
__device__ __forceinline__ void clear_unreceived_topk(const Workspace& ws, const ScatterArgs& a, int c) {
    const int received = a.rank_prefix_matrix[(ws.n_pes - 1) * ws.n_pes + ws.my_pe];
    if (a.recv_topk_idx == nullptr) return;
    const int64_t begin = int64_t(received) * a.slot.num_topk, end = int64_t(a.num_recv_rows) * a.slot.num_topk;
    for (int64_t i = begin + c * blockDim.x + threadIdx.x; i < end; i += int64_t(a.num_channels) * blockDim.x) {
        a.recv_topk_idx[i] = -1;
    }
}

// Dispatch. Grid 2 x num_channels: blocks [0, C) send, [C, 2C) receive. Blocks of 32 x k
// warps, k >= n_pes: a sender has k / n_pes warps per PE (itself included), a receiver
// k / (n_pes - 1) per peer.
extern "C" __global__ void __launch_bounds__(CHANNEL_THREADS) moe_scatter(const __grid_constant__ Workspace ws,
                                                               const __grid_constant__ ScatterArgs a) {
    const uint64_t epoch = begin_call(ws);
    const int c = blockIdx.x % a.num_channels;
    if (blockIdx.x < a.num_channels) {
        const PeerGroup g(ws.n_pes);  // our own tokens are a group's work too
        if (g.active()) scatter_send(ws, a, epoch, c, g);
    } else {
        const PeerGroup g(ws.n_pes, ws.my_pe);  // our own tokens were written by the sender
        if (c == 0 && threadIdx.x == 0) check_recv_rows(a.bad_input, a.rank_prefix_matrix, ws.n_pes, ws.my_pe, a.num_recv_rows);
        if (g.active()) scatter_receive(ws, a, epoch, c, g);
        clear_unreceived_topk(ws, a, c);
    }
    end_call(ws, epoch);
}
