// Chapter 4: what every collective kernel shares. The protocol in one place:
//
// EPOCHS. A communicator counts its calls. Every PE makes the same calls in the same order,
// so call number e means the same collective on every PE, and e is the value every flag of
// that call carries. The count lives on the device, one copy per block slot
// (`Workspace::state[STATE_EPOCHS + b]`, the epoch of the last finished call): block b of a
// kernel reads slot b when it starts, and at its end writes the new epoch into the slots
// congruent to b modulo the grid, so every slot advances once per call whatever the launch's
// grid, with plain stores instead of an atomic that every block's tail would wait for. Nothing comes from the host per call, which is what lets a CUDA graph replay
// the same launch many times. Flags only ever grow, so nobody resets them and a stale value
// can never pass for a new one.
//
// ANNOUNCE. Every kernel's block 0 starts by adding 1 to `ready[my_pe]` on every peer, which
// so counts our calls: "I have entered call e". By stream order that says two things about the announcing PE:
// it has finished call e - 1 (so it no longer reads the scratch slots it read then), and the
// work its stream queued before this call is done (so the user's buffers it passes to call e
// are free to be written and hold their inputs).
//
// LL LINES. Small messages travel as 16-byte lines {data0, flag, data1, flag}: one vector
// store carries 8 payload bytes and the epoch twice, and an 8-byte aligned store is never
// seen half-written. So the reader polls the data itself: no fence, no separate flag, one
// NVLink traversal. Half of every line is flag, which is why LL is for small messages.
// LL scratch is double-buffered by the parity of e; before writing call e into a peer's slot
// the writer checks that the peer announced e - 1, i.e. it is done reading call e - 2, the
// last user of that parity.
//
// TICKETS. Large messages go straight into the destination's symmetric buffer; afterwards
// block b of the writer fences and raises `done[writer][b]` on the destination to
// ticket(e, step). Steps number the stages of multi-stage algorithms (the ring), so one flag
// array serves them all and still only grows.
//
// BOUNDED WAITS. Every wait gives up after `timeout_cycles`, records what it waited for in
// the error record (host-mapped, so the host reads it without synchronising) and makes every
// other wait of this PE give up at once. A communicator that failed stays failed.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "common.cuh"
#include "contract.cuh"
#include "ptx.cuh"

