"""The MoE layer of scripts/moe_layer.py (the torchrun script that checks and times it): a
router (softmax over the experts, top-k, the k weights renormalised), the tokens sent to the
ranks of their experts (`get_dispatch_layout`, `dispatch`, in bf16 or fp8), each rank's experts
(gate / up / down with SiLU) on the rows it received, weighted by the router, and the results
sent back and summed (`combine`). Dispatch and combine are `torch.autograd.Function`s whose
backward passes are each other, as DeepEP documents: the gradient of dispatch is a combine of
the received rows' gradients (with the top-k weights' gradients summed back the same way), and
the gradient of combine is a dispatch of the output's gradient with the forward's handle.

The experts are three grouped GEMMs over the (row, expert) pairs sorted by expert on the GPU
(`torch._grouped_mm`; one GEMM per expert where torch lacks it); only the pairs' total comes
from the host, so nothing waits for the GPU. In low-latency mode the rows arrive grouped by
expert and the experts are three batched GEMMs.

Two schedules of two micro-batches, serial or overlapped: normal mode on the buffer's
communication stream with events (`two_micro_batches`), low-latency mode with receive hooks
(`decode_two_micro_batches`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.nn.functional as F

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


def exchange_config(num_sms: int) -> Config:
    """The exchanges' config on `num_sms` SMs: NVL chunk 8, NVL ring 256 tokens (DeepEP's
    defaults at EP2-8)."""
    return Config(num_sms, 8, 256)


CONFIG = exchange_config(24)
# The exchanges beside compute (two micro-batches): a third of the SMs, the rest to the GEMMs.
LEAN_CONFIG = exchange_config(8)
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
def two_micro_batches(layer: MoeLayer, xs: List[torch.Tensor], overlap: bool,
                      config: Config = CONFIG) -> List[torch.Tensor]:
    """The layer's forward on two micro-batches. Overlapped, every dispatch and combine runs on
    the buffer's communication stream (`async_finish`, `allocate_on_comm_stream`), each after an
    event of the compute stream, and the compute stream waits only where it reads the result:
    micro-batch 1's dispatch travels while the experts compute micro-batch 0, and micro-batch
    0's combine while they compute micro-batch 1. Serial, the same calls on the compute stream.
    `config` sets the SMs the exchanges take from the experts' GEMMs while both run.

    The order the host enqueues them in matters as much as the streams: a normal-mode dispatch
    waits on the host for its receive counts, so micro-batch 0's experts are enqueued before
    micro-batch 1's dispatch, and the GPU computes while the host waits.
    """
    buffer, experts = layer.buffer, layer.shape.experts
    streams = dict(async_finish=overlap, allocate_on_comm_stream=overlap)

    def route(x: torch.Tensor) -> tuple:
        """Top-k on the compute stream, and an event after it for the dispatch to start from."""
        topk_idx, topk_w = layer.route(x)
        return x, topk_idx, topk_w, Buffer.capture() if overlap else None

    def dispatch(routed: tuple) -> tuple:
        x, topk_idx, topk_w, before = routed
        per_rank, _, per_expert, in_rank, event = buffer.get_dispatch_layout(
            topk_idx, experts, previous_event=before, **streams)
        recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_w,
            config=config, previous_event=event if overlap else None, **streams)
        return recv_x, recv_idx, recv_w, counts, handle, event

    def combine(y: torch.Tensor, handle: tuple) -> tuple:
        before = Buffer.capture() if overlap else None
        combined, _, event = buffer.combine(y, handle, config=config, previous_event=before,
                                            **streams)
        return combined, event

    with torch.no_grad():
        sent = [dispatch(route(xs[0]))]
        routed = route(xs[1])  # before the experts: its dispatch need not wait for them
        outs, alive = [], []  # what the communication stream may still read
        for i in range(2):
            recv_x, recv_idx, recv_w, counts, handle, event = sent[i]
            if overlap:
                event.current_stream_wait()  # micro-batch i's rows are here
            y = layer.experts(recv_x, recv_idx, recv_w, counts)
            alive.append(y)
            if i == 0:
                sent.append(dispatch(routed))  # travels while the experts above compute
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


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The relative error of `a` against the reference `b`: the norm of their difference over
    b's norm (the checks' one comparator)."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))
