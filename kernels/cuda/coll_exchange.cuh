// Chapter 4: the two ways every PE sends a block of bytes to every PE, shared by all-gather
// (everyone sends the same block) and all-to-all (block q goes to PE q). In both, the block
// PE p sends lands at out[p * num_bytes] on the receiver.
#pragma once

#include "coll_common.cuh"

namespace coll {

// The block for PE q: all-gather passes src_stride = 0, all-to-all src_stride = num_bytes.
__device__ __forceinline__ const uint8_t* block_for(const uint8_t* input, uint64_t src_stride, int q) {
    return input + q * src_stride;
}

// ANCHOR: exchange_ll
// Small messages: LL lines into every peer's scratch slot, then unpack what the peers sent.
// input: local [..] (block q at input + q * src_stride); out: local [n_pes * num_bytes].
// Every thread of the grid takes lines t, t + T, ...: the lines it sends are the lines it
// later waits for, so a thread's wait overlaps the other threads' sends.
__device__ __forceinline__ void exchange_ll(const Workspace& ws, uint64_t epoch, const uint8_t* input,
                                            uint64_t src_stride, uint8_t* out, uint64_t num_bytes) {
    const uint32_t flag = static_cast<uint32_t>(epoch);
    const uint64_t num_lines = (num_bytes + 7) / 8;
    const uint64_t thread = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t num_threads = uint64_t(gridDim.x) * blockDim.x;
    const int me = ws.my_pe, n = ws.n_pes;
    for (int i = 1; i < n; ++i) {
        const int q = (me + i) % n;  // PE me + 1 first: the PEs spread their traffic over peers
        if (!wait_slot_free(ws, q, epoch)) return;
        uint4* slot = peer(ws, ll_slot(ws, epoch, me), q);
        const uint8_t* block = block_for(input, src_stride, q);
        for (uint64_t w = thread; w < num_lines; w += num_threads) ll_store(slot + w, load_word(block, w, num_bytes), flag);
    }
    copy_bytes(out + me * num_bytes, block_for(input, src_stride, me), 0, num_bytes, thread, num_threads);
    for (int i = 1; i < n; ++i) {
        const int p = (me + n - i) % n;  // PE me - 1 first: it wrote to us first
        const uint4* slot = ll_slot(ws, epoch, p);
        for (uint64_t w = thread; w < num_lines; w += num_threads) {
            uint64_t payload;
            if (!ll_load(ws, slot + w, flag, p, epoch, &payload)) return;
            store_word(out + p * num_bytes, w, num_bytes, payload);
        }
    }
}
// ANCHOR_END: exchange_ll

// ANCHOR: exchange_direct
// Large messages: wait until every peer has entered this call (its `out` is free), store
// straight into its symmetric `out`, then raise a ticket per block and wait for everyone
// else's. input: local (block q at input + q * src_stride); out: symmetric [n_pes * num_bytes].
__device__ __forceinline__ void exchange_direct(const Workspace& ws, uint64_t epoch, const uint8_t* input,
                                                uint64_t src_stride, uint8_t* out, uint64_t num_bytes) {
    if (!block_wait_ready(ws, epoch)) return;
    const int me = ws.my_pe, n = ws.n_pes;
    uint8_t* dsts[MAX_PES];
    const uint8_t* srcs[MAX_PES];
#pragma unroll
    for (int i = 0; i < MAX_PES; ++i) {  // unrolled, so the pointers stay in registers
        const int q = (me + 1 + i) % n;  // the local copy last: it is the fastest
        if (i < n) {
            dsts[i] = (q == me ? out : peer(ws, out, q)) + me * num_bytes;
            srcs[i] = block_for(input, src_stride, q);
        }
    }
    for_each_piece(num_bytes, [&](uint64_t begin, uint64_t end) {
        if (src_stride == 0) {
            copy_to_many(dsts, n, input, begin, end, threadIdx.x, blockDim.x);  // all-gather: one source
        } else {
            copy_fanout(dsts, srcs, n, begin, end, threadIdx.x, blockDim.x);
        }
    });
    block_signal_done_all(ws, ticket(epoch, 1));
    block_wait_done_all(ws, ticket(epoch, 1), epoch);
}
// ANCHOR_END: exchange_direct

}  // namespace coll
