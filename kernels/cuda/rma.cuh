// Chapter 5: the protocol of an RMA group, PEs that reach each other only through NVSHMEM's
// RMA calls (the PEs of a rail, one per node; or every PE, for the flat algorithms). It is
// chapter 4's protocol (coll_common.cuh) with every peer access replaced by a call that works
// across nodes, over InfiniBand on a cluster and over NVLink on one host:
//
// MEMBERS. Member i of a group is world PE start + i * stride, nvshmem_team_split_strided's
// triple. Nothing here computes a pointer into a member's memory: across nodes there is none.
//
// EPOCHS. As in chapter 4: the group numbers its calls in local state, one slot per block, and
// every flag of call e carries e. Nothing is reset between calls.
//
// ANNOUNCE. Block 0 adds 1 to ready[me] on every member with nvshmemx_signal_op(SIGNAL_ADD):
// "I have entered call e", which by stream order also says "I finished call e - 1, so what I
// received then has been read, and my outputs for call e are free". Adds commute, so the
// announcements need no order among themselves.
//
// DATA. Block b sends its slice of a part to member j with one put-with-signal
// (nvshmemx_putmem_signal_nbi_block): NVSHMEM sets done[step][me][b] on j to ticket(e, step)
// only once the slice has landed there. Each step of a call has signal words of its own, so
// the steps of one call never race for a word and need no nvshmem_fence between them; and a
// member sends call e + 1 only after the receiver announced e + 1, which it does after it saw
// call e's ticket, so one word never has two values in flight.
//
// WAITS. nvshmem_signal_fetch (a volatile load) in a bounded loop, then a system fence: the
// acquire that makes visible what the signal announced. A wait that gives up records the
// member's world PE and what it waited for (record_failure, coll_common.cuh).
//
// END. The puts are non-blocking: a source may still be read after the last instruction that
// named it. Every block ends with nvshmem_quiet, so once the call is over the caller may
// overwrite its input.
#pragma once

#include "coll_common.cuh"

namespace rma {

using namespace contract;
using namespace ptx;
using coll::Element;
using coll::end_call;
using coll::failed;
using coll::part_bounds;
using coll::record_failure;
using coll::ticket;

// The world PE of member `member`.
__device__ __forceinline__ int member_pe(const RmaWorkspace& g, int member) { return g.start + member * g.stride; }

// done[step][sender][block], this PE's copy (symmetric: the same offset names it on any member).
__device__ __forceinline__ uint64_t* done_word(const RmaWorkspace& g, int step, int sender, int block) {
    return g.done + (static_cast<uint64_t>(step) * MAX_GROUP + sender) * MAX_RMA_BLOCKS + block;
}

// ANCHOR: rma_begin
// Announces this call to every member (block 0, one signal add per member) and returns its
// epoch. The add is an atomic NVSHMEM performs at the target: across nodes, the NIC does it.
__device__ __forceinline__ uint64_t begin_call(const RmaWorkspace& g) {
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < g.size; i += blockDim.x) {
            nvshmemx_signal_op(g.ready + g.me, 1, NVSHMEM_SIGNAL_ADD, member_pe(g, i));
        }
    }
    return ld_volatile(g.state + STATE_EPOCHS + blockIdx.x) + 1;
}
// ANCHOR_END: rma_begin

// ANCHOR: rma_wait
// Waits until *signal >= target, a word that `member` raises; false when this PE has failed
// or after the timeout, which it records naming the member's world PE.
__device__ __forceinline__ bool wait_signal(const RmaWorkspace& g, uint64_t* signal, uint64_t target, Failure what,
                                            int member, uint64_t epoch) {
    uint64_t seen = nvshmem_signal_fetch(signal);
    if (seen < target) {
        const long long start = clock64();
        while ((seen = nvshmem_signal_fetch(signal)) < target) {
            if (failed(g)) return false;
            if (clock64() - start > g.timeout_cycles) {
                record_failure(g, what, member_pe(g, member), target, seen, epoch);
                return false;
            }
        }
    }
    __threadfence_system();  // the fetch is a volatile load: the fence makes it an acquire
    return true;
}

