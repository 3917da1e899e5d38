// Chapter 5: collectives over an RMA group (rma.cuh): the steps of the hierarchical
// algorithms that cross nodes (over the rail), and the flat algorithms (over every PE). Every
// byte that leaves this PE goes by nvshmemx_putmem_signal_nbi_block, every flag by
// nvshmemx_signal_op: no peer pointer appears in this file (a CPU test of chapter 5 checks it).
#include "rma.cuh"

using namespace rma;

// ANCHOR: rma_exchange
// Every member (or only `root`) sends part `src_for(j)` of `num_bytes` to `dst_on(j)` on every
// member j, block b its slice of it; then every member waits for what it receives. The
// senders first wait until every member announced the call (its output is free).
template <typename Src, typename Dst>
__device__ __forceinline__ void exchange(const RmaWorkspace& g, uint64_t epoch, uint64_t num_bytes, Src src_for,
                                         Dst dst_on, int root) {
    const bool sends = root < 0 || g.me == root;
    if (sends && !block_wait_ready(g, epoch)) return;
    uint64_t begin, end;
    block_slice(num_bytes, &begin, &end);
    for (int i = 1; sends && i <= g.size; ++i) {
        const int j = (g.me + i) % g.size;  // member me + 1 first: the members spread their traffic
        put_signal(g, dst_on(j), src_for(j), begin, end, 0, epoch, j);
    }
    block_wait_done(g, 0, epoch, root);
}
// ANCHOR_END: rma_exchange

// A barrier of the group: every member entered the call.
extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_sync(const __grid_constant__ RmaWorkspace g) {
    const uint64_t epoch = begin_call(g);
    block_wait_ready(g, epoch);
    finish_call(g, epoch);
}

// input: symmetric [num_bytes]; out: symmetric [size * num_bytes] (member i's at i * num_bytes).
extern "C" __global__ void __launch_bounds__(RMA_THREADS)
    rma_all_gather(const __grid_constant__ RmaWorkspace g, const uint8_t* input, uint8_t* out, uint64_t num_bytes) {
    const uint64_t epoch = begin_call(g);
    exchange(
        g, epoch, num_bytes, [&](int) { return input; }, [&](int) { return out + g.me * num_bytes; }, -1);
    finish_call(g, epoch);
}

// input: symmetric [size * num_bytes] (block j for member j); out: symmetric [size * num_bytes].
extern "C" __global__ void __launch_bounds__(RMA_THREADS)
    rma_all_to_all(const __grid_constant__ RmaWorkspace g, const uint8_t* input, uint8_t* out, uint64_t num_bytes) {
    const uint64_t epoch = begin_call(g);
    exchange(
        g, epoch, num_bytes, [&](int j) { return input + j * num_bytes; },
        [&](int) { return out + g.me * num_bytes; }, -1);
    finish_call(g, epoch);
}

// Member `root`'s input into every member's out. input, out: symmetric [num_bytes].
extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_broadcast(const __grid_constant__ RmaWorkspace g,
                                                                        const uint8_t* input, uint8_t* out,
                                                                        uint64_t num_bytes, int root) {
    const uint64_t epoch = begin_call(g);
    exchange(
        g, epoch, num_bytes, [&](int) { return input; }, [&](int) { return out; }, root);
    finish_call(g, epoch);
}

// ---- reductions ---------------------------------------------------------------------------------

// dst[begin, end) = the sum over the `n` slots of bytes [begin, end) of each slot, in fp32, in
// member order (the order the host reference sums in), rounded once to T.
template <typename T>
__device__ __forceinline__ void sum_slots(const uint8_t* slots, uint64_t slot_bytes, int n, uint8_t* dst,
                                          uint64_t begin, uint64_t end) {
    constexpr int PER_VECTOR = 16 / sizeof(T);
    const bool vectors = ((reinterpret_cast<uintptr_t>(dst) | begin) & 15) == 0;
    const uint64_t vector_end = vectors ? end / 16 * 16 : begin;
    for (uint64_t v = begin + 16 * threadIdx.x; v < vector_end; v += 16 * blockDim.x) {
        float acc[PER_VECTOR] = {};
        for (int i = 0; i < n; ++i) {
            const uint4 loaded = *reinterpret_cast<const uint4*>(slots + i * slot_bytes + v);
            const T* values = reinterpret_cast<const T*>(&loaded);
#pragma unroll
            for (int k = 0; k < PER_VECTOR; ++k) acc[k] += Element<T>::load(values[k]);
        }
        uint4 sum;
        T* packed = reinterpret_cast<T*>(&sum);
#pragma unroll
        for (int k = 0; k < PER_VECTOR; ++k) packed[k] = Element<T>::store(acc[k]);
        *reinterpret_cast<uint4*>(dst + v) = sum;
    }
    for (uint64_t e = vector_end + sizeof(T) * threadIdx.x; e < end; e += sizeof(T) * blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < n; ++i) acc += Element<T>::load(*reinterpret_cast<const T*>(slots + i * slot_bytes + e));
        *reinterpret_cast<T*>(dst + e) = Element<T>::store(acc);
    }
}

