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
