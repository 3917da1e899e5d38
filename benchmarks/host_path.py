"""Host time per call of a DeepEP-style Buffer, ours or DeepEP's, at N = 1.

What a call costs the CPU before it returns (its launches are asynchronous): the median over
many calls of the time spent inside the call, with the GPU drained between iterations so that
no queue back-pressure is counted. Calls that must wait for the GPU (a dispatch that learns its
receive counts) include that wait; the `end to end` column times the whole iteration with a
synchronise, for reference (kernel time is the difference, roughly).

Run it on one GPU, one system per process (both load NVSHMEM), with no torchrun: it makes a
1-rank process group itself.

    python3 benchmarks/host_path.py --system ours [--csv benchmarks/results/host_path_<gpu>.csv]
    PYTHONPATH=<DeepEP's built package> python3 benchmarks/host_path.py --system deepep [--csv ...]

`--csv` appends this system's rows to a CSV (created with `# gpu:` / `# date:` header lines),
so one file holds both systems of one machine; compare only rows of the same GPU. `--profile`
prints the top of a cProfile of 200 of our low-latency pairs (where the host time goes);
`--breakdown` times the torch calls a call through Python is made of, each alone (the output
allocations, one tensor's reads). Shapes: DeepEP's tests (low latency: 128 tokens x 7168,
top-8 of 288 experts, fp8 dispatch; normal: 4096 tokens x 7168, top-8, 32 experts). Normal
mode runs for ours only: DeepEP's intranode kernels assert "Unsupported ranks" at one rank.
It passes Config(24, 8, 256), the config of DeepEP's test (neither system has a default
config for one rank).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import pstats
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

ITERS, WARMUP = 300, 30


def median_us(samples: list) -> float:
    return statistics.median(samples) * 1e6


def timed(call, iters: int = ITERS) -> tuple:
    """(median host us of `call`, median us of call + synchronise)."""
    host, total = [], []
    for i in range(WARMUP + iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= WARMUP:
            host.append(t1 - t0)
            total.append(t2 - t0)
    return median_us(host), median_us(total)


def low_latency(deep_ep, group, report, profile: bool) -> None:
    tokens, hidden, topk, experts = 128, 7168, 8, 288
    rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, 1, experts)
    buffer = deep_ep.Buffer(group, 0, rdma, low_latency_mode=True, num_qps_per_rank=experts, explicitly_destroy=True)
    x = torch.randn((tokens, hidden), dtype=torch.bfloat16, device="cuda")
    topk_idx = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(tokens)])
    weights = torch.rand((tokens, topk), dtype=torch.float32, device="cuda")
    recv, _, handle, _, _ = buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=True)
    expert_out = torch.randn((recv[0].shape[0], recv[0].shape[1], hidden), dtype=torch.bfloat16, device="cuda")

    def dispatch():
        buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=True)

    def combine():
        buffer.low_latency_combine(expert_out, topk_idx, weights, handle)

    def pair():
        _, _, h, _, _ = buffer.low_latency_dispatch(x, topk_idx, tokens, experts, use_fp8=True)
        buffer.low_latency_combine(expert_out, topk_idx, weights, h)

    report("low_latency_dispatch", *timed(dispatch))
    report("low_latency_combine", *timed(combine))
    report("low-latency pair", *timed(pair))
    if profile:
        stats = cProfile.Profile()
        stats.enable()
        for _ in range(200):
            pair()
        torch.cuda.synchronize()
        stats.disable()
        pstats.Stats(stats).sort_stats("tottime").print_stats(18)
    buffer.destroy()


def breakdown(report) -> None:
    """The host cost of the torch calls any binding that goes through Python makes per call,
    each timed alone: low-latency dispatch's five output allocations (DeepEP's shapes at 128
    tokens x 7168, 288 experts, one rank) and the reads of one input tensor."""
    x = torch.randn((128, 7168), dtype=torch.bfloat16, device="cuda")
    device = torch.device("cuda", 0)
    outputs = [((288, 128, 7168), torch.float8_e4m3fn), ((288, 56, 128), torch.float32), ((288,), torch.int32),
               ((288, 128), torch.int32), ((288, 1), torch.int64)]

    def allocate():
        for shape, dtype in outputs:
            torch.empty(shape, dtype=dtype, device=device)

    templates = {dtype: torch.empty((0,), dtype=dtype, device=device) for _, dtype in outputs}

    def allocate_like():
        for shape, dtype in outputs:
            templates[dtype].new_empty(shape)

    def read_tensor():
        x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device()

    def stream():
        torch._C._cuda_getCurrentRawStream(0)

    report("torch.empty x 5 (dispatch's outputs)", *timed(allocate))
    report("new_empty x 5 (from a tensor per dtype)", *timed(allocate_like))
    report("one tensor's reads (ptr, shape, ...)", *timed(read_tensor))
    report("current raw stream", *timed(stream))


def normal(deep_ep, group, report) -> None:
    tokens, hidden, topk, experts = 4096, 7168, 8, 32
    buffer = deep_ep.Buffer(group, int(2e9), 0, explicitly_destroy=True)
    config = deep_ep.Config(24, 8, 256)
    x = torch.randn((tokens, hidden), dtype=torch.bfloat16, device="cuda")
    scores = torch.randn((tokens, experts), dtype=torch.float32, device="cuda").abs() + 1
    topk_idx = torch.topk(scores, topk, dim=-1, sorted=False).indices
    weights = torch.rand((tokens, topk), dtype=torch.float32, device="cuda")
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    routed = {"num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank, "num_tokens_per_expert": per_expert}
    recv_x, _, recv_weights, _, handle, _ = buffer.dispatch(x, **routed, topk_idx=topk_idx, topk_weights=weights, config=config)

    def get_layout():
        buffer.get_dispatch_layout(topk_idx, experts)

    def dispatch():
        buffer.dispatch(x, **routed, topk_idx=topk_idx, topk_weights=weights, config=config)

    def cached_dispatch():
        buffer.dispatch(x, handle=handle, config=config)

    def combine():
        buffer.combine(recv_x, handle, topk_weights=recv_weights, config=config)

    report("get_dispatch_layout", *timed(get_layout))
    report("dispatch (fresh: waits for counts)", *timed(dispatch, 100))
    report("dispatch (cached handle)", *timed(cached_dispatch, 100))
    report("combine", *timed(combine, 100))
    buffer.destroy()


def write_csv(path: Path, system: str, rows: list) -> None:
    """Appends `rows` (what, host us, end-to-end us) to `path`, made with its header lines."""
    if not path.exists():
        gpu = torch.cuda.get_device_name(0)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        path.write_text(
            f"# gpu: {gpu} x 1; torch {torch.__version__}; benchmarks/host_path.py (N = 1)\n"
            f"# date: {now}\n"
            "# timing: host = median CPU time inside one call (GPU drained between calls); "
            "end_to_end = call + synchronise\n"
            "method,call,host_us,end_to_end_us\n"
        )
    with path.open("a") as out:
        for what, host_us, total_us in rows:
            out.write(f"{system},{what},{host_us:.1f},{total_us:.1f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["ours", "deepep"], required=True)
    parser.add_argument("--profile", action="store_true", help="cProfile our low-latency pair")
    parser.add_argument("--csv", type=Path, help="append the rows to this CSV")
    parser.add_argument("--breakdown", action="store_true",
                        help="time the torch calls a Python-facing call is made of (allocations, tensor reads)")
    args = parser.parse_args()
    for name in ("NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
        os.environ.setdefault(name, "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    group = dist.new_group([0])
    if args.system == "ours":
        # Both buffers of this run on one heap (ours sizes it for the first otherwise).
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(6 << 30))
        import nvshmem_tutorial.buffer as deep_ep
    else:
        import deep_ep
    rows = []

    def report(what, host_us, total_us):
        rows.append((what, host_us, total_us))
        print(f"{args.system:>6}  {what:<38} host {host_us:8.1f} us   end to end {total_us:8.1f} us", flush=True)

    low_latency(deep_ep, group, report, args.profile and args.system == "ours")
    if args.breakdown:
        breakdown(report)
    if args.system == "ours":
        normal(deep_ep, group, report)
    else:
        print("deepep  normal mode: not at N = 1 (its intranode kernels assert 'Unsupported ranks' for one rank)")
    torch.cuda.synchronize()
    if args.csv:
        write_csv(args.csv, args.system, rows)
    if args.system == "ours":
        import nvshmem_tutorial as nv

        nv.finalize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
