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
//     counts[2][MAX_LL_EXPERTS]  u64   counts[h][s * L + e]: (call << 32) | rows rank s sent
//                                 for our local expert e (dispatch) or that our rank s's
//                                 expert e sent back (combine); the word is the signal
//     barrier[MAX_LL_RANKS]      u64   the barriers each rank entered (ll_barrier.cu)
//   half[2]   a third each of the rest of the region, at offsets fixed by the region's size
//             (so calls of different shapes share them); half h holds one area per rank,
//             area x at x * area_bytes (also fixed by the region's size). In our half h, area x
//             is what rank x sends us in a call of that half; in our other half, during the
//             call, area x of a rank on another node is where we stage what we put to x
//     dispatch: area s, message (e, i) at (e * T + i) * msg_bytes: slot i of local expert e
//                 [src token: i32, pad x 3][row: hidden bf16 or fp8][scales: f32 x hidden/128],
//                 the whole rounded up to 16 bytes (every slot 16-byte aligned)
//     combine:  area r, row (e, i) at (e * T + i) * 2 * hidden: the bf16 result of r's local
//                 expert e for our token i (r on our node), or for the token that took slot
//                 i of run (e, us) in the dispatch (r on another node: runs leave as one put)
//   staging   the last third: L x (n_pes x T) x hidden bf16, get_next_low_latency_combine_buffer
//
// ANCHOR: ll_route
// THE ROUTE (chapter 5's rule, benchmarks/notes/buffer_internode.md section 5). The ranks sit in
// nodes of node_pes (LlTopology). A rank of this node, this one included, is reached through a
// peer pointer (node_peer, the only way these kernels turn a rank into an address): its slots
// are written by stores, its count words by release stores, as on one node. A rank of another
// node has no pointer: what we send it is written into area x of our own idle half, and once
// every block is done, one put-with-signal per (local expert, destination) carries the run
// and sets its count word after it. NVSHMEM orders a put-with-signal's signal after its own
// data, which is the whole ordering argument: no fence, no quiet, one atomic per run.
// ANCHOR_END: ll_route
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
// - Count words only grow (they hold the call number in their high half), so a stale one
//   never passes for a new one: the receiver waits for each (source, expert) word and nothing
//   else, and no separate flag (one more fence and round trip) follows the counts. Only rank s
//   writes the words of s, always by the same route: GPU stores, or NIC atomics, never mixed.
// - Who signals: the data to one destination comes from every block. After its stores each
//   block synchronises, and thread d fences and adds 1 to LlState::finish[d]; the block whose
//   add is the grid's last publishes destination d: its count words, by release stores (same
//   node) or by one put-with-signal per run (another node). One thread's fence after the block
//   barrier covers the whole block's stores (causality order: barrier, then fence, then
//   atomic), and the atomic-then-fence in the last block carries every block's stores to its
//   release stores and to the NIC's reads: the pattern of cooperative groups' grid sync and of
//   DeepEP's per-expert finish counters. The blocks' fences are system-scoped: the NIC reads
//   the staged runs over PCIe (on one node GPU scope would do, and measured no faster,
//   benchmarks/notes/buffer.md, "GPU-scope block fences").
// - Slots are token-ordered: slot i of token t's entry for expert e counts the entries before
//   it, in (token, k) order, that name e (token_slots). Both sides compute it from topk_idx,
//   so combine sends each run to another node back compacted, in one piece, and the token's
//   rank finds its row without an index. A same-node rank needs no run: combine stores each
//   row at its token's slot, and the receiver skips the scan (a token dropped from a full
//   run then has no row: its result is undefined, as the dispatch's SLOTS_FULL reports).
//   LlState::slots only counts: the publisher reads and zeroes each destination's counters in
//   one atomicExch, which is also the reset for the next call.
// - Staging in the idle half needs no cleaning either: during call k, area x of our other half
//   is written in call k + 1 by rank x alone, and x starts call k + 1 only after its call k
//   received our put to it, which by then has read the staged run. The areas sit where the
//   region's size puts them, so this holds whatever shape or op call k + 1 has.
// - Every expert's packed rows are runs by source in ring order from the receiver: its own
//   run first. So a token for an expert of its own rank needs no slot: slot index i is its
//   packed row, and the send phase writes the row, its scales and its source token straight
//   into the outputs; the receive phase copies only the other ranks' runs.
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
// MAX_LL_BLOCKS, MAX_LL_RANKS), LlTopology (where the ranks live), LlState (per-rank device state, zeroed at creation) and LlRegion (one half
// of every rank's region and the control words, as this rank addresses its own copy) are the
// host/device contract: kernels/contract/defs.rs.

