// Chapter 3: device-initiated put and get, the signal handshake, and the kernels the p2p
// benchmark times. Every kernel that waits for another PE bounds its wait and reports a
// timeout through `error` (a local u64[4], see `report_timeout` in common.cuh), which the host
// turns into an error naming the PE and what it waited for.
#include "common.cuh"

// Which threads cooperate in one NVSHMEM call. The same bytes can be moved by one thread, a
// warp or a whole block; the wider the scope, the more threads issue loads and stores for the
// one call, and the fewer calls (and slices) there are.
enum Scope : int { SCOPE_THREAD = 0, SCOPE_WARP = 1, SCOPE_BLOCK = 2 };

// ANCHOR: slice
// The bytes [begin, end) that part `part_idx` of `num_parts` moves: equal shares rounded up to
// 16 bytes (so every share but the last starts 16-byte aligned and vector loads stay legal),
// empty for parts past the end. The host mirror is ch03_put_get::slice_bounds.
__device__ __forceinline__ void slice_bounds(uint64_t num_bytes, uint64_t num_parts, uint64_t part_idx,
                                             uint64_t* begin, uint64_t* end) {
    const uint64_t per_part = ((num_bytes + 15) / 16 + num_parts - 1) / num_parts * 16;
    *begin = min(num_bytes, part_idx * per_part);
    *end = min(num_bytes, *begin + per_part);
}
// ANCHOR_END: slice

// ANCHOR: scoped_put
// The slice of this thread's owner (itself, its warp or its block) when the grid splits
// `num_bytes` into one slice per owner.
template <int S>
__device__ __forceinline__ void scope_slice(uint64_t num_bytes, uint64_t* begin, uint64_t* end) {
    const uint64_t warps_per_block = blockDim.x / 32;
    uint64_t num_parts, part_idx;
    if (S == SCOPE_THREAD) {
        num_parts = uint64_t(gridDim.x) * blockDim.x;
        part_idx = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    } else if (S == SCOPE_WARP) {
        num_parts = uint64_t(gridDim.x) * warps_per_block;
        part_idx = uint64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32;
    } else {
        num_parts = gridDim.x;
        part_idx = blockIdx.x;
    }
    slice_bounds(num_bytes, num_parts, part_idx, begin, end);
}

// One slice per thread, warp or block (whichever owns the call): the caller of a collective
// _warp/_block function must be every thread of that warp/block, with the same arguments.
// dest: symmetric [num_bytes] on `pe`; source: local device [num_bytes].
template <int S>
__device__ __forceinline__ void put_slice(char* dest, const char* source, uint64_t num_bytes, int pe, bool nbi) {
    uint64_t begin, end;
    scope_slice<S>(num_bytes, &begin, &end);
    // A warp or block whose slice is empty skips the call as a whole: the condition is the
    // same for all of its threads, so no thread is left waiting inside a collective call.
    if (begin < end) {
        char* d = dest + begin;
        const char* s = source + begin;
        const size_t n = end - begin;
        if (S == SCOPE_THREAD) {
            nbi ? nvshmem_putmem_nbi(d, s, n, pe) : nvshmem_putmem(d, s, n, pe);
        } else if (S == SCOPE_WARP) {
            nbi ? nvshmemx_putmem_nbi_warp(d, s, n, pe) : nvshmemx_putmem_warp(d, s, n, pe);
        } else {
            nbi ? nvshmemx_putmem_nbi_block(d, s, n, pe) : nvshmemx_putmem_block(d, s, n, pe);
        }
    }
    // A blocking put returns once `source` may be reused; an _nbi put returns at once, and
    // only quiet says the bytes were delivered. Over NVLink, quiet is a system-scope fence.
    if (nbi) nvshmem_quiet();
}
// ANCHOR_END: scoped_put

