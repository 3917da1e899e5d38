// Helpers shared by every kernel module.
#pragma once

#include <cstdint>

#include <nvshmem.h>
#include <nvshmemx.h>

// A spin-wait that gives up: every wait in this project is bounded. Returns true when
// `done()` became true, false after `timeout_cycles` of the SM clock (about 1.98 GHz on
// H200: 2e9 cycles ~ 1 s).
template <typename Done>
__device__ __forceinline__ bool wait_bounded(Done done, long long timeout_cycles) {
    const long long start = clock64();
    while (!done()) {
        if (clock64() - start > timeout_cycles) return false;
    }
    return true;
}

// Test data that shows where it came from: word `index` sent by `source_pe` in a run seeded
// with `seed`. A wrong sender, a shifted index and a slot nobody wrote all read differently.
// The host mirror is kernels::pattern_word; keep the two identical.
__host__ __device__ __forceinline__ uint32_t pattern_word(int source_pe, uint64_t index, uint32_t seed) {
    uint32_t x = static_cast<uint32_t>(index) * 0x9E3779B1u ^ (static_cast<uint32_t>(source_pe) + 1u) * 0x85EBCA77u;
    x ^= seed;
    x ^= x >> 15;
    return x * 0x2C1B3C6Du;
}

// ANCHOR: signal_wait_bounded
// nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, expected) with a deadline. On success
// returns 1 with acquire ordering: the data a putmem_signal delivered before raising the signal
// is visible to this thread. On timeout returns 0 and records, in the local u64[4] `error`,
// (1, the PE it waited for, the value it waited for, the value it saw) for the host to report.
__device__ __forceinline__ int signal_wait_bounded(uint64_t* signal, uint64_t expected, long long timeout_cycles,
                                                   int from_pe, uint64_t* error) {
    uint64_t seen = 0;
    const bool arrived = wait_bounded([&] { return (seen = nvshmem_signal_fetch(signal)) >= expected; },
                                      timeout_cycles);
    if (!arrived) {
        error[1] = static_cast<uint64_t>(from_pe);
        error[2] = expected;
        error[3] = seen;
        __threadfence_system();
        error[0] = 1;
        return 0;
    }
    // The fetch is a relaxed (volatile) load; a fence after it makes it an acquire.
    __threadfence_system();
    return 1;
}
// ANCHOR_END: signal_wait_bounded
