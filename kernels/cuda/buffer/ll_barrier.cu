// The barrier of a low-latency buffer whose ranks span nodes, for clean_low_latency_buffer:
// chapter 4's barrier (coll_sync.cu) reaches the node only, through peer pointers. This one
// crosses nodes with NVSHMEM's signal ops alone, and needs no team and no on-stream
// collective, so it also runs on PEs folded onto one GPU without MPS (limited MPG), where
// NVSHMEM refuses those.
#include "low_latency.cuh"

namespace nvshmem_tutorial {

// ANCHOR: ll_barrier
// words[s] on every rank counts the barriers rank s entered: each rank adds 1 to its word on
// every rank (itself included), then waits until every rank's word on it reaches `target`,
// the barriers it entered itself. Words only grow, and only the signal ops of one rank add to
// a word, so nothing is reset, and clean_low_latency_buffer's zeroing leaves them alone.
__global__ void __launch_bounds__(LL_THREADS) ll_barrier(Workspace ws, LlBarrierArgs a) {
    const LlTopology& topo = a.topo;
    for (int s = threadIdx.x; s < topo.num_ranks; s += blockDim.x) {
        nvshmemx_signal_op(a.words + topo.rank, 1, NVSHMEM_SIGNAL_ADD, s);
    }
    for (int s = threadIdx.x; s < topo.num_ranks; s += blockDim.x) {
        wait_at_least(ws, a.words + s, a.target, WAIT_LL_BARRIER, failure_rank(topo, s), a.target);
    }
}
// ANCHOR_END: ll_barrier

}  // namespace nvshmem_tutorial
