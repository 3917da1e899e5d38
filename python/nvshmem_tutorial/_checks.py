"""The checks that are torch's business, shared by every call that takes tensors.

Everything that decides *whether* an operation is valid on the NVSHMEM side (is this range
inside a symmetric allocation, is this PE real, may this be freed) lives in Rust. These
functions check only what torch knows (is it a CUDA tensor on our device, do dtype and shape
match, which stream) and turn tensors into (pointer, bytes) pairs. Each raises an
``InvalidArgumentError`` that names the argument, the problem and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, Union

from . import _native
from ._native import InvalidArgumentError
from ._runtime import Runtime

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch

    Tensor = torch.Tensor
    StreamLike = Union[torch.cuda.Stream, int, None]
    ShapeLike = Union[int, Sequence[int], torch.Size]


def check_tensor(torch: Any, tensor: Any, name: str, runtime: Runtime) -> None:
    """A torch.Tensor on this PE's GPU, or an InvalidArgumentError that says which and why."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(
            f"{name} must be a torch.Tensor, got {type(tensor).__name__}"
        )
    if tensor.device.type != "cuda":
        raise InvalidArgumentError(
            f"{name} is a {tensor.device.type.upper()} tensor; NVSHMEM moves GPU memory. "
            f"Move it to this PE's GPU first: {name}.to('cuda:{runtime.device}')"
        )
    if tensor.device.index != runtime.device:
        raise InvalidArgumentError(
            f"{name} is on cuda:{tensor.device.index}, but this PE's GPU is "
            f"cuda:{runtime.device} (the device current at init()); NVSHMEM can only read and "
            "write memory of its own GPU here"
        )


def check_contiguous(tensor: Any, name: str) -> None:
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            f"{name} is not contiguous (shape {tuple(tensor.shape)}, stride "
            f"{tuple(tensor.stride())}); put/get copy one contiguous byte range. Use "
            f"{name}.contiguous() for a local tensor, or a contiguous slice of a symmetric one"
        )


def check_copy_pair(
    torch: Any, what: str, dst: Any, src: Any, runtime: Runtime, same_numel: bool = False
) -> None:
    """dst and src: CUDA tensors on our GPU, same dtype, both contiguous, and the same shape
    (or, with `same_numel`, the same number of elements: contiguous, so the same bytes)."""
    check_tensor(torch, dst, "dst", runtime)
    check_tensor(torch, src, "src", runtime)
    if dst.dtype != src.dtype:
        raise InvalidArgumentError(
            f"dst is {dst.dtype} but src is {src.dtype}; {what} copies bytes and needs equal "
            "dtypes (convert src with .to(dst.dtype) first)"
        )
    if same_numel:
        if dst.numel() != src.numel():
            raise InvalidArgumentError(
                f"dst has {dst.numel()} elements (shape {tuple(dst.shape)}) but src has "
                f"{src.numel()} (shape {tuple(src.shape)}); {what} needs equal numel (slice "
                "one of them)"
            )
    elif dst.shape != src.shape:
        raise InvalidArgumentError(
            f"dst has shape {tuple(dst.shape)} but src has {tuple(src.shape)}; {what} needs "
            "equal shapes (slice or reshape one of them)"
        )
    check_contiguous(dst, "dst")
    check_contiguous(src, "src")


def check_pe(pe: Any) -> int:
    """A PE number of the right type; whether it names a PE of the job is Rust's check."""
    if isinstance(pe, bool) or not isinstance(pe, int):
        raise InvalidArgumentError(f"pe must be an int, got {type(pe).__name__}")
    return pe


def num_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def span_bytes(tensor: Any) -> int:
    """Bytes from the first to one past the last element a (possibly strided) tensor touches."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def in_symmetric_heap(address: int, length: int) -> bool:
    """Whether bytes ``address..address + length`` lie in one live symmetric allocation."""
    try:
        _native.locate(address, length)
    except InvalidArgumentError:
        return False
    return True


def stream_handle(torch: Any, stream: "StreamLike", runtime: Runtime) -> int:
    """``cudaStream_t`` as an integer: torch's current stream on our device by default."""
    if stream is None:
        return torch.cuda.current_stream(runtime.device).cuda_stream
    if isinstance(stream, torch.cuda.Stream):
        if stream.device.index != runtime.device:
            raise InvalidArgumentError(
                f"stream belongs to cuda:{stream.device.index}, but this PE's GPU is "
                f"cuda:{runtime.device}"
            )
        return stream.cuda_stream
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise InvalidArgumentError(
        "stream must be a torch.cuda.Stream, a raw cudaStream_t integer, or None (torch's "
        f"current stream); got {type(stream).__name__}"
    )


def keep_local_alive(torch: Any, stream: "StreamLike", local: "torch.Tensor") -> None:
    """The caching allocator must not hand a non-symmetric local tensor's memory to someone
    else while a copy on a side stream may still touch it."""
    if isinstance(stream, torch.cuda.Stream) and not in_symmetric_heap(
        local.data_ptr(), max(num_bytes(local), 1)
    ):
        local.record_stream(stream)