// ANCHOR: rma_reduce
// Reduce-scatter (all_reduce false): part j of the input, [j * count, (j + 1) * count)
// elements, summed over the members, lands in member j's out[0, count). All-reduce: the
// count elements cut into `size` parts (part_bounds), part j summed by member j into its out
// at the part's offset, then put from there into every member's out (step 1). The parts travel
// into the receivers' scratch, one slot per sender, and are summed there in member order.
// input: symmetric [count] (all-reduce) or [size * count] T; out: symmetric [count] T.
template <typename T>
__device__ __forceinline__ void reduce(const RmaWorkspace& g, const uint8_t* input, uint8_t* out, uint64_t count,
                                       bool all_reduce) {
    const uint64_t epoch = begin_call(g);
    auto part = [&](int j, uint64_t* begin, uint64_t* end) {
        if (all_reduce) return part_bounds(count * sizeof(T), g.size, j, begin, end);
        *begin = j * count * sizeof(T);
        *end = *begin + count * sizeof(T);
    };
    uint64_t first, last, begin, end;
    part(0, &first, &last);  // part 0 is the longest: it sizes the slots
    const uint64_t slot_bytes = (last - first + 15) / 16 * 16;
    if (block_wait_ready(g, epoch)) {
        for (int i = 1; i <= g.size; ++i) {
            const int j = (g.me + i) % g.size;
            part(j, &first, &last);
            block_slice(last - first, &begin, &end);
            put_signal(g, g.scratch + g.me * slot_bytes, input + first, begin, end, 0, epoch, j);
        }
        part(g.me, &first, &last);
        block_slice(last - first, &begin, &end);
        uint8_t* mine = out + (all_reduce ? first : 0);
        const bool received = block_wait_done(g, 0, epoch);  // the same in every thread
        if (received) sum_slots<T>(g.scratch, slot_bytes, g.size, mine, begin, end);
        __syncthreads();  // the block's sums are in `out` before it sends them
        for (int i = 1; all_reduce && received && i <= g.size; ++i) {
            const int j = (g.me + i) % g.size;  // ourselves last, with the signal alone
            put_signal(g, mine, mine, begin, j == g.me ? begin : end, 1, epoch, j);
        }
        if (all_reduce && received) block_wait_done(g, 1, epoch);
    }
    finish_call(g, epoch);
}
// ANCHOR_END: rma_reduce

extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_reduce_scatter_bf16(const __grid_constant__ RmaWorkspace g,
                                                                                  const uint8_t* input, uint8_t* out,
                                                                                  uint64_t count) {
    reduce<__nv_bfloat16>(g, input, out, count, false);
}
extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_reduce_scatter_f32(const __grid_constant__ RmaWorkspace g,
                                                                                 const uint8_t* input, uint8_t* out,
                                                                                 uint64_t count) {
    reduce<float>(g, input, out, count, false);
}
extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_all_reduce_bf16(const __grid_constant__ RmaWorkspace g,
                                                                              const uint8_t* input, uint8_t* out,
                                                                              uint64_t count) {
    reduce<__nv_bfloat16>(g, input, out, count, true);
}
extern "C" __global__ void __launch_bounds__(RMA_THREADS) rma_all_reduce_f32(const __grid_constant__ RmaWorkspace g,
                                                                             const uint8_t* input, uint8_t* out,
                                                                             uint64_t count) {
    reduce<float>(g, input, out, count, true);
}

// ---- local ---------------------------------------------------------------------------------------

// ANCHOR: local_permute
// out[j][i] = in[i][j] for blocks of `block_bytes`: [outer][inner] blocks become
// [inner][outer]. Local memory only. The hierarchical all-gather and reduce-scatter use it to
// turn "by node, then by local index" into "by local index, then by node" and back.
extern "C" __global__ void __launch_bounds__(RMA_THREADS) local_permute(const uint8_t* in, uint8_t* out, uint64_t outer,
                                                                        uint64_t inner, uint64_t block_bytes) {
    for (uint64_t b = blockIdx.x; b < outer * inner; b += gridDim.x) {
        const uint64_t i = b / inner, j = b % inner;
        coll::copy_bytes(out + (j * outer + i) * block_bytes, in + b * block_bytes, 0, block_bytes, threadIdx.x,
                         blockDim.x);
    }
}
// ANCHOR_END: local_permute
