"""What the buffer benchmarks (buffer_bench.py, buffer_ll_bench.py) share: one process per
GPU spawned from the command line, as DeepEP's own tests do (not torchrun: DeepEP's
init_dist would read torchrun's WORLD_SIZE and RANK as the node count and rank), the process
group each joins, how a run ends, and the profiler's kernel records."""

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parser() -> argparse.ArgumentParser:
    """The arguments every buffer benchmark takes: which `deep_ep` it times, on how many GPUs,
    and the CSV it writes."""
    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=["ours", "deepep"], required=True)
    p.add_argument("--num-processes", type=int, default=2)
    p.add_argument("out")
    return p


def spawn(run, args) -> int:
    """Runs `run(local_rank, num_ranks, args)` in one process per GPU."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        os.environ.pop(name, None)
    mp.spawn(run, args=(args.num_processes, args), nprocs=args.num_processes)
    return 0


def join(local_rank: int, num_ranks: int, port: int):
    """This process's GPU and NCCL process group; returns the group a Buffer takes."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=local_rank, world_size=num_ranks, device_id=torch.device("cuda", local_rank))
    return dist.new_group(list(range(num_ranks)))


def kernel_events(prof) -> list:
    """The CUDA kernels a torch profiler recorded, as its Chrome trace lists them (name, ts,
    dur in us), in launch order."""
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.load(open(trace.name))["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def leave(buffer) -> None:
    """Destroys the buffer (collective) and the process group."""
    buffer.destroy()
    dist.barrier()
    dist.destroy_process_group()
