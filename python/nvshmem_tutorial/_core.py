"""The torch glue: tensors, devices, streams and process groups around ``_native``.

Everything that decides *whether* an operation is valid on the NVSHMEM side (is this range
inside a symmetric allocation, is this PE real, may this be freed) lives in Rust. This module
checks only what is torch's business (is it a CUDA tensor on our device, do dtype and shape
match, which stream) and turns tensors into (pointer, bytes) pairs.

torch is imported inside the functions, never at module level, so that the package imports
on machines without torch (CI, tooling) and fails with a clear message only when a call needs
it.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

from . import _native
from ._native import (
    InvalidArgumentError,
    NoDeviceError,
    NotInitializedError,
    NvshmemError,
)

if TYPE_CHECKING:  # only for annotations; never imported at run time here
    import torch
    import torch.distributed

    StreamLike = Union[torch.cuda.Stream, int, None]
    ShapeLike = Union[int, Sequence[int], torch.Size]

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


class _Runtime:
    """What init() learned: the process group the PEs map onto, and this PE's GPU."""

    def __init__(self, group: Any, device: int) -> None:
        self.group = group
        self.device = device


_runtime: Optional[_Runtime] = None


# ---- helpers ---------------------------------------------------------------------------------


def _import_torch(what: str) -> Any:
    try:
        import torch
    except ImportError as error:
        raise ImportError(
            f"nvshmem_tutorial.{what}() needs PyTorch, which is not installed in this "
            "interpreter. Install a CUDA build of torch (https://pytorch.org/get-started/)"
        ) from error
    return torch


def _require_init(what: str) -> _Runtime:
    if _runtime is None or not _native.is_initialized():
        raise NotInitializedError(
            f"nvshmem_tutorial.{what}() needs NVSHMEM, which is not initialised in this "
            "process. Call nvshmem_tutorial.init() first, on every rank, after "
            "torch.distributed.init_process_group()"
        )
    return _runtime


def _check_tensor(torch: Any, tensor: Any, name: str, runtime: _Runtime) -> None:
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


def _tensor_at(address: int, num_bytes: int, anchor: "torch.Tensor") -> "torch.Tensor":
    """uint8 [num_bytes] on this PE's GPU over device memory at `address`, zero-copy, keeping
    the symmetric allocation under `anchor` (a local symmetric tensor) alive while torch's
    storage lives.

    Through DLPack, which names the device explicitly: for a peer's memory the driver would
    report the peer's GPU, and torch would copy instead of aliasing (see python/src/dlpack.rs).
    """
    runtime = _require_init("_tensor_at")
    torch = _import_torch("_tensor_at")
    return _from_capsule(torch, _native.to_dlpack(address, num_bytes, anchor.data_ptr()))


def _from_capsule(torch: Any, capsule: object) -> "torch.Tensor":
    """torch.from_dlpack, then mark the capsule consumed so only torch's storage frees it."""
    tensor = torch.from_dlpack(capsule)
    _native.mark_consumed(capsule)
    return tensor


def _check_contiguous(tensor: Any, name: str) -> None:
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            f"{name} is not contiguous (shape {tuple(tensor.shape)}, stride "
            f"{tuple(tensor.stride())}); put/get copy one contiguous byte range. Use "
            f"{name}.contiguous() for a local tensor, or a contiguous slice of a symmetric one"
        )


def _num_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _span_bytes(tensor: Any) -> int:
    """Bytes from the first to one past the last element a (possibly strided) tensor touches."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def _stream_handle(torch: Any, stream: "StreamLike", runtime: _Runtime) -> int:
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


def _check_pe_type(pe: Any) -> int:
    if isinstance(pe, bool) or not isinstance(pe, int):
        raise InvalidArgumentError(f"pe must be an int, got {type(pe).__name__}")
    return pe


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


def _gather(payload: Any, runtime: _Runtime) -> list:
    """all_gather_object over init()'s group: one entry per rank of it, in rank order."""
    import torch.distributed as dist

    gathered: list = [None] * dist.get_world_size(runtime.group)
    dist.all_gather_object(gathered, payload, group=runtime.group)
    return gathered


# ANCHOR: collect
def _collect(runtime: _Runtime, request: Optional[Tuple[int, str]] = None) -> int:
    """Collective: frees what every rank released; checks an allocation request agrees.

    Every rank sends its released ids (and, from empty(), the size it is about to ask for);
    the ids released everywhere are freed in allocation order. A size that differs between
    ranks is an error on every rank: all of them see the same gathered table, so all of them
    raise, and none is left waiting inside nvshmem_malloc.
    """
    gathered = _gather((_native.released_ids(), request), runtime)
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


