"""A complete MoE layer over the buffer, forward and backward, checked against the same layer
computed without communication.

    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py            # small, checked
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --bench    # DeepSeek-V3 shapes
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --timeline PREFIX

The layer: a router (softmax over the experts, top-k, the k weights renormalised), the tokens
sent to the ranks of their experts (`get_dispatch_layout`, `dispatch`, in bf16 or fp8), each
rank's experts (gate / up / down with SiLU) on the rows it received, weighted by the router, and
the results sent back and summed (`combine`). Dispatch and combine are `torch.autograd.Function`s
whose backward passes are each other, as DeepEP documents: the gradient of dispatch is a combine
of the received rows' gradients (with the top-k weights' gradients summed back the same way),
and the gradient of combine is a dispatch of the output's gradient with the forward's handle.

The experts run as a loop over this rank's experts, each on the rows routed to it (the
(row, expert) pairs sorted by expert once, with the per-expert counts the dispatch already
returned to the host, so the loop never waits for the GPU; then `index_select`, three GEMMs,
`index_add`): exact, simple to read, and each GEMM is large at real shapes; a grouped GEMM
would save launches when experts get few rows.

The check: every rank also computes its own tokens' outputs with every expert's weights on its
own GPU (the weights come from a seed, so every rank can make every expert), then the
gradients of the input, of the router and of the experts (the reference's expert gradients are
summed over the ranks first). Tolerances, relative to the reference's norm: outputs 1e-2,
gradients 2e-2 (bf16 rows, summed in a different order; fp8 dispatch quantises the
reference's input the same way). Then, with --bench, the time per layer (forward + backward)
and the share spent in dispatch and combine, each timed with CUDA events on rank 0.

--timeline PREFIX profiles two micro-batches' forward at DeepSeek-V3 shapes, serial and
overlapped, one call each after 3 warm-ups and a barrier, inside
torch.profiler.record_function("step") (benchmarks/plot_timeline.py's record_steps); rank 0
writes the traces PREFIX_serial.json and PREFIX_overlapped.json and draws each as
PREFIX_<case>.svg (a lane per CUDA stream: the buffer's kernels as communication, the experts'
GEMMs as compute, the rest as other) and PREFIX_<case>.csv (every operation, and the time
communication runs while the GEMMs do), on one time scale.
"""

from __future__ import annotations

import argparse
import csv
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ch00_common import draw_timelines, main, print_by_pe, start, Tally, timeline_modules
from nvshmem_tutorial.buffer import Buffer, Config


@dataclass
class Shape:
    tokens: int  # per rank
    hidden: int
    experts: int  # in all
    top_k: int
    ffn: int  # expert intermediate size


SMALL = Shape(tokens=256, hidden=1024, experts=16, top_k=4, ffn=256)
DEEPSEEK_V3 = Shape(tokens=4096, hidden=7168, experts=256, top_k=8, ffn=2048)
CONFIG = Config(24, 8, 256)  # SMs, NVL chunk, NVL ring tokens (DeepEP's defaults at EP2-8)
FP8_GROUP = 128  # channels per fp8 scale


