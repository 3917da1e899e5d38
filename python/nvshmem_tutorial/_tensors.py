"""Symmetric tensors: allocation, peer views, and the collective freeing rule.

Chapter 2's ``SymmetricBuffer`` owns each allocation on the Rust side; here it becomes a torch
tensor, zero-copy, through a DLPack capsule. Freeing rule: ``nvshmem_free`` is collective, so
a tensor whose last reference dies is only *released*; its memory is returned at the next
collective point (``empty()``, ``collect()`` or ``finalize()``) once every rank has released
it too (python/src/state.rs explains why).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

from . import _native
from ._checks import check_pe, check_tensor, in_symmetric_heap, span_bytes
from ._native import InvalidArgumentError
from ._runtime import Runtime, gather, import_torch, require_init

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch

    from ._checks import ShapeLike

# Dtypes a symmetric tensor may have, by torch attribute name: every dtype torch uses for
# activations, weights and routing tables. Complex and quantized dtypes are left out.
SUPPORTED_DTYPES: Tuple[str, ...] = (
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint64",  # signal words (put_signal/wait_signal); torch has few uint64 kernels
    "bool",
)


def _check_dtype(torch: Any, dtype: Any) -> None:
    supported = [getattr(torch, name) for name in SUPPORTED_DTYPES if hasattr(torch, name)]
    if dtype not in supported:
        raise InvalidArgumentError(
            f"dtype {dtype} is not supported for symmetric tensors; use one of "
            + ", ".join(f"torch.{name}" for name in SUPPORTED_DTYPES)
        )


def _itemsize(torch: Any, dtype: Any) -> int:
    itemsize = getattr(dtype, "itemsize", None)  # torch >= 2.1
    if itemsize is None:
        itemsize = torch.empty((), dtype=dtype).element_size()
    return int(itemsize)


def _normalize_shape(shape: "ShapeLike") -> Tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgumentError(
            f"shape must be an int or a sequence of ints, got {type(shape).__name__}"
        ) from None
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise InvalidArgumentError(
                f"shape {dims} has {dim!r}; every dimension must be an int >= 0"
            )
    return dims


def _from_capsule(torch: Any, capsule: object) -> "torch.Tensor":
    """torch.from_dlpack, then mark the capsule consumed so only torch's storage frees it."""
    tensor = torch.from_dlpack(capsule)
    _native.mark_consumed(capsule)
    return tensor


def _tensor_at(address: int, num_bytes: int, anchor: "torch.Tensor") -> "torch.Tensor":
    """uint8 [num_bytes] on this PE's GPU over device memory at `address`, zero-copy, keeping
    the symmetric allocation under `anchor` (a local symmetric tensor) alive while torch's
    storage lives.

    Through DLPack, which names the device explicitly: for a peer's memory the driver would
    report the peer's GPU, and torch would copy instead of aliasing (see python/src/dlpack.rs).
    """
    require_init("_tensor_at")
    torch = import_torch("_tensor_at")
    return _from_capsule(torch, _native.to_dlpack(address, num_bytes, anchor.data_ptr()))


# ANCHOR: collect
def _collect(runtime: Runtime, request: Optional[Tuple[int, str]] = None) -> int:
    """Collective: frees what every rank released; checks an allocation request agrees.

    Every rank sends its released ids (and, from empty(), the size it is about to ask for);
    the ids released everywhere are freed in allocation order. A size that differs between
    ranks is an error on every rank: all of them see the same gathered table, so all of them
    raise, and none is left waiting inside nvshmem_malloc.
    """
    gathered = gather((_native.released_ids(), request), runtime)
    common = set(gathered[0][0])
    for ids, _ in gathered[1:]:
        common &= set(ids)
    freed = _native.free_released(sorted(common)) if common else 0
    if request is not None:
        sizes = [entry[1][0] for entry in gathered]
        if len(set(sizes)) > 1:
            table = "; ".join(
                f"rank {rank}: {entry[1][1]} = {entry[1][0]} bytes"
                for rank, entry in enumerate(gathered)
            )
            raise InvalidArgumentError(
                "symmetric allocations must be identical on every rank, in the same order, "
                f"but this one differs: {table}. Call empty() with the same shape and dtype "
                "on every rank"
            )
    return freed
# ANCHOR_END: collect


