"""CPU tests of chapter 5's calls (nvshmem_tutorial.inter_node_*): their checks before anything
needs a GPU, the method names and the node size. Run with the rest of python/tests in CI."""

from __future__ import annotations

import pytest

import nvshmem_tutorial as nv
from nvshmem_tutorial import _native

from cpu_expect import NEEDS_INIT, NEEDS_NVSHMEM, fails_before_init


@pytest.mark.parametrize(
    "call",
    [
        lambda: nv.inter_node_layout(),
        lambda: nv.check_inter_node(),
        lambda: nv.inter_node_all_reduce(None, None),
        lambda: nv.inter_node_reduce_scatter(None, None, method="flat"),
        lambda: nv.inter_node_all_gather(None, None, method="nvshmem_teams"),
        lambda: nv.inter_node_broadcast(None, None, 0),
        lambda: nv.inter_node_all_to_all(None, None),
        lambda: nv.inter_node_all_to_all_v(None, None, None, None, method="flat"),
    ],
)
def test_inter_node_calls_before_init_are_a_clear_error(call):
    fails_before_init(call, nv.NotInitializedError, NEEDS_INIT)


@pytest.mark.parametrize(
    "call",
    [
        lambda: _native.inter_node_layout(),
        lambda: _native.check_inter_node(),
        lambda: _native.inter_node_all_reduce(0x1000, 0x1000, 16, "float32", "hierarchical", 0),
        lambda: _native.inter_node_reduce_scatter(0x1000, 0x9000, 16, "bfloat16", "nvshmem_teams", 0),
        lambda: _native.inter_node_all_gather(0x1000, 0x9000, 16, "flat", 0),
        lambda: _native.inter_node_broadcast(0x1000, 0x2000, 16, 0, "hierarchical", 0),
        lambda: _native.inter_node_all_to_all(0x1000, 0x9000, 16, "flat", 0),
        lambda: _native.inter_node_all_to_all_v(0x1000, 4, 0x9000, 4, 64, 0x20000, 0x30000, "hierarchical", 0),
    ],
)
def test_native_inter_node_calls_with_good_arguments_need_nvshmem(call):
    fails_before_init(call, nv.NotInitializedError, NEEDS_NVSHMEM)


def test_inter_node_methods_are_the_rust_chapters():
    assert _native.INTER_NODE_METHODS == ("hierarchical", "nvshmem_teams", "flat")
    assert nv.INTER_NODE_METHODS == _native.INTER_NODE_METHODS
    assert nv.InterNodeLayout._fields == ("n_pes", "node_pes", "num_nodes", "node", "local")


# The method is checked before anything else, so these need neither NVSHMEM nor torch.
@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: nv.inter_node_all_reduce(None, None, method="hier"), "method='hier' is not one of"),
        (lambda: nv.inter_node_all_gather(None, None, method="Flat"), "'hierarchical', 'nvshmem_teams', 'flat'"),
        (lambda: nv.inter_node_broadcast(None, None, 0, method=None), "method=None"),
        (lambda: nv.inter_node_all_to_all_v(None, None, None, None, method="ring"), "inter_node_all_to_all_v: method='ring'"),
        (lambda: _native.inter_node_all_gather(0x1000, 0x9000, 16, "teams", 0), 'unknown method "teams": use one of "hierarchical", "nvshmem_teams", "flat"'),
        (lambda: _native.inter_node_all_reduce(0x1000, 0x2000, 16, "int32", "flat", 0), "bfloat16 or torch.float32"),
        (lambda: _native.inter_node_reduce_scatter(0x1000, 0x9000, 16, "float16", "flat", 0), "not float16"),
    ],
)
def test_bad_inter_node_methods_and_dtypes_are_named(call, text):
    fails_before_init(call, nv.InvalidArgumentError, text)


# What a method cannot do and overlapping tensors are refused before NVSHMEM is even asked.
@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: _native.inter_node_all_reduce(0x1000, 0x2000, 16, "float32", "nvshmem_teams", 0), "reduces bf16 only"),
        (lambda: _native.inter_node_reduce_scatter(0x1000, 0x9000, 0, "float32", "nvshmem_teams", 0), "use \"hierarchical\" or \"flat\" for float32"),
        (lambda: _native.inter_node_all_to_all(0x1000, 0x9000, 16, "nvshmem_teams", 0), "all_to_all: method \"nvshmem_teams\" has no all-to-all"),
        (lambda: _native.inter_node_all_to_all_v(0x1000, 4, 0x9000, 4, 64, 0x20000, 0x30000, "nvshmem_teams", 0), "has no all-to-all"),
        (lambda: _native.inter_node_all_reduce(0x1000, 0x1004, 16, "float32", "flat", 0), r"may be the input itself, not a part of it"),
        (lambda: _native.inter_node_broadcast(0x1000, 0x1000, 16, 0, "hierarchical", 0), r"broadcast: output \(bytes 0x1000..0x1010\) and input \(bytes 0x1000..0x1010\) overlap"),
        (lambda: _native.inter_node_all_to_all_v(0x1000, 4, 0x1040, 4, 64, 0x20000, 0x30000, "flat", 0), "overlap; pass distinct buffers"),
    ],
)
def test_inter_node_calls_refuse_what_cannot_run_before_anything_else(call, text):
    fails_before_init(call, nv.InvalidArgumentError, text)


def test_node_size_comes_from_torchrun_or_nvshmem_cut_by_the_variable():
    # _resolve_node_pes(NVSHMEM_TUTORIAL_NODE_PES, LOCAL_WORLD_SIZE, NVSHMEM's node, n_pes):
    # the rule the topology's first call applies.
    assert _native.NODE_PES_VAR == "NVSHMEM_TUTORIAL_NODE_PES"
    resolve = _native._resolve_node_pes
    assert resolve(None, 4, 8, 8) == 4  # torchrun's node (two agents on one host)
    assert resolve(None, None, 8, 8) == 8  # no torchrun: NVSHMEM's node team
    assert resolve("2", 4, 4, 8) == 2  # virtual nodes of 2
    assert resolve(" 1 ", None, 2, 2) == 1
    for bad in ("3", "0", "two", "", "8"):
        with pytest.raises(nv.InvalidArgumentError, match=r'NVSHMEM_TUTORIAL_NODE_PES=".*" must be .* one of 1, 2, 4$'):
            resolve(bad, 4, 4, 8)
    with pytest.raises(nv.InvalidArgumentError, match="LOCAL_WORLD_SIZE is 3 PEs, which does not divide NVSHMEM's node team of 4"):
        resolve(None, 3, 4, 8)