# ANCHOR: fp8
def to_fp8(x: torch.Tensor) -> tuple:
    """Per token and 128 channels: (e4m3 values, float32 scales [N, H / 128])."""
    n, h = x.shape
    groups = x.float().view(n, h // FP8_GROUP, FP8_GROUP)
    scales = groups.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    values = (groups / scales.unsqueeze(2)).to(torch.float8_e4m3fn).view(n, h)
    return values, scales


def from_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, h = values.shape
    groups = values.float().view(n, h // FP8_GROUP, FP8_GROUP) * scales.unsqueeze(2)
    return groups.view(n, h).to(torch.bfloat16)
# ANCHOR_END: fp8


class Route:
    """What the backward passes need from the forward's dispatch: the buffer and the handle."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer
        self.handle: Optional[tuple] = None
        self.counts: List[int] = []  # rows per local expert, from the dispatch


# ANCHOR: autograd
class Dispatch(torch.autograd.Function):
    """Forward: this rank's tokens to the ranks of their experts. Backward: a combine."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                route: Route, num_experts: int, fp8: bool) -> tuple:
        buffer = route.buffer
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
        sent = to_fp8(x) if fp8 else x
        recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
            sent, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights,
            config=CONFIG)
        route.handle, route.counts = handle, counts
        ctx.route = route
        ctx.mark_non_differentiable(recv_idx)
        # fp8 travels; the experts compute in bf16 (the backward is straight-through).
        return (from_fp8(*recv_x) if fp8 else recv_x), recv_idx, recv_w

    @staticmethod
    def backward(ctx: Any, grad_x: torch.Tensor, _grad_idx: Any, grad_w: torch.Tensor) -> tuple:
        route = ctx.route
        grad_w = grad_w.contiguous() if grad_w is not None else None
        grad_x_sent, grad_w_sent, _ = route.buffer.combine(
            grad_x.contiguous(), route.handle, topk_weights=grad_w, config=CONFIG)
        return grad_x_sent, None, grad_w_sent, None, None, None


class Combine(torch.autograd.Function):
    """Forward: every expert result back to its token's rank, summed. Backward: a dispatch
    with the forward's handle (the same rows to the same ranks)."""

    @staticmethod
    def forward(ctx: Any, y: torch.Tensor, route: Route) -> torch.Tensor:
        ctx.route = route
        combined, _, _ = route.buffer.combine(y, route.handle, config=CONFIG)
        return combined

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        route = ctx.route
        grad_y, _, _, _, _, _ = route.buffer.dispatch(grad.contiguous(), handle=route.handle,
                                                      config=CONFIG)
        return grad_y, None
# ANCHOR_END: autograd


def grouped_mm(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows ends[e - 1]..ends[e] of `a` times b[e]: one grouped GEMM (torch._grouped_mm, bf16
    on Hopper, with its backward), or one GEMM per group where torch lacks it."""
    if hasattr(torch, "_grouped_mm") and torch.cuda.get_device_capability() >= (9, 0):
        return torch._grouped_mm(a, b, offs=ends)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]]).tolist()  # a host sync: fallback only
    return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends.tolist()))])


class Experts(torch.nn.Module):
    """Every expert's weights made from a seed (so that any rank can make any expert);
    `first`..`first + count` are this rank's."""

    def __init__(self, shape: Shape, first: int, count: int, seed: int) -> None:
        super().__init__()

        def weights(which: int, *size: int) -> torch.Tensor:
            out = torch.empty(count, *size, dtype=torch.bfloat16, device="cuda")
            for i in range(count):  # expert first + i's matrix `which`, from its own seed
                expert_seed = seed * 1_000_003 + (first + i) * 3 + which
                g = torch.Generator(device="cuda").manual_seed(expert_seed)
                out[i] = torch.randn(*size, generator=g, device="cuda") / size[0] ** 0.5
            return out

        self.first = first
        self.gate = torch.nn.Parameter(weights(0, shape.hidden, shape.ffn))
        self.up = torch.nn.Parameter(weights(1, shape.hidden, shape.ffn))
        self.down = torch.nn.Parameter(weights(2, shape.ffn, shape.hidden))

    # ANCHOR: experts
    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor,
                counts: List[int]) -> torch.Tensor:
        """Each row's sum over its experts here of weight x expert(row): three grouped GEMMs
        over the (row, expert) pairs sorted by expert. topk_idx holds local expert ids (-1:
        another rank's, or none); only the pairs' total comes from the host (the dispatch's
        counts), so nothing here waits for the GPU."""
        k, experts = topk_idx.shape[1], self.gate.shape[0]
        expert = topk_idx.view(-1)
        expert = torch.where(expert < 0, experts, expert)  # the -1s last
        pairs = torch.argsort(expert, stable=True)[: sum(counts)]
        if pairs.numel() == 0:
            return x * 0  # no row here for these experts (and still a graph for backward)
        # ends[e]: pairs of experts 0..e, found on the GPU (no bincount: it syncs for its size)
        ends = torch.searchsorted(expert.index_select(0, pairs),
                                  torch.arange(1, experts + 1, device=x.device))
        ends = ends.to(torch.int32)
        rows = pairs // k
        h = x.index_select(0, rows)
        h = F.silu(grouped_mm(h, self.gate, ends)) * grouped_mm(h, self.up, ends)
        weight = topk_w.view(-1).index_select(0, pairs).unsqueeze(1).to(h.dtype)
        y = grouped_mm(h, self.down, ends) * weight
        # Each pair's output in its own (row, slot) place, then the sum over slots: the same
        # bits every run (an index_add of rows repeated across experts adds in any order).
        y = x.new_zeros(topk_idx.numel(), x.shape[1]).index_copy(0, pairs, y)
        return y.view(-1, k, x.shape[1]).sum(dim=1)
    # ANCHOR_END: experts

    def forward_loop(self, x: torch.Tensor, topk_idx: torch.Tensor,
                     topk_w: torch.Tensor) -> torch.Tensor:
        """The same sum as one GEMM chain per expert: the check of the grouped GEMMs."""
        out = torch.zeros_like(x)
        for e in range(self.gate.shape[0]):
            rows, slot = (topk_idx == e).nonzero(as_tuple=True)
            h = x.index_select(0, rows)
            h = F.silu(h @ self.gate[e]) * (h @ self.up[e])
            weight = topk_w[rows, slot].unsqueeze(1).to(h.dtype)
            out = out.index_add(0, rows, (h @ self.down[e]) * weight)
        return out


class MoeLayer(torch.nn.Module):
    def __init__(self, shape: Shape, buffer: Optional[Buffer], rank: int, ranks: int,
                 seed: int) -> None:
        super().__init__()
        per_rank = shape.experts // ranks
        self.shape, self.buffer = shape, buffer
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        router = torch.randn(shape.hidden, shape.experts, generator=g, device="cuda")
        self.router = torch.nn.Parameter((router / shape.hidden ** 0.5).to(torch.bfloat16))
        self.experts = Experts(shape, rank * per_rank, per_rank, seed)

    def route(self, x: torch.Tensor) -> tuple:
        scores = torch.softmax((x @ self.router).float(), dim=1)
        topk_w, topk_idx = scores.topk(self.shape.top_k, dim=1)
        return topk_idx, topk_w / topk_w.sum(dim=1, keepdim=True)

    # ANCHOR: layer
    def forward(self, x: torch.Tensor, fp8: bool = False) -> torch.Tensor:
        topk_idx, topk_w = self.route(x)
        route = Route(self.buffer)
        recv_x, recv_idx, recv_w = Dispatch.apply(x, topk_idx, topk_w, route,
                                                  self.shape.experts, fp8)
        y = self.experts(recv_x, recv_idx, recv_w, route.counts)
        return Combine.apply(y, route)
    # ANCHOR_END: layer

    def reference(self, x: torch.Tensor, every_expert: Experts, fp8: bool) -> torch.Tensor:
        """The same layer on this GPU alone: every expert here, no communication."""
        topk_idx, topk_w = self.route(x)
        seen = from_fp8(*to_fp8(x)) if fp8 else x
        seen = x + (seen - x).detach()  # the straight-through fp8 of the dispatch
        counts = torch.bincount(topk_idx.view(-1), minlength=self.shape.experts).tolist()
        return every_expert(seen, topk_idx, topk_w, counts)


# ANCHOR: micro_batches
def two_micro_batches(layer: MoeLayer, xs: List[torch.Tensor], overlap: bool) -> List[torch.Tensor]:
    """The layer's forward on two micro-batches. Overlapped, every dispatch and combine runs on
    the buffer's communication stream (`async_finish`, `allocate_on_comm_stream`), each after an
    event of the compute stream, and the compute stream waits only where it reads the result:
    micro-batch 1's dispatch travels while the experts compute micro-batch 0, and micro-batch
    0's combine while they compute micro-batch 1. Serial, the same calls on the compute stream.
    """
    buffer, experts = layer.buffer, layer.shape.experts
    streams = dict(async_finish=overlap, allocate_on_comm_stream=overlap)

    def dispatch(x: torch.Tensor) -> tuple:
        topk_idx, topk_w = layer.route(x)
        before = Buffer.capture() if overlap else None
        per_rank, _, per_expert, in_rank, event = buffer.get_dispatch_layout(
            topk_idx, experts, previous_event=before, **streams)
        recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_w,
            config=CONFIG, previous_event=event if overlap else None, **streams)
        return recv_x, recv_idx, recv_w, counts, handle, event

    def combine(y: torch.Tensor, handle: tuple) -> tuple:
        before = Buffer.capture() if overlap else None
        combined, _, event = buffer.combine(y, handle, config=CONFIG, previous_event=before,
                                            **streams)
        return combined, event

    with torch.no_grad():
        sent = [dispatch(xs[0])]
        outs, alive = [], []  # what the communication stream may still read
        for i in range(2):
            recv_x, recv_idx, recv_w, counts, handle, event = sent[i]
            if overlap:
                event.current_stream_wait()  # micro-batch i's rows are here
            if i == 0:
                sent.append(dispatch(xs[1]))  # travels while the experts below compute
            y = layer.experts(recv_x, recv_idx, recv_w, counts)
            alive.append(y)
            outs.append(combine(y, handle))
        for combined, event in outs:
            if overlap:
                event.current_stream_wait()
        return [combined for combined, _ in outs]
