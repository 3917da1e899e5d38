"""A complete MoE layer over the buffer, forward and backward, checked against the same layer
computed without communication.

    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py            # small, checked
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --bench    # DeepSeek-V3 shapes
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --bench CSV --overlap-rounds 5
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --timeline PREFIX
    torchrun --standalone --nproc_per_node=N scripts/moe_layer.py --pipeline-timeline PREFIX

The layer is scripts/moe_model.py's `MoeLayer`.

The checks: the grouped GEMMs against one GEMM chain per expert; then every rank also
computes its own tokens' outputs with every expert's weights on its own GPU (the weights come
from a seed, so every rank can make every expert), then the
gradients of the input, of the router and of the experts (the reference's expert gradients are
summed over the ranks first). Tolerances, relative to the reference's norm: outputs 1e-2,
gradients 2e-2 (bf16 rows, summed in a different order; fp8 dispatch quantises the
reference's input the same way). Then, with --bench, the time per layer (forward + backward)
and the share spent in dispatch and combine, and two micro-batches serial against overlapped
in both modes, each timed with CUDA events (every value the slowest rank's).

--overlap-rounds R (with --bench) checks `pipelined` (two micro-batches overlapped across
several layers; its GEMMs may leave SMs to the exchanges) against its serial schedule, bit for
bit, then times every two-micro-batch schedule, one layer and four, in turn over R rounds: the
CSV's cases "..., in turn" hold the medians.

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
import contextlib
import csv
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist

from ch00_common import draw_timelines, main, print_by_pe, start, Tally, timeline_modules
from moe_model import (
    Combine,
    CONFIG,
    decode_two_micro_batches,
    DEEPSEEK_V3,
    Dispatch,
    Experts,
    LEAN_CONFIG,
    ll_experts,
    LL_TOKENS,
    MoeLayer,
    Route,
    SMALL,
    two_micro_batches,
)
from nvshmem_tutorial.buffer import Buffer, Config


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


def slowest(values: List[float]) -> List[float]:
    """Collective: each value's largest over the ranks."""
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def record(case: str, **ms: float) -> List[float]:
    """Keeps each quantity's slowest rank for the CSV and returns the values in that order."""
    values = slowest(list(ms.values()))
    BENCH_ROWS.extend((case, name, v) for name, v in zip(ms, values))
    return values


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
    # The same with the exchanges on fewer SMs, the rest left to the experts' GEMMs.
    lean = timed_ms(lambda: two_micro_batches(layer, xs, overlap=True, config=LEAN_CONFIG))
    # The parts alone: the experts on what arrived, and the exchanges with identity experts.
    recv = [layer.buffer.dispatch(x, handle=None, **_layout(layer, x)) for x in xs]
    compute = timed_ms(lambda: [layer.experts(r[0], r[1], r[2], r[3]) for r in recv])
    what = f"two micro-batches of {half} tokens, forward"
    return [overlap_line(what, serial, overlapped, compute),
            overlap_line(f"{what}, exchanges on {LEAN_CONFIG.num_sms} SMs", serial, lean, compute)]


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


# ---- two micro-batches through several layers, and the schedules timed in turn ---------------
# (--overlap-rounds R; benchmarks/notes/overlap.md, "Session of 2026-11-27 07:00 UTC", has the
# predictions each case was run against.)

TINY_CONFIG = Config(4, 8, 256)  # two channels: the exchanges beside GEMMs that leave 4 SMs


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


