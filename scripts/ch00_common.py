"""Shared by the chapter scripts (scripts/ch0N_*.py): launch, self-check tally, test data.

Each chapter script mirrors its chapter's Rust example with the Python package, checks its own
results, and ends like the Rust examples: every rank prints `pe <i>: P passed, F failed`, then
rank 0 prints the job's total `N passed, M failed` as its last line (scripts/gpu_test.sh looks
for it). Exit code 0: all passed, 1: a check failed, 2: an error stopped the run.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
import traceback
from typing import Callable

# NVLink multicast (NVLS) stays off in every layer (see DESIGN.md); set before NCCL/NVSHMEM
# read their environment.
for _name in ("NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")

faulthandler.enable()  # a crash in native code prints the Python stack of every rank

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import nvshmem_tutorial as nv  # noqa: E402


def start() -> float:
    """torch.distributed over NCCL on LOCAL_RANK's GPU, then NVSHMEM. Returns init() seconds."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    started = time.perf_counter()
    nv.init()
    return time.perf_counter() - started


def job_seed() -> int:
    """A random 32-bit number every rank shares (rank 0 draws it): sender and receiver derive
    the same test data without sending it, and data left from another run cannot pass."""
    box = [int.from_bytes(os.urandom(4), "little") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def pattern_words(source_pe: int, num_words: int, seed: int) -> torch.Tensor:
    """int32 [num_words] on the current GPU: word i sent by `source_pe` in a run seeded with
    `seed`. The same function as kernels::pattern_word / common.cuh's pattern_word."""
    mask = 0xFFFFFFFF
    i = torch.arange(num_words, device="cuda", dtype=torch.int64)
    x = (i * 0x9E3779B1) & mask
    x ^= ((source_pe + 1) * 0x85EBCA77) & mask
    x ^= seed & mask
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & mask
    return torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)


class Tally:
    """Checks counted on this rank; `finish` prints the job's total on rank 0."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, ok: bool, what: Callable[[], str] | str = "") -> bool:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            text = what() if callable(what) else what
            print(f"pe {dist.get_rank()}: FAILED: {text}", file=sys.stderr, flush=True)
        return ok

    def expect_error(self, call: Callable[[], object], error: type, text: str) -> None:
        """Counts a pass when `call` raises `error` with `text` in its message."""
        try:
            call()
        except error as e:
            self.check(text in str(e), lambda: f"{error.__name__} without {text!r}: {e}")
            return
        except Exception as e:  # noqa: BLE001 - reported as a failed check
            self.check(False, lambda: f"expected {error.__name__}, got {type(e).__name__}: {e}")
            return
        self.check(False, f"expected {error.__name__} ({text!r}), nothing was raised")

    def finish(self) -> bool:
        """Collective: every rank's line, then rank 0's total as the last line of the job."""
        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, (self.passed, self.failed))
        print(f"pe {dist.get_rank()}: {self.passed} passed, {self.failed} failed", flush=True)
        dist.barrier()
        passed = sum(r[0] for r in rows)
        # A rank that checked nothing counts as a failure, not as silence.
        failed = sum(r[1] for r in rows) + sum(1 for r in rows if r[0] + r[1] == 0)
        if dist.get_rank() == 0:
            time.sleep(0.2)  # let the other ranks' lines reach torchrun's output first
            print(f"{passed} passed, {failed} failed", flush=True)
        return failed == 0


def main(program: str, run: Callable[[], bool]) -> None:
    """Runs `run`, shuts down in order, exits 0 (all passed), 1 (a check failed), 2 (error)."""
    try:
        ok = run()
        code = 0 if ok else 1
    except Exception:  # noqa: BLE001 - every error ends the run with its message
        print(f"{program}: error on rank {os.environ.get('RANK', '?')}:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(2)
    nv.finalize()
    dist.destroy_process_group()
    sys.exit(code)
