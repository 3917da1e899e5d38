// Chapter 1: every PE writes a pattern derived from its rank into the next PE's symmetric
// buffer (pattern_word in common.cuh).
#include "common.cuh"

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
        staging[i] = pattern_word(my_pe, i, seed);
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
