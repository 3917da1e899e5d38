"""CPU tests: what works, and how things fail, on a machine without a GPU (and without torch).

These run in CI (scripts/test.sh). The GPU suite is python/tests/gpu, run under torchrun by
scripts/gpu_test.sh.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import nvshmem_tutorial as nv
from nvshmem_tutorial import _native

from cpu_expect import NEEDS_INIT, NEEDS_NVSHMEM, fails_before_init

REPO = Path(__file__).resolve().parents[2]


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def test_version_matches_the_crate():
    assert nv.__version__ == _native.__version__
    cargo = (REPO / "Cargo.toml").read_text()
    workspace_version = re.search(r'^version = "([^"]+)"', cargo, re.M)
    assert workspace_version, "workspace version not found in Cargo.toml"
    assert nv.__version__ == workspace_version.group(1)


def test_native_module_and_public_names_load():
    for name in nv.__all__:
        assert hasattr(nv, name), name
    assert _native.UNIQUE_ID_BYTES == 128
    assert _native.pinned_nvshmem_version() == (3, 4, 5)


def test_importing_does_not_import_torch():
    # The package must import on machines without torch: check in a fresh interpreter.
    code = "import sys, nvshmem_tutorial; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out


def test_exception_hierarchy():
    assert issubclass(nv.NvshmemError, RuntimeError)
    for cls in (nv.NotInitializedError, nv.NoDeviceError, nv.LibraryError):
        assert issubclass(cls, nv.NvshmemError)
    assert issubclass(nv.InvalidArgumentError, ValueError)
    for cls in (nv.NotSymmetricError, nv.OutOfBoundsError, nv.PeOutOfRangeError):
        assert issubclass(cls, nv.InvalidArgumentError)


def test_library_is_found_and_is_the_pinned_release():
    path, version = nv.library_info()
    assert path.endswith("libnvshmem_host.so.3")
    assert Path(path).exists()
    assert version == (3, 4, 5)


@pytest.mark.parametrize(
    "call",
    [
        lambda: nv.my_pe(),
        lambda: nv.n_pes(),
        lambda: nv.node_pe(),
        lambda: nv.node_size(),
        lambda: nv.empty((4,), None),
        lambda: nv.zeros(4),
        lambda: nv.peer_view(None, 0),
        lambda: nv.put(None, None, 0),
        lambda: nv.get(None, None, 0),
        lambda: nv.put_nbi(None, None, 0),
        lambda: nv.get_nbi(None, None, 0),
        lambda: nv.barrier(),
        lambda: nv.quiet(),
        lambda: nv.put_signal(None, None, 0, None, 1),
        lambda: nv.put_signal(None, None, 0, None, 1, op="add", nbi=True),
        lambda: nv.signal_op(None, 1, 0),
        lambda: nv.wait_signal(None, 1),
        lambda: nv.wait_signal(None, 0, cmp="eq"),
        lambda: nv.collect(),
        lambda: nv.heap_usage(),
        lambda: nv.is_symmetric(None),
    ],
)
def test_use_before_init_is_a_clear_error(call):
    fails_before_init(call, nv.NotInitializedError, NEEDS_INIT)


@pytest.mark.parametrize(
    "call",
    [
        lambda: _native.topology(),
        lambda: _native.alloc(16),
        lambda: _native.to_dlpack(0x1000, 16, 0x1000),
        lambda: _native.released_ids(),
        lambda: _native.locate(0x1000, 8),
        lambda: _native.peer_ptr(0x1000, 8, 0),
        lambda: _native.put(0x1000, 0x2000, 8, 0, 0),
        lambda: _native.get(0x1000, 0x2000, 8, 0, 0),
        lambda: _native.barrier(0),
        lambda: _native.quiet(0),
        lambda: _native.put_signal(0x1000, 0x2000, 8, 0x3000, 1, "set", 0, 0),
        lambda: _native.signal_op(0x3000, 1, "add", 0, 0),
        lambda: _native.wait_signal(0x3000, "ge", 1, 0),
    ],
)
def test_native_calls_before_init_raise_instead_of_crashing(call):
    fails_before_init(call, nv.NotInitializedError, NEEDS_NVSHMEM)


def test_signal_names_are_nvshmems_constants():
    # The Rust tables behind op=/cmp=, checked against nvshmem-sys/src/types.rs's values
    # (nvshmemx_signal_op_t, nvshmemx_cmp_type_t).
    assert _native.SIGNAL_OPS == ("set", "add")
    assert [_native.signal_op_code(op) for op in _native.SIGNAL_OPS] == [9, 10]
    assert _native.SIGNAL_CMPS == ("eq", "ne", "gt", "ge", "lt", "le")
    codes = [_native.signal_cmp_code(cmp) for cmp in _native.SIGNAL_CMPS]
    assert codes == [0, 1, 2, 5, 4, 3]
    assert "uint64" in nv.SUPPORTED_DTYPES  # signal words are symmetric uint64 tensors


# Scalar arguments are checked before anything else, so these need neither NVSHMEM nor torch
# (the tensor checks, which need torch, are in python/tests/gpu/test_signals.py).
@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: nv.put_signal(None, None, 0, None, 1, op="xor"), "op='xor' is not one of"),
        (lambda: nv.put_signal(None, None, 0, None, 1, op="SET"), "'set', 'add'"),
        (lambda: nv.put_signal(None, None, 0, None, 1, op=None), "op=None"),
        (lambda: nv.put_signal(None, None, 0, None, -1), "0..2\\*\\*64-1"),
        (lambda: nv.put_signal(None, None, 0, None, 1 << 64), "does not fit"),
        (lambda: nv.put_signal(None, None, 0, None, 1.0), "must be a Python int"),
        (lambda: nv.put_signal(None, None, 0, None, True), "must be a Python int"),
        (lambda: nv.signal_op(None, 1, 0, op="inc"), "op='inc'"),
        (lambda: nv.signal_op(None, -5, 0), "does not fit"),
        (lambda: nv.wait_signal(None, 1, cmp=">="), "cmp='>=' is not one of"),
        (lambda: nv.wait_signal(None, 1, cmp="gte"), "'ge'"),
        (lambda: nv.wait_signal(None, "1"), "must be a Python int"),
        (lambda: nv.wait_signal(None, 2**64), "does not fit"),
    ],
)
def test_bad_signal_arguments_are_rejected_before_anything_else(call, text):
    fails_before_init(call, nv.InvalidArgumentError, text)


@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: _native.put_signal(0x1000, 0x2000, 8, 0x3000, 1, "or", 0, 0), 'op="or"'),
        (lambda: _native.signal_op(0x3000, 1, "", 0, 0), 'op=""'),
        (lambda: _native.wait_signal(0x3000, "GE", 1, 0), 'cmp="GE" is not one of'),
        (lambda: _native.signal_op_code("swap"), '"set", "add"'),
        (lambda: _native.signal_cmp_code("equal"), '"eq", "ne", "gt", "ge", "lt", "le"'),
    ],
)
def test_native_signal_names_are_checked_before_nvshmem(call, text):
    # The native layer does not trust the Python one: a direct call with a bad name is an
    # argument error too, raised before it asks whether NVSHMEM is up.
    fails_before_init(call, nv.InvalidArgumentError, text)


def test_native_signal_value_must_fit_u64():
    with pytest.raises(OverflowError):
        _native.wait_signal(0x3000, "ge", -1, 0)


def test_finalize_before_init_is_a_no_op():
    nv.finalize()
    assert not nv.is_initialized()


def test_init_without_torch_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(ImportError, match="needs PyTorch"):
        nv.init()


def test_unique_id_of_the_wrong_size_is_rejected():
    with pytest.raises(nv.InvalidArgumentError, match="exactly 128"):
        _native.init(0, 1, 0, b"\0" * 12)


def test_rank_outside_the_world_is_rejected():
    with pytest.raises(nv.InvalidArgumentError, match="rank"):
        _native.init(3, 2, 0, b"\0" * 128)


@pytest.mark.skipif(_have("torch"), reason="torch installed: the no-torch path is not reachable")
def test_without_torch_every_call_that_needs_it_says_so():
    with pytest.raises(ImportError, match="needs PyTorch"):
        nv.init()


def _driver_present() -> bool:
    try:
        _native.probe_driver()
    except nv.NoDeviceError:
        return False
    return True


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present")
def test_no_gpu_is_a_no_device_error():
    with pytest.raises(nv.NoDeviceError, match="libcuda.so.1"):
        _native.probe_driver()
    # The full native init path reaches the same check without crashing the interpreter.
    with pytest.raises(nv.NoDeviceError, match="no NVIDIA driver"):
        _native.init(0, 1, 0, b"\0" * 128)
    assert not nv.is_initialized()


def test_a_broken_library_is_a_library_error_with_the_fix(tmp_path):
    # A fresh interpreter (the library is not loaded yet) whose NVSHMEM_HOME, searched first,
    # holds a file that is not a library: loading must fail with the fix, not crash.
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libnvshmem_host.so.3").write_bytes(b"not an ELF file")
    code = (
        "import nvshmem_tutorial as nv\n"
        "try:\n"
        "    nv.library_info()\n"
        "except nv.LibraryError as e:\n"
        "    print('LibraryError:', e)\n"
    )
    env = {"NVSHMEM_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "LibraryError:" in text, text
    assert "pip install nvidia-nvshmem-cu13==3.4.5" in text, text
