// Chapter 7: normal-mode dispatch and combine inside one node.
//
// Dispatch scatters each token to the PEs that hold any of its experts; combine gathers the
// experts' results back and sums them on the token's PE. Both run 2 x num_channels blocks:
// blocks [0, C) send channel c = blockIdx.x, blocks [C, 2C) receive it, and inside a block
// the warps split into one group per peer. Channel c owns a contiguous range of the original
// tokens, so walking a channel's tokens in order and its rings in order keeps every PE's
// received tokens sorted by (source PE, source token): DeepEP's order.
//
// Tokens for ourselves skip the ring: the sender writes them straight into our outputs, and
// combine reads them straight from our own expert outputs.
#include "moe.cuh"

using namespace moe;

// A dispatch slot's parts (DispatchSlot in the contract: the row, then the metadata):
//   [src_idx: int32][pad: int32][topk_idx: int64 x K][topk_weights: f32 x K][scales: f32 x S]
__device__ __forceinline__ int slot_meta(const DispatchSlot& s) { return (s.hidden_bytes + 15) / 16 * 16; }
__device__ __forceinline__ int slot_topk_idx(const DispatchSlot& s) { return slot_meta(s) + 8; }
__device__ __forceinline__ int slot_topk_weights(const DispatchSlot& s) { return slot_topk_idx(s) + 8 * s.num_topk; }
__device__ __forceinline__ int slot_scales(const DispatchSlot& s) { return slot_topk_weights(s) + 4 * s.num_topk; }

// ScatterArgs (dispatch) and GatherArgs (combine), the kernels' arguments, are the host/device
// contract: kernels/contract/defs.rs.

// Rows PE `src` delivered to us in channel c: where they start in our received rows, and how
// many there are.
__device__ __forceinline__ void rows_from(const int* rank_prefix_matrix, const int* recv_channel_prefix_matrix, int n,
                                          int me, int num_channels, int src, int c, int* first, int* count) {
    const int before_src = src > 0 ? rank_prefix_matrix[(src - 1) * n + me] : 0;
    const int total = rank_prefix_matrix[src * n + me] - before_src;
    const int start = recv_channel_prefix_matrix[src * num_channels + c];
    const int next = c + 1 < num_channels ? recv_channel_prefix_matrix[src * num_channels + c + 1] : total;
    *first = before_src + start;
    *count = next - start;
}

// Before filling a ring up to position `end`, the receiver's head must have reached
// end - ring_tokens (counters are unsigned: nothing to wait for while end fits).
__device__ __forceinline__ uint64_t space_needed(uint64_t end, int ring_tokens) {
    return end > uint64_t(ring_tokens) ? end - ring_tokens : 0;
}

// Rows a combine sender stores before it publishes its tail (at most a ring). The grain of
// the pipeline: the receiver sums a token only once every PE's row of it is published, and a
// channel carries a few hundred rows per peer, so a smaller window starts the receiver
// sooner, even with some of a 32-warp group idle per window. Measured at EP2 (build-time
// override, benchmarks/notes/buffer.md): 128 rows 295 us, 64 260, 32 232, 16 221, 8 296.
#ifndef COMBINE_WINDOW
#define COMBINE_WINDOW 16
#endif

// acc[u][i] += element i of 8-element bf16 vector v0 + 32u of `row` (vectors past
// `num_vectors` skipped): the loads first, then the adds.
template <int UNROLL>
__device__ __forceinline__ void add_rows(float (&acc)[UNROLL][8], const uint8_t* row, int v0, int num_vectors) {
    uint4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (v0 + 32 * u < num_vectors) raw[u] = reinterpret_cast<const uint4*>(row)[v0 + 32 * u];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (v0 + 32 * u >= num_vectors) continue;
        const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[u][i] += __bfloat162float(h[i]);
    }
}

__device__ __forceinline__ uint32_t lanes_below() {
    uint32_t mask;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
    return mask;
}

