// Normal mode across nodes (issue 32): the notify step over N nodes of G ranks, in one launch
// (benchmarks/notes/buffer_internode_normal.md, sections 2.3 and 2.5; host model and reference:
// src/internode.rs). Before any token moves, every rank learns DeepEP's handle positions 1-6
// and how many rows it will receive, in two levels:
//
//   rail   block 1 + k counts our tokens for node k and sends one **rail row** to the rank with
//          our local index there (our rail peer): a put-with-signal across nodes, plain stores
//          and a release on our own node;
//   node   block 0 waits for the N rows sent to us, raises a ticket on every member of our node,
//          waits for theirs, and reads the G x N rows the node's members received through
//          node_peer (peer pointers inside the node only), which is every rank's row for us.
//
// A rail row, i32 (src/internode.rs rail_row, RowFormat below):
//   [tokens to each rank of node k: G][tokens per expert of node k: G L][tokens to node k: 1]
//   [node channel prefix: C][rank channel prefixes: G C]
//
// The cached flavour (a dispatch with a handle) sends no rows: the signals and the tickets alone
// are the entry barrier every call needs (2.3), and blocks 1..N check the handle's channel
// prefixes against its routing instead of writing them.
//
// ANCHOR: internode_notify_notes
// NOTES on the protocol (the subtle part):
// - Nothing is reset. signals[set][b] on a rank counts what came from node b's rail peer: in
//   set p (0, 1) its rows of that parity, in set 2 its cached notifies' signals; NVSHMEM's
//   signal ADD 1 across nodes, a release store of the count on our own node (one writer, one
//   route per word). tickets[l] holds the last notify member l has every row of. Call numbers
//   are counted per block on the device (InternodeNotifyState), so a graph replay is a new call.
// - Why a counter per parity: puts are not ordered with each other, only each one's signal
//   after its own data. With one counter of every notify, the rail peer's next row (the other
//   parity) could land first and bring the count to this call's target while this call's row
//   is still in flight (src/internode_protocol_tests.rs found it). A row of parity p cannot be
//   overtaken by the rail peer's next row of parity p: that one leaves only after the peer got
//   our row of the notify in between, which we sent only once this one had landed. So the
//   count of parity p names this call's row.
// - Rows are double-buffered by the parity of the notifies that send rows. The next writer of
//   rows[p][b] on rank (a, l) is (b, l), two such notifies later; every reader of it, (a, l)
//   and its node members through node_peer, finished the notify in between: (b, l) waited in
//   it for the tickets of its node, each raised after that member got the row of (a, member),
//   sent only once (a, member) had finished the notify before. Staging is double-buffered too:
//   a put that read staging[p][k] has landed once node k's rail peer signalled a later call.
// - The put's signal is ordered after its data by NVSHMEM: the wait for the signal is the wait
//   for the row, no fence or quiet. Before the put one thread fences system-wide after the
//   block's barrier: the NIC reads the staged row over PCIe.
// - Every wait is bounded and records who it waited for: WAIT_NOTIFY_ROWS names the rail peer
//   (rank and, on the host, node), WAIT_READY the node member whose ticket never came.
// ANCHOR_END: internode_notify_notes
#include "low_latency.cuh"