// Thread t waits for member t's word (every member, or only `only`); the block learns whether
// all of them came. Block-collective.
template <typename Word>
__device__ __forceinline__ bool block_wait(const RmaWorkspace& g, Word word_of, uint64_t target, Failure what,
                                           uint64_t epoch, int only = -1) {
    bool ok = true;
    for (int t = threadIdx.x; t < g.size; t += blockDim.x) {
        if (only < 0 || t == only) ok = wait_signal(g, word_of(t), target, what, t, epoch) && ok;
    }
    return __syncthreads_and(ok);
}
// ANCHOR_END: rma_wait

// Every member announced call `epoch`: its outputs and landing space are free.
__device__ __forceinline__ bool block_wait_ready(const RmaWorkspace& g, uint64_t epoch) {
    return block_wait(g, [&](int t) { return g.ready + t; }, epoch, WAIT_REMOTE_READY, epoch);
}

// Every member's (or `only`'s) block of our index sent its step `step` of call `epoch`.
__device__ __forceinline__ bool block_wait_done(const RmaWorkspace& g, int step, uint64_t epoch, int only = -1) {
    auto word = [&](int t) { return done_word(g, step, t, blockIdx.x); };
    return block_wait(g, word, ticket(epoch, step), WAIT_REMOTE_DATA, epoch, only);
}

// ANCHOR: rma_put
// Bytes [begin, end) of `src` to `dst` on `member` (both symmetric addresses), then
// done[step][me][block] on the member set to ticket(epoch, step) once they have landed: one
// put-with-signal, non-blocking. An empty range sends the signal alone. Block-collective.
__device__ __forceinline__ void put_signal(const RmaWorkspace& g, uint8_t* dst, const uint8_t* src, uint64_t begin,
                                           uint64_t end, int step, uint64_t epoch, int member) {
    uint64_t* signal = done_word(g, step, g.me, blockIdx.x);
    const int pe = member_pe(g, member);
    if (end > begin) {
        nvshmemx_putmem_signal_nbi_block(dst + begin, src + begin, end - begin, signal, ticket(epoch, step),
                                         NVSHMEM_SIGNAL_SET, pe);
    } else if (threadIdx.x == 0) {
        nvshmemx_signal_op(signal, ticket(epoch, step), NVSHMEM_SIGNAL_SET, pe);
    }
}
// ANCHOR_END: rma_put

// Completes this block's puts (its sources may be reused after the kernel), then advances the
// epoch as chapter 4's calls do.
__device__ __forceinline__ void finish_call(const RmaWorkspace& g, uint64_t epoch) {
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
    __syncthreads();
    end_call(g, epoch);
}

// This block's contiguous slice of a part of `num_bytes` (16-byte rounded): one put per member.
__device__ __forceinline__ void block_slice(uint64_t num_bytes, uint64_t* begin, uint64_t* end) {
    part_bounds(num_bytes, gridDim.x, blockIdx.x, begin, end);
}

// ---- all-to-all-v -------------------------------------------------------------------------------

// A row of counts whose sender found its splits invalid (negative, or more rows than its input).
constexpr uint64_t BAD_ROW = ~0ull;

// counts[sender] of the group: one word per destination PE of the job.
__device__ __forceinline__ uint64_t* counts_row(const RmaWorkspace& g, int sender) {
    return g.counts + static_cast<uint64_t>(sender) * MAX_GROUP;
}

// Bytes of the landing slot each sender of a hierarchical all-to-all-v owns in a receiver's
// scratch (one slot per member, 16-byte aligned). The host sizes calls by the same formula.
__device__ __forceinline__ uint64_t a2av_slot_bytes(const RmaWorkspace& g) {
    return g.scratch_bytes / g.size / 16 * 16;
}

}  // namespace rma