# ---- bootstrap -------------------------------------------------------------------------------


def library_info() -> Tuple[str, Tuple[int, int, int]]:
    """Loads the NVSHMEM host library and returns ``(path, (major, minor, patch))``.

    Needs no GPU and no torch. Raises ``LibraryError`` (listing every place searched and the
    fix) when libnvshmem_host.so.3 is missing or is not the pinned release.
    """
    return _native.library_info()


def init(group: "Optional[torch.distributed.ProcessGroup]" = None) -> None:
    """Collective: initialises NVSHMEM on every rank of ``group`` (default: the whole job).

    Call after ``torch.distributed.init_process_group()`` and ``torch.cuda.set_device()``:
    each rank becomes PE ``group``-rank on ``torch.cuda.current_device()``. Rank 0 of the
    group creates NVSHMEM's unique id and it travels to the others over torch.distributed.

    Idempotent: a second call returns at once. Every rank first checks locally that the
    library loads and a GPU exists, and the verdicts are exchanged before anyone enters
    NVSHMEM's own (blocking) initialisation, so one rank's missing library is an error on
    every rank rather than a hang.

    Raises: ``ImportError`` without torch; ``NvshmemError`` if torch.distributed is not
    initialised; ``NoDeviceError`` without a CUDA device; ``LibraryError`` without the
    NVSHMEM library.
    """
    global _runtime
    if _native.is_initialized():
        if _runtime is not None and group is not None and group is not _runtime.group:
            raise InvalidArgumentError(
                "NVSHMEM is already initialised with another process group; call "
                "nvshmem_tutorial.finalize() on every rank before initialising with a new one"
            )
        return
    torch = _import_torch("init")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise NvshmemError(
            "nvshmem_tutorial.init() bootstraps over torch.distributed, which is not "
            "initialised. Launch with torchrun and call "
            "torch.distributed.init_process_group('nccl') first"
        )
    if not torch.cuda.is_available():
        raise NoDeviceError(
            "torch sees no CUDA device (torch.cuda.is_available() is False): NVSHMEM needs one "
            "GPU per rank. Check the driver, CUDA_VISIBLE_DEVICES, and that torch is a CUDA "
            "build"
        )
    device = torch.cuda.current_device()
    rank = dist.get_rank(group)
    world_size = dist.get_world_size(group)
    runtime = _Runtime(group, device)

    # ANCHOR: init_exchange
    # Local readiness, then one exchange that also carries rank 0's unique id.
    try:
        _native.probe_driver()
        _native.library_info()
        status: Tuple[Any, ...] = ("ok", _native.unique_id() if rank == 0 else None)
    except (NvshmemError, InvalidArgumentError) as error:
        status = ("error", type(error).__name__, str(error))
    statuses = _gather(status, runtime)
    failures = [(r, s) for r, s in enumerate(statuses) if s[0] == "error"]
    if failures:
        first_rank, (_, kind, message) = failures[0]
        exception = getattr(_native, kind, NvshmemError)
        others = f" (and {len(failures) - 1} more rank(s))" if len(failures) > 1 else ""
        raise exception(f"rank {first_rank}{others} cannot initialise NVSHMEM: {message}")
    unique_id = statuses[0][1]
    _native.init(rank, world_size, device, unique_id)
    # ANCHOR_END: init_exchange
    _runtime = runtime


def finalize() -> None:
    """Collective: frees every symmetric tensor's memory and shuts NVSHMEM down.

    Waits for the GPU first. Symmetric tensors still referenced afterwards point at freed
    memory: drop them before calling this (a warning says how many were still alive). A
    no-op when NVSHMEM is not initialised.
    """
    global _runtime
    still_referenced = _native.finalize()
    _runtime = None
    if still_referenced:
        warnings.warn(
            f"nvshmem_tutorial.finalize(): {still_referenced} symmetric tensor(s) were still "
            "referenced; their memory has been freed and they must not be used any more",
            RuntimeWarning,
            stacklevel=2,
        )


def is_initialized() -> bool:
    """Whether NVSHMEM is initialised in this process."""
    return _native.is_initialized()