// dest: local device [num_bytes]; source: symmetric [num_bytes] read on `pe`.
template <int S>
__device__ __forceinline__ void get_slice(char* dest, const char* source, uint64_t num_bytes, int pe, bool nbi) {
    uint64_t begin, end;
    scope_slice<S>(num_bytes, &begin, &end);
    if (begin < end) {
        char* d = dest + begin;
        const char* s = source + begin;
        const size_t n = end - begin;
        if (S == SCOPE_THREAD) {
            nbi ? nvshmem_getmem_nbi(d, s, n, pe) : nvshmem_getmem(d, s, n, pe);
        } else if (S == SCOPE_WARP) {
            nbi ? nvshmemx_getmem_nbi_warp(d, s, n, pe) : nvshmemx_getmem_warp(d, s, n, pe);
        } else {
            nbi ? nvshmemx_getmem_nbi_block(d, s, n, pe) : nvshmemx_getmem_block(d, s, n, pe);
        }
    }
    // A blocking get returns with the data in `dest`; an _nbi get only after quiet.
    if (nbi) nvshmem_quiet();
}

// Launch with blockDim.x a multiple of 32 (the warp variants need whole warps).
extern "C" __global__ void put_thread(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    put_slice<SCOPE_THREAD>(dest, source, num_bytes, pe, nbi);
}
extern "C" __global__ void put_warp(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    put_slice<SCOPE_WARP>(dest, source, num_bytes, pe, nbi);
}
extern "C" __global__ void put_block(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    put_slice<SCOPE_BLOCK>(dest, source, num_bytes, pe, nbi);
}
extern "C" __global__ void get_thread(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    get_slice<SCOPE_THREAD>(dest, source, num_bytes, pe, nbi);
}
extern "C" __global__ void get_warp(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    get_slice<SCOPE_WARP>(dest, source, num_bytes, pe, nbi);
}
extern "C" __global__ void get_block(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    get_slice<SCOPE_BLOCK>(dest, source, num_bytes, pe, nbi);
}

// ANCHOR: consume
// The consumer half of the handshake: wait (bounded) until the local `signal` reaches
// `expected`, then copy this block's slice of `inbox` into `seen`. Copying right after the
// wait, before any barrier, is the test: if the signal could overtake the data, `seen`
// would hold poison.
// inbox: symmetric [num_bytes]; signal: symmetric u64; seen: local device [num_bytes].
__device__ __forceinline__ void consume_after_signal(const char* inbox, uint64_t* signal, uint64_t expected,
                                                     char* seen, uint64_t num_bytes, int from_pe,
                                                     long long timeout_cycles, uint64_t* error) {
    __shared__ int arrived;
    if (threadIdx.x == 0) {
        arrived = signal_wait_bounded(signal, expected, timeout_cycles, from_pe, error);
    }
    __syncthreads();
    if (!arrived) return;
    uint64_t begin, end;
    slice_bounds(num_bytes, gridDim.x, blockIdx.x, &begin, &end);
    for (uint64_t i = begin + threadIdx.x; i < end; i += blockDim.x) seen[i] = inbox[i];
}
// ANCHOR_END: consume

// ANCHOR: put_signal_ring
// Producer and consumer in one kernel, on every PE of a ring: each block puts its slice of
// `source` into `next_pe`'s inbox and adds 1 to `next_pe`'s signal once those bytes have
// landed (putmem_signal orders the signal after the data). The consumer side waits until
// the local signal reaches `expected`: its value before this launch plus gridDim.x, one add
// per block of the previous PE. One signal word counts many producers: no per-block flag
// array, no barrier, and no reset between launches (the host passes the running total).
// Every block waits for every block of the previous PE's launch, so all blocks of every PE
// must be resident at once: the host checks the grid against the GPU's occupancy before it
// launches (ch03_put_get::signal).
// inbox: symmetric [num_bytes]; source: local device [num_bytes]; signal: symmetric u64 that
// only ever grows; seen: local device [num_bytes]; error: local u64[4].
extern "C" __global__ void put_signal_ring(char* inbox, const char* source, uint64_t num_bytes, uint64_t* signal,
                                           uint64_t expected, int next_pe, int previous_pe, char* seen,
                                           long long timeout_cycles, uint64_t* error) {
    uint64_t begin, end;
    slice_bounds(num_bytes, gridDim.x, blockIdx.x, &begin, &end);
    // Every block signals, even one with an empty slice: the consumer counts blocks.
    nvshmemx_putmem_signal_nbi_block(inbox + begin, source + begin, end - begin, signal, 1, NVSHMEM_SIGNAL_ADD,
                                     next_pe);
    consume_after_signal(inbox, signal, expected, seen, num_bytes, previous_pe, timeout_cycles, error);
}
// ANCHOR_END: put_signal_ring

