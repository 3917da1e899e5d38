"""Shared by the chapter scripts (scripts/ch0N_*.py): launch, self-check tally, test data.

Each chapter script mirrors its chapter's Rust example with the Python package, checks its own
results, and ends like the Rust examples: a line `pe <i>: P passed, F failed` per rank, then the
job's total `N passed, M failed` as the last line (scripts/gpu_test.sh looks for it). Exit code
0: all passed, 1: a check failed, 2: an error stopped the run.

Output: torchrun gives every rank the same terminal, and Python's print writes a line's text and
its newline separately, so two ranks printing at once run their lines together. So the
scripts print results through `print_by_pe` (collective: rank 0 prints every rank's lines, in
PE order, each prefixed `pe <i>: `), and what cannot wait for a collective (a failed check, an
error) through `print_now` (this rank's lines, prefixed, in one write).
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable, List, Sequence, Tuple, Union

# NVLink multicast (NVLS) stays off in every layer (see DESIGN.md); set before NCCL/NVSHMEM
# read their environment.
for _name in ("NVSHMEM_DISABLE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")

faulthandler.enable()  # a crash in native code prints the Python stack of every rank

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import nvshmem_tutorial as nv  # noqa: E402


def timeline_modules() -> Tuple[ModuleType, ModuleType]:
    """benchmarks/plot_timeline.py and benchmarks/timeline_trace.py (benchmarks/ is no package:
    it goes on the import path, as when its scripts run)."""
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.append(benchmarks)
    return importlib.import_module("plot_timeline"), importlib.import_module("timeline_trace")


def draw_timelines(traces: dict, prefix: str, classes: Sequence[Tuple[str, str]],
                   header: Sequence[str], tally: "Tally") -> List[str]:
    """Rank 0's figures of the traces `record_steps` wrote (plot_timeline.draw_all), one line
    each. A figure that cannot be drawn, or an "overlapped" one without communication on a
    stream of its own, is a failed check with its reason."""
    pt, tt = timeline_modules()
    try:
        drawn = pt.draw_all(traces, prefix, classes, header=header)
    except Exception as error:  # noqa: BLE001 - a figure that cannot be drawn is a failed check
        tally.check(False, f"timeline: {type(error).__name__}: {error}")
        return [f"timeline not drawn: {error}"]
    lines = [f"timeline {name}: {tt.summary(t)}; wrote {prefix}_{name}.svg and .csv"
             for name, t in drawn.items()]
    t = drawn["overlapped"]
    tally.check(len(t.lanes) >= 2 and tt.busy_us(t, "communication") > 0,
                lambda: "timeline overlapped: no communication on a stream of its own: "
                f"{len(t.lanes)} stream(s), classes {sorted({op.cls for op in t.ops})}")
    return lines


def start() -> float:
    """torch.distributed on LOCAL_RANK's GPU (NCCL, or gloo when ranks share a GPU:
    nv.process_group_backend), then NVSHMEM. Returns init() seconds."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if nv.process_group_backend() == "nccl":
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    started = time.perf_counter()
    nv.init()
    return time.perf_counter() - started


PAIRS_VAR = "NVSHMEM_TUTORIAL_PAIRS"


def pairs_in_a_row(default: int) -> int:
    """How many dispatch/combine pairs a script's "in a row" check makes: `default`, or
    NVSHMEM_TUTORIAL_PAIRS when set (scripts/gpu_test.sh sets it under compute-sanitizer, as it
    passes `--pairs` to the Rust programs, whose runs would otherwise outlast their bounds)."""
    value = os.environ.get(PAIRS_VAR)
    if value is None:
        return default
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{PAIRS_VAR}={value!r} is not a positive integer: unset it, or give a count such as 4")
    return int(value)


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


def gather_rows(t: torch.Tensor) -> list:
    """Collective: every rank's tensor (their rows may differ in number, also be 0), in rank
    order: what the buffer scripts build their torch references from."""
    # gloo (ranks sharing a GPU) gathers host tensors.
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([t.shape[0]], device=device))
    rows = max(1, max(int(s) for s in sizes))
    padded = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=device)
    padded[: t.shape[0]] = t
    out = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(out, padded)
    return [o[: int(s)].to(t.device) for o, s in zip(out, sizes)]


def _prefixed(pe: int, lines: Sequence[str]) -> str:
    return "".join(f"pe {pe}: {line}\n" for text in lines for line in text.splitlines())


def print_now(text: str, *, error: bool = False) -> None:
    """This rank's `text` now, every line prefixed `pe <rank>: `, in one write (so another
    rank's output cannot land inside it). For what must not wait: failures and errors."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    stream = sys.stderr if error else sys.stdout
    stream.flush()
    os.write(stream.fileno(), _prefixed(rank, [text]).encode())


def print_by_pe(lines: Union[str, Sequence[str], None]) -> None:
    """Collective: every rank passes its lines (a string, a list, or None for none); rank 0
    prints all of them in PE order, each prefixed `pe <i>: `. Every rank must call it at the
    same point, also a rank with nothing to say."""
    mine = [lines] if isinstance(lines, str) else list(lines or [])
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        print("".join(_prefixed(pe, rows) for pe, rows in enumerate(everyone)), end="", flush=True)


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
            print_now(f"FAILED: {text}", error=True)
        return ok

    def expect_error(self, call: Callable[[], object], error: type, text: str) -> None:
        """Counts a pass when `call` raises `error` with `text` in its message."""
        try:
            call()
        except error as raised:
            self.check(text in str(raised), f"{error.__name__} without {text!r}: {raised}")
            return
        except Exception as other:  # noqa: BLE001 - reported as a failed check
            self.check(False, f"expected {error.__name__}, got {type(other).__name__}: {other}")
            return
        self.check(False, f"expected {error.__name__} ({text!r}), nothing was raised")

    def finish(self) -> bool:
        """Collective: every rank's line, then the job's total as the last line of the job."""
        rows: list = [None] * dist.get_world_size()
        dist.all_gather_object(rows, (self.passed, self.failed))
        print_by_pe(f"{self.passed} passed, {self.failed} failed")
        passed = sum(r[0] for r in rows)
        # A rank that checked nothing counts as a failure, not as silence.
        failed = sum(r[1] for r in rows) + sum(1 for r in rows if r[0] + r[1] == 0)
        if dist.get_rank() == 0:
            print(f"{passed} passed, {failed} failed", flush=True)
        return failed == 0


def main(program: str, run: Callable[[], bool]) -> None:
    """Runs `run`, shuts down in order, exits 0 (all passed), 1 (a check failed), 2 (error)."""
    try:
        ok = run()
        code = 0 if ok else 1
    except Exception:  # noqa: BLE001 - every error ends the run with its message
        print_now(f"{program}: error:\n{traceback.format_exc()}", error=True)
        sys.exit(2)
    nv.finalize()
    dist.destroy_process_group()
    sys.exit(code)
