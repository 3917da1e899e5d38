"""CPU tests of the buffer across nodes from Python (issue 32 step 9): that DeepEP's
``tests/test_internode.py`` would run unchanged against ``nvshmem_tutorial`` through the
``deep_ep`` shim on a cluster (it needs 8 GPUs per node and more than 8 ranks, so it cannot run
here).

What DeepEP's test uses is written below (``TEST_INTERNODE_USES``, ``DEEPEP_SIGNATURES``), with
the file and lines of DeepEP 567632d it comes from, because CI has no DeepEP checkout. Where a
checkout is (``$DEEPEP_SRC``, else ``.carry/deepep`` in the repository), the test also derives
both from DeepEP's source with ``ast`` and requires them equal to the written ones, so the lists
cannot drift from DeepEP. Every use is then checked against our ``Buffer``: each call binds to
our signature with its positional count and keywords, our signatures have DeepEP's parameter
names, order and defaults, and through a recording runtime (no GPU) each call returns DeepEP's
tuple length, ``dispatch`` / ``combine`` go to ``internode_dispatch`` / ``internode_combine``
when ``runtime.get_num_rdma_ranks() > 1`` (as DeepEP's ``buffer.py:376, 438``), the handle is
DeepEP's 10-tuple in DeepEP's order with ``handle[-4]`` the runtime's
``recv_gbl_rank_prefix_sum``, and every argument reaches the native parameter of its name.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Dict, Optional, Set, Tuple

import pytest

from test_buffer_cpu import _NATIVE_RESULTS, _recording_buffer

REPO = Path(__file__).resolve().parents[2]

# ---- what DeepEP's tests/test_internode.py (commit 567632d) uses --------------------------------
# Per call: the positional counts and keyword names it passes (its `**dispatch_args`,
# `**combine_args` and `**tune_args` dicts included, with their `.update`s), and the lengths of
# the tuples it unpacks from the result.
TEST_INTERNODE_USES: Dict[str, Dict[str, Set]] = {
    # deep_ep.Buffer(group, int(2e9), int(1e9), low_latency_mode=, num_qps_per_rank=,
    # explicitly_destroy=): test_internode.py:325-330
    "Buffer": {"positional": {3}, "keywords": {"low_latency_mode", "num_qps_per_rank", "explicitly_destroy"}, "returns": set()},
    # deep_ep.Config(num_sms, nvl chunk, nvl buffer, rdma chunk, rdma buffer): :103, :244, :272-273, :289
    "Config": {"positional": {5}, "keywords": set(), "returns": set()},
    # buffer.get_dispatch_layout(topk_idx, num_experts), 5 values: :88-89, :94
    "get_dispatch_layout": {"positional": {2}, "keywords": set(), "returns": {5}},
    # buffer.dispatch(**dispatch_args), 6 values: :125-139 (with top-k, previous event), :176-177
    # (num_worst_tokens), :191-194 (cached: handle), :245-247 (tuning), :275-283
    "dispatch": {
        "positional": {0},
        "keywords": {
            "x", "num_tokens_per_rank", "num_tokens_per_rdma_rank", "is_token_in_rank", "num_tokens_per_expert", "config",
            "async_finish", "topk_idx", "topk_weights", "previous_event", "num_worst_tokens", "handle",
        },
        "returns": {6},
    },
    # buffer.combine(**combine_args), 3 values: :203-208, :290-292
    "combine": {
        "positional": {0},
        "keywords": {"x", "bias", "handle", "config", "async_finish", "topk_weights", "previous_event"},
        "returns": {3},
    },
    # buffer.capture(): :137, :193, :207
    "capture": {"positional": {0}, "keywords": set(), "returns": set()},
    # buffer.clean_low_latency_buffer(ll_num_tokens, ll_hidden, ll_num_experts): :362
    "clean_low_latency_buffer": {"positional": {3}, "keywords": set(), "returns": set()},
    # buffer.destroy(): :366
    "destroy": {"positional": {0}, "keywords": set(), "returns": set()},
}
# handle[-4] (recv_gbl_rank_prefix_sum): test_internode.py:151
TEST_INTERNODE_HANDLE_INDICES = {-4}
# Module attributes: deep_ep.Buffer, deep_ep.Config (:103), deep_ep.topk_idx_t (:45)
TEST_INTERNODE_MODULE_NAMES = {"Buffer", "Config", "topk_idx_t"}
# Methods called on a returned event: event.current_stream_wait(): :140, :178, :195, :209
TEST_INTERNODE_EVENT_METHODS = {"current_stream_wait"}

_NO_DEFAULT = "<no default>"
# DeepEP's signatures (deep_ep/buffer.py at 567632d) of every Buffer method the test reaches,
# directly or through dispatch/combine: (name, default) in order, `self` left out.
DEEPEP_SIGNATURES: Dict[str, Tuple[Tuple[str, object], ...]] = {
    # buffer.py:32-42
    "__init__": (
        ("group", _NO_DEFAULT), ("num_nvl_bytes", 0), ("num_rdma_bytes", 0), ("low_latency_mode", False),
        ("num_qps_per_rank", 24), ("allow_nvlink_for_low_latency_mode", True), ("allow_mnnvl", False), ("use_fabric", False),
        ("explicitly_destroy", False), ("enable_shrink", False), ("comm", None),
    ),
    # buffer.py:138, :166, :533
    "destroy": (),
    "capture": (),
    "clean_low_latency_buffer": (("num_max_dispatch_tokens_per_rank", _NO_DEFAULT), ("hidden", _NO_DEFAULT), ("num_experts", _NO_DEFAULT)),
    # buffer.py:293-295
    "get_dispatch_layout": (
        ("topk_idx", _NO_DEFAULT), ("num_experts", _NO_DEFAULT), ("previous_event", None), ("async_finish", False),
        ("allocate_on_comm_stream", False),
    ),
    # buffer.py:322-329 and :453-460 (the same parameters)
    "dispatch": (
        ("x", _NO_DEFAULT), ("handle", None), ("num_tokens_per_rank", None), ("num_tokens_per_rdma_rank", None),
        ("is_token_in_rank", None), ("num_tokens_per_expert", None), ("topk_idx", None), ("topk_weights", None),
        ("expert_alignment", 1), ("num_worst_tokens", 0), ("config", None), ("previous_event", None), ("async_finish", False),
        ("allocate_on_comm_stream", False),
    ),
    # buffer.py:405-410 and :504-509 (the same parameters)
    "combine": (
        ("x", _NO_DEFAULT), ("handle", _NO_DEFAULT), ("topk_weights", None), ("bias", None), ("config", None),
        ("previous_event", None), ("async_finish", False), ("allocate_on_comm_stream", False),
    ),
}
DEEPEP_SIGNATURES["internode_dispatch"] = DEEPEP_SIGNATURES["dispatch"]
DEEPEP_SIGNATURES["internode_combine"] = DEEPEP_SIGNATURES["combine"]

# The internode handle in DeepEP's order (buffer.py:495-497); the combine unpacks it at :518-521.
HANDLE_ORDER = (
    "is_token_in_rank", "rdma_channel_prefix_matrix", "gbl_channel_prefix_matrix", "recv_rdma_channel_prefix_matrix",
    "recv_rdma_rank_prefix_sum", "recv_gbl_channel_prefix_matrix", "recv_gbl_rank_prefix_sum", "recv_src_meta",
    "send_rdma_head", "send_nvl_head",
)


def _deepep_checkout() -> Optional[Path]:
    """DeepEP's source, when this machine has it: $DEEPEP_SRC, else .carry/deepep."""
    given = os.environ.get("DEEPEP_SRC")
    root = Path(given) if given else REPO / ".carry" / "deepep"
    return root if (root / "tests" / "test_internode.py").is_file() and (root / "deep_ep" / "buffer.py").is_file() else None


