"""What a collective checks of its tensors, once for chapter 4's calls and chapter 5's.

The two chapters run the same collectives on the same tensors; they differ in how a call runs
(chapter 4's ``algorithm``, chapter 5's ``method``) and in the Rust function that runs it.
Each ``*_args`` function makes every check torch can make of one collective's tensors (as
``_collectives`` describes them) and returns the arguments its Rust functions take first, in
their order, and the stream handle; the algorithm or method goes between the two (``run``).
``what`` names the caller in the errors.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Tuple

from ._bootstrap import n_pes
from ._checks import check_contiguous, check_tensor, num_bytes, stream_handle
from ._native import InvalidArgumentError
from ._runtime import import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    from ._checks import StreamLike

_REDUCIBLE = ("bfloat16", "float32")

Args = Tuple[Tuple[Any, ...], int]
"""(the Rust function's leading arguments, the stream handle)."""


def prepare(what: str, stream: StreamLike, **tensors: Any) -> tuple:
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


def _pair(what: str, stream: StreamLike, output: Any, input: Any) -> int:
    """The stream handle, once output and input are checked tensors of one dtype."""
    _, _, handle = prepare(what, stream, output=output, input=input)
    _same_dtype(what, output, input)
    return handle


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


def _reduction_args(what: str, stream: StreamLike, output: Any, input: Any, scatter: bool) -> Args:
    """(out_ptr, in_ptr, count, dtype), the stream handle; count: output's elements, of which
    input holds n_pes() chunks with ``scatter`` (reduce-scatter), else one (all-reduce)."""
    handle = _pair(what, stream, output, input)
    if scatter:
        n = n_pes()
        _numel_must_be(what, "input", input, n * output.numel(), f"n_pes() = {n} chunks of output's size")
    else:
        _numel_must_be(what, "output", output, input.numel(), "one sum per input element")
    dtype = _reduce_dtype(what, input)
    return (output.data_ptr(), input.data_ptr(), output.numel(), dtype), handle


def all_reduce_args(what: str, stream: StreamLike, output: Any, input: Any) -> Args:
    return _reduction_args(what, stream, output, input, scatter=False)


def reduce_scatter_args(what: str, stream: StreamLike, output: Any, input: Any) -> Args:
    return _reduction_args(what, stream, output, input, scatter=True)


def all_gather_args(what: str, stream: StreamLike, output: Any, input: Any) -> Args:
    """(out_ptr, in_ptr, num_bytes), the stream handle; num_bytes: input's."""
    handle = _pair(what, stream, output, input)
    n = n_pes()
    _numel_must_be(what, "output", output, n * input.numel(), f"n_pes() = {n} copies of input")
    return (output.data_ptr(), input.data_ptr(), num_bytes(input)), handle


def all_to_all_args(what: str, stream: StreamLike, output: Any, input: Any) -> Args:
    """(out_ptr, in_ptr, num_bytes), the stream handle; num_bytes: one PE's block. Uneven
    splits are ``{what}_v``'s."""
    handle = _pair(what, stream, output, input)
    n = n_pes()
    _numel_must_be(what, "output", output, input.numel(), "as many elements as input")
    if input.numel() % n:
        raise InvalidArgumentError(
            f"{what}: input has {input.numel()} elements, not a multiple of n_pes() = {n}; "
            f"equal splits need equal blocks (use {what}_v for uneven ones)"
        )
    return (output.data_ptr(), input.data_ptr(), num_bytes(input) // n), handle


def broadcast_args(what: str, stream: StreamLike, output: Any, input: Any, root: Any) -> Args:
    """(out_ptr, in_ptr, num_bytes, root), the stream handle; whether ``root`` names a PE of
    the job is Rust's check."""
    handle = _pair(what, stream, output, input)
    _numel_must_be(what, "output", output, input.numel(), "as many elements as input")
    if isinstance(root, bool) or not isinstance(root, int):
        raise InvalidArgumentError(f"root must be an int, got {type(root).__name__}")
    return (output.data_ptr(), input.data_ptr(), num_bytes(input), root), handle


def all_to_all_v_args(
    what: str, stream: StreamLike, output: Any, input: Any, in_splits: Any, out_splits_offsets: Any
) -> Args:
    """(out_ptr, out_rows, in_ptr, in_rows, row_bytes, in_splits_ptr,
    out_splits_offsets_ptr), the stream handle."""
    torch, _, handle = prepare(
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
    rows = (output.data_ptr(), output.shape[0], input.data_ptr(), input.shape[0], row_bytes)
    return (*rows, in_splits.data_ptr(), out_splits_offsets.data_ptr()), handle


def run(function: Callable[..., None], how: Any, args_of: Callable[..., Args], stream: StreamLike, *tensors: Any) -> None:
    """Calls ``function``, a Rust collective (its name names the call in the errors), with the
    arguments ``args_of`` checks ``tensors`` for, then ``how`` (the algorithm or method) and
    the stream handle."""
    args, handle = args_of(function.__name__, stream, *tensors)
    function(*args, how, handle)
