"""Chapters 7 and 8 from PyTorch: ``Buffer``, DeepEP's ``Buffer`` (intranode normal mode and
low-latency mode) on this tutorial's kernels.

Names, arguments, defaults, return tuples and handle contents follow DeepEP v1 (commit
567632d), so code written against DeepEP switches with an import (``benchmarks/deepep_shim``
runs DeepEP's own tests this way). This module only shapes DeepEP's signatures and tuples:
each call is one call into ``nvshmem_tutorial._native.BufferCore`` (python/src/buffer.rs, the
calls of each mode in python/src/buffer/), which reads the tensors, checks everything (the
root crate's plans), orders the streams, allocates the outputs with torch's caching allocator
and launches the kernels.

Streams, as DeepEP: a call runs on the buffer's communication stream, which first waits for
``previous_event`` if given, else for the current stream. With ``async_finish=False`` the
current stream then waits for it (results usable at once); with ``async_finish=True`` the
returned ``EventOverlap`` holds an event on the communication stream, and the call's tensors
are kept alive until it completes. A low-latency call with ``return_recv_hook=True`` runs on
the current stream, and ``hook()`` runs its receive half.

Errors: bad input raises ``InvalidArgumentError`` (a ``ValueError``) before anything is
launched; what a kernel records (a timeout, an expert id out of range) raises at the next call,
at ``EventOverlap.current_stream_wait()``, in a receive hook, in ``check()`` and in
``destroy()``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Tuple, Union

from . import _native
from ._native import Config, InvalidArgumentError  # noqa: F401  (Config: DeepEP's, re-exported)

try:  # torch is only needed once a Buffer is used; importing the package must not need it
    import torch

    topk_idx_t = torch.int64
except ImportError:  # pragma: no cover - exercised by the CPU tests without torch
    torch = None  # type: ignore[assignment]
    topk_idx_t = None


def _source_meta_bytes(recv_src_meta: Any) -> Any:
    """Handle position 7 as DeepEP gives it: [M, 8] uint8 (the kernels write [M, 2] int32:
    {source node, in-node rank mask}, DeepEP's ``SourceMeta`` bytes at nodes of 8)."""
    return recv_src_meta.view(torch.uint8)


def _source_meta_words(recv_src_meta: Any) -> Any:
    """Handle position 7 as the kernels read it ([M, 2] int32), from DeepEP's [M, 8] uint8."""
    return recv_src_meta.view(torch.int32) if recv_src_meta.dtype == torch.uint8 else recv_src_meta


class EventOverlap:
    """An event to wait for, and tensors to keep alive until it completes (DeepEP's)."""

    def __init__(self, event: Optional[Any] = None, extra_tensors: Optional[Tuple[Any, ...]] = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        """Makes the current stream wait for the event, then raises what a kernel of the
        buffer recorded (its error record is read)."""
        assert self.event is not None
        self.event.current_stream_wait()

    def __enter__(self) -> "EventOverlap":
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.event.current_stream_wait()


class Buffer:
    """DeepEP's ``Buffer``: normal-mode dispatch and combine through NVLink inside one node, and
    across nodes (``num_rdma_bytes > 0``, issue 32: DeepEP's internode mode, any node size G
    from 1 to 8, up to 64 ranks), and with ``low_latency_mode=True`` the low-latency calls
    (chapter 8) in ``num_rdma_bytes``, up to 256 ranks across nodes (peer stores inside a node,
    NVSHMEM puts across). The node size is chapter 5's: the real node, or virtual nodes of G
    ranks with ``NVSHMEM_TUTORIAL_NODE_PES=G``. ``dispatch`` and ``combine`` go across nodes
    when ``runtime.get_num_rdma_ranks() > 1``, as DeepEP's (``internode_dispatch`` /
    ``internode_combine``). A buffer made with ``low_latency_mode=True`` across nodes (up to 64
    ranks) serves both modes, as DeepEP's (its ``test_internode.py --test-ll-compatibility``):
    the normal calls' rings and the low-latency region share ``num_rdma_bytes`` (Rust's
    ``mode_sharing`` module), so size it with the larger of the two hints,
    ``max(Config.get_buffer_size_hints_for_nodes(...)[1], get_low_latency_rdma_size_hint(...))``,
    and call ``clean_low_latency_buffer`` on every rank between a normal call and the next
    low-latency one (the runtime refuses the low-latency call without it, as DeepEP requires the
    clean); a normal call after low-latency ones needs nothing (its notify step is a barrier),
    but not while a receive hook is pending. What ``get_next_low_latency_combine_buffer`` holds
    does not survive a normal call. At more than 64 ranks a low-latency buffer has its
    low-latency calls only. ``allow_nvlink_for_low_latency_mode=False`` is nodes of one rank:
    it needs ``NVSHMEM_TUTORIAL_NODE_PES=1``. ``num_qps_per_rank`` is accepted and unused
    (NVSHMEM maps its own queue pairs).

    The constructor initialises NVSHMEM over ``group`` if nothing has yet (sizing the
    symmetric heap for this buffer unless ``NVSHMEM_SYMMETRIC_SIZE`` is set), then makes one
    symmetric allocation holding the buffer's rings. ``num_rdma_bytes > 0`` outside low-latency
    mode on one node raises ``ValueError`` (there is no network stage); size it across nodes
    with ``Config.get_buffer_size_hints_for_nodes(hidden_bytes, num_ranks, node_pes)``.
    Options DeepEP has for other machines (MNNVL, fabric memory, shrink) raise ``ValueError``
    naming them.

    ``timeout_ms`` (ours) bounds every wait of the buffer, on the GPU and on the host; by
    default ``NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS``, else 100 s (DeepEP's bound).
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
        *, timeout_ms: Optional[int] = None,  # ours, keyword-only: after DeepEP's arguments
    ) -> None:
        unsupported = [
            name
            for name, value in (
                ("comm (mpi4py)", comm is not None),
                ("allow_mnnvl", allow_mnnvl),
                ("use_fabric", use_fabric),
                ("enable_shrink", enable_shrink),
                (
                    "allow_nvlink_for_low_latency_mode=False without NVSHMEM_TUTORIAL_NODE_PES=1 "
                    "(every peer through NVSHMEM's RMA calls is nodes of one rank: set it)",
                    low_latency_mode
                    and not allow_nvlink_for_low_latency_mode
                    and os.environ.get("NVSHMEM_TUTORIAL_NODE_PES", "").strip() != "1",
                ),
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
        self._comm_stream = torch.cuda.Stream(priority=-1)
        self.runtime = _native.BufferCore(num_nvl_bytes, num_rdma_bytes, low_latency_mode, self._comm_stream, timeout_ms)
        # Views of the buffer's own memory, made once (they keep the memory alive: destroy()
        # drops them).
        self._regions: dict = {}
        dist.barrier(group)

    # ---- lifetime and errors ------------------------------------------------------------------

    def destroy(self) -> None:
        """Collective: releases the buffer (DeepEP requires ``explicitly_destroy=True``) after
        waiting for the GPU, and raises what its kernels recorded. Its memory returns to
        NVSHMEM at the collect point that follows (or, while a tensor from
        ``get_local_buffer_tensor`` or ``get_next_low_latency_combine_buffer`` is alive, at a
        later one: such views stay valid)."""
        assert self.explicitly_destroy, "`explicitly_destroy` flag must be set"
        from ._tensors import collect

        self._regions.clear()
        try:
            self.runtime.destroy()
        except InvalidArgumentError:  # bad input a kernel saw: the buffer itself is sound
            collect()
            raise
        # A failed kernel (NvshmemError) skips the collective step: a peer may be gone.
        collect()

    def check(self) -> None:
        """Raises what a kernel of this buffer recorded (a timeout naming the rank and what it
        waited for, an expert id out of range), if anything. Cheap: reads host memory, never
        waits for the GPU, so it sees what finished kernels recorded: synchronise the stream
        first to see the last call's. Under CUDA-graph replay, call it after ``replay()`` and a
        synchronise."""
        self.runtime.check()

    @property
    def timeout_ms(self) -> int:
        """The bound on every wait of this buffer, in milliseconds."""
        return self.runtime.timeout_ms

    # ---- DeepEP's static helpers ------------------------------------------------------------

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
        return EventOverlap(_native.capture())

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

    # ---- views of the buffer's memory --------------------------------------------------------

    def _region(self, key: Any, make: Callable[[], Tuple[object, Any]]) -> Any:
        """The view `make` describes (a DLPack capsule and a dtype/shape), made once per key."""
        view = self._regions.get(key)
        if view is None:
            from ._tensors import _from_capsule

            capsule, shape = make()
            view = _from_capsule(torch, capsule)
            if shape is not None:
                view = view.view(torch.bfloat16).view(shape)
            self._regions[key] = view
        return view

    def get_local_buffer_tensor(self, dtype: Any, size: Optional[Any] = None, offset: int = 0, use_rdma_buffer: bool = False) -> Any:
        """A tensor over this rank's region of the buffer (raw bytes from ``offset``). It keeps
        the buffer's memory alive, also after ``destroy()``."""
        region = self._region(use_rdma_buffer, lambda: (self.runtime.local_region(use_rdma_buffer), None))
        region = region[offset:].view(dtype) if offset or dtype != torch.uint8 else region
        if size is None:
            return region
        numel = 1
        for d in size:
            numel *= d
        return region[:numel].view(size)

    def get_next_low_latency_combine_buffer(self, handle: object) -> Any:
        """The rows a ``zero_copy`` combine reads: bf16 ``[num_local_experts, num_ranks * T,
        hidden]`` in this rank's region. Write the expert outputs there, then combine with
        ``zero_copy=True``. It keeps the buffer's memory alive, also after ``destroy()``."""
        return self._region(tuple(handle[2:]), lambda: self.runtime.next_low_latency_combine_buffer(handle))

    # ---- layout, dispatch, combine --------------------------------------------------------------

    def get_dispatch_layout(
        self,
        topk_idx: Any,
        num_experts: int,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> Tuple[Any, Optional[Any], Any, Any, EventOverlap]:
        """``(num_tokens_per_rank [R] int32, num_tokens_per_rdma_rank [R / G] int32 or None,
        num_tokens_per_expert [E] int32, is_token_in_rank [N, R] bool, event)``: the per-node
        counts (a token once per node it has an expert on) when the buffer spans several nodes
        of G ranks, else None, as DeepEP's."""
        streams = (previous_event, async_finish, allocate_on_comm_stream)
        per_rank, per_node, per_expert, in_rank, event = self.runtime.get_dispatch_layout(topk_idx, num_experts, streams)
        return per_rank, per_node, per_expert, in_rank, EventOverlap(event)

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
        """DeepEP's dispatch: ``(recv_x or (recv_x, recv_x_scales), recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)``; with a cached
        ``handle``: ``(recv_x..., None, None, None, None, event)``. Across nodes
        (``runtime.get_num_rdma_ranks() > 1``) it is ``internode_dispatch``, as DeepEP's."""
        if self.runtime.get_num_rdma_ranks() > 1:
            return self.internode_dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                                           num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, num_worst_tokens, config,
                                           previous_event, async_finish, allocate_on_comm_stream)
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        if num_tokens_per_rdma_rank is not None:
            raise ValueError("num_tokens_per_rdma_rank is for a buffer across nodes; this one is one node (get_num_rdma_ranks() == 1)")
        topk, streams = (topk_idx, topk_weights), (previous_event, async_finish, allocate_on_comm_stream)
        if handle is not None:
            recv_x, recv_scales, event = self.runtime.dispatch_cached(x, x_scales, handle, topk, config, Buffer.num_sms, streams)
            return (recv_x if recv_scales is None else (recv_x, recv_scales)), None, None, None, None, EventOverlap(event)
        layout = (num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert)
        recv_x, recv_scales, recv_idx, recv_w, per_expert, handle, event = self.runtime.dispatch(
            x, x_scales, layout, topk, expert_alignment, num_worst_tokens, config, Buffer.num_sms, streams
        )
        return (recv_x if recv_scales is None else (recv_x, recv_scales)), recv_idx, recv_w, per_expert, handle, EventOverlap(event)

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
        """DeepEP's combine: ``(combined_x [N, H] bf16, combined_topk_weights [N, K] f32 or
        None, event)``: each token's results from every rank it went to, summed (plus the
        biases) in fp32 and rounded once. Across nodes (``runtime.get_num_rdma_ranks() > 1``)
        it is ``internode_combine``, as DeepEP's."""
        if self.runtime.get_num_rdma_ranks() > 1:
            return self.internode_combine(x, handle, topk_weights, bias, config, previous_event, async_finish, allocate_on_comm_stream)
        bias = bias if isinstance(bias, tuple) else (bias, None)
        streams = (previous_event, async_finish, allocate_on_comm_stream)
        combined, combined_w, event = self.runtime.combine(x, handle, topk_weights, bias, config, Buffer.num_sms, streams)
        return combined, combined_w, EventOverlap(event)

    # ---- normal mode across nodes (issue 32) ---------------------------------------------------

    def internode_dispatch(
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
        """DeepEP's internode dispatch (``dispatch`` calls it across nodes): the notify step
        across nodes, then each token once to each destination node (to the rank of its local
        index there), which forwards it over NVLink. Returns what ``dispatch`` does; the handle
        is DeepEP's 10-tuple, in DeepEP's order::

            (is_token_in_rank [T, n] bool, rdma_channel_prefix_matrix [N, C] int32,
             gbl_channel_prefix_matrix [n, C], recv_rdma_channel_prefix_matrix [N, C],
             recv_rdma_rank_prefix_sum [N], recv_gbl_channel_prefix_matrix [n, C],
             recv_gbl_rank_prefix_sum [n], recv_src_meta [M, 8] uint8,
             send_rdma_head [T, N] int32, send_nvl_head [M_r, G] int32)

        for n ranks in N nodes of G, C = config.num_sms / 2 channels, M rows received, M_r
        forwarded. Positions 0-6 have DeepEP's meaning and values (``handle[-4]``, the rows
        received from ranks 0..s, is what DeepEP's test reads). Where ours differ:
        ``recv_src_meta`` holds {source node int32, in-node rank mask uint32} (DeepEP's
        ``SourceMeta`` bytes at nodes of 8); ``send_rdma_head`` is the token's index in its
        channel's stream to node k (-1: not sent), never rewritten; ``send_nvl_head`` is G wide
        (DeepEP's 8) and keeps its -1 entries (DeepEP rewrites them before a combine), its other
        values are positions in our NVL rings. Pass the handle back unchanged.

        With ``handle`` (DeepEP's cached mode): the handle's counts and positions, no top-k,
        no host wait; returns ``(recv_x..., None, None, None, None, event)``. With
        ``num_worst_tokens`` W: outputs of W rows (received and forwarded), no host wait (CUDA
        graphs), an empty per-expert list, ``recv_topk_idx`` -1 past the rows received; a call
        that would deliver or forward more drops the rest, and the overflow the kernels record
        raises ``InvalidArgumentError`` at the next check."""
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        topk, streams = (topk_idx, topk_weights), (previous_event, async_finish, allocate_on_comm_stream)
        if handle is not None:
            handle = tuple(handle)
            handle = (*handle[:7], _source_meta_words(handle[7]), *handle[8:]) if len(handle) == 10 else handle
            recv_x, recv_scales, event = self.runtime.internode_dispatch_cached(x, x_scales, handle, topk, config, Buffer.num_sms, streams)
            return (recv_x if recv_scales is None else (recv_x, recv_scales)), None, None, None, None, EventOverlap(event)
        layout = (num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank, num_tokens_per_expert)
        recv_x, recv_scales, recv_idx, recv_w, per_expert, handle, event = self.runtime.internode_dispatch(
            x, x_scales, layout, topk, expert_alignment, num_worst_tokens, config, Buffer.num_sms, streams
        )
        handle = (*handle[:7], _source_meta_bytes(handle[7]), *handle[8:])
        return (recv_x if recv_scales is None else (recv_x, recv_scales)), recv_idx, recv_w, per_expert, handle, EventOverlap(event)

    def internode_combine(
        self,
        x: Any,
        handle: Union[tuple, list],
        topk_weights: Optional[Any] = None,
        bias: Union[Any, Tuple[Any, Any], None] = None,
        config: Optional[Config] = None,
        previous_event: Optional[EventOverlap] = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ) -> Tuple[Any, Optional[Any], EventOverlap]:
        """DeepEP's internode combine (``combine`` calls it across nodes), with the 10-tuple
        handle of ``internode_dispatch``: each rank's rows go back to the rank that forwarded
        them, which sums a token's rows of its node (fp32, rounded to bf16 once), and that sum
        crosses the network once to the token's rank, where the nodes' sums and the biases are
        added (fp32, rounded once). ``(combined_x [T, H] bf16, combined_topk_weights [T, K] f32
        or None, event)``. Results are bitwise repeatable (the order is fixed by the handle)."""
        bias = bias if isinstance(bias, tuple) else (bias, None)
        streams = (previous_event, async_finish, allocate_on_comm_stream)
        combined, combined_w, event = self.runtime.internode_combine(x, tuple(handle), topk_weights, bias, config, Buffer.num_sms, streams)
        return combined, combined_w, EventOverlap(event)

    # ---- low-latency mode (chapter 8) -------------------------------------------------------------

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Collective: zeroes the low-latency control words and call count on every rank. Our
        protocol never needs it (its flags only grow); it is DeepEP's API and a known starting
        point. It does not revive a buffer whose call timed out: destroy that one."""
        self.runtime.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

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
        stats, fp8 = (cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats), (use_fp8, round_scale, use_ue8m0)
        recv_x, scales, recv_count, handle, event, hook = self.runtime.low_latency_dispatch(
            x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, stats, fp8, async_finish, return_recv_hook
        )
        recv = (recv_x, scales.transpose(1, 2)) if use_fp8 else recv_x
        return recv, recv_count, handle, EventOverlap(event), hook

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
        combined, event, hook = self.runtime.low_latency_combine(
            x, topk_idx, topk_weights, handle, zero_copy, async_finish, return_recv_hook, out, combine_wait_recv_cost_stats
        )
        return combined, EventOverlap(event), hook

    def __getattr__(self, name: str) -> Any:
        if name in {"low_latency_update_mask_buffer", "low_latency_query_mask_buffer", "low_latency_clean_mask_buffer"}:
            raise ValueError(f"Buffer.{name}: shrink mode (masking failed ranks) is not supported by nvshmem_tutorial")
        raise AttributeError(name)