def _literal(node: ast.AST) -> object:
    return ast.literal_eval(node)


def uses_in_test(source: str) -> Tuple[Dict[str, Dict[str, Set]], Set[int], Set[str], Set[str]]:
    """What a DeepEP test source uses, found with ast: calls on `buffer` and on the `deep_ep`
    module (positional counts, keywords with those of the dicts passed as `**name`, tuple lengths
    unpacked), the constant indices of `handle[...]`, the module's attributes, and the methods
    called on `event`."""
    tree = ast.parse(source)
    dict_keys: Dict[str, Set[str]] = {}

    def keys(d: ast.Dict) -> Set[str]:
        return {k.value for k in d.keys if isinstance(k, ast.Constant)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    dict_keys.setdefault(target.id, set()).update(keys(node.value))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name) and node.args and isinstance(node.args[0], ast.Dict)):
            dict_keys.setdefault(node.func.value.id, set()).update(keys(node.args[0]))

    def called(call: ast.AST) -> Optional[str]:
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
            if call.func.value.id == "buffer" or (call.func.value.id == "deep_ep" and call.func.attr in ("Buffer", "Config")):
                return call.func.attr
        return None

    uses: Dict[str, Dict[str, Set]] = {}
    handle_indices: Set[int] = set()
    module_names: Set[str] = set()
    event_methods: Set[str] = set()
    for node in ast.walk(tree):
        name = called(node)
        if name is not None:
            entry = uses.setdefault(name, {"positional": set(), "keywords": set(), "returns": set()})
            entry["positional"].add(len(node.args))
            for kw in node.keywords:
                if kw.arg is not None:
                    entry["keywords"].add(kw.arg)
                elif isinstance(kw.value, ast.Name):
                    entry["keywords"].update(dict_keys.get(kw.value.id, set()))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple):
            name = called(node.value)
            if name is not None:
                uses.setdefault(name, {"positional": set(), "keywords": set(), "returns": set()})
                uses[name]["returns"].add(len(node.targets[0].elts))
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "handle":
            handle_indices.add(_literal(node.slice))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "deep_ep":
                module_names.add(node.attr)
            if node.value.id == "event":
                event_methods.add(node.attr)
    return uses, handle_indices, module_names, event_methods


