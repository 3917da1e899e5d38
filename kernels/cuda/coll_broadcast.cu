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
// The pipeline's UNIT is the group of threads that owns a stream of pieces and signals its own
// done word: a whole block (coll_broadcast_scatter, unit = block) or a few warps of one
// (coll_broadcast_scatter_units: 4-warp units, 4 per block). Each part is dealt to the units
// in pieces, round-robin (for_each_piece's cut): in round r unit u moves piece r x U + u (U
// units) of every part. The root's unit u starts each round at part u mod (n - 1), so that
// every forwarder has data from the first round on.
//
// Rounds are grouped into at most MAX_STEPS steps. After each step the root's unit u raises
// its done word on every forwarder to the step's number (a barrier of the unit and one
// release per forwarder); forwarder f's unit u waits for that word alone and forwards that
// step's pieces of part f. The forwarding trails the root by one step, so with forwarders the
// pieces are cut small enough for up to TARGET_STEPS rounds, but not below MIN_PIECE_BYTES:
// each step stops the root's unit at a barrier and its signalling threads at a release, and
// pieces of a few KiB leave most of a unit's threads without a full round of loads (at N = 4,
// with a fence in every thread per step, 4-5 KiB pieces in 32 steps made 64 MiB a third
// slower). A smaller unit waits for its own word only, so a unit's wait hides behind the other
// units of its SM instead of stopping the block. At the end the forwarders tell each other
// they are done (FINAL_STEP, block-wide, once per call), since each one's output is complete
// only when every other forwarder's part has arrived. At n = 2 there is nothing to forward,
// and one step (one signal per unit) is all the one forwarder needs.
// In place (out == input on the root) skips the root's local copy.
// input: local [num_bytes] (read on the root only); out: symmetric [num_bytes].
constexpr uint64_t MAX_STEPS = STEPS_PER_EPOCH - 2;  // steps 1 .. MAX_STEPS of the root's done word
constexpr uint64_t FINAL_STEP = STEPS_PER_EPOCH - 1;
// Overridable at build time (NVCC_FLAGS=-DBROADCAST_TARGET_STEPS=32 ...) for the sweeps in
// benchmarks/notes/collectives.md. The block unit's:
#ifndef BROADCAST_TARGET_STEPS
#define BROADCAST_TARGET_STEPS 16
#endif
#ifndef BROADCAST_MIN_PIECE_BYTES
#define BROADCAST_MIN_PIECE_BYTES (32 << 10)  // one round of 4 vectors per thread of a 512-thread block
#endif
#ifndef BROADCAST_MAX_BLOCKS
#define BROADCAST_MAX_BLOCKS MAX_BLOCKS  // blocks that move data when there are forwarders
#endif
// coll_broadcast_scatter_units' (its grid is the host's: 64 blocks, algorithm.rs):
#ifndef BROADCAST_UNIT_WARPS
#define BROADCAST_UNIT_WARPS 4  // 1, 2, 4 or 8
#endif
#ifndef BROADCAST_UNIT_TARGET_STEPS
#define BROADCAST_UNIT_TARGET_STEPS 16
#endif
#ifndef BROADCAST_UNIT_MIN_PIECE_BYTES
#define BROADCAST_UNIT_MIN_PIECE_BYTES 0  // rounded up to whole rounds of the unit's loop, at least one
#endif
constexpr uint64_t TARGET_STEPS = BROADCAST_TARGET_STEPS;
constexpr uint64_t MIN_PIECE_BYTES = BROADCAST_MIN_PIECE_BYTES;

