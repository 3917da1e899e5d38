// Chapter 4: broadcast. PE `root`'s `num_bytes` of input end up in every PE's `out`.
#include "coll_common.cuh"

using namespace coll;

// ANCHOR: broadcast_ll
// Small messages: the root writes LL lines into every peer's slot `root`; the others poll
// their slot and unpack it. Nobody but the root sends, and nobody waits for the root to be
// ready beyond the slot-reuse check.
// input: local [num_bytes] (read on the root only); out: local [num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_broadcast_ll(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t num_bytes,
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
// Large messages: scatter, then all-gather, pipelined. The message is cut into n - 1 parts, one
// per PE other than the root (its forwarders): part f goes from the root to forwarder f only,
// so the root sends the message once, and forwarder f passes part f on to the other
// forwarders as the root's data arrives.
//
// Each part is dealt to the blocks in pieces, round-robin (for_each_piece's cut): in round r
// block b moves piece r x G + b (G blocks) of every part. The root's block b starts each
// round at part b mod (n - 1), so that every forwarder has data from the first round on.
//
// Rounds are grouped into at most MAX_STEPS steps. After each step the root's block b raises
// its done word on every forwarder to the step's number (block_signal_done_all: a barrier and
// a release); forwarder f's block b waits for each step and forwards that step's pieces of
// part f. The forwarding trails the root by one step, so with forwarders the pieces are cut
// small enough for up to TARGET_STEPS rounds, but not below MIN_PIECE_BYTES: each step stops
// the root's block at a barrier and its signalling warp at a release, and pieces of a few
// KiB leave most of a block's threads without a full round of loads (at N = 4, with a fence
// in every thread per step, 4-5 KiB pieces in 32 steps made 64 MiB a third slower). At the
// end the forwarders tell each other they are done (FINAL_STEP), since each one's output is
// complete only when every other forwarder's part has arrived. At n = 2 there is nothing to
// forward, and one step (one signal per block) is all the one forwarder needs.
// In place (out == input on the root) skips the root's local copy.
// input: local [num_bytes] (read on the root only); out: symmetric [num_bytes].
constexpr uint64_t MAX_STEPS = STEPS_PER_EPOCH - 2;  // steps 1 .. MAX_STEPS of the root's done word
constexpr uint64_t FINAL_STEP = STEPS_PER_EPOCH - 1;
// Overridable at build time (NVCC_FLAGS=-DBROADCAST_TARGET_STEPS=32 ...) for the sweeps in
// benchmarks/notes/collectives.md.
#ifndef BROADCAST_TARGET_STEPS
#define BROADCAST_TARGET_STEPS 16
#endif
#ifndef BROADCAST_MIN_PIECE_BYTES
#define BROADCAST_MIN_PIECE_BYTES (32 << 10)  // one round of 4 vectors per thread of a 512-thread block
#endif
#ifndef BROADCAST_MAX_BLOCKS
#define BROADCAST_MAX_BLOCKS MAX_BLOCKS  // blocks that move data when there are forwarders
#endif
constexpr uint64_t TARGET_STEPS = BROADCAST_TARGET_STEPS;
constexpr uint64_t MIN_PIECE_BYTES = BROADCAST_MIN_PIECE_BYTES;
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_broadcast_scatter(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes, int root) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes, forwarders = n - 1;
    const bool local_copy = out != input;
    if (forwarders == 0) {
        if (local_copy) copy_bytes(out, input, 0, num_bytes, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x, uint64_t(gridDim.x) * blockDim.x);
        end_call(ws, epoch);
        return;
    }
    // Part 0 is the longest: its size sets the piece and the number of rounds for every part.
    uint64_t longest_begin, longest_end;
    part_bounds(num_bytes, forwarders, 0, &longest_begin, &longest_end);
    const uint64_t longest = longest_end - longest_begin;
    const uint64_t grid = forwarders > 1 ? min(uint64_t(gridDim.x), uint64_t(BROADCAST_MAX_BLOCKS)) : gridDim.x;
    if (blockIdx.x >= grid) {  // same grid on every PE: the idle blocks are idle everywhere
        end_call(ws, epoch);
        return;
    }
    const uint64_t pipelined = max(MIN_PIECE_BYTES, (longest + 16 * grid * TARGET_STEPS - 1) / (16 * grid * TARGET_STEPS) * 16);
    const uint64_t piece = forwarders > 1 ? min(piece_bytes(longest, grid), pipelined) : piece_bytes(longest, grid);
    const uint64_t rounds = (longest + grid * piece - 1) / (grid * piece);
    const uint64_t steps = forwarders > 1 ? min(MAX_STEPS, rounds) : 1;
    // ANCHOR: broadcast_pieces
    // This block's bytes of part f in round r (empty past the part's end).
    auto piece_in_round = [&](int f, uint64_t r, uint64_t* begin, uint64_t* end) {
        uint64_t part_begin, part_end;
        part_bounds(num_bytes, forwarders, f, &part_begin, &part_end);
        *begin = min(part_end, part_begin + (r * grid + blockIdx.x) * piece);
        *end = min(part_end, *begin + piece);
    };
    auto first_round = [&](uint64_t step) { return step * rounds / steps; };
    auto pe_of = [&](int f) { return (root + 1 + f) % n; };
    // ANCHOR_END: broadcast_pieces
    uint64_t begin, end;
    uint8_t* dsts[MAX_PES];
    // ANCHOR: broadcast_steps
    if (block_wait_ready(ws, epoch)) {
        if (me == root) {
            for (uint64_t step = 0; step < steps; ++step) {
                for (uint64_t r = first_round(step); r < first_round(step + 1); ++r) {
                    for (int i = 0; i < forwarders; ++i) {
                        const int f = static_cast<int>((blockIdx.x + i) % forwarders);
                        dsts[0] = peer(ws, out, pe_of(f));
                        dsts[1] = out;
                        piece_in_round(f, r, &begin, &end);
                        copy_to_many(dsts, local_copy ? 2 : 1, input, begin, end, threadIdx.x, blockDim.x);
                    }
                }
                block_signal_done_all(ws, ticket(epoch, 1 + step));  // one signal per step
            }
        } else {
            const int f = (me - root - 1 + n) % n;
            int num = 0;
            for (int i = 1; i < forwarders; ++i) dsts[num++] = peer(ws, out, pe_of((f + i) % forwarders));
            const uint64_t* from_root = ws.done + root * MAX_BLOCKS + blockIdx.x;
            bool arrived = true;
            for (uint64_t step = 0; step < steps && arrived; ++step) {
                arrived = block_wait_at_least(ws, from_root, ticket(epoch, 1 + step), WAIT_DONE, root, epoch);
                for (uint64_t r = first_round(step); arrived && num > 0 && r < first_round(step + 1); ++r) {
                    piece_in_round(f, r, &begin, &end);
                    copy_to_many(dsts, num, out, begin, end, threadIdx.x, blockDim.x);
                }
            }
            if (arrived && num > 0) {
                block_signal_done_all(ws, ticket(epoch, FINAL_STEP), root);
                block_wait_done_all(ws, ticket(epoch, FINAL_STEP), epoch, root);
            }
        }
    }
    // ANCHOR_END: broadcast_steps
    end_call(ws, epoch);
}
// ANCHOR_END: broadcast_scatter