// Consumer alone, for a producer that is the host (nvshmemx_putmem_signal_on_stream).
extern "C" __global__ void wait_signal_copy(const char* inbox, uint64_t* signal, uint64_t expected, char* seen,
                                            uint64_t num_bytes, int from_pe, long long timeout_cycles,
                                            uint64_t* error) {
    consume_after_signal(inbox, signal, expected, seen, num_bytes, from_pe, timeout_cycles, error);
}

// ANCHOR: store_copy
// Plain loads and stores into a peer's memory through the pointer nvshmem_ptr returned: no
// NVSHMEM call at all. 16-byte vectors when both pointers and the size allow it (the widest
// store an SM issues, and what NVSHMEM's own NVLink put does inside), bytes otherwise. With
// `fence`, every thread ends with a system-scope fence: the completion a put gives (its
// quiet), so that the two can be compared like with like. Without it the kernel's end is the
// only completion, which is enough for stream order but not for a signal sent from inside.
// dest: device [num_bytes] on a peer (from nvshmem_ptr); source: local device [num_bytes].
extern "C" __global__ void store_copy(char* dest, const char* source, uint64_t num_bytes, int fence) {
    const uint64_t thread_idx = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t num_threads = uint64_t(gridDim.x) * blockDim.x;
    const bool aligned = ((reinterpret_cast<uintptr_t>(dest) | reinterpret_cast<uintptr_t>(source)) & 15) == 0;
    uint64_t num_vectors = aligned ? num_bytes / 16 : 0;
    const int4* s = reinterpret_cast<const int4*>(source);
    int4* d = reinterpret_cast<int4*>(dest);
    for (uint64_t i = thread_idx; i < num_vectors; i += num_threads) d[i] = s[i];
    for (uint64_t i = num_vectors * 16 + thread_idx; i < num_bytes; i += num_threads) dest[i] = source[i];
    if (fence) __threadfence_system();
}
// ANCHOR_END: store_copy

// ANCHOR: put_stores
// A block put written as what it is over NVLink: each block stores its slice (the slicing of
// nvshmemx_putmem_nbi_block) through the peer pointer, four 16-byte loads in flight per
// thread, then completes it as a block: a barrier, and one system-scope fence by one thread.
// The fence after the barrier orders every thread's stores of the block before whatever that
// thread does next (a signal, the kernel's end): the PTX memory model's causality order runs
// through the barrier, as in cooperative groups' grid sync. That one fence per block, instead
// of nvshmem_quiet in every thread, and no per-call bookkeeping are the whole difference from
// NVSHMEM's put. A peer that is not load/store reachable, or unaligned bytes, take NVSHMEM's
// block put. dest: symmetric [num_bytes] on `pe`; source: local device [num_bytes]. `nbi` is
// ignored: the bytes have landed when the kernel ends.
extern "C" __global__ void put_stores(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    (void)nbi;
    uint64_t begin, end;
    slice_bounds(num_bytes, gridDim.x, blockIdx.x, &begin, &end);
    char* peer = static_cast<char*>(nvshmem_ptr(dest, pe));
    const bool aligned = ((reinterpret_cast<uintptr_t>(dest) | reinterpret_cast<uintptr_t>(source)) & 15) == 0;
    if (peer == nullptr || !aligned) {
        put_slice<SCOPE_BLOCK>(dest, source, num_bytes, pe, true);
        return;
    }
    // Slices start at multiples of 16 (slice_bounds); only the last one may end unaligned.
    const int4* s = reinterpret_cast<const int4*>(source + begin);
    int4* d = reinterpret_cast<int4*>(peer + begin);
    const uint64_t n = end > begin ? (end - begin) / 16 : 0;
    constexpr int kDepth = 4;
    uint64_t i = threadIdx.x;
    for (; i + (kDepth - 1) * blockDim.x < n; i += kDepth * blockDim.x) {
        int4 v[kDepth];
#pragma unroll
        for (int j = 0; j < kDepth; ++j) v[j] = s[i + j * blockDim.x];
#pragma unroll
        for (int j = 0; j < kDepth; ++j) d[i + j * blockDim.x] = v[j];
    }
    for (; i < n; i += blockDim.x) d[i] = s[i];
    for (uint64_t b = begin + n * 16 + threadIdx.x; b < end; b += blockDim.x) peer[b] = source[b];
    __syncthreads();
    if (threadIdx.x == 0) __threadfence_system();
}
// ANCHOR_END: put_stores

