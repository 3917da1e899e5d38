// Normal mode across nodes (issue 32): what the internode dispatch and combine share, the RDMA
// rings. Both ops use the same rings, chunk words and heads, because landing ring (c, b) on a
// rank is written in both by the same rank, its rail peer on node b (the dispatch's sender, the
// combine's forwarder), and read by the rank itself (its forwarder, its home receivers). So
// the positions (sent, received) run on from one op into the next, and the protocol is one:
// internode_dispatch.cu's NOTES. `Args` is InternodeDispatchArgs or InternodeCombineArgs.
#pragma once

#include "low_latency.cuh"

namespace nvshmem_tutorial {

// Bytes of one slot of the call's rings: the dispatch's slot, or the combine's.
__device__ __forceinline__ int ring_slot_bytes(const InternodeDispatchArgs& a) { return a.slot.bytes; }
__device__ __forceinline__ int ring_slot_bytes(const InternodeCombineArgs& a) { return a.slot_bytes; }

template <typename Args>
__device__ __forceinline__ uint8_t* slot_at(const Args& a, uint8_t* ring, uint64_t pos, int ring_tokens) {
    return ring + static_cast<int64_t>(pos % ring_tokens) * ring_slot_bytes(a);
}
// Landing ring (c, b): what node b's rail peer sends us. Staging ring (c, k): what we put to k.
template <typename Args>
__device__ __forceinline__ uint8_t* landing(const Args& a, int c, int b) {
    return a.rings.base + static_cast<int64_t>(c * num_nodes(a.topo) + b) * a.rings.ring_tokens * ring_slot_bytes(a);
}
template <typename Args>
__device__ __forceinline__ uint8_t* staging(const Args& a, int c, int k) {
    const int N = num_nodes(a.topo);
    return a.rings.base + static_cast<int64_t>(a.num_channels * N + c * N + k) * a.rings.ring_tokens * ring_slot_bytes(a);
}
// The word of the chunk at `pos` of ring (c, b) (symmetric: the same on the rail peer).
template <typename Args>
__device__ __forceinline__ uint64_t* chunk_word(const Args& a, int c, int b, uint64_t pos) {
    const int chunks = a.rings.ring_tokens / a.rings.chunk_tokens;
    return a.rings.chunk_words + static_cast<int64_t>(c * num_nodes(a.topo) + b) * MAX_RDMA_CHUNKS +
           static_cast<int>(pos / a.rings.chunk_tokens % chunks);
}
__device__ __forceinline__ uint64_t round_to_chunk(uint64_t pos, int chunk) { return (pos + chunk - 1) / chunk * chunk; }

// ANCHOR: post_chunk
// The chunk [p, p + m) of our stream to node k leaves: one put-with-signal from staging ring
// (c, k) into landing ring (c, our node) on our rail peer there, SETting the chunk's word to
// p + m after the data; on our own node the slots are in place (our landing ring) and a release
// store of the word publishes them. One warp, after a barrier over the warps that wrote the
// slots; `fence`: this warp's first put since that barrier (the NIC reads staging over PCIe).
template <typename Args>
__device__ __forceinline__ void post_chunk(const Args& a, int c, int k, uint64_t p, uint64_t m, bool fence, int lane) {
    const LlTopology& topo = a.topo;
    const int me = my_node(topo);
    uint64_t* word = chunk_word(a, c, me, p);
    if (k == me) {
        if (lane == 0) st_release_sys(word, p + m);
        return;
    }
    if (fence && lane == 0) __threadfence_system();
    __syncwarp();
    nvshmemx_putmem_signal_nbi_warp(slot_at(a, landing(a, c, me), p, a.rings.ring_tokens),
                                    slot_at(a, staging(a, c, k), p, a.rings.ring_tokens), m * ring_slot_bytes(a), word, p + m,
                                    NVSHMEM_SIGNAL_SET, k * topo.node_pes + my_local(topo));
}
// ANCHOR_END: post_chunk

// Positions of landing ring (c, b) we consumed, `was` -> `now`, go back to the ring's writer,
// the rail peer on node b: to its head word (c, our node) by signal ADD (two SETs could land out
// of order and move the head back), or on our own node by a release store of the count (one
// writer, one route). One thread.
template <typename Args>
__device__ __forceinline__ void return_head(const Args& a, int c, int b, uint64_t was, uint64_t now) {
    const LlTopology& topo = a.topo;
    const int N = num_nodes(topo), me = my_node(topo);
    if (b == me) {
        st_release_sys(a.rings.heads + c * N + b, now);
    } else if (now > was) {
        nvshmemx_signal_op(a.rings.heads + c * N + me, now - was, NVSHMEM_SIGNAL_ADD, b * topo.node_pes + my_local(topo));
    }
}

}  // namespace nvshmem_tutorial
