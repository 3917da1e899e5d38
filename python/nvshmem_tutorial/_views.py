"""How the buffer's calls describe tensors to the Rust side, and adopt device memory torch did
not allocate. A tensor crosses as ``(address, shape, strides in elements, dtype name)``; the
Rust crate checks every shape and dtype (python/src/buffer.rs, ``view``).

Low-latency calls make these descriptions on every decoding step, so the cheap forms matter:
``_owned`` for outputs this package just allocated (their shape is known) and
``_current_stream_handle`` for the current stream (no Stream object).
"""

from __future__ import annotations

from typing import Any, Optional

try:  # torch is only needed once a Buffer is used
    import torch
except ImportError:  # pragma: no cover - exercised by the CPU tests without torch
    torch = None  # type: ignore[assignment]


def _view(tensor: Any) -> tuple:
    """(address, shape, strides, dtype name): what the Rust side takes for a tensor."""
    return (tensor.data_ptr(), list(tensor.shape), list(tensor.stride()), str(tensor.dtype).removeprefix("torch."))


def _maybe(tensor: Optional[Any]) -> Optional[tuple]:
    return None if tensor is None else _view(tensor)


def _rows(tensor: Any) -> tuple:
    """`_view` of a [..., cols] tensor as the matrix of its rows: a contiguous one is described
    without a torch view op; any other is flattened (a copy where it must)."""
    if not tensor.is_contiguous():
        return _view(tensor.flatten(0, -2))
    cols = tensor.shape[-1]
    return (tensor.data_ptr(), [tensor.numel() // max(cols, 1), cols], [cols, 1], str(tensor.dtype).removeprefix("torch."))


def _owned(tensor: Any, rows: int, cols: Optional[int] = None) -> tuple:
    """`_view` of a contiguous tensor this module just allocated, seen as [rows, cols] (or
    [rows]): its shape is known, so only the address is asked of torch."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if cols is None:
        return (tensor.data_ptr(), [rows], [1], dtype)
    return (tensor.data_ptr(), [rows, cols], [cols, 1], dtype)


def _current_stream_handle(device_index: int) -> int:
    """The current stream's CUstream, as torch.cuda.current_stream().cuda_stream, without
    building a Stream object (a low-latency call asks for it on every call)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _device_bytes(address: int, length: int) -> Any:
    """A uint8 tensor over device memory torch did not allocate (the buffer's regions)."""

    class _Region:  # __cuda_array_interface__ is how torch adopts memory it did not allocate
        __cuda_array_interface__ = {"shape": (length,), "typestr": "|u1", "data": (address, False), "version": 3}

    return torch.as_tensor(_Region(), device=f"cuda:{torch.cuda.current_device()}")
