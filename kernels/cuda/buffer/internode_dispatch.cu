// Normal mode across nodes (issue 32, steps 4, 6-8): the two-level dispatch, bf16 rows or fp8
// bytes with their scales, with or without top-k, fresh or cached, into outputs of the notify's
// counts or of num_worst_tokens (benchmarks/notes/buffer_internode_normal.md, 2.6 and 7). Grid
// 2C, all blocks resident; channel c owns a contiguous range of our tokens, as in chapter 7.
//
//   block 2c, warps 0-7   sender: each token once to each destination node k, into ring
//                         (c, our node) on our rail peer there (k, our local index): staged,
//                         then one put-with-signal per chunk; on our own node, stored in place
//   block 2c + 1          forwarder: the chunks our rail peers sent us, copied verbatim into
//                         the NVL ring (c, us) of every member of our node the token goes to
//                         (node_peer: peer pointers inside the node only), ourselves included
//   block 2c, warps 8-31  NVL receivers, a group per forwarder of our node: each slot into our
//                         outputs at its row, a running row per source node
//
// ANCHOR: internode_dispatch_notes
// NOTES on the protocol (the subtle part; a model of it: src/internode_dispatch_protocol_tests.rs):
// - Positions count the slots of one ring over every call, never reset (chapter 7's rule): the
//   sender's rings.sent and the forwarder's rings.received advance alike, from the same counts.
// - A chunk is c_r positions from a multiple of c_r, and leaves in exactly one put, when full
//   or when the call's stream to that node ends; its signal SETs the chunk's word to its start
//   + its tokens. Puts are not ordered with each other, so one tail word that every put adds
//   to could count a later chunk before an earlier chunk's data landed; a word per chunk names
//   the chunk. The forwarder waits for word > start: the word's older values are at most
//   start - R_r + c_r. On our own node the sender's stores are in place and a release store
//   of the word publishes them (each word: one writer by one route).
// - Both ends round their position up to a chunk at the end of a call (both know the count:
//   the sender walks it, the forwarder has handle 3), so a chunk never spans two calls; and
//   again at the start, to this call's c_r (a config may change it between calls: a chunk
//   off its grid would cross the ring's end, and its one put write past the ring). The
//   forwarder returns the skipped positions to the sender's head then.
// - Heads count positions and go back by signal ADD of c_r per chunk (own node: a release
//   store of the count): two SETs from one forwarder could land out of order and leave the
//   head below what was consumed. A head past a slot proves the put that filled it landed,
//   hence finished reading its staging slot: the sender's one wait covers both rings. The
//   forwarder frees whole chunks only, so a window of WINDOW_TOKENS needs R_r >=
//   WINDOW_TOKENS + c_r (a plan check), or the sender could wait for a chunk not yet posted.
// - Between two calls the full notify is a barrier over every rank (2.3): each finished the
//   previous dispatch, so every chunk of it landed and was read, whatever the next slot size.
// - The forwarder polls its N source rings without blocking on one: a fixed order could wait
//   for node b while node b' is blocked on our ring, and close a cycle through two rails. NVL
//   receivers never wait for space, so forwarders drain, so senders get space.
// - Every wait is bounded and names whom it waited for: WAIT_RDMA_SPACE the rail peer whose
//   forwarder never freed space, WAIT_RDMA_DATA the first rail peer still owing a chunk,
//   WAIT_RING_SPACE / WAIT_RING_DATA the node member (chapter 7's kinds).
// - A cached dispatch (a handle of an earlier full one, after the cached notify's barrier) is
//   the same kernel and protocol: positions, chunks and rows come from the routing and handle
//   3-6 alone, so they are the full dispatch's again. Its send_rdma_head, send_nvl_head and
//   recv_src_meta are null: the handle is read, never rewritten (send_nvl_head's values depend
//   on the order the forwarder met chunks, which a rerun need not repeat).
// ANCHOR_END: internode_dispatch_notes
#include "internode.cuh"