def signatures_in_buffer(source: str) -> Dict[str, Tuple[Tuple[str, object], ...]]:
    """The (name, default) parameters of DeepEP's Buffer methods, `self` left out."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Buffer")
    found = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name not in DEEPEP_SIGNATURES:
            continue
        args = fn.args.args
        defaults = [_NO_DEFAULT] * (len(args) - len(fn.args.defaults)) + [_literal(d) for d in fn.args.defaults]
        params = tuple((a.arg, d) for a, d in zip(args, defaults))
        found[fn.name] = tuple(p for p in params if p[0] != "self")
    return found


def test_the_written_lists_are_deepeps_where_its_source_is_here():
    root = _deepep_checkout()
    if root is None:
        pytest.skip("no DeepEP checkout ($DEEPEP_SRC or .carry/deepep): the written lists stand alone")
    uses, indices, module_names, event_methods = uses_in_test((root / "tests" / "test_internode.py").read_text())
    assert uses == TEST_INTERNODE_USES
    assert indices == TEST_INTERNODE_HANDLE_INDICES
    assert module_names == TEST_INTERNODE_MODULE_NAMES
    assert event_methods == TEST_INTERNODE_EVENT_METHODS
    assert signatures_in_buffer((root / "deep_ep" / "buffer.py").read_text()) == DEEPEP_SIGNATURES


def test_the_ast_reader_sees_what_it_must():
    # The reader itself, on a few lines shaped as DeepEP's test (so the comparison above cannot
    # pass by reading nothing).
    source = (
        "args = {'x': x, 'config': c}\n"
        "args.update({'handle': h})\n"
        "a, b, c = buffer.combine(**args)\n"
        "buffer.clean_low_latency_buffer(1, 2, 3)\n"
        "y = handle[-4]\n"
        "b = deep_ep.Buffer(g, 1, 2, low_latency_mode=True)\n"
        "event.current_stream_wait()\n"
    )
    uses, indices, names, events = uses_in_test(source)
    assert uses["combine"] == {"positional": {0}, "keywords": {"x", "config", "handle"}, "returns": {3}}
    assert uses["clean_low_latency_buffer"]["positional"] == {3}
    assert uses["Buffer"] == {"positional": {3}, "keywords": {"low_latency_mode"}, "returns": set()}
    assert (indices, names, events) == ({-4}, {"Buffer"}, {"current_stream_wait"})


def _deep_ep_shim():
    """`import deep_ep` as DeepEP's test does it here: benchmarks/deepep_shim first on the path."""
    shim = str(REPO / "benchmarks" / "deepep_shim")
    sys.path.insert(0, shim)
    try:
        sys.modules.pop("deep_ep", None)
        import deep_ep

        return deep_ep
    finally:
        sys.path.remove(shim)
        sys.modules.pop("deep_ep", None)