def empty(
    shape: "ShapeLike",
    dtype: "Optional[torch.dtype]" = None,
    *,
    device: "Union[torch.device, str, int, None]" = None,
) -> "torch.Tensor":
    """Collective: a new symmetric tensor, uninitialised, on this PE's GPU.

    Args:
        shape: int or sequence of ints >= 0; the same on every rank.
        dtype: one of ``SUPPORTED_DTYPES`` (default ``torch.get_default_dtype()``); the same
            on every rank.
        device: None, or this PE's GPU (``cuda:<init device>``); anything else is an error.

    Returns:
        A contiguous ``torch.Tensor`` of ``shape`` and ``dtype`` on ``cuda:<device>`` that
        aliases NVSHMEM's symmetric heap (zero-copy). The same allocation exists on every PE
        at the same heap offset, so it can be the remote side of ``put``/``get`` and of
        ``peer_view``. Its memory is released when the last tensor over it (peer views
        included) dies and freed at the next collective point (``empty``, ``collect``,
        ``finalize``) once every rank has released it.

    Every rank must call it with the same shape and dtype, in the same order; a mismatch is
    an ``InvalidArgumentError`` on every rank. Raises ``NvshmemError`` when the symmetric heap
    is full (raise NVSHMEM_SYMMETRIC_SIZE before launch).
    """
    runtime = require_init("empty")
    torch = import_torch("empty")
    dims = _normalize_shape(shape)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    _check_dtype(torch, dtype)
    here = torch.device("cuda", runtime.device)
    if device is not None:
        if isinstance(device, int):
            asked = torch.device("cuda", device)
        else:
            asked = torch.device(device)
        if asked.type != "cuda" or (asked.index is not None and asked.index != runtime.device):
            raise InvalidArgumentError(
                f"device={device!r}: symmetric tensors live on this PE's GPU, {here}"
            )
    num_bytes = math.prod(dims) * _itemsize(torch, dtype)
    _collect(runtime, (num_bytes, f"empty({dims}, {dtype})"))
    capsule, _allocation_id, _address = _native.alloc(num_bytes)
    # The storage keeps the allocation unreleased as long as any tensor sharing it lives:
    # views, slices and dtype views included.
    raw = _from_capsule(torch, capsule)
    return raw[:num_bytes].view(dtype).view(dims)


def zeros(
    shape: "ShapeLike",
    dtype: "Optional[torch.dtype]" = None,
    *,
    device: "Union[torch.device, str, int, None]" = None,
) -> "torch.Tensor":
    """Collective: like ``empty`` (same arguments), filled with zeros on torch's current stream.

    The zeros are ordered before later work on that stream only; call ``barrier()`` before
    peers write into the tensor.
    """
    tensor = empty(shape, dtype, device=device)
    # Zero the bytes, not the elements: all-zero bytes are 0 in every supported dtype, and
    # torch has no zero_ kernel for some of them (uint64 signal words on older releases).
    # reshape(-1) of a contiguous tensor is a view, and lets a 0-d tensor be viewed as bytes.
    tensor.reshape(-1).view(import_torch("zeros").uint8).zero_()
    return tensor


def is_symmetric(tensor: "torch.Tensor") -> bool:
    """Whether every byte of ``tensor`` (any shape/dtype, CUDA) lies in one symmetric
    allocation."""
    runtime = require_init("is_symmetric")
    torch = import_torch("is_symmetric")
    check_tensor(torch, tensor, "tensor", runtime)
    return in_symmetric_heap(tensor.data_ptr(), span_bytes(tensor))


def peer_view(tensor: "torch.Tensor", pe: int) -> "Optional[torch.Tensor]":
    """A tensor over ``pe``'s copy of the symmetric ``tensor``, or None when unreachable.

    Args:
        tensor: a symmetric tensor (from ``empty``, or any view/slice of one) on this PE's
            GPU; any shape, dtype and strides.
        pe: 0 <= pe < n_pes().

    Returns:
        A tensor of the same shape, dtype and strides, on this PE's GPU (``cuda:<device>``),
        whose elements are ``pe``'s copy, reached by loads and stores over NVLink/PCIe
        (``nvshmem_ptr``). None when ``pe`` is only reachable through put/get (another
        node). The view keeps the symmetric allocation alive. Stores become visible to
        ``pe`` after a ``barrier()``.

    Raises ``NotSymmetricError`` for a tensor outside the symmetric heap, ``OutOfBoundsError``
    for one that reaches past its allocation, ``PeOutOfRangeError`` for a bad ``pe``.
    """
    runtime = require_init("peer_view")
    torch = import_torch("peer_view")
    check_tensor(torch, tensor, "tensor", runtime)
    pe = check_pe(pe)
    span = span_bytes(tensor)
    address = _native.peer_ptr(tensor.data_ptr(), span, pe)
    if address is None:
        return None
    if span == 0:
        return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)
    raw = _tensor_at(address, span, tensor)
    return raw.view(tensor.dtype).as_strided(tuple(tensor.shape), tuple(tensor.stride()))


def heap_usage() -> dict:
    """This PE's symmetric allocations: ``{"live": n, "released": n, "bytes": n}``.

    ``released`` counts allocations no tensor references any more that wait for a collective
    point to be freed; ``bytes`` is what live allocations hold (including released ones).
    """
    require_init("heap_usage")
    live, released, num_bytes = _native.heap_usage()
    return {"live": live, "released": released, "bytes": num_bytes}


def collect() -> int:
    """Collective: frees the symmetric tensors every rank has released. Returns how many.

    ``empty()`` and ``finalize()`` collect on their own; call this to return memory between
    allocations (for example after dropping a large buffer). Waits for the GPU when there is
    something to free.
    """
    runtime = require_init("collect")
    import_torch("collect")
    return _collect(runtime)
