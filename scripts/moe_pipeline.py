"""Two micro-batches pipelined through a stack of layers, and the in-turn timing of every
schedule (scripts/moe_layer.py --overlap-rounds): the exchanges of one micro-batch beside the
experts of the other, the GEMMs leaving SMs to them (torch's SM carveout)."""

from __future__ import annotations

import contextlib
import statistics
from typing import Any, Callable, Dict, Iterator, List, Sequence

import torch
import torch.distributed as dist

from ch00_common import Tally
from moe_model import (CONFIG, DEEPSEEK_V3, LEAN_CONFIG, MoeLayer, SMALL, exchange_config, relative,
                       two_micro_batches)
from moe_timing import BENCH_ROWS, overlap_line, record, slowest, timed_ms
from nvshmem_tutorial.buffer import Buffer, Config


def dispatch_kwargs(layer: MoeLayer, x: torch.Tensor) -> dict:
    """Keyword arguments of a plain dispatch of `x` as the layer routes it."""
    topk_idx, topk_w = layer.route(x)
    per_rank, _, per_expert, in_rank, _ = layer.buffer.get_dispatch_layout(topk_idx,
                                                                           layer.shape.experts)
    return dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_w,
                config=CONFIG)


# ---- two micro-batches through several layers, and the schedules timed in turn ---------------
# (--overlap-rounds R; benchmarks/notes/overlap.md, "Session of 2026-11-27 07:00 UTC", has the
# predictions each case was run against.)

TINY_CONFIG = exchange_config(4)  # two channels: the exchanges beside GEMMs that leave 4 SMs


# ANCHOR: carveout
@contextlib.contextmanager
def gemm_carveout(sms: int) -> Iterator[None]:
    """GEMMs enqueued inside leave `sms` SMs to other streams (0: every SM, as without it).
    torch._C._set_sm_carveout_experimental is read when a GEMM is launched: the grouped GEMM
    (CUTLASS, persistent) gets a grid of that many fewer CTAs, cuBLASLt an SM-count target."""
    if sms == 0:
        yield
        return
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(sms)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(previous)
# ANCHOR_END: carveout


def serial_layers(layer: MoeLayer, xs: List[torch.Tensor], layers: int) -> List[torch.Tensor]:
    """Two micro-batches through `layers` MoE layers in a row (the same layer each time, with
    the residual: x + layer(x)), every exchange on the compute stream: `pipelined`'s baseline."""
    with torch.no_grad():
        for _ in range(layers):
            ys = two_micro_batches(layer, xs, overlap=False)
            xs = [x + y for x, y in zip(xs, ys)]
    return xs