def test_every_name_and_call_of_test_internode_exists_with_deepeps_signature():
    deep_ep = _deep_ep_shim()
    for name in TEST_INTERNODE_MODULE_NAMES:
        assert hasattr(deep_ep, name), f"deep_ep.{name} (test_internode.py uses it)"
    for method in TEST_INTERNODE_EVENT_METHODS:
        assert callable(getattr(deep_ep.EventOverlap, method)), f"EventOverlap.{method}"
    for name, use in TEST_INTERNODE_USES.items():
        if name == "Config":
            continue  # native: below
        fn = deep_ep.Buffer.__init__ if name == "Buffer" else getattr(deep_ep.Buffer, name)
        signature = inspect.signature(fn)
        is_static = isinstance(inspect.getattr_static(deep_ep.Buffer, name, None), staticmethod)
        for count in use["positional"]:
            args = [object()] * count if is_static else [object()] * (count + 1)  # + self
            try:
                signature.bind(*args, **{k: object() for k in use["keywords"]})
            except TypeError as error:
                pytest.fail(f"Buffer.{name}: DeepEP's test passes {count} positional and {sorted(use['keywords'])}: {error}")
    # Config(num_sms, nvl chunk, nvl buffer, rdma chunk, rdma buffer), DeepEP's test values.
    config = deep_ep.Config(24, 8, 512, 16, 128)
    assert repr(config) == "Config(24, 8, 512, 16, 128)"


def test_our_signatures_are_deepeps():
    import nvshmem_tutorial.buffer as ours

    for name, params in DEEPEP_SIGNATURES.items():
        signature = inspect.signature(getattr(ours.Buffer, name))
        mine = tuple(
            (p.name, _NO_DEFAULT if p.default is inspect.Parameter.empty else p.default)
            for p in signature.parameters.values()
            if p.name != "self" and p.kind != inspect.Parameter.KEYWORD_ONLY  # ours come after DeepEP's, by keyword
        )
        assert mine == params, f"Buffer.{name}: ours {mine}, DeepEP's {params}"
        extra = [p for p in signature.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty]
        assert extra == [], f"Buffer.{name}: keyword-only parameters without a default break DeepEP's calls"


class _Meta:
    """recv_src_meta as the runtime returns it ([M, 2] int32): Buffer views it as uint8 for the
    caller, and back as int32 for a cached dispatch."""

    def __init__(self, dtype="int32"):
        self.dtype = dtype

    def view(self, dtype):
        return _Meta(dtype)

    def __eq__(self, other):
        return other == ("recv_src_meta", self.dtype)


_INTERNODE_RESULTS = dict(_NATIVE_RESULTS)
_INTERNODE_RESULTS.update(
    {
        "get_num_rdma_ranks": 2,
        "internode_dispatch": (
            "recv_x", None, "recv_idx", "recv_w", [5, 0],
            tuple(_Meta() if name == "recv_src_meta" else name for name in HANDLE_ORDER), "event",
        ),
        "internode_combine": ("combined", "combined_w", "event"),
        "internode_dispatch_cached": ("recv_x", "recv_scales", "event"),
    }
)


@pytest.fixture
def across_nodes(monkeypatch):
    """A Buffer over 2 nodes whose runtime records its calls, and the calls list."""
    import nvshmem_tutorial.buffer as ours

    monkeypatch.setattr(ours, "torch", types.SimpleNamespace(uint8="uint8", int32="int32"))
    monkeypatch.setattr(ours.Buffer, "num_sms", 24)
    calls: list = []
    return _recording_buffer(calls, _INTERNODE_RESULTS), calls


