// Normal mode across nodes (issue 32, step 5): the two-level combine, bf16 rows with their top-k
// weights and up to two biases (benchmarks/notes/buffer_internode_normal.md, sections 2.7 and 8).
// The dispatch (internode_dispatch.cu) run backwards: reduce inside the node first, send once
// per node across the network, reduce at home. Grid 2C, all blocks resident; channel c owns the
// token range it owned in the dispatch.
//
//   block 2c, warps 0-7   NVL senders, a group per forwarder l of our node (not us): the rows we
//                         received from source (k, l) go back to l, per node k, into sub-ring
//                         (c, us, k) of l's NVL region (node_peer: peer pointers inside the node)
//   block 2c + 1          forwarder: per destination node k, the rows we forwarded from node k, a
//                         chunk of c_r at a time: each row is the sum of its pieces from the
//                         members that got it (sub-rings; our own in x), stored in staging ring
//                         (c, k) and sent in one put-with-signal to our rail peer on node k (on
//                         our own node: stored in our landing ring)
//   block 2c, warps 8-31  home receivers: each of our tokens, bias0 + bias1 + the sums of the
//                         nodes it went to, from our landing rings
//
// ANCHOR: internode_combine_notes
// NOTES on the protocol (a model of it: src/internode_combine_protocol_tests/):
// - Entry: internode_combine_raw launches the cached notify first, a barrier over every rank
//   (2.3): the dispatch before has finished everywhere, every chunk of it landed and was read,
//   so the rings may change their slot size and the NVL region its layout (the dispatch's NVL
//   rings become sub-rings).
// - RDMA stage: the dispatch's rings, words and positions (internode.cuh). Landing ring (c, b)
//   is written, in both ops, by our rail peer on node b, so rings.sent / rings.received run on
//   across the ops and the dispatch's rules hold as they are: a chunk is c_r positions from a
//   multiple of c_r and leaves in one put that SETs its word to start + tokens; calls start
//   and end on a chunk; heads go back by ADD. The home receivers return their heads after each
//   round of tokens, up to the last position the round read; the forwarder waits for ring
//   space before it writes a chunk. A round reads at most one position per token of each ring,
//   so a round of W <= 32 tokens needs a chunk ending at most W + c_r past the head: the plan's
//   R_r >= 32 + c_r (the dispatch's) covers it.
// - NVL stage: sub-ring (c, l', k) on forwarder l holds what member l' sends back for node k,
//   floor(R_n / N) slots (S). One sub-ring per node, as DeepEP (internode.cu:1782-1789): rows for
//   a node whose ring is full must not stand in front of rows for another. Tails and heads are
//   (member, node) words, released through node_peer. A sender publishes windows of w <=
//   S - c_r rows: the forwarder consumes a sub-ring in whole chunks only (up to c_r rows of
//   each member), so a chunk's rows and a window must fit side by side.
// - Which sub-ring position holds forwarded row j's piece from l': the rows of node k's stream
//   that l' got, counted in order (send_nvl_head says which by its -1 entries; its values, the
//   dispatch's NVL positions across nodes, are not needed).
// - No cycle of waits: NVL senders poll their N streams and write any with space; the forwarder
//   polls its N nodes and takes a chunk only once ring space and every piece of it are there,
//   so it never holds half a chunk; home receivers consume in token order and return heads.
// - Sums in a fixed order: the forwarder adds a row's pieces in member order, the home
//   receiver bias0, bias1, then the nodes' sums in node order, each from 0 in fp32 and rounded
//   to bf16 once; so results are bitwise the same every call. Weights likewise, never rounded.
// - Every wait is bounded and names whom it waited for: WAIT_COMBINE_NVL_SPACE the forwarder
//   (member), WAIT_COMBINE_NVL_DATA the first member owing a piece, WAIT_COMBINE_RDMA_SPACE and
//   WAIT_COMBINE_RDMA_DATA the rail peer.
// ANCHOR_END: internode_combine_notes
#include "internode.cuh"