# ANCHOR_END: micro_batches


LL_TOKENS = 128  # T: tokens per rank and micro-batch in low-latency mode (DeepEP's decode shape)


def ll_experts(layer: MoeLayer, recv_x: torch.Tensor) -> torch.Tensor:
    """Low-latency layout: expert e's rows are recv_x[e], [num_ranks x T, hidden], the valid
    ones first; every row is computed (no host sync for the counts) as three batched GEMMs,
    and combine reads the valid ones."""
    ex = layer.experts
    h = F.silu(torch.bmm(recv_x, ex.gate)) * torch.bmm(recv_x, ex.up)
    return torch.bmm(h, ex.down)


# ANCHOR: decode
def decode_two_micro_batches(layer: MoeLayer, xs: List[torch.Tensor],
                             overlap: bool) -> List[torch.Tensor]:
    """Low-latency mode, as decoding uses it. With `overlap`, each call only sends, and its
    receive hook is called when the result is needed: micro-batch 1's tokens travel while the
    experts compute micro-batch 0, and micro-batch 0's results while they compute micro-batch
    1. One low-latency call may be in flight per buffer, and this order keeps to it: every
    hook is called before the next call is sent."""
    buffer, experts = layer.buffer, layer.shape.experts

    def send(x: torch.Tensor) -> tuple:
        topk_idx, topk_w = layer.route(x)
        recv, _, handle, _, hook = buffer.low_latency_dispatch(
            x, topk_idx, LL_TOKENS, experts, use_fp8=False, return_recv_hook=overlap)
        return recv, handle, hook, topk_idx, topk_w

    def combine(y: torch.Tensor, sent: tuple) -> tuple:
        out, _, hook = buffer.low_latency_combine(y, sent[3], sent[4], sent[1],
                                                  return_recv_hook=overlap)
        return out, hook

    with torch.no_grad():
        if not overlap:
            outs = []
            for x in xs:
                sent = send(x)
                outs.append(combine(ll_experts(layer, sent[0]), sent)[0])
            return outs
        d0 = send(xs[0])
        d0[2]()  # micro-batch 0's tokens are here
        d1 = send(xs[1])  # micro-batch 1's travel ...
        y0 = ll_experts(layer, d0[0])  # ... while the experts compute micro-batch 0
        d1[2]()
        c0 = combine(y0, d0)  # micro-batch 0's results travel ...
        y1 = ll_experts(layer, d1[0])  # ... while the experts compute micro-batch 1
        c0[1]()
        c1 = combine(y1, d1)
        c1[1]()
        return [c0[0], c1[0]]
