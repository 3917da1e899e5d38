"""Signals: the pairwise handshake, enqueued on a torch stream.

put + barrier completes a transfer by waiting for *every* PE. When only the two PEs of a
transfer care, the NVSHMEM idiom is cheaper: the sender's put carries a signal, a u64 word
in the receiver's symmetric memory that NVSHMEM updates only after the data has landed, and
the receiver's stream waits until the word reaches a value. Every step is enqueued on a
stream, so torch kernels before and after need no host synchronisation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple

from . import _native
from ._checks import (
    check_copy_pair,
    check_pe,
    check_tensor,
    keep_local_alive,
    num_bytes,
    stream_handle,
)
from ._native import InvalidArgumentError
from ._runtime import Runtime, import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch

    from ._checks import StreamLike


def _check_value(value: Any) -> int:
    """A signal value: a Python int that fits NVSHMEM's uint64_t."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"value must be a Python int in 0..2**64-1, got {type(value).__name__} (use "
            "int(x) for a tensor or numpy scalar)"
        )
    if not 0 <= value < 1 << 64:
        raise InvalidArgumentError(
            f"value {value} does not fit a signal word: signals are uint64, 0..2**64-1"
        )
    return value


def _check_name(kind: str, name: Any, choices: Tuple[str, ...]) -> str:
    """`name` is one of `choices` (the Rust tables, `_native.SIGNAL_OPS`/`SIGNAL_CMPS`)."""
    if not isinstance(name, str) or name not in choices:
        raise InvalidArgumentError(
            f"{kind}={name!r} is not one of " + ", ".join(repr(c) for c in choices)
        )
    return name


def _begin(
    what: str, kind: str, name: Any, choices: Tuple[str, ...], value: Any
) -> Tuple[Any, Runtime, int]:
    """The checks every signal call starts with: the scalar arguments first (they need
    neither NVSHMEM nor torch, so a CPU machine can test them), then NVSHMEM, then torch.
    Returns (torch, runtime, value)."""
    _check_name(kind, name, choices)
    value = _check_value(value)
    runtime = require_init(what)
    return import_torch(what), runtime, value


def _check_signal(torch: Any, signal: Any, runtime: Runtime) -> int:
    """One uint64 element of a tensor on our GPU; returns its device address. Whether it lies
    in the symmetric heap (and is aligned) is Rust's check."""
    check_tensor(torch, signal, "signal", runtime)
    uint64 = getattr(torch, "uint64", None)
    if uint64 is None or signal.dtype != uint64:
        raise InvalidArgumentError(
            f"signal is {signal.dtype}; NVSHMEM signal words are uint64. Allocate them with "
            "nvshmem_tutorial.empty((n,), torch.uint64) (torch >= 2.3) and pass one element"
        )
    if signal.numel() != 1:
        raise InvalidArgumentError(
            f"signal has shape {tuple(signal.shape)} ({signal.numel()} elements); pass exactly "
            "one signal word: signals[i] or signals[i:i+1] of a symmetric uint64 tensor"
        )
    return signal.data_ptr()


def put_signal(
    dst: "torch.Tensor",
    src: "torch.Tensor",
    pe: int,
    signal: "torch.Tensor",
    value: int,
    *,
    op: str = "set",
    nbi: bool = False,
    stream: "StreamLike" = None,
) -> None:
    """Copies ``src`` into ``pe``'s copy of ``dst``, then updates ``pe``'s copy of ``signal``;
    enqueued on ``stream``.

    NVSHMEM orders the signal after the data: once ``pe`` sees the signal change (for example
    with ``wait_signal`` on its stream), the bytes are in its ``dst``. No barrier is needed and
    no third PE is involved.

    Args:
        dst: symmetric tensor (from ``empty``, or a contiguous slice of one), contiguous, on
            this PE's GPU; any supported dtype and shape. Written on ``pe``, not here.
        src: tensor on this PE's GPU (symmetric or not), contiguous, same dtype and number
            of elements as ``dst`` (shapes may differ: the bytes are copied in order). Zero
            elements: only the signal is sent.
        pe: destination PE, 0 <= pe < n_pes() (may be this PE).
        signal: one uint64 element of a symmetric tensor (``signals[i]`` or
            ``signals[i:i+1]`` of ``empty((n,), torch.uint64)``) on this PE's GPU; the word
            updated is ``pe``'s copy. Must not overlap ``dst``.
        value: Python int, 0 <= value < 2**64.
        op: ``"set"`` (the word becomes ``value``) or ``"add"`` (atomically adds ``value``;
            use it when several senders, or several puts, count into one word).
        nbi: non-blocking: the stream does not wait for ``src`` to be read; do not change
            ``src`` before ``quiet()`` on the stream. The signal still follows the data.
        stream: torch.cuda.Stream of this GPU, a raw ``cudaStream_t`` int, or None for
            torch's current stream. Runs after the work already on it.

    Under CUDA-graph capture the value is baked into the graph: every replay sends the same
    value, so a receiver waiting for it passes at once on the word the previous replay left.
    Reset the words between replays (zero them, then a barrier) or count with ``op="add"``
    against a wait value that the reset makes meaningful again. Blocking ``put_signal`` and
    ``wait_signal`` capture as they are. ``nbi=True`` does not: with NVSHMEM 3.4.5 (2x H200)
    ending a capture after ``put_signal(..., nbi=True)`` + ``wait_signal`` fails with
    ``cudaErrorStreamCaptureUnjoined`` (the non-blocking work evidently runs on a stream of
    NVSHMEM's own); ``quiet()`` on the stream, which completes it, should join it before the
    capture ends (not measured under capture).

    Raises before enqueueing anything: ``InvalidArgumentError`` (CPU tensor, wrong device,
    dtype/numel mismatch, not contiguous, signal not one uint64 element, bad ``op`` or
    ``value``, signal overlapping ``dst``, misaligned signal), ``NotSymmetricError`` (``dst``
    or ``signal``), ``OutOfBoundsError``, ``PeOutOfRangeError``, ``NotInitializedError``.
    """
    torch, runtime, value = _begin("put_signal", "op", op, _native.SIGNAL_OPS, value)
    check_copy_pair(torch, "put_signal", dst, src, runtime, same_numel=True)
    signal_ptr = _check_signal(torch, signal, runtime)
    pe = check_pe(pe)
    handle = stream_handle(torch, stream, runtime)
    _native.put_signal(
        dst.data_ptr(), src.data_ptr(), num_bytes(dst), signal_ptr, value, op, pe, handle, nbi
    )
    keep_local_alive(torch, stream, src)