def my_pe() -> int:
    """This process's PE number, ``0 <= my_pe() < n_pes()`` (its rank in init()'s group)."""
    _require_init("my_pe")
    return _native.topology()[0]


def n_pes() -> int:
    """Number of PEs in the job (the size of init()'s group)."""
    _require_init("n_pes")
    return _native.topology()[1]


def node_pe() -> int:
    """This PE's number among the PEs of its host (NVSHMEMX_TEAM_NODE)."""
    _require_init("node_pe")
    return _native.topology()[2]


def node_size() -> int:
    """Number of PEs on this host."""
    _require_init("node_size")
    return _native.topology()[3]


# ---- symmetric tensors ----------------------------------------------------------------------


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
        included) dies and freed at
        the next collective point (``empty``, ``collect``, ``finalize``) once every rank has
        released it.

    Every rank must call it with the same shape and dtype, in the same order; a mismatch is
    an ``InvalidArgumentError`` on every rank. Raises ``NvshmemError`` when the symmetric heap
    is full (raise NVSHMEM_SYMMETRIC_SIZE before launch).
    """
    runtime = _require_init("empty")
    torch = _import_torch("empty")
    dims = _normalize_shape(shape)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    _check_dtype(torch, dtype)
    here = torch.device("cuda", runtime.device)
    if device is not None:
        asked = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
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
    tensor.reshape(-1).view(_import_torch("zeros").uint8).zero_()
    return tensor


def is_symmetric(tensor: "torch.Tensor") -> bool:
    """Whether every byte of ``tensor`` (any shape/dtype, CUDA) lies in one symmetric allocation."""
    runtime = _require_init("is_symmetric")
    torch = _import_torch("is_symmetric")
    _check_tensor(torch, tensor, "tensor", runtime)
    try:
        _native.locate(tensor.data_ptr(), _span_bytes(tensor))
    except InvalidArgumentError:
        return False
    return True


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
        node). The view keeps the symmetric allocation alive. Stores become visible to ``pe`` after a
        ``barrier()``.

    Raises ``NotSymmetricError`` for a tensor outside the symmetric heap, ``OutOfBoundsError``
    for one that reaches past its allocation, ``PeOutOfRangeError`` for a bad ``pe``.
    """
    runtime = _require_init("peer_view")
    torch = _import_torch("peer_view")
    _check_tensor(torch, tensor, "tensor", runtime)
    pe = _check_pe_type(pe)
    span = _span_bytes(tensor)
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
    _require_init("heap_usage")
    live, released, num_bytes = _native.heap_usage()
    return {"live": live, "released": released, "bytes": num_bytes}


def collect() -> int:
    """Collective: frees the symmetric tensors every rank has released. Returns how many.

    ``empty()`` and ``finalize()`` collect on their own; call this to return memory between
    allocations (for example after dropping a large buffer). Waits for the GPU when there is
    something to free.
    """
    runtime = _require_init("collect")
    _import_torch("collect")
    return _collect(runtime)


# ---- communication --------------------------------------------------------------------------


def _check_copy_pair(
    torch: Any, what: str, dst: Any, src: Any, runtime: _Runtime, same_numel: bool = False
) -> None:
    """dst and src: CUDA tensors on our GPU, same dtype, both contiguous, and the same shape
    (or, with `same_numel`, the same number of elements: contiguous, so the same bytes)."""
    _check_tensor(torch, dst, "dst", runtime)
    _check_tensor(torch, src, "src", runtime)
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
    _check_contiguous(dst, "dst")
    _check_contiguous(src, "src")


def _keep_local_alive(torch: Any, stream: "StreamLike", local: "torch.Tensor") -> None:
    """The caching allocator must not hand a non-symmetric local tensor's memory to someone
    else while a copy on a side stream may still touch it."""
    if isinstance(stream, torch.cuda.Stream) and not _is_symmetric_quiet(local):
        local.record_stream(stream)


def _one_sided(
    what: str,
    dst: "torch.Tensor",
    src: "torch.Tensor",
    pe: int,
    stream: "StreamLike",
    nbi: bool,
) -> None:
    runtime = _require_init(what)
    torch = _import_torch(what)
    _check_copy_pair(torch, what, dst, src, runtime)
    pe = _check_pe_type(pe)
    handle = _stream_handle(torch, stream, runtime)
    num_bytes = _num_bytes(dst)
    if what.startswith("put"):
        _native.put(dst.data_ptr(), src.data_ptr(), num_bytes, pe, handle, nbi)
        local = src
    else:
        _native.get(dst.data_ptr(), src.data_ptr(), num_bytes, pe, handle, nbi)
        local = dst
    _keep_local_alive(torch, stream, local)


