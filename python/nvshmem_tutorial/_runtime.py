"""What every call of the package shares: the runtime init() set up, torch on demand, and the
exchange over init()'s process group.

torch is imported inside the functions, never at module level, so that the package imports
on machines without torch (CI, tooling) and fails with a clear message only when a call needs
it.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _native
from ._native import NotInitializedError


class Runtime:
    """What init() learned: the process group the PEs map onto, and this PE's GPU."""

    def __init__(self, group: Any, device: int) -> None:
        self.group = group
        self.device = device


# Set by init() once NVSHMEM is up, cleared by finalize(). One per process, like NVSHMEM.
_current: Optional[Runtime] = None


def current() -> Optional[Runtime]:
    """The runtime of the last init(), or None before init() and after finalize()."""
    return _current


def install(runtime: Optional[Runtime]) -> None:
    """Records the runtime init() built (None: finalize() shut NVSHMEM down)."""
    global _current
    _current = runtime


def import_torch(what: str) -> Any:
    """The torch module, or an ImportError that says which call needed it and how to get it."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"nvshmem_tutorial.{what}() needs PyTorch, which is not installed in this "
            "interpreter. Install a CUDA build of torch (https://pytorch.org/get-started/)"
        ) from error
    return torch


def require_init(what: str) -> Runtime:
    """The current runtime, or a NotInitializedError that says to call init() first."""
    if _current is None or not _native.is_initialized():
        raise NotInitializedError(
            f"nvshmem_tutorial.{what}() needs NVSHMEM, which is not initialised in this "
            "process. Call nvshmem_tutorial.init() first, on every rank, after "
            "torch.distributed.init_process_group()"
        )
    return _current


def gather(payload: Any, runtime: Runtime) -> list:
    """all_gather_object over init()'s group: one entry per rank of it, in rank order."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size(runtime.group)
    dist.all_gather_object(gathered, payload, group=runtime.group)
    return gathered
