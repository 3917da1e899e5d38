// Chapter 5: the second half of the hierarchical all-to-all-v, inside one node. After
// hier_a2av_send (rma_a2av.cu), PE (k', l) holds, in its rail scratch, slot k = the rows that
// PE (k, l) sent to every PE of node k', and in its rail counts, row k = PE (k, l)'s counts.
// Every PE of node k' now pulls its own rows out of every forwarder's slots through peer
// pointers (the forwarders are in its node: chapter 4's Workspace reaches exactly them), in
// source PE order. This is a call of the node's chapter-4 communicator: it follows
// coll_common.cuh's protocol (begin_call, tickets, end_call) and fails into its record.
#include "coll_common.cuh"
#include "rma.cuh"

using namespace coll;
using rma::a2av_slot_bytes;
using rma::BAD_ROW;

// Every count of the job, [source PE][destination PE], from the node's forwarders: source
// (k, l)'s row is row k of forwarder l's rail counts. Loaded once per block into shared memory.
__device__ __forceinline__ void load_counts(const Workspace& ws, const RmaWorkspace& rail,
                                            uint64_t (&counts)[MAX_GROUP][MAX_GROUP]) {
    const int node_pes = ws.n_pes, n_pes = node_pes * rail.size;
    for (int i = threadIdx.x; i < n_pes * n_pes; i += blockDim.x) {
        const int source = i / n_pes, dest = i % n_pes;
        const int k = source / node_pes, l = source % node_pes;
        const uint64_t* rows = l == ws.my_pe ? rail.counts : peer(ws, rail.counts, l);
        counts[source][dest] = ld_volatile(rows + k * MAX_GROUP + dest);
    }
    __syncthreads();
}

// The same verdict on every PE of the job (each sees every count): a bad row, a node's rows
// that did not fit their slot, or a PE that would receive more rows than `out_rows`.
// Block-collective; block 0 records what it found in the rail group's record, which names
// world PEs (the node communicator's names members of the node).
__device__ __forceinline__ bool all_counts_valid(const Workspace& ws, const RmaWorkspace& rail,
                                                 const uint64_t (&counts)[MAX_GROUP][MAX_GROUP], uint64_t row_bytes,
                                                 uint64_t out_rows, uint64_t epoch) {
    const int node_pes = ws.n_pes, n_pes = node_pes * rail.size;
    const uint64_t slot_rows = a2av_slot_bytes(rail) / row_bytes;
    bool ok = true;
    for (int t = threadIdx.x; t < n_pes; t += blockDim.x) {
        uint64_t total = 0;  // thread t: column t (what PE t receives) and row t (what it sends)
        for (int s = 0; s < n_pes; ++s) total += counts[s][t] == BAD_ROW ? 0 : counts[s][t];
        for (int k = 0; k < rail.size && counts[t][0] != BAD_ROW; ++k) {
            uint64_t rows = 0;
            for (int d = k * node_pes; d < (k + 1) * node_pes; ++d) rows += counts[t][d];
            if (rows > slot_rows && blockIdx.x == 0) record_failure(rail, SLOT_OVERFLOW, t, slot_rows, rows, epoch);
            ok = ok && rows <= slot_rows;
        }
        if (counts[t][0] == BAD_ROW && blockIdx.x == 0) record_failure(rail, BAD_SPLITS, t, 0, 0, epoch);
        if (total > out_rows && blockIdx.x == 0) record_failure(rail, OUT_TOO_SMALL, t, out_rows, total, epoch);
        ok = ok && counts[t][0] != BAD_ROW && total <= out_rows;
    }
    return __syncthreads_and(ok);
}

// ANCHOR: node_forward
// out: local [out_rows, row_bytes] (this PE's rows, grouped by source PE in PE order);
// out_splits_offsets: local int64 [2, n_pes]. `ws` is the node's communicator (members = the
// PEs of this node), `rail` this PE's rail group (member = node).
extern "C" __global__ void __launch_bounds__(COLL_THREADS)
    hier_a2av_forward(const __grid_constant__ Workspace ws, const __grid_constant__ RmaWorkspace rail, uint8_t* out,
                      int64_t* out_splits_offsets, uint64_t row_bytes, uint64_t out_rows) {
    __shared__ uint64_t counts[MAX_GROUP][MAX_GROUP];
    const uint64_t epoch = begin_call(ws);
    const int node_pes = ws.n_pes, n_pes = node_pes * rail.size;
    const int me = rail.me * node_pes + ws.my_pe, first_of_node = rail.me * node_pes;
    const uint64_t slot_bytes = a2av_slot_bytes(rail);
    // Every forwarder entered this call, so (stream order) its send step is over: its slots
    // and counts hold this call's rows.
    if (block_wait_ready(ws, epoch)) {
        load_counts(ws, rail, counts);
        if (all_counts_valid(ws, rail, counts, row_bytes, out_rows, epoch)) {
            uint64_t out_row = 0;
            for (int s = 0; s < n_pes; ++s) {
                const int k = s / node_pes, l = s % node_pes;
                uint64_t skip = 0;  // rows of slot k for PEs of this node before me
                for (int d = first_of_node; d < me; ++d) skip += counts[s][d];
                const uint8_t* slot = (l == ws.my_pe ? rail.scratch : peer(ws, rail.scratch, l)) + k * slot_bytes;
                for_each_piece(counts[s][me] * row_bytes, [&](uint64_t begin, uint64_t end) {
                    copy_bytes(out + out_row * row_bytes, slot + skip * row_bytes, begin, end, threadIdx.x,
                               blockDim.x);
                });
                out_row += counts[s][me];
            }
            // "I have read your slots": a forwarder's next send step (which overwrites them)
            // comes after its copy of this call, which ends after everyone's ticket.
            block_signal_done_all(ws, ticket(epoch, 1));
            block_wait_done_all(ws, ticket(epoch, 1), epoch);
            if (blockIdx.x == 0 && threadIdx.x == 0) {
                int64_t offset = 0;
                for (int s = 0; s < n_pes; ++s) {
                    out_splits_offsets[s] = int64_t(counts[s][me]);
                    out_splits_offsets[n_pes + s] = offset;
                    offset += int64_t(counts[s][me]);
                }
            }
        }
    }
    end_call(ws, epoch);
}
// ANCHOR_END: node_forward