def _is_symmetric_quiet(tensor: "torch.Tensor") -> bool:
    try:
        _native.locate(tensor.data_ptr(), max(_num_bytes(tensor), 1))
    except InvalidArgumentError:
        return False
    return True


def put(
    dst: "torch.Tensor",
    src: "torch.Tensor",
    pe: int,
    *,
    stream: "StreamLike" = None,
    nbi: bool = False,
) -> None:
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


def put_nbi(
    dst: "torch.Tensor", src: "torch.Tensor", pe: int, *, stream: "StreamLike" = None
) -> None:
    """``put(dst, src, pe, stream=stream, nbi=True)``; same arguments and errors."""
    _one_sided("put_nbi", dst, src, pe, stream, True)


def get(
    dst: "torch.Tensor",
    src: "torch.Tensor",
    pe: int,
    *,
    stream: "StreamLike" = None,
    nbi: bool = False,
) -> None:
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


def get_nbi(
    dst: "torch.Tensor", src: "torch.Tensor", pe: int, *, stream: "StreamLike" = None
) -> None:
    """``get(dst, src, pe, stream=stream, nbi=True)``; same arguments and errors."""
    _one_sided("get_nbi", dst, src, pe, stream, True)


def barrier(*, stream: "StreamLike" = None) -> None:
    """Collective, enqueued on ``stream``: completes this PE's puts, then waits for all PEs.

    Work enqueued on the stream after it sees every PE's puts (and peer-view stores) issued
    before their barrier. The host does not block. ``stream`` as for ``put``.
    """
    runtime = _require_init("barrier")
    torch = _import_torch("barrier")
    _native.barrier(_stream_handle(torch, stream, runtime))


def quiet(*, stream: "StreamLike" = None) -> None:
    """Enqueued on ``stream``: later work on it runs after this PE's puts/gets on it complete.

    Not collective and not a barrier: it says nothing about other PEs. ``stream`` as for
    ``put``.
    """
    runtime = _require_init("quiet")
    torch = _import_torch("quiet")
    _native.quiet(_stream_handle(torch, stream, runtime))


# ---- signals: the pairwise handshake --------------------------------------------------------
#
# put + barrier completes a transfer by waiting for *every* PE. When only the two PEs of a
# transfer care, the NVSHMEM idiom is cheaper: the sender's put carries a signal, a u64 word
# in the receiver's symmetric memory that NVSHMEM updates only after the data has landed, and
# the receiver's stream waits until the word reaches a value. Every step is enqueued on a
# stream, so torch kernels before and after need no host synchronisation.


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


def _check_signal(torch: Any, signal: Any, runtime: _Runtime) -> int:
    """One uint64 element of a tensor on our GPU; returns its device address. Whether it lies
    in the symmetric heap (and is aligned) is Rust's check."""
    _check_tensor(torch, signal, "signal", runtime)
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
    _check_name("op", op, _native.SIGNAL_OPS)
    value = _check_value(value)
    runtime = _require_init("put_signal")
    torch = _import_torch("put_signal")
    _check_copy_pair(torch, "put_signal", dst, src, runtime, same_numel=True)
    signal_ptr = _check_signal(torch, signal, runtime)
    pe = _check_pe_type(pe)
    handle = _stream_handle(torch, stream, runtime)
    _native.put_signal(
        dst.data_ptr(), src.data_ptr(), _num_bytes(dst), signal_ptr, value, op, pe, handle, nbi
    )
    _keep_local_alive(torch, stream, src)


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
    _check_name("op", op, _native.SIGNAL_OPS)
    value = _check_value(value)
    runtime = _require_init("signal_op")
    torch = _import_torch("signal_op")
    signal_ptr = _check_signal(torch, signal, runtime)
    pe = _check_pe_type(pe)
    _native.signal_op(signal_ptr, value, op, pe, _stream_handle(torch, stream, runtime))


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
    _check_name("cmp", cmp, _native.SIGNAL_CMPS)
    value = _check_value(value)
    runtime = _require_init("wait_signal")
    torch = _import_torch("wait_signal")
    signal_ptr = _check_signal(torch, signal, runtime)
    _native.wait_signal(signal_ptr, cmp, value, _stream_handle(torch, stream, runtime))
