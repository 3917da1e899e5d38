// Chapter 4: reduce-scatter and all-reduce (sum), bf16 or fp32 elements, summed in fp32 in
// PE order (see Element in coll_common.cuh). Two algorithm families:
//  - one-shot LL: every PE sends its data to every peer as LL lines and each PE sums what it
//    received. One NVLink traversal, no barrier: the latency choice.
//  - pull (reduce-scatter) / two-shot (all-reduce): after every PE announced the call, PE j
//    reads chunk j of every PE's symmetric input, sums it, and (all-reduce) stores the sum
//    into chunk j of every PE's output. Each byte crosses a link once per phase: the
//    bandwidth choice.
#include "coll_common.cuh"

using namespace coll;

// ANCHOR: reduce_ll
// One-shot LL reduction of `count` elements. The data for PE q is at input + q * src_stride
// (all-reduce: src_stride 0, everybody gets everything; reduce-scatter: src_stride = chunk
// bytes, PE q gets chunk q). PE `me` sums its own part and the n - 1 slots it received.
// input: local; out: local [count] T.
template <typename T>
__device__ __forceinline__ void reduce_ll(const Workspace& ws, uint64_t epoch, const uint8_t* input,
                                          uint64_t src_stride, uint8_t* out, uint64_t count) {
    const uint32_t flag = static_cast<uint32_t>(epoch);
    const uint64_t num_bytes = count * sizeof(T), num_lines = (num_bytes + 7) / 8;
    const uint64_t thread = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    const uint64_t num_threads = uint64_t(gridDim.x) * blockDim.x;
    const int me = ws.my_pe, n = ws.n_pes;
    for (int i = 1; i < n; ++i) {
        const int q = (me + i) % n;
        if (!wait_slot_free(ws, q, epoch)) return;
        uint4* slot = peer(ws, ll_slot(ws, epoch, me), q);
        const uint8_t* data = input + q * src_stride;
        for (uint64_t w = thread; w < num_lines; w += num_threads) ll_store(slot + w, load_word(data, w, num_bytes), flag);
    }
    const uint8_t* mine = input + me * src_stride;
    for (uint64_t w = thread; w < num_lines; w += num_threads) {
        float acc[Word<T>::N] = {};
        for (int p = 0; p < n; ++p) {
            uint64_t payload;
            if (p == me) {
                payload = load_word(mine, w, num_bytes);
            } else if (!ll_load(ws, ll_slot(ws, epoch, p) + w, flag, p, epoch, &payload)) {
                return;
            }
            Word<T>::add(acc, payload);
        }
        store_word(out, w, num_bytes, Word<T>::pack(acc));
    }
}
// ANCHOR_END: reduce_ll

// ANCHOR: reduce_chunk
// dsts[d][i] = sum over p of srcs[p][i], for elements [begin, end), summed in PE order.
// srcs: n_pes pointers (this PE's and its peers' copies); dsts: num_dsts <= n_pes pointers.
// 16-byte vectors when every pointer allows it. Each thread keeps UNROLL vectors of each of
// the NP PEs in flight (NP, the PE count rounded up, is a template argument so that the
// loads stay in registers). At two PEs that is 2 vectors per thread; more would spill. It
// measured no faster than 1 (16 warps per SM already hide the peers' load latency) and no
// slower, so it stays (benchmarks/notes/collectives.md, v5).
template <typename T, int NP, int UNROLL>
__device__ __forceinline__ void reduce_vectors(const uint8_t* const (&srcs)[MAX_PES], int n, uint8_t* const (&dsts)[MAX_PES],
                                               int num_dsts, uint64_t begin, uint64_t num_vectors) {
    constexpr int PER_VECTOR = 16 / sizeof(T);
    for (uint64_t v0 = threadIdx.x; v0 < num_vectors; v0 += uint64_t(blockDim.x) * UNROLL) {
        uint4 loaded[UNROLL][NP];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const uint64_t v = v0 + uint64_t(u) * blockDim.x;
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < n && v < num_vectors) loaded[u][p] = *reinterpret_cast<const uint4*>(srcs[p] + (begin + v * PER_VECTOR) * sizeof(T));
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const uint64_t v = v0 + uint64_t(u) * blockDim.x;
            if (v >= num_vectors) break;
            float acc[PER_VECTOR] = {};
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                if (p < n) {
                    const T* values = reinterpret_cast<const T*>(&loaded[u][p]);
#pragma unroll
                    for (int k = 0; k < PER_VECTOR; ++k) acc[k] += Element<T>::load(values[k]);
                }
            }
            uint4 sum;
            T* packed = reinterpret_cast<T*>(&sum);
#pragma unroll
            for (int k = 0; k < PER_VECTOR; ++k) packed[k] = Element<T>::store(acc[k]);
