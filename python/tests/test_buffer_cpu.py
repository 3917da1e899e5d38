"""CPU tests of chapters 4 and 7's Python surface: what the collectives and the buffer check
before anything needs a GPU, DeepEP's signatures, Config and its size hints, and that every
argument reaches the native parameter of its name. (test_cpu.py holds the package's own: its
loading, init, signals and errors.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import nvshmem_tutorial as nv
from nvshmem_tutorial import _native

from cpu_expect import fails_before_init

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.parametrize(
    "call",
    [
        lambda: _native.sync_all(0),
        lambda: _native.all_reduce(0, 0, 16, "float32", None, 0),
        lambda: _native.all_gather(0, 0, 16, None, 0),
        lambda: _native.check_collectives(),
    ],
)
def test_collectives_before_init_raise_not_initialized(call):
    fails_before_init(call, nv.NotInitializedError)


def test_collective_arguments_are_named_in_the_error():
    with pytest.raises(nv.InvalidArgumentError, match="bfloat16 or torch.float32"):
        _native.all_reduce(0, 0, 16, "int32", None, 0)
    with pytest.raises(nv.InvalidArgumentError, match="unknown algorithm"):
        _native.all_gather(0, 0, 16, "fastest", 0)


def test_config_checks_and_hints_are_deepeps():
    config = _native.Config(24, 8, 256)
    assert config.num_sms == 24
    assert repr(config) == "Config(24, 8, 256, 6, 258)"  # rdma recv aligned up to the send chunk, as DeepEP
    with pytest.raises(nv.InvalidArgumentError, match="smaller than"):
        _native.Config(24, 256, 256)
    hint = config.get_nvl_buffer_size_hint(7168 * 2, 8)
    assert 12 * 8 * 256 * 7168 * 2 < hint < 2_000_000_000  # DeepEP's test asks for 2e9
    assert config.get_rdma_buffer_size_hint(7168 * 2, 8) == 0
    assert _native.dispatch_config(2, 24).num_sms == 24
    assert repr(_native.dispatch_config(16, 24)) == "Config(24, 36, 288, 20, 140)"  # DeepEP's table
    with pytest.raises(nv.InvalidArgumentError, match="Unsupported number of EP ranks: 96"):
        _native.combine_config(96, 24)
    # Across nodes: DeepEP's nodes of 8 by default, any node size by name (the design's numbers).
    test = _native.Config(24, 8, 512, 16, 128)
    deepep = (test.get_nvl_buffer_size_hint(7168 * 2, 16), test.get_rdma_buffer_size_hint(7168 * 2, 16))
    assert deepep == test.get_buffer_size_hints_for_nodes(7168 * 2, 16, 8)
    nvl, rdma = test.get_buffer_size_hints_for_nodes(7168 * 2, 16, 4)
    assert (round(nvl / 1e6, 2), round(rdma / 1e6, 2)) == (364.51, 182.29)
    with pytest.raises(nv.InvalidArgumentError, match="whole nodes"):
        test.get_buffer_size_hints_for_nodes(7168 * 2, 16, 3)
    assert _native.buffer_heap_bytes(2, 1 << 30, 0) > 1 << 30


def test_buffer_module_imports_without_torch_and_refuses_what_it_lacks():
    import nvshmem_tutorial.buffer as deep_ep

    assert deep_ep.Buffer.num_sms == 20
    deep_ep.Buffer.set_num_sms(24)
    assert deep_ep.Buffer.num_sms == 24
    with pytest.raises(AssertionError, match="even"):
        deep_ep.Buffer.set_num_sms(23)
    with pytest.raises(ValueError, match="allow_mnnvl"):
        deep_ep.Buffer(object(), 1 << 20, allow_mnnvl=True)
    with pytest.raises(ValueError, match="'group' or 'comm'"):
        deep_ep.Buffer(None, 1 << 20)


def test_low_latency_size_hint_and_refusals():
    # DeepEP's test shape: control words + 3 parts of E x T x (16 + 2H), rounded to 128 bytes.
    part = -(-288 * 128 * (16 + 2 * 7168) // 256) * 256
    hint = _native.low_latency_rdma_size_hint(128, 7168, 2, 288)
    assert 3 * part < hint < 3 * part + 64 * 1024
    assert hint % 128 == 0
    import nvshmem_tutorial.buffer as deep_ep

    assert deep_ep.Buffer.get_low_latency_rdma_size_hint(128, 7168, 2, 288) == hint
    # Pure RDMA is nodes of one rank: it asks for the variable that makes them (issue 31).
    with pytest.raises(ValueError, match="allow_nvlink_for_low_latency_mode=False without NVSHMEM_TUTORIAL_NODE_PES=1"):
        deep_ep.Buffer(object(), 0, hint, low_latency_mode=True, allow_nvlink_for_low_latency_mode=False)
    with pytest.raises(ValueError, match="enable_shrink"):
        deep_ep.Buffer(object(), 0, hint, low_latency_mode=True, enable_shrink=True)


def test_every_native_name_has_a_stub():
    import ast

    stubs = ast.parse((REPO / "python/nvshmem_tutorial/_native.pyi").read_text())
    stubbed = set()
    for node in stubs.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    exported = {name for name in dir(_native) if not name.startswith("__")}
    stubbed = {name for name in stubbed if not name.startswith("__")}
    assert exported - stubbed == set(), "names _native exports without a stub in _native.pyi"
    stub_only = {"Tensor", "Shape3", "Streams"}  # aliases the stubs use
    assert stubbed - exported - stub_only == set(), "stubs of names _native does not export"


def test_buffer_timeout_comes_from_the_argument_the_variable_or_the_default(monkeypatch):
    variable = _native.BUFFER_TIMEOUT_VAR
    assert variable == "NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS"
    monkeypatch.delenv(variable, raising=False)
    assert _native.buffer_timeout_ms() == 100_000  # DeepEP's 100 s
    assert _native.buffer_timeout_ms(5000) == 5000
    monkeypatch.setenv(variable, " 2500 ")
    assert _native.buffer_timeout_ms() == 2500
    assert _native.buffer_timeout_ms(7) == 7  # the argument wins over the variable
    # The rendezvous's variable is another one: it does not set the buffer's.
    monkeypatch.setenv("NVSHMEM_TUTORIAL_TIMEOUT_MS", "1")
    assert _native.buffer_timeout_ms() == 2500
    for bad in ("ten seconds", "0", "-5", "1.5", "", str(10**12)):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(nv.InvalidArgumentError, match=variable):
            _native.buffer_timeout_ms()
    for bad in (0, -1, 10**12):
        with pytest.raises(nv.InvalidArgumentError, match="timeout_ms"):
            _native.buffer_timeout_ms(bad)


class _Dtype:
    """A stand-in for a torch dtype: the buffer reads its name (``torch.<name>``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


_DTYPES = {name: _Dtype(name) for name in ("bfloat16", "float16", "int64", "bool")}


class _Tensor:
    """What a buffer call reads of a torch tensor, without torch: data_ptr(), shape,
    stride(), dtype, get_device()."""

    def __init__(self, shape, strides=None, dtype="bfloat16", device=0, ptr=0x7F00_0000_0000):
        self.shape = tuple(shape)
        self._strides = tuple(strides) if strides is not None else self._row_major(self.shape)
        self.dtype = _DTYPES[dtype]
        self._device = device
        self._ptr = ptr

    @staticmethod
    def _row_major(shape):
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
        return tuple(strides)

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device


def test_a_tensor_becomes_a_view_only_on_the_buffers_gpu_and_in_its_dtypes():
    ptr, shape, strides, dtype = _native._view(_Tensor((4, 8)), "x", 0, False)
    assert (ptr, shape, strides, dtype) == (0x7F00_0000_0000, [4, 8], [8, 1], "bfloat16")
    assert _native._view(_Tensor((5,), dtype="int64"), "v", 0, False)[1:] == ([5], [1], "int64")
    # DeepEP's [N, 1] routing: a size-1 dimension's stride is the plans' to judge (torch's rule).
    assert _native._view(_Tensor((4096, 1), strides=(1, 1), dtype="bool"), "m", 0, False)[1] == [4096, 1]
    with pytest.raises(nv.InvalidArgumentError, match=r"x is a CPU tensor, but this buffer's GPU is cuda:0"):
        _native._view(_Tensor((4, 8), device=-1), "x", 0, False)
    with pytest.raises(nv.InvalidArgumentError, match=r"topk_idx is on cuda:1, but this buffer's GPU is cuda:0"):
        _native._view(_Tensor((4, 8), dtype="int64", device=1), "topk_idx", 0, False)
    with pytest.raises(nv.InvalidArgumentError, match=r"x is torch.float16; the buffer takes bfloat16"):
        _native._view(_Tensor((4, 8), dtype="float16"), "x", 0, False)
    with pytest.raises(nv.InvalidArgumentError, match=r"x must be 1-D or 2-D, got shape \[2, 4, 8\]"):
        _native._view(_Tensor((2, 4, 8)), "x", 0, False)
    with pytest.raises(TypeError, match="expected a torch.Tensor, got tuple"):
        _native._view((4, 8), "x", 0, False)


def test_a_3d_tensor_is_read_as_its_rows_only_when_contiguous():
    # The low-latency combine's x: [experts, slots, hidden] as [experts x slots, hidden].
    assert _native._view(_Tensor((3, 4, 8)), "x", 0, True)[1:3] == ([12, 8], [8, 1])
    assert _native._view(_Tensor((1, 4, 8), strides=(999, 8, 1)), "x", 0, True)[1] == [4, 8]
    sliced = _Tensor((3, 3, 8), strides=(32, 8, 1))  # x[:, :-1] of a [3, 4, 8] tensor
    with pytest.raises(nv.InvalidArgumentError, match=r"x must be contiguous \(call .contiguous\(\)\)"):
        _native._view(sliced, "x", 0, True)


def test_buffer_core_needs_nvshmem_and_checks_its_timeout_first(monkeypatch):
    class Stream:
        cuda_stream = 0

    monkeypatch.delenv(_native.BUFFER_TIMEOUT_VAR, raising=False)
    with pytest.raises(nv.NotInitializedError):
        _native.BufferCore(1 << 20, 0, False, Stream())
    with pytest.raises(nv.InvalidArgumentError, match="timeout_ms"):
        _native.BufferCore(1 << 20, 0, False, Stream(), 0)


def test_buffer_keeps_deepeps_signatures_and_adds_check_and_a_timeout():
    import inspect

    import nvshmem_tutorial.buffer as deep_ep

    init = inspect.signature(deep_ep.Buffer.__init__).parameters
    assert list(init)[:12] == [
        "self", "group", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode", "num_qps_per_rank",
        "allow_nvlink_for_low_latency_mode", "allow_mnnvl", "use_fabric", "explicitly_destroy",
        "enable_shrink", "comm",
    ]
    assert init["timeout_ms"].default is None
    assert init["timeout_ms"].kind == inspect.Parameter.KEYWORD_ONLY  # ours, after DeepEP's
    assert callable(deep_ep.Buffer.check)
    dispatch = inspect.signature(deep_ep.Buffer.dispatch).parameters
    assert list(dispatch)[1:] == [
        "x", "handle", "num_tokens_per_rank", "num_tokens_per_rdma_rank", "is_token_in_rank",
        "num_tokens_per_expert", "topk_idx", "topk_weights", "expert_alignment", "num_worst_tokens",
        "config", "previous_event", "async_finish", "allocate_on_comm_stream",
    ]


class _Scales:
    """An fp8 scales' storage stand-in: Buffer returns its transpose, as DeepEP."""

    def transpose(self, a, b):
        return ("transposed", a, b)


_NATIVE_RESULTS = {
    "get_dispatch_layout": ("per_rank", "per_node", "per_expert", "in_rank", None),
    "dispatch": ("recv_x", None, "recv_idx", "recv_w", [3], ("handle",), "event"),
    "dispatch_cached": ("recv_x", "recv_scales", None),
    "combine": ("combined", None, None),
    "low_latency_dispatch": ("recv_x", _Scales(), "recv_count", ("ll_handle",), None, "hook"),
    "low_latency_combine": ("combined", None, "hook"),
    "clean_low_latency_buffer": None,
    "check": None,
    "get_num_rdma_ranks": 1,  # one node: the intranode calls (test_internode_cpu.py: 2)
}


def _recording_buffer(calls, results=_NATIVE_RESULTS):
    """A Buffer whose runtime records each native call's arguments by the names the Rust
    signature gives them (so a positional mix-up between buffer.py and buffer.rs shows) and
    returns `results[name]`."""
    import inspect

    import nvshmem_tutorial.buffer as deep_ep

    class Recorder:
        def __getattr__(self, name):
            signature = inspect.signature(getattr(_native.BufferCore, name))

            def method(*args, **kwargs):
                bound = signature.bind(None, *args, **kwargs).arguments
                calls.append((name, {k: v for k, v in bound.items() if k != "self"}))
                return results[name]

            return method

    buffer = object.__new__(deep_ep.Buffer)
    buffer.runtime = Recorder()
    return buffer


def test_buffer_passes_every_argument_to_the_native_parameter_of_its_name():
    import nvshmem_tutorial.buffer as deep_ep

    calls: list = []
    buffer = _recording_buffer(calls)
    deep_ep.Buffer.set_num_sms(24)
    layout = buffer.get_dispatch_layout("topk", 64, previous_event="prev", async_finish=True)
    assert layout[:4] == ("per_rank", "per_node", "per_expert", "in_rank")
    assert calls[-1] == ("get_dispatch_layout", {"topk_idx": "topk", "num_experts": 64, "streams": ("prev", True, False)})

    out = buffer.dispatch(("x", "scales"), num_tokens_per_rank="r", is_token_in_rank="m", num_tokens_per_expert="e", topk_idx="i",
                          topk_weights="w", expert_alignment=4, num_worst_tokens=9, config="cfg", previous_event="p",
                          async_finish=True, allocate_on_comm_stream=True)
    assert out[:5] == ("recv_x", "recv_idx", "recv_w", [3], ("handle",)) and out[5].event == "event"
    assert calls[-1] == ("dispatch", {
        "x": "x", "x_scales": "scales", "layout": ("r", "m", "e"), "topk": ("i", "w"), "expert_alignment": 4,
        "num_worst_tokens": 9, "config": "cfg", "num_sms": 24, "streams": ("p", True, True),
    })
    cached = buffer.dispatch("x", handle=("h",) * 6, config="cfg")
    assert cached[0] == ("recv_x", "recv_scales") and cached[1:5] == (None, None, None, None)
    assert calls[-1] == ("dispatch_cached", {
        "x": "x", "x_scales": None, "handle": ("h",) * 6, "topk": (None, None), "config": "cfg", "num_sms": 24,
        "streams": (None, False, False),
    })
    buffer.combine("x", ("h",) * 6, topk_weights="w", bias=("b0", "b1"))
    assert calls[-1][1] == {
        "x": "x", "handle": ("h",) * 6, "topk_weights": "w", "bias": ("b0", "b1"), "config": None, "num_sms": 24,
        "streams": (None, False, False),
    }
    buffer.combine("x", ("h",) * 6, bias="b")
    assert calls[-1][1]["bias"] == ("b", None)
    recv, count, handle, event, hook = buffer.low_latency_dispatch("x", "i", 128, 288, cumulative_local_expert_recv_stats="s", use_fp8=True,
                                                                   round_scale=True, use_ue8m0=True, return_recv_hook=True)
    assert recv == ("recv_x", ("transposed", 1, 2)) and (count, handle, event.event, hook) == ("recv_count", ("ll_handle",), None, "hook")
    assert calls[-1][1] == {
        "x": "x", "topk_idx": "i", "num_max_dispatch_tokens_per_rank": 128, "num_experts": 288, "stats": ("s", None),
        "fp8": (True, True, True), "async_finish": False, "return_recv_hook": True,
    }
    buffer.low_latency_combine("y", "i", "w", ("ll_handle",), zero_copy=True, out="o", combine_wait_recv_cost_stats="c")
    assert calls[-1][1] == {
        "x": "y", "topk_idx": "i", "topk_weights": "w", "handle": ("ll_handle",), "zero_copy": True,
        "async_finish": False, "return_recv_hook": False, "out": "o", "combine_wait_recv_cost_stats": "c",
    }
    buffer.clean_low_latency_buffer(128, 7168, 288)
    assert calls[-1][1] == {"num_max_dispatch_tokens_per_rank": 128, "hidden": 7168, "num_experts": 288}
    buffer.check()
    assert calls[-1] == ("check", {})
    deep_ep.Buffer.set_num_sms(20)