// ANCHOR: pingpong
// Latency: PE `initiator` sends `num_bytes` with a signal, the peer waits for it and sends
// the same back; `num_iters` round trips. Round i sets the signal to first_value + i, so a
// late or repeated message cannot be mistaken for the current one, and the next launch
// continues from first_value + num_iters without anyone resetting the word (a reset could
// erase a value the peer has already sent). One block per PE: both kernels must be resident
// at the same time, and the host checks that one block of this kernel fits.
// buffer: symmetric [num_bytes]; source: local device [num_bytes]; signal: symmetric u64,
// at most first_value on both PEs before either launches; error: local u64[4].
extern "C" __global__ void pingpong(char* buffer, const char* source, uint64_t num_bytes, uint64_t* signal,
                                    uint64_t first_value, int peer, int initiator, uint64_t num_iters,
                                    long long timeout_cycles, uint64_t* error) {
    // One thread is enough for a few bytes; a block-wide put spreads larger messages over
    // all of the block's threads.
    const bool whole_block = num_bytes > 256;
    for (uint64_t i = first_value + 1; i <= first_value + num_iters; ++i) {
        if (!initiator) {
            // Thread 0 waits; the barrier hands its outcome to every thread (no shared flag
            // that thread 0 could overwrite in the next round while others still read it).
            const int came = threadIdx.x != 0 || signal_wait_bounded(signal, i, timeout_cycles, peer, error);
            if (!__syncthreads_and(came)) return;
        }
        if (whole_block) {
            nvshmemx_putmem_signal_nbi_block(buffer, source, num_bytes, signal, i, NVSHMEM_SIGNAL_SET, peer);
        } else if (threadIdx.x == 0) {
            nvshmem_putmem_signal_nbi(buffer, source, num_bytes, signal, i, NVSHMEM_SIGNAL_SET, peer);
        }
        if (initiator) {
            const int came = threadIdx.x != 0 || signal_wait_bounded(signal, i, timeout_cycles, peer, error);
            if (!__syncthreads_and(came)) return;
        }
    }
    // Nothing may still be in flight when the kernel ends.
    nvshmem_quiet();
}
// ANCHOR_END: pingpong

