"""GPU suite: run under torchrun, one pytest process per GPU, e.g.

    python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m pytest -p no:cacheprovider python/tests/gpu -q

(no cache: two processes writing .pytest_cache at once race). Every line of pytest's report
starts with `pe <rank>: ` (see `pytest_configure`), so the ranks' reports, which share
torchrun's terminal, stay apart.

Every rank collects and runs the same tests in the same order, so a test may call collective
operations (init, empty, barrier, collect) as long as every rank reaches them: assertions
come after the collectives of a test, never between them. Outside torchrun the suite skips.
"""

from __future__ import annotations

import io
import os
import sys

import pytest


class _RankPrefixedStdout(io.TextIOBase):
    """Holds pytest's report back until a line is complete, then writes it prefixed with
    `pe <rank>: ` in one write. Without it the ranks' progress dots (written one at a time)
    interleave into one unreadable line on torchrun's shared terminal."""

    def __init__(self, stream: io.TextIOBase, rank: str) -> None:
        super().__init__()
        self._stream = stream
        self._prefix = f"pe {rank}: "
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        if lines:
            block = "".join(f"{self._prefix}{line}\n" for line in lines)
            self._stream.flush()
            os.write(self._stream.fileno(), block.encode(errors="replace"))
        return len(text)

    def flush(self) -> None:  # a partial line waits for its newline (see the class docs)
        self._stream.flush()

    def isatty(self) -> bool:
        return False  # no colour codes or cursor tricks in a shared, prefixed stream

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")

    def close(self) -> None:
        if self._pending:
            self.write("\n")
        super().close()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before the terminal reporter takes sys.stdout: give it the rank-prefixing stream."""
    if "RANK" in os.environ:
        sys.stdout = _RankPrefixedStdout(sys.stdout, os.environ["RANK"])

if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
    pytest.skip(
        "GPU tests run under torchrun (RANK/LOCAL_RANK unset)", allow_module_level=True
    )

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session", autouse=True)
def world():
    """torch.distributed (NCCL, or gloo when ranks share a GPU) and NVSHMEM on this rank's
    GPU, for the whole session."""
    import torch.distributed as dist

    import nvshmem_tutorial as nv

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        if nv.process_group_backend() == "nccl":
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        else:
            dist.init_process_group("gloo")
    nv.init()
    yield nv
    if nv.is_initialized():
        nv.finalize()
    dist.barrier()
    dist.destroy_process_group()