static_assert(LL_THREADS >= MAX_LL_RANKS, "finish_sends and wait_all_sources give each rank a thread");

// ---- the route ------------------------------------------------------------------------------

__device__ __forceinline__ bool same_node(const LlTopology& topo, int rank) {
    return rank >= topo.node_start && rank < topo.node_start + topo.node_pes;
}

__device__ __forceinline__ int num_nodes(const LlTopology& topo) { return topo.num_ranks / topo.node_pes; }
__device__ __forceinline__ int my_node(const LlTopology& topo) { return topo.rank / topo.node_pes; }
__device__ __forceinline__ int my_local(const LlTopology& topo) { return topo.rank % topo.node_pes; }

// How a failure names a rank in the communicator's record: a rank of this node by its member
// index (the communicator maps it back to the world rank), any other as MAX_LL_RANKS + rank,
// past every member (src/error.rs takes MAX_LL_RANKS off).
__device__ __forceinline__ int failure_rank(const LlTopology& topo, int rank) {
    return same_node(topo, rank) ? rank - topo.node_start : MAX_LL_RANKS + rank;
}

// ANCHOR: node_peer
// The copy of symmetric `ptr` on `rank`, as a pointer this GPU stores to, for a rank of this
// node only (the communicator holds the offsets of its members, the node, and of no one else).
// Asked about a rank of another node it records CROSS_NODE_POINTER and returns null: on
// virtual nodes such a pointer would work (one host, NVLink), so a wrong route must fail here
// instead of passing the tests unseen.
template <typename T>
__device__ __forceinline__ T* node_peer(const Workspace& ws, const LlTopology& topo, T* ptr, int rank) {
    if (same_node(topo, rank)) return peer(ws, ptr, rank - topo.node_start);
    record_failure(ws, CROSS_NODE_POINTER, failure_rank(topo, rank), topo.node_start, topo.node_pes, 0);
    return nullptr;
}
// ANCHOR_END: node_peer

// Area x of half h of our region (symmetric: the same offset names area x on any rank).
__device__ __forceinline__ uint8_t* area(const LlRegion& region, int h, int x) {
    return region.data[h] + static_cast<uint64_t>(x) * region.area_bytes;
}

// ANCHOR: publish_run
// Publishes one run of ours to rank d: `bytes` at `offset` of an area, the run for d's local
// expert e, and its count word (call << 32 | rows). Same node: the rows are already in our
// area of d's half h (stored through node_peer); the word follows by a release store. Another
// node: the rows wait in area d of our other half; one put-with-signal carries them into our
// area of d's half h and sets the word after them (a run of zero rows: the word alone). Run by
// a whole warp (the put copies with all its lanes). The kernels publish the ranks of this node
// with publish_node_words instead (their words a thread each, not a lane per warp).
__device__ __forceinline__ void publish_run(const Workspace& ws, const LlTopology& topo, const LlRegion& region, int h, int d,
                                            int e, int L, uint64_t word, uint64_t offset, size_t bytes, int lane) {
    uint64_t* signal = region.counts[h] + topo.rank * L + e;
    if (same_node(topo, d)) {
        uint64_t* at = lane == 0 ? node_peer(ws, topo, signal, d) : nullptr;
        if (at != nullptr) st_release_sys(at, word);
    } else if (bytes > 0) {
        nvshmemx_putmem_signal_nbi_warp(area(region, h, topo.rank) + offset, area(region, h ^ 1, d) + offset, bytes, signal,
                                        word, NVSHMEM_SIGNAL_SET, d);
    } else if (lane == 0) {
        nvshmemx_signal_op(signal, word, NVSHMEM_SIGNAL_SET, d);
    }
}
// ANCHOR_END: publish_run