namespace nvshmem_tutorial {

static_assert(INTERNODE_NOTIFY_THREADS > MAX_PES, "a thread per prefix line: G ranks and the node");
static_assert(MAX_NOTIFY_BLOCKS == 1 + MAX_NODES, "InternodeNotifyState counts calls per block");

// Offsets of a rail row's parts, in i32 (host: src/internode.rs rail_row and rail_row_words).
struct RowFormat {
    int to_rank, per_expert, to_node, node_prefix, rank_prefix, words;
    __device__ RowFormat(int G, int L, int C)
        : to_rank(0),
          per_expert(G),
          to_node(G + G * L),
          node_prefix(G + G * L + 1),
          rank_prefix(G + G * L + 1 + C),
          words(G + G * L + 1 + C + G * C) {}
};

// What a block knows of the call: its number among all notifies (the tickets' target), among
// those with rows, the parity of the latter (which rows and staging), and its signal counter:
// the set it adds to and the count that set reaches with this call.
struct NotifyCall {
    uint64_t k, with_rows, target;
    int parity, set;
};

__device__ __forceinline__ NotifyCall begin_notify(const InternodeNotifyArgs& a) {
    const uint64_t k = ld_volatile(reinterpret_cast<const uint64_t*>(a.state->calls + blockIdx.x)) + 1;
    const uint64_t rows = ld_volatile(reinterpret_cast<const uint64_t*>(a.state->row_calls + blockIdx.x));
    const uint64_t with_rows = a.cached ? rows : rows + 1;
    const int parity = static_cast<int>(with_rows & 1);
    // Rows of parity p: that parity's notifies so far (1, 3, 5, ... of them: (w + p) / 2);
    // cached: the cached notifies so far.
    const uint64_t target = a.cached ? k - with_rows : (with_rows + parity) / 2;
    return {k, with_rows, target, parity, a.cached ? 2 : parity};
}

// This notify's signal word from node b's rail peer (symmetric: the same on every rank).
__device__ __forceinline__ uint64_t* signal_of(const InternodeNotifyArgs& a, const NotifyCall& call, int b) {
    return a.signals + call.set * MAX_NODES + b;
}

// Each block closes the call in its own words: only later launches read them.
__device__ __forceinline__ void end_notify(const InternodeNotifyArgs& a, const NotifyCall& call) {
    if (threadIdx.x == 0) {
        a.state->calls[blockIdx.x] = call.k;
        a.state->row_calls[blockIdx.x] = call.with_rows;
    }
}

// Row `node` of parity p in a [2][N][row_stride] array (rows or staging).
__device__ __forceinline__ int* row_at(const InternodeNotifyArgs& a, int* base, int parity, int node) {
    return base + (static_cast<int64_t>(parity) * num_nodes(a.topo) + node) * a.row_stride;
}

// ANCHOR: count_for_node
// Our tokens per channel for node k: to each of its G ranks (line l < G) and to the node (line
// MAX_PES: a token counts once however many of its ranks it goes to), as inclusive prefixes over
// the channels in prefix[line][c]. Every thread of the block calls it.
__device__ __forceinline__ void count_for_node(const InternodeNotifyArgs& a, int k, int (*prefix)[MAX_CHANNELS]) {
    const int G = a.topo.node_pes, n = a.topo.num_ranks, C = a.num_channels;
    for (int i = threadIdx.x; i < (MAX_PES + 1) * MAX_CHANNELS; i += blockDim.x) prefix[i / MAX_CHANNELS][i % MAX_CHANNELS] = 0;
    __syncthreads();
    for (int c = 0; c < C; ++c) {
        int begin, end;
        moe::channel_range(a.num_tokens, C, c, &begin, &end);
        int mine[MAX_PES + 1] = {};
        for (int t = begin + threadIdx.x; t < end; t += blockDim.x) {
            const bool* to = a.is_token_in_rank + static_cast<int64_t>(t) * n + k * G;
            bool any = false;
#pragma unroll
            for (int l = 0; l < MAX_PES; ++l) {
                const bool hit = l < G && to[l];
                mine[l] += hit;
                any |= hit;
            }
            mine[MAX_PES] += any;
        }
#pragma unroll
        for (int line = 0; line <= MAX_PES; ++line) {
            int count = mine[line];
            for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) count += __shfl_xor_sync(ALL_LANES, count, offset);
            if (threadIdx.x % WARP_SIZE == 0 && count > 0) atomicAdd(&prefix[line][c], count);
        }
    }
    __syncthreads();
    const int line = threadIdx.x;
    if (line < G || line == MAX_PES) {
        int sum = 0;
        for (int c = 0; c < C; ++c) prefix[line][c] = sum += prefix[line][c];
    }
    __syncthreads();
}
// ANCHOR_END: count_for_node

// The prefix line of a rail row's line i: rank i of the node, or (i == G) the node.
__device__ __forceinline__ const int* line_of(const int (*prefix)[MAX_CHANNELS], int i, int G) {
    return prefix[i < G ? i : MAX_PES];
}

// Our rail row for node k, the send side's handle rows for node k (positions 1 and 2), and the
// check of the caller's counts against the routing (the step goes by the routing, as chapter 7's).
__device__ __forceinline__ void write_rail_row(const InternodeNotifyArgs& a, int k, const int (*prefix)[MAX_CHANNELS],
                                               int* row) {
    const int G = a.topo.node_pes, C = a.num_channels, L = a.num_experts / a.topo.num_ranks;
    const RowFormat f(G, L, C);
    for (int i = threadIdx.x; i < (G + 1) * C; i += blockDim.x) {
        const int line = i / C, c = i % C;
        const int value = line_of(prefix, line, G)[c];
        if (line < G) {
            row[f.rank_prefix + line * C + c] = value;
            a.gbl_channel_prefix_matrix[(k * G + line) * C + c] = value;
        } else {
            row[f.node_prefix + c] = value;
            a.rdma_channel_prefix_matrix[k * C + c] = value;
        }
    }
    for (int i = threadIdx.x; i < G * L; i += blockDim.x) row[f.per_expert + i] = a.num_tokens_per_expert[k * G * L + i];
    const int line = threadIdx.x;
    if (line <= G) {
        const int total = line_of(prefix, line, G)[C - 1];
        row[line < G ? f.to_rank + line : f.to_node] = total;
        const int given = line < G ? a.num_tokens_per_rank[k * G + line] : a.num_tokens_per_rdma_rank[k];
        if (given != total) {
            const Failure kind = line < G ? COUNTS_MISMATCH : NODE_COUNTS_MISMATCH;
            moe::record_input_error(a.bad_input, kind, line < G ? k * G + line : k, total, uint64_t(int64_t(given)));
        }
    }
}

