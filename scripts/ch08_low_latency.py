"""Chapter 8 from PyTorch: low-latency dispatch and combine with nvshmem_tutorial.Buffer.

    torchrun --standalone --nproc_per_node=N scripts/ch08_low_latency.py

Through DeepEP's low-latency API, against a reference built with plain torch from every rank's
inputs (all_gather): random top-k routing with -1 entries, bf16 and fp8 dispatch (plain,
power-of-two and UE8M0 scales), the receive hook, async_finish, zero-copy combine, a rank that
sends nothing, a dispatch and a combine captured once in a CUDA graph and replayed with new
data, 200 pairs in a row without cleaning, clean_low_latency_buffer, and bad input (refused
before any launch, or recorded by a kernel and raised by the next call or the receive hook).
Every comparison is a check of its own, by name. Rank 0 prints every rank's lines
(`pe <i>: ...`) and `N passed, M failed` last.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ch00_common import Tally, gather_rows, main, nv, pairs_in_a_row, print_by_pe, start
from nvshmem_tutorial.buffer import Buffer

MAX_TOKENS = 128  # num_max_dispatch_tokens_per_rank
EXPERTS_PER_RANK = 16
NUM_TOPK = 8


def inputs(num_tokens: int, hidden: int, seed: int) -> tuple:
    """This rank's tokens (bf16, values exact in bf16), routing (distinct experts, ~10% -1) and
    weights."""
    n, me = dist.get_world_size(), dist.get_rank()
    g = torch.Generator(device="cuda").manual_seed(seed * 1009 + me)
    x = (torch.randint(-256, 256, (num_tokens, hidden), generator=g, device="cuda") / 64).to(torch.bfloat16)
    scores = torch.rand((num_tokens, EXPERTS_PER_RANK * n), generator=g, device="cuda")
    idx = scores.topk(NUM_TOPK, dim=1).indices
    idx = torch.where(torch.rand(idx.shape, generator=g, device="cuda") < 0.1, torch.full_like(idx, -1), idx)
    weights = torch.rand((num_tokens, NUM_TOPK), generator=g, device="cuda")
    return x, idx, weights


def check_layout(buffer: Buffer, tally: Tally, num_experts: int) -> None:
    """get_dispatch_layout against torch on this buffer's topology: per rank, per node (None on
    one node, as DeepEP's), per expert and the routing; with -1 entries and experts sharing a
    rank or a node, so that each counts once."""
    n, _, num_nodes = nv.inter_node_layout()[:3]
    _, idx, _ = inputs(MAX_TOKENS, 8, 21)
    per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, num_experts)
    ranks = torch.where(idx >= 0, idx // EXPERTS_PER_RANK, torch.full_like(idx, n))
    want_in_rank = torch.nn.functional.one_hot(ranks, n + 1)[..., :n].amax(1).bool()
    tally.check(torch.equal(in_rank, want_in_rank), "layout: is_token_in_rank differs from torch's")
    tally.check(torch.equal(per_rank, want_in_rank.sum(0).int()), f"layout: num_tokens_per_rank {per_rank.tolist()}")
    want_expert = torch.bincount(idx[idx >= 0], minlength=num_experts).int()
    tally.check(torch.equal(per_expert, want_expert), "layout: num_tokens_per_expert differs from torch's")
    if num_nodes == 1:
        tally.check(per_node is None, "layout: num_tokens_per_rdma_rank on one node should be None")
        return
    want_node = want_in_rank.view(-1, num_nodes, n // num_nodes).any(2).sum(0).int()
    tally.check(per_node is not None and torch.equal(per_node, want_node),
                f"layout: num_tokens_per_rdma_rank {None if per_node is None else per_node.tolist()}, expected {want_node.tolist()}")


def expected_scales(rows: torch.Tensor, round_scale: bool) -> torch.Tensor:
    """DeepEP's fp8 scales of bf16 rows [M, H]: f32 [M, H / 128]."""
    amax = rows.float().view(rows.shape[0], -1, 128).abs().amax(2).clamp(min=1e-4)
    scale = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32, device="cuda")  # DeepEP: amax x f32(1/448)
    if round_scale:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return scale


