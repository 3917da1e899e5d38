// Chapter 4: broadcast. PE `root`'s `num_bytes` of input end up in every PE's `out`.
#include "coll_common.cuh"

using namespace coll;

// ANCHOR: broadcast_ll
// Small messages: the root writes LL lines into every peer's slot `root`; the others poll
// their slot and unpack it. Nobody but the root sends, and nobody waits for the root to be
// ready beyond the slot-reuse check.
// input: local [num_bytes] (read on the root only); out: local [num_bytes].
extern "C" __global__ void __launch_bounds__(512) coll_broadcast_ll(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t num_bytes,
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
            uint4* slot = peer(ws, ll_slot(ws, epoch, root), q);
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
// (n - 1) x num_bytes over its own links; this way no PE sends much more than num_bytes.
// Block b moves the same slice of every part, so it waits only for block b of the root.
// In place (out == input on the root) skips the root's local copy.
// input: local [num_bytes] (read on the root only); out: symmetric [num_bytes].
extern "C" __global__ void __launch_bounds__(512) coll_broadcast_scatter(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
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
    uint8_t* dsts[MAX_PES];
    if (block_wait_ready(ws, epoch)) {
        if (me == root) {
            const bool local_copy = out != input;
            // Our own part to everybody, then part q to PE q (and to our own out).
            int num = 0;
            for (int i = 1; i < n; ++i) dsts[num++] = peer(ws, out, (me + i) % n);
            if (local_copy) dsts[num++] = out;
            slice(root, &begin, &end);
            copy_to_many(dsts, num, input, begin, end, threadIdx.x, blockDim.x);
            for (int i = 1; i < n; ++i) {
                const int q = (me + i) % n;
                dsts[0] = peer(ws, out, q);
                dsts[1] = out;
                slice(q, &begin, &end);
                copy_to_many(dsts, local_copy ? 2 : 1, input, begin, end, threadIdx.x, blockDim.x);
                block_signal_done(ws, q, ticket(epoch, 1));
            }
        } else {
            const uint64_t* from_root = ws.done + root * MAX_BLOCKS + blockIdx.x;
            if (block_wait_at_least(ws, from_root, ticket(epoch, 1), WAIT_DONE, root, epoch)) {
                int num = 0;
                for (int i = 1; i < n; ++i) {
                    const int q = (me + i) % n;
                    if (q != root) dsts[num++] = peer(ws, out, q);
                }
                slice(me, &begin, &end);
                copy_to_many(dsts, num, out, begin, end, threadIdx.x, blockDim.x);
                block_signal_done_all(ws, ticket(epoch, 2), root);
                block_wait_done_all(ws, ticket(epoch, 2), epoch, root);
            }
        }
    }
    end_call(ws, epoch);
}
// ANCHOR_END: broadcast_scatter