// A cached notify writes no handle: it checks that the handle's send side (positions 1 and 2)
// is what its routing (position 0) gives. A difference names the rank (or n + node) and both
// values.
__device__ __forceinline__ void check_handle(const InternodeNotifyArgs& a, int k, const int (*prefix)[MAX_CHANNELS]) {
    const int G = a.topo.node_pes, C = a.num_channels;
    for (int i = threadIdx.x; i < (G + 1) * C; i += blockDim.x) {
        const int line = i / C, c = i % C;
        const int want = line_of(prefix, line, G)[c];
        const int have =
            line < G ? a.gbl_channel_prefix_matrix[(k * G + line) * C + c] : a.rdma_channel_prefix_matrix[k * C + c];
        const int who = line < G ? k * G + line : a.topo.num_ranks + k;
        if (have != want) moe::record_input_error(a.bad_input, HANDLE_MISMATCH, who, want, uint64_t(int64_t(have)));
    }
}

// ANCHOR: send_rail_row
// Row k goes to our rail peer on node k, into its rows[parity][our node], and its signal follows:
// on our own node (we are the rail peer) the row is already in place and a release store after
// the block's barrier publishes it; across nodes one put-with-signal carries the row and adds 1
// to the signal after it. A cached notify sends the signal alone.
__device__ __forceinline__ void send_rail_row(const InternodeNotifyArgs& a, int k, const NotifyCall& call, const int* row,
                                              int num_words) {
    const LlTopology& topo = a.topo;
    uint64_t* signal = signal_of(a, call, my_node(topo));
    const int peer = k * topo.node_pes + my_local(topo);
    __syncthreads();  // every store of the row is issued
    if (k == my_node(topo)) {
        if (threadIdx.x == 0) st_release_sys(signal, call.target);
        return;
    }
    if (a.cached) {
        if (threadIdx.x == 0) nvshmemx_signal_op(signal, 1, NVSHMEM_SIGNAL_ADD, peer);
        return;
    }
    if (threadIdx.x == 0) __threadfence_system();  // the NIC reads the staged row over PCIe
    __syncthreads();
    int* dest = row_at(a, a.rows, call.parity, my_node(topo));
    nvshmemx_putmem_signal_nbi_block(dest, row, num_words * sizeof(int), signal, 1, NVSHMEM_SIGNAL_ADD, peer);
}
// ANCHOR_END: send_rail_row

// Block 1 + k: the rail row for node k, built and sent (or, cached, the handle checked and the
// signal sent).
__device__ __forceinline__ void send_side(const InternodeNotifyArgs& a, int k, const NotifyCall& call) {
    __shared__ int prefix[MAX_PES + 1][MAX_CHANNELS];
    const LlTopology& topo = a.topo;
    count_for_node(a, k, prefix);
    // Our own node's row goes straight where block 0 reads it; the others are staged for the put.
    int* row = row_at(a, k == my_node(topo) ? a.rows : a.staging, call.parity, k);
    if (a.cached) {
        check_handle(a, k, prefix);
    } else {
        write_rail_row(a, k, prefix, row);
    }
    const RowFormat f(topo.node_pes, a.num_experts / topo.num_ranks, a.num_channels);
    send_rail_row(a, k, call, row, f.words);
}

// ANCHOR: wait_rows
// Thread b waits until node b's rail peer's signal reached this call's count; the block learns
// whether all did.
__device__ __forceinline__ bool wait_rows(const Workspace& ws, const InternodeNotifyArgs& a, const NotifyCall& call) {
    __shared__ int all_came;
    const LlTopology& topo = a.topo;
    if (threadIdx.x == 0) all_came = 1;
    __syncthreads();
    for (int b = threadIdx.x; b < num_nodes(topo); b += blockDim.x) {
        const int from = b * topo.node_pes + my_local(topo);
        const int who = failure_rank(topo, from);
        if (!wait_at_least(ws, signal_of(a, call, b), call.target, WAIT_NOTIFY_ROWS, who, call.k)) all_came = 0;
    }
    __syncthreads();
    return all_came;
}

