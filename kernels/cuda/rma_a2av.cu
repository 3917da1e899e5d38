// Chapter 5: all-to-all-v over an RMA group, counts known only on the device. The flat
// algorithm (every PE a member) sends each PE's rows straight into the receivers' outputs;
// the hierarchical one (the rail: one member per node) sends each node the rows of all its
// PEs in one put, into a landing slot, and node_forward.cu hands them on inside the node. Like
// rma_coll.cu, nothing here computes a peer pointer.
#include "rma.cuh"

using namespace rma;

// ANCHOR: rma_counts
// Step 0 of every all-to-all-v: this PE's counts (in_splits: rows for each of the job's
// `n_pes` PEs, or BAD_ROW everywhere when they are negative or add up to more than `in_rows`)
// into counts[me] of every member. Block 0 writes the row into its own symmetric copy (over
// InfiniBand a put's source must be symmetric or registered memory) and puts it; every block
// then waits until every member's row has arrived.
__device__ __forceinline__ bool exchange_counts(const RmaWorkspace& g, uint64_t epoch, const int64_t* in_splits,
                                                int n_pes, uint64_t in_rows) {
    uint64_t* row = counts_row(g, g.me);
    if (blockIdx.x == 0) {
        __shared__ int valid;
        if (threadIdx.x == 0) {
            int64_t total = 0;
            bool ok = true;
            for (int q = 0; q < n_pes; ++q) {
                ok = ok && in_splits[q] >= 0;
                total += ok ? in_splits[q] : 0;
            }
            valid = ok && uint64_t(total) <= in_rows;
        }
        __syncthreads();
        for (int q = threadIdx.x; q < n_pes; q += blockDim.x) row[q] = valid ? uint64_t(in_splits[q]) : BAD_ROW;
        __threadfence_system();  // the row is in memory before NVSHMEM reads it
        __syncthreads();
        auto bytes = reinterpret_cast<uint8_t*>(row);
        for (int j = 0; j < g.size; ++j) put_signal(g, bytes, bytes, 0, j == g.me ? 0 : n_pes * 8, 0, epoch, j);
    }
    auto word = [&](int t) { return done_word(g, 0, t, 0); };  // block 0's words of step 0
    return block_wait(g, word, ticket(epoch, 0), WAIT_REMOTE_DATA, epoch);
}
// ANCHOR_END: rma_counts

// Every PE checks the same n x n matrix, so every PE refuses the same call and nobody waits
// for rows that never come. Block-collective; block 0 records what it found.
__device__ __forceinline__ bool counts_valid(const RmaWorkspace& g, uint64_t out_rows, uint64_t epoch) {
    __shared__ int ok;
    if (threadIdx.x == 0) {
        ok = 1;
        for (int q = 0; q < g.size && ok; ++q) {
            uint64_t total = 0;
            for (int p = 0; p < g.size && ok; ++p) {
                const uint64_t rows = counts_row(g, p)[q];
                if (rows == BAD_ROW) {
                    if (blockIdx.x == 0) record_failure(g, BAD_SPLITS, member_pe(g, p), 0, 0, epoch);
                    ok = 0;
                }
                total += rows;
            }
            if (ok && total > out_rows) {
                if (blockIdx.x == 0) record_failure(g, OUT_TOO_SMALL, member_pe(g, q), out_rows, total, epoch);
                ok = 0;
            }
        }
    }
    __syncthreads();
    return ok;
}

// ANCHOR: rma_all_to_all_v
// Flat all-to-all-v: member p sends in_splits[q] rows to member q, where they land after the
// rows of members 0..p-1, straight in q's output. Then out_splits_offsets = the rows from
// each member and where they start. input: symmetric [in_rows, row_bytes]; out: symmetric
// [out_rows, row_bytes]; in_splits: local int64 [size]; out_splits_offsets: local int64
// [2, size].
extern "C" __global__ void __launch_bounds__(RMA_THREADS)
    rma_all_to_all_v(const __grid_constant__ RmaWorkspace g, const uint8_t* input, uint8_t* out,
                     const int64_t* in_splits, int64_t* out_splits_offsets, uint64_t row_bytes, uint64_t in_rows,
                     uint64_t out_rows) {
    const uint64_t epoch = begin_call(g);
    if (block_wait_ready(g, epoch) && exchange_counts(g, epoch, in_splits, g.size, in_rows) &&
        counts_valid(g, out_rows, epoch)) {
        const uint64_t* mine = counts_row(g, g.me);
        for (int i = 1; i <= g.size; ++i) {
            const int q = (g.me + i) % g.size;
            uint64_t send_row = 0, recv_row = 0, begin, end;
            for (int c = 0; c < q; ++c) send_row += mine[c];
            for (int p = 0; p < g.me; ++p) recv_row += counts_row(g, p)[q];
            block_slice(mine[q] * row_bytes, &begin, &end);
            put_signal(g, out + recv_row * row_bytes, input + send_row * row_bytes, begin, end, 1, epoch, q);
        }
        if (block_wait_done(g, 1, epoch) && blockIdx.x == 0 && threadIdx.x == 0) {
            int64_t offset = 0;
            for (int p = 0; p < g.size; ++p) {
                out_splits_offsets[p] = int64_t(counts_row(g, p)[g.me]);
                out_splits_offsets[g.size + p] = offset;
                offset += out_splits_offsets[p];
            }
        }
    }
    finish_call(g, epoch);
}
// ANCHOR_END: rma_all_to_all_v

// ANCHOR: hier_a2av_send
// The hierarchical all-to-all-v's crossing, over the rail (member k = this PE's counterpart on
// node k): the rows for all `node_pes` PEs of node k leave in one put, into slot `me` of
// member k's scratch. The input is ordered by destination PE, so a node's rows are one
// contiguous range. A row of counts that is invalid, or a node's rows that would overflow the
// slot, send nothing: node_forward.cu sees every count and refuses the call on every PE.
// input: symmetric [in_rows, row_bytes]; in_splits: local int64 [n_pes].
extern "C" __global__ void __launch_bounds__(RMA_THREADS)
    hier_a2av_send(const __grid_constant__ RmaWorkspace g, const uint8_t* input, const int64_t* in_splits,
                   uint64_t row_bytes, uint64_t in_rows, int node_pes) {
    const uint64_t epoch = begin_call(g);
    const int n_pes = g.size * node_pes;
    if (block_wait_ready(g, epoch) && exchange_counts(g, epoch, in_splits, n_pes, in_rows)) {
        const uint64_t* mine = counts_row(g, g.me);
        const uint64_t slot_bytes = a2av_slot_bytes(g);
        for (int i = 1; i <= g.size; ++i) {
            const int k = (g.me + i) % g.size;
            uint64_t first_row = 0, rows = 0, begin, end;
            for (int q = 0; q < k * node_pes; ++q) first_row += mine[q];
            for (int q = k * node_pes; q < (k + 1) * node_pes; ++q) rows += mine[q];
            const bool fits = mine[0] != BAD_ROW && rows * row_bytes <= slot_bytes;
            block_slice(fits ? rows * row_bytes : 0, &begin, &end);
            put_signal(g, g.scratch + g.me * slot_bytes, input + first_row * row_bytes, begin, end, 1, epoch, k);
        }
        block_wait_done(g, 1, epoch);
    }
    finish_call(g, epoch);
}
// ANCHOR_END: hier_a2av_send