def pipelined(layer: MoeLayer, xs: List[torch.Tensor], layers: int, hidden: Config = CONFIG,
              ends: Config = CONFIG, carve: int = 0, residual: bool = True) -> List[torch.Tensor]:
    """`serial_layers` overlapped across the layers, as DeepEP's README draws two micro-batches:
    while the experts compute micro-batch i, the other micro-batch's combine, its residual, its
    next layer's routing and its next dispatch run on the buffer's stream. Over L layers only
    micro-batch 0's first dispatch and micro-batch 1's last combine have nothing beside them
    (2 of the 4L exchanges). With L = 1 and residual=False this is
    `two_micro_batches(overlap=True)` (the last layer's residual is the only difference).

    A combine must run on its dispatch's channels, so a configuration belongs to a (micro-batch,
    layer) pair: `ends` for the two pairs with an exchange at an end, `hidden` for the others
    (at L = 1 both pairs are end pairs). The experts' GEMMs leave `carve` SMs free for the
    exchanges beside them. Routing and residuals of the layers after the first run on the
    buffer's stream too: on the compute stream they would wait for the experts they run beside.
    """
    buffer, experts = layer.buffer, layer.shape.experts
    comm = buffer.get_comm_stream()
    streams = dict(async_finish=True, allocate_on_comm_stream=True)
    keep: List[Any] = []  # what one stream hands the other, alive until the call ends

    def route(x: torch.Tensor, on_comm: bool) -> tuple:
        """Top-k on the buffer's stream (or the compute stream), and an event after it."""
        with torch.cuda.stream(comm) if on_comm else contextlib.nullcontext():
            topk_idx, topk_w = layer.route(x)
            before = Buffer.capture()
        keep.extend((x, topk_idx, topk_w))
        return x, topk_idx, topk_w, before

    def dispatch(routed: tuple, i: int, layer_idx: int) -> tuple:
        x, topk_idx, topk_w, before = routed
        end = (i, layer_idx) in ((0, 0), (1, layers - 1))
        config = ends if end else hidden
        per_rank, _, per_expert, in_rank, event = buffer.get_dispatch_layout(
            topk_idx, experts, previous_event=before, **streams)
        recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_w,
            config=config, previous_event=event, **streams)
        return recv_x, recv_idx, recv_w, counts, handle, event, config

    with torch.no_grad():
        xs = list(xs)
        sent: List[Any] = [dispatch(route(xs[0], False), 0, 0), None]
        first_route = route(xs[1], False)  # before the experts: its dispatch need not wait
        done: List[Any] = [None, None]  # per micro-batch: (experts' rows, handle, config, event)
        last: List[Any] = [None, None]  # per micro-batch: (last layer's combine, its event)

        def combine(j: int) -> tuple:
            y, handle, config, after = done[j]
            combined, _, event = buffer.combine(y, handle, config=config, previous_event=after,
                                                **streams)
            keep.append(combined)
            return combined, event

        for step in range(2 * layers):
            i, j = step % 2, 1 - step % 2
            recv_x, recv_idx, recv_w, counts, handle, event, config = sent[i]
            event.current_stream_wait()  # micro-batch i's rows are here
            with gemm_carveout(carve):
                y = layer.experts(recv_x, recv_idx, recv_w, counts)
            done[i] = (y, handle, config, Buffer.capture())
            keep.append(y)
            # Beside these experts, micro-batch j: its combine, residual, routing and dispatch.
            if step == 0:
                sent[1] = dispatch(first_route, 1, 0)
                continue
            j_layer = (step - 1) // 2  # the layer micro-batch j's experts computed last step
            combined, event = combine(j)
            if j_layer + 1 == layers:
                last[j] = (combined, event)
                continue
            with torch.cuda.stream(comm):  # after the combine, in the buffer stream's order
                xs[j] = xs[j] + combined
            sent[j] = dispatch(route(xs[j], True), j, j_layer + 1)
        last[1] = combine(1)  # nothing left to run beside it
        outs = []
        for x, (combined, event) in zip(xs, last):
            event.current_stream_wait()
            outs.append(x + combined if residual else combined)
        return outs


def check_pipeline(tally: Tally, buffer: Buffer) -> List[str]:
    """`pipelined` gives the bits of its serial schedule in every configuration the bench
    times: over 3 layers against `serial_layers`, over 1 layer (no residual) against
    `two_micro_batches` serial (the same kernels on the same data; the streams, the channels
    and the GEMMs' grid differ)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    layer = MoeLayer(SMALL, buffer, rank, ranks, 88)
    g = torch.Generator(device="cuda").manual_seed(88 + rank)
    xs = [torch.randn(SMALL.tokens, SMALL.hidden, generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(2)]
    three = serial_layers(layer, xs, 3)
    one = two_micro_batches(layer, xs, overlap=False)
    lean, tiny, wide = LEAN_CONFIG.num_sms, TINY_CONFIG.num_sms, CONFIG.num_sms
    cases = [
        (3, dict(), three),
        (3, dict(hidden=LEAN_CONFIG, carve=lean), three),
        (3, dict(hidden=TINY_CONFIG, carve=tiny), three),
        (1, dict(carve=wide, residual=False), one),
        (1, dict(hidden=LEAN_CONFIG, ends=LEAN_CONFIG, carve=lean, residual=False), one),
    ]
    lines = []
    for layers, kwargs, reference in cases:
        outs = pipelined(layer, xs, layers, **kwargs)
        error = max(relative(o, r) for o, r in zip(outs, reference))
        same = all(torch.equal(o, r) for o, r in zip(outs, reference))
        how = (f"{layers} layer(s), hidden exchanges on "
               f"{kwargs.get('hidden', CONFIG).num_sms} SMs, ends on "
               f"{kwargs.get('ends', CONFIG).num_sms}, GEMMs leave {kwargs.get('carve', 0)}")
        tally.check(same, f"pipelined ({how}) and serial differ: relative error {error:.2e}")
        lines.append(f"two micro-batches pipelined ({how}) against serial: "
                     + ("the same" if same else f"DIFFERENT (relative error {error:.2e})"))
    return lines


def in_turn(schedules: Dict[str, Callable[[], Any]], rounds: int,
            repeats: int) -> Dict[str, List[float]]:
    """Every schedule timed once per round (timed_ms: 3 warm-ups, a barrier, `repeats` calls),
    the rounds starting one schedule later each time, so that a GPU clocking down under
    sustained GEMMs slows every schedule alike. Milliseconds per round, this rank's."""
    names = list(schedules)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(timed_ms(schedules[name], repeats))
    return times