# ANCHOR_END: decode


def check_decode(tally: Tally, buffer: Buffer) -> List[str]:
    """Low-latency mode's two micro-batches, serial and overlapped, against the one-GPU layer
    (outputs within 1e-2 of the reference's norm)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    layer = MoeLayer(SMALL, buffer, rank, ranks, 55)
    every = Experts(SMALL, 0, SMALL.experts, 55)
    g = torch.Generator(device="cuda").manual_seed(55 + rank)
    xs = [torch.randn(LL_TOKENS // 2, SMALL.hidden, generator=g, device="cuda")
          .to(torch.bfloat16) for _ in range(2)]
    with torch.no_grad():
        reference = [layer.reference(x, every, fp8=False) for x in xs]
    lines = []
    for overlap in (False, True):
        outs = decode_two_micro_batches(layer, xs, overlap)
        error = max(relative(o, r) for o, r in zip(outs, reference))
        how = "overlapped (receive hooks)" if overlap else "serial"
        tally.check(error <= 1e-2, f"low-latency, {how}: relative error {error:.2e} > 1e-2")
        lines.append(f"low-latency two micro-batches, {how}: relative error {error:.2e} "
                     "(limit 1e-2)")
    return lines


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


def check(tally: Tally, buffer: Buffer, fp8: bool) -> List[str]:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape, seed = SMALL, 1234
    layer = MoeLayer(shape, buffer, rank, ranks, seed)
    every = Experts(shape, 0, shape.experts, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 10 + rank)
    x = torch.randn(shape.tokens, shape.hidden, generator=g, device="cuda").to(torch.bfloat16)
    grad_out = torch.randn(shape.tokens, shape.hidden, generator=g, device="cuda")
    grad_out = grad_out.to(torch.bfloat16)
    x1 = x.clone().requires_grad_(True)
    y = layer(x1, fp8)
    y.backward(grad_out)
    x2 = x.clone().requires_grad_(True)
    layer_ref = MoeLayer(shape, None, rank, ranks, seed)  # the same router, from the seed
    y_ref = layer_ref.reference(x2, every, fp8)
    y_ref.backward(grad_out)
    what = "fp8" if fp8 else "bf16"
    results = {"output": relative(y, y_ref), "grad of x": relative(x1.grad, x2.grad),
               "grad of the router": relative(layer.router.grad, layer_ref.router.grad)}
    first, count = layer.experts.first, layer.experts.gate.shape[0]
    for name in ("gate", "up", "down"):
        summed = getattr(every, name).grad.float()
        summed = summed.cpu() if dist.get_backend() == "gloo" else summed
        dist.all_reduce(summed)  # every rank's tokens reach these experts
        mine = summed[first : first + count].to(getattr(layer.experts, name).grad.device)
        results[f"grad of {name}"] = relative(getattr(layer.experts, name).grad, mine)
    lines = []
    for name, error in results.items():
        limit = 1e-2 if name == "output" else 2e-2
        tally.check(error <= limit, f"{what}: {name}: relative error {error:.2e} > {limit}")
        lines.append(f"{what}: {name}: relative error {error:.2e} (limit {limit})")
    return lines


def check_grouped(tally: Tally) -> List[str]:
    """The grouped GEMMs against one GEMM chain per expert, outputs and weight gradients, on
    routing with other ranks' pairs (-1) and an expert that gets no row."""
    shape, rank = SMALL, dist.get_rank()
    experts = Experts(shape, 0, 8, 4321)
    g = torch.Generator(device="cuda").manual_seed(4321 + rank)
    x = torch.randn(200, shape.hidden, generator=g, device="cuda").to(torch.bfloat16)
    topk_idx = torch.randint(-1, 7, (200, shape.top_k), generator=g, device="cuda")  # no 7
    topk_w = torch.rand(200, shape.top_k, generator=g, device="cuda")
    counts = torch.bincount(topk_idx.view(-1) + 1, minlength=9)[1:].tolist()
    lines = []
    outs, grads = [], []
    for grouped in (True, False):
        experts.zero_grad()
        y = experts(x, topk_idx, topk_w, counts) if grouped else experts.forward_loop(
            x, topk_idx, topk_w)
        y.float().square().sum().backward()
        outs.append(y)
        grads.append([p.grad.clone() for p in (experts.gate, experts.up, experts.down)])
    errors = {"output": relative(outs[0], outs[1])}
    errors.update({f"grad of {n}": relative(a, b)
                   for n, a, b in zip(("gate", "up", "down"), grads[0], grads[1])})
    for name, error in errors.items():
        tally.check(error <= 1e-2, f"grouped GEMMs: {name}: relative error {error:.2e} > 1e-2")
        lines.append(f"grouped GEMMs against a loop: {name}: relative error {error:.2e} "
                     f"(limit 1e-2)")
    return lines


