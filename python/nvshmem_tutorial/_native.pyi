"""Type stubs of the Rust extension (python/src/*.rs): every name ``_native`` exports.
Pointers are device addresses as ints (``tensor.data_ptr()``), streams are ``cudaStream_t`` as
ints (``stream.cuda_stream``); the buffer's calls take torch tensors themselves."""

from typing import Any, List, Optional, Tuple

__version__: str
UNIQUE_ID_BYTES: int
SIGNAL_OPS: Tuple[str, ...]
"""Names put_signal/signal_op take as ``op``: ("set", "add")."""
SIGNAL_CMPS: Tuple[str, ...]
"""Names wait_signal takes as ``cmp``: ("eq", "ne", "gt", "ge", "lt", "le")."""
BUFFER_TIMEOUT_VAR: str
"""``"NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS"``: the default bound on a Buffer's waits."""
NODE_PES_VAR: str
"""``"NVSHMEM_TUTORIAL_NODE_PES"``: cuts chapter 5's nodes into virtual nodes of that many PEs."""
INTER_NODE_METHODS: Tuple[str, ...]
"""Names the inter-node calls take as ``method``: ("hierarchical", "nvshmem_teams", "flat")."""

class NvshmemError(RuntimeError): ...
class NotInitializedError(NvshmemError): ...
class NoDeviceError(NvshmemError): ...
class LibraryError(NvshmemError): ...
class InvalidArgumentError(ValueError): ...
class NotSymmetricError(InvalidArgumentError): ...
class OutOfBoundsError(InvalidArgumentError): ...
class PeOutOfRangeError(InvalidArgumentError): ...

def to_dlpack(ptr: int, num_bytes: int, anchor_ptr: int) -> object:
    """A DLPack capsule: uint8 [num_bytes] at device address ``ptr`` on this PE's GPU, keeping
    the symmetric allocation containing ``anchor_ptr`` alive until the consumer's tensor dies."""

def library_info() -> Tuple[str, Tuple[int, int, int]]: ...
def pinned_nvshmem_version() -> Tuple[int, int, int]: ...
def probe_driver() -> None: ...
def unique_id() -> bytes: ...
def init(rank: int, world_size: int, device: int, unique_id: bytes) -> None: ...
def is_initialized() -> bool: ...
def finalize() -> int: ...
def topology() -> Tuple[int, int, int, int, int]: ...
def alloc(num_bytes: int) -> Tuple[object, int, int]:
    """(DLPack capsule of uint8 [max(num_bytes, 1)], allocation id, device pointer)."""
def released_ids() -> List[int]: ...
def free_released(ids: List[int]) -> int: ...
def heap_usage() -> Tuple[int, int, int]: ...
def locate(ptr: int, num_bytes: int) -> Tuple[int, int]: ...
def peer_ptr(ptr: int, num_bytes: int, pe: int) -> Optional[int]: ...
def mark_consumed(capsule: object) -> None: ...
def put(dst_ptr: int, src_ptr: int, num_bytes: int, pe: int, stream: int, nbi: bool = False) -> None: ...
def get(dst_ptr: int, src_ptr: int, num_bytes: int, pe: int, stream: int, nbi: bool = False) -> None: ...
def barrier(stream: int) -> None: ...
def quiet(stream: int) -> None: ...
def signal_op_code(op: str) -> int:
    """NVSHMEM's nvshmemx_signal_op_t for ``op``; InvalidArgumentError for an unknown name."""
def signal_cmp_code(cmp: str) -> int:
    """NVSHMEM's nvshmemx_cmp_type_t for ``cmp``; InvalidArgumentError for an unknown name."""
def put_signal(
    dst_ptr: int,
    src_ptr: int,
    num_bytes: int,
    signal_ptr: int,
    value: int,
    op: str,
    pe: int,
    stream: int,
    nbi: bool = False,
) -> None:
    """``num_bytes`` from local ``src_ptr`` into ``pe``'s symmetric ``dst_ptr``, then ``op``
    ("set"/"add") ``value`` into ``pe``'s symmetric, 8-byte aligned u64 at ``signal_ptr``."""
def signal_op(signal_ptr: int, value: int, op: str, pe: int, stream: int) -> None: ...
def wait_signal(signal_ptr: int, cmp: str, value: int, stream: int) -> None:
    """Stalls ``stream`` until the local u64 at ``signal_ptr`` satisfies ``<cmp> value``
    (no timeout)."""