# ANCHOR: check_dispatch
def check_dispatch(recv, recv_count, handle, x, idx, hidden: int, *, use_fp8: bool, round_scale: bool = False, use_ue8m0: bool = False) -> str:
    """'' if the packed receive matches torch's reference, else what differs."""
    n, me = dist.get_world_size(), dist.get_rank()
    src_info, layout_range, slots, _, num_experts = handle
    xs, idxs = gather_rows(x), gather_rows(idx)
    recv_x = recv[0] if use_fp8 else recv
    for e in range(EXPERTS_PER_RANK):
        expert = me * EXPERTS_PER_RANK + e
        want = sorted((s, t) for s in range(n) for t, k in (idxs[s] == expert).nonzero().tolist())
        count = int(recv_count[e])
        if count != len(want):
            return f"expert {e}: recv_count {count}, expected {len(want)}"
        begins, counts = (layout_range[e] >> 32).tolist(), (layout_range[e] & 0xFFFFFFFF).tolist()
        # Runs by source in ring order from this rank: its own first, then rank me + 1's, ...
        ring = [(me + p) % n for p in range(n)]
        if [begins[s] for s in ring] != [sum(counts[s] for s in ring[:p]) for p in range(n)] or sum(counts) != count:
            return f"expert {e}: layout_range begins {begins} counts {counts} do not tile {count} rows in ring order from rank {me}"
        source = torch.repeat_interleave(torch.tensor(ring, device="cuda"), torch.tensor([counts[s] for s in ring], device="cuda"))
        tokens = src_info[e, :count].long()
        got = sorted(zip(source.tolist(), tokens.tolist()))
        if got != want:
            return f"expert {e}: received (rank, token) pairs differ from the routing"
        if count == 0:
            continue
        original = torch.stack([xs[s][t] for s, t in zip(source.tolist(), tokens.tolist())])
        if not use_fp8:
            if not torch.equal(recv_x[e, :count], original):
                return f"expert {e}: a bf16 row differs"
            continue
        scales = recv[1][e, :count]
        want_scales = expected_scales(original, round_scale)
        if use_ue8m0:
            got_bytes = scales.contiguous().view(torch.uint8).view(count, -1)
            want_bytes = (want_scales.view(torch.int32) >> 23).to(torch.uint8)
            if not torch.equal(got_bytes, want_bytes):
                return f"expert {e}: a UE8M0 scale byte differs"
            scales = (got_bytes.int() << 23).view(torch.float32)
        elif not torch.equal(scales, want_scales):
            return f"expert {e}: an fp8 scale differs (max {float((scales - want_scales).abs().max())})"
        values = (recv_x[e, :count].float().view(count, -1, 128) * scales.unsqueeze(2)).view(count, hidden)
        error = (values - original.float()).abs().view(count, -1, 128).amax(2)
        if bool((error > want_scales * 448 * 0.07).any()):
            return f"expert {e}: an fp8 row is off by more than fp8 rounding"
    return ""
# ANCHOR_END: check_dispatch


def dequantize(recv, use_fp8: bool, use_ue8m0: bool) -> torch.Tensor:
    """The received rows as f32 [L, R * T, hidden]."""
    if not use_fp8:
        return recv.float()
    values, scales = recv
    if use_ue8m0:  # 4 exponent bytes per int32 -> f32 powers of two
        scales = (scales.contiguous().view(torch.uint8).int() << 23).view(torch.float32)
    return (values.float().view(*values.shape[:2], -1, 128) * scales.unsqueeze(3)).view(values.shape)


def expert_outputs(recv, use_fp8: bool, use_ue8m0: bool = False) -> torch.Tensor:
    """What each rank's experts 'compute': the received rows as bf16, times (rank + 1)."""
    return (dequantize(recv, use_fp8, use_ue8m0) * (dist.get_rank() + 1)).to(torch.bfloat16)


