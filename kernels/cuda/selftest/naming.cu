// Not a chapter: the build pipeline's own check (kernels/src/lib.rs's tests read this module's
// entry in CUBINS on a CPU machine). It is what a later chapter's device code looks like:
//   - a module in a subfolder, named by its path: `selftest/naming`;
//   - the shared header included both ways a subfolder may (`#pragma once` keeps one copy);
//   - an extern "C" kernel, listed under its source name, and C++ kernels in a namespace,
//     listed under their mangled names (the driver looks them up by those).
#include "../common.cuh"
#include "common.cuh"

// out: device [blockDim.x] u32
extern "C" __global__ void naming_plain(uint32_t* out) {
    out[threadIdx.x] = pattern_word(0, threadIdx.x, 1);
}

namespace nvshmem_tutorial {

// out: device [num_words] u32
__global__ void naming_scoped(uint32_t* out, int num_words) {
    for (int i = threadIdx.x; i < num_words; i += blockDim.x) out[i] = pattern_word(1, i, 2);
}

// out: device [kWords] u32. Two instantiations: one qualified name, two kernels.
template <int kWords>
__global__ void naming_template(uint32_t* out) {
    if (threadIdx.x < kWords) out[threadIdx.x] = pattern_word(2, threadIdx.x, kWords);
}
template __global__ void naming_template<2>(uint32_t*);
template __global__ void naming_template<4>(uint32_t*);

}  // namespace nvshmem_tutorial