def test_across_nodes_calls_return_deepeps_tuples_and_handle(across_nodes):
    buffer, calls = across_nodes
    layout = buffer.get_dispatch_layout("topk_idx", 64)
    assert len(layout) in TEST_INTERNODE_USES["get_dispatch_layout"]["returns"]
    assert layout[1] == "per_node"  # num_tokens_per_rdma_rank in DeepEP's second place
    dispatch_args = {
        "x": "x", "num_tokens_per_rank": "r", "num_tokens_per_rdma_rank": "n", "is_token_in_rank": "m",
        "num_tokens_per_expert": "e", "config": "cfg", "async_finish": True, "topk_idx": "i", "topk_weights": "w",
        "previous_event": "p",
    }
    # Every keyword of DeepEP's test but the cached handle and num_worst_tokens (the next test).
    assert set(dispatch_args) == TEST_INTERNODE_USES["dispatch"]["keywords"] - {"handle", "num_worst_tokens"}
    out = buffer.dispatch(**dispatch_args)
    assert len(out) in TEST_INTERNODE_USES["dispatch"]["returns"]
    recv_x, recv_idx, recv_w, per_expert, handle, event = out
    assert (recv_x, recv_idx, recv_w, per_expert, event.event) == ("recv_x", "recv_idx", "recv_w", [5, 0], "event")
    assert len(handle) == len(HANDLE_ORDER) == 10
    expected = tuple(("recv_src_meta", "uint8") if name == "recv_src_meta" else name for name in HANDLE_ORDER)
    assert handle == expected, "the handle is not DeepEP's 10-tuple in DeepEP's order"
    for index in TEST_INTERNODE_HANDLE_INDICES:
        assert handle[index] == "recv_gbl_rank_prefix_sum"
    assert calls[-1] == ("internode_dispatch", {
        "x": "x", "x_scales": None, "layout": ("r", "n", "m", "e"), "topk": ("i", "w"), "expert_alignment": 1,
        "num_worst_tokens": 0, "config": "cfg", "num_sms": 24, "streams": ("p", True, False),
    })
    fp8 = buffer.dispatch(("x8", "scales"), num_tokens_per_rank="r", num_tokens_per_rdma_rank="n", is_token_in_rank="m",
                          num_tokens_per_expert="e", expert_alignment=4, allocate_on_comm_stream=True, previous_event="p",
                          async_finish=True)
    assert calls[-1][1]["x"] == "x8" and calls[-1][1]["x_scales"] == "scales" and calls[-1][1]["expert_alignment"] == 4
    assert calls[-1][1]["streams"] == ("p", True, True) and len(fp8) == 6

    combine_args = {"x": "y", "bias": ("b0", "b1"), "handle": handle, "config": "cfg", "async_finish": True, "topk_weights": "tw",
                    "previous_event": "p"}
    assert set(combine_args) == TEST_INTERNODE_USES["combine"]["keywords"]
    combined = buffer.combine(**combine_args)
    assert len(combined) in TEST_INTERNODE_USES["combine"]["returns"]
    assert combined[:2] == ("combined", "combined_w") and combined[2].event == "event"
    assert calls[-1] == ("internode_combine", {
        "x": "y", "handle": handle, "topk_weights": "tw", "bias": ("b0", "b1"), "config": "cfg", "num_sms": 24,
        "streams": ("p", True, False),
    })
    buffer.combine("y", list(handle), bias="b")  # DeepEP takes a list too, and one bias
    assert calls[-1][0] == "internode_combine"
    assert calls[-1][1]["handle"] == handle and calls[-1][1]["bias"] == ("b", None)
    # The internode calls by name, as DeepEP's buffer exposes them.
    buffer.internode_combine("y", handle)
    assert calls[-1][0] == "internode_combine"


def test_across_nodes_cached_and_worst_case_dispatches_reach_their_native_calls(across_nodes):
    buffer, calls = across_nodes
    handle = buffer.dispatch("x", num_tokens_per_rank="r", num_tokens_per_rdma_rank="n", is_token_in_rank="m",
                             num_tokens_per_expert="e")[4]
    # Cached (test_internode.py:191-194): the handle as DeepEP's test passes it back, position 7
    # viewed as the kernels read it ([M, 2] int32).
    out = buffer.dispatch(("x8", "scales"), handle=handle, config="cfg", async_finish=True, previous_event="p")
    assert len(out) in TEST_INTERNODE_USES["dispatch"]["returns"]
    assert out[0] == ("recv_x", "recv_scales") and out[1:5] == (None, None, None, None) and out[5].event == "event"
    words = tuple(("recv_src_meta", "int32") if name == "recv_src_meta" else name for name in HANDLE_ORDER)
    assert calls[-1] == ("internode_dispatch_cached", {
        "x": "x8", "x_scales": "scales", "handle": words, "topk": (None, None), "config": "cfg", "num_sms": 24,
        "streams": ("p", True, False),
    })
    buffer.dispatch("x", handle=list(handle), topk_idx="i")  # DeepEP takes a list; top-k is the plan's to refuse
    assert calls[-1][1]["handle"] == words and calls[-1][1]["topk"] == ("i", None)
    # num_worst_tokens (test_internode.py:174-177): passed through, the native call sizes the outputs.
    worst = buffer.dispatch("x", num_tokens_per_rank="r", num_tokens_per_rdma_rank="n", is_token_in_rank="m",
                            num_tokens_per_expert="e", topk_idx="i", topk_weights="w", num_worst_tokens=64)
    assert len(worst) == 6 and calls[-1][0] == "internode_dispatch" and calls[-1][1]["num_worst_tokens"] == 64


