"""Chapter 7 from PyTorch: MoE dispatch and combine with nvshmem_tutorial.Buffer.

    torchrun --standalone --nproc_per_node=N scripts/ch07_buffer.py

Mirrors src/bin/ch07-buffer.rs through DeepEP's API: random top-k routing with -1 entries,
dispatch of bf16 and fp8 tokens with and without top-k, cached, async with a previous event,
fixed-size outputs (num_worst_tokens), combine with weights and a bias; edge routings (a rank
with no tokens, expert 0 first for every token, hidden 2048/4096/7168); 1000 dispatch/combine
pairs in a row with new routing and no cleanup; bad input (refused before any launch, or
recorded by a kernel and raised by `check()`, an event wait or the next call); a region view
that outlives `destroy()`. Every result is compared with a reference built from every rank's
inputs with plain torch (all_gather), and every comparison is a check of its own, by name.
Rank 0 prints every rank's lines (`pe <i>: ...`) and `N passed, M failed` last.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ch00_common import Tally, gather_rows, main, nv, pairs_in_a_row, print_by_pe, start
from nvshmem_tutorial.buffer import Buffer, Config

EXPERTS_PER_RANK = 8
NUM_TOPK = 8


def routing(num_tokens: int, n: int, seed: int, skew: bool = False) -> torch.Tensor:
    """[num_tokens, K] int64 global expert ids, distinct per token, about 10% -1."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand((num_tokens, EXPERTS_PER_RANK * n), generator=g, device="cuda")
    if skew:
        scores[:, 0] += 10  # every token's first choice is expert 0
    idx = scores.topk(NUM_TOPK, dim=1).indices
    drop = torch.rand(idx.shape, generator=g, device="cuda") < 0.1
    return torch.where(drop, torch.full_like(idx, -1), idx)