namespace nvshmem_tutorial {

using moe::channel_range;
using moe::PeerGroup;
using moe::record_input_error;
using moe::space_needed;

static_assert(COMBINE_SENDER_WARPS < CHANNEL_THREADS / WARP_SIZE, "home receivers beside the senders");
static_assert(CHANNEL_THREADS / WARP_SIZE - COMBINE_SENDER_WARPS <= WINDOW_TOKENS, "a round within R_r - c_r");
static_assert(WINDOW_TOKENS == WARP_SIZE, "a chunk (c_r <= WINDOW_TOKENS, the plan) has a row per lane of a mask");

// Named barriers: 1 + i for NVL sender group i, then the home receivers'.
constexpr int SENDER_BARRIERS = 1;
constexpr int RECEIVER_BARRIER = SENDER_BARRIERS + MAX_PES;
static_assert(RECEIVER_BARRIER < 16, "named barriers");

// Word (member l, node k) of channel c in a [MAX_CHANNELS][MAX_NORMAL_RANKS] array (l N + k < n).
__device__ __forceinline__ int member_node(const InternodeCombineArgs& a, int c, int l, int k) {
    return c * MAX_NORMAL_RANKS + l * num_nodes(a.topo) + k;
}
// Sub-ring (c, l, k) of the NVL region (symmetric: the forwarder's copy is its own).
__device__ __forceinline__ uint8_t* sub_ring(const InternodeCombineArgs& a, int c, int l, int k) {
    const int64_t ring = (static_cast<int64_t>(c) * a.topo.node_pes + l) * num_nodes(a.topo) + k;
    return a.nvl + ring * a.nvl_sub_ring_tokens * a.slot_bytes;
}
__device__ __forceinline__ int weights_at(const InternodeCombineArgs& a) { return moe::round_up_to_vector(a.hidden_bytes); }

// ---- sums ------------------------------------------------------------------------------------

// ANCHOR: sum_rows
// One warp: out = bf16(0 + row(0) + row(1) + ... + row(num - 1)), element by element in fp32,
// in that order, rounded once (row(i) null: skipped). UNROLL vectors per lane in flight, every
// row's loads before its adds. Rows are read through L2 (peers and our forwarder wrote them
// during this kernel).
template <typename RowAt>
__device__ __forceinline__ void sum_rows(int num, RowAt row, uint8_t* out, int hidden_bytes, int lane) {
    constexpr int UNROLL = 2;
    const int num_vectors = hidden_bytes / VECTOR_BYTES;
    for (int v0 = lane; v0 < num_vectors; v0 += WARP_SIZE * UNROLL) {
        float acc[UNROLL][BF16_PER_VECTOR] = {};
        for (int i = 0; i < num; ++i) {
            const uint4* r = reinterpret_cast<const uint4*>(row(i));
            if (r == nullptr) continue;
            uint4 raw[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) raw[u] = v0 + u * WARP_SIZE < num_vectors ? __ldcg(r + v0 + u * WARP_SIZE) : uint4{};
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw[u]);
#pragma unroll
                for (int e = 0; e < BF16_PER_VECTOR; ++e) acc[u][e] += __bfloat162float(h[e]);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (v0 + u * WARP_SIZE >= num_vectors) break;
            uint4 packed;
            __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&packed);
#pragma unroll
            for (int e = 0; e < BF16_PER_VECTOR; ++e) o[e] = __float2bfloat16_rn(acc[u][e]);
            reinterpret_cast<uint4*>(out)[v0 + u * WARP_SIZE] = packed;
        }
    }
}
// ANCHOR_END: sum_rows

// Lane j < num_topk: out[j] = 0 + weights(0)[j] + ... in that order, fp32 (weights(i) null: skipped).
template <typename WeightsAt>
__device__ __forceinline__ void sum_weights(int num, WeightsAt weights, float* out, int num_topk, int lane) {
    if (lane >= num_topk) return;
    float sum = 0.0f;
    for (int i = 0; i < num; ++i) {
        const float* w = weights(i);
        if (w != nullptr) sum += __ldcg(w + lane);
    }
    out[lane] = sum;
}

// ---- NVL senders -----------------------------------------------------------------------------

// What one sender group keeps per stream k (rows from source (k, l) in this channel): its rows
// in x, those sent, the sub-ring position; and the stream it picked.
struct SenderStreams {
    int first[MAX_NODES], count[MAX_NODES], sent[MAX_NODES];
    uint64_t pos[MAX_NODES];
    int chosen;
};