def expected_combine(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_k w_k * bf16(x * (owner(k) + 1)) in fp32, k in order, rounded once."""
    total = torch.zeros(x.shape, dtype=torch.float32, device="cuda")
    for k in range(idx.shape[1]):
        owner = (idx[:, k] // EXPERTS_PER_RANK).clamp(min=0)
        scaled = (x.float() * (owner + 1).unsqueeze(1)).to(torch.bfloat16).float()
        total += torch.where((idx[:, k] >= 0).unsqueeze(1), weights[:, k].unsqueeze(1) * scaled, 0.0)
    return total.to(torch.bfloat16)


def combine_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative error as DeepEP's calc_diff (0 for equal tensors)."""
    g, w = got.double() + 1, want.double() + 1
    return float(1 - 2 * (g * w).sum() / (g * g + w * w).sum())


# ANCHOR: pair
def pair(buffer: Buffer, tally: Tally, num_tokens: int, hidden: int, seed: int, *, use_fp8: bool = False, round_scale: bool = False,
         use_ue8m0: bool = False, hook: bool = False, async_finish: bool = False, zero_copy: bool = False, what: str = "") -> bool:
    """One dispatch and one combine, both checked against torch."""
    num_experts = EXPERTS_PER_RANK * dist.get_world_size()
    x, idx, weights = inputs(num_tokens, hidden, seed)
    stats = torch.zeros(EXPERTS_PER_RANK, dtype=torch.int32, device="cuda")
    recv, recv_count, handle, event, recv_hook = buffer.low_latency_dispatch(
        x, idx, MAX_TOKENS, num_experts, cumulative_local_expert_recv_stats=stats, use_fp8=use_fp8, round_scale=round_scale,
        use_ue8m0=use_ue8m0, async_finish=async_finish, return_recv_hook=hook)
    recv_hook() if hook else (event.current_stream_wait() if async_finish else None)
    problems = {"dispatch": check_dispatch(recv, recv_count, handle, x, idx, hidden, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=use_ue8m0)}
    problems["cumulative_local_expert_recv_stats"] = "" if torch.equal(stats, recv_count) else "differs from recv_count"
    y = expert_outputs(recv, use_fp8, use_ue8m0)
    if zero_copy:
        buffer.get_next_low_latency_combine_buffer(handle)[:, :, :] = y
    out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device="cuda")
    combined, event, recv_hook = buffer.low_latency_combine(y, idx, weights, handle, zero_copy=zero_copy, async_finish=async_finish,
                                                            return_recv_hook=hook, out=out)
    recv_hook() if hook else (event.current_stream_wait() if async_finish else None)
    want = expected_combine(x, idx, weights)
    problems["combine: out"] = "" if combined.data_ptr() == out.data_ptr() else "not written into the out given"
    limit = 1e-3 if use_fp8 else 1e-5
    bad = combine_error(combined, want) > limit or bool(combined.isnan().any())
    problems["combine: combined_x"] = f"differs from torch (diff {combine_error(combined, want):.2e})" if bad else ""
    mode = "fp8" + (" ue8m0" if use_ue8m0 else " pow2" if round_scale else "") if use_fp8 else "bf16"
    label = f"{what}: {num_tokens} tokens x {hidden} {mode}{' hook' if hook else ''}"
    return all([tally.check(not problem, f"{label}: {name}: {problem}") for name, problem in problems.items()])
# ANCHOR_END: pair