namespace coll {

// The limits, the failure kinds and `Workspace` (the communicator as a kernel sees it) are
// the host/device contract: kernels/contract/defs.rs, generated into contract.cuh.
using namespace contract;
// Loads, stores and barriers with the order they need: ptx.cuh.
using namespace ptx;

// ANCHOR: ticket
__host__ __device__ constexpr uint64_t ticket(uint64_t epoch, uint64_t step) { return epoch * STEPS_PER_EPOCH + step; }
// ANCHOR_END: ticket

// The copy of symmetric `ptr` that lives on `pe`, as a pointer this GPU loads from and stores
// to directly: nvshmem_ptr(ptr, pe), with the offset the host read from it once.
template <typename T>
__device__ __forceinline__ T* peer(const Workspace& ws, T* ptr, int pe) {
    using Byte = typename std::conditional<std::is_const<T>::value, const char, char>::type;
    return reinterpret_cast<T*>(reinterpret_cast<Byte*>(ptr) + ws.peer_delta[pe]);
}

// ---- failure ----------------------------------------------------------------------------------

// `failed`, `record_failure` and `end_call` take a workspace with the local `state` and the
// host-mapped `error` record: chapter 4's `Workspace` or chapter 5's `RmaWorkspace`.
template <typename WS>
__device__ __forceinline__ bool failed(const WS& ws) { return ld_volatile(ws.state + STATE_FAILED) != 0; }

// First failure wins: it claims state[2] (device memory, where atomics are cheap), fills the
// host-mapped record and raises its word 0 last, so a host that sees word 0 sees the rest.
template <typename WS>
__device__ __forceinline__ void fill_failure_record(const WS& ws, Failure what, int pe, uint64_t expected,
                                                    uint64_t seen, uint64_t epoch) {
    if (atomicCAS(reinterpret_cast<unsigned long long*>(ws.state + STATE_FAILED), 0ull, 1ull) != 0ull) return;
    volatile uint64_t* record = ws.error;
    record[1] = static_cast<uint64_t>(pe);
    record[2] = expected;
    record[3] = seen;
    record[4] = what;
    record[5] = blockIdx.x;
    record[6] = epoch;
    __threadfence_system();
    record[0] = 1;
}

// Out of line, once per workspace type: chapter 4's and chapter 5's (`RmaWorkspace`).
__device__ __noinline__ void record_failure(const Workspace& ws, Failure what, int pe, uint64_t expected,
                                            uint64_t seen, uint64_t epoch) {
    fill_failure_record(ws, what, pe, expected, seen, epoch);
}
__device__ __noinline__ void record_failure(const RmaWorkspace& ws, Failure what, int pe, uint64_t expected,
                                            uint64_t seen, uint64_t epoch) {
    fill_failure_record(ws, what, pe, expected, seen, epoch);
}

// ANCHOR: wait_at_least
// Waits until `*flag >= target` (acquire: what was written before the flag is visible after).
// False when this PE has failed, or after the timeout, recording it.
__device__ __forceinline__ bool wait_at_least(const Workspace& ws, const uint64_t* flag, uint64_t target, Failure what,
                                              int pe, uint64_t epoch, uint64_t* value = nullptr) {
    uint64_t seen = ld_acquire_sys(flag);
    if (seen < target) {
        const long long start = clock64();
        while ((seen = ld_acquire_sys(flag)) < target) {
            if (failed(ws)) return false;
            if (clock64() - start > ws.timeout_cycles) {
                record_failure(ws, what, pe, target, seen, epoch);
                return false;
            }
        }
    }
    if (value != nullptr) *value = seen;  // what came, for a flag that also carries data
    return true;
}
// ANCHOR_END: wait_at_least

// ---- the call ---------------------------------------------------------------------------------

// ANCHOR: begin_call
// Announces this call to every peer (block 0) and returns its epoch. The announcement is an
// increment: ready[me] on a peer counts the calls we entered, which is the epoch, so it can
// leave before our own read of the epoch returns. Relaxed is enough: it orders nothing
// written in this kernel, only what finished before it started (earlier kernels).
__device__ __forceinline__ uint64_t begin_call(const Workspace& ws) {
    const int pe = threadIdx.x;
    if (blockIdx.x == 0 && pe < ws.n_pes && pe != ws.my_pe) {
        red_add_one_relaxed_sys(peer(ws, ws.ready + ws.my_pe, pe));
    }
    return ld_volatile(ws.state + STATE_EPOCHS + blockIdx.x) + 1;
}
// ANCHOR_END: begin_call

// Block b advances the epoch in slots b, b + grid, b + 2 grid, ...: every slot once per call.
// Slot b is written by block b alone in this launch, after it read it in begin_call, so no
// block of this launch sees the new value; later launches read it after this one's end.
template <typename WS>
__device__ __forceinline__ void end_call(const WS& ws, uint64_t epoch) {
    for (unsigned slot = blockIdx.x + threadIdx.x * gridDim.x; slot < MAX_BLOCKS; slot += blockDim.x * gridDim.x)
        ws.state[STATE_EPOCHS + slot] = epoch;
}

// Block-wide wait by thread 0 for a peer's flag; every thread learns the outcome.
__device__ __forceinline__ bool block_wait_at_least(const Workspace& ws, const uint64_t* flag, uint64_t target,
                                                    Failure what, int pe, uint64_t epoch) {
    __shared__ int arrived;
    __syncthreads();
    if (threadIdx.x == 0) arrived = wait_at_least(ws, flag, target, what, pe, epoch);
    __syncthreads();
    return arrived;
}

// Thread t < n_pes waits for peer t's announcement of call >= `epoch`; the block learns
// whether all arrived.
__device__ __forceinline__ bool block_wait_ready(const Workspace& ws, uint64_t epoch) {
    __shared__ int all_ready;
    __syncthreads();
    if (threadIdx.x == 0) all_ready = 1;
    __syncthreads();
    const int pe = threadIdx.x;
    if (pe < ws.n_pes && pe != ws.my_pe) {
        if (!wait_at_least(ws, ws.ready + pe, epoch, WAIT_READY, pe, epoch)) all_ready = 0;
    }
    __syncthreads();
    return all_ready;
}

// ANCHOR: block_signal
// After this block's stores into `pe`'s buffers: raise done[my_pe][block] on `pe` to
// `value`, so that whoever acquires the value sees every store of the block. One barrier,
// then one release store: a release is cumulative, it publishes everything that happens
// before it, and the barrier puts every thread's stores before it (chapter 3's put_stores,
// cooperative groups' grid sync and NCCL's step counters rely on the same causality order).
// What this replaced, a system fence in every thread before the barrier, cost 1.1-2.3 us
// more per signal (benchmarks/notes/collectives.md, v6).
// ANCHOR: block_signal_code
__device__ __forceinline__ void block_signal_done(const Workspace& ws, int pe, uint64_t value) {
    __syncthreads();
    if (threadIdx.x == 0) st_release_sys(peer(ws, ws.done + ws.my_pe * MAX_BLOCKS + blockIdx.x, pe), value);
}

// The same, to every peer but `skip_pe` at once (thread t signals peer t).
__device__ __forceinline__ void block_signal_done_all(const Workspace& ws, uint64_t value, int skip_pe = -1) {
    __syncthreads();
    const int pe = threadIdx.x;
    if (pe < ws.n_pes && pe != ws.my_pe && pe != skip_pe) {
        st_release_sys(peer(ws, ws.done + ws.my_pe * MAX_BLOCKS + blockIdx.x, pe), value);
    }
}
// ANCHOR_END: block_signal_code
// ANCHOR_END: block_signal

// Thread t < n_pes waits until peer t's block of our index raised done to `value` (every
// peer but `skip_pe`).
__device__ __forceinline__ bool block_wait_done_all(const Workspace& ws, uint64_t value, uint64_t epoch,
                                                    int skip_pe = -1) {
    __shared__ int all_done;
    __syncthreads();
    if (threadIdx.x == 0) all_done = 1;
    __syncthreads();
    const int pe = threadIdx.x;
    if (pe < ws.n_pes && pe != ws.my_pe && pe != skip_pe) {
        if (!wait_at_least(ws, ws.done + pe * MAX_BLOCKS + blockIdx.x, value, WAIT_DONE, pe, epoch)) all_done = 0;
    }
    __syncthreads();
    return all_done;
}

// ---- LL lines ---------------------------------------------------------------------------------

// ANCHOR: ll_line
__device__ __forceinline__ void ll_store(uint4* line, uint64_t payload, uint32_t flag) {
    st_volatile_v4(line, static_cast<uint32_t>(payload), flag, static_cast<uint32_t>(payload >> 32), flag);
}

// Polls `line` until both halves carry `flag`; false on failure (recorded).
__device__ __forceinline__ bool ll_load(const Workspace& ws, const uint4* line, uint32_t flag, int from_pe,
                                        uint64_t epoch, uint64_t* payload) {
    uint32_t d0, f0, d1, f1;
    const long long start = clock64();
    for (;;) {
        ld_volatile_v4(line, d0, f0, d1, f1);
        if (f0 == flag && f1 == flag) break;
        if (failed(ws)) return false;
        if (clock64() - start > ws.timeout_cycles) {
            record_failure(ws, WAIT_LL, from_pe, flag, f0 == flag ? f1 : f0, epoch);
            return false;
        }
    }
    *payload = static_cast<uint64_t>(d0) | (static_cast<uint64_t>(d1) << 32);
    return true;
}
// ANCHOR_END: ll_line

// The LL slot that `sender` writes into for call `epoch`, on this PE.
__device__ __forceinline__ uint4* ll_slot(const Workspace& ws, uint64_t epoch, int sender) {
    return reinterpret_cast<uint4*>(ws.ll + ((epoch & 1) * ws.n_pes + sender) * ws.ll_slot_bytes);
}

// ANCHOR: wait_slot_free
// Before writing call `epoch` into peer `pe`'s LL slot (or count row) of this parity: wait
// until `pe` announced epoch - 1, i.e. it stopped reading epoch - 2's data there.
__device__ __forceinline__ bool wait_slot_free(const Workspace& ws, int pe, uint64_t epoch) {
    return wait_at_least(ws, ws.ready + pe, epoch - 1, WAIT_READY, pe, epoch);
}
// ANCHOR_END: wait_slot_free

// ---- payload words: 8 bytes at any alignment, zero-padded past the end -----------------------

__device__ __forceinline__ uint64_t load_word(const uint8_t* src, uint64_t word, uint64_t num_bytes) {
    const uint64_t begin = word * 8;
    const uint8_t* p = src + begin;
    if (begin + 8 <= num_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
    uint64_t value = 0;
    for (uint64_t i = 0; i < 8 && begin + i < num_bytes; ++i) value |= static_cast<uint64_t>(p[i]) << (8 * i);
    return value;
}

__device__ __forceinline__ void store_word(uint8_t* dst, uint64_t word, uint64_t num_bytes, uint64_t value) {
    const uint64_t begin = word * 8;
    uint8_t* p = dst + begin;
    if (begin + 8 <= num_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
        *reinterpret_cast<uint64_t*>(p) = value;
        return;
    }
    for (uint64_t i = 0; i < 8 && begin + i < num_bytes; ++i) p[i] = static_cast<uint8_t>(value >> (8 * i));
}

// ---- bulk copies: the widest access both sides' alignment allows ------------------------------

// Copies bytes [begin, end) of `src` to `dst`, split over `num_threads` threads (this one is
// `thread`). Remote stores over NVLink want many bytes in flight per thread, hence the
// 4-deep unroll of 16-byte loads before the stores.
template <typename V, int UNROLL>
__device__ __forceinline__ void copy_as(uint8_t* dst, const uint8_t* src, uint64_t begin, uint64_t end, uint64_t thread,
                                        uint64_t num_threads) {
    const uint64_t first = (begin + sizeof(V) - 1) / sizeof(V), last = end / sizeof(V);
    V* d = reinterpret_cast<V*>(dst);
    const V* s = reinterpret_cast<const V*>(src);
    uint64_t i = first + thread;
    for (; i + (UNROLL - 1) * num_threads < last; i += UNROLL * num_threads) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = s[i + u * num_threads];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) d[i + u * num_threads] = v[u];
    }
    for (; i < last; i += num_threads) d[i] = s[i];
    // The unaligned head and tail, byte by byte.
    const uint64_t head_end = min(end, first * sizeof(V)), tail_begin = max(head_end, last * sizeof(V));
    for (uint64_t b = begin + thread; b < head_end; b += num_threads) dst[b] = src[b];
    for (uint64_t b = tail_begin + thread; b < end; b += num_threads) dst[b] = src[b];
}

