"""Starting and stopping NVSHMEM over torch.distributed, and where this PE stands.

Chapter 1's bootstrap, with torch.distributed as the rendezvous: rank 0's unique id travels
over init()'s process group instead of the Rust examples' TCP rendezvous.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _native, _runtime
from ._native import InvalidArgumentError, NoDeviceError, NvshmemError
from ._runtime import Runtime, gather, import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch.distributed


def library_info() -> Tuple[str, Tuple[int, int, int]]:
    """Loads the NVSHMEM host library and returns ``(path, (major, minor, patch))``.

    Needs no GPU and no torch. Raises ``LibraryError`` (listing every place searched and the
    fix) when libnvshmem_host.so.3 is missing or is not the pinned release.
    """
    return _native.library_info()


def process_group_backend() -> str:
    """The torch.distributed backend for this launch: ``"nccl"``, or ``"gloo"`` when torchrun
    starts more local ranks than there are GPUs (PEs folded onto fewer GPUs, as
    scripts/fold_pes.sh does to run 4 PEs on 2 GPUs): NCCL refuses two ranks on one GPU, and
    this package needs torch.distributed only to carry small host messages (the unique id,
    readiness), which gloo does."""
    import os

    torch = import_torch("process_group_backend")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return "nccl" if local_world <= torch.cuda.device_count() else "gloo"


def init(group: "Optional[torch.distributed.ProcessGroup]" = None) -> None:
    """Collective: initialises NVSHMEM on every rank of ``group`` (default: the whole job).

    Call after ``torch.distributed.init_process_group()`` and ``torch.cuda.set_device()``:
    each rank becomes PE ``group``-rank on ``torch.cuda.current_device()``. Rank 0 of the
    group creates NVSHMEM's unique id and it travels to the others over torch.distributed.

    Idempotent: a second call returns at once. Every rank first checks locally that the
    library loads and a GPU exists, and the verdicts are exchanged before anyone enters
    NVSHMEM's own (blocking) initialisation, so one rank's missing library is an error on
    every rank rather than a hang.

    Raises: ``ImportError`` without torch; ``NvshmemError`` if torch.distributed is not
    initialised; ``NoDeviceError`` without a CUDA device; ``LibraryError`` without the
    NVSHMEM library.
    """
    if _native.is_initialized():
        current = _runtime.current()
        if current is not None and group is not None and group is not current.group:
            raise InvalidArgumentError(
                "NVSHMEM is already initialised with another process group; call "
                "nvshmem_tutorial.finalize() on every rank before initialising with a new one"
            )
        return
    torch = import_torch("init")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise NvshmemError(
            "nvshmem_tutorial.init() bootstraps over torch.distributed, which is not "
            "initialised. Launch with torchrun and call "
            "torch.distributed.init_process_group('nccl') first"
        )
    if not torch.cuda.is_available():
        raise NoDeviceError(
            "torch sees no CUDA device (torch.cuda.is_available() is False): NVSHMEM needs one "
            "GPU per rank. Check the driver, CUDA_VISIBLE_DEVICES, and that torch is a CUDA "
            "build"
        )
    device = torch.cuda.current_device()
    rank = dist.get_rank(group)
    world_size = dist.get_world_size(group)
    runtime = Runtime(group, device)

    # ANCHOR: init_exchange
    # Local readiness, then one exchange that also carries rank 0's unique id.
    try:
        _native.probe_driver()
        _native.library_info()
        status: Tuple[Any, ...] = ("ok", _native.unique_id() if rank == 0 else None)
    except (NvshmemError, InvalidArgumentError) as error:
        status = ("error", type(error).__name__, str(error))
    statuses = gather(status, runtime)
    failures = [(r, s) for r, s in enumerate(statuses) if s[0] == "error"]
    if failures:
        first_rank, (_, kind, message) = failures[0]
        exception = getattr(_native, kind, NvshmemError)
        others = f" (and {len(failures) - 1} more rank(s))" if len(failures) > 1 else ""
        raise exception(f"rank {first_rank}{others} cannot initialise NVSHMEM: {message}")
    unique_id = statuses[0][1]
    _native.init(rank, world_size, device, unique_id)
    # ANCHOR_END: init_exchange
    _runtime.install(runtime)


def finalize() -> None:
    """Collective: frees every symmetric tensor's memory and shuts NVSHMEM down.

    Waits for the GPU first. Symmetric tensors still referenced afterwards point at freed
    memory: drop them before calling this (a warning says how many were still alive). A
    no-op when NVSHMEM is not initialised.
    """
    still_referenced = _native.finalize()
    _runtime.install(None)
    if still_referenced:
        warnings.warn(
            f"nvshmem_tutorial.finalize(): {still_referenced} symmetric tensor(s) or Buffer(s) "
            "were still referenced; their memory has been freed and they must not be used any more",
            RuntimeWarning,
            stacklevel=2,
        )


def is_initialized() -> bool:
    """Whether NVSHMEM is initialised in this process."""
    return _native.is_initialized()


def _topology(what: str) -> Tuple[int, int, int, int, int]:
    """(my_pe, n_pes, node_pe, node_size, device ordinal), once NVSHMEM is up."""
    require_init(what)
    return _native.topology()


def my_pe() -> int:
    """This process's PE number, ``0 <= my_pe() < n_pes()`` (its rank in init()'s group)."""
    return _topology("my_pe")[0]


def n_pes() -> int:
    """Number of PEs in the job (the size of init()'s group)."""
    return _topology("n_pes")[1]


def node_pe() -> int:
    """This PE's number among the PEs of its host (NVSHMEMX_TEAM_NODE)."""
    return _topology("node_pe")[2]


def node_size() -> int:
    """Number of PEs on this host."""
    return _topology("node_size")[3]