#pragma unroll
            for (int d = 0; d < NP; ++d) {
                if (d < num_dsts) *reinterpret_cast<uint4*>(dsts[d] + (begin + v * PER_VECTOR) * sizeof(T)) = sum;
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void reduce_chunk(const uint8_t* const (&srcs)[MAX_PES], int n, uint8_t* const (&dsts)[MAX_PES],
                                             int num_dsts, uint64_t begin, uint64_t end) {
    constexpr int PER_VECTOR = 16 / sizeof(T);
    uintptr_t misalignment = begin * sizeof(T);
#pragma unroll
    for (int p = 0; p < MAX_PES; ++p) {
        if (p < n) misalignment |= reinterpret_cast<uintptr_t>(srcs[p]);
        if (p < num_dsts) misalignment |= reinterpret_cast<uintptr_t>(dsts[p]);
    }
    uint64_t i = begin;
    if ((misalignment & 15) == 0) {
        const uint64_t num_vectors = (end - begin) / PER_VECTOR;
        if (n <= 2) {
            reduce_vectors<T, 2, 2>(srcs, n, dsts, num_dsts, begin, num_vectors);
        } else if (n <= 4) {
            reduce_vectors<T, 4, 1>(srcs, n, dsts, num_dsts, begin, num_vectors);
        } else {
            reduce_vectors<T, MAX_PES, 1>(srcs, n, dsts, num_dsts, begin, num_vectors);
        }
        i = begin + num_vectors * PER_VECTOR;
    }
    for (i += threadIdx.x; i < end; i += blockDim.x) {
        float acc = 0.f;
        for (int p = 0; p < n; ++p) acc += Element<T>::load(reinterpret_cast<const T*>(srcs[p])[i]);
        const T sum = Element<T>::store(acc);
        for (int d = 0; d < num_dsts; ++d) reinterpret_cast<T*>(dsts[d])[i] = sum;
    }
}
// ANCHOR_END: reduce_chunk

// ANCHOR: two_shot
// Two-shot all-reduce. In place (out == input) is allowed: chunk j of every input is read
// only by PE j, which writes chunk j of every output only after reading it.
// input: symmetric [count] T; out: symmetric [count] T.
template <typename T>
__device__ __forceinline__ void all_reduce_two_shot(const Workspace& ws, const uint8_t* input, uint8_t* out,
                                                    uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    if (block_wait_ready(ws, epoch)) {
        const uint8_t* srcs[MAX_PES];
        uint8_t* dsts[MAX_PES];
#pragma unroll
        for (int p = 0; p < MAX_PES; ++p) {  // unrolled, so the pointers stay in registers
            if (p < n) {
                srcs[p] = p == me ? input : peer(ws, input, p);
                dsts[p] = p == me ? out : peer(ws, out, p);
            }
        }
        // Chunk me: the part of every input this PE sums.
        uint64_t chunk_begin, chunk_end;
        part_bounds(count * sizeof(T), n, me, &chunk_begin, &chunk_end);
        for_each_piece(chunk_end - chunk_begin, [&](uint64_t begin, uint64_t end) {
            reduce_chunk<T>(srcs, n, dsts, n, (chunk_begin + begin) / sizeof(T), (chunk_begin + end) / sizeof(T));
        });
        // The tickets say both "your chunk of my output is written" and "I have finished
        // reading your input": after the wait, out is complete and input may be reused.
        block_signal_done_all(ws, ticket(epoch, 1));
        block_wait_done_all(ws, ticket(epoch, 1), epoch);
    }
    end_call(ws, epoch);
}
// ANCHOR_END: two_shot

// ANCHOR: rs_ag
// The all-reduce as two launches, reduce-scatter then all-gather (the size table's rs_ag,
// large messages): the first is the two-shot with this PE's output as its only destination,
// the second stores that chunk of the output into every peer's. The chunks are the
// two-shot's (part_bounds: 16-byte rounded, so every chunk starts aligned for any count and
// the last ones may be short or empty). Each launch is a call of its own (an epoch, an
// announcement). In place (out == input) is allowed: chunk j of every input is read only by
// PE j, in the first launch, and written only by PE j, in either launch, after it was read.
//
// NOTES: the first launch raises no tickets. What they would promise every peer, "I have
// finished reading your input", the second launch's tickets promise already: a peer's
// second launch starts only after its whole first launch (stream order), and this PE returns
// only after every peer's block of its index raised its ticket. Its stores need no ticket
// either: they go to this PE's own output, which the second launch then reads. So the two
// phases meet at one wait (the second launch's block_wait_ready), where the fused kernel's
// loop needs none and the two standalone collectives have two.
// input: symmetric [count] T; out: symmetric [count] T.
template <typename T>
__device__ __forceinline__ void all_reduce_rs(const Workspace& ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    if (block_wait_ready(ws, epoch)) {  // every peer's input holds this call's data
        const uint8_t* srcs[MAX_PES];
        uint8_t* dsts[MAX_PES] = {out};
#pragma unroll
        for (int p = 0; p < MAX_PES; ++p) {
            if (p < n) srcs[p] = p == me ? input : peer(ws, input, p);
        }
        uint64_t chunk_begin, chunk_end;
        part_bounds(count * sizeof(T), n, me, &chunk_begin, &chunk_end);
        for_each_piece(chunk_end - chunk_begin, [&](uint64_t begin, uint64_t end) {
            reduce_chunk<T>(srcs, n, dsts, 1, (chunk_begin + begin) / sizeof(T), (chunk_begin + end) / sizeof(T));
        });
    }
    end_call(ws, epoch);
}

// The second launch: chunk me of this PE's output into the same place of every peer's, as
// the direct all-gather stores (copy_to_many), without the local copy (the chunk is already
// in place). Nobody else reads or writes chunk me of a peer's buffers in this call (in
// place, only this PE read it, in its first launch), and the first launch already waited for
// every peer to enter, so the wait below is not needed for correctness: it keeps the two
// phases apart as the standalone reduce-scatter and all-gather are, whose times predict
// these (benchmarks/notes/collectives.md, 2026-11-27).
// out: symmetric [count] T.
template <typename T>
__device__ __forceinline__ void all_reduce_ag(const Workspace& ws, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    if (block_wait_ready(ws, epoch)) {
        uint64_t chunk_begin, chunk_end;
        part_bounds(count * sizeof(T), n, me, &chunk_begin, &chunk_end);
        uint8_t* dsts[MAX_PES];
#pragma unroll
        for (int i = 0; i < MAX_PES; ++i) {
            if (i < n - 1) dsts[i] = peer(ws, out, (me + 1 + i) % n) + chunk_begin;  // PE me + 1 first
        }
        if (n > 1) {
            for_each_piece(chunk_end - chunk_begin, [&](uint64_t begin, uint64_t end) {
                copy_to_many(dsts, n - 1, out + chunk_begin, begin, end, threadIdx.x, blockDim.x);
            });
        }
        // "Your chunk me is written, and I am done with your input" (see all_reduce_rs).
        block_signal_done_all(ws, ticket(epoch, 1));
        block_wait_done_all(ws, ticket(epoch, 1), epoch);
    }
    end_call(ws, epoch);
}
// ANCHOR_END: rs_ag

// Pull reduce-scatter: PE me sums chunk me of every PE's input into its out.
// input: symmetric [n_pes * count] T; out: local [count] T.
template <typename T>
__device__ __forceinline__ void reduce_scatter_pull(const Workspace& ws, const uint8_t* input, uint8_t* out,
                                                    uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    if (block_wait_ready(ws, epoch)) {
        const uint8_t* srcs[MAX_PES];
        uint8_t* dsts[MAX_PES] = {out};
#pragma unroll
        for (int p = 0; p < MAX_PES; ++p) {
            if (p < n) srcs[p] = (p == me ? input : peer(ws, input, p)) + me * count * sizeof(T);
        }
        for_each_piece(count * sizeof(T), [&](uint64_t begin, uint64_t end) {
            reduce_chunk<T>(srcs, n, dsts, 1, begin / sizeof(T), end / sizeof(T));
        });
        block_signal_done_all(ws, ticket(epoch, 1));  // "I have finished reading your input"
        block_wait_done_all(ws, ticket(epoch, 1), epoch);
    }
    end_call(ws, epoch);
}

// The entry points, one per algorithm and element type (the driver looks kernels up by
// their unmangled names).
// input, out: as the functions above, __nv_bfloat16 elements.
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_one_shot_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    reduce_ll<__nv_bfloat16>(ws, epoch, input, 0, out, count);
    end_call(ws, epoch);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_two_shot_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_two_shot<__nv_bfloat16>(ws, input, out, count);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_rs_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_rs<__nv_bfloat16>(ws, input, out, count);
}
// Launched right after coll_all_reduce_rs_bf16, with the same arguments (input unused).
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_ag_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_ag<__nv_bfloat16>(ws, out, count);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_reduce_scatter_ll_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    reduce_ll<__nv_bfloat16>(ws, epoch, input, count * sizeof(__nv_bfloat16), out, count);
    end_call(ws, epoch);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_reduce_scatter_pull_bf16(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    reduce_scatter_pull<__nv_bfloat16>(ws, input, out, count);
}
// input, out: as the functions above, float elements.
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_one_shot_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    reduce_ll<float>(ws, epoch, input, 0, out, count);
    end_call(ws, epoch);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_two_shot_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_two_shot<float>(ws, input, out, count);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_rs_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_rs<float>(ws, input, out, count);
}
// Launched right after coll_all_reduce_rs_f32, with the same arguments (input unused).
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_reduce_ag_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    all_reduce_ag<float>(ws, out, count);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_reduce_scatter_ll_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    const uint64_t epoch = begin_call(ws);
    reduce_ll<float>(ws, epoch, input, count * sizeof(float), out, count);
    end_call(ws, epoch);
}
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_reduce_scatter_pull_f32(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t count) {
    reduce_scatter_pull<float>(ws, input, out, count);
}
