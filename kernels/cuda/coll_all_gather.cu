// Chapter 4: all-gather. Every PE contributes `num_bytes`; afterwards every PE's `out` holds
// PE p's contribution at out[p * num_bytes]. Three algorithms, chosen by size on the host:
// LL (latency), direct (every PE stores into every peer), ring (n - 1 forwarding steps).
#include "coll_exchange.cuh"

using namespace coll;

// input: local [num_bytes]; out: local [n_pes * num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_gather_ll(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out, uint64_t num_bytes) {
    const uint64_t epoch = begin_call(ws);
    exchange_ll(ws, epoch, input, 0, out, num_bytes);
    end_call(ws, epoch);
}

// input: local [num_bytes]; out: symmetric [n_pes * num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_gather_direct(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                  uint64_t num_bytes) {
    const uint64_t epoch = begin_call(ws);
    exchange_direct(ws, epoch, input, 0, out, num_bytes);
    end_call(ws, epoch);
}

// ANCHOR: ring
// The ring: at step s every PE forwards block (me - s) to PE me + 1, so after n - 1 steps
// every block has visited every PE. Each PE sends num_bytes per step instead of
// (n - 1) * num_bytes at once: the same total, but one peer at a time, the shape that suits
// links between neighbours only. Block b of the grid forwards the same pieces (for_each_piece) of
// every block, so it only ever waits for block b of the previous PE (ticket(epoch, s)).
// input: local [num_bytes]; out: symmetric [n_pes * num_bytes].
extern "C" __global__ void __launch_bounds__(COLL_THREADS) coll_all_gather_ring(const __grid_constant__ Workspace ws, const uint8_t* input, uint8_t* out,
                                                uint64_t num_bytes) {
    const uint64_t epoch = begin_call(ws);
    const int me = ws.my_pe, n = ws.n_pes;
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const uint64_t* from_prev = ws.done + prev * MAX_BLOCKS + blockIdx.x;
    bool ok = n == 1 || block_wait_at_least(ws, ws.ready + next, epoch, WAIT_READY, next, epoch);
    if (n == 1) copy_bytes(out + me * num_bytes, input, 0, num_bytes, uint64_t(blockIdx.x) * blockDim.x + threadIdx.x, uint64_t(gridDim.x) * blockDim.x);
    for (int step = 0; ok && step < n - 1; ++step) {
        const int block = (me + n - step) % n;
        if (step > 0) ok = block_wait_at_least(ws, from_prev, ticket(epoch, step), WAIT_DONE, prev, epoch);
        if (!ok) break;
        // Step 0 also places our own block locally, in the same pass over the input.
        uint8_t* dsts[MAX_PES] = {peer(ws, out, next) + block * num_bytes, out + me * num_bytes};
        const uint8_t* srcs[MAX_PES] = {step == 0 ? input : out + block * num_bytes, input};
        for_each_piece(num_bytes, [&](uint64_t begin, uint64_t end) {
            copy_fanout(dsts, srcs, step == 0 ? 2 : 1, begin, end, threadIdx.x, blockDim.x);
        });
        block_signal_done(ws, next, ticket(epoch, step + 1));
    }
    if (ok && n > 1) block_wait_at_least(ws, from_prev, ticket(epoch, n - 1), WAIT_DONE, prev, epoch);
    end_call(ws, epoch);
}
// ANCHOR_END: ring
