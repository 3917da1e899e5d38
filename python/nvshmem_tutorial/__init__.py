"""NVSHMEM symmetric tensors for PyTorch programs launched by torchrun.

A thin front over the tutorial's Rust crates (``nvshmem_tutorial._native``): chapter 1
bootstraps NVSHMEM, chapter 2 owns the symmetric allocations and checks every range, PE and
pointer. This package only adapts them to torch: tensors, devices, streams, process groups.

Typical use (every rank runs the same code)::

    import os, torch, torch.distributed as dist
    import nvshmem_tutorial as nv

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    nv.init()                                   # NVSHMEM on torch.cuda.current_device()
    x = nv.empty((4096,), torch.bfloat16)       # symmetric: same allocation on every PE
    src = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    nv.put(x, src, pe=(nv.my_pe() + 1) % nv.n_pes())   # on torch's current stream
    nv.barrier()                                # puts complete, every PE past this point
    ...
    nv.finalize()

Between two PEs, a put can carry a signal instead of waiting for every PE at a barrier::

    flags = nv.zeros((1,), torch.uint64)        # symmetric signal word(s)
    nv.barrier()                                # every PE's flags are zero
    nv.put_signal(x, src, peer, flags[0], 1)    # data, then the peer's flag := 1
    nv.wait_signal(flags[0], 1)                 # our stream waits for the peer's flag >= 1
    y = x * 2                                   # sees the peer's data; no host sync

(the wait has no timeout: see ``wait_signal``).

Importing the package needs neither torch nor a GPU; the calls that do raise clear errors
(``NotInitializedError``, ``NoDeviceError``, ``ImportError``) when they are missing.

Where things are: ``_bootstrap`` (init, finalize, where this PE stands), ``_tensors``
(symmetric tensors, peer views, freeing), ``_transfers`` (put/get, barrier, quiet),
``_signals`` (put_signal, signal_op, wait_signal), ``_collectives`` (chapter 4: all_reduce,
reduce_scatter, all_gather, all_to_all, all_to_all_v, broadcast, sync_all), ``_inter_node``
(chapter 5: the same collectives across nodes, ``inter_node_*``, each ``method="hierarchical"``,
``"nvshmem_teams"`` or ``"flat"``, and ``inter_node_layout``); ``_checks`` and ``_runtime`` hold
what they share, ``_collective_args`` the tensor checks of both chapters' collectives. The Rust
side (python/src) is split the same way.

Freeing rule: ``nvshmem_free`` is collective, so a symmetric tensor whose last reference dies
is only *released*; its memory is returned at the next collective point (``empty()``,
``collect()`` or ``finalize()``) once every rank has released it too.
"""

from __future__ import annotations

import os


def _point_nvshmem_home_at_the_wheel() -> None:
    """Sets NVSHMEM_HOME to the nvidia-nvshmem-cu13 wheel when the variable is unset.

    CUDA 13 builds of torch ship that wheel; pointing the loader at it means we open the very
    library torch would, instead of whichever copy the system search finds first. Runs before
    the native module has loaded anything (it loads the library lazily).
    """
    if os.environ.get("NVSHMEM_HOME"):
        return
    try:
        import nvidia.nvshmem as wheel  # namespace package: cheap, no library is loaded
    except ImportError:
        return
    for folder in list(getattr(wheel, "__path__", [])):
        if os.path.exists(os.path.join(folder, "lib", "libnvshmem_host.so.3")):
            os.environ["NVSHMEM_HOME"] = folder
            return


_point_nvshmem_home_at_the_wheel()

from . import _native  # noqa: E402
from ._bootstrap import (  # noqa: E402
    finalize,
    init,
    is_initialized,
    library_info,
    my_pe,
    n_pes,
    node_pe,
    node_size,
    process_group_backend,
)
from ._native import (  # noqa: E402
    InvalidArgumentError,
    LibraryError,
    NoDeviceError,
    NotInitializedError,
    NotSymmetricError,
    NvshmemError,
    OutOfBoundsError,
    PeOutOfRangeError,
)

from ._collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    all_to_all,
    all_to_all_v,
    broadcast,
    check_collectives,
    reduce_scatter,
    sync_all,
)
from ._inter_node import (  # noqa: E402
    INTER_NODE_METHODS,
    InterNodeLayout,
    check_inter_node,
    inter_node_all_gather,
    inter_node_all_reduce,
    inter_node_all_to_all,
    inter_node_all_to_all_v,
    inter_node_broadcast,
    inter_node_layout,
    inter_node_reduce_scatter,
)
from ._signals import put_signal, signal_op, wait_signal  # noqa: E402
from ._tensors import (  # noqa: E402
    SUPPORTED_DTYPES,
    collect,
    empty,
    heap_usage,
    is_symmetric,
    peer_view,
    zeros,
)
from ._transfers import barrier, get, get_nbi, put, put_nbi, quiet  # noqa: E402
__version__: str = _native.__version__

__all__ = [
    "process_group_backend",
    "SUPPORTED_DTYPES",
    "INTER_NODE_METHODS",
    "InterNodeLayout",
    "InvalidArgumentError",
    "LibraryError",
    "NoDeviceError",
    "NotInitializedError",
    "NotSymmetricError",
    "NvshmemError",
    "OutOfBoundsError",
    "PeOutOfRangeError",
    "__version__",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "all_to_all_v",
    "barrier",
    "broadcast",
    "check_collectives",
    "check_inter_node",
    "collect",
    "empty",
    "finalize",
    "get",
    "get_nbi",
    "heap_usage",
    "init",
    "inter_node_all_gather",
    "inter_node_all_reduce",
    "inter_node_all_to_all",
    "inter_node_all_to_all_v",
    "inter_node_broadcast",
    "inter_node_layout",
    "inter_node_reduce_scatter",
    "is_initialized",
    "is_symmetric",
    "library_info",
    "my_pe",
    "n_pes",
    "node_pe",
    "node_size",
    "peer_view",
    "put",
    "put_nbi",
    "put_signal",
    "quiet",
    "reduce_scatter",
    "signal_op",
    "sync_all",
    "wait_signal",
    "zeros",
]
