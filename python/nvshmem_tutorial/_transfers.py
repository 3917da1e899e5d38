"""One-sided transfers and their completion, enqueued on a torch stream.

``put``/``get`` (and their ``_nbi`` forms) copy between this PE's GPU and a peer's copy of a
symmetric tensor; ``barrier`` and ``quiet`` complete them. Each call is one NVSHMEM
on-stream operation (``nvshmemx_*_on_stream``), ordered with the torch kernels around it on
the same stream, so no host synchronisation is needed in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _native
from ._checks import check_copy_pair, check_pe, keep_local_alive, num_bytes, stream_handle
from ._runtime import import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    from ._checks import StreamLike, Tensor


def _one_sided(
    what: str, dst: Tensor, src: Tensor, pe: int, stream: StreamLike, nbi: bool
) -> None:
    """Checks and enqueues one put or get; `what` names the public call for the errors."""
    runtime = require_init(what)
    torch = import_torch(what)
    check_copy_pair(torch, what, dst, src, runtime)
    pe = check_pe(pe)
    handle = stream_handle(torch, stream, runtime)
    length = num_bytes(dst)
    if what.startswith("put"):
        _native.put(dst.data_ptr(), src.data_ptr(), length, pe, handle, nbi)
        local = src
    else:
        _native.get(dst.data_ptr(), src.data_ptr(), length, pe, handle, nbi)
        local = dst
    keep_local_alive(torch, stream, local)


def put(dst: Tensor, src: Tensor, pe: int, *, stream: StreamLike = None, nbi: bool = False) -> None:
    """Copies ``src`` into ``pe``'s copy of ``dst``, enqueued on ``stream``.

    Args:
        dst: symmetric tensor (from ``empty``, or a contiguous slice of one), contiguous, on
            this PE's GPU; any supported dtype and shape. Written on ``pe``, not here.
        src: tensor on this PE's GPU (symmetric or not), contiguous, same dtype and shape.
        pe: destination PE, 0 <= pe < n_pes() (may be this PE).
        stream: torch.cuda.Stream of this GPU, a raw ``cudaStream_t`` int, or None for
            torch's current stream. The copy runs after the work already on it, so no host
            synchronisation is needed between a kernel that fills ``src`` and the put.
        nbi: non-blocking: the stream does not wait for local completion; ``src`` may not be
            changed until ``quiet()`` or ``barrier()`` on the stream.

    The data is visible to ``pe`` after a ``barrier()`` (which completes puts).
    Raises before enqueueing anything: ``InvalidArgumentError`` (CPU tensor, wrong device,
    dtype/shape mismatch, not contiguous), ``NotSymmetricError``, ``OutOfBoundsError``,
    ``PeOutOfRangeError``, ``NotInitializedError``.
    """
    _one_sided("put", dst, src, pe, stream, nbi)


def put_nbi(dst: Tensor, src: Tensor, pe: int, *, stream: StreamLike = None) -> None:
    """``put(dst, src, pe, stream=stream, nbi=True)``; same arguments and errors."""
    _one_sided("put_nbi", dst, src, pe, stream, True)


def get(dst: Tensor, src: Tensor, pe: int, *, stream: StreamLike = None, nbi: bool = False) -> None:
    """Copies ``pe``'s copy of ``src`` into the local ``dst``, enqueued on ``stream``.

    Args:
        dst: tensor on this PE's GPU (symmetric or not), contiguous; receives the data.
        src: symmetric tensor (from ``empty``, or a contiguous slice of one), contiguous, on
            this PE's GPU, same dtype and shape as ``dst``; read on ``pe``.
        pe: source PE, 0 <= pe < n_pes().
        stream: as for ``put``; later work on the stream sees ``dst`` filled (with ``nbi``,
            only after ``quiet()``/``barrier()``).
        nbi: non-blocking: ``dst`` is complete only after ``quiet()`` on the stream.

    Raises the same errors as ``put``, before enqueueing anything.
    """
    _one_sided("get", dst, src, pe, stream, nbi)


def get_nbi(dst: Tensor, src: Tensor, pe: int, *, stream: StreamLike = None) -> None:
    """``get(dst, src, pe, stream=stream, nbi=True)``; same arguments and errors."""
    _one_sided("get_nbi", dst, src, pe, stream, True)


def barrier(*, stream: "StreamLike" = None) -> None:
    """Collective, enqueued on ``stream``: completes this PE's puts, then waits for all PEs.

    Work enqueued on the stream after it sees every PE's puts (and peer-view stores) issued
    before their barrier. The host does not block. ``stream`` as for ``put``.
    """
    runtime = require_init("barrier")
    torch = import_torch("barrier")
    _native.barrier(stream_handle(torch, stream, runtime))


def quiet(*, stream: "StreamLike" = None) -> None:
    """Enqueued on ``stream``: later work on it runs after this PE's puts/gets on it complete.

    Not collective and not a barrier: it says nothing about other PEs. ``stream`` as for
    ``put``.
    """
    runtime = require_init("quiet")
    torch = import_torch("quiet")
    _native.quiet(stream_handle(torch, stream, runtime))