def turn_lines(case: str, times: Dict[str, List[float]], key: str,
               carved: str = "") -> List[str]:
    """overlap_line for the schedule `key` against the round medians of "serial" and "compute"
    (the experts alone); with `carved`, the experts alone under the same carveout too (the CSV's
    compute_carveout_ms: what the carveout costs the experts; overlapped minus it is what the
    schedule failed to hide)."""
    med = {name: statistics.median(ms) for name, ms in times.items()}
    ratios = [o / s for o, s in zip(times[key], times["serial"])]
    lines = [overlap_line(case, med["serial"], med[key], med["compute"])]
    extra = f"overlapped / serial per round {min(ratios):.3f}-{max(ratios):.3f} (this rank)"
    if carved:
        overlapped, compute_c = slowest([med[key], med[carved]])
        BENCH_ROWS.append((case, "compute_carveout_ms", compute_c))
        extra += (f"; experts alone with the same carveout {compute_c:.2f} ms, overlapped minus "
                  f"that {overlapped - compute_c:.2f} ms")
    return lines + [f"  {extra}"]


def bench_in_turn(buffer: Buffer, rounds: int, hidden_sms: Sequence[int] = (8, 4)) -> List[str]:
    """The forward of two micro-batches at DeepSeek-V3 shapes, one layer and four, every
    schedule timed in turn over `rounds` rounds; the CSV gets the medians (slowest rank's).
    Four layers run once per count in `hidden_sms`: the hidden exchanges on that many SMs, the
    GEMMs leaving them (LEAN_CONFIG's 8 and TINY_CONFIG's 4 by default)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 98)
    half = shape.tokens // 2
    xs = [torch.randn(half, shape.hidden, device="cuda").to(torch.bfloat16) for _ in range(2)]
    recv = [layer.buffer.dispatch(x, handle=None, **dispatch_kwargs(layer, x)) for x in xs]

    def experts_alone(carve: int, layers: int = 1) -> Callable[[], Any]:
        def run() -> None:
            with gemm_carveout(carve):
                for _ in range(layers):
                    for r in recv:
                        layer.experts(r[0], r[1], r[2], r[3])
        return run

    lean, tiny = LEAN_CONFIG.num_sms, TINY_CONFIG.num_sms
    wide = CONFIG.num_sms
    one = {
        "serial": lambda: two_micro_batches(layer, xs, overlap=False),
        "overlapped": lambda: two_micro_batches(layer, xs, overlap=True),
        "carve_wide": lambda: pipelined(layer, xs, 1, carve=wide, residual=False),
        "lean_carve": lambda: pipelined(layer, xs, 1, LEAN_CONFIG, LEAN_CONFIG, lean,
                                        residual=False),
        "compute": experts_alone(0),
        "compute_wide": experts_alone(wide),
        "compute_lean": experts_alone(lean),
        "compute_tiny": experts_alone(tiny),
    }
    t1 = in_turn(one, rounds, repeats=10)
    what = f"two micro-batches of {half} tokens, forward, in turn"
    lines = turn_lines(what, t1, "overlapped")
    lines += turn_lines(f"{what}, GEMMs leave {wide} SMs", t1, "carve_wide", "compute_wide")
    lines += turn_lines(f"{what}, all exchanges on {lean} SMs, GEMMs leave {lean}", t1,
                        "lean_carve", "compute_lean")
    compute_tiny = record(f"{what}, experts alone, GEMMs leave {tiny} SMs",
                          compute_carveout_ms=statistics.median(t1["compute_tiny"]))[0]
    lines.append(f"  experts alone with GEMMs leaving {tiny} SMs: {compute_tiny:.2f} ms")
    layers = 4

    four = {
        "serial": lambda: serial_layers(layer, xs, layers),
        "overlapped": lambda: pipelined(layer, xs, layers),
        "compute": experts_alone(0, layers),
    }
    for sms in hidden_sms:
        four[f"carve_{sms}"] = (lambda c=exchange_config(sms), sms=sms: pipelined(layer, xs, layers, c, CONFIG, sms))
        four[f"compute_{sms}"] = experts_alone(sms, layers)
    t4 = in_turn(four, rounds, repeats=5)
    what = f"{layers} layers x two micro-batches of {half} tokens, forward, pipelined, in turn"
    lines += turn_lines(what, t4, "overlapped")
    for sms in hidden_sms:
        lines += turn_lines(f"{what}, hidden exchanges on {sms} SMs, GEMMs leave {sms}", t4,
                            f"carve_{sms}", f"compute_{sms}")
    return lines
