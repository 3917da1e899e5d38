// Chapter 8: what low-latency dispatch (ll_dispatch.cu) and combine (ll_combine.cu) share.
//
// A decoding step moves few tokens (tens to hundreds per rank), so its cost is latency: kernel
// launches, round trips, fences. Normal mode (dispatch.cu) first exchanges counts (the notify
// step) so that every token lands in its final row; here nothing is exchanged before the data.
// Every (local expert, source rank) pair owns a fixed run of num_max_dispatch_tokens_per_rank
// (T) slots on the expert's rank, big enough for the worst case, so a sender can write a token
// the moment it has cast it. Counts travel after the data, one word per (expert, source).
// Shapes are fixed by (T, hidden, num_experts) alone, which is what lets a CUDA graph capture
// a dispatch and a combine once and replay them with new data.
//
// Layout of the low-latency region (host mirror with the size formulas: src/low_latency/regions.rs):
//
//   control  (fixed offsets, whatever the call's shape)
//     flags[2][MAX_PES]    u64   flags[h][s]: the last combine whose rows PE s finished
//                                 writing into half h of our region
//     counts[2][MAX_LL_EXPERTS]  u64   counts[h][s * L + e]: (call << 32) | tokens PE s sent our
//                                 local expert e in that dispatch (the count is the signal)
//   half[2]   a third each of the rest of the region, at offsets fixed by the region's size
//             (so calls of different shapes share them), each >= E x T x (16 + 2 x hidden)
//             (E = num_experts, L = E / n_pes local experts, msg_bytes the call's message)
//     dispatch: slot (e, s, i) at ((e * n_pes + s) * T + i) * msg_bytes (s != this rank):
//                 [src token: i32, pad x 3][row: hidden bf16 or fp8][scales: f32 x hidden/128],
//                 the whole rounded up to 16 bytes (every slot 16-byte aligned)
//     combine:  row (global expert g, token t) at (g * T + t) * 2 * hidden: the bf16 result
//   staging   the last third: L x (n_pes x T) x hidden bf16, get_next_low_latency_combine_buffer
//
// ANCHOR: ll_notes
// NOTES on the protocol (the subtle part):
// - Calls are numbered on the device (LlState::calls, the last call each block finished; all
//   blocks agree, since every launch has one block per SM and each closes every call), never
//   from the host, so a graph replay is a new call. Dispatches and combines share one count: call k
//   uses half k & 1 of every rank's region, dispatch or combine.
// - Reuse of a half needs no cleaning: call k writes into a peer's half h only after its own
//   call k - 1 received from every peer (stream order), and that peer sent call k - 1 only
//   after it had finished reading call k - 2, the last user of half h. Every call is a full
//   exchange (every rank signals every rank, zero tokens included), which is what makes this
//   chain hold.
// - Flags and count words only grow (they hold the call number), so a stale one never passes
//   for a new one. A dispatch count word carries its call in the high half: the receiver
//   waits for each (expert, source) word of its own experts and nothing else, and no separate
//   flag (one more fence and round trip) follows the counts.
// - Who signals: the data to one destination comes from every block. After its stores each
//   block synchronises, and thread d fences and adds 1 to LlState::finish[d]; the block whose
//   add is the grid's last writes destination d's count words (dispatch) or raises its flag
//   (combine), each a release store. One thread's fence after the block barrier covers the
//   whole block's stores (causality order: barrier, then fence, then atomic), and the
//   atomic-then-fence in the last block carries every block's stores to its release stores:
//   the pattern of cooperative groups' grid sync and of DeepEP's per-expert finish counters.
//   The blocks' fences are system-scoped, the conservative choice: GPU scope would do by the
//   memory model (the blocks meet on this GPU and the release stores are cumulative), and
//   measured no faster (benchmarks/notes/buffer.md, "GPU-scope block fences").
// - Slots are handed out by atomics on LlState::slots, in the order tokens reach them (as in
//   DeepEP); the last block for a destination reads and zeroes its experts' counters in one
//   atomicExch, which is also the reset for the next call.
// - Every expert's packed rows are runs by source in ring order from the receiver: its own
//   run first. So a token for an expert of its own rank needs no slot: slot index i is its
//   packed row, and the send phase writes the row, its scales and its source token straight
//   into the outputs; the receive phase copies only the peers' runs.
// ANCHOR_END: ll_notes
#pragma once

#include <cuda_fp8.h>

#include "moe.cuh"

namespace nvshmem_tutorial {

using namespace coll;
using moe::BF16_PER_VECTOR;
using moe::round_up_to_vector;
using moe::VECTOR_BYTES;
using moe::warp_copy;

// PHASE_SEND / PHASE_RECV, the limits (MAX_LL_EXPERTS, MAX_TOPK, MAX_LL_HIDDEN,
// MAX_LL_BLOCKS), LlState (per-rank device state, zeroed at creation) and LlRegion (one half
// of every rank's region and the control words, as this rank addresses its own copy) are the
// host/device contract: kernels/contract/defs.rs.

// After this block's stores to every PE: the grid's last block to get here for PE d publishes
// d's part of the call (`publish(d)`, run by the whole block, its stores release stores).
// Counting blocks rather than messages means no block needs the call's totals.
template <typename Publish>
__device__ __forceinline__ void finish_sends(const Workspace& ws, LlState* state, Publish publish) {
    __shared__ int last[MAX_PES];
    __syncthreads();  // every store of the block is issued (and ordered before the fence below)
    const int d = threadIdx.x;
    if (d < ws.n_pes) {
        __threadfence_system();
        const bool is_last = atomicAdd(state->finish + d, 1u) == gridDim.x - 1;
        if (is_last) {
            state->finish[d] = 0;  // every block's add of this call is in: reset for the next
            __threadfence();       // acquire what the other blocks fenced before their adds
        }
        last[d] = is_last;
    }
    __syncthreads();
    for (int p = 0; p < ws.n_pes; ++p) {
        if (last[p]) publish(p);
    }
}

// A block past its receive phase has finished the call. Each block counts calls in a word of
// its own (every launch has one block per SM), so closing a call is a plain store, not an
// atomic every block waits for; only later launches read it, after this kernel's end.
__device__ __forceinline__ void end_ll_call(LlState* state, uint64_t k) {
    if (threadIdx.x == 0) state->calls[blockIdx.x] = k;
}

// One launch of a call: its send phase, its receive phase, or both (`phases`, a mask of
// PHASE_SEND and PHASE_RECV). Both phases of a call read the same call number; the receive
// closes the call.
template <typename Args, typename Phase>
__device__ __forceinline__ void run_call(const Workspace& ws, const Args& args, int phases, Phase send, Phase recv) {
    const uint64_t k = ld_volatile(reinterpret_cast<const uint64_t*>(args.state->calls + blockIdx.x)) + 1;
    const int h = static_cast<int>(k & 1);
    if (phases & PHASE_SEND) send(ws, args, h, k);
    if (phases & PHASE_RECV) {
        recv(ws, args, h, k);
        end_ll_call(args.state, k);
    }
}

__device__ __forceinline__ bool valid_expert(const InputError& bad, int64_t e, int num_experts, int token) {
    if (e >= 0 && e < num_experts) return true;
    if (e != -1) moe::record_input_error(bad, BAD_EXPERT, token, static_cast<uint64_t>(e), num_experts);
    return false;
}

}  // namespace nvshmem_tutorial