# ---- chapter 4: collectives (python/src/collectives.rs) ----------------------------------------
def sync_all(stream: int) -> None: ...
def all_reduce(out_ptr: int, in_ptr: int, count: int, dtype: str, algorithm: Optional[str], stream: int) -> None: ...
def reduce_scatter(out_ptr: int, in_ptr: int, count: int, dtype: str, algorithm: Optional[str], stream: int) -> None: ...
def all_gather(out_ptr: int, in_ptr: int, num_bytes: int, algorithm: Optional[str], stream: int) -> None: ...
def all_to_all(out_ptr: int, in_ptr: int, num_bytes: int, algorithm: Optional[str], stream: int) -> None: ...
def broadcast(out_ptr: int, in_ptr: int, num_bytes: int, root: int, algorithm: Optional[str], stream: int) -> None: ...
def all_to_all_v(out_ptr: int, out_rows: int, in_ptr: int, in_rows: int, row_bytes: int,
                 in_splits_ptr: int, out_splits_offsets_ptr: int, stream: int) -> None: ...
def check_collectives() -> None: ...

# ---- chapter 5: collectives across nodes (python/src/inter_node.rs) ----------------------------
def inter_node_layout() -> Tuple[int, int, int, int, int]:
    """(n_pes, node_pes, num_nodes, node, local): the live topology's, else the one the first
    inter-node call would make now."""
def _resolve_node_pes(env_value: Optional[str], local_world_size: Optional[int], nvshmem_node: int, n_pes: int) -> int:
    """The node size Topology::from_env takes from these inputs (no NVSHMEM needed)."""
def inter_node_all_reduce(out_ptr: int, in_ptr: int, count: int, dtype: str, method: str, stream: int) -> None: ...
def inter_node_reduce_scatter(out_ptr: int, in_ptr: int, count: int, dtype: str, method: str, stream: int) -> None: ...
def inter_node_all_gather(out_ptr: int, in_ptr: int, num_bytes: int, method: str, stream: int) -> None: ...
def inter_node_broadcast(out_ptr: int, in_ptr: int, num_bytes: int, root: int, method: str, stream: int) -> None: ...
def inter_node_all_to_all(out_ptr: int, in_ptr: int, num_bytes: int, method: str, stream: int) -> None: ...
def inter_node_all_to_all_v(out_ptr: int, out_rows: int, in_ptr: int, in_rows: int, row_bytes: int,
                            in_splits_ptr: int, out_splits_offsets_ptr: int, method: str, stream: int) -> None: ...
def check_inter_node() -> None: ...

# ---- chapters 7 and 8: the buffer (python/src/buffer.rs, config.rs, events.rs, low_latency.rs) --
Tensor = Any  # a torch.Tensor on the buffer's GPU
Shape3 = Tuple[int, int, int]

class Config:
    """DeepEP's Config: the same constructor, defaults, checks and size hints."""

    def __init__(
        self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6, num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6, num_max_rdma_chunked_recv_tokens: int = 256,
    ) -> None: ...
    @property
    def num_sms(self) -> int: ...
    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int: ...
    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int: ...
    def get_buffer_size_hints_for_nodes(self, hidden_bytes: int, num_ranks: int, node_pes: int) -> Tuple[int, int]: ...

def dispatch_config(num_ranks: int, num_sms: int) -> Config: ...
def combine_config(num_ranks: int, num_sms: int) -> Config: ...
def buffer_heap_bytes(n_pes: int, num_nvl_bytes: int, num_rdma_bytes: int) -> int: ...
def low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int: ...
def buffer_timeout_ms(timeout_ms: Optional[int] = None) -> int:
    """The timeout a Buffer gets: ``timeout_ms``, else BUFFER_TIMEOUT_VAR, else 100000;
    InvalidArgumentError naming the source for anything but 1..86400000."""

class Event:
    """A CUDA event (DeepEP's EventHandle): what EventOverlap wraps."""

    def current_stream_wait(self) -> None:
        """torch's current stream waits for the event; then raises what a kernel of its
        buffer recorded."""
    @property
    def cuda_event(self) -> int: ...

def capture() -> Event:
    """An event recorded on torch's current stream (Buffer.capture)."""

class ReceiveHook:
    """The receive half of a low-latency call made with return_recv_hook."""

    def __call__(self) -> None: ...

def _view(tensor: Tensor, name: str, device: int, as_rows: bool) -> Tuple[int, List[int], List[int], str]:
    """(address, shape, strides, dtype) of the view a buffer call makes of ``tensor``: what the
    CPU tests check (a CPU tensor, another GPU, a dtype or shape the buffer does not take)."""

Streams = Tuple[Optional[Any], bool, bool]
"""(previous_event, async_finish, allocate_on_comm_stream): DeepEP's stream arguments."""

