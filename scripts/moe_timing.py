"""Timing for scripts/moe_layer.py --bench: calls between CUDA events, each value the slowest
rank's, kept as rows of the CSV, and the overlap line (bound and efficiency)."""

from __future__ import annotations

from typing import Any, List, Tuple

import torch
import torch.distributed as dist


def timed_ms(fn: Any, repeats: int = 10) -> float:
    """Milliseconds per call on the current stream, after 3 warm-ups and a barrier."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    start_event.record()
    for _ in range(repeats):
        fn()
    end_event.record()
    torch.cuda.synchronize()
    return start_event.elapsed_time(end_event) / repeats


# Rows of the --bench CSV (case, quantity, ms): each value the slowest rank's.
BENCH_ROWS: List[Tuple[str, str, float]] = []


def slowest(values: List[float]) -> List[float]:
    """Collective: each value's largest over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def record(case: str, **ms: float) -> List[float]:
    """Keeps each quantity's slowest rank for the CSV and returns the values in that order."""
    values = slowest(list(ms.values()))
    BENCH_ROWS.extend((case, name, v) for name, v in zip(ms, values))
    return values


def overlap_line(what: str, serial: float, overlapped: float, compute: float) -> str:
    """Serial against overlapped beside the bound (comm + compute) / max(comm, compute) and the
    efficiency (serial - overlapped) / min(comm, compute); comm is serial minus the experts."""
    serial, overlapped, compute = record(what, serial_ms=serial, overlapped_ms=overlapped,
                                         compute_ms=compute)
    comm = serial - compute
    head = (f"{what}, DeepSeek-V3 shapes: serial {serial:.2f} ms, overlapped {overlapped:.2f} ms "
            f"({serial / overlapped:.2f}x")
    if comm <= 0.01 * serial:  # the exchanges hide in the noise of the experts' own time
        return f"{head}; experts alone {compute:.2f} ms, no communication left to hide)"
    bound = (comm + compute) / max(comm, compute)
    efficiency = (serial - overlapped) / min(comm, compute)
    return f"{head}; bound {bound:.2f}x, efficiency {efficiency:.0%}; experts alone {compute:.2f} ms)"
