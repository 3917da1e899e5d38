"""Chapter 4's collectives from Python on 2+ GPUs: results against plain torch, CUDA-graph
capture, the table's choices, and validation before launch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import nvshmem_tutorial as nv


def rank_values(pe: int, numel: int, salt: int, dtype=torch.float32) -> torch.Tensor:
    """Small integers / 4 (exact in bf16, so fp32 sums are exact): any rank rebuilds any
    rank's input."""
    g = torch.Generator(device="cuda").manual_seed(7919 * (pe + 1) + salt)
    return (torch.randint(-64, 64, (numel,), generator=g, device="cuda") / 4).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("numel", [1, 4099, 1 << 20])
def test_all_reduce_table_choice_matches_torch(dtype, numel):
    n, me = nv.n_pes(), nv.my_pe()
    x = nv.empty((numel,), dtype)
    out = nv.empty((numel,), dtype)
    x.copy_(rank_values(me, numel, numel, dtype))
    nv.all_reduce(out, x)
    expected = torch.stack([rank_values(p, numel, numel, dtype) for p in range(n)]).float().sum(0).to(dtype)
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_reduce_scatter_and_all_gather_compose_to_all_reduce():
    n, me = nv.n_pes(), nv.my_pe()
    count = 1000
    x = nv.empty((n * count,), torch.float32)
    part = nv.empty((count,), torch.float32)
    out = nv.empty((n * count,), torch.float32)
    x.copy_(rank_values(me, n * count, 3))
    nv.reduce_scatter(part, x)
    nv.all_gather(out, part)
    expected = torch.stack([rank_values(p, n * count, 3) for p in range(n)]).sum(0)
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


def test_graph_captured_all_reduce_replays_with_new_data():
    n, me = nv.n_pes(), nv.my_pe()
    x = nv.empty((2048,), torch.float32)
    x.zero_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        nv.all_reduce(x, x, algorithm="one_shot")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nv.all_reduce(x, x, algorithm="one_shot")  # in place
    ok = True
    for replay in range(3):
        x.copy_(rank_values(me, 2048, 100 + replay))
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.stack([rank_values(p, 2048, 100 + replay) for p in range(n)]).sum(0)
        ok &= torch.equal(x, expected)
    assert ok


def test_sync_all_orders_peer_views():
    n, me = nv.n_pes(), nv.my_pe()
    box = nv.zeros((n,), torch.int64)
    nv.sync_all()
    for pe in range(n):
        nv.peer_view(box, pe)[me] = 10 + me  # a store into pe's copy
    nv.barrier()  # completes the stores; sync_all alone would not
    torch.cuda.synchronize()
    assert box.tolist() == [10 + p for p in range(n)]


def test_mistakes_raise_before_launch():
    x = nv.empty((64,), torch.float32)
    with pytest.raises(nv.NotSymmetricError):
        nv.all_reduce(x, torch.zeros(64, device="cuda"))
    with pytest.raises(nv.InvalidArgumentError, match="n_pes"):
        nv.reduce_scatter(x, x)
    with pytest.raises(nv.InvalidArgumentError, match="bfloat16 or torch.float32"):
        nv.all_reduce(x.to(torch.int32), x.to(torch.int32))
    with pytest.raises(nv.InvalidArgumentError, match="int64"):
        nv.all_to_all_v(x, x, torch.zeros(nv.n_pes(), device="cuda"), torch.zeros(2, nv.n_pes(), dtype=torch.int64, device="cuda"))
    dist.barrier()
    nv.check_collectives()  # nothing failed on the device