def check_micro_batches(tally: Tally, buffer: Buffer) -> List[str]:
    """Overlapped and serial two-micro-batch forwards give the same bits (the same kernels on
    the same data; only the streams differ)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    layer = MoeLayer(SMALL, buffer, rank, ranks, 77)
    g = torch.Generator(device="cuda").manual_seed(77 + rank)
    xs = [torch.randn(SMALL.tokens, SMALL.hidden, generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(2)]
    serial = two_micro_batches(layer, xs, overlap=False)
    overlapped = two_micro_batches(layer, xs, overlap=True)
    same = all(torch.equal(a, b) for a, b in zip(serial, overlapped))
    tally.check(same, "two micro-batches: overlapped and serial differ")
    return [f"two micro-batches, overlapped against serial: {'the same' if same else 'DIFFERENT'}"]


def timed_ms(fn: Any, repeats: int = 10) -> float:
    """Milliseconds per call on the current stream, after 3 warm-ups and a barrier."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start_event = torch.cuda.Event(enable_timing=True)
    end_event = torch.cuda.Event(enable_timing=True)
    start_event.record()
    for _ in range(repeats):
        fn()
    end_event.record()
    torch.cuda.synchronize()
    return start_event.elapsed_time(end_event) / repeats


# Rows of the --bench CSV (case, quantity, ms): each value the slowest rank's.
BENCH_ROWS: List[Tuple[str, str, float]] = []


