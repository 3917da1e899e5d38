// Every inline PTX instruction the kernels of chapters 4, 7 and 8 use, each behind a name that
// says what it orders and at which scope. Kernel code calls these and never writes `asm`: a
// reader checks the memory model in one file, and a port (another architecture, a stricter
// order) changes one line. The model is DeepEP's csrc/kernels/utils.cuh.
//
// Names follow the PTX they emit: `<op>_<order>_<scope>`, with order one of relaxed, acquire,
// release (or volatile, PTX's pre-memory-model load/store that the compiler must not merge or
// drop) and scope sys (every GPU and the host: peers' memory reached through NVLink).
// Chapter 3's TMA bulk copies (put_get.cu) keep their own, Hopper-only PTX.
#pragma once

#include <cstdint>

namespace ptx {

// Threads of a warp, and the mask naming all of them in the *_sync warp intrinsics.
constexpr int WARP_SIZE = 32;
constexpr unsigned ALL_LANES = 0xffffffffu;

// ---- loads and stores with the order they need -----------------------------------------------

// Acquire: what the writer stored before its release of this word is visible after the load.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// Release: every store this thread made (or saw, causally) before it is visible to whoever
// acquires the value. The publishing half of every flag, tail, head and count word.
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Relaxed: atomic (never seen half-written) but ordering nothing; for words that carry their
// own validity (an epoch in the high half).
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// A load the compiler may not hoist out of a loop or merge; no ordering (a plain C++ volatile
// load, not PTX, kept here with the other ordered accesses).
__device__ __forceinline__ uint64_t ld_volatile(const uint64_t* p) { return *reinterpret_cast<const volatile uint64_t*>(p); }

// *p += 1 as a fire-and-forget reduction (no value comes back, so the thread does not wait
// for the round trip), relaxed.
__device__ __forceinline__ void red_add_one_relaxed_sys(uint64_t* p) {
    asm volatile("red.relaxed.sys.global.add.u64 [%0], 1;" ::"l"(p) : "memory");
}

// One 16-byte vector store of four words, {x, y, z, w} in address order; a reader's 16-byte
// load sees each aligned 8-byte half whole (chapter 4's LL lines rely on that).
__device__ __forceinline__ void st_volatile_v4(void* p, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x), "r"(y), "r"(z), "r"(w)
                 : "memory");
}

// The matching 16-byte volatile load.
__device__ __forceinline__ void ld_volatile_v4(const void* p, uint32_t& x, uint32_t& y, uint32_t& z, uint32_t& w) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(p) : "memory");
}

// ---- warps and barriers ----------------------------------------------------------------------

// Bit i set for every lane i below this one: popc(mask & lanemask_lt()) is this lane's rank
// among the lanes whose bit is set in `mask`.
__device__ __forceinline__ uint32_t lanemask_lt() {
    uint32_t mask;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
    return mask;
}

// A barrier over `num_threads` threads (whole warps) of the block: named barrier `id` (1 to
// 15; 0 is __syncthreads). Lets a group of warps synchronise without stalling the rest.
__device__ __forceinline__ void named_barrier_sync(int id, int num_threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

}  // namespace ptx