// dst[begin, end) = src[begin, end); `dst` may be a peer's memory.
__device__ __forceinline__ void copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t begin, uint64_t end,
                                           uint64_t thread, uint64_t num_threads) {
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
    if ((misalignment & 15) == 0) {
        copy_as<uint4, 4>(dst, src, begin, end, thread, num_threads);
    } else if ((misalignment & 7) == 0) {
        copy_as<uint2, 4>(dst, src, begin, end, thread, num_threads);
    } else if ((misalignment & 3) == 0) {
        copy_as<uint32_t, 4>(dst, src, begin, end, thread, num_threads);
    } else {
        copy_as<uint8_t, 4>(dst, src, begin, end, thread, num_threads);
    }
}

// ANCHOR: copy_fanout
// dsts[d][begin, end) = srcs[d][begin, end) for every d < num: several copies interleaved
// vector by vector, so a local copy (HBM-bound) rides along with the peer stores
// (NVLink-bound) instead of queueing behind them, and a source shared by all destinations
// (all-gather, broadcast) is read from memory once and cached for the rest.
__device__ __forceinline__ void copy_fanout(uint8_t* const (&dsts)[MAX_PES], const uint8_t* const (&srcs)[MAX_PES],
                                            int num, uint64_t begin, uint64_t end, uint64_t thread,
                                            uint64_t num_threads) {
    uintptr_t misalignment = begin;
#pragma unroll
    for (int d = 0; d < MAX_PES; ++d) {
        if (d < num) misalignment |= reinterpret_cast<uintptr_t>(dsts[d]) | reinterpret_cast<uintptr_t>(srcs[d]);
    }
    if ((misalignment & 15) != 0) {
        for (int d = 0; d < num; ++d) copy_bytes(dsts[d], srcs[d], begin, end, thread, num_threads);
        return;
    }
    const uint64_t first = begin / 16, last = end / 16;
    for (uint64_t v = first + thread; v < last; v += num_threads) {
        uint4 loaded[MAX_PES];
#pragma unroll
        for (int d = 0; d < MAX_PES; ++d) {
            if (d < num) loaded[d] = reinterpret_cast<const uint4*>(srcs[d])[v];
        }
#pragma unroll
        for (int d = 0; d < MAX_PES; ++d) {
            if (d < num) reinterpret_cast<uint4*>(dsts[d])[v] = loaded[d];
        }
    }
    const uint64_t tail = max(begin, last * 16);
    for (int d = 0; d < num; ++d) copy_bytes(dsts[d], srcs[d], tail, end, thread, num_threads);
}
// ANCHOR_END: copy_fanout

