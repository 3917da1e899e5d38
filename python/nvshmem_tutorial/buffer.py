"""Chapters 7 and 8 from PyTorch: ``Buffer``, DeepEP's ``Buffer`` (intranode normal mode and
low-latency mode) on this tutorial's kernels.

Names, arguments, defaults, return tuples and handle contents follow DeepEP v1 (commit
567632d), so code written against DeepEP switches with an import (``benchmarks/deepep_shim``
runs DeepEP's own tests this way). This module is the torch side only: it allocates outputs
with torch's caching allocator, orders the work on streams with events as DeepEP does, and
builds DeepEP's tuples. The checks, the size formulas and the kernels are Rust
(``nvshmem_tutorial._native.BufferCore``, the root crate's ``NvshmemBuffer``).

Streams: every operation runs on the buffer's communication stream. It first waits for
``previous_event`` if given, else for the current stream. With ``async_finish=False`` the
current stream then waits for the communication stream (results usable at once); with
``async_finish=True`` the returned ``EventOverlap`` holds an event on the communication stream
and the tensors involved are kept alive until it completes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Tuple, Union

from . import _native
from ._native import Config  # noqa: F401  (re-exported: DeepEP's Config)
from ._views import _current_stream_handle, _device_bytes, _maybe, _owned, _rows, _view

try:  # torch is only needed once a Buffer is used; importing the package must not need it
    import torch

    topk_idx_t = torch.int64
except ImportError:  # pragma: no cover - exercised by the CPU tests without torch
    torch = None  # type: ignore[assignment]
    topk_idx_t = None

#: Bound on every device and host wait of a buffer, in milliseconds.
TIMEOUT_MS = int(os.environ.get("NVSHMEM_TUTORIAL_TIMEOUT_MS", "10000"))


class EventOverlap:
    """An event to wait for, and tensors to keep alive until it completes (DeepEP's)."""

    def __init__(self, event: Optional[Any] = None, extra_tensors: Optional[Tuple[Any, ...]] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        """Makes the current stream wait for the event."""
        assert self.event is not None
        torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait()


class Buffer:
    """DeepEP's ``Buffer`` for one node: normal-mode dispatch and combine through NVLink, and
    with ``low_latency_mode=True`` the low-latency calls (chapter 8) in ``num_rdma_bytes``.
    ``num_qps_per_rank`` is accepted and unused (there are no queue pairs on NVLink).

    The constructor initialises NVSHMEM over ``group`` if nothing has yet (sizing the
    symmetric heap for this buffer unless ``NVSHMEM_SYMMETRIC_SIZE`` is set), then makes one
    symmetric allocation holding the buffer's rings. Options DeepEP has for other machines
    (inter-node normal mode, MNNVL, fabric memory, shrink) raise ``ValueError`` naming them.
    """

    #: SMs of the default configs (``set_num_sms``).
    num_sms: int = 20

    def __init__(
        self,
        group: Optional[Any],
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        use_fabric: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm: Optional[Any] = None,
    ) -> None:
        unsupported = [
            name
            for name, value in (
                ("comm (mpi4py)", comm is not None),
                ("allow_mnnvl", allow_mnnvl),
                ("use_fabric", use_fabric),
                ("enable_shrink", enable_shrink),
                (
                    "allow_nvlink_for_low_latency_mode=False (this buffer reaches its peers only through NVLink)",
                    low_latency_mode and not allow_nvlink_for_low_latency_mode,
                ),
                ("num_rdma_bytes > 0 (inter-node normal mode)", num_rdma_bytes > 0 and not low_latency_mode),
            )
            if value
        ]
        if unsupported:
            raise ValueError(f"Buffer: not supported by nvshmem_tutorial: {', '.join(unsupported)}")
        if group is None:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        import torch.distributed as dist

        from ._bootstrap import init

        self.group = group
        self.rank = group.rank()
        self.group_size = group.size()
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        if not _native.is_initialized():
            heap = _native.buffer_heap_bytes(self.group_size, num_nvl_bytes, num_rdma_bytes)
            # Room for this buffer, a communicator and some tensors: rounded up to whole GiB.
            os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", f"{(heap >> 30) + 2}G")
            init(group)
        self.runtime = _native.BufferCore(num_nvl_bytes, num_rdma_bytes, low_latency_mode, TIMEOUT_MS)
        self._comm_stream = torch.cuda.Stream(priority=-1)
        self._comm_stream_handle = self._comm_stream.cuda_stream
        dist.barrier(group)

    # ---- DeepEP's static helpers ------------------------------------------------------------

    def destroy(self) -> None:
        """Collective: frees the buffer (DeepEP requires ``explicitly_destroy=True``)."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        torch.cuda.synchronize()
        self.runtime.destroy()

    @staticmethod
    def is_sm90_compiled() -> bool:
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        assert new_num_sms % 2 == 0, "The SM count must be even"
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An event recorded on the current stream, as a ``previous_event``."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        return EventOverlap(event)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
        """Bytes of ``num_rdma_bytes`` low-latency calls of this shape need (bf16, the largest)."""
        return _native.low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return _native.dispatch_config(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return _native.combine_config(num_ranks, Buffer.num_sms)

    def get_comm_stream(self) -> Any:
        return self._comm_stream

    def get_local_buffer_tensor(self, dtype: Any, size: Optional[Any] = None, offset: int = 0, use_rdma_buffer: bool = False) -> Any:
        """A tensor over this rank's region of the buffer (raw bytes from ``offset``)."""
        address, length = self.runtime.local_region(use_rdma_buffer)
        region = _device_bytes(address, length)
        region = region[offset:].view(dtype) if offset or dtype != torch.uint8 else region
        if size is None:
            return region
        numel = 1
        for d in size:
            numel *= d
        return region[:numel].view(size)

    # ---- stream and event handling, as DeepEP's -----------------------------------------------

    def _run(self, previous_event: Optional[EventOverlap], async_finish: bool, allocate_on_comm_stream: bool, work: Callable[[int], tuple]) -> Tuple[tuple, EventOverlap]:
        """Runs `work(stream handle)` on the comm stream after the current stream (or
        `previous_event`); returns its result and DeepEP's EventOverlap."""
        if allocate_on_comm_stream and (previous_event is None or not async_finish):
            raise ValueError("allocate_on_comm_stream needs previous_event and async_finish (as in DeepEP)")
        compute = torch.cuda.current_stream()
        comm = self._comm_stream
        if previous_event is not None:
            comm.wait_event(previous_event.event)
        else:
            comm.wait_stream(compute)
        with torch.cuda.stream(comm if allocate_on_comm_stream else compute):
            result = work(comm.cuda_stream)
        if async_finish:
            return result, _event_after(comm, result)
        compute.wait_stream(comm)
        return result, EventOverlap(None)

    # ---- layout, dispatch, combine --------------------------------------------------------------

    def get_dispatch_layout(
        self,
        topk_idx: Any,
        num_experts: int,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> Tuple[Any, Optional[Any], Any, Any, EventOverlap]:
        """``(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32,
        is_token_in_rank [N, R] bool, event)``."""
        device = topk_idx.device

        def work(stream: int) -> tuple:
            per_rank = torch.empty(self.group_size, dtype=torch.int32, device=device)
            per_expert = torch.empty(num_experts, dtype=torch.int32, device=device)
            in_rank = torch.empty((topk_idx.shape[0], self.group_size), dtype=torch.bool, device=device)
            self.runtime.get_dispatch_layout(_view(topk_idx), num_experts, _view(per_rank), _view(per_expert), _view(in_rank), stream)
            return per_rank, per_expert, in_rank

        (per_rank, per_expert, in_rank), event = self._run(previous_event, async_finish, allocate_on_comm_stream, work)
        return per_rank, None, per_expert, in_rank, event

    def dispatch(
        self,
        x: Union[Any, Tuple[Any, Any]],
        handle: Optional[Tuple] = None,
        num_tokens_per_rank: Optional[Any] = None,
        num_tokens_per_rdma_rank: Optional[Any] = None,
        is_token_in_rank: Optional[Any] = None,
        num_tokens_per_expert: Optional[Any] = None,
        topk_idx: Optional[Any] = None,
        topk_weights: Optional[Any] = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> Tuple[Union[Tuple[Any, Any], Any], Optional[Any], Optional[Any], List[int], Tuple, EventOverlap]:
        """DeepEP's intranode dispatch: ``(recv_x or (recv_x, recv_x_scales), recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)``; with a cached
        ``handle``: ``(recv_x..., None, None, None, None, event)``."""
        config = self.get_dispatch_config(self.group_size) if config is None else config
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if num_tokens_per_rdma_rank is not None:
            raise ValueError("num_tokens_per_rdma_rank is for inter-node dispatch, which this buffer does not have")
        hidden = x.shape[1]
        device = x.device
        num_scales = x_scales.shape[1] if x_scales is not None else 0

        def outputs(rows: int, num_topk: int) -> tuple:
            recv_x = torch.empty((rows, hidden), dtype=x.dtype, device=device)
            recv_scales = torch.empty((rows, num_scales), dtype=torch.float32, device=device) if x_scales is not None else None
            recv_idx = torch.empty((rows, num_topk), dtype=topk_idx_t, device=device) if num_topk else None
            recv_w = torch.empty((rows, num_topk), dtype=torch.float32, device=device) if num_topk else None
            return recv_x, recv_scales, recv_idx, recv_w

        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise ValueError("a cached dispatch (handle given) takes no topk_idx/topk_weights")

            def cached(stream: int) -> tuple:
                recv_x, recv_scales, _, _ = outputs(handle[3].shape[0], 0)
                self.runtime.dispatch(_view(x), _maybe(x_scales), None, None, 0, tuple(_view(h) for h in handle), _view(recv_x), _maybe(recv_scales), None, None, config, stream)
                return recv_x, recv_scales

            (recv_x, recv_scales), event = self._run(previous_event, async_finish, allocate_on_comm_stream, cached)
            return (recv_x if recv_scales is None else (recv_x, recv_scales)), None, None, None, None, event

        if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
            raise ValueError("dispatch without a handle needs num_tokens_per_rank, is_token_in_rank and num_tokens_per_expert (from get_dispatch_layout)")
        if num_worst_tokens and topk_idx is None:
            raise ValueError("num_worst_tokens > 0 needs topk_idx (as in DeepEP)")
        num_experts = num_tokens_per_expert.shape[0]
        num_topk = topk_idx.shape[1] if topk_idx is not None else 0
        channels = config.num_sms // 2

        def fresh(stream: int) -> tuple:
            rank_prefix = torch.empty((self.group_size, self.group_size), dtype=torch.int32, device=device)
            channel_prefix = torch.empty((self.group_size, channels), dtype=torch.int32, device=device)
            recv_channel_prefix = torch.empty((self.group_size, channels), dtype=torch.int32, device=device)
            counts = self.runtime.notify(
                _view(num_tokens_per_rank), _view(num_tokens_per_expert), _view(is_token_in_rank), expert_alignment,
                _view(rank_prefix), _view(channel_prefix), _view(recv_channel_prefix), config, num_worst_tokens == 0, stream,
            )
            rows = num_worst_tokens if num_worst_tokens else counts[0]
            recv_x, recv_scales, recv_idx, recv_w = outputs(rows, num_topk)
            recv_src_idx = torch.empty(rows, dtype=torch.int32, device=device)
            send_head = torch.empty((x.shape[0], self.group_size), dtype=torch.int32, device=device)
            handle = (rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, is_token_in_rank, send_head)
            self.runtime.dispatch(
                _view(x), _maybe(x_scales), _maybe(topk_idx), _maybe(topk_weights), num_experts, tuple(_view(h) for h in handle),
                _view(recv_x), _maybe(recv_scales), _maybe(recv_idx), _maybe(recv_w), config, stream,
            )
            per_expert = [] if num_worst_tokens else list(counts[1])
            return recv_x, recv_scales, recv_idx, recv_w, per_expert, handle

        (recv_x, recv_scales, recv_idx, recv_w, per_expert, handle), event = self._run(previous_event, async_finish, allocate_on_comm_stream, fresh)
        return (recv_x if recv_scales is None else (recv_x, recv_scales)), recv_idx, recv_w, per_expert, handle, event

    def combine(
        self,
        x: Any,
        handle: Tuple,
        topk_weights: Optional[Any] = None,
        bias: Union[Any, Tuple[Any, Any], None] = None,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> Tuple[Any, Optional[Any], EventOverlap]:
        """DeepEP's intranode combine: ``(combined_x [N, H] bf16, combined_topk_weights
        [N, K] f32 or None, event)``: each token's results from every rank it went to,
        summed (plus the biases) in fp32 and rounded once."""
        config = self.get_combine_config(self.group_size) if config is None else config
        bias0, bias1 = bias if isinstance(bias, tuple) else (bias, None)
        num_tokens = handle[5].shape[0]

        def work(stream: int) -> tuple:
            combined = torch.empty((num_tokens, x.shape[1]), dtype=x.dtype, device=x.device)
            combined_w = None
            if topk_weights is not None:
                combined_w = torch.empty((num_tokens, topk_weights.shape[1]), dtype=torch.float32, device=x.device)
            self.runtime.combine(_view(x), _maybe(topk_weights), _maybe(bias0), _maybe(bias1), tuple(_view(h) for h in handle), _view(combined), _maybe(combined_w), config, stream)
            return combined, combined_w

        (combined, combined_w), event = self._run(previous_event, async_finish, allocate_on_comm_stream, work)
        return combined, combined_w, event

    # ---- low-latency mode (chapter 8) -------------------------------------------------------------

    def _ll_streams(self, tensor: Any, async_finish: bool, return_recv_hook: bool) -> Tuple[int, int, bool]:
        """(compute stream, comm stream or 0, join) as the native calls take them. As DeepEP:
        with the hook everything runs on the current stream; otherwise on the comm stream after
        the current one, which waits for it unless `async_finish` (the event does then)."""
        if async_finish and return_recv_hook:
            raise ValueError("async_finish and return_recv_hook cannot both be set (as in DeepEP)")
        compute = _current_stream_handle(tensor.device.index)
        if return_recv_hook:
            return compute, 0, False
        return compute, self._comm_stream_handle, not async_finish

    def _ll_local_experts(self, num_experts: int) -> int:
        if num_experts <= 0 or num_experts % self.group_size:
            raise ValueError(f"num_experts = {num_experts} must be a positive multiple of the {self.group_size} ranks")
        return num_experts // self.group_size

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Collective: zeroes the low-latency control words and call count on every rank. Our
        protocol never needs it (its flags only grow); it is DeepEP's API and a known starting
        point. It does not revive a buffer whose call timed out: destroy that one."""
        _native.clean_low_latency_buffer(self.runtime, num_max_dispatch_tokens_per_rank, hidden, num_experts, torch.cuda.current_stream().cuda_stream)

    def low_latency_dispatch(
        self,
        x: Any,
        topk_idx: Any,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats: Optional[Any] = None,
        dispatch_wait_recv_cost_stats: Optional[Any] = None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ) -> Tuple[Union[Tuple[Any, Any], Any], Any, Tuple, EventOverlap, Optional[Callable[[], None]]]:
        """DeepEP's low-latency dispatch: ``(recv_x or (recv_x fp8, scales), recv_count, handle,
        event, hook)``. ``recv_x`` is ``[num_local_experts, num_ranks * T, hidden]``; expert e's
        valid rows are the first ``recv_count[e]``. fp8 scales are f32 ``[E_local, R * T,
        hidden / 128]`` (or with ``use_ue8m0`` int32 ``[..., hidden / 512]``), column-major in
        the last two dimensions as DeepEP's. With ``return_recv_hook`` the call only sends;
        ``hook()`` receives. Capturable in a CUDA graph."""
        if x.dim() != 2:
            raise ValueError(f"x must be [num_tokens, hidden], got shape {list(x.shape)}")
        num_local = self._ll_local_experts(num_experts)
        num_ranks, slots, hidden = self.group_size, num_max_dispatch_tokens_per_rank, x.shape[1]
        compute, comm, join = self._ll_streams(x, async_finish, return_recv_hook)
        device = x.device
        recv_x = torch.empty((num_local, num_ranks * slots, hidden), dtype=torch.float8_e4m3fn if use_fp8 else torch.bfloat16, device=device)
        recv_src_info = torch.empty((num_local, num_ranks * slots), dtype=torch.int32, device=device)
        recv_layout_range = torch.empty((num_local, num_ranks), dtype=torch.int64, device=device)
        recv_count = torch.empty((num_local,), dtype=torch.int32, device=device)
        scales_storage = scales_view = None
        if use_fp8:
            groups, dtype = (hidden // 512, torch.int32) if use_ue8m0 else (hidden // 128, torch.float32)
            scales_storage = torch.empty((num_local, groups, num_ranks * slots), dtype=dtype, device=device)
            scales_view = _owned(scales_storage, num_local * groups, num_ranks * slots)
        # The outputs are ours (shapes known): described without asking torch again.
        outputs = (
            _owned(recv_x, num_local * num_ranks * slots, hidden), scales_view,
            _owned(recv_src_info, num_local, num_ranks * slots), _owned(recv_layout_range, num_local, num_ranks),
            _owned(recv_count, num_local),
        )
        inputs = (_view(x), _view(topk_idx), _maybe(cumulative_local_expert_recv_stats), _maybe(dispatch_wait_recv_cost_stats))

        def run(phases: str) -> None:
            _native.low_latency_dispatch(self.runtime, *inputs, slots, num_experts, use_fp8, round_scale, use_ue8m0, *outputs, phases, compute, comm, join)

        run("send" if return_recv_hook else "both")
        tensors = (x, topk_idx, recv_x, scales_storage, recv_count, recv_src_info, recv_layout_range, cumulative_local_expert_recv_stats)
        event = _event_after(self._comm_stream, tensors) if async_finish else EventOverlap(None)
        hook = (lambda: run("recv")) if return_recv_hook else None
        handle = (recv_src_info, recv_layout_range, slots, hidden, num_experts)
        recv = (recv_x, scales_storage.transpose(1, 2)) if use_fp8 else recv_x
        return recv, recv_count, handle, event, hook

    def low_latency_combine(
        self,
        x: Any,
        topk_idx: Any,
        topk_weights: Any,
        handle: Tuple,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out: Optional[Any] = None,
        combine_wait_recv_cost_stats: Optional[Any] = None,
    ) -> Tuple[Any, EventOverlap, Optional[Callable[[], None]]]:
        """DeepEP's low-latency combine: ``(combined_x [num_tokens, hidden] bf16, event, hook)``,
        each token's expert results weighted by ``topk_weights`` and summed in fp32. With
        ``zero_copy`` the results are read from ``get_next_low_latency_combine_buffer``."""
        if use_logfmt:
            raise ValueError("low_latency_combine: use_logfmt (DeepEP's LogFMT compression) is not supported by nvshmem_tutorial")
        src_info, layout_range, slots, hidden, num_experts = handle
        if not zero_copy and x.dim() != 3:
            raise ValueError(f"x must be [num_local_experts, num_ranks * T, hidden], got shape {list(x.shape)}")
        compute, comm, join = self._ll_streams(topk_idx, async_finish, return_recv_hook)
        num_tokens = topk_idx.shape[0]
        if out is None:
            combined = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=topk_idx.device)
            out_view = _owned(combined, num_tokens, hidden)
        else:
            combined, out_view = out, _view(out)
        x_view = None if zero_copy else _rows(x)
        args = (x_view, _view(topk_idx), _view(topk_weights), _view(src_info), _view(layout_range), slots, hidden, num_experts, _maybe(combine_wait_recv_cost_stats), out_view)

        def run(phases: str) -> None:
            _native.low_latency_combine(self.runtime, *args, phases, compute, comm, join)

        run("send" if return_recv_hook else "both")
        event = _event_after(self._comm_stream, (x, topk_idx, topk_weights, src_info, layout_range, combined)) if async_finish else EventOverlap(None)
        hook = (lambda: run("recv")) if return_recv_hook else None
        return combined, event, hook

    def get_next_low_latency_combine_buffer(self, handle: object) -> Any:
        """The rows a ``zero_copy`` combine reads: bf16 ``[num_local_experts, num_ranks * T,
        hidden]`` in this rank's region. Write the expert outputs there, then combine with
        ``zero_copy=True``."""
        _, _, slots, hidden, num_experts = handle
        address, rows, cols = _native.next_low_latency_combine_buffer(self.runtime, slots, hidden, num_experts)
        num_local = self._ll_local_experts(num_experts)
        staging = _device_bytes(address, rows * cols * 2).view(torch.bfloat16)
        return staging.view(num_local, self.group_size * slots, hidden)

    def __getattr__(self, name: str) -> Any:
        if name in {"internode_dispatch", "internode_combine"}:
            raise ValueError(f"Buffer.{name}: inter-node normal mode is not supported by nvshmem_tutorial (one node)")
        if name in {"low_latency_update_mask_buffer", "low_latency_query_mask_buffer", "low_latency_clean_mask_buffer"}:
            raise ValueError(f"Buffer.{name}: shrink mode (masking failed ranks) is not supported by nvshmem_tutorial")
        raise AttributeError(name)


def _event_after(stream: Any, work: Any) -> EventOverlap:
    """DeepEP's async_finish: an event after what `stream` has queued, with every tensor in
    `work` marked as used by `stream` and kept alive until the event completes."""
    event = torch.cuda.Event()
    event.record(stream)
    tensors = tuple(_tensors_in(work))
    for tensor in tensors:
        tensor.record_stream(stream)
    return EventOverlap(event, tensors)


def _tensors_in(value: Any) -> List[Any]:
    """Every tensor in a nest of tuples and lists (what async_finish keeps alive)."""
    if torch is not None and isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    return []

