// Chapter 7: normal-mode combine inside one node (`moe_gather`; the dispatch it undoes is
// dispatch.cu).
//
// Combine gathers the experts' results back and sums them on the token's PE, over the rings
// of dispatch run backwards: 2 x num_channels blocks, blocks [0, C) send channel
// c = blockIdx.x, blocks [C, 2C) receive it. Each PE pushes, in received order, the rows a
// peer's tokens became; the token's PE finds each with the `send_head` dispatch left in the
// handle. Our own results skip the ring: the receiver reads them straight from our expert
// outputs.
#include "moe.cuh"

using namespace moe;

// GatherArgs, the kernel's arguments, are the host/device contract: kernels/contract/defs.rs.

// Rows a combine sender stores before it publishes its tail (at most a ring). The grain of
// the pipeline: the receiver sums a token only once every PE's row of it is published, and a
// channel carries a few hundred rows per peer, so a smaller window starts the receiver
// sooner, even with some of a 32-warp group idle per window. Measured at EP2 (build-time
// override, benchmarks/notes/buffer.md): 128 rows 295 us, 64 260, 32 232, 16 221, 8 296.
#ifndef COMBINE_WINDOW
#define COMBINE_WINDOW 16
#endif

// A combine slot: [row: hidden_bytes bf16][topk_weights: f32 x K]; where the weights start.
__device__ __forceinline__ int slot_weights(const GatherArgs& a) {
    return (a.hidden_bytes + VECTOR_BYTES - 1) / VECTOR_BYTES * VECTOR_BYTES;
}

// acc[u][i] += element i of bf16 vector v0 + WARP_SIZE x u of `row` (vectors past
// `num_vectors` skipped): the loads first, then the adds.
template <int UNROLL>
__device__ __forceinline__ void add_rows(float (&acc)[UNROLL][BF16_PER_VECTOR], const uint8_t* row, int v0, int num_vectors) {
    uint4 raw[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (v0 + WARP_SIZE * u < num_vectors) raw[u] = reinterpret_cast<const uint4*>(row)[v0 + WARP_SIZE * u];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (v0 + WARP_SIZE * u >= num_vectors) continue;
        const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
#pragma unroll
        for (int i = 0; i < BF16_PER_VECTOR; ++i) acc[u][i] += __bfloat162float(h[i]);
    }
}

// A row the handle names but x does not have (x holds num_recv_rows rows, and the dispatch
// that made the handle received more; check_recv_rows records it): its slot goes out as zeros,
// row and weights, so the token's owner sums nothing for it rather than a stale slot.
__device__ __forceinline__ void warp_zero_slot(uint8_t* slot, int slot_bytes, int lane) {
    for (int i = lane; i < slot_bytes / VECTOR_BYTES; i += WARP_SIZE) reinterpret_cast<uint4*>(slot)[i] = make_uint4(0, 0, 0, 0);
}

