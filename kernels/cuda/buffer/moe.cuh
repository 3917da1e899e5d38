// Chapter 7: what the buffer's kernels share (layout.cu, notify.cu, dispatch.cu, combine.cu,
// and chapter 8's low_latency.cuh). The buffer is a chapter-4 communicator whose one symmetric
// allocation carries, after the communicator's own flags and scratch, the buffer's regions
// (layout and size formulas: src/regions.rs):
//
//   control   ring counters, MAX_CHANNELS x MAX_PES u64 each:
//               dispatch_tail[c][src]   on the receiver: tokens src pushed into ring (c, src)
//               dispatch_head[c][dst]   on the sender:   tokens dst consumed from ring (c, us)
//               combine_tail[c][src], combine_head[c][dst]: the same for combine
//   rows      the notify step's count rows: mine, then n_pes gathered ones
//   nvl       num_nvl_bytes: the ring queues of dispatch, then (reusing it) of combine
//   rdma      num_rdma_bytes: the low-latency slots (chapter 8)
//
// ANCHOR: ring_notes
// NOTES on the rings (the subtle part):
// - Ring (c, s) lives in the receiver's nvl region: ring_tokens slots of slot_bytes each.
//   The sender writes slots and publishes its tail into the receiver's memory; the receiver
//   copies slots out and publishes its head into the sender's memory. So each side only ever
//   polls its own memory, and the other side's updates are posted stores.
// - Counters never reset. Each side keeps, in local memory, how many tokens it has pushed
//   (sent) or consumed (received) on each ring over all calls; a call starts where the last
//   one ended. Both sides advance by the same count per call (the counts come from the notify
//   step or the handle), so they agree without a reset, a memset or a barrier.
// - A ring slot is count % ring_tokens. Different calls may lay slots out differently (other
//   hidden size, dtype, ring size); that is safe because a sender writes into a peer's region
//   only after the peer announced this call (chapter 4's ready flags), i.e. after the peer's
//   previous kernel, which drained every ring it was reading, has finished.
// - A sender publishes its tail after a window (dispatch: the tokens of one 32-token ballot;
//   combine: COMBINE_WINDOW rows, combine.cu), from one thread, after a named barrier over
//   the warps that wrote the window: the barrier orders their stores before the releasing
//   thread's store (the pattern DeepEP also relies on).
// ANCHOR_END: ring_notes
#pragma once

#include "../coll_common.cuh"

