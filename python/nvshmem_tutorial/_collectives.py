"""Chapter 4's collectives on symmetric tensors, enqueued on a torch stream.

Each call checks what torch knows here (CUDA tensors on this PE's GPU, contiguous, dtypes
and element counts that fit the collective) and hands (pointer, size) pairs to Rust, which
checks that every tensor lies in a live symmetric allocation and launches one kernel. Every
PE must make the same calls in the same order with the same sizes. All of them can be
captured in a CUDA graph (``torch.cuda.graph``): the call numbers live on the GPU.

``algorithm=None`` lets the size table of chapter 4 choose; a name (``"one_shot"``,
``"two_shot"``, ``"direct"``, ``"ring"``, ``"scatter_gather"``, ``"pull"``) forces one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

from . import _native
from ._bootstrap import n_pes
from ._checks import check_contiguous, check_tensor, num_bytes, stream_handle
from ._native import InvalidArgumentError
from ._runtime import import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    from ._checks import StreamLike, Tensor

_REDUCIBLE = ("bfloat16", "float32")


def _prepare(what: str, stream: StreamLike, **tensors: Any) -> tuple:
    """(torch, runtime, stream handle) after checking every named tensor."""
    runtime = require_init(what)
    torch = import_torch(what)
    for name, tensor in tensors.items():
        check_tensor(torch, tensor, name, runtime)
        check_contiguous(tensor, name)
    return torch, runtime, stream_handle(torch, stream, runtime)


def _same_dtype(what: str, output: Any, input: Any) -> None:
    if output.dtype != input.dtype:
        raise InvalidArgumentError(
            f"{what}: output is {output.dtype} but input is {input.dtype}; the collective "
            "moves elements of one dtype (convert one of them)"
        )


def _numel_must_be(what: str, name: str, tensor: Any, expected: int, why: str) -> None:
    if tensor.numel() != expected:
        raise InvalidArgumentError(
            f"{what}: {name} has {tensor.numel()} elements (shape {tuple(tensor.shape)}) but "
            f"needs {expected}: {why}"
        )


def _reduce_dtype(what: str, tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _REDUCIBLE:
        raise InvalidArgumentError(
            f"{what} sums torch.bfloat16 or torch.float32 elements (in fp32), not "
            f"{tensor.dtype}; convert with .to(torch.bfloat16) or .float()"
        )
    return name


def _all_to_all_v_args(what: str, stream: StreamLike, output: Any, input: Any, in_splits: Any, out_splits_offsets: Any) -> tuple:
    """The checks of an all-to-all-v's tensors (chapter 4's and chapter 5's alike): the
    stream handle and the bytes of one row."""
    torch, _, handle = _prepare(
        what, stream, output=output, input=input, in_splits=in_splits, out_splits_offsets=out_splits_offsets
    )
    _same_dtype(what, output, input)
    n = n_pes()
    if output.dim() == 0 or input.dim() == 0 or output.shape[1:] != input.shape[1:]:
        raise InvalidArgumentError(
            f"{what}: output {tuple(output.shape)} and input {tuple(input.shape)} must be at "
            "least 1-D with the same row shape (dims after the first)"
        )
    for name, tensor, shape in (("in_splits", in_splits, (n,)), ("out_splits_offsets", out_splits_offsets, (2, n))):
        if tensor.dtype != torch.int64 or tuple(tensor.shape) != shape:
            raise InvalidArgumentError(
                f"{what}: {name} must be a torch.int64 tensor of shape {shape}, got "
                f"{tensor.dtype} {tuple(tensor.shape)}"
            )
    row_bytes = math.prod(input.shape[1:]) * input.element_size()
    if row_bytes == 0:
        raise InvalidArgumentError(f"{what}: rows of shape {tuple(input.shape[1:])} hold no bytes")
    return handle, row_bytes


def sync_all(*, stream: StreamLike = None) -> None:
    """Collective barrier on ``stream``: later work on every PE's stream runs after every PE's
    stream reached this call. Cheaper than ``barrier()`` (one signal each way, no NVSHMEM
    quiet), and like ``nvshmem_sync_all`` it does *not* complete puts still in flight."""
    _, _, handle = _prepare("sync_all", stream)
    _native.sync_all(handle)


def all_reduce(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``output[i] = sum over PEs of input[i]``, summed in fp32 in PE order.

    Args:
        output, input: symmetric tensors (``nvshmem_tutorial.empty``), contiguous, same
            dtype (torch.bfloat16 or torch.float32) and number of elements; ``output`` may be
            ``input`` (in place).
        algorithm: ``"one_shot"`` (latency), ``"two_shot"`` (bandwidth), or None (by size).
        stream: as for ``put``.

    Raises before enqueueing anything: ``InvalidArgumentError`` (dtype, sizes, an algorithm
    that cannot run this size), ``NotSymmetricError``, ``OutOfBoundsError``.
    """
    what = "all_reduce"
    _, _, handle = _prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    _numel_must_be(what, "output", output, input.numel(), "one sum per input element")
    dtype = _reduce_dtype(what, input)
    _native.all_reduce(output.data_ptr(), input.data_ptr(), input.numel(), dtype, algorithm, handle)


