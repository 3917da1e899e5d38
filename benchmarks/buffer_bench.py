"""Normal-mode dispatch/combine benchmark, timed exactly as DeepEP's tests/test_intranode.py
times it (its `bench`: eager calls, 50 warm-ups, mean of 50 between events after a 256 MB
cache flush), bandwidth as it computes it (received bytes / time, "NVL GB/s"), for whichever
`deep_ep` is first on PYTHONPATH: DeepEP itself, or nvshmem_tutorial through
benchmarks/deepep_shim. Sweeps num_sms and the NVL chunk size; also times an NCCL
`all_to_all_single`-based dispatch/combine (layout on the GPU, count exchange, payload
exchange, with the host synchronisation it needs) as context. Rows `dispatch_gpu` and
`combine_gpu` (at each num_sms, the first chunk) time a whole call on the GPU instead: the
summed durations of the kernels it launches, from the torch profiler, as DeepEP V2's test
times its calls (dispatch with its notify, not from a cached handle; no host time).

    python3 benchmarks/buffer_bench.py --method ours|deepep [--num-processes 2] OUT.csv

Data as DeepEP's test: 4096 tokens x 7168 hidden per rank, top-8 of 256 experts from random
scores, bf16 and fp8 (per-token cast) dispatch, bf16 combine.
"""

import sys
import time

import torch
import torch.distributed as dist

import bench_processes

HEADER = "method,op,dtype,ep,num_sms,chunk,us,gb_per_s"


def bench(fn, num_warmups=50, num_tests=50):
    """DeepEP's tests/utils.py bench: mean seconds over num_tests - 1 timed calls."""
    torch.cuda.synchronize()
    cache = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    for _ in range(num_warmups):
        fn()
    cache.zero_()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(num_tests)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(num_tests)]
    for i in range(num_tests):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) / 1e3 for s, e in zip(start, end)][1:]
    return sum(times) / len(times)