def signal_op(
    signal: "torch.Tensor",
    value: int,
    pe: int,
    *,
    op: str = "set",
    stream: "StreamLike" = None,
) -> None:
    """Updates ``pe``'s copy of ``signal`` (``op`` with ``value``), enqueued on ``stream``.

    A signal without data: "I am ready", "you may overwrite my buffer", a counter. It does
    *not* wait for earlier ``put``s to land on ``pe``; to publish data use ``put_signal``, or
    ``quiet()`` before this.

    Args:
        signal: one uint64 element of a symmetric tensor on this PE's GPU (as for
            ``put_signal``); the word updated is ``pe``'s copy.
        value: Python int, 0 <= value < 2**64.
        pe: target PE, 0 <= pe < n_pes() (may be this PE).
        op: ``"set"`` or ``"add"`` (atomic).
        stream: as for ``put_signal``.

    Raises the ``put_signal`` errors that apply, before enqueueing anything.
    """
    torch, runtime, value = _begin("signal_op", "op", op, _native.SIGNAL_OPS, value)
    signal_ptr = _check_signal(torch, signal, runtime)
    pe = check_pe(pe)
    _native.signal_op(signal_ptr, value, op, pe, stream_handle(torch, stream, runtime))


def wait_signal(
    signal: "torch.Tensor",
    value: int,
    *,
    cmp: str = "ge",
    stream: "StreamLike" = None,
) -> None:
    """Enqueued on ``stream``: later work on it waits until ``signal <cmp> value`` holds on
    this PE's copy of ``signal``. The host does not block.

    After the wait, the stream sees the data of every ``put_signal`` whose signal update
    made the comparison true, so a torch kernel enqueued next may read that ``dst``.

    Args:
        signal: one uint64 element of a symmetric tensor (``signals[i]`` or
            ``signals[i:i+1]`` of ``empty((n,), torch.uint64)``) on this PE's GPU.
        value: Python int, 0 <= value < 2**64.
        cmp: ``"ge"`` (default: counters and increasing sequence numbers, robust to a
            sender that is already further ahead), ``"eq"``, ``"ne"``, ``"gt"``, ``"lt"``,
            ``"le"``.
        stream: as for ``put_signal``.

    Hazard: the wait is unbounded. NVSHMEM's on-stream wait has no timeout, so if no PE ever
    makes the comparison true (a peer crashed, skipped its ``put_signal``, sent another value,
    or a graph replay expects a value the words were not reset for), the stream stalls for
    good, and so does every host call that synchronises with it (``.item()``,
    ``torch.cuda.synchronize()``, the next collective). This package cannot bound it from
    Python (that needs a spin-wait kernel with a deadline, which it does not ship), so it
    validates every argument before enqueueing: a mistake is an exception, never a hang.
    Keep ``put_signal`` and ``wait_signal`` paired by construction (same loop, same counter).

    Raises before enqueueing anything: ``InvalidArgumentError`` (CPU tensor, wrong device,
    signal not one uint64 element, bad ``cmp`` or ``value``, misaligned signal),
    ``NotSymmetricError``, ``OutOfBoundsError``, ``NotInitializedError``.
    """
    torch, runtime, value = _begin("wait_signal", "cmp", cmp, _native.SIGNAL_CMPS, value)
    signal_ptr = _check_signal(torch, signal, runtime)
    _native.wait_signal(signal_ptr, cmp, value, stream_handle(torch, stream, runtime))