// ANCHOR: copy_to_many
// dsts[d][begin, end) = src[begin, end) for every d < num: one source to several places
// (all-gather, broadcast). Each 16-byte vector is loaded once and stored num times, four
// vectors per thread in flight, so the link sees long runs of stores per SM.
__device__ __forceinline__ void copy_to_many(uint8_t* const (&dsts)[MAX_PES], int num, const uint8_t* src,
                                             uint64_t begin, uint64_t end, uint64_t thread, uint64_t num_threads) {
    constexpr int UNROLL = 4;
    uintptr_t misalignment = begin | reinterpret_cast<uintptr_t>(src);
#pragma unroll
    for (int d = 0; d < MAX_PES; ++d) {
        if (d < num) misalignment |= reinterpret_cast<uintptr_t>(dsts[d]);
    }
    if ((misalignment & 15) != 0) {
        for (int d = 0; d < num; ++d) copy_bytes(dsts[d], src, begin, end, thread, num_threads);
        return;
    }
    const uint4* s = reinterpret_cast<const uint4*>(src);
    const uint64_t first = begin / 16, last = end / 16;
    uint64_t v = first + thread;
    for (; v + (UNROLL - 1) * num_threads < last; v += UNROLL * num_threads) {
        uint4 loaded[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) loaded[u] = s[v + u * num_threads];
#pragma unroll
        for (int d = 0; d < MAX_PES; ++d) {
            if (d < num) {
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) reinterpret_cast<uint4*>(dsts[d])[v + u * num_threads] = loaded[u];
            }
        }
    }
    for (; v < last; v += num_threads) {
        const uint4 loaded = s[v];
        for (int d = 0; d < num; ++d) reinterpret_cast<uint4*>(dsts[d])[v] = loaded;
    }
    const uint64_t tail = max(begin, last * 16);
    for (int d = 0; d < num; ++d) copy_bytes(dsts[d], src, tail, end, thread, num_threads);
}
// ANCHOR_END: copy_to_many

