"""Chapter 5's collectives across nodes on symmetric tensors, enqueued on a torch stream.

The job is seen as nodes of G consecutive PEs (``inter_node_layout()``): G is torchrun's
LOCAL_WORLD_SIZE (else NVSHMEM's node team), smaller when ``NVSHMEM_TUTORIAL_NODE_PES`` asks
(virtual nodes: one host runs the code paths of several nodes). Each call runs one of three
ways, named by ``method``:

- ``"hierarchical"`` (the default): chapter 4's kernels inside a node, NVSHMEM's RMA calls
  (put-with-signal) across nodes, one PE per node on each rail;
- ``"nvshmem_teams"``: the same plan on NVSHMEM's own team collectives over the node and rail
  teams (bf16 reductions only, no all-to-all): the baseline;
- ``"flat"``: every PE with every PE through NVSHMEM's RMA calls, as if there were no nodes.

Hierarchical and nvshmem_teams sums add each node's PEs first (local order), then the nodes
(node order); flat sums add the PEs in PE order; both in fp32. In bf16 the hierarchical sum
rounds twice (once per node, once more), so its result may differ from the flat one.

Each call checks what torch knows here (CUDA tensors on this PE's GPU, contiguous, dtypes and
element counts that fit the collective) and hands (pointer, size) pairs to Rust, which checks
that every tensor lies in a live symmetric allocation and that output and input do not
overlap, then runs the chapter's call. Every PE must make the same calls in the same order with
the same sizes and method. The first call makes the topology (collective: NVSHMEM's team
split and the topology's symmetric memory): make it outside CUDA graph capture; later calls
can be captured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from . import _native
from ._collective_args import (
    all_gather_args,
    all_reduce_args,
    all_to_all_args,
    all_to_all_v_args,
    broadcast_args,
    reduce_scatter_args,
    run,
)
from ._native import InvalidArgumentError
from ._runtime import require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    from ._checks import StreamLike, Tensor
    from ._collective_args import Args

INTER_NODE_METHODS = _native.INTER_NODE_METHODS
"""The names ``method`` takes: ``("hierarchical", "nvshmem_teams", "flat")``."""


class InterNodeLayout(NamedTuple):
    """The job as nodes: ``num_nodes`` nodes of ``node_pes`` PEs (``n_pes`` in all), and this
    PE's ``node`` and ``local`` index in it (PE p is local p mod node_pes of node
    p // node_pes; the rail of local index l is PE l of every node)."""

    n_pes: int
    node_pes: int
    num_nodes: int
    node: int
    local: int


def _method(what: str, method: Any) -> str:
    """A name from INTER_NODE_METHODS, checked before anything else (needs neither NVSHMEM nor torch)."""
    if not isinstance(method, str) or method not in INTER_NODE_METHODS:
        raise InvalidArgumentError(
            f"{what}: method={method!r} is not one of " + ", ".join(repr(m) for m in INTER_NODE_METHODS)
        )
    return method


def _run(function: Callable[..., None], method: Any, args_of: Callable[..., Args], stream: StreamLike, *tensors: Any) -> None:
    """``run`` with ``method``, checked before anything else."""
    run(function, _method(function.__name__, method), args_of, stream, *tensors)


def inter_node_layout() -> InterNodeLayout:
    """The topology's layout: the one the first inter-node call made, else the one it would
    make now. Not collective. Raises ``InvalidArgumentError`` when the environment names a node
    size that does not fit the job (``NVSHMEM_TUTORIAL_NODE_PES`` must divide the node)."""
    require_init("inter_node_layout")
    return InterNodeLayout(*_native.inter_node_layout())


def inter_node_all_reduce(
    output: Tensor, input: Tensor, *, method: str = "hierarchical", stream: StreamLike = None
) -> None:
    """``output[i] = sum over PEs of input[i]``, summed in fp32 in the method's order (module
    docstring).

    Args:
        output, input: symmetric tensors (``nvshmem_tutorial.empty``), contiguous, same dtype
            (torch.bfloat16 or torch.float32; ``"nvshmem_teams"`` takes bfloat16 only) and
            number of elements; ``output`` may be ``input`` (in place), not a part of it.
        method: ``"hierarchical"``, ``"nvshmem_teams"`` or ``"flat"``.
        stream: as for ``put``.

    Raises before enqueueing anything: ``InvalidArgumentError`` (method, dtype, sizes,
    overlap, a call larger than the topology's staging), ``NotSymmetricError``,
    ``OutOfBoundsError``.
    """
    _run(_native.inter_node_all_reduce, method, all_reduce_args, stream, output, input)