// ANCHOR: put_bulk
// A put through Hopper's bulk-copy (TMA) unit instead of SM stores. Thread 0 of each block
// streams its chunks through shared memory: a bulk load from local HBM completes on an
// mbarrier, then a bulk store writes the stage into the peer's memory (the pointer
// nvshmem_ptr gives) without any SM load/store instruction per 16 bytes. BULK_STAGES stores
// stay in flight per block; a stage is reused only once its store has finished reading it.
// Where the peer is not load/store reachable (another node), it falls back to NVSHMEM's block
// put, so the kernel is a put for any PE.
// dest: symmetric [num_bytes] on `pe`; source: local device [num_bytes]. The `nbi` argument
// is ignored: the bytes have landed when the kernel ends.
// Hopper only: bulk copies and mbarrier transaction counts are sm_90 instructions. Built for
// an older architecture (KERNEL_ARCHS=sm_80,sm_90), the kernel is NVSHMEM's block put, so that
// every cubin links and a launch still moves the right bytes; the host refuses `put_bulk` on
// such a GPU before launching (PutGetError::NeedsHopper), so callers of the Rust API never
// get a different algorithm than the one they asked for.
constexpr uint32_t BULK_CHUNK_BYTES = 8192;
constexpr int BULK_STAGES = 4;

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

extern "C" __global__ void put_bulk(char* dest, const char* source, uint64_t num_bytes, int pe, int nbi) {
    (void)nbi;
#if __CUDA_ARCH__ >= 900
    char* peer = static_cast<char*>(nvshmem_ptr(dest, pe));
    const bool aligned = ((reinterpret_cast<uintptr_t>(dest) | reinterpret_cast<uintptr_t>(source)) & 15) == 0;
    if (peer == nullptr || !aligned) {
        put_slice<SCOPE_BLOCK>(dest, source, num_bytes, pe, true);
        return;
    }
    __shared__ alignas(128) char stage[BULK_STAGES][BULK_CHUNK_BYTES];
    __shared__ alignas(8) uint64_t loaded[BULK_STAGES];
    if (threadIdx.x != 0) return;
    // Chunks go round-robin over the blocks, so that at any moment the grid writes one
    // window of the destination (not one far-apart region per block); a chunk is as large as
    // an even split allows, at most BULK_CHUNK_BYTES, so small messages still use every block.
    const uint64_t bulk_bytes = num_bytes & ~uint64_t(15);  // bulk copies move 16 B multiples
    const uint64_t even_share = ((num_bytes + gridDim.x - 1) / gridDim.x + 15) & ~uint64_t(15);
    const uint64_t chunk = min(uint64_t(BULK_CHUNK_BYTES), max(uint64_t(16), even_share));
    const uint64_t stride = chunk * gridDim.x;
    for (int s = 0; s < BULK_STAGES; ++s) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&loaded[s])));
    }
    // Make the initialised barriers visible to the bulk-copy unit (the async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    // ANCHOR: put_bulk_loop
    uint32_t phases = 0;
    int k = 0;
    for (uint64_t offset = blockIdx.x * chunk; offset < bulk_bytes; offset += stride, ++k) {
        const int s = k % BULK_STAGES;
        const uint32_t n = static_cast<uint32_t>(min(chunk, bulk_bytes - offset));
        // At most BULK_STAGES - 1 stores may still be reading shared memory: the one that
        // used stage `s` (BULK_STAGES iterations ago) is done with it.
        asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(BULK_STAGES - 1) : "memory");
        const uint32_t bar = shared_address(&loaded[s]);
        const uint32_t smem = shared_address(stage[s]);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(n) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem), "l"(source + offset), "r"(n), "r"(bar) : "memory");
        // A local load always completes; the bound only keeps a broken GPU from hanging us.
        const uint32_t parity = (phases >> s) & 1u;
        const bool ok = wait_bounded([&] {
            uint32_t done;
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
            return done != 0;
        }, 2000000000ll);
        if (!ok) break;  // the destination stays partly unwritten: the caller's check sees it
        phases ^= 1u << s;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     ::"l"(peer + offset), "r"(smem), "r"(n) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
    // ANCHOR_END: put_bulk_loop
    // Every bulk store complete (written, not just read from shared memory) before we leave.
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    if (blockIdx.x == 0) {
        for (uint64_t i = bulk_bytes; i < num_bytes; ++i) peer[i] = source[i];
    }
    __threadfence_system();
#else
    put_slice<SCOPE_BLOCK>(dest, source, num_bytes, pe, true);
#endif
}
// ANCHOR_END: put_bulk