def gpu_time(fn, iterations=20):
    """Mean seconds per call of the CUDA kernels `fn` launches, summed (torch profiler).

    A call that is not cached starts with the notify kernel, which waits for every rank to
    enter: kernel time then includes the ranks' skew. So the ranks meet (a barrier after the
    GPU drained) before the profiler starts, and the first profiler session of the process
    (CUPTI's set-up, tens of ms on one rank) is spent untimed by `run`."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    durations = [e["dur"] for e in bench_processes.kernel_events(prof)]
    assert durations, "the profiler saw no kernel"
    return sum(durations) / 1e6 / iterations


def per_token_cast_to_fp8(x):
    m, n = x.shape
    xv = x.view(m, -1, 128)
    amax = xv.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
    return (xv * (448.0 / amax.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, n), (amax / 448.0).view(m, -1)


def run(local_rank, num_ranks, args):
    group = bench_processes.join(local_rank, num_ranks, 8371)
    import deep_ep

    rank = dist.get_rank()
    n_tokens, hidden, num_topk, num_experts = 4096, 7168, 8, 256
    buffer = deep_ep.Buffer(group, int(2e9), 0, low_latency_mode=False, num_qps_per_rank=1, explicitly_destroy=True)
    torch.manual_seed(rank)
    x = torch.randn((n_tokens, hidden), dtype=torch.bfloat16, device="cuda")
    x_fp8 = per_token_cast_to_fp8(x)
    x_fp8 = (x_fp8[0], x_fp8[1].T.contiguous().T)  # column-major scales, as DeepEP's test
    scores = torch.randn((n_tokens, num_experts), device="cuda").abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, sorted=False).indices.to(deep_ep.topk_idx_t)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    rows = []
    # The first profiler session of a process sets CUPTI up on each rank at its own pace;
    # this one is not timed, so that gpu_time's sessions start together.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        buffer.get_dispatch_layout(topk_idx, num_experts)
        torch.cuda.synchronize()
    t = bench(lambda: buffer.get_dispatch_layout(topk_idx, num_experts))
    rows.append(("layout", "-", 24, 0, t * 1e6, 0.0))

    # Received bytes, as the test counts them ("NVL GB/s").
    recv_tokens = in_rank.sum(0).to(torch.int32)
    dist.all_reduce(recv_tokens, group=group)
    bf16_bytes = int(recv_tokens[rank]) * hidden * 2
    fp8_bytes = bf16_bytes * (1 + 4 / 128) / 2
    for num_sms in args.num_sms:
        config = deep_ep.Config(num_sms, 8, 256)
        recv_x, _, _, _, handle, _ = buffer.dispatch(x=x_fp8, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, config=config)
        for dtype, current, nbytes in (("fp8", x_fp8, fp8_bytes), ("bf16", x, bf16_bytes)):
            for chunk in args.chunks:
                cfg = deep_ep.Config(num_sms, chunk, 256)
                t = bench(lambda: buffer.dispatch(x=current, handle=handle, config=cfg))  # noqa: B023
                rows.append(("dispatch", dtype, num_sms, chunk, t * 1e6, nbytes / 1e9 / t))
            cfg = deep_ep.Config(num_sms, args.chunks[0], 256)
            t = gpu_time(lambda: buffer.dispatch(x=current, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,  # noqa: B023
                                                 num_tokens_per_expert=per_expert, config=cfg))  # noqa: B023
            rows.append(("dispatch_gpu", dtype, num_sms, args.chunks[0], t * 1e6, nbytes / 1e9 / t))
        recv_x, _, _, _, handle, _ = buffer.dispatch(x=x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, config=config)
        for chunk in args.combine_chunks:
            cfg = deep_ep.Config(num_sms, chunk, 256)
            t = bench(lambda: buffer.combine(x=recv_x, handle=handle, config=cfg))  # noqa: B023
            rows.append(("combine", "bf16", num_sms, chunk, t * 1e6, bf16_bytes / 1e9 / t))
        cfg = deep_ep.Config(num_sms, args.combine_chunks[0], 256)
        t = gpu_time(lambda: buffer.combine(x=recv_x, handle=handle, config=cfg))  # noqa: B023
        rows.append(("combine_gpu", "bf16", num_sms, args.combine_chunks[0], t * 1e6, bf16_bytes / 1e9 / t))
        if rank == 0:
            print(f"{args.method}: num_sms {num_sms} done", flush=True)
    if args.method == "ours":
        rows += nccl_rows(x, in_rank, topk_idx, num_ranks, rank, group, hidden, bf16_bytes)
    if rank == 0:
        with open(args.out, "w") as f:
            f.write(f"# gpu: {torch.cuda.get_device_name()} x {num_ranks}; torch {torch.__version__}; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}\n")
            f.write(f"# date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
            f.write("# timing: DeepEP's tests/utils.py bench (eager, 50 warm-ups, mean of 49); *_gpu rows: the call's kernels' summed durations (torch profiler, mean of 20; dispatch not cached); gb_per_s = received bytes / time (DeepEP's NVL GB/s)\n")
            f.write(HEADER + "\n")
            for op, dtype, num_sms, chunk, us, bw in rows:
                method = "nccl_a2a" if op.startswith("nccl") else args.method
                f.write(f"{method},{op.removeprefix('nccl_')},{dtype},{num_ranks},{num_sms},{chunk},{us:.2f},{bw:.2f}\n")
        for row in rows:
            print(args.method, *row, flush=True)
    bench_processes.leave(buffer)


def nccl_rows(x, in_rank, topk_idx, num_ranks, rank, group, hidden, bf16_bytes):
    """dispatch/combine from all_to_all_single: count exchange, host sync, payload exchange."""
    send_counts = in_rank.sum(0)
    order = torch.cat([torch.nonzero(in_rank[:, r]).squeeze(1) for r in range(num_ranks)])

    def dispatch():
        counts = torch.empty_like(send_counts)
        dist.all_to_all_single(counts, send_counts, group=group)
        recv_splits = counts.tolist()  # the host synchronisation NCCL's API needs
        out = torch.empty((sum(recv_splits), hidden), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x[order], recv_splits, send_counts.tolist(), group=group)
        return out, recv_splits

    out, recv_splits = dispatch()

    def combine():
        back = torch.empty((order.shape[0], hidden), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(back, out, send_counts.tolist(), recv_splits, group=group)
        combined = torch.zeros_like(x, dtype=torch.float32)
        combined.index_add_(0, order, back.float())
        return combined.to(x.dtype)

    t_dispatch, t_combine = bench(dispatch), bench(combine)
    return [
        ("nccl_dispatch", "bf16", 0, 0, t_dispatch * 1e6, bf16_bytes / 1e9 / t_dispatch),
        ("nccl_combine", "bf16", 0, 0, t_combine * 1e6, bf16_bytes / 1e9 / t_combine),
    ]


def main():
    parser = bench_processes.parser()
    parser.add_argument("--num-sms", type=int, nargs="+", default=[8, 12, 16, 20, 24])
    parser.add_argument("--chunks", type=int, nargs="+", default=[6, 8, 16])
    parser.add_argument("--combine-chunks", type=int, nargs="+", default=[4, 8])
    return bench_processes.spawn(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