// The node's half of the barrier: our ticket on every member of the node (we hold every row for
// us-as-forwarder), then a wait for each member's ticket on us.
__device__ __forceinline__ bool node_tickets(const Workspace& ws, const InternodeNotifyArgs& a, const NotifyCall& call) {
    __shared__ int all_came;
    const LlTopology& topo = a.topo;
    if (threadIdx.x == 0) all_came = 1;
    __syncthreads();
    const int l = threadIdx.x;
    if (l < topo.node_pes) {
        uint64_t* ticket = node_peer(ws, topo, a.tickets + my_local(topo), topo.node_start + l);
        if (ticket != nullptr) st_release_sys(ticket, call.k);
        if (!wait_at_least(ws, a.tickets + l, call.k, WAIT_READY, l, call.k)) all_came = 0;
    }
    __syncthreads();
    return all_came;
}
// ANCHOR_END: wait_rows

// As a forwarder: what our rail peers send through us, by source node (handle 3 and 4).
// Returns the rows we forward (the last prefix), in thread 0.
__device__ __forceinline__ int write_forwarded(const InternodeNotifyArgs& a, const NotifyCall& call) {
    const int N = num_nodes(a.topo), C = a.num_channels;
    const RowFormat f(a.topo.node_pes, a.num_experts / a.topo.num_ranks, C);
    for (int i = threadIdx.x; i < N * C; i += blockDim.x) {
        const int* row = row_at(a, a.rows, call.parity, i / C);
        a.recv_rdma_channel_prefix_matrix[i] = __ldcg(row + f.node_prefix + i % C);
    }
    int sum = 0;
    if (threadIdx.x == 0) {
        for (int b = 0; b < N; ++b) {
            sum += __ldcg(row_at(a, a.rows, call.parity, b) + f.to_node);
            a.recv_rdma_rank_prefix_sum[b] = sum;
        }
    }
    return sum;
}

// ANCHOR: write_received
// As a receiver: member l of our node holds, in rows[p][b], the row of source rank s = b G + l,
// whose part for us is at our local index. Through node_peer, every source's rows for us by
// channel (handle 5 and 6, rows grouped by source rank), and for the host its per-expert counts
// rounded up to expert_alignment, the rows we forward, and (word 0, last) the rows we receive.
__device__ __forceinline__ void write_received(const Workspace& ws, const InternodeNotifyArgs& a, const NotifyCall& call,
                                               int num_forwarded) {
    __shared__ const int* from[MAX_NORMAL_RANKS];
    __shared__ int before[MAX_NORMAL_RANKS + 1];
    const LlTopology& topo = a.topo;
    const int n = topo.num_ranks, G = topo.node_pes, C = a.num_channels, L = a.num_experts / n, me = my_local(topo);
    const RowFormat f(G, L, C);
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        from[s] = node_peer(ws, topo, row_at(a, a.rows, call.parity, s / G), topo.node_start + s % G);
        before[s + 1] = from[s] != nullptr ? __ldcg(from[s] + f.to_rank + me) : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        before[0] = 0;
        for (int s = 0; s < n; ++s) before[s + 1] += before[s];
    }
    __syncthreads();
    for (int s = threadIdx.x; s < n; s += blockDim.x) a.recv_gbl_rank_prefix_sum[s] = before[s + 1];
    for (int i = threadIdx.x; i < n * C; i += blockDim.x) {
        const int s = i / C, c = i % C;
        const int start = c == 0 || from[s] == nullptr ? 0 : __ldcg(from[s] + f.rank_prefix + me * C + c - 1);
        a.recv_gbl_channel_prefix_matrix[i] = before[s] + start;
    }
    volatile int* host = a.counts;
    for (int e = threadIdx.x; e < L; e += blockDim.x) {
        int sum = 0;
        for (int s = 0; s < n; ++s) sum += from[s] != nullptr ? __ldcg(from[s] + f.per_expert + me * L + e) : 0;
        host[1 + e] = (sum + a.expert_alignment - 1) / a.expert_alignment * a.expert_alignment;
    }
    if (threadIdx.x == 0) host[1 + L] = num_forwarded;
    __syncthreads();  // every thread's counts before thread 0's fence: it publishes them all
    if (threadIdx.x == 0) {
        __threadfence_system();
        host[0] = before[n];
    }
}
// ANCHOR_END: write_received

// ANCHOR: internode_notify
// Grid 1 + N blocks, all resident (block 0 waits for rows that blocks of other ranks send).
extern "C" __global__ void __launch_bounds__(INTERNODE_NOTIFY_THREADS) internode_notify(Workspace ws, InternodeNotifyArgs a) {
    const NotifyCall call = begin_notify(a);
    if (blockIdx.x > 0) {
        send_side(a, blockIdx.x - 1, call);
    } else if (wait_rows(ws, a, call)) {
        const int num_forwarded = a.cached ? 0 : write_forwarded(a, call);
        if (node_tickets(ws, a, call) && !a.cached) write_received(ws, a, call, num_forwarded);
    }
    end_notify(a, call);
}
// ANCHOR_END: internode_notify

}  // namespace nvshmem_tutorial
