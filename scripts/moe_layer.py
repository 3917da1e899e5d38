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
import csv
import time
from typing import Any, List

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
    relative,
    Route,
    SMALL,
    two_micro_batches,
)
from moe_pipeline import bench_in_turn, check_pipeline, dispatch_kwargs, pipelined, serial_layers
from moe_timing import BENCH_ROWS, overlap_line, record, timed_ms
from nvshmem_tutorial.buffer import Buffer


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
    recv = [layer.buffer.dispatch(x, handle=None, **dispatch_kwargs(layer, x)) for x in xs]
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
    parser.add_argument("--hidden-sms", type=int, nargs="+", default=[8, 4], metavar="S",
                        help="with --overlap-rounds: the SM counts of the four-layer schedule's "
                        "hidden exchanges, the GEMMs leaving as many (default 8 4)")
    parser.add_argument("--timeline", metavar="PREFIX", help="profile two micro-batches at "
                        "DeepSeek-V3 shapes, serial and overlapped; rank 0 writes "
                        "PREFIX_<case>.json, .svg and .csv")
    parser.add_argument("--pipeline-timeline", metavar="PREFIX", help="the same for two "
                        "micro-batches through 2 layers, serial and pipelined (hidden exchanges "
                        "on 8 SMs, GEMMs leaving them)")
    args = parser.parse_args()
    if args.overlap_rounds and not args.bench:
        parser.error("--overlap-rounds needs --bench")
    if any(s < 2 or s % 2 for s in args.hidden_sms):
        parser.error(f"--hidden-sms {args.hidden_sms}: each count is an even number of SMs, 2 or more "
                     "(a channel is two blocks, a sender and a receiver)")
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
            print_by_pe(bench_in_turn(buffer, args.overlap_rounds, args.hidden_sms))
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
