"""What the CPU suites (test_cpu.py, test_buffer_cpu.py, test_inter_node_cpu.py) check of a
call that must fail before anything else, once: NVSHMEM is not initialised, and ``call()``
raises ``error`` with a message that matches ``match``."""

from __future__ import annotations

from typing import Any, Callable, Optional, Type

import pytest

import nvshmem_tutorial as nv

NEEDS_INIT = r"nvshmem_tutorial\.init\(\) first"
"""What a package call says before init(): call init() first."""

NEEDS_NVSHMEM = "not initialised"
"""What a native call whose arguments pass its checks says before init()."""


def fails_before_init(call: Callable[[], Any], error: Type[BaseException], match: Optional[str] = None) -> None:
    assert not nv.is_initialized()
    with pytest.raises(error, match=match):
        call()