# ANCHOR: graph
def graph_replays(buffer: Buffer, tally: Tally, hidden: int, replays: int) -> None:
    """Capture one dispatch + combine, replay it with new tokens and routing copied into the
    captured inputs: every replay is checked."""
    num_experts = EXPERTS_PER_RANK * dist.get_world_size()
    x, idx, weights = inputs(MAX_TOKENS, hidden, 7000)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            recv, recv_count, handle, _, _ = buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=False)
            y = (recv.float() * (dist.get_rank() + 1)).to(torch.bfloat16)
            combined, _, _ = buffer.low_latency_combine(y, idx, weights, handle)
    torch.cuda.current_stream().wait_stream(stream)
    bad = 0
    for r in range(replays):
        new_x, new_idx, new_w = inputs(MAX_TOKENS, hidden, 7001 + r)
        x.copy_(new_x), idx.copy_(new_idx), weights.copy_(new_w)
        graph.replay()
        torch.cuda.synchronize()
        buffer.check()  # a failure inside a replay shows here (nothing else reads the record)
        problem = check_dispatch(recv, recv_count, handle, x, idx, hidden, use_fp8=False)
        if problem or combine_error(combined, expected_combine(x, idx, weights)) > 1e-5:
            bad += 1
    tally.check(bad == 0, f"CUDA graph: {bad} of {replays} replays differ from torch")
    # After a replay only the error record tells of a failure: an expert id out of range in
    # the captured routing is skipped by both kernels and recorded, and check() raises it;
    # the next replay is sound again.
    idx[0, 0] = num_experts + 3
    graph.replay()
    torch.cuda.synchronize()
    tally.expect_error(buffer.check, nv.InvalidArgumentError, "outside -1..")
    new_x, new_idx, new_w = inputs(MAX_TOKENS, hidden, 7001 + replays)
    x.copy_(new_x), idx.copy_(new_idx), weights.copy_(new_w)
    graph.replay()
    torch.cuda.synchronize()
    buffer.check()
    problem = check_dispatch(recv, recv_count, handle, x, idx, hidden, use_fp8=False)
    if not problem and combine_error(combined, expected_combine(x, idx, weights)) > 1e-5:
        problem = "combine differs from torch"
    tally.check(not problem, f"CUDA graph: the replay after a recorded bad input: {problem}")
    del graph
# ANCHOR_END: graph


def bad_input(buffer: Buffer, tally: Tally) -> None:
    """Every rank makes the same bad calls: each is refused before anything is launched."""
    n = dist.get_world_size()
    num_experts = EXPERTS_PER_RANK * n
    x, idx, _ = inputs(MAX_TOKENS, 2048, 1)
    Invalid = nv.InvalidArgumentError
    too_many = torch.cat([x, x[:1]])
    tally.expect_error(lambda: buffer.low_latency_dispatch(too_many, torch.cat([idx, idx[:1]]), MAX_TOKENS, num_experts), Invalid, "more than num_max_dispatch_tokens_per_rank")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x[:, :100].contiguous(), idx, MAX_TOKENS, num_experts), Invalid, "multiple of 128")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=True, use_ue8m0=True), Invalid, "round_scale")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx, 4 * MAX_TOKENS, num_experts), Invalid, "get_low_latency_rdma_size_hint")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx.int(), MAX_TOKENS, num_experts), Invalid, "int64")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts + 1), ValueError, "multiple")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x[0], idx, MAX_TOKENS, num_experts), Invalid, "x must be")
    tally.expect_error(lambda: buffer.low_latency_dispatch(x.cpu(), idx, MAX_TOKENS, num_experts), Invalid, "a CPU tensor")
    recv, _, handle, _, _ = buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=False)
    weights = torch.ones(idx.shape, device="cuda")
    tally.expect_error(lambda: buffer.low_latency_combine(recv[:, :-1], idx, weights, handle), Invalid, "x must be")
    tally.expect_error(lambda: buffer.low_latency_combine(recv, idx, weights, handle[:2]), Invalid, "handle must be the 5-tuple")
    tally.expect_error(lambda: buffer.get_next_low_latency_combine_buffer(handle[:2]), Invalid, "handle must be the 5-tuple")
    tally.expect_error(lambda: buffer.low_latency_combine(recv, idx, weights, handle, use_logfmt=True), ValueError, "use_logfmt")
    tally.expect_error(lambda: buffer.low_latency_update_mask_buffer(0, True), ValueError, "shrink")
    buffer.low_latency_combine(recv, idx, weights, handle)
    # One call in flight: a send's receive hook must run before the next call, and only once.
    _, _, _, _, hook = buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=False, return_recv_hook=True)
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts), Invalid, "receive hook")
    hook()
    tally.expect_error(hook, Invalid, "once")
    # An expert id out of range only the GPU sees: skipped, recorded, raised by the next call,
    # or by the receive hook after its receive is launched (the call completes either way).
    idx[0, 0] = num_experts + 5
    buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=False)
    torch.cuda.synchronize()
    tally.expect_error(lambda: buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts), Invalid, "outside -1..")
    _, _, _, _, hook = buffer.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts, use_fp8=False, return_recv_hook=True)
    torch.cuda.synchronize()
    tally.expect_error(hook, Invalid, "outside -1..")
    torch.cuda.synchronize()
    buffer.check()  # reported once, then cleared