# ANCHOR: round_trip
def round_trip(buffer: Buffer, tally: Tally, num_tokens: int, hidden: int, seed: int, *, fp8: bool = False, skew: bool = False, what: str = "") -> bool:
    """Layout, dispatch, cached dispatch, worst-case dispatch, combine: all against torch,
    each comparison a check of its own."""
    me, n = dist.get_rank(), dist.get_world_size()
    num_experts = EXPERTS_PER_RANK * n
    g = torch.Generator(device="cuda").manual_seed(seed * 977 + me)
    x = (torch.randint(-64, 64, (num_tokens, hidden), generator=g, device="cuda") / 8).to(torch.bfloat16)
    topk_idx = routing(num_tokens, n, seed * 31 + me, skew)
    topk_weights = torch.rand((num_tokens, NUM_TOPK), generator=g, device="cuda")
    config = Config(24, 8, 256)
    checks = {}
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    owner = torch.where(topk_idx >= 0, topk_idx // EXPERTS_PER_RANK, -1)
    expected_in_rank = torch.stack([(owner == r).any(1) for r in range(n)], 1)
    checks["layout: is_token_in_rank"] = torch.equal(in_rank, expected_in_rank)
    checks["layout: num_tokens_per_rank"] = torch.equal(per_rank, expected_in_rank.sum(0).int())
    expected_per_expert = torch.stack([(topk_idx == e).sum() for e in range(num_experts)]).int()
    checks["layout: num_tokens_per_expert"] = torch.equal(per_expert, expected_per_expert)
    sent = x
    if fp8:  # per-token, per-128-channel scales, column-major as DeepEP's test passes them
        amax = x.view(num_tokens, -1, 128).abs().float().amax(2).clamp(1e-4)
        sent = ((x.view(num_tokens, -1, 128) * (448 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(num_tokens, hidden), (amax / 448).T.contiguous().T)
    recv, recv_idx, recv_w, per_expert_list, handle, _ = buffer.dispatch(
        sent, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=topk_weights, config=config,
    )
    # The reference: every rank's tokens that have an expert here, by (rank, token).
    xs, idxs, ws = gather_rows(x), gather_rows(topk_idx), gather_rows(topk_weights)
    rows, exp_idx, exp_w = [], [], []
    for s in range(n):
        mine = ((idxs[s] >= 0) & (idxs[s] // EXPERTS_PER_RANK == me)).any(1)
        rows.append(xs[s][mine])
        local = (idxs[s][mine] >= 0) & (idxs[s][mine] // EXPERTS_PER_RANK == me)
        exp_idx.append(torch.where(local, idxs[s][mine] - me * EXPERTS_PER_RANK, -1))
        exp_w.append(torch.where(local, ws[s][mine], 0.0))
    expected = torch.cat(rows)
    got = recv if not fp8 else (recv[0].float().view(-1, hidden // 128, 128) * recv[1].unsqueeze(2)).view(-1, hidden).to(torch.bfloat16)
    want_local = [int((torch.cat(exp_idx) == e).sum()) for e in range(EXPERTS_PER_RANK)]
    close = torch.equal(got, expected) if not fp8 else bool((got.float() - expected.float()).abs().max() <= expected.float().abs().max() / 8 + 1e-3)
    checks["dispatch: recv_x"] = got.shape == expected.shape and close
    checks["dispatch: recv_topk_idx"] = torch.equal(recv_idx, torch.cat(exp_idx))
    checks["dispatch: recv_topk_weights"] = torch.equal(recv_w, torch.cat(exp_w))
    checks["dispatch: num_recv_tokens_per_expert_list"] = per_expert_list == want_local
    checks["dispatch: rank_prefix_matrix"] = handle[0][:, me].tolist() == torch.tensor([len(r) for r in rows]).cumsum(0).tolist()
    # Cached (the handle instead of the notify step), async after a captured event.
    cached, _, _, _, _, event = buffer.dispatch(sent, handle=handle, config=config, previous_event=buffer.capture(), async_finish=True)
    event.current_stream_wait()
    checks["cached dispatch (async, after an event)"] = torch.equal(cached[0] if fp8 else cached, recv[0] if fp8 else recv)
    # Fixed-size outputs (CUDA graphs): the first rows identical, the rest of topk_idx -1.
    worst = 1000 * n  # the same on every rank, above any rank's receive count here
    w_recv, w_idx, _, w_list, _, _ = buffer.dispatch(
        sent, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=topk_idx, topk_weights=topk_weights, num_worst_tokens=worst, config=config,
    )
    count = expected.shape[0]
    checks["num_worst_tokens: no per-expert list"] = w_list == []
    checks["num_worst_tokens: the received rows"] = torch.equal((w_recv[0] if fp8 else w_recv)[:count], recv[0] if fp8 else recv)
    checks["num_worst_tokens: recv_topk_idx -1 past them"] = bool((w_idx[count:] == -1).all())
    # Combine: each rank's "expert" scales what it got by (rank + 1); the token's rank sums
    # in fp32, in rank order, plus the bias, and rounds once.
    if not fp8:
        bias = torch.full((num_tokens, hidden), 0.5, dtype=torch.bfloat16, device="cuda")
        combined, combined_w, _ = buffer.combine((recv.float() * (me + 1)).to(torch.bfloat16), handle, topk_weights=recv_w, bias=bias, config=config)
        total = bias.float()
        for r in range(n):
            total = total + expected_in_rank[:, r].unsqueeze(1) * (x.float() * (r + 1)).to(torch.bfloat16).float()
        checks["combine: combined_x"] = torch.equal(combined, total.to(torch.bfloat16))
        checks["combine: combined_topk_weights"] = torch.equal(combined_w, torch.where(topk_idx >= 0, topk_weights, 0.0))
    label = f"{what}: {num_tokens} tokens x {hidden}{' fp8' if fp8 else ''}{' skewed' if skew else ''}"
    return all([tally.check(ok, f"{label}: {name} differs from torch's") for name, ok in checks.items()])
# ANCHOR_END: round_trip


def bad_input(buffer: Buffer, tally: Tally) -> None:
    """Every rank makes the same bad calls: each is refused before anything is launched, or
    recorded by the kernel that saw it and raised where the error record is read."""
    n = dist.get_world_size()
    num_experts = EXPERTS_PER_RANK * n
    Invalid = nv.InvalidArgumentError
    topk_idx = routing(64, n, 1)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    x = torch.ones((64, 2048), dtype=torch.bfloat16, device="cuda")
    layout = {"num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank, "num_tokens_per_expert": per_expert, "config": Config(24, 8, 256)}
    tally.expect_error(lambda: buffer.get_dispatch_layout(topk_idx.int(), num_experts), Invalid, "int64")
    tally.expect_error(lambda: buffer.get_dispatch_layout(topk_idx.cpu(), num_experts), Invalid, "a CPU tensor")
    tally.expect_error(lambda: buffer.dispatch(x[0], **layout), Invalid, "x must be")
    tally.expect_error(lambda: buffer.dispatch(x, **layout, num_worst_tokens=8), Invalid, "needs topk_idx")
    *_, handle, _ = buffer.dispatch(x, **layout)
    tally.expect_error(lambda: buffer.dispatch(x, handle=handle[:3], config=layout["config"]), Invalid, "handle must be the 6-tuple")
    too_many = torch.ones((handle[3].shape[0] + 1, 2048), dtype=torch.bfloat16, device="cuda")
    tally.expect_error(lambda: buffer.combine(too_many, handle, config=layout["config"]), Invalid, "x must be")
    tally.expect_error(lambda: Buffer(dist.group.WORLD, 1 << 20, 1 << 20), ValueError, "inter-node")
    # An expert id out of range only the GPU sees: recorded, raised by check(), by an event's
    # wait and by the next call, once each; the buffer stays usable.
    with_bad = torch.full((8, NUM_TOPK), num_experts, dtype=torch.int64, device="cuda")
    buffer.get_dispatch_layout(with_bad, num_experts)
    torch.cuda.synchronize()
    tally.expect_error(buffer.check, Invalid, "outside -1..")
    *_, event = buffer.get_dispatch_layout(with_bad, num_experts, async_finish=True)
    torch.cuda.synchronize()
    tally.expect_error(event.current_stream_wait, Invalid, "outside -1..")
    buffer.get_dispatch_layout(with_bad, num_experts)
    torch.cuda.synchronize()
    tally.expect_error(lambda: buffer.get_dispatch_layout(with_bad, num_experts), Invalid, "outside -1..")
    torch.cuda.synchronize()
    buffer.check()  # the record was reported once and cleared


def region_after_destroy(buffer: Buffer, tally: Tally) -> None:
    """A view of the buffer's memory keeps it alive after destroy(); the memory returns at the
    collect point after the view is gone (the package's freeing rule)."""
    region = buffer.get_local_buffer_tensor(torch.int32, (16,))
    nv.collect()  # nothing else released is left to free below
    live = nv.heap_usage()["live"]
    buffer.destroy()
    region.fill_(7)
    tally.check(int(region.sum()) == 7 * 16, "a region view no longer reads and writes the buffer's memory after destroy()")
    tally.check(nv.heap_usage()["live"] == live, "the buffer's memory was freed while a region view of it lived")
    del region
    nv.collect()
    tally.check(nv.heap_usage()["live"] == live - 1, "the buffer's memory was not freed at the collect point after its last view")


def run() -> bool:
    start()
    me, n = dist.get_rank(), dist.get_world_size()
    tally = Tally()
    buffer = Buffer(dist.group.WORLD, Config(24, 8, 256).get_nvl_buffer_size_hint(7168 * 2, n), explicitly_destroy=True)
    if os.environ.get(nv._native.BUFFER_TIMEOUT_VAR) is None:
        tally.check(buffer.timeout_ms == 100_000, f"the default timeout is {buffer.timeout_ms} ms, not 100 s")
    for hidden in (2048, 4096, 7168):
        round_trip(buffer, tally, 1000, hidden, hidden, what="random routing")
        round_trip(buffer, tally, 1000, hidden, hidden + 1, fp8=True, what="random routing")
    round_trip(buffer, tally, 0 if me == 0 else 300, 2048, 5, what="a rank with no tokens")
    round_trip(buffer, tally, 500, 2048, 6, skew=True, what="expert 0 first for every token")
    pairs = pairs_in_a_row(1000)
    ok = all(round_trip(buffer, Tally(), 64 + i % 50, 2048, 100 + i, what="pair") for i in range(pairs))
    tally.check(ok, f"{pairs} dispatch/combine pairs in a row: a result differed")
    print_by_pe(f"{tally.passed} checks passed")
    bad_input(buffer, tally)
    round_trip(buffer, tally, 300, 2048, 7, what="after bad input")
    region_after_destroy(buffer, tally)
    tally.expect_error(lambda: buffer.get_dispatch_layout(routing(8, n, 2), EXPERTS_PER_RANK * n), nv.NvshmemError, "destroyed")
    return tally.finish()


if __name__ == "__main__":
    main("ch07_buffer.py", run)