// One thread: a stream with rows left and sub-ring space for its next window, round-robin from
// `*next`; -2 when every stream is sent, -1 for none yet, -3 after the timeout (recorded,
// naming forwarder l) or another wait's failure.
__device__ __forceinline__ int pick_stream(const Workspace& ws, const InternodeCombineArgs& a, const SenderStreams& s, int c,
                                           int l, int* next, long long* idle_since, uint64_t call) {
    const int N = num_nodes(a.topo);
    int owing = -1;
    uint64_t need = 0;
    for (int i = 0; i < N; ++i) {
        const int k = (*next + i) % N;
        const int left = s.count[k] - s.sent[k];
        if (left == 0) continue;
        const int w = min(left, a.nvl_window_tokens);
        const uint64_t needed = space_needed(s.pos[k] + w, a.nvl_sub_ring_tokens);
        if (needed == 0 || ld_acquire_sys(a.nvl_counters.heads + member_node(a, c, l, k)) >= needed) {
            *next = k + 1;
            *idle_since = clock64();
            return k;
        }
        if (owing < 0) owing = k, need = needed;
    }
    if (owing < 0) return -2;
    if (failed(ws)) return -3;
    if (clock64() - *idle_since > ws.timeout_cycles) {
        const uint64_t head = ld_acquire_sys(a.nvl_counters.heads + member_node(a, c, l, owing));
        record_failure(ws, WAIT_COMBINE_NVL_SPACE, failure_rank(a.topo, a.topo.node_start + l), need, head, call);
        return -3;
    }
    return -1;
}

// The group's window of stream k into sub-ring (c, us, k) on forwarder l: a warp per row, the
// row and its weights (zeros for a row past x: check_rows recorded it), then the tail.
__device__ __forceinline__ void send_window(const Workspace& ws, const InternodeCombineArgs& a, SenderStreams& s, int c,
                                            const PeerGroup& g, int k) {
    const LlTopology& topo = a.topo;
    const int l = g.peer, lane = threadIdx.x % WARP_SIZE, K = a.num_topk;
    const int w = min(s.count[k] - s.sent[k], a.nvl_window_tokens);
    const uint64_t p = s.pos[k];
    uint8_t* ring = node_peer(ws, topo, sub_ring(a, c, my_local(topo), k), topo.node_start + l);
    for (int i = g.member; ring != nullptr && i < w; i += g.size) {
        const int64_t row = s.first[k] + s.sent[k] + i;
        uint8_t* slot = ring + static_cast<int64_t>((p + i) % a.nvl_sub_ring_tokens) * a.slot_bytes;
        if (row < a.num_recv_rows) {
            moe::warp_copy<false, 4>(slot, a.x + row * a.hidden_bytes, a.hidden_bytes, lane);
            if (lane < K) reinterpret_cast<float*>(slot + weights_at(a))[lane] = __ldg(a.topk_weights + row * K + lane);
        } else {
            for (int v = lane; v < a.slot_bytes / VECTOR_BYTES; v += WARP_SIZE) reinterpret_cast<uint4*>(slot)[v] = uint4{};
        }
    }
    g.sync();  // every row of the window stored
    if (g.member == 0 && lane == 0) {
        uint64_t* tail = node_peer(ws, topo, a.nvl_counters.tails + member_node(a, c, my_local(topo), k), topo.node_start + l);
        if (tail != nullptr) st_release_sys(tail, p + w);
        s.pos[k] = p + w;
        s.sent[k] += w;
    }
}

// ANCHOR: nvl_send
// The senders of forwarder l (group g.peer) in channel c: per node k, the rows we received from
// (k, l) in this channel (handle 5's range), back in order, any stream with space first.
__device__ void nvl_send(const Workspace& ws, const InternodeCombineArgs& a, uint64_t call, int c, const PeerGroup& g) {
    __shared__ SenderStreams streams[MAX_PES];
    SenderStreams& s = streams[g.index];
    const int G = a.topo.node_pes, N = num_nodes(a.topo), C = a.num_channels, l = g.peer, lane = threadIdx.x % WARP_SIZE;
    if (g.member == 0) {
        for (int k = lane; k < N; k += WARP_SIZE) {
            const int src = k * G + l;
            const int first = a.recv_gbl_channel_prefix_matrix[src * C + c];
            const int next = c + 1 < C ? a.recv_gbl_channel_prefix_matrix[src * C + c + 1] : a.recv_gbl_rank_prefix_sum[src];
            s.first[k] = first;
            s.count[k] = next - first;
            s.sent[k] = 0;
            s.pos[k] = a.nvl_counters.sent[member_node(a, c, l, k)];
        }
    }
    int next = 0;
    long long idle_since = clock64();
    for (;;) {
        g.sync();  // the last window's state is stored
        if (g.member == 0 && lane == 0) s.chosen = pick_stream(ws, a, s, c, l, &next, &idle_since, call);
        g.sync();
        const int k = s.chosen;
        if (k == -2 || k == -3) break;
        if (k >= 0) send_window(ws, a, s, c, g, k);
    }
    if (s.chosen == -3 || g.member != 0) return;  // gave up: the positions stay (the buffer is unusable)
    for (int k = lane; k < N; k += WARP_SIZE) a.nvl_counters.sent[member_node(a, c, l, k)] = s.pos[k];
}
// ANCHOR_END: nvl_send

