"""Low-latency dispatch/combine benchmark (chapter 8), for whichever `deep_ep` is first on
PYTHONPATH: DeepEP itself, or nvshmem_tutorial through benchmarks/deepep_shim. The same data
and timing for both:

- data as DeepEP's tests/test_low_latency.py: 128 tokens x 7168 per rank (randn x 0.1), top-8
  of 288 experts from random scores, 10 entries masked to -1, fp8 dispatch, bf16 combine;
  bytes as that test counts them (per selected expert: hidden + hidden/128 x 4 + 16 for fp8
  dispatch, hidden x 2 for combine);
- `kernel`: the kernels' own durations from the torch profiler, as the test's bench_kineto
  (after a large matmul and an all-reduce that line the ranks up): dispatch and combine in one
  launch each, and with the receive hook the send and receive launches separately (a 100 us
  GPU sleep between them, so the receive finds its data arrived, as the test's CPU GEMM does);
- `graph`: one dispatch + combine captured in a CUDA graph, replayed 200 times between CUDA
  events after 20 warm-ups: mean time per pair, launches included;
- `eager`: dispatch + combine called from Python, each pair between CUDA events, as the test's
  `bench` (its "Dispatch + combine bandwidth" line): what an eager decode step sees, the
  host's cost per call included whenever the host is slower than the GPU;
- `host`: the CPU time of one eager dispatch + combine pair (perf_counter over 100 pairs,
  the GPU kept ahead): the launch path's own cost. `--profile-host` also prints where it goes.

    python3 benchmarks/buffer_ll_bench.py --method ours|deepep [--num-processes 2] OUT.csv
"""

import cProfile
import pstats
import time
import sys

import torch
import torch.distributed as dist

import bench_processes

HEADER = "method,op,ep,timing,us,gb_per_s"
TOKENS, HIDDEN, TOPK, EXPERTS = 128, 7168, 8, 288


def kernel_times(fn, names, per_period, iterations=30):
    """Mean duration (us) of the profiled kernels whose name contains '::<name>', per launch
    position within a period of `per_period` launches (send, recv)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        lhs = torch.randn((8192, 8192), device="cuda")
        lhs @ lhs
        dist.all_reduce(torch.ones(1, device="cuda"))
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    events = bench_processes.kernel_events(prof)
    out = {}
    for name in names:
        durations = [e["dur"] for e in events if f"::{name}" in e.get("name", "")]
        assert durations and len(durations) % per_period == 0, f"{name}: {len(durations)} kernels"
        out[name] = [sum(durations[j::per_period]) / (len(durations) // per_period) for j in range(per_period)]
    return out


def graph_time(fn, replays=200):
    """Mean us per replay of `fn` captured once (None if capture fails)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            fn()
    except Exception as error:  # noqa: BLE001 - reported, the other rows still count
        print(f"graph capture failed: {error}", flush=True)
        return None
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def eager_time(fn, warmups=50, tests=50):
    """DeepEP's tests/utils.py bench: mean us of `fn` between CUDA events, after an L2 flush."""
    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    for _ in range(warmups):
        fn()
    cache.zero_()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(tests)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(end) * 1e3 for start, end in events][1:]
    return sum(times) / len(times)


def host_time(fn, calls=100, profile=False, report=False):
    """Mean CPU us per call of `fn`, nothing waited for in between (the GPU keeps up). With
    `profile`, where the time goes, printed where `report`: every rank must profile (the calls
    are collective: a rank that ran 20 more would wait for peers that never come)."""
    torch.cuda.synchronize()
    profiler = cProfile.Profile() if profile else None
    begin = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(calls):
        fn()
    if profiler:
        profiler.disable()
    elapsed = time.perf_counter() - begin
    torch.cuda.synchronize()
    if profiler:
        # The driver and runtime calls behind those Python lines, CPU time each.
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        if report:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    return elapsed * 1e6 / calls


def pair_of(buffer, x, topk_idx, topk_weights, y):
    """One dispatch + combine as `pair(hook)`: with the hook, each receive launches after a
    100 us GPU sleep, so it finds its data arrived (as the test's CPU GEMM does)."""

    def pair(hook):
        _, _, h, _, recv_hook = buffer.low_latency_dispatch(x, topk_idx, TOKENS, EXPERTS, use_fp8=True, return_recv_hook=hook)
        if hook:
            torch.cuda._sleep(200_000)
            recv_hook()
        _, _, recv_hook = buffer.low_latency_combine(y, topk_idx, topk_weights, h, return_recv_hook=hook)
        if hook:
            torch.cuda._sleep(200_000)
            recv_hook()

    return pair


def scaling(buffer, x, topk_idx, topk_weights, y, rank, num_ranks, out):
    """Kernel times against the number of tokens that send anything (the others' top-k set to
    -1): the intercept is a call's fixed cost (launch, signals, waits), the slope its cost per
    token. Every rank sends the same number, so each receive waits for no one in particular."""
    lines = []
    for active in (0, 1, 16, 64, TOKENS):
        routing = topk_idx.clone()
        routing[active:] = -1
        pair = pair_of(buffer, x, routing, topk_weights, y)
        dist.barrier()
        one = kernel_times(lambda: pair(False), ("dispatch", "combine"), 1)
        dist.barrier()
        split = kernel_times(lambda: pair(True), ("dispatch", "combine"), 2)
        row = [one["dispatch"][0], one["combine"][0], *split["dispatch"], *split["combine"]]
        gathered = [None] * num_ranks
        dist.all_gather_object(gathered, row)
        if rank == 0:
            names = ("dispatch", "combine", "dispatch_send", "dispatch_recv", "combine_send", "combine_recv")
            for i, name in enumerate(names):
                per_rank = [r[i] for r in gathered]
                lines.append(f"{active},{name},{sum(per_rank) / num_ranks:.2f},{' '.join(f'{v:.2f}' for v in per_rank)}")
                print("scaling", active, name, lines[-1], flush=True)
    if rank == 0:
        with open(out, "w") as f:
            f.write("active_tokens,op,us,us_per_rank\n" + "\n".join(lines) + "\n")