// ANCHOR: gather_send
// Combine, sender side of channel c to PE s (the tokens' owner): push, in received order, the
// rows s delivered to us in channel c, with their top-k weights. kPastRows: the handle names
// rows past x's (see moe_gather).
template <bool kPastRows>
__device__ void gather_send(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c, const PeerGroup& g) {
    const int me = ws.my_pe, n = ws.n_pes, s = g.peer, lane = threadIdx.x % WARP_SIZE;
    if (s == me) return;  // the owner reads our own rows in place
    int first, count;
    rows_from(a.rank_prefix_matrix, a.recv_channel_prefix_matrix, n, me, a.num_channels, s, c, &first, &count);
    const uint64_t base = a.sent[c * MAX_PES + s];
    uint8_t* ring = peer(ws, a.nvl, s) + int64_t(c * n + me) * a.ring_tokens * a.slot_bytes;
    const int weights_at = slot_weights(a);
    bool alive = lane != 0 || wait_counter(ws, ws.ready + s, epoch, WAIT_READY, s, epoch);
    alive = __shfl_sync(ALL_LANES, alive, 0);
    const int full_window = min(COMBINE_WINDOW, a.ring_tokens);
    const int stored = kPastRows ? max(0, min(count, a.num_recv_rows - first)) : count;
    for (int w0 = 0; w0 < count; w0 += full_window) {
        const int window = min(full_window, count - w0);
        const uint64_t pos = base + w0;
        if (alive && lane == 0) {
            alive = wait_counter(ws, a.heads + c * MAX_PES + s, space_needed(pos + window, a.ring_tokens), WAIT_RING_SPACE, s, epoch);
        }
        alive = __shfl_sync(ALL_LANES, alive, 0);
        for (int j = g.member; alive && j < window; j += g.size) {
            const int64_t r = first + w0 + j;
            uint8_t* slot = ring + int64_t((pos + j) % a.ring_tokens) * a.slot_bytes;
            if (kPastRows && w0 + j >= stored) {
                warp_zero_slot(slot, a.slot_bytes, lane);
                continue;
            }
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

// ANCHOR: gather_rows
// Where token t's results are, one row per PE that had any of its experts (send_head says
// where in that PE's ring, -1 if none): our own in x, a peer's in its ring slot, waited for if
// it has not arrived. Returns how many; `alive` turns false once a wait gives up. `me` and `n`
// come from the caller: a wait may record a failure through `ws`, after which its fields are
// read from memory again, not reused from registers.
template <bool kPastRows>
__device__ __forceinline__ int gather_rows(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c, int t, int me,
                                           int n, int self_first, const uint8_t* (&rows)[MAX_PES],
                                           const float* (&weights)[MAX_PES], bool& alive) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int weights_at = slot_weights(a);
    int num_rows = 0;
    for (int p = 0; p < n; ++p) {
        const int k = a.send_head[int64_t(t) * n + p];
        if (k < 0) continue;
        if (p == me) {
            const int64_t r = self_first + k;
            if (kPastRows && r >= a.num_recv_rows) continue;  // no such row in x
            rows[num_rows] = a.x + r * a.hidden_bytes;
            weights[num_rows++] = a.topk_weights != nullptr ? a.topk_weights + r * a.num_topk : nullptr;
            continue;
        }
        const uint64_t pos = a.received[c * MAX_PES + p] + k;
        if (alive && lane == 0) alive = wait_counter(ws, a.tails + c * MAX_PES + p, pos + 1, WAIT_RING_DATA, p, epoch);
        alive = __shfl_sync(ALL_LANES, alive, 0);
        const uint8_t* slot = a.nvl + (int64_t(c * n + p) * a.ring_tokens + int64_t(pos % a.ring_tokens)) * a.slot_bytes;
        rows[num_rows] = slot;
        weights[num_rows++] = reinterpret_cast<const float*>(slot + weights_at);
    }
    return num_rows;
}
// ANCHOR_END: gather_rows

// ANCHOR: gather_sum
// Token t's combined row, by one warp: bias0 + bias1 + the rows in PE order, summed in fp32
// and rounded to bf16 once; and its combined top-k weights.
__device__ __forceinline__ void gather_sum(const GatherArgs& a, int t, const uint8_t* const (&rows)[MAX_PES],
                                           const float* const (&weights)[MAX_PES], int num_rows) {
    const int lane = threadIdx.x % WARP_SIZE;
    // UNROLL vectors per lane at a time, every row's loads issued before any add: the sum is
    // bound by memory latency, so loads in flight are what count.
    constexpr int UNROLL = 4;
    const int num_vectors = a.hidden_bytes / VECTOR_BYTES;
    const int64_t row_offset = int64_t(t) * a.hidden_bytes;
    for (int v0 = lane; v0 < num_vectors; v0 += WARP_SIZE * UNROLL) {
        float acc[UNROLL][BF16_PER_VECTOR] = {};
        if (a.bias0 != nullptr) add_rows(acc, a.bias0 + row_offset, v0, num_vectors);
        if (a.bias1 != nullptr) add_rows(acc, a.bias1 + row_offset, v0, num_vectors);
        for (int r = 0; r < num_rows; ++r) add_rows(acc, rows[r], v0, num_vectors);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int v = v0 + WARP_SIZE * u;
            if (v >= num_vectors) break;
            uint4 out;
            __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
            for (int i = 0; i < BF16_PER_VECTOR; ++i) o[i] = __float2bfloat16_rn(acc[u][i]);
            reinterpret_cast<uint4*>(a.combined_x + row_offset)[v] = out;
        }
    }
    if (a.combined_topk_weights != nullptr && lane < a.num_topk) {
        float sum = 0.0f;
        for (int r = 0; r < num_rows; ++r) sum += weights[r] != nullptr ? weights[r][lane] : 0.0f;
        a.combined_topk_weights[int64_t(t) * a.num_topk + lane] = sum;
    }
}
// ANCHOR_END: gather_sum

// ANCHOR: gather_receive
// Combine, receiver side of channel c: every warp takes one of the channel's tokens at a
// time, finds each PE's result for it (gather_rows) and sums them (gather_sum). After each
// round of tokens, thread p publishes how far ring (c, p) has been consumed.
template <bool kPastRows>
__device__ void gather_receive(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c) {
    __shared__ int consumed[MAX_PES];
    const int me = ws.my_pe, n = ws.n_pes, warp = threadIdx.x / WARP_SIZE;
    const int num_warps = blockDim.x / WARP_SIZE;
    int begin, end;
    channel_range(a.num_tokens, a.num_channels, c, &begin, &end);
    int self_first, self_count;  // where our own results for this channel's tokens are in x
    rows_from(a.rank_prefix_matrix, a.recv_channel_prefix_matrix, n, me, a.num_channels, me, c, &self_first, &self_count);
    if (threadIdx.x < n) consumed[threadIdx.x] = 0;
    __syncthreads();
    bool alive = true;
    for (int round = begin; round < end; round += num_warps) {
        const int t = round + warp;
        if (t < end) {
            const uint8_t* rows[MAX_PES];
            const float* weights[MAX_PES];
            const int num_rows = gather_rows<kPastRows>(ws, a, epoch, c, t, me, n, self_first, rows, weights, alive);
            if (alive) gather_sum(a, t, rows, weights, num_rows);
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

// A handle that names more rows than x holds (check_recv_rows) takes copies of both sides that
// skip those rows, out of line: the code every correct call runs has no test for them, and its
// registers are its own.
static __device__ __noinline__ void gather_send_past_rows(const Workspace& ws, const GatherArgs& a, uint64_t epoch, int c,
                                                          const PeerGroup& g) {
    gather_send<true>(ws, a, epoch, c, g);
}
static __device__ __noinline__ void gather_receive_past_rows(const Workspace& ws, const GatherArgs& a, uint64_t epoch,
                                                             int c) {
    if (c == 0 && threadIdx.x == 0) check_recv_rows(a.bad_input, a.rank_prefix_matrix, ws.n_pes, ws.my_pe, a.num_recv_rows);
    gather_receive<true>(ws, a, epoch, c);
}

// Combine. Grid 2 x num_channels: blocks [0, C) send, [C, 2C) receive.
extern "C" __global__ void __launch_bounds__(CHANNEL_THREADS) moe_gather(const __grid_constant__ Workspace ws,
                                                              const __grid_constant__ GatherArgs a) {
    const uint64_t epoch = begin_call(ws);
    const int c = blockIdx.x % a.num_channels;
    const bool past_rows = handle_past_rows(a.rank_prefix_matrix, ws.n_pes, ws.my_pe, a.num_recv_rows);
    if (blockIdx.x < a.num_channels) {
        const PeerGroup g(ws.n_pes, ws.my_pe);  // the owner reads our own rows in place
        if (g.active() && past_rows) gather_send_past_rows(ws, a, epoch, c, g);
        if (g.active() && !past_rows) gather_send<false>(ws, a, epoch, c, g);
    } else if (past_rows) {
        gather_receive_past_rows(ws, a, epoch, c);
    } else {
        gather_receive<false>(ws, a, epoch, c);
    }
    end_call(ws, epoch);
}