def bench_in_turn(buffer: Buffer, rounds: int) -> List[str]:
    """The forward of two micro-batches at DeepSeek-V3 shapes, one layer and four, every
    schedule timed in turn over `rounds` rounds; the CSV gets the medians (slowest rank's)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 98)
    half = shape.tokens // 2
    xs = [torch.randn(half, shape.hidden, device="cuda").to(torch.bfloat16) for _ in range(2)]
    recv = [layer.buffer.dispatch(x, handle=None, **_layout(layer, x)) for x in xs]

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
        "lean_carve": lambda: pipelined(layer, xs, layers, LEAN_CONFIG, CONFIG, lean),
        "tiny_carve": lambda: pipelined(layer, xs, layers, TINY_CONFIG, CONFIG, tiny),
        "compute": experts_alone(0, layers),
        "compute_lean": experts_alone(lean, layers),
        "compute_tiny": experts_alone(tiny, layers),
    }
    t4 = in_turn(four, rounds, repeats=5)
    what = f"{layers} layers x two micro-batches of {half} tokens, forward, pipelined, in turn"
    lines += turn_lines(what, t4, "overlapped")
    lines += turn_lines(f"{what}, hidden exchanges on {lean} SMs, GEMMs leave {lean}", t4,
                        "lean_carve", "compute_lean")
    lines += turn_lines(f"{what}, hidden exchanges on {tiny} SMs, GEMMs leave {tiny}", t4,
                        "tiny_carve", "compute_tiny")
    return lines


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


def timeline(buffer: Buffer, prefix: str, tally: Tally, pipeline: bool = False) -> List[str]:
    """--timeline: two micro-batches, serial and overlapped, under torch.profiler (every rank),
    drawn on rank 0. A figure that cannot be drawn is a failed check, with its reason.
    --pipeline-timeline (`pipeline`): the same for 2 layers, `serial_layers` against
    `pipelined` with the hidden exchanges on LEAN_CONFIG's SMs and the GEMMs leaving them."""
    pt, tt = timeline_modules()
    rank, ranks = dist.get_rank(), dist.get_world_size()
    shape = DEEPSEEK_V3
    layer = MoeLayer(shape, buffer, rank, ranks, 98)
    half = shape.tokens // 2
    xs = [torch.randn(half, shape.hidden, device="cuda").to(torch.bfloat16) for _ in range(2)]
    device = torch.cuda.get_device_name()
    gpu = device.removeprefix("NVIDIA ")  # for the titles
    traces = {}
    lean = LEAN_CONFIG.num_sms
    for name, overlap in (("serial", False), ("overlapped", True)):
        how = "overlapped on the buffer's stream" if overlap else "serial"
        what = f"two micro-batches of {half} tokens"
        if pipeline:
            how = (f"pipelined, hidden exchanges on {lean} SMs, GEMMs leave {lean}" if overlap
                   else "serial")
            what = f"2 layers x {what}"

        def step(overlap: bool = overlap) -> Any:
            if not pipeline:
                return two_micro_batches(layer, xs, overlap)
            if overlap:
                return pipelined(layer, xs, 2, LEAN_CONFIG, CONFIG, lean)
            return serial_layers(layer, xs, 2)

        title = f"MoE layer forward, {what}, {how} ({ranks}x {gpu}, rank 0)"
        traces[name] = (title, f"{prefix}_{name}.json")
        pt.record_steps(step, traces[name][1] if rank == 0 else None, steps=1, warmup=3,
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


def write_csv(path: str, rounds: int) -> None:
    """Rank 0 writes every row recorded so far (rewritten as more are recorded)."""
    if dist.get_rank() != 0:
        return
    with open(path, "w", newline="") as f:
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        f.write(f"# gpu: {torch.cuda.get_device_name()} x {dist.get_world_size()}; "
                f"torch {torch.__version__}\n# date: {date}\n# timing: 3 warm-ups, a "
                "barrier, 10 calls between CUDA events; each value the slowest rank's\n")
        if rounds:
            f.write(f"# cases '..., in turn': each schedule timed once per round as above (5 "
                    f"calls for 4 layers), {rounds} rounds in turn; each value the slowest "
                    "rank's median\n")
        out = csv.writer(f)
        out.writerow(["case", "quantity", "ms"])
        out.writerows((c, q, f"{v:.4f}") for c, q, v in BENCH_ROWS)


def run() -> bool:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", nargs="?", const="moe_layer.csv", default=None,
                        metavar="CSV", help="also time DeepSeek-V3 shapes; rows to CSV "
                        "(default moe_layer.csv)")
    parser.add_argument("--overlap-rounds", type=int, default=0, metavar="R",
                        help="with --bench: also check the pipelined schedules, then time every "
                        "two-micro-batch schedule (one layer and four) in turn over R rounds")
    parser.add_argument("--timeline", metavar="PREFIX", help="profile two micro-batches at "
                        "DeepSeek-V3 shapes, serial and overlapped; rank 0 writes "
                        "PREFIX_<case>.json, .svg and .csv")
    parser.add_argument("--pipeline-timeline", metavar="PREFIX", help="the same for two "
                        "micro-batches through 2 layers, serial and pipelined (hidden exchanges "
                        "on 8 SMs, GEMMs leaving them)")
    args = parser.parse_args()
    if args.overlap_rounds and not args.bench:
        parser.error("--overlap-rounds needs --bench")
    start()
    tally = Tally()
    group = dist.group.WORLD
    shape = DEEPSEEK_V3 if args.bench or args.timeline or args.pipeline_timeline else SMALL
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
        write_csv(args.bench, 0)
        if args.overlap_rounds:
            print_by_pe(check_pipeline(tally, buffer))
            started = time.perf_counter()
            print_by_pe(bench_in_turn(buffer, args.overlap_rounds))
            print_by_pe(f"{args.overlap_rounds} rounds in turn took "
                        f"{time.perf_counter() - started:.1f} s")
            write_csv(args.bench, args.overlap_rounds)
    if args.timeline:
        print_by_pe(timeline(buffer, args.timeline, tally))
    if args.pipeline_timeline:
        print_by_pe(timeline(buffer, args.pipeline_timeline, tally, pipeline=True))
    del buffer
    return tally.finish()


if __name__ == "__main__":
    main("moe_layer.py", run)