namespace nvshmem_tutorial {

using moe::channel_range;
using moe::PeerGroup;
using moe::space_needed;

static_assert(RDMA_SENDER_WARPS * WARP_SIZE >= MAX_NODES, "a sender thread per destination node");
static_assert(WINDOW_TOKENS == WARP_SIZE, "a window is one token per lane");

// Named barriers: 1 for the sender warps, 2 + l for the NVL receivers of forwarder l.
constexpr int SENDER_BARRIER = 1;
constexpr int RECEIVER_BARRIERS = 2;
static_assert(RECEIVER_BARRIERS + MAX_PES <= 16, "named barriers");

// Where a slot's metadata sits after its row (the contract's InternodeDispatchArgs).
struct SlotParts {
    int meta, topk_idx, topk_weights, scales;
    __device__ explicit SlotParts(const DispatchSlot& s)
        : meta(round_up_to_vector(s.hidden_bytes)),
          topk_idx(meta + 8),
          topk_weights(meta + 8 + 4 * s.num_topk),
          scales(meta + 8 + 8 * s.num_topk) {}
};

// ---- sender ----------------------------------------------------------------------------------

// What the sender warps share about one window: per destination node, which of its 32 tokens
// go there and the position of the first.
struct Window {
    uint32_t mask[MAX_NODES];
    uint64_t first[MAX_NODES];
};

// Thread k (< N): the window's tokens for node k, their send_rdma_head entries, and the wait
// for ring space. False when the wait gave up.
__device__ __forceinline__ bool plan_window(const Workspace& ws, const InternodeDispatchArgs& a, uint64_t call, int c, int k,
                                            int w0, int end, uint64_t pos, uint64_t base, Window& win) {
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, N = num_nodes(topo);
    uint32_t mask = 0;
    for (int i = 0; i < WINDOW_TOKENS && w0 + i < end; ++i) {
        const bool* to = a.is_token_in_rank + static_cast<int64_t>(w0 + i) * topo.num_ranks + k * G;
        bool any = false;
        for (int l = 0; l < G; ++l) any |= to[l];
        mask |= uint32_t(any) << i;
    }
    for (int i = 0; a.send_rdma_head != nullptr && i < WINDOW_TOKENS && w0 + i < end; ++i) {  // null: cached
        const bool hit = mask >> i & 1;
        a.send_rdma_head[static_cast<int64_t>(w0 + i) * N + k] = hit ? int(pos - base) + __popc(mask & ((1u << i) - 1)) : -1;
    }
    win.mask[k] = mask;
    win.first[k] = pos;
    const uint64_t need = space_needed(pos + __popc(mask), a.rings.ring_tokens);
    if (mask == 0 || need == 0) return true;
    const int who = failure_rank(topo, k * G + my_local(topo));
    return wait_at_least(ws, a.rings.heads + c * N + k, need, WAIT_RDMA_SPACE, who, call);
}

// Token t into its slot for node k: the row, then {our node, the ranks of node k it goes to},
// the global top-k ids and weights (each receiver keeps its own). One warp.
__device__ __forceinline__ void write_slot(const InternodeDispatchArgs& a, int t, int k, uint8_t* slot, int lane) {
    const LlTopology& topo = a.topo;
    const SlotParts parts(a.slot);
    moe::warp_copy<false, 4>(slot, a.x + static_cast<int64_t>(t) * a.slot.hidden_bytes, a.slot.hidden_bytes, lane);
    if (lane == 0) {
        const bool* to = a.is_token_in_rank + static_cast<int64_t>(t) * topo.num_ranks + k * topo.node_pes;
        uint32_t in_node = 0;
        for (int l = 0; l < topo.node_pes; ++l) in_node |= uint32_t(to[l]) << l;
        int* meta = reinterpret_cast<int*>(slot + parts.meta);
        meta[0] = my_node(topo);
        meta[1] = static_cast<int>(in_node);
    }
    if (a.topk_idx != nullptr && lane < a.slot.num_topk) {
        const int64_t i = static_cast<int64_t>(t) * a.slot.num_topk + lane;
        reinterpret_cast<int*>(slot + parts.topk_idx)[lane] = static_cast<int>(__ldg(a.topk_idx + i));
        reinterpret_cast<float*>(slot + parts.topk_weights)[lane] = __ldg(a.topk_weights + i);
    }
    // fp8: the token's scales, read with the caller's strides (DeepEP's test passes column-major
    // ones), copied as opaque 4-byte words (f32, or int32 UE8M0).
    if (a.x_scales != nullptr) {
        const int* scales = reinterpret_cast<const int*>(a.x_scales) + static_cast<int64_t>(t) * a.scale_token_stride;
        for (int k = lane; k < a.slot.num_scales; k += WARP_SIZE) {
            reinterpret_cast<int*>(slot + parts.scales)[k] = __ldg(scales + k * a.scale_hidden_stride);
        }
    }
}

// ANCHOR: post_chunks
// Node k's complete chunks from `posted` leave (the last, partial one too when `last`), each by
// post_chunk (internode.cuh). Returns the next chunk's start. One warp, after the sender barrier
// (every slot of the chunks stored).
__device__ __forceinline__ uint64_t post_chunks(const InternodeDispatchArgs& a, int c, int k, uint64_t posted, uint64_t pos,
                                                bool last, int lane) {
    const int chunk = a.rings.chunk_tokens;
    bool first = true;
    while (posted < pos) {  // past pos after the last, partial chunk: then done
        const uint64_t m = min(pos - posted, uint64_t(chunk));
        if (m < uint64_t(chunk) && !last) break;
        post_chunk(a, c, k, posted, m, first, lane);
        first = false;
        posted += chunk;
    }
    return last ? round_to_chunk(pos, chunk) : posted;
}
// ANCHOR_END: post_chunks

// ANCHOR: rdma_send
// The sender warps of channel c: windows of 32 tokens in order; per node the tokens' positions
// (plan_window), their slots written (staging, or our own landing ring), complete chunks
// posted. The first RDMA_SENDER_WARPS warps of the block; never __syncthreads (the receivers).
__device__ void rdma_send(const Workspace& ws, const InternodeDispatchArgs& a, uint64_t call, int c) {
    __shared__ Window win;
    __shared__ uint64_t pos[MAX_NODES], posted[MAX_NODES];
    __shared__ int alive;
    const LlTopology& topo = a.topo;
    const int N = num_nodes(topo), me = my_node(topo), lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int k = threadIdx.x;  // the node this thread plans for (k < N)
    // Our chunks start on a multiple of this call's c_r (the last call may have had another).
    const uint64_t base = k < N ? round_to_chunk(a.rings.sent[c * N + k], a.rings.chunk_tokens) : 0;
    auto sync = [] { named_barrier_sync(SENDER_BARRIER, RDMA_SENDER_WARPS * WARP_SIZE); };
    if (k < N) pos[k] = posted[k] = base;
    if (threadIdx.x == 0) alive = 1;
    int begin, end;
    channel_range(a.num_tokens, a.num_channels, c, &begin, &end);
    for (int w0 = begin; w0 < end; w0 += WINDOW_TOKENS) {
        sync();  // the last window's posts read pos and posted
        if (k < N && !plan_window(ws, a, call, c, k, w0, end, pos[k], base, win)) alive = 0;
        sync();
        if (!alive) break;
        for (int i = warp; i < WINDOW_TOKENS && w0 + i < end; i += RDMA_SENDER_WARPS) {
            for (int d = 0; d < N; ++d) {
                const uint32_t mask = win.mask[d];
                if (!(mask >> i & 1)) continue;
                const uint64_t p = win.first[d] + __popc(mask & ((1u << i) - 1));
                uint8_t* ring = d == me ? landing(a, c, me) : staging(a, c, d);
                write_slot(a, w0 + i, d, slot_at(a, ring, p, a.rings.ring_tokens), lane);
            }
        }
        sync();  // every slot of the window is stored
        if (k < N) pos[k] += __popc(win.mask[k]);
        sync();
        const bool last = w0 + WINDOW_TOKENS >= end;
        for (int d = warp; d < N; d += RDMA_SENDER_WARPS) {
            const uint64_t next = post_chunks(a, c, d, posted[d], pos[d], last, lane);
            __syncwarp();
            if (lane == 0) posted[d] = next;
        }
    }
    sync();
    if (k < N && alive) a.rings.sent[c * N + k] = posted[k];
}
// ANCHOR_END: rdma_send

// ---- forwarder -------------------------------------------------------------------------------

// What the forwarder's threads share: per source node its next position, tokens still to come
// in this call and tokens taken; per member of our node the next NVL position; the chunk at hand.
struct Forwarder {
    uint64_t pos[MAX_NODES];
    int left[MAX_NODES], taken[MAX_NODES];
    uint64_t nvl_pos[MAX_PES], nvl_base[MAX_PES];
    uint32_t slot_mask[WINDOW_TOKENS];  // in-node mask of each slot of the chunk
    uint32_t to[MAX_PES];               // the chunk's slots that go to member l
    int chosen, alive;
};

// Thread 0: a source node with a chunk landed, round-robin from `*next`; -2 when every stream is
// done; -1 for none yet; -3 after the timeout (recorded, naming the first rail peer still owing).
__device__ __forceinline__ int pick_chunk(const Workspace& ws, const InternodeDispatchArgs& a, const Forwarder& f, int c,
                                          int* next, long long* idle_since, uint64_t call) {
    const LlTopology& topo = a.topo;
    const int N = num_nodes(topo);
    int owing = -1;
    for (int i = 0; i < N; ++i) {
        const int b = (*next + i) % N;
        if (f.left[b] == 0) continue;
        if (owing < 0) owing = b;
        if (ld_acquire_sys(chunk_word(a, c, b, f.pos[b])) > f.pos[b]) {
            *next = b + 1;
            *idle_since = clock64();
            return b;
        }
    }
    if (owing < 0) return -2;
    if (failed(ws)) return -3;
    if (clock64() - *idle_since > ws.timeout_cycles) {
        const uint64_t seen = ld_acquire_sys(chunk_word(a, c, owing, f.pos[owing]));
        record_failure(ws, WAIT_RDMA_DATA, failure_rank(topo, owing * topo.node_pes + my_local(topo)), f.pos[owing] + 1,
                       seen, call);
        return -3;
    }
    return -1;
}

// ANCHOR: forward_chunk
// One landed chunk of node b's ring: each slot's members by ballot-free counting (thread l for
// member l), NVL space, send_nvl_head, the copies (a warp per slot and member), then the NVL
// tails and our head back to the rail peer. Every thread of the block.
__device__ __forceinline__ void forward_chunk(const Workspace& ws, const InternodeDispatchArgs& a, Forwarder& f, int c, int b,
                                              uint64_t call) {
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, N = num_nodes(topo), C = a.num_channels, me = my_local(topo);
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    const uint64_t p = f.pos[b];
    const int m = min(f.left[b], a.rings.chunk_tokens);
    uint8_t* ring = landing(a, c, b);
    if (threadIdx.x < m) {
        const uint8_t* slot = slot_at(a, ring, p + threadIdx.x, a.rings.ring_tokens);
        f.slot_mask[threadIdx.x] = static_cast<uint32_t>(__ldcg(reinterpret_cast<const int*>(slot + SlotParts(a.slot).meta) + 1));
    }
    __syncthreads();
    const int l = threadIdx.x;
    if (l < G) {
        uint32_t to = 0;
        for (int i = 0; i < m; ++i) to |= (f.slot_mask[i] >> l & 1) << i;
        f.to[l] = to;
        // Forwarded rows are numbered by source node, channel, position (handles 3 and 4).
        const int first_row = (b > 0 ? a.recv_rdma_rank_prefix_sum[b - 1] : 0) +
                              (c > 0 ? a.recv_rdma_channel_prefix_matrix[b * C + c - 1] : 0) + f.taken[b];
        const int at = int(f.nvl_pos[l] - f.nvl_base[l]);
        for (int i = 0; a.send_nvl_head != nullptr && i < m && first_row + i < a.num_forwarded_rows; ++i) {  // null: cached
            const bool hit = to >> i & 1;
            a.send_nvl_head[static_cast<int64_t>(first_row + i) * G + l] = hit ? at + __popc(to & ((1u << i) - 1)) : -1;
        }
        const uint64_t need = space_needed(f.nvl_pos[l] + __popc(to), a.nvl_ring_tokens);
        if (to != 0 && need > 0 && !wait_at_least(ws, a.nvl_counters.heads + c * MAX_PES + l, need, WAIT_RING_SPACE, l, call)) f.alive = 0;
    }
    __syncthreads();
    if (!f.alive) return;
    for (int q = warp; q < m * G; q += warps) {
        const int i = q / G, d = q % G;
        if (!(f.to[d] >> i & 1)) continue;
        const uint64_t at = f.nvl_pos[d] + __popc(f.to[d] & ((1u << i) - 1));
        uint8_t* nvl_ring = a.nvl + static_cast<int64_t>(c * G + me) * a.nvl_ring_tokens * a.slot.bytes;
        uint8_t* dst = node_peer(ws, topo, slot_at(a, nvl_ring, at, a.nvl_ring_tokens), topo.node_start + d);
        if (dst == nullptr) continue;
        moe::warp_copy<true, 4>(dst, slot_at(a, ring, p + i, a.rings.ring_tokens), a.slot.bytes, lane);
    }
    __syncthreads();  // every copy is stored (and every landing slot read)
    if (l < G && f.to[l] != 0) {
        f.nvl_pos[l] += __popc(f.to[l]);
        uint64_t* tail = node_peer(ws, topo, a.nvl_counters.tails + c * MAX_PES + me, topo.node_start + l);
        if (tail != nullptr) st_release_sys(tail, f.nvl_pos[l]);
    }
    if (threadIdx.x == WARP_SIZE) {
        f.pos[b] = p + a.rings.chunk_tokens;  // a chunk spans c_r positions (the call's last: rounded)
        f.left[b] -= m;
        f.taken[b] += m;
        return_head(a, c, b, p, f.pos[b]);
    }
}
// ANCHOR_END: forward_chunk

// The forwarder block of channel c: the N source rings polled until every stream of the call
// is forwarded (counts from handle 3).
__device__ void forward(const Workspace& ws, const InternodeDispatchArgs& a, uint64_t call, int c) {
    __shared__ Forwarder f;
    const LlTopology& topo = a.topo;
    const int N = num_nodes(topo), C = a.num_channels;
    for (int b = threadIdx.x; b < N; b += blockDim.x) {
        const int* prefix = a.recv_rdma_channel_prefix_matrix + b * C;
        // As the sender: the call's first chunk on a multiple of this call's c_r. If the last
        // call's c_r was another, the skipped positions go back to the sender's head now.
        const uint64_t was = a.rings.received[c * N + b];
        f.pos[b] = round_to_chunk(was, a.rings.chunk_tokens);
        if (f.pos[b] != was) return_head(a, c, b, was, f.pos[b]);
        f.left[b] = prefix[c] - (c > 0 ? prefix[c - 1] : 0);
        f.taken[b] = 0;
    }
    for (int l = threadIdx.x; l < topo.node_pes; l += blockDim.x) f.nvl_pos[l] = f.nvl_base[l] = a.nvl_counters.sent[c * MAX_PES + l];
    if (threadIdx.x == 0) f.alive = 1;
    int next = 0;
    long long idle_since = clock64();
    for (;;) {
        __syncthreads();
        if (threadIdx.x == 0) f.chosen = f.alive ? pick_chunk(ws, a, f, c, &next, &idle_since, call) : -3;
        __syncthreads();
        const int b = f.chosen;
        if (b == -2 || b == -3) break;
        if (b >= 0) forward_chunk(ws, a, f, c, b, call);
    }
    if (f.chosen == -3) return;  // the progress words stay where they were: the buffer is unusable
    for (int b = threadIdx.x; b < N; b += blockDim.x) a.rings.received[c * N + b] = f.pos[b];
    for (int l = threadIdx.x; l < topo.node_pes; l += blockDim.x) a.nvl_counters.sent[c * MAX_PES + l] = f.nvl_pos[l];
}

// ---- NVL receiver ----------------------------------------------------------------------------

// Slot `slot` into our outputs at `row`: the row, its source meta, and the top-k ids made local
// (ours: 0..L-1, others -1 with weight 0). One warp.
__device__ __forceinline__ void receive_slot(const InternodeDispatchArgs& a, const uint8_t* slot, int row, int lane) {
    const SlotParts parts(a.slot);
    const int64_t r = row;
    moe::warp_copy<true, 4>(a.recv_x + r * a.slot.hidden_bytes, slot, a.slot.hidden_bytes, lane);
    if (a.recv_src_meta != nullptr && lane < 2) {
        a.recv_src_meta[r * 2 + lane] = __ldcg(reinterpret_cast<const int*>(slot + parts.meta) + lane);
    }
    if (a.recv_x_scales != nullptr) {
        int* scales = reinterpret_cast<int*>(a.recv_x_scales) + r * a.slot.num_scales;
        for (int k = lane; k < a.slot.num_scales; k += WARP_SIZE) {
            scales[k] = __ldcg(reinterpret_cast<const int*>(slot + parts.scales) + k);
        }
    }
    if (a.recv_topk_idx != nullptr && lane < a.slot.num_topk) {
        const int L = a.num_experts / a.topo.num_ranks, first = a.topo.rank * L;
        const int expert = __ldcg(reinterpret_cast<const int*>(slot + parts.topk_idx) + lane);
        const float weight = __ldcg(reinterpret_cast<const float*>(slot + parts.topk_weights) + lane);
        const bool local = expert >= first && expert < first + L;
        a.recv_topk_idx[r * a.slot.num_topk + lane] = local ? expert - first : -1;
        a.recv_topk_weights[r * a.slot.num_topk + lane] = local ? weight : 0.0f;
    }
}

// ANCHOR: nvl_receive
// The receivers of forwarder l (group g.peer) in channel c: it forwards the tokens of sources
// (b, l), every node b, mixed in the order it met their chunks. Each slot's row is a running
// row per source node, from handle 5; member 0 numbers 32 slots at a time, the group copies.
__device__ void nvl_receive(const Workspace& ws, const InternodeDispatchArgs& a, uint64_t call, int c, const PeerGroup& g) {
    __shared__ int next_row[MAX_PES][MAX_NODES];
    __shared__ int rows[MAX_PES][WINDOW_TOKENS];
    __shared__ uint64_t seen_tail[MAX_PES];
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, N = num_nodes(topo), C = a.num_channels, l = g.peer, lane = threadIdx.x % WARP_SIZE;
    const SlotParts parts(a.slot);
    int total = 0;
    for (int b = 0; b < N; ++b) {
        const int s = b * G + l;
        const int first = a.recv_gbl_channel_prefix_matrix[s * C + c];
        const int next = c + 1 < C ? a.recv_gbl_channel_prefix_matrix[s * C + c + 1] : a.recv_gbl_rank_prefix_sum[s];
        total += next - first;
        if (g.member == 0 && lane == 0) next_row[l][b] = first;
    }
    const uint64_t base = a.nvl_counters.received[c * MAX_PES + l], target = base + total;
    const uint8_t* ring = a.nvl + static_cast<int64_t>(c * G + l) * a.nvl_ring_tokens * a.slot.bytes;
    const uint64_t* tail = a.nvl_counters.tails + c * MAX_PES + l;
    for (uint64_t head = base; head < target;) {
        if (g.member == 0 && lane == 0) {
            const bool arrived = wait_at_least(ws, tail, head + 1, WAIT_RING_DATA, l, call);
            seen_tail[l] = arrived ? min(ld_acquire_sys(tail), target) : 0;
        }
        g.sync();
        const uint64_t new_tail = seen_tail[l];
        if (new_tail == 0) return;  // gave up: recorded
        for (uint64_t w = head; w < new_tail; w += WINDOW_TOKENS) {
            if (g.member == 0) {
                const uint64_t k = w + lane;
                const int b = k < new_tail ? __ldcg(reinterpret_cast<const int*>(
                                                        ring + static_cast<int64_t>(k % a.nvl_ring_tokens) * a.slot.bytes + parts.meta))
                                           : -1 - lane;  // unique: matches no other lane
                const uint32_t same = __match_any_sync(ALL_LANES, b);
                const int row = b >= 0 ? next_row[l][b] + __popc(same & lanemask_lt()) : 0;
                __syncwarp();  // every lane read its node's row before the last one moves it
                if (b >= 0 && lane == 31 - __clz(same)) next_row[l][b] += __popc(same);
                rows[l][lane] = row;
            }
            g.sync();
            for (uint64_t k = w + g.member; k < min(new_tail, w + WINDOW_TOKENS); k += g.size) {
                const int row = rows[l][k - w];
                if (row < a.num_recv_rows) receive_slot(a, ring + static_cast<int64_t>(k % a.nvl_ring_tokens) * a.slot.bytes, row, lane);
            }
            g.sync();
        }
        if (g.member == 0 && lane == 0) {
            uint64_t* head_word = node_peer(ws, topo, a.nvl_counters.heads + c * MAX_PES + my_local(topo), topo.node_start + l);
            if (head_word != nullptr) st_release_sys(head_word, new_tail);
        }
        head = new_tail;
    }
    if (g.member == 0 && lane == 0) a.nvl_counters.received[c * MAX_PES + l] = target;
}
// ANCHOR_END: nvl_receive

// ---- outputs of a fixed size (num_worst_tokens) ----------------------------------------------

// ANCHOR: internode_rows_fit
// Outputs the caller sized (num_worst_tokens: CUDA graphs, no host wait for the counts) may hold
// fewer rows than the handle delivers. Every store is bounded (the receiver by num_recv_rows,
// the forwarder's send_nvl_head by num_forwarded_rows), so those rows are consumed and not
// copied, every ring still moves and the peers finish the call; one thread records
// RECV_OVERFLOW, an input error: the first source rank whose rows do not all fit (the
// forwarder's: the rail peer of the first such node), the rows delivered, the rows there were.
__device__ __forceinline__ void check_rows_fit(const InternodeDispatchArgs& a) {
    const LlTopology& topo = a.topo;
    const int n = topo.num_ranks, N = num_nodes(topo);
    const int received = a.recv_gbl_rank_prefix_sum[n - 1];
    if (received > a.num_recv_rows) {
        int s = 0;
        while (s + 1 < n && a.recv_gbl_rank_prefix_sum[s] <= a.num_recv_rows) ++s;
        moe::record_input_error(a.bad_input, RECV_OVERFLOW, s, received, a.num_recv_rows);
    }
    const int forwarded = a.recv_rdma_rank_prefix_sum[N - 1];
    if (a.send_nvl_head != nullptr && forwarded > a.num_forwarded_rows) {  // null: cached, nothing stored
        int b = 0;
        while (b + 1 < N && a.recv_rdma_rank_prefix_sum[b] <= a.num_forwarded_rows) ++b;
        moe::record_input_error(a.bad_input, RECV_OVERFLOW, b * topo.node_pes + my_local(topo), forwarded, a.num_forwarded_rows);
    }
}

// Rows past those received hold no expert: recv_topk_idx -1 there (as DeepEP's worst-case
// outputs; the weights are left). The receiver threads of every channel share the rows.
__device__ __forceinline__ void clear_unreceived_topk(const InternodeDispatchArgs& a, int c, int thread, int threads) {
    if (a.recv_topk_idx == nullptr) return;
    const int64_t k = a.slot.num_topk, received = a.recv_gbl_rank_prefix_sum[a.topo.num_ranks - 1];
    const int64_t stride = static_cast<int64_t>(a.num_channels) * threads;
    for (int64_t i = received * k + static_cast<int64_t>(c) * threads + thread; i < a.num_recv_rows * k; i += stride) {
        a.recv_topk_idx[i] = -1;
    }
}
// ANCHOR_END: internode_rows_fit

// ANCHOR: internode_dispatch
// Grid 2C of CHANNEL_THREADS, all resident (every role waits for others).
extern "C" __global__ void __launch_bounds__(CHANNEL_THREADS) internode_dispatch(const __grid_constant__ Workspace ws,
                                                                          const __grid_constant__ InternodeDispatchArgs a) {
    const uint64_t call = ld_volatile(a.calls + blockIdx.x) + 1;
    const int c = blockIdx.x / 2;
    if (blockIdx.x % 2 == 1) {
        forward(ws, a, call, c);
    } else if (threadIdx.x < RDMA_SENDER_WARPS * WARP_SIZE) {
        rdma_send(ws, a, call, c);
    } else {
        const int warps = blockDim.x / WARP_SIZE - RDMA_SENDER_WARPS, first = RDMA_SENDER_WARPS * WARP_SIZE;
        if (c == 0 && threadIdx.x == first) check_rows_fit(a);
        const PeerGroup g(a.topo.node_pes, -1, RDMA_SENDER_WARPS, warps, RECEIVER_BARRIERS);
        if (g.active()) nvl_receive(ws, a, call, c, g);
        clear_unreceived_topk(a, c, threadIdx.x - first, blockDim.x - first);
    }
    if (threadIdx.x == 0) a.calls[blockIdx.x] = call;
}
// ANCHOR_END: internode_dispatch

}  // namespace nvshmem_tutorial
