// Chapter 2: plain CUDA stores into a peer GPU's memory through the pointer nvshmem_ptr
// returned. No NVSHMEM device call: once mapped, a peer's heap is ordinary device memory.
#include "common.cuh"

// ANCHOR: store_pattern
// destination: device [num_words] u32, here or on a peer (from nvshmem_ptr)
extern "C" __global__ void store_pattern(uint32_t* destination, uint64_t num_words, int source_pe, uint32_t seed) {
    for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < num_words; i += gridDim.x * blockDim.x) {
        destination[i] = pattern_word(source_pe, i, seed);
    }
}
// ANCHOR_END: store_pattern