// ANCHOR: part_bounds
// Bytes [begin, end) of a range of `num_bytes` split into `num_parts` equal, 16-byte rounded
// parts.
__device__ __forceinline__ void part_bounds(uint64_t num_bytes, uint64_t num_parts, uint64_t part, uint64_t* begin,
                                            uint64_t* end) {
    const uint64_t per_part = ((num_bytes + 15) / 16 + num_parts - 1) / num_parts * 16;
    *begin = min(num_bytes, part * per_part);
    *end = min(num_bytes, *begin + per_part);
}
// ANCHOR_END: part_bounds

// ANCHOR: block_pieces
// Block b's share of a range of `num_bytes`, as pieces dealt round-robin: piece k, bytes
// [k P, (k + 1) P), belongs to block k mod G (G blocks). Cutting the range into G contiguous
// slices instead has the grid storing into G places far apart at once, and that costs NVLink
// bandwidth at large sizes (chapter 3's launch-shape sweep, 256 MiB: as 132 slices 346 GB/s,
// as 528 slices 368 GB/s). P is an equal share of the range, 16-byte rounded, up to
// MAX_PIECE_BYTES, so a range of up to G x 64 KiB is cut exactly as G slices would cut it.
// ANCHOR: block_pieces_code
constexpr uint64_t MAX_PIECE_BYTES = 64 << 10;  // two rounds of 4 vectors per thread of a 512-thread block

__device__ __forceinline__ uint64_t piece_bytes(uint64_t num_bytes, uint64_t num_blocks) {
    const uint64_t share = (num_bytes + 16 * num_blocks - 1) / (16 * num_blocks) * 16;
    return max(uint64_t(16), min(MAX_PIECE_BYTES, share));
}

// Calls piece(begin, end) for each of this block's pieces of [0, num_bytes), in order.
template <typename Piece>
__device__ __forceinline__ void for_each_piece(uint64_t num_bytes, Piece piece) {
    const uint64_t bytes = piece_bytes(num_bytes, gridDim.x), stride = bytes * gridDim.x;
#pragma unroll 1
    for (uint64_t begin = blockIdx.x * bytes; begin < num_bytes; begin += stride) piece(begin, min(num_bytes, begin + bytes));
}
// ANCHOR_END: block_pieces_code
// ANCHOR_END: block_pieces

// ---- element types of reductions ---------------------------------------------------------------

// Sums are always taken in fp32, in PE order 0, 1, ..., n_pes - 1, so every algorithm and the
// host reference round the same way and results compare exactly.
template <typename T>
struct Element;
template <>
struct Element<float> {
    __device__ static float load(float v) { return v; }
    __device__ static float store(float v) { return v; }
};
template <>
struct Element<__nv_bfloat16> {
    __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
    __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

// Elements of T in one 8-byte payload word, unpacked and packed.
template <typename T>
struct Word {
    static constexpr int N = 8 / sizeof(T);
    __device__ static void add(float (&acc)[N], uint64_t word) {
        T values[N];
        memcpy(values, &word, 8);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] += Element<T>::load(values[i]);
    }
    __device__ static uint64_t pack(const float (&acc)[N]) {
        T values[N];
#pragma unroll
        for (int i = 0; i < N; ++i) values[i] = Element<T>::store(acc[i]);
        uint64_t word;
        memcpy(&word, values, 8);
        return word;
    }
};

}  // namespace coll
