// Chapter 4: all-to-all. Equal splits: block q of every PE's input goes to PE q, landing at
// out[p * num_bytes] for sender p (LL or direct, as all-gather). Variable splits whose counts
// live only on the device: all_to_all_v, the MoE primitive.
#include "coll_exchange.cuh"

using namespace coll;

// input: local [n_pes * num_bytes]; out: local [n_pes * num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_to_all_ll(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t num_bytes) {
    const uint64_t epoch = begin_call(ws);
    exchange_ll(ws, epoch, input, num_bytes, out, num_bytes);
    end_call(ws, epoch);
}

// input: local [n_pes * num_bytes]; out: symmetric [n_pes * num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_to_all_direct(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes) {
    const uint64_t epoch = begin_call(ws);
    exchange_direct(ws, epoch, input, num_bytes, out, num_bytes);
    end_call(ws, epoch);
}

constexpr uint64_t BAD_ROW = 0xFFFFFFFFull;  // a count row whose sender found its splits invalid

// ANCHOR: all_to_all_v
// all_to_all_v: PE p sends in_splits[q] rows to PE q; nobody knows the counts on the host.
//  1. Each PE writes its row of counts into every PE's count matrix (flagged with the epoch,
//     like an LL line, so the reader polls the values themselves).
//  2. Every block reads the whole n x n matrix. Receiving PE q's row also proves q has
//     entered this call, so its `out` is free: no separate ready wait.
//  3. Rows go straight into the receivers' symmetric `out`: PE p's rows for q land after the
//     rows of PEs 0..p-1 for q. Then tickets, as in exchange_direct.
// Every PE validates the same matrix, so a bad split or an overflow is seen by all of them
// and nobody waits for data that will never come.
// input: local [in_rows, row_bytes]; out: symmetric [out_rows, row_bytes];
// in_splits: local int64 [n_pes]; out_splits_offsets: local int64 [2, n_pes] (written:
// rows received from each PE, and where they start in out).
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_to_all_v(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, const int64_t* in_splits,
                                             int64_t* out_splits_offsets, uint64_t row_bytes, uint64_t in_rows,
                                             uint64_t out_rows) {
    // ANCHOR: a2av_counts
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    const uint32_t flag = static_cast<uint32_t>(epoch);
    uint64_t* rows_for = ws.counts + (epoch & 1) * MAX_PES * MAX_PES;  // [sender][receiver]
    __shared__ uint64_t matrix[MAX_PES][MAX_PES];

    if (blockIdx.x == 0 && threadIdx.x < n) {
        const int q = threadIdx.x;
        int64_t total = 0;
        bool valid = true;
        for (int c = 0; c < n; ++c) {
            valid = valid && in_splits[c] >= 0 && in_splits[c] < int64_t(BAD_ROW);
            total += valid ? in_splits[c] : 0;
        }
        valid = valid && uint64_t(total) <= in_rows;
        if (q == me || wait_slot_free(ws, q, epoch)) {
            uint64_t* row = (q == me ? rows_for : peer(ws, rows_for, q)) + me * MAX_PES;
            for (int c = 0; c < n; ++c) {
                const uint64_t rows = valid ? uint64_t(in_splits[c]) : BAD_ROW;
                st_relaxed_sys(row + c, (uint64_t(flag) << 32) | rows);
            }
        }
    }
    bool came = true;  // this thread's word of the matrix arrived
    if (threadIdx.x < n * n) {
        const int sender = threadIdx.x / n, receiver = threadIdx.x % n;
        const uint64_t* word = rows_for + sender * MAX_PES + receiver;
        uint64_t value = ld_volatile(word);
        const long long start = clock64();
        while ((value >> 32) != flag) {
            if (failed(ws) || clock64() - start > ws.timeout_cycles) {
                record_failure(ws, WAIT_COUNTS, sender, flag, value >> 32, epoch);  // no-op if already failed
                came = false;
                break;
            }
            value = ld_volatile(word);
        }
        matrix[sender][receiver] = value & BAD_ROW;
    }
    // The barrier publishes the matrix, and its AND tells every thread whether all of it came.
    // No flag in shared memory: thread 0 would write it while the others still read it.
    bool ok = __syncthreads_and(came);
    // ANCHOR_END: a2av_counts
    bool valid = true;  // thread 0: no bad row, and no receiver gets more than out_rows
    if (threadIdx.x == 0 && ok) {
        for (int p = 0; p < n && valid; ++p) {
            uint64_t received = 0;
            for (int i = 0; i < n; ++i) {
                if (matrix[p][i] == BAD_ROW) {
                    if (blockIdx.x == 0) record_failure(ws, BAD_SPLITS, p, in_rows, 0, epoch);
                    valid = false;
                }
                received += matrix[i][p];
            }
            if (valid && received > out_rows) {
                if (blockIdx.x == 0) record_failure(ws, OUT_TOO_SMALL, p, out_rows, received, epoch);
                valid = false;
            }
        }
    }
    ok = __syncthreads_and(ok && valid);
    // ANCHOR: a2av_rows
    if (ok) {
        for (int i = 1; i <= n; ++i) {
            const int q = (me + i) % n;  // PE me + 1 first (the PEs spread their traffic), ourselves last
            uint64_t send_offset = 0;    // rows of my input before block q
            for (int c = 0; c < q; ++c) send_offset += matrix[me][c];
            uint64_t recv_offset = 0;  // rows of PEs 0..me-1 before mine in q's out
            for (int p = 0; p < me; ++p) recv_offset += matrix[p][q];
            const uint64_t num_bytes = matrix[me][q] * row_bytes;
            uint8_t* dst = (q == me ? out : peer(ws, out, q)) + recv_offset * row_bytes;
            for_each_piece(num_bytes, [&](uint64_t begin, uint64_t end) {
                copy_bytes(dst, input + send_offset * row_bytes, begin, end, threadIdx.x, blockDim.x);
            });
        }
        block_signal_done_all(ws, ticket(epoch, 1));
        block_wait_done_all(ws, ticket(epoch, 1), epoch);
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            int64_t offset = 0;
            for (int p = 0; p < n; ++p) {
                out_splits_offsets[p] = int64_t(matrix[p][me]);
                out_splits_offsets[n + p] = offset;
                offset += int64_t(matrix[p][me]);
            }
        }
    }
    // ANCHOR_END: a2av_rows
    end_call(ws, epoch);
}
// ANCHOR_END: all_to_all_v
