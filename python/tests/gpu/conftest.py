"""GPU suite: run under torchrun, one pytest process per GPU, e.g.

    python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m pytest -p no:cacheprovider python/tests/gpu -q

(no cache: two processes writing .pytest_cache at once race).

Every rank collects and runs the same tests in the same order, so a test may call collective
operations (init, empty, barrier, collect) as long as every rank reaches them: assertions
come after the collectives of a test, never between them. Outside torchrun the suite skips.
"""

from __future__ import annotations

import os

import pytest

if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
    pytest.skip(
        "GPU tests run under torchrun (RANK/LOCAL_RANK unset)", allow_module_level=True
    )

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session", autouse=True)
def world():
    """torch.distributed (NCCL) and NVSHMEM on this rank's GPU, for the whole session."""
    import torch.distributed as dist

    import nvshmem_tutorial as nv

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    nv.init()
    yield nv
    if nv.is_initialized():
        nv.finalize()
    dist.barrier()
    dist.destroy_process_group()
