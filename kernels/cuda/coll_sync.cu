// Chapter 4: the signal barrier. Launch: 1 block of 32 threads (any n_pes <= 32).
//
// Every kernel of this chapter already starts by announcing its call number to every peer
// (begin_call). A barrier is that announcement and nothing else: wait until every peer has
// announced this call too. It orders stream work across PEs, but, unlike
// nvshmemx_barrier_all_on_stream, it does not complete puts still in flight: that is
// nvshmem_sync's meaning, hence the name.
#include "coll_common.cuh"

using namespace coll;

// ANCHOR: sync_all
extern "C" __global__ void __launch_bounds__(32) coll_sync_all(const __grid_constant__ Workspace ws) {
    const uint64_t epoch = begin_call(ws);
    block_wait_ready(ws, epoch);
    end_call(ws, epoch);
}
// ANCHOR_END: sync_all