// ANCHOR: broadcast_unit
// The unit of kWarps warps this thread belongs to: its place in the grid, its barrier, its
// signal and its wait. kWarps = COLL_THREADS / WARP_SIZE is the block, which uses the block
// primitives of coll_common.cuh unchanged (barrier 0). A smaller unit synchronises on a warp
// barrier (one warp) or on named barrier 1 + its index in the block: barrier 0 stays the
// block's (block_wait_ready, the final exchange), and no other chapter 4 kernel uses a named
// barrier, so ids 1 .. 15 are this kernel's.
template <int kWarps>
struct Unit {
    static constexpr int THREADS = kWarps * WARP_SIZE;
    static constexpr int PER_BLOCK = COLL_THREADS / THREADS;
    static constexpr bool IS_BLOCK = PER_BLOCK == 1;
    static_assert(COLL_THREADS % THREADS == 0, "a block holds whole units");
    static_assert(IS_BLOCK || kWarps == 1 || PER_BLOCK <= 15, "named barriers 1 .. 15, one per unit");
    static_assert(MAX_PES <= THREADS, "one signalling thread per PE");
    static_assert(MAX_BLOCKS % PER_BLOCK == 0, "the root's row of done words holds one word per unit");
    // The pieces: the block's as they were measured (16-byte multiples, at least
    // MIN_PIECE_BYTES, at most an equal share of the part); a smaller unit's are whole rounds
    // of copy_to_many's loop (4 vectors per thread), at least one, at most MAX_PIECE_BYTES.
    static constexpr uint64_t ROUND_BYTES = uint64_t(THREADS) * 16 * 4;
    static constexpr uint64_t GRANULE = IS_BLOCK ? 16 : ROUND_BYTES;
    static constexpr uint64_t UNIT_MIN = (uint64_t(BROADCAST_UNIT_MIN_PIECE_BYTES) + ROUND_BYTES - 1) / ROUND_BYTES * ROUND_BYTES;
    static constexpr uint64_t MIN_PIECE = IS_BLOCK ? MIN_PIECE_BYTES : (UNIT_MIN > ROUND_BYTES ? UNIT_MIN : ROUND_BYTES);
    static constexpr uint64_t MAX_PIECE = MIN_PIECE > MAX_PIECE_BYTES ? MIN_PIECE : MAX_PIECE_BYTES;
    static constexpr uint64_t TARGET = IS_BLOCK ? TARGET_STEPS : BROADCAST_UNIT_TARGET_STEPS;

    // This thread's unit: its index in the block, this thread's index in it, and its index in
    // the grid (the root's done word it raises, its share of the rounds).
    __device__ __forceinline__ static unsigned index() { return IS_BLOCK ? 0 : threadIdx.x / THREADS; }
    __device__ __forceinline__ static unsigned thread() { return IS_BLOCK ? threadIdx.x : threadIdx.x % THREADS; }
    __device__ __forceinline__ static unsigned id() { return IS_BLOCK ? blockIdx.x : blockIdx.x * PER_BLOCK + threadIdx.x / THREADS; }
    __device__ __forceinline__ static unsigned threads() { return IS_BLOCK ? blockDim.x : THREADS; }

    // Blocks that move data (the same grid on every PE: idle blocks are idle everywhere).
    __device__ __forceinline__ static uint64_t blocks(int forwarders) {
        if constexpr (IS_BLOCK) {
            return forwarders > 1 ? min(uint64_t(gridDim.x), uint64_t(BROADCAST_MAX_BLOCKS)) : gridDim.x;
        } else {
            return min(uint64_t(gridDim.x), uint64_t(MAX_BLOCKS / PER_BLOCK));
        }
    }

    // The largest piece with forwarders: the block's an equal share of the part (so a short
    // part still spreads over every block), a smaller unit's MAX_PIECE.
    __device__ __forceinline__ static uint64_t largest_piece(uint64_t longest, uint64_t units) {
        return IS_BLOCK ? piece_bytes(longest, units) : MAX_PIECE;
    }

    // Every thread of the unit at one barrier (memory ordered among them, as __syncthreads is).
    __device__ __forceinline__ static void sync() {
        if constexpr (IS_BLOCK) {
            __syncthreads();
        } else if constexpr (kWarps == 1) {
            __syncwarp();
        } else {
            named_barrier_sync(1 + index(), THREADS);
        }
    }

    // block_signal_done_all with the unit for the block: after the unit's stores, raise
    // done[my_pe][id] on every peer to `value` (a barrier, then one release per peer: the
    // release is cumulative, the barrier puts every thread's stores before it).
    __device__ __forceinline__ static void signal_done_all(const Workspace& ws, uint64_t value) {
        if constexpr (IS_BLOCK) {
            block_signal_done_all(ws, value);
        } else {
            sync();
            const int pe = static_cast<int>(thread());
            if (pe < ws.n_pes && pe != ws.my_pe) st_release_sys(peer(ws, ws.done + ws.my_pe * MAX_BLOCKS + id(), pe), value);
        }
    }

    // block_wait_at_least with the unit for the block (WAIT_DONE): the unit's thread 0 waits
    // (acquire), and every thread learns the outcome after a barrier of the unit, so the
    // acquire comes before every thread's loads.
    __device__ __forceinline__ static bool wait_at_least(const Workspace& ws, const uint64_t* flag, uint64_t target, int pe, uint64_t epoch) {
        if constexpr (IS_BLOCK) {
            return block_wait_at_least(ws, flag, target, WAIT_DONE, pe, epoch);
        } else {
            int arrived = 1;
            if (thread() == 0) arrived = coll::wait_at_least(ws, flag, target, WAIT_DONE, pe, epoch);
            if constexpr (kWarps == 1) {
                arrived = __shfl_sync(ALL_LANES, arrived, 0);
                __syncwarp();
                return arrived;
            } else {
                unsigned all;
                asm volatile(
                    "{\n\t.reg .pred p, q;\n\tsetp.ne.s32 p, %1, 0;\n\tbar.red.and.pred q, %2, %3, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
                    : "=r"(all)
                    : "r"(arrived), "r"(1 + index()), "r"(THREADS)
                    : "memory");
                return all != 0;
            }
        }
    }

