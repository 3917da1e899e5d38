"""Chapter 4's peers, timed the way ch04-coll-bench times ours: NCCL (torch.distributed) and
torch SymmetricMemory, 1 KiB to 256 MiB, each call captured K times in a CUDA graph and the
graph replayed between CUDA events (median of 7 replays after one warm-up, L2 flushed before
each). An op that cannot be captured is timed eagerly and marked `eager`.

    torchrun --standalone --nproc_per_node=N benchmarks/coll_bench.py --peers nccl,torch OUT.csv
    torchrun --standalone --nproc_per_node=N benchmarks/coll_bench.py --peers torch_nvshmem OUT.csv
    torchrun --standalone --nproc_per_node=N benchmarks/coll_bench.py --peers ours OUT.csv

torch's all_to_all_vdev loads its own NVSHMEM: run `torch_nvshmem` in a process of its own,
apart from `ours` (nvshmem_tutorial through Python, the size table choosing).
Sizes and busbw follow nccl-tests (all-reduce and broadcast: the buffer; all-gather: its
output; reduce-scatter: its input; all-to-all: one rank's input). COLL_ONLY (collective
names, comma-separated) times only those, as in ch04-coll-bench.
"""

import argparse
import os
import statistics

import torch
import torch.distributed as dist

NUM_SAMPLES = 7
FLUSH_BYTES = 256 << 20
SIZES = [1 << s for s in range(10, 29, 2)]  # 1 KiB .. 256 MiB by x4
HEADER = "collective,algorithm,method,timing,n_pes,num_bytes,us,busbw_gb_per_s"