def record(case: str, **ms: float) -> List[float]:
    """Keeps each quantity's slowest rank for the CSV and returns the values in that order."""
    values = torch.tensor(list(ms.values()), dtype=torch.float64, device="cuda")
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    BENCH_ROWS.extend((case, name, v) for name, v in zip(ms, values.tolist()))
    return values.tolist()


def overlap_line(what: str, serial: float, overlapped: float, compute: float) -> str:
    """Serial against overlapped beside the bound (comm + compute) / max(comm, compute) and the
    efficiency (serial - overlapped) / min(comm, compute); comm is serial minus the experts."""
    serial, overlapped, compute = record(what, serial_ms=serial, overlapped_ms=overlapped,
                                         compute_ms=compute)
    comm = serial - compute
    head = (f"{what}, DeepSeek-V3 shapes: serial {serial:.2f} ms, overlapped {overlapped:.2f} ms "
            f"({serial / overlapped:.2f}x")
    if comm <= 0.01 * serial:  # the exchanges hide in the noise of the experts' own time
        return f"{head}; experts alone {compute:.2f} ms, no communication left to hide)"
    bound = (comm + compute) / max(comm, compute)
    efficiency = (serial - overlapped) / min(comm, compute)
    return f"{head}; bound {bound:.2f}x, efficiency {efficiency:.0%}; experts alone {compute:.2f} ms)"