def reduce_scatter(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``output[i] = sum over PEs of input[my_pe * output.numel() + i]``.

    ``input`` holds n_pes() chunks of ``output.numel()`` elements; PE p gets the sums of
    chunk p. Both symmetric, contiguous, same dtype (bf16 or fp32). ``algorithm``:
    ``"one_shot"``, ``"pull"`` or None. Errors as ``all_reduce``.
    """
    what = "reduce_scatter"
    _, _, handle = _prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    n = n_pes()
    _numel_must_be(what, "input", input, n * output.numel(), f"n_pes() = {n} chunks of output's size")
    dtype = _reduce_dtype(what, input)
    _native.reduce_scatter(output.data_ptr(), input.data_ptr(), output.numel(), dtype, algorithm, handle)


def all_gather(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """Every PE's ``input`` into every PE's ``output``, PE p's at elements
    ``p * input.numel() ..``. Symmetric, contiguous, same dtype (any). ``algorithm``:
    ``"one_shot"``, ``"direct"``, ``"ring"`` or None. Errors as ``all_reduce``."""
    what = "all_gather"
    _, _, handle = _prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    n = n_pes()
    _numel_must_be(what, "output", output, n * input.numel(), f"n_pes() = {n} copies of input")
    _native.all_gather(output.data_ptr(), input.data_ptr(), num_bytes(input), algorithm, handle)


def all_to_all(output: Tensor, input: Tensor, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """Block q of every PE's ``input`` (``input.numel() / n_pes()`` elements) goes to PE q,
    landing at block p of its ``output`` for sender p. Symmetric, contiguous, same dtype and
    numel, divisible by n_pes(). ``algorithm``: ``"one_shot"``, ``"direct"`` or None."""
    what = "all_to_all"
    _, _, handle = _prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    n = n_pes()
    _numel_must_be(what, "output", output, input.numel(), "as many elements as input")
    if input.numel() % n:
        raise InvalidArgumentError(
            f"{what}: input has {input.numel()} elements, not a multiple of n_pes() = {n}; "
            "equal splits need equal blocks (use all_to_all_v for uneven ones)"
        )
    _native.all_to_all(output.data_ptr(), input.data_ptr(), num_bytes(input) // n, algorithm, handle)


def broadcast(output: Tensor, input: Tensor, root: int, *, algorithm: Optional[str] = None, stream: StreamLike = None) -> None:
    """``root``'s ``input`` into every PE's ``output`` (``output`` may be ``input``).
    Symmetric, contiguous, same dtype and numel. ``algorithm``: ``"one_shot"``,
    ``"scatter_gather"`` or None. Raises ``PeOutOfRangeError`` for a root outside 0..n_pes()."""
    what = "broadcast"
    _, _, handle = _prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    _numel_must_be(what, "output", output, input.numel(), "as many elements as input")
    if isinstance(root, bool) or not isinstance(root, int):
        raise InvalidArgumentError(f"root must be an int, got {type(root).__name__}")
    _native.broadcast(output.data_ptr(), input.data_ptr(), num_bytes(input), root, algorithm, handle)


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
    handle, row_bytes = _all_to_all_v_args("all_to_all_v", stream, output, input, in_splits, out_splits_offsets)
    _native.all_to_all_v(
        output.data_ptr(),
        output.shape[0],
        input.data_ptr(),
        input.shape[0],
        row_bytes,
        in_splits.data_ptr(),
        out_splits_offsets.data_ptr(),
        handle,
    )


def check_collectives() -> None:
    """Raises ``NvshmemError`` with what a collective kernel recorded on the GPU (a wait that
    timed out, naming the PE and the call; all-to-all-v counts that do not add up), if
    anything. Every collective call checks this first; call it after synchronising to learn
    about the last one."""
    require_init("check_collectives")
    _native.check_collectives()