def calls_per_graph(size: int) -> int:
    return max(1, min(100, -(-(256 << 20) // max(size, 1))))


def wanted(collective: str) -> bool:
    only = os.environ.get("COLL_ONLY")
    return only is None or collective in only.split(",")


def busbw_factor(collective: str, n: int) -> float:
    return {
        "all_reduce": 2 * (n - 1) / n,
        "broadcast": 1.0,
    }.get(collective, (n - 1) / n)


class Timer:
    def __init__(self):
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def _replay(self, launch, calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for sample in range(NUM_SAMPLES + 1):
            self.flush.fill_(sample)
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            launch()
            end.record()
            end.synchronize()
            if sample > 0:
                samples.append(start.elapsed_time(end) * 1e3 / calls)
        return statistics.median(samples)

    def time(self, size: int, call) -> tuple:
        """(us per call, 'graph' or 'eager')."""
        calls = calls_per_graph(size)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm up outside the graph: lazy init must not be captured
                call()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    call()
            return self._replay(graph.replay, calls), "graph"
        except Exception as error:  # noqa: BLE001 - any capture failure means: time it eagerly
            if dist.get_rank() == 0:
                print(f"rank 0: capture failed ({type(error).__name__}: {error}); timing eagerly", flush=True)
            torch.cuda.synchronize()

            def eager():
                for _ in range(calls):
                    call()

            return self._replay(eager, calls), "eager"


def nccl_and_torch(rows, timer, n, rank, with_torch: bool):
    group = dist.group.WORLD
    for size in SIZES:
        count = size // 2  # bf16
        x = torch.ones(count, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(count, dtype=torch.bfloat16, device="cuda")
        part = torch.ones(count // n, dtype=torch.bfloat16, device="cuda")
        cases = {
            "all_reduce": lambda: dist.all_reduce(x),
            "all_gather": lambda: dist.all_gather_into_tensor(y, part),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, x),
            "broadcast": lambda: dist.broadcast(x, 0),
            "all_to_all": lambda: dist.all_to_all_single(y, x),
        }
        for collective, call in cases.items():
            if not wanted(collective):
                continue
            us, timing = timer.time(size, call)
            rows.append((collective, "nccl", "nccl", timing, n, size, us, size / (us * 1e-6) / 1e9 * busbw_factor(collective, n)))
        if with_torch and wanted("all_reduce"):
            import torch.distributed._symmetric_memory as symm_mem

            buffer = symm_mem.empty(count, dtype=torch.bfloat16, device="cuda").fill_(1)
            symm_mem.rendezvous(buffer, group.group_name)
            for algorithm, call in [
                ("one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce(buffer, "sum", group.group_name)),
                ("two_shot", lambda: torch.ops.symm_mem.two_shot_all_reduce_(buffer, "sum", group.group_name)),
            ]:
                try:
                    us, timing = timer.time(size, call)
                except Exception as error:  # noqa: BLE001 - a size the op refuses is reported, not fatal
                    if rank == 0:
                        print(f"rank 0: torch {algorithm} at {size} B: {type(error).__name__}: {error}", flush=True)
                    continue
                rows.append(("all_reduce", algorithm, "torch_symm", timing, n, size, us, size / (us * 1e-6) / 1e9 * busbw_factor("all_reduce", n)))
            del buffer
        if rank == 0:
            print(f"rank 0: {size} B done", flush=True)


def ours_from_python(rows, timer, n, rank):
    """nvshmem_tutorial's collectives through the Python package, the size table choosing:
    the same kernels as ch04-coll-bench, here to show the Python path captures in a graph
    and costs nothing per call once captured."""
    import nvshmem_tutorial as nv

    nv.init()
    for size in SIZES:
        count = size // 2
        x = nv.empty((count,), torch.bfloat16)
        y = nv.empty((count,), torch.bfloat16)
        part = nv.empty((count // n,), torch.bfloat16)
        x.fill_(1)
        cases = {
            "all_reduce": lambda: nv.all_reduce(y, x),
            "all_gather": lambda: nv.all_gather(y, part),
            "reduce_scatter": lambda: nv.reduce_scatter(part, x),
            "broadcast": lambda: nv.broadcast(x, x, 0),
            "all_to_all": lambda: nv.all_to_all(y, x),
        }
        for collective, call in cases.items():
            if not wanted(collective):
                continue
            us, timing = timer.time(size, call)
            rows.append((collective, "auto_python", "ours", timing, n, size, us, size / (us * 1e-6) / 1e9 * busbw_factor(collective, n)))
        x = y = part = None  # release the tensors (the lambdas hold the names, not copies)
        nv.collect()
        if rank == 0:
            print(f"rank 0: ours (python) {size} B done", flush=True)
    nv.finalize()


def torch_nvshmem(rows, timer, n, rank, device):
    import torch.distributed._symmetric_memory as symm_mem

    symm_mem.set_backend("NVSHMEM")
    group_name = dist.group.WORLD.group_name
    hidden = 7168
    for tokens in (128, 4096):
        # NVSHMEM's team manager binds to the first device index it sees: name it everywhere.
        splits = torch.tensor([tokens // n + (q < tokens % n) for q in range(n)], dtype=torch.int64, device=device)
        inp = symm_mem.empty((tokens, hidden), dtype=torch.bfloat16, device=device).fill_(1)
        out = symm_mem.empty((tokens * n, hidden), dtype=torch.bfloat16, device=device)
        in_splits = symm_mem.empty(n, dtype=torch.int64, device=device).copy_(splits)
        out_splits_offsets = symm_mem.empty((2, n), dtype=torch.int64, device=device)
        for t in (inp, out, in_splits, out_splits_offsets):
            symm_mem.rendezvous(t, group_name)
        size = tokens * hidden * 2
        call = lambda: torch.ops.symm_mem.all_to_all_vdev(inp, out, in_splits, out_splits_offsets, group_name)  # noqa: E731
        us, timing = timer.time(size, call)
        rows.append(("all_to_all_v", f"vdev_{tokens}tok", "torch_symm", timing, n, size, us, size / (us * 1e-6) / 1e9 * busbw_factor("all_to_all_v", n)))
        if rank == 0:
            print(f"rank 0: all_to_all_vdev {tokens} tokens: {us:.1f} us ({timing})", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", default="nccl,torch")
    parser.add_argument("out")
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    n = dist.get_world_size()
    timer, rows = Timer(), []
    peers = args.peers.split(",")
    if "nccl" in peers:
        nccl_and_torch(rows, timer, n, rank, with_torch="torch" in peers)
    if "ours" in peers:
        ours_from_python(rows, timer, n, rank)
    if "torch_nvshmem" in peers and wanted("all_to_all_v"):
        with torch.cuda.device(device):
            torch_nvshmem(rows, timer, n, rank, device)
    if rank == 0:
        with open(args.out, "w") as f:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
            f.write(f"# peers: torch {torch.__version__}, NCCL {nccl} (torch.distributed), CUDA {torch.version.cuda}\n")
            f.write("# peers timed by benchmarks/coll_bench.py the same way; nccl broadcast/all_reduce in place\n")
            f.write(HEADER + "\n")
            for row in rows:
                c, a, m, t, npes, size, us, bw = row
                f.write(f"{c},{a},{m},{t},{npes},{size},{us:.3f},{bw:.3f}\n")
        print(f"rank 0: wrote {args.out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