def bench_micro_batches(buffer: Buffer) -> List[str]:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 98)
    half = shape.tokens // 2
    xs = [torch.randn(half, shape.hidden, device="cuda").to(torch.bfloat16) for _ in range(2)]
    serial = timed_ms(lambda: two_micro_batches(layer, xs, overlap=False))
    overlapped = timed_ms(lambda: two_micro_batches(layer, xs, overlap=True))
    # The parts alone: the experts on what arrived, and the exchanges with identity experts.
    recv = [layer.buffer.dispatch(x, handle=None, **_layout(layer, x)) for x in xs]
    compute = timed_ms(lambda: [layer.experts(r[0], r[1], r[2], r[3]) for r in recv])
    return [overlap_line(f"two micro-batches of {half} tokens, forward", serial, overlapped,
                         compute)]


def bench_decode(buffer: Buffer) -> List[str]:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 97)
    xs = [torch.randn(LL_TOKENS, shape.hidden, device="cuda").to(torch.bfloat16)
          for _ in range(2)]
    serial = timed_ms(lambda: decode_two_micro_batches(layer, xs, overlap=False))
    overlapped = timed_ms(lambda: decode_two_micro_batches(layer, xs, overlap=True))
    rows = torch.randn(shape.experts // ranks, ranks * LL_TOKENS, shape.hidden, device="cuda")
    rows = rows.to(torch.bfloat16)
    compute = timed_ms(lambda: [ll_experts(layer, rows) for _ in xs])
    return [overlap_line(f"low-latency, two micro-batches of {LL_TOKENS} tokens", serial,
                         overlapped, compute)]


def _layout(layer: MoeLayer, x: torch.Tensor) -> dict:
    """Keyword arguments of a plain dispatch of `x` as the layer routes it."""
    topk_idx, topk_w = layer.route(x)
    per_rank, _, per_expert, in_rank, _ = layer.buffer.get_dispatch_layout(topk_idx,
                                                                           layer.shape.experts)
    return dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_w,
                config=CONFIG)


def bench(buffer: Buffer, fp8: bool) -> List[str]:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 99)
    x = torch.randn(shape.tokens, shape.hidden, device="cuda").to(torch.bfloat16)
    x.requires_grad_(True)
    grad = torch.randn_like(x)
    layer_ms = timed_ms(lambda: layer(x, fp8).backward(grad))
    # Communication alone: dispatch and combine of the same routing, forward and backward.
    topk_idx, topk_w = layer.route(x.detach())
    route = Route(buffer)

    def exchange() -> None:  # the layer's four exchanges, forward and backward
        recv, _, recv_w = Dispatch.apply(x.detach(), topk_idx, topk_w, route, shape.experts, fp8)
        Combine.apply(recv, route)
        buffer.dispatch(x.detach(), handle=route.handle, config=CONFIG)
        buffer.combine(recv, route.handle, topk_weights=recv_w, config=CONFIG)

    comm_ms = timed_ms(exchange)
    what = "fp8" if fp8 else "bf16"
    layer_ms, comm_ms = record(f"{what} layer", layer_ms=layer_ms, comm_ms=comm_ms)
    return [f"{what} dispatch, DeepSeek-V3 shapes ({shape.tokens} tokens x {shape.hidden}, "
            f"{shape.experts} experts, top-{shape.top_k}, FFN {shape.ffn}): forward + backward "
            f"{layer_ms:.2f} ms per layer, of which dispatch + combine (both directions) "
            f"{comm_ms:.2f} ms ({100 * comm_ms / layer_ms:.0f}%)"]