def run() -> bool:
    start()
    me, n = dist.get_rank(), dist.get_world_size()
    tally = Tally()
    num_experts = EXPERTS_PER_RANK * n
    size = Buffer.get_low_latency_rdma_size_hint(MAX_TOKENS, 7168, n, num_experts)
    buffer = Buffer(dist.group.WORLD, num_rdma_bytes=size, low_latency_mode=True, num_qps_per_rank=EXPERTS_PER_RANK, explicitly_destroy=True)
    for hidden in (2048, 7168):
        pair(buffer, tally, MAX_TOKENS, hidden, hidden, what="random routing")
        pair(buffer, tally, MAX_TOKENS, hidden, hidden + 1, use_fp8=True, what="random routing")
        pair(buffer, tally, MAX_TOKENS, hidden, hidden + 2, use_fp8=True, round_scale=True, what="random routing")
        pair(buffer, tally, MAX_TOKENS, hidden, hidden + 3, use_fp8=True, round_scale=True, use_ue8m0=True, what="random routing")
        pair(buffer, tally, MAX_TOKENS, hidden, hidden + 4, use_fp8=True, hook=True, what="receive hook")
        pair(buffer, tally, MAX_TOKENS, hidden, hidden + 5, hook=True, zero_copy=True, what="hook, zero copy")
        pair(buffer, tally, 77, hidden, hidden + 6, async_finish=True, what="async_finish")
    # 384 = 3 x 128: 12 bytes of scales per fp8 message, so the slots only stay 16-byte
    # aligned because the message is padded.
    pair(buffer, tally, MAX_TOKENS, 384, 13, use_fp8=True, what="hidden not a multiple of 512")
    pair(buffer, tally, 0 if me == n - 1 else 50, 2048, 9, what="a rank that sends nothing")
    graph_replays(buffer, tally, 7168, 20)
    pairs = pairs_in_a_row(200)
    ok = all(pair(buffer, Tally(), 1 + (i * 37) % MAX_TOKENS, 2048, 100 + i, use_fp8=i % 2 == 1, what="pair") for i in range(pairs))
    tally.check(ok, f"{pairs} dispatch/combine pairs in a row: a result differed")
    buffer.clean_low_latency_buffer(MAX_TOKENS, 7168, num_experts)
    pair(buffer, tally, MAX_TOKENS, 7168, 11, use_fp8=True, what="after clean_low_latency_buffer")
    print_by_pe(f"{tally.passed} checks passed")
    bad_input(buffer, tally)
    pair(buffer, tally, MAX_TOKENS, 2048, 12, what="after bad input")
    check_layout(buffer, tally, num_experts)
    def normal_buffer():
        return Buffer(dist.group.WORLD, 1 << 22, explicitly_destroy=True, timeout_ms=5000)

    num_nodes = nv.inter_node_layout()[2]
    if num_nodes > 1:
        # Normal mode stays inside one node: a buffer over several is refused, naming the fix.
        tally.expect_error(normal_buffer, nv.InvalidArgumentError, "normal mode runs inside one node")
    else:
        normal = normal_buffer()
        tally.check(normal.timeout_ms == 5000, f"Buffer(timeout_ms=5000) has timeout_ms {normal.timeout_ms}")
        x, idx, _ = inputs(8, 2048, 3)
        tally.expect_error(lambda: normal.low_latency_dispatch(x, idx, MAX_TOKENS, num_experts), nv.InvalidArgumentError, "low_latency_mode")
        normal.destroy()
    buffer.destroy()
    return tally.finish()


if __name__ == "__main__":
    main("ch08_low_latency.py", run)