// ANCHOR: publish_node_words
// Publishes the ranks of this node whose last block this is (`last[d]`): their rows are
// already in our areas of their halves h (stored through node_peer), so only their count words
// remain, `count(d, e)` rows for rank d's local expert e. One pass of the whole block, a thread
// per word over every such rank: each release store is a system-scope fence, a warp's store
// instruction fences once for its 32 lanes, and in one pass each thread waits for one fence
// whatever the number of ranks (a pass per rank would wait for one fence per rank in a row).
// Run by every thread of the block; count(d, e) runs once per word, null pointer or not.
template <typename Count>
__device__ __forceinline__ void publish_node_words(const Workspace& ws, const LlTopology& topo, const LlRegion& region, int h,
                                                   const int* last, int L, uint64_t k, Count count) {
    for (int j = threadIdx.x; j < topo.num_ranks * L; j += blockDim.x) {
        const int d = j / L, e = j % L;
        if (!last[d] || !same_node(topo, d)) continue;
        uint64_t* words = node_peer(ws, topo, region.counts[h] + topo.rank * L, d);
        const uint64_t word = (k << 32) | static_cast<uint32_t>(count(d, e));
        if (words != nullptr) st_release_sys(words + e, word);
    }
}
// ANCHOR_END: publish_node_words

// After this block's stores to every rank: the grid's last block to get here for rank d
// publishes d's part of the call, the ranks of this node together (publish_node_words, with
// `count`), then each rank of another node (`remote(d)`, run by the whole block). Counting
// blocks rather than messages means no block needs the call's totals.
template <typename Count, typename Remote>
__device__ __forceinline__ void finish_sends(const Workspace& ws, const LlTopology& topo, const LlRegion& region, LlState* state,
                                             int h, int L, uint64_t k, Count count, Remote remote) {
    __shared__ int last[MAX_LL_RANKS];
    __syncthreads();  // every store of the block is issued (and ordered before the fence below)
    for (int d = threadIdx.x; d < topo.num_ranks; d += blockDim.x) {
        __threadfence_system();
        const bool is_last = atomicAdd(state->finish + d, 1u) == gridDim.x - 1;
        if (is_last) {
            state->finish[d] = 0;  // every block's add of this call is in: reset for the next
            __threadfence();       // acquire what the other blocks fenced before their adds
        }
        last[d] = is_last;
    }
    __syncthreads();
    publish_node_words(ws, topo, region, h, last, L, k, count);
    for (int p = 0; p < topo.num_ranks; ++p) {
        if (last[p] && !same_node(topo, p)) remote(p);
    }
}

// ANCHOR: token_slots
// slots[k] = the entries before (t, k), in (token, k) order, that name experts[k]: the slot of
// token t's copy in its (expert, source) run. Dispatch places the copy there, and combine's
// receiver finds the row its expert sent back there, each from topk_idx alone. experts[] holds
// token t's K checked ids (-1 for none), slots[] is written; both in shared memory. Every
// thread of the block calls it.
__device__ __forceinline__ void token_slots(const int64_t* topk_idx, int t, int K, const int* experts, int* slots) {
    if (static_cast<int>(threadIdx.x) < K) slots[threadIdx.x] = 0;
    __syncthreads();
    const int before = t * K;  // the entries of the tokens before t
    // One pass: each entry loaded once (a thread each) and held against all K ids, a warp's
    // matches for each k counted by a ballot (a pass per k reloaded every entry K times, a
    // load-reduce chain each). The bound is the block's, so every lane takes every ballot.
    for (int base = 0; base < before; base += blockDim.x) {
        const int j = base + static_cast<int>(threadIdx.x);
        const int64_t v = j < before ? __ldg(topk_idx + j) : -1;
        for (int k = 0; k < K; ++k) {
            const int e = experts[k];
            if (e < 0) continue;  // the same for every thread: a shared value
            const int c = __popc(__ballot_sync(ALL_LANES, v == e));
            if (threadIdx.x % WARP_SIZE == 0 && c > 0) atomicAdd(slots + k, c);
        }
    }
    __syncthreads();
    const int k = threadIdx.x;
    if (k < K && experts[k] >= 0) {
        int same = 0;  // the token's own earlier entries for the same expert (named twice)
        for (int j = 0; j < k; ++j) same += experts[j] == experts[k];
        slots[k] += same;
    }
    __syncthreads();
}
// ANCHOR_END: token_slots

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