// ---- forwarder -------------------------------------------------------------------------------

// What the forwarder's threads share: per destination node k, the RDMA position of its next
// chunk, rows left and taken of its stream, where the stream starts among the forwarded rows
// and where our own pieces start in x; per (node, member) = k G + l' the next sub-ring position
// (l' = us: our pieces taken from x) and which rows of node k's next chunk l' got, a bit each.
struct Forwarder {
    uint64_t pos[MAX_NODES];
    int left[MAX_NODES], taken[MAX_NODES], first_row[MAX_NODES], self_row[MAX_NODES];
    uint64_t nvl_pos[MAX_NORMAL_RANKS];
    uint32_t got[MAX_NORMAL_RANKS];
    int chosen;
};

// Thread l < G: which rows of node k's next chunk member l got (send_nvl_head not -1; a row
// past send_nvl_head: none, check_rows recorded it).
__device__ __forceinline__ void chunk_pieces(const InternodeCombineArgs& a, Forwarder& f, int k, int l) {
    const int G = a.topo.node_pes, m = min(f.left[k], a.rings.chunk_tokens);
    uint32_t got = 0;
    for (int i = 0; i < m; ++i) {
        const int64_t j = f.first_row[k] + f.taken[k] + i;
        if (j < a.num_forwarded_rows && a.send_nvl_head[j * G + l] >= 0) got |= 1u << i;
    }
    f.got[k * G + l] = got;
}

// Whether node k's next chunk can go: space for it in our rail peer's landing ring, and every
// member's pieces in their sub-rings. If not, what it waits for (kind, the rank to name, the
// word's target and value).
struct Missing {
    Failure kind;
    int rank;
    uint64_t expected, seen;
};
__device__ __forceinline__ bool chunk_ready(const InternodeCombineArgs& a, const Forwarder& f, int c, int k, Missing* why) {
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, N = num_nodes(topo), me = my_local(topo);
    const int m = min(f.left[k], a.rings.chunk_tokens);
    const uint64_t need = space_needed(f.pos[k] + m, a.rings.ring_tokens);
    const uint64_t head = need > 0 ? ld_acquire_sys(a.rings.heads + c * N + k) : 0;
    if (head < need) {
        *why = {WAIT_COMBINE_RDMA_SPACE, failure_rank(topo, k * G + me), need, head};
        return false;
    }
    for (int l = 0; l < G; ++l) {
        const uint32_t got = f.got[k * G + l];
        if (l == me || got == 0) continue;
        const uint64_t want = f.nvl_pos[k * G + l] + __popc(got);
        const uint64_t tail = ld_acquire_sys(a.nvl_counters.tails + member_node(a, c, l, k));
        if (tail < want) {
            *why = {WAIT_COMBINE_NVL_DATA, failure_rank(topo, topo.node_start + l), want, tail};
            return false;
        }
    }
    return true;
}

// Thread 0: a node whose next chunk can go, round-robin from `*next`; -2 when every stream is
// done, -1 for none yet, -3 after the timeout (recorded: what the first node still owing waits
// for) or another wait's failure.
__device__ __forceinline__ int pick_node(const Workspace& ws, const InternodeCombineArgs& a, const Forwarder& f, int c,
                                         int* next, long long* idle_since, uint64_t call) {
    const int N = num_nodes(a.topo);
    int owing = -1;
    Missing why{}, first{};
    for (int i = 0; i < N; ++i) {
        const int k = (*next + i) % N;
        if (f.left[k] == 0) continue;
        if (chunk_ready(a, f, c, k, &why)) {
            *next = k + 1;
            *idle_since = clock64();
            return k;
        }
        if (owing < 0) owing = k, first = why;
    }
    if (owing < 0) return -2;
    if (failed(ws)) return -3;
    if (clock64() - *idle_since > ws.timeout_cycles) {
        record_failure(ws, first.kind, first.rank, first.expected, first.seen, call);
        return -3;
    }
    return -1;
}