// One token's metadata as one lane carries it. It is loaded before the token's row is copied
// and stored after, so its loads ride along with the row's first round trip instead of adding
// round trips of their own after it: at 7168 fp8 bytes a row is only two rounds of loads per
// lane, and the copy is bound by those round trips, not by bandwidth.
struct LaneMeta {
    int src_idx;          // lane 0
    int64_t topk_idx;     // lanes < num_topk
    float topk_weight;    // lanes < num_topk
    float scales[2];      // scales lane and lane + 32; rows with more (hidden > 8192) copy the rest after
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
        for (int j = 0; j < 2; ++j) {
            const int k = lane + 32 * j;
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
        for (int j = 0; j < 2; ++j) {
            const int k = lane + 32 * j;
            if (k < a.slot.num_scales) m.scales[j] = __ldcg(reinterpret_cast<const float*>(slot + slot_scales(a.slot)) + k);
        }
    }
    return m;
}

// Stores what load_meta / load_slot_meta loaded; scales past the first 64 are copied here
// with `scale(k)`, one dependent round trip each 32 (only rows wider than 8192 have them).
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
        for (int j = 0; j < 2; ++j) {
            if (lane + 32 * j < num_scales) dst.scales[lane + 32 * j] = m.scales[j];
        }
        for (int k = lane + 64; k < num_scales; k += 32) dst.scales[k] = scale(k);
    }
}