def run(local_rank, num_ranks, args):
    group = bench_processes.join(local_rank, num_ranks, 8373)
    import deep_ep

    rank = dist.get_rank()
    num_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, num_ranks, EXPERTS)
    buffer = deep_ep.Buffer(group, num_rdma_bytes=num_bytes, low_latency_mode=True, num_qps_per_rank=EXPERTS // num_ranks, explicitly_destroy=True)
    torch.manual_seed(rank)
    x = torch.randn((TOKENS, HIDDEN), dtype=torch.bfloat16, device="cuda") * 0.1
    scores = torch.randn((TOKENS, EXPERTS), dtype=torch.float32, device="cuda").abs() + 1
    topk_idx = torch.topk(scores, TOPK, dim=-1, largest=True, sorted=True)[1].to(deep_ep.topk_idx_t)
    g = torch.Generator().manual_seed(rank)
    for _ in range(10):
        topk_idx[int(torch.randint(TOKENS, (1,), generator=g)), int(torch.randint(TOPK, (1,), generator=g))] = -1
    topk_weights = torch.randn((TOKENS, TOPK), dtype=torch.float32, device="cuda").abs()
    selections = int((topk_idx != -1).sum())
    dispatch_bytes = selections * (HIDDEN + HIDDEN / 128 * 4 + 16)
    combine_bytes = selections * HIDDEN * 2

    recv, _, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, TOKENS, EXPERTS, use_fp8=True)
    y = (recv[0].float().view(*recv[0].shape[:2], -1, 128) * recv[1].unsqueeze(3)).view(recv[0].shape).to(torch.bfloat16)
    buffer.low_latency_combine(y, topk_idx, topk_weights, handle)

    pair = pair_of(buffer, x, topk_idx, topk_weights, y)
    if args.scaling:
        scaling(buffer, x, topk_idx, topk_weights, y, rank, num_ranks, args.out)
        bench_processes.leave(buffer)
        return

    # Warm: DeepEP's test times after its correctness passes; the first launches after a
    # buffer is made run slower (first touches of fresh outputs, clocks).
    for _ in range(50):
        pair(False)
    torch.cuda.synchronize()

    rows = []
    dist.barrier()
    one = kernel_times(lambda: pair(False), ("dispatch", "combine"), 1)
    rows.append(("dispatch", "kernel", one["dispatch"][0], dispatch_bytes))
    rows.append(("combine", "kernel", one["combine"][0], combine_bytes))
    dist.barrier()
    split = kernel_times(lambda: pair(True), ("dispatch", "combine"), 2)
    rows.append(("dispatch_send", "kernel", split["dispatch"][0], dispatch_bytes))
    rows.append(("dispatch_recv", "kernel", split["dispatch"][1], dispatch_bytes))
    rows.append(("combine_send", "kernel", split["combine"][0], combine_bytes))
    rows.append(("combine_recv", "kernel", split["combine"][1], combine_bytes))
    dist.barrier()
    t = graph_time(lambda: pair(False))
    if t is not None:
        rows.append(("dispatch_combine", "graph", t, dispatch_bytes + combine_bytes))

    dist.barrier()
    rows.append(("dispatch_combine", "eager", eager_time(lambda: pair(False)), dispatch_bytes + combine_bytes))
    dist.barrier()
    rows.append(("dispatch_combine", "host", host_time(lambda: pair(False), profile=args.profile_host, report=rank == 0), dispatch_bytes + combine_bytes))

    gathered = [None] * num_ranks
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        with open(args.out, "w") as f:
            f.write(f"# gpu: {torch.cuda.get_device_name()} x {num_ranks}; torch {torch.__version__}; {TOKENS} tokens x {HIDDEN}, top-{TOPK} of {EXPERTS} experts, fp8 dispatch, bf16 combine\n")
            f.write(f"# date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
            f.write("# timing: kernel = profiler kernel durations (mean of 30, as DeepEP's bench_kineto); graph = CUDA graph replay of dispatch+combine (mean of 200); eager = the pair between CUDA events (DeepEP's bench); host = CPU time per eager pair; us = mean over ranks; gb_per_s = DeepEP's test's bytes / us\n")
            f.write(HEADER + "\n")
            for i, (op, timing, _, nbytes) in enumerate(rows):
                us = sum(r[i][2] for r in gathered) / num_ranks
                f.write(f"{args.method},{op},{num_ranks},{timing},{us:.2f},{nbytes / 1e3 / us:.2f}\n")
                print(args.method, op, timing, f"{us:.2f} us", " ".join(f"{r[i][2]:.2f}" for r in gathered), flush=True)
    bench_processes.leave(buffer)


def main():
    parser = bench_processes.parser()
    parser.add_argument("--profile-host", action="store_true", help="print rank 0's cProfile of the eager pair")
    parser.add_argument("--scaling", action="store_true", help="only kernel times against the number of tokens sent (OUT: active_tokens,op,us,us_per_rank)")
    return bench_processes.spawn(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