// Where member l's piece of row i of node k's chunk is: its sub-ring slot, or ours in x. Null
// when l did not get the row (or ours is past x).
__device__ __forceinline__ const uint8_t* piece(const InternodeCombineArgs& a, const Forwarder& f, int c, int k, int l,
                                                int i) {
    const int G = a.topo.node_pes;
    const uint32_t got = f.got[k * G + l];
    if (!(got >> i & 1)) return nullptr;
    const uint64_t at = f.nvl_pos[k * G + l] + __popc(got & ((1u << i) - 1));
    if (l != my_local(a.topo)) return sub_ring(a, c, l, k) + static_cast<int64_t>(at % a.nvl_sub_ring_tokens) * a.slot_bytes;
    const int64_t row = f.self_row[k] + static_cast<int64_t>(at);
    return row < a.num_recv_rows ? a.x + row * a.hidden_bytes : nullptr;
}

// ANCHOR: combine_chunk
// Node k's next chunk: row i by warp i (c_r <= 32), its pieces summed in member order into
// slot p + i of staging ring (c, k) (our own node: of our landing ring); then the sub-ring
// heads back to the members, the chunk to node k, the head returned for the next chunk's pieces.
__device__ __forceinline__ void combine_chunk(const Workspace& ws, const InternodeCombineArgs& a, Forwarder& f, int c, int k) {
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, me = my_local(topo), lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const uint64_t p = f.pos[k];
    const int m = min(f.left[k], a.rings.chunk_tokens), K = a.num_topk;
    uint8_t* ring = k == my_node(topo) ? landing(a, c, k) : staging(a, c, k);
    for (int i = warp; i < m; i += blockDim.x / WARP_SIZE) {
        uint8_t* out = slot_at(a, ring, p + i, a.rings.ring_tokens);
        sum_rows(G, [&](int l) { return piece(a, f, c, k, l, i); }, out, a.hidden_bytes, lane);
        const auto weights = [&](int l) -> const float* {
            const uint8_t* at = piece(a, f, c, k, l, i);
            if (at == nullptr) return nullptr;
            if (l != me) return reinterpret_cast<const float*>(at + weights_at(a));
            return a.topk_weights + (at - a.x) / a.hidden_bytes * K;
        };
        if (K > 0) sum_weights(G, weights, reinterpret_cast<float*>(out + weights_at(a)), K, lane);
    }
    __syncthreads();  // every slot of the chunk stored, every piece read
    const int l = threadIdx.x;
    if (l < G && f.got[k * G + l] != 0) {
        f.nvl_pos[k * G + l] += __popc(f.got[k * G + l]);
        uint64_t* head = l == me ? nullptr : node_peer(ws, topo, a.nvl_counters.heads + member_node(a, c, me, k), topo.node_start + l);
        if (head != nullptr) st_release_sys(head, f.nvl_pos[k * G + l]);
    }
    if (warp == 1) post_chunk(a, c, k, p, m, true, lane);
    if (threadIdx.x == WARP_SIZE * 2) {
        f.pos[k] = p + a.rings.chunk_tokens;  // a chunk spans c_r positions (the call's last: rounded)
        f.left[k] -= m;
        f.taken[k] += m;
    }
    __syncthreads();
    if (l < G) chunk_pieces(a, f, k, l);
}
// ANCHOR_END: combine_chunk