// ANCHOR: scatter_send
// Sender of channel c to PE d: walk the channel's tokens 32 at a time; a ballot says which
// go to d and gives each its position in the ring; the group's warps copy them round-robin;
// then one thread publishes the new tail.
__device__ void scatter_send(const Workspace& ws, const ScatterArgs& a, uint64_t epoch, int c, const PeerGroup& g) {
    const int me = ws.my_pe, n = ws.n_pes, d = g.peer, lane = threadIdx.x % 32;
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
    alive = __shfl_sync(0xffffffff, alive, 0);
    uint64_t pos = base;
    for (int w0 = begin; w0 < end; w0 += WINDOW_TOKENS) {
        const int t = w0 + lane;
        const bool selected = t < end && a.is_token_in_rank[int64_t(t) * n + d];
        const uint32_t mask = __ballot_sync(0xffffffff, selected);
        if (g.member == 0 && t < end) {
            a.send_head[int64_t(t) * n + d] = selected ? int(pos - base) + __popc(mask & lanes_below()) : -1;
        }
        const int count = __popc(mask);
        if (count == 0) continue;
        if (!to_self && alive && lane == 0) {
            alive = wait_counter(ws, head, space_needed(pos + count, a.ring_tokens), WAIT_RING_SPACE, d, epoch);
        }
        alive = __shfl_sync(0xffffffff, alive, 0);
        for (int j = g.member; alive && j < count; j += g.size) {
            const int token = w0 + __fns(mask, 0, j + 1);  // the j-th selected token of the window
            const uint64_t k = pos + j;
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
    const int me = ws.my_pe, n = ws.n_pes, s = g.peer, lane = threadIdx.x % 32;
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
            if (!arrived) seen_tail[s] |= 1ull << 63;  // give up: skip the copies, keep the barriers
        }
        g.sync();
        const uint64_t seen = seen_tail[s];
        const bool alive = !(seen >> 63);
        const uint64_t new_tail = seen & ~(1ull << 63);
        for (uint64_t k = head + g.member; alive && k < new_tail; k += g.size) {
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
        if (g.active()) scatter_receive(ws, a, epoch, c, g);
        // Worst-case outputs: rows past the ones received hold no expert.
        const int received = a.rank_prefix_matrix[(ws.n_pes - 1) * ws.n_pes + ws.my_pe];
        if (a.recv_topk_idx != nullptr) {
            const int64_t begin = int64_t(received) * a.slot.num_topk, end = int64_t(a.num_recv_rows) * a.slot.num_topk;
            for (int64_t i = begin + c * blockDim.x + threadIdx.x; i < end; i += int64_t(a.num_channels) * blockDim.x) {
                a.recv_topk_idx[i] = -1;
            }
        }
    }
    end_call(ws, epoch);
}

// ANCHOR: gather_send
// Combine, sender side of channel c to PE s (the tokens' owner): push, in received order, the
// rows s delivered to us in channel c, with their top-k weights.
__device__ void gather_send(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c, const PeerGroup& g) {
    const int me = ws.my_pe, n = ws.n_pes, s = g.peer, lane = threadIdx.x % 32;
    if (s == me) return;  // the owner reads our own rows in place
    int first, count;
    rows_from(a.rank_prefix_matrix, a.recv_channel_prefix_matrix, n, me, a.num_channels, s, c, &first, &count);
    const uint64_t base = a.sent[c * MAX_PES + s];
    uint8_t* ring = peer(ws, a.nvl, s) + int64_t(c * n + me) * a.ring_tokens * a.slot_bytes;
    const int weights_at = (a.hidden_bytes + 15) / 16 * 16;
    bool alive = lane != 0 || wait_counter(ws, ws.ready + s, epoch, WAIT_READY, s, epoch);
    alive = __shfl_sync(0xffffffff, alive, 0);
    const int full_window = min(COMBINE_WINDOW, a.ring_tokens);
    for (int w0 = 0; w0 < count; w0 += full_window) {
        const int window = min(full_window, count - w0);
        const uint64_t pos = base + w0;
        if (alive && lane == 0) {
            alive = wait_counter(ws, a.heads + c * MAX_PES + s, space_needed(pos + window, a.ring_tokens), WAIT_RING_SPACE, s, epoch);
        }
        alive = __shfl_sync(0xffffffff, alive, 0);
        for (int j = g.member; alive && j < window; j += g.size) {
            const int64_t r = first + w0 + j;
            uint8_t* slot = ring + int64_t((pos + j) % a.ring_tokens) * a.slot_bytes;
            warp_copy<false, 4>(slot, a.x + r * a.hidden_bytes, a.hidden_bytes, lane);
            if (lane < a.num_topk) {
                reinterpret_cast<float*>(slot + weights_at)[lane] =
                    a.topk_weights != nullptr ? a.topk_weights[r * a.num_topk + lane] : 0.0f;
            }
        }
        g.sync();
        if (g.member == 0 && lane == 0 && alive) st_release_sys(peer(ws, a.tails + c * MAX_PES + me, s), pos + window);
    }
    if (g.member == 0 && lane == 0) a.sent[c * MAX_PES + s] = base + count;
}
// ANCHOR_END: gather_send

// ANCHOR: gather_receive
// Combine, receiver side of channel c: every warp takes one of the channel's tokens at a
// time, finds each PE's result for it (send_head says where in that PE's ring), waits for it
// if it has not arrived, and sums in fp32: bias0 + bias1 + the PEs' rows in PE order.
// After each round of tokens, thread p publishes how far ring (c, p) has been consumed.
__device__ void gather_receive(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c) {
    __shared__ int consumed[MAX_PES];
    const int me = ws.my_pe, n = ws.n_pes, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int num_warps = blockDim.x / 32;
    int begin, end;
    channel_range(a.num_tokens, a.num_channels, c, &begin, &end);
    int self_first, self_count;  // where our own results for this channel's tokens are in x
    rows_from(a.rank_prefix_matrix, a.recv_channel_prefix_matrix, n, me, a.num_channels, me, c, &self_first, &self_count);
    const int weights_at = (a.hidden_bytes + 15) / 16 * 16;
    if (threadIdx.x < n) consumed[threadIdx.x] = 0;
    __syncthreads();
    bool alive = true;
    for (int round = begin; round < end; round += num_warps) {
        const int t = round + warp;
        if (t < end) {
            const uint8_t* rows[MAX_PES];
            const float* weights[MAX_PES];
            int num_rows = 0;
            for (int p = 0; p < n; ++p) {
                const int k = a.send_head[int64_t(t) * n + p];
                if (k < 0) continue;
                if (p == me) {
                    const int64_t r = self_first + k;
                    rows[num_rows] = a.x + r * a.hidden_bytes;
                    weights[num_rows++] = a.topk_weights != nullptr ? a.topk_weights + r * a.num_topk : nullptr;
                    continue;
                }
                const uint64_t pos = a.received[c * MAX_PES + p] + k;
                if (alive && lane == 0) alive = wait_counter(ws, a.tails + c * MAX_PES + p, pos + 1, WAIT_RING_DATA, p, epoch);
                alive = __shfl_sync(0xffffffff, alive, 0);
                const uint8_t* slot = a.nvl + (int64_t(c * n + p) * a.ring_tokens + int64_t(pos % a.ring_tokens)) * a.slot_bytes;
                rows[num_rows] = slot;
                weights[num_rows++] = reinterpret_cast<const float*>(slot + weights_at);
            }
            if (alive) {
                // UNROLL vectors per lane at a time, every row's loads issued before any add:
                // the sum is bound by memory latency, so loads in flight are what count.
                constexpr int UNROLL = 4;
                const int num_vectors = a.hidden_bytes / 16;
                const int64_t row_offset = int64_t(t) * a.hidden_bytes;
                for (int v0 = lane; v0 < num_vectors; v0 += 32 * UNROLL) {
                    float acc[UNROLL][8] = {};
                    if (a.bias0 != nullptr) add_rows(acc, a.bias0 + row_offset, v0, num_vectors);
                    if (a.bias1 != nullptr) add_rows(acc, a.bias1 + row_offset, v0, num_vectors);
                    for (int r = 0; r < num_rows; ++r) add_rows(acc, rows[r], v0, num_vectors);
#pragma unroll
                    for (int u = 0; u < UNROLL; ++u) {
                        const int v = v0 + 32 * u;
                        if (v >= num_vectors) break;
                        uint4 out;
                        __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
                        for (int i = 0; i < 8; ++i) o[i] = __float2bfloat16_rn(acc[u][i]);
                        reinterpret_cast<uint4*>(a.combined_x + row_offset)[v] = out;
                    }
                }
                if (a.combined_topk_weights != nullptr && lane < a.num_topk) {
                    float sum = 0.0f;
                    for (int r = 0; r < num_rows; ++r) sum += weights[r] != nullptr ? weights[r][lane] : 0.0f;
                    a.combined_topk_weights[int64_t(t) * a.num_topk + lane] = sum;
                }
            }
        }
        __syncthreads();  // the round's slots are read
        const int p = threadIdx.x;
        if (p < n && p != me) {
            // send_head grows along the channel: the round's last token sent to p marks it.
            for (int i = min(end, round + num_warps) - 1; i >= round; --i) {
                const int k = a.send_head[int64_t(i) * n + p];
                if (k >= 0) {
                    consumed[p] = k + 1;
                    break;
                }
            }
            if (alive) st_release_sys(peer(ws, a.heads + c * MAX_PES + me, p), a.received[c * MAX_PES + p] + consumed[p]);
        }
    }
    __syncthreads();
    if (threadIdx.x < n && threadIdx.x != me) a.received[c * MAX_PES + threadIdx.x] += consumed[threadIdx.x];
}
// ANCHOR_END: gather_receive

// Combine. Grid 2 x num_channels: blocks [0, C) send, [C, 2C) receive.
extern "C" __global__ void __launch_bounds__(CHANNEL_THREADS) moe_gather(const __grid_constant__ Workspace ws,
                                                              const __grid_constant__ GatherArgs a) {
    const uint64_t epoch = begin_call(ws);
    const int c = blockIdx.x % a.num_channels;
    if (blockIdx.x < a.num_channels) {
        const PeerGroup g(ws.n_pes, ws.my_pe);  // the owner reads our own rows in place
        if (g.active()) gather_send(ws, a, epoch, c, g);
    } else {
        gather_receive(ws, a, epoch, c);
    }
    end_call(ws, epoch);
}