def test_one_node_calls_stay_intranode(monkeypatch):
    import nvshmem_tutorial.buffer as ours

    monkeypatch.setattr(ours.Buffer, "num_sms", 24)
    calls: list = []
    buffer = _recording_buffer(calls)
    buffer.dispatch("x", num_tokens_per_rank="r", is_token_in_rank="m", num_tokens_per_expert="e")
    assert calls[-1][0] == "dispatch"
    buffer.combine("x", ("h",) * 6)
    assert calls[-1][0] == "combine"
    with pytest.raises(ValueError, match="one node"):
        buffer.dispatch("x", num_tokens_per_rank="r", num_tokens_per_rdma_rank="n", is_token_in_rank="m", num_tokens_per_expert="e")


def test_buffer_takes_num_rdma_bytes_in_normal_mode(monkeypatch):
    # No refusal before the group is used: across nodes is the runtime's to check (on one node
    # it refuses, naming inter-node normal mode; scripts/ch07_buffer.py checks that on a GPU).
    import nvshmem_tutorial.buffer as ours

    distributed = types.ModuleType("torch.distributed")
    fake_torch = types.ModuleType("torch")
    fake_torch.distributed = distributed
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", fake_torch))
    monkeypatch.setitem(sys.modules, "torch.distributed", sys.modules.get("torch.distributed", distributed))

    class Reached(Exception):
        pass

    class Group:
        def rank(self):
            raise Reached

    # Both ways test_internode.py makes it (:325-330): without, and with --test-ll-compatibility
    # (num_qps_per_rank = max(24, 256 // num_ranks)).
    for low_latency_mode in (False, True):
        with pytest.raises(Reached):
            ours.Buffer(Group(), int(2e9), int(1e9), low_latency_mode=low_latency_mode, num_qps_per_rank=24,
                        explicitly_destroy=True)


def test_a_low_latency_buffer_across_nodes_takes_normal_calls_then_the_clean(across_nodes):
    # test_internode.py --test-ll-compatibility on one buffer: the normal checks (dispatch and
    # combine across nodes), then clean_low_latency_buffer, then test_low_latency's calls. The
    # mode switch rules are the runtime's (src/mode_sharing/, CPU-tested in Rust).
    buffer, calls = across_nodes
    buffer.low_latency_mode = True
    handle = buffer.dispatch("x", num_tokens_per_rank="r", num_tokens_per_rdma_rank="n", is_token_in_rank="m",
                             num_tokens_per_expert="e")[4]
    assert calls[-1][0] == "internode_dispatch"
    buffer.combine("y", handle)
    assert calls[-1][0] == "internode_combine"
    buffer.clean_low_latency_buffer(16, 5120, 256)
    assert calls[-1] == ("clean_low_latency_buffer", {
        "num_max_dispatch_tokens_per_rank": 16, "hidden": 5120, "num_experts": 256,
    })


def test_the_runtime_has_deepeps_node_queries():
    from nvshmem_tutorial import _native

    for name, params in {
        "get_num_rdma_ranks": [], "get_rdma_rank": [], "get_root_rdma_rank": ["global_"], "get_local_device_id": [],
        "internode_max_num_sms": [],
        "internode_dispatch": ["x", "x_scales", "layout", "topk", "expert_alignment", "num_worst_tokens", "config", "num_sms", "streams"],
        "internode_dispatch_cached": ["x", "x_scales", "handle", "topk", "config", "num_sms", "streams"],
        "internode_combine": ["x", "handle", "topk_weights", "bias", "config", "num_sms", "streams"],
    }.items():
        signature = inspect.signature(getattr(_native.BufferCore, name))
        assert [p for p in signature.parameters if p != "self"] == params, name