// The forwarder block of channel c: the N streams polled until each is sent (counts from
// handles 3 and 4; our own pieces in x from handle 5).
__device__ void forward(const Workspace& ws, const InternodeCombineArgs& a, uint64_t call, int c) {
    __shared__ Forwarder f;
    const LlTopology& topo = a.topo;
    const int G = topo.node_pes, N = num_nodes(topo), C = a.num_channels, me = my_local(topo);
    for (int k = threadIdx.x; k < N; k += blockDim.x) {
        const int* prefix = a.recv_rdma_channel_prefix_matrix + k * C;
        f.pos[k] = round_to_chunk(a.rings.sent[c * N + k], a.rings.chunk_tokens);  // this call's chunk grid
        f.left[k] = prefix[c] - (c > 0 ? prefix[c - 1] : 0);
        f.taken[k] = 0;
        f.first_row[k] = (k > 0 ? a.recv_rdma_rank_prefix_sum[k - 1] : 0) + (c > 0 ? prefix[c - 1] : 0);
        f.self_row[k] = a.recv_gbl_channel_prefix_matrix[(k * G + me) * C + c];
    }
    for (int i = threadIdx.x; i < N * G; i += blockDim.x) {
        const int k = i / G, l = i % G;
        f.nvl_pos[i] = l == me ? 0 : a.nvl_counters.received[member_node(a, c, l, k)];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < N * G; i += blockDim.x) chunk_pieces(a, f, i / G, i % G);
    int next = 0;
    long long idle_since = clock64();
    for (;;) {
        __syncthreads();
        if (threadIdx.x == 0) f.chosen = pick_node(ws, a, f, c, &next, &idle_since, call);
        __syncthreads();
        const int k = f.chosen;
        if (k == -2 || k == -3) break;
        if (k >= 0) combine_chunk(ws, a, f, c, k);
    }
    if (f.chosen == -3) return;  // the progress words stay where they were: the buffer is unusable
    for (int k = threadIdx.x; k < N; k += blockDim.x) a.rings.sent[c * N + k] = f.pos[k];
    for (int i = threadIdx.x; i < N * G; i += blockDim.x) {
        if (i % G != me) a.nvl_counters.received[member_node(a, c, i % G, i / G)] = f.nvl_pos[i];
    }
}

// ---- home receivers --------------------------------------------------------------------------

// ANCHOR: receive_token
// Token t by one warp: lane 0 waits for the chunk of each node's sum (send_rdma_head: its
// index in that node's stream, from `base`), then bias0 + bias1 + the sums in node order, and
// the weights in node order. False when a wait gave up.
__device__ __forceinline__ bool receive_token(const Workspace& ws, const InternodeCombineArgs& a, uint64_t call, int c,
                                              int t, const uint64_t* base) {
    const LlTopology& topo = a.topo;
    const int N = num_nodes(topo), lane = threadIdx.x % WARP_SIZE;
    const int* head = a.send_rdma_head + static_cast<int64_t>(t) * N;
    bool alive = true;
    for (int k = 0; k < N && lane == 0 && alive; ++k) {
        const uint64_t p = base[k] + head[k];
        if (head[k] >= 0) {
            const int rail_peer = failure_rank(topo, k * topo.node_pes + my_local(topo));
            alive = wait_at_least(ws, chunk_word(a, c, k, p), p + 1, WAIT_COMBINE_RDMA_DATA, rail_peer, call);
        }
    }
    if (!__shfl_sync(ALL_LANES, alive, 0)) return false;
    const auto node_sum = [&](int k) -> const uint8_t* {
        return head[k] >= 0 ? slot_at(a, landing(a, c, k), base[k] + head[k], a.rings.ring_tokens) : nullptr;
    };
    const int64_t row = static_cast<int64_t>(t) * a.hidden_bytes;
    const auto term = [&](int i) -> const uint8_t* {
        if (i < 2) {
            const uint8_t* bias = i == 0 ? a.bias0 : a.bias1;
            return bias != nullptr ? bias + row : nullptr;
        }
        return node_sum(i - 2);
    };
    sum_rows(2 + N, term, a.combined_x + row, a.hidden_bytes, lane);
    if (a.num_topk > 0) {
        const auto weights = [&](int k) -> const float* {
            const uint8_t* at = node_sum(k);
            return at != nullptr ? reinterpret_cast<const float*>(at + weights_at(a)) : nullptr;
        };
        sum_weights(N, weights, a.combined_topk_weights + static_cast<int64_t>(t) * a.num_topk, a.num_topk, lane);
    }
    return true;
}
// ANCHOR_END: receive_token