def timeline(buffer: Buffer, prefix: str, tally: Tally) -> List[str]:
    """--timeline: two micro-batches, serial and overlapped, under torch.profiler (every rank),
    drawn on rank 0. A figure that cannot be drawn is a failed check, with its reason."""
    pt, tt = timeline_modules()
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 98)
    half = shape.tokens // 2
    xs = [torch.randn(half, shape.hidden, device="cuda").to(torch.bfloat16) for _ in range(2)]
    device = torch.cuda.get_device_name()
    gpu = device.removeprefix("NVIDIA ")  # for the titles
    traces = {}
    for name, overlap in (("serial", False), ("overlapped", True)):
        how = "overlapped on the buffer's stream" if overlap else "serial"
        title = (f"MoE layer forward, two micro-batches of {half} tokens, {how} "
                 f"({ranks}x {gpu}, rank 0)")
        traces[name] = (title, f"{prefix}_{name}.json")
        pt.record_steps(lambda overlap=overlap: two_micro_batches(layer, xs, overlap),
                        traces[name][1] if rank == 0 else None, steps=1, warmup=3,
                        barrier=dist.barrier)
    if rank != 0:
        return []
    header = [f"gpu: {device} x {ranks}; torch {torch.__version__}",
              "date: " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "timing: torch.profiler (CUPTI) on rank 0, one call after 3 warm-ups and a barrier; "
              f"DeepSeek-V3 shapes ({half} tokens per micro-batch x {shape.hidden}, "
              f"{shape.experts} experts, top-{shape.top_k}, FFN {shape.ffn}), bf16"]
    # The buffer's kernels are the communication; the experts' grouped GEMMs the compute;
    # routing, SiLU, gathers and copies to the host stay "other".
    classes = (("compute", tt.COMPUTE), ("communication", tt.COMMUNICATION))
    return draw_timelines(traces, prefix, classes, header, tally)


def run() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", nargs="?", const="moe_layer.csv", default=None,
                        metavar="CSV", help="also time DeepSeek-V3 shapes; rows to CSV "
                        "(default moe_layer.csv)")
    parser.add_argument("--timeline", metavar="PREFIX", help="profile two micro-batches at "
                        "DeepSeek-V3 shapes, serial and overlapped; rank 0 writes "
                        "PREFIX_<case>.json, .svg and .csv")
    args = parser.parse_args()
    start()
    tally = Tally()
    group = dist.group.WORLD
    shape = DEEPSEEK_V3 if args.bench or args.timeline else SMALL
    # Both modes in one buffer: the normal mode's rings and the low-latency region.
    buffer = Buffer(group,
                    num_nvl_bytes=CONFIG.get_nvl_buffer_size_hint(shape.hidden * 2, group.size()),
                    num_rdma_bytes=Buffer.get_low_latency_rdma_size_hint(
                        LL_TOKENS, shape.hidden, group.size(), shape.experts),
                    low_latency_mode=True, num_qps_per_rank=shape.experts // group.size())
    started = time.perf_counter()
    print_by_pe(check_grouped(tally))
    for fp8 in (False, True):
        print_by_pe(check(tally, buffer, fp8))
    print_by_pe(check_micro_batches(tally, buffer))
    print_by_pe(check_decode(tally, buffer))
    print_by_pe(f"checks took {time.perf_counter() - started:.1f} s")
    if args.bench:
        for fp8 in (False, True):
            print_by_pe(bench(buffer, fp8))
        print_by_pe(bench_micro_batches(buffer))
        print_by_pe(bench_decode(buffer))
        if dist.get_rank() == 0:
            with open(args.bench, "w", newline="") as f:
                date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                f.write(f"# gpu: {torch.cuda.get_device_name()} x {dist.get_world_size()}; "
                        f"torch {torch.__version__}\n# date: {date}\n# timing: 3 warm-ups, a "
                        "barrier, 10 calls between CUDA events; each value the slowest rank's\n")
                out = csv.writer(f)
                out.writerow(["case", "quantity", "ms"])
                out.writerows((c, q, f"{v:.4f}") for c, q, v in BENCH_ROWS)
    if args.timeline:
        print_by_pe(timeline(buffer, args.timeline, tally))
    del buffer
    return tally.finish()


if __name__ == "__main__":
    main("moe_layer.py", run)