namespace moe {

using namespace coll;

// Bad input found on the device: the first writer claims the record (InputError in the
// contract), fills it and raises its kind last, so a host that sees the kind sees the rest.
__device__ __forceinline__ void record_input_error(const InputError& e, Failure kind, uint64_t token, uint64_t value,
                                                   uint64_t limit) {
    if (atomicCAS(e.claim, 0ull, 1ull) != 0ull) return;
    volatile uint64_t* r = e.words;
    r[1] = token;
    r[2] = value;
    r[3] = limit;
    __threadfence_system();
    r[0] = kind;
}

__device__ __forceinline__ bool wait_counter(const Workspace& ws, const uint64_t* counter, uint64_t target,
                                             Failure what, int pe, uint64_t epoch) {
    return wait_at_least(ws, counter, target, what, pe, epoch);
}

// [begin, end) of the original tokens channel c owns: equal shares in token order. Host
// mirror: src/regions.rs channel_range.
__device__ __forceinline__ void channel_range(int num_tokens, int num_channels, int c, int* begin, int* end) {
    const int per = (num_tokens + num_channels - 1) / num_channels;
    *begin = min(per * c, num_tokens);
    *end = min(*begin + per, num_tokens);
}

// Rows PE `src` delivered to us in channel c: where they start in our received rows, and how
// many there are. Dispatch's receiver writes them; combine's sender sends them back.
__device__ __forceinline__ void rows_from(const int* rank_prefix_matrix, const int* recv_channel_prefix_matrix, int n,
                                          int me, int num_channels, int src, int c, int* first, int* count) {
    const int before_src = src > 0 ? rank_prefix_matrix[(src - 1) * n + me] : 0;
    const int total = rank_prefix_matrix[src * n + me] - before_src;
    const int start = recv_channel_prefix_matrix[src * num_channels + c];
    const int next = c + 1 < num_channels ? recv_channel_prefix_matrix[src * num_channels + c + 1] : total;
    *first = before_src + start;
    *count = next - start;
}

// A handle that delivers more rows than the outputs hold (a dispatch with num_worst_tokens
// below what arrives, and the combine with its handle): one thread records it; every row at or
// past `num_recv_rows` is skipped, but its ring slot still moves, so the peers finish the call
// and the rings stay in step. The record names the first source rank whose rows do not all fit,
// the rows the handle delivers, and the rows there were.
__device__ __forceinline__ bool handle_past_rows(const int* rank_prefix_matrix, int n, int me, int num_recv_rows) {
    return rank_prefix_matrix[(n - 1) * n + me] > num_recv_rows;
}
__device__ __forceinline__ void check_recv_rows(const InputError& e, const int* rank_prefix_matrix, int n, int me,
                                                int num_recv_rows) {
    const int received = rank_prefix_matrix[(n - 1) * n + me];
    if (received <= num_recv_rows) return;
    int src = 0;
    while (src + 1 < n && rank_prefix_matrix[src * n + me] <= num_recv_rows) ++src;
    record_input_error(e, RECV_OVERFLOW, src, received, num_recv_rows);
}

// Before filling a ring up to position `end`, the receiver's head must have reached
// end - ring_tokens (counters are unsigned: nothing to wait for while end fits).
__device__ __forceinline__ uint64_t space_needed(uint64_t end, int ring_tokens) {
    return end > uint64_t(ring_tokens) ? end - ring_tokens : 0;
}

// Bytes of one uint4, the widest load and store: rows and the parts of ring slots and messages
// start at multiples of it so that warp_copy moves them as vectors.
constexpr int VECTOR_BYTES = 16;
static_assert(VECTOR_BYTES == sizeof(uint4), "a vector is one uint4");
// bf16 elements in one vector.
constexpr int BF16_PER_VECTOR = VECTOR_BYTES / int(sizeof(__nv_bfloat16));

__host__ __device__ __forceinline__ constexpr int round_up_to_vector(int num_bytes) {
    return (num_bytes + (VECTOR_BYTES - 1)) / VECTOR_BYTES * VECTOR_BYTES;
}

// Warps of a block split into groups, one per PE, or, with `skip` = a PE, one per PE but
// that one (a side with nothing to do for its own PE, e.g. a receiver, should not leave a
// group of warps idle). `peer` is the group's PE, `member` this warp's index in it.
struct PeerGroup {
    int peer, member, size, index, groups, first_barrier;
    __device__ PeerGroup(int n_pes, int skip = -1) : PeerGroup(n_pes, skip, 0, int(blockDim.x / WARP_SIZE), 1) {}
    // The same over warps [first_warp, first_warp + num_warps) only (the block's other warps
    // have another role), with named barriers from first_barrier.
    __device__ PeerGroup(int n_pes, int skip, int first_warp, int num_warps, int first_barrier_) {
        const int warp = int(threadIdx.x / WARP_SIZE) - first_warp;
        groups = skip >= 0 ? n_pes - 1 : n_pes;
        size = groups > 0 ? num_warps / groups : 0;
        index = size > 0 && warp >= 0 ? warp / size : groups;
        member = size > 0 && warp >= 0 ? warp % size : 0;
        peer = skip >= 0 && index >= skip ? index + 1 : index;
        first_barrier = first_barrier_;
    }
    __device__ bool active() const { return size > 0 && index < groups; }
    // A barrier over just this group's warps (named barrier first_barrier + index; 0 is
    // __syncthreads).
    __device__ void sync() const { named_barrier_sync(first_barrier + index, size * WARP_SIZE); }
};

// Copies `num_bytes` (a multiple of VECTOR_BYTES) with the lanes of a warp, kDepth loads in
// flight per lane before the first store: a decode-sized row is a few such rounds, so the copy
// costs a few memory latencies rather than one per 512 bytes. `kCoherent` reads through L2 only
// (data a peer wrote during this kernel); otherwise through the read-only path (inputs).
template <bool kCoherent, int kDepth = 8>
__device__ __forceinline__ void warp_copy(uint8_t* dst, const uint8_t* src, int num_bytes, int lane) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const int n = num_bytes / VECTOR_BYTES;
    for (int base = 0; base < n; base += WARP_SIZE * kDepth) {
        uint4 v[kDepth];
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = base + j * WARP_SIZE + lane;
            if (i < n) v[j] = kCoherent ? __ldcg(s + i) : __ldg(s + i);
        }
#pragma unroll
        for (int j = 0; j < kDepth; ++j) {
            const int i = base + j * WARP_SIZE + lane;
            if (i < n) d[i] = v[j];
        }
    }
}

}  // namespace moe
