// Chapter 1: every PE writes a pattern derived from its rank into the next PE's symmetric
// buffer. The pattern is f(source pe, index) so the receiver can tell a wrong sender, a
// shifted index and an unwritten slot apart.
#include "common.cuh"

__device__ __forceinline__ uint32_t ring_pattern(int source_pe, uint64_t index, uint32_t seed) {
    // A cheap bijective mix: distinct (pe, index) pairs give distinct words for a run.
    uint32_t x = static_cast<uint32_t>(index) * 0x9E3779B1u ^ (static_cast<uint32_t>(source_pe) + 1u) * 0x85EBCA77u;
    x ^= seed;
    x ^= x >> 15;
    return x * 0x2C1B3C6Du;
}

// ANCHOR: ring_put
// received: symmetric [num_words] u32, written by the previous PE
// staging:  local device [num_words] u32, this PE's outgoing pattern
extern "C" __global__ void ring_put(uint32_t* received, uint32_t* staging, uint64_t num_words, uint32_t seed) {
    const int my_pe = nvshmem_my_pe();
    const int next_pe = (my_pe + 1) % nvshmem_n_pes();
    // Each block owns one contiguous slice: it fills it, then sends it.
    const uint64_t per_block = (num_words + gridDim.x - 1) / gridDim.x;
    const uint64_t begin = min(num_words, blockIdx.x * per_block);
    const uint64_t end = min(num_words, begin + per_block);
    for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        staging[i] = ring_pattern(my_pe, i, seed);
    }
    // The put reads what the whole block wrote.
    __syncthreads();
    // A block-wide put moves the bytes with all of the block's threads. It returns when the
    // source may be reused, not when the data has arrived: the barrier after the kernel
    // (nvshmemx_barrier_all_on_stream) is what completes it on the receiver.
    if (begin < end) {
        nvshmemx_putmem_block(received + begin, staging + begin, (end - begin) * sizeof(uint32_t), next_pe);
    }
}
// ANCHOR_END: ring_put
