// Chapter 4: broadcast. PE `root`'s `num_bytes` of input end up in every PE's `out`.
#include "coll_common.cuh"

using namespace coll;

// ANCHOR: broadcast_ll
// Small messages: the root writes LL lines into every peer's slot `root`; the others poll
// their slot and unpack it. Nobody but the root sends, and nobody waits for the root to be
// ready beyond the slot-reuse check.
// input: local [num_bytes] (read on the root only); out: local [num_bytes].
extern "C" __global__ void coll_broadcast_ll(Workspace ws, const uint8_t* input, uint8_t* out, uint64_t num_bytes,
                                             int root) {
    const uint64_t epoch = begin_call(ws);
    const uint32_t flag = static_cast<uint32_t>(epoch);
    const uint64_t num_lines = (num_bytes + 7) / 8;
    const uint64_t thread = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t num_threads = uint64_t(gridDim.x) * blockDim.x;
    const int me = ws.my_pe, n = ws.n_pes;
    if (me == root) {
        for (int i = 1; i < n; ++i) {
            const int q = (me + i) % n;
            if (!wait_slot_free(ws, q, epoch)) break;
            uint4* slot = peer(ll_slot(ws, epoch, root), q);
            for (uint64_t w = thread; w < num_lines; w += num_threads) ll_store(slot + w, load_word(input, w, num_bytes), flag);
        }
        copy_bytes(out, input, 0, num_bytes, thread, num_threads);
    } else {
        const uint4* slot = ll_slot(ws, epoch, root);
        for (uint64_t w = thread; w < num_lines; w += num_threads) {
            uint64_t payload;
            if (!ll_load(ws, slot + w, flag, root, epoch, &payload)) break;
            store_word(out, w, num_bytes, payload);
        }
    }
    end_call(ws, epoch);
}
// ANCHOR_END: broadcast_ll

// ANCHOR: broadcast_scatter
// Large messages: scatter, then all-gather. The message is cut into n parts; the root stores
// part q into PE q, and its own part into everybody; then every PE q forwards part q to the
// PEs other than the root. Storing everything into everybody would make the root send
// (n - 1) x num_bytes over its own links; this way no PE sends more than about num_bytes.
// Block b moves the same slice of every part, so it waits only for block b of the root.
// input: local [num_bytes] (read on the root only); out: symmetric [num_bytes].
extern "C" __global__ void coll_broadcast_scatter(Workspace ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes, int root) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    // This block's slice [begin, end) of part `part`.
    auto slice = [&](int part, uint64_t* begin, uint64_t* end) {
        uint64_t part_begin, part_end;
        part_bounds(num_bytes, n, part, &part_begin, &part_end);
        part_bounds(part_end - part_begin, gridDim.x, blockIdx.x, begin, end);
        *begin += part_begin;
        *end += part_begin;
    };
    uint64_t begin, end;
    if (!block_wait_ready(ws, epoch)) {
        end_call(ws, epoch);
        return;
    }
    if (me == root) {
        for (int part = 0; part < n; ++part) {
            slice(part, &begin, &end);
            copy_bytes(out, input, begin, end, threadIdx.x, blockDim.x);
        }
        for (int i = 1; i < n; ++i) {
            const int q = (me + i) % n;
            uint8_t* dst = peer(out, q);
            slice(q, &begin, &end);
            copy_bytes(dst, input, begin, end, threadIdx.x, blockDim.x);
            slice(root, &begin, &end);
            copy_bytes(dst, input, begin, end, threadIdx.x, blockDim.x);
            block_signal_done(ws, q, ticket(epoch, 1));
        }
    } else {
        const uint64_t* from_root = ws.done + root * MAX_BLOCKS + blockIdx.x;
        if (block_wait_at_least(ws, from_root, ticket(epoch, 1), WAIT_DONE, root, epoch)) {
            slice(me, &begin, &end);
            for (int i = 1; i < n; ++i) {
                const int q = (me + i) % n;
                if (q != root) copy_bytes(peer(out, q), out, begin, end, threadIdx.x, blockDim.x);
            }
            block_signal_done_all(ws, ticket(epoch, 2), root);
            block_wait_done_all(ws, ticket(epoch, 2), epoch, root);
        }
    }
    end_call(ws, epoch);
}
// ANCHOR_END: broadcast_scatter