def inter_node_reduce_scatter(
    output: Tensor, input: Tensor, *, method: str = "hierarchical", stream: StreamLike = None
) -> None:
    """``output[i] = sum over PEs of input[my_pe * output.numel() + i]`` (orders as
    ``inter_node_all_reduce``).

    ``input`` holds n_pes() chunks of ``output.numel()`` elements; PE p gets the sums of chunk
    p. Both symmetric, contiguous, distinct, same dtype (bf16 or fp32). Errors as
    ``inter_node_all_reduce``.
    """
    _run(_native.inter_node_reduce_scatter, method, reduce_scatter_args, stream, output, input)


def inter_node_all_gather(
    output: Tensor, input: Tensor, *, method: str = "hierarchical", stream: StreamLike = None
) -> None:
    """Every PE's ``input`` into every PE's ``output``, PE p's at elements
    ``p * input.numel() ..``. Hierarchical: across the rail first, then inside the node, then
    into PE order. Symmetric, contiguous, distinct, same dtype (any). Errors as
    ``inter_node_all_reduce``."""
    _run(_native.inter_node_all_gather, method, all_gather_args, stream, output, input)


def inter_node_broadcast(
    output: Tensor, input: Tensor, root: int, *, method: str = "hierarchical", stream: StreamLike = None
) -> None:
    """``root``'s ``input`` into every PE's ``output``. Hierarchical: across the root's rail
    (one put per node), then inside every node. Symmetric, contiguous, distinct, same dtype and
    numel. Raises ``PeOutOfRangeError`` for a root outside 0..n_pes(); otherwise as
    ``inter_node_all_reduce``."""
    _run(_native.inter_node_broadcast, method, broadcast_args, stream, output, input, root)


def inter_node_all_to_all(
    output: Tensor, input: Tensor, *, method: str = "hierarchical", stream: StreamLike = None
) -> None:
    """Block q of every PE's ``input`` (``input.numel() / n_pes()`` elements) goes to PE q,
    landing at block p of its ``output`` for sender p. Hierarchical: the all-to-all-v of one
    block per PE (each node's blocks cross once). ``"hierarchical"`` or ``"flat"``.
    Symmetric, contiguous, distinct, same dtype and numel, divisible by n_pes()."""
    _run(_native.inter_node_all_to_all, method, all_to_all_args, stream, output, input)


def inter_node_all_to_all_v(
    output: Tensor,
    input: Tensor,
    in_splits: Tensor,
    out_splits_offsets: Tensor,
    *,
    method: str = "hierarchical",
    stream: StreamLike = None,
) -> None:
    """all-to-all with uneven splits whose counts exist only on the GPU, rows along dim 0
    (``all_to_all_v``'s arguments). Hierarchical: each PE's rows for a node cross once, to its
    rail partner there, which forwards them inside the node. ``"hierarchical"`` or ``"flat"``.

    Args:
        output: symmetric tensor ``[out_rows, ...]``: rows from PE 0, then PE 1, ...; must
            hold every row this PE receives.
        input: symmetric tensor ``[in_rows, ...]``, distinct from output, same dtype and row
            shape, the same in_rows on every PE: the rows for PE 0, then PE 1, ...
        in_splits: int64 tensor ``[n_pes()]`` on this GPU: rows for each PE.
        out_splits_offsets: int64 tensor ``[2, n_pes()]`` on this GPU, written: rows received
            from each PE, and where each PE's rows start in ``output``.

    Counts that do not add up are found on the GPU by every PE; the next inter-node call (or
    ``check_inter_node()``) raises ``NvshmemError``.
    """
    what = "inter_node_all_to_all_v"
    method = _method(what, method)
    args, handle = all_to_all_v_args(what, stream, output, input, in_splits, out_splits_offsets)
    _native.inter_node_all_to_all_v(*args, method, handle)


def check_inter_node() -> None:
    """Raises ``NvshmemError`` with what a kernel of the topology recorded on the GPU (a wait
    across nodes that timed out, naming both PEs by node and local index; all-to-all-v counts
    that do not add up), if anything. Every inter-node call checks this first; call it after
    synchronising to learn about the last one. After such a failure the topology is unusable
    until ``finalize()``."""
    require_init("check_inter_node")
    _native.check_inter_node()