    // Whether every unit of the block got `arrived` (the block's is the block's already).
    __device__ __forceinline__ static bool all_of_block(bool arrived) {
        if constexpr (IS_BLOCK) {
            return arrived;
        } else {
            return __syncthreads_and(arrived) != 0;
        }
    }
};
// ANCHOR_END: broadcast_unit

template <int kWarps>
__device__ __forceinline__ void broadcast_scatter(const Workspace& ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes, int root) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes, forwarders = n - 1;
    const bool local_copy = out != input;
    if (forwarders == 0) {
        if (local_copy) copy_bytes(out, input, 0, num_bytes, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x, uint64_t(gridDim.x) * blockDim.x);
        end_call(ws, epoch);
        return;
    }
    using U = Unit<kWarps>;
    // Part 0 is the longest: its size sets the piece and the number of rounds for every part.
    uint64_t longest_begin, longest_end;
    part_bounds(num_bytes, forwarders, 0, &longest_begin, &longest_end);
    const uint64_t longest = longest_end - longest_begin;
    const uint64_t grid = U::blocks(forwarders);
    if (blockIdx.x >= grid) {  // same grid on every PE: the idle blocks are idle everywhere
        end_call(ws, epoch);
        return;
    }
    const uint64_t units = grid * U::PER_BLOCK;
    const uint64_t pipelined = max(U::MIN_PIECE, (longest + U::GRANULE * units * U::TARGET - 1) / (U::GRANULE * units * U::TARGET) * U::GRANULE);
    const uint64_t piece = forwarders > 1 ? min(U::largest_piece(longest, units), pipelined) : piece_bytes(longest, units);
    const uint64_t rounds = (longest + units * piece - 1) / (units * piece);
    const uint64_t steps = forwarders > 1 ? min(MAX_STEPS, rounds) : 1;
    // ANCHOR: broadcast_pieces
    // This unit's bytes of part f in round r (empty past the part's end).
    auto piece_in_round = [&](int f, uint64_t r, uint64_t* begin, uint64_t* end) {
        uint64_t part_begin, part_end;
        part_bounds(num_bytes, forwarders, f, &part_begin, &part_end);
        *begin = min(part_end, part_begin + (r * units + U::id()) * piece);
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
                        const int f = static_cast<int>((U::id() + i) % forwarders);
                        dsts[0] = peer(ws, out, pe_of(f));
                        dsts[1] = out;
                        piece_in_round(f, r, &begin, &end);
                        copy_to_many(dsts, local_copy ? 2 : 1, input, begin, end, U::thread(), U::threads());
                    }
                }
                U::signal_done_all(ws, ticket(epoch, 1 + step));  // one signal per step
            }
        } else {
            const int f = (me - root - 1 + n) % n;
            int num = 0;
            for (int i = 1; i < forwarders; ++i) dsts[num++] = peer(ws, out, pe_of((f + i) % forwarders));
            const uint64_t* from_root = ws.done + root * MAX_BLOCKS + U::id();
            bool arrived = true;
            for (uint64_t step = 0; step < steps && arrived; ++step) {
                arrived = U::wait_at_least(ws, from_root, ticket(epoch, 1 + step), root, epoch);
                for (uint64_t r = first_round(step); arrived && num > 0 && r < first_round(step + 1); ++r) {
                    piece_in_round(f, r, &begin, &end);
                    copy_to_many(dsts, num, out, begin, end, U::thread(), U::threads());
                }
            }
            if (U::all_of_block(arrived) && num > 0) {  // every unit of the block past its last step
                block_signal_done_all(ws, ticket(epoch, FINAL_STEP), root);
                block_wait_done_all(ws, ticket(epoch, FINAL_STEP), epoch, root);
            }
        }
    }
    // ANCHOR_END: broadcast_steps
    end_call(ws, epoch);
}

// The block pipeline: every size at n = 2, and below 4 MiB at n > 2 (algorithm.rs).
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_broadcast_scatter(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes, int root) {
    broadcast_scatter<COLL_THREADS / WARP_SIZE>(ws, input, out, num_bytes, root);
}

// The same pipeline in units of BROADCAST_UNIT_WARPS warps: from 4 MiB at n > 2, on 64 blocks
// (4 units each: 256 units, one done word each in the root's row).
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_broadcast_scatter_units(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                        uint64_t num_bytes, int root) {
    broadcast_scatter<BROADCAST_UNIT_WARPS>(ws, input, out, num_bytes, root);
}
// ANCHOR_END: broadcast_scatter
