"""Chapter 4's collectives on symmetric tensors, enqueued on a torch stream.

Each call checks what torch knows here (CUDA tensors on this PE's GPU, contiguous, dtypes
and element counts that fit the collective) and hands (pointer, size) pairs to Rust, which
checks that every tensor lies in a live symmetric allocation and launches one kernel. Every
PE must make the same calls in the same order with the same sizes. All of them can be
captured in a CUDA graph (``torch.cuda.graph``): the call numbers live on the GPU.

``algorithm=None`` lets the size table of chapter 4 choose; a name (``"one_shot"``,
``"two_shot"``, ``"direct"``, ``"ring"``, ``"scatter_gather"``, ``"scatter_gather_units"``,
``"pull"``, ``"rs_ag"``)
forces one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from . import _native
from ._collective_args import (
    all_gather_args,
    all_reduce_args,
    all_to_all_args,
    all_to_all_v_args,
    broadcast_args,
    prepare,
    reduce_scatter_args,
    run,
)
from ._runtime import require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    from ._checks import StreamLike, Tensor


def sync_all(*, stream: StreamLike = None) -> None:
    """Collective barrier on ``stream``: later work on every PE's stream runs after every PE's
    stream reached this call. Cheaper than ``barrier()`` (one signal each way, no NVSHMEM
    quiet), and like ``nvshmem_sync_all`` it does *not* complete puts still in flight."""
    _, _, handle = prepare("sync_all", stream)
    _native.sync_all(handle)


def all_reduce(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``output[i] = sum over PEs of input[i]``, summed in fp32 in PE order.

    Args:
        output, input: symmetric tensors (``nvshmem_tutorial.empty``), contiguous, same
            dtype (torch.bfloat16 or torch.float32) and number of elements; ``output`` may be
            ``input`` (in place).
        algorithm: ``"one_shot"`` (latency), ``"two_shot"`` (bandwidth), ``"rs_ag"``
            (reduce-scatter then all-gather, two launches: the largest), or None (by size).
        stream: as for ``put``.

    Raises before enqueueing anything: ``InvalidArgumentError`` (dtype, sizes, an algorithm
    that cannot run this size), ``NotSymmetricError``, ``OutOfBoundsError``.
    """
    run(_native.all_reduce, algorithm, all_reduce_args, stream, output, input)


def reduce_scatter(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``output[i] = sum over PEs of input[my_pe * output.numel() + i]``.

    ``input`` holds n_pes() chunks of ``output.numel()`` elements; PE p gets the sums of
    chunk p. Both symmetric, contiguous, same dtype (bf16 or fp32). ``algorithm``:
    ``"one_shot"``, ``"pull"`` or None. Errors as ``all_reduce``.
    """
    run(_native.reduce_scatter, algorithm, reduce_scatter_args, stream, output, input)


def all_gather(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """Every PE's ``input`` into every PE's ``output``, PE p's at elements
    ``p * input.numel() ..``. Symmetric, contiguous, same dtype (any). ``algorithm``:
    ``"one_shot"``, ``"direct"``, ``"ring"`` or None. Errors as ``all_reduce``."""
    run(_native.all_gather, algorithm, all_gather_args, stream, output, input)


def all_to_all(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """Block q of every PE's ``input`` (``input.numel() / n_pes()`` elements) goes to PE q,
    landing at block p of its ``output`` for sender p. Symmetric, contiguous, same dtype and
    numel, divisible by n_pes(). ``algorithm``: ``"one_shot"``, ``"direct"`` or None."""
    run(_native.all_to_all, algorithm, all_to_all_args, stream, output, input)


def broadcast(output: Tensor, input: Tensor, root: int, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``root``'s ``input`` into every PE's ``output`` (``output`` may be ``input``).
    Symmetric, contiguous, same dtype and numel. ``algorithm``: ``"one_shot"``,
    ``"scatter_gather"``, ``"scatter_gather_units"`` or None. Raises ``PeOutOfRangeError`` for a
    root outside 0..n_pes()."""
    run(_native.broadcast, algorithm, broadcast_args, stream, output, input, root)


def all_to_all_v(
    output: Tensor, input: Tensor, in_splits: Tensor, out_splits_offsets: Tensor, *, stream: StreamLike = None
) -> None:
    """all-to-all with uneven splits whose counts exist only on the GPU (the MoE primitive,
    like torch's ``all_to_all_vdev``): rows along dim 0.

    Args:
        output: symmetric tensor ``[out_rows, ...]``: rows from PE 0, then PE 1, ...; must
            hold every row this PE receives.
        input: symmetric tensor ``[in_rows, ...]``, same dtype and row shape: the rows for
            PE 0, then PE 1, ...
        in_splits: int64 tensor ``[n_pes()]`` on this GPU: rows for each PE.
        out_splits_offsets: int64 tensor ``[2, n_pes()]`` on this GPU, written: rows received
            from each PE, and where each PE's rows start in ``output``.

    Counts that do not add up (negative, more rows than ``input`` holds, more than
    ``output`` holds on some PE) are found on the GPU by every PE; the kernel returns early
    and the next collective call (or ``check_collectives()``) raises ``NvshmemError``.
    """
    args, handle = all_to_all_v_args("all_to_all_v", stream, output, input, in_splits, out_splits_offsets)
    _native.all_to_all_v(*args, handle)


def check_collectives() -> None:
    """Raises ``NvshmemError`` with what a collective kernel recorded on the GPU (a wait that
    timed out, naming the PE and the call; all-to-all-v counts that do not add up), if
    anything. Every collective call checks this first; call it after synchronising to learn
    about the last one."""
    require_init("check_collectives")
    _native.check_collectives()