class BufferCore:
    """The Rust buffer behind one Buffer; every DeepEP call is one method, with DeepEP's
    arguments in its order, a few grouped in tuples (``streams``, ``topk``, ...)."""

    def __init__(self, num_nvl_bytes: int, num_rdma_bytes: int, low_latency_mode: bool, comm_stream: Any, timeout_ms: Optional[int] = None) -> None: ...
    def destroy(self) -> None:
        """Waits for the GPU, releases the buffer, raises what its kernels recorded."""
    def is_destroyed(self) -> bool: ...
    def check(self) -> None: ...
    @property
    def timeout_ms(self) -> int: ...
    def local_region(self, rdma: bool) -> object:
        """A DLPack capsule (uint8) over this rank's region; keeps the memory alive."""
    def next_low_latency_combine_buffer(self, handle: Tuple) -> Tuple[object, Shape3]: ...
    def get_dispatch_layout(self, topk_idx: Tensor, num_experts: int, streams: Streams) -> Tuple[Tensor, Optional[Tensor], Tensor, Tensor, Optional[Event]]: ...
    def dispatch(
        self, x: Tensor, x_scales: Optional[Tensor], layout: Tuple[Tensor, Tensor, Tensor], topk: Tuple[Optional[Tensor], Optional[Tensor]],
        expert_alignment: int, num_worst_tokens: int, config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], List[int], Tuple, Optional[Event]]:
        """layout: (num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert); topk:
        (topk_idx, topk_weights). Returns (recv_x, recv_x_scales, recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)."""
    def dispatch_cached(
        self, x: Tensor, x_scales: Optional[Tensor], handle: Tuple, topk: Tuple[Optional[Tensor], Optional[Tensor]],
        config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Event]]: ...
    def combine(
        self, x: Tensor, handle: Tuple, topk_weights: Optional[Tensor], bias: Tuple[Optional[Tensor], Optional[Tensor]],
        config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Event]]: ...
    def get_num_rdma_ranks(self) -> int:
        """Nodes the buffer spans (ranks / G; 1 on one node), as DeepEP's runtime."""
    def get_rdma_rank(self) -> int:
        """This rank's node (0 on one node)."""
    def get_root_rdma_rank(self, global_: bool) -> int:
        """This rank's local index with ``global``, else 0 (DeepEP's rail root)."""
    def get_local_device_id(self) -> int: ...
    def internode_max_num_sms(self) -> int:
        """The largest Config.num_sms the internode dispatch and combine can keep resident."""
    def internode_dispatch(
        self, x: Tensor, x_scales: Optional[Tensor], layout: Tuple[Tensor, Tensor, Tensor, Tensor], topk: Tuple[Optional[Tensor], Optional[Tensor]],
        expert_alignment: int, num_worst_tokens: int, config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor], List[int], Tuple, Optional[Event]]:
        """layout: (num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
        num_tokens_per_expert). Returns (recv_x, recv_x_scales, recv_topk_idx,
        recv_topk_weights, num_recv_tokens_per_expert_list (empty with num_worst_tokens), the
        10-tuple handle with recv_src_meta as [M, 2] int32, event)."""
    def internode_dispatch_cached(
        self, x: Tensor, x_scales: Optional[Tensor], handle: Tuple, topk: Tuple[Optional[Tensor], Optional[Tensor]],
        config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Event]]:
        """handle: a full internode dispatch's 10-tuple, position 7 as [M, 2] int32."""
    def internode_combine(
        self, x: Tensor, handle: Tuple, topk_weights: Optional[Tensor], bias: Tuple[Optional[Tensor], Optional[Tensor]],
        config: Optional[Config], num_sms: int, streams: Streams,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Event]]: ...
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None: ...
    def low_latency_dispatch(
        self, x: Tensor, topk_idx: Tensor, num_max_dispatch_tokens_per_rank: int, num_experts: int,
        stats: Tuple[Optional[Tensor], Optional[Tensor]], fp8: Tuple[bool, bool, bool], async_finish: bool, return_recv_hook: bool,
    ) -> Tuple[Tensor, Optional[Tensor], Tensor, Tuple, Optional[Event], Optional[ReceiveHook]]:
        """stats: (cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats); fp8:
        (use_fp8, round_scale, use_ue8m0). Returns (recv_x, the fp8 scales' storage
        [L, groups, R * T] or None, recv_count, handle, event, hook)."""
    def low_latency_combine(
        self, x: Optional[Tensor], topk_idx: Tensor, topk_weights: Tensor, handle: Tuple, zero_copy: bool,
        async_finish: bool, return_recv_hook: bool, out: Optional[Tensor], combine_wait_recv_cost_stats: Optional[Tensor],
    ) -> Tuple[Tensor, Optional[Event], Optional[ReceiveHook]]: ...