// ANCHOR: home_receive
// The home receivers of channel c (warps COMBINE_SENDER_WARPS on): a token per warp and round,
// in token order; after each round, thread k returns ring (c, k)'s positions up to the round's
// last token there (send_rdma_head grows along the channel). Starts and ends on this call's
// chunk grid, as the forwarder (the skipped positions go back too).
__device__ void home_receive(const Workspace& ws, const InternodeCombineArgs& a, uint64_t call, int c) {
    __shared__ uint64_t base[MAX_NODES], returned[MAX_NODES];
    __shared__ int alive;
    const int N = num_nodes(a.topo), C = a.num_channels, first = COMBINE_SENDER_WARPS * WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE - COMBINE_SENDER_WARPS, r = threadIdx.x - first;
    const auto sync = [&] { named_barrier_sync(RECEIVER_BARRIER, warps * WARP_SIZE); };
    for (int k = r; k < N; k += warps * WARP_SIZE) {
        const uint64_t was = a.rings.received[c * N + k];
        base[k] = returned[k] = round_to_chunk(was, a.rings.chunk_tokens);
        if (base[k] != was) return_head(a, c, k, was, base[k]);
    }
    if (r == 0) alive = 1;
    sync();
    int begin, end;
    channel_range(a.num_tokens, C, c, &begin, &end);
    for (int round = begin; round < end && alive; round += warps) {
        const int t = round + r / WARP_SIZE;
        if (t < end && !receive_token(ws, a, call, c, t, base) && r % WARP_SIZE == 0) alive = 0;
        sync();  // the round's slots are read
        for (int k = r; k < N && alive; k += warps * WARP_SIZE) {
            for (int i = min(end, round + warps) - 1; i >= round; --i) {
                const int h = a.send_rdma_head[static_cast<int64_t>(i) * N + k];
                if (h < 0) continue;
                return_head(a, c, k, returned[k], base[k] + h + 1);
                returned[k] = base[k] + h + 1;
                break;
            }
        }
        sync();
    }
    for (int k = r; k < N && alive; k += warps * WARP_SIZE) {
        const int* prefix = a.rdma_channel_prefix_matrix + k * C;
        const uint64_t done = round_to_chunk(base[k] + prefix[c] - (c > 0 ? prefix[c - 1] : 0), a.rings.chunk_tokens);
        return_head(a, c, k, returned[k], done);
        a.rings.received[c * N + k] = done;
    }
}
// ANCHOR_END: home_receive

// A handle naming more rows than x holds (received) is bad input, as in chapter 7: recorded as
// RECV_OVERFLOW (the first source rank whose rows do not all fit, the rows named, the rows x
// has); those rows go back as zeros, so every ring still moves as the peers expect. One naming
// more rows than send_nvl_head holds (forwarded) cannot be run: which members sent a piece of
// those rows is in the missing entries, so the sub-rings would fall out of step. It is recorded
// as this rank's failure (RECV_OVERFLOW, n + the first source node short of rows): the buffer
// is unusable from here on. One thread.
__device__ __forceinline__ void check_rows(const Workspace& ws, const InternodeCombineArgs& a, uint64_t call) {
    const int n = a.topo.num_ranks, N = num_nodes(a.topo);
    const int received = a.recv_gbl_rank_prefix_sum[n - 1], forwarded = a.recv_rdma_rank_prefix_sum[N - 1];
    if (received > a.num_recv_rows) {
        int s = 0;
        while (s + 1 < n && a.recv_gbl_rank_prefix_sum[s] <= a.num_recv_rows) ++s;
        record_input_error(a.bad_input, RECV_OVERFLOW, s, received, a.num_recv_rows);
    }
    if (forwarded > a.num_forwarded_rows) {
        int b = 0;
        while (b + 1 < N && a.recv_rdma_rank_prefix_sum[b] <= a.num_forwarded_rows) ++b;
        record_failure(ws, RECV_OVERFLOW, n + b, forwarded, a.num_forwarded_rows, call);
    }
}

// ANCHOR: internode_combine
// Grid 2C of CHANNEL_THREADS, all resident (every role waits for others).
extern "C" __global__ void __launch_bounds__(CHANNEL_THREADS) internode_combine(const __grid_constant__ Workspace ws,
                                                                         const __grid_constant__ InternodeCombineArgs a) {
    const uint64_t call = ld_volatile(a.calls + blockIdx.x) + 1;
    const int c = blockIdx.x / 2;
    if (blockIdx.x == 0 && threadIdx.x == 0) check_rows(ws, a, call);
    if (blockIdx.x % 2 == 1) {
        forward(ws, a, call, c);
    } else if (threadIdx.x >= COMBINE_SENDER_WARPS * WARP_SIZE) {
        home_receive(ws, a, call, c);
    } else {
        const PeerGroup g(a.topo.node_pes, my_local(a.topo), 0, COMBINE_SENDER_WARPS, SENDER_BARRIERS);
        if (g.active()) nvl_send(ws, a, call, c, g);
    }
    if (threadIdx.x == 0) a.calls[blockIdx.x] = call;
}
// ANCHOR_END: internode_combine

}  // namespace nvshmem_tutorial
