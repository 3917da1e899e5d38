"""Chapter 3 from PyTorch: host-initiated put and get on torch's stream, and a benchmark.

    torchrun --standalone --nproc_per_node=N scripts/ch03_put_get.py [--bench] [--csv PATH]

Mirrors the host-initiated half of chapters/ch03-put-get/examples/ch03_put_get.rs: on a ring
(send to the next PE, receive from the previous), put and get, blocking and non-blocking
(+ quiet), plain stores through a peer view, each checked on fresh random data written into
a poisoned destination at an odd offset, with torch kernels producing the source and
consuming the result on the same stream and no host synchronisation in between. Then the
mistakes, each an exception before anything is enqueued. (The device-side put/get of the Rust
chapter needs its kernels, which this package does not expose.)

--bench (2+ PEs, pairs 0<->1, 2<->3, ...): an exchange of N bytes between the two PEs of a
pair, completion included, timed for NVSHMEM (put + barrier) and NCCL (torch.distributed
send/recv) in the same run. Both are timed as K operations captured in one CUDA graph,
replayed between CUDA events (median of several replays), and, for reference, eagerly: one
eager NCCL call costs 30-50 us of host overhead that graph replay removes. Rank 0 prints the
table (and writes --csv). Rank 0 prints `N passed, M failed` last.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from ch00_common import Tally, main, nv, start

SIZES_WORDS = (3, 1_000_003, 16 << 20)  # the Rust example's sizes plus 64 MiB
DST_OFFSET_WORDS = 7  # an odd offset into the destination: no alignment luck
POISON = -1  # 0xFFFFFFFF in every word nobody wrote

BENCH_SIZES_BYTES = (8, 1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20)
OPS_PER_GRAPH = 20
NUM_SAMPLES = 7


def fresh_words(num_words: int, pe: int, round_seed: int) -> torch.Tensor:
    """Random int32 [num_words] that any rank can rebuild for `pe` (never all zeros)."""
    g = torch.Generator(device="cuda").manual_seed(round_seed * 1_000_003 + pe)
    return torch.randint(0, 1 << 31, (num_words,), generator=g, device="cuda", dtype=torch.int32)


def run(args: argparse.Namespace) -> bool:
    start()
    tally = Tally()
    round_seed = int(torch.randint(1 << 30, (1,)).item())
    box = [round_seed]
    dist.broadcast_object_list(box, src=0)
    round_seed = box[0]
    for method in ("put", "put_nbi", "get", "get_nbi", "peer_store"):
        for num_words in SIZES_WORDS:
            round_seed += 1
            ring_round(method, num_words, round_seed, tally)
    mistakes(tally)
    if args.bench:
        bench(tally, args.csv)
    return tally.finish()


def ring_round(method: str, num_words: int, seed: int, tally: Tally) -> None:
    me, n = nv.my_pe(), nv.n_pes()
    nxt, prv = (me + 1) % n, (me - 1) % n
    total = num_words + 2 * DST_OFFSET_WORDS
    window = slice(DST_OFFSET_WORDS, DST_OFFSET_WORDS + num_words)
    if method.startswith("put") or method == "peer_store":
        # Push: we write into the next PE's symmetric inbox.
        inbox = nv.empty((total,), torch.int32)
        inbox.fill_(POISON)
        nv.barrier()  # the poison lands before any peer writes
        src = fresh_words(num_words, me, seed)
        src.bitwise_xor_(0x5A5A5A5A)  # a kernel producing the source right before the put
        if method == "peer_store":
            nv.peer_view(inbox, nxt)[window].copy_(src)
        else:
            nv.put(inbox[window], src, nxt, nbi=method.endswith("nbi"))
        nv.barrier()  # completes the puts (and stores) of every PE
        got = inbox.clone()  # a kernel consuming the result right after
        source = prv
    else:
        # Pull: we read the previous PE's symmetric outbox into a private tensor.
        outbox = nv.empty((num_words,), torch.int32)
        outbox.copy_(fresh_words(num_words, me, seed)).bitwise_xor_(0x5A5A5A5A)
        nv.barrier()  # every outbox is written before anyone reads
        local = torch.full((total,), POISON, dtype=torch.int32, device="cuda")
        nv.get(local[window], outbox, prv, nbi=method.endswith("nbi"))
        if method.endswith("nbi"):
            nv.quiet()
        got = local.clone()
        nv.barrier()  # nobody rewrites an outbox while a peer may still read it
        source = prv
    expected = torch.full((total,), POISON, dtype=torch.int32, device="cuda")
    expected[window] = fresh_words(num_words, source, seed) ^ 0x5A5A5A5A
    wrong = (got != expected).sum().item()
    if num_words == SIZES_WORDS[-1] or wrong:
        print(f"pe {me}: {method} of {num_words} words from pe {source}: {wrong} wrong", flush=True)
    tally.check(wrong == 0, f"{method} of {num_words} words: {wrong} wrong words from pe {source}")


def mistakes(tally: Tally) -> None:
    n = nv.n_pes()
    sym = nv.empty((1024,), torch.int32)
    local = torch.zeros(1024, dtype=torch.int32, device="cuda")
    tally.expect_error(lambda: nv.put(sym, local.cpu(), 0), nv.InvalidArgumentError, "CPU")
    tally.expect_error(lambda: nv.put(local, local, 0), nv.NotSymmetricError, "symmetric heap")
    tally.expect_error(lambda: nv.get(local, local, 0), nv.NotSymmetricError, "symmetric heap")
    tally.expect_error(lambda: nv.put(sym, local, n), nv.PeOutOfRangeError, "out of range")
    tally.expect_error(lambda: nv.get(local, sym, -1), nv.PeOutOfRangeError, "out of range")
    tally.expect_error(lambda: nv.put(sym, local.float(), 0), nv.InvalidArgumentError, "dtype")
    tally.expect_error(lambda: nv.put(sym[:10], local, 0), nv.InvalidArgumentError, "shape")
    overhang = nv._core._tensor_at(sym[1000:].data_ptr(), 100 * 4, sym).view(torch.int32)
    tally.expect_error(
        lambda: nv.put(overhang, local[:100], 0), nv.OutOfBoundsError, "past the end"
    )
    nv.barrier()  # nothing above reached a stream: the job is healthy
    torch.cuda.synchronize()
    tally.check(True)


# ---- benchmark ------------------------------------------------------------------------------


def time_per_op_us(op: Callable[[], None], graph: bool) -> float:
    """Median microseconds per `op`, over NUM_SAMPLES timed batches of OPS_PER_GRAPH."""
    stream = torch.cuda.current_stream()
    for _ in range(3):  # warm-up: NCCL creates its p2p communicator here, not in a capture
        op()
    torch.cuda.synchronize()
    dist.barrier()
    if graph:
        g = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog and NVSHMEM's proxy threads keep making CUDA calls
        # while we capture; only this thread's calls belong to the graph.
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for _ in range(OPS_PER_GRAPH):
                op()
        run_batch: Callable[[], None] = g.replay
    else:

        def run_batch() -> None:
            for _ in range(OPS_PER_GRAPH):
                op()

    run_batch()  # warm replay
    torch.cuda.synchronize()
    samples = []
    for _ in range(NUM_SAMPLES):
        dist.barrier()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        run_batch()
        end.record(stream)
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e3 / OPS_PER_GRAPH)
    return statistics.median(samples)


def bench_bytes(num_bytes: int, pe: int) -> torch.Tensor:
    """Random uint8 [num_bytes] that any rank can rebuild for `pe`."""
    g = torch.Generator(device="cuda").manual_seed(7 * num_bytes + pe)
    return torch.randint(0, 256, (num_bytes,), generator=g, dtype=torch.uint8, device="cuda")


def bench(tally: Tally, csv_path: Optional[str]) -> None:
    me, n = nv.my_pe(), nv.n_pes()
    if n < 2 or n % 2:
        print(f"pe {me}: --bench needs an even number of PEs (pairs); skipping", flush=True)
        return
    peer = me ^ 1
    rows: List[Dict[str, object]] = []
    for num_bytes in BENCH_SIZES_BYTES:
        inbox = nv.empty((num_bytes,), torch.uint8)
        src = bench_bytes(num_bytes, me)
        recv = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")

        def nvshmem_exchange() -> None:
            nv.put(inbox, src, peer)
            nv.barrier()  # completion: the peer's data is in our inbox

        def nccl_exchange() -> None:
            ops = [dist.P2POp(dist.isend, src, peer), dist.P2POp(dist.irecv, recv, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        row: Dict[str, object] = {"bytes": num_bytes}
        for system, op in (("nvshmem", nvshmem_exchange), ("nccl", nccl_exchange)):
            for mode in ("graph", "eager"):
                try:
                    row[f"{system}_{mode}_us"] = time_per_op_us(op, graph=mode == "graph")
                except Exception as error:  # noqa: BLE001 - reported, the other system still runs
                    row[f"{system}_{mode}_us"] = float("nan")
                    print(f"pe {me}: {system} {mode} timing failed: {error}", flush=True)
                    torch.cuda.synchronize()
        torch.cuda.synchronize()
        # The data really moved: both systems delivered the peer's bytes.
        expected = bench_bytes(num_bytes, peer)
        tally.check(torch.equal(inbox, expected), f"nvshmem bench data of {num_bytes} B wrong")
        tally.check(torch.equal(recv, expected), f"nccl bench data of {num_bytes} B wrong")
        rows.append(row)
        del inbox
    if me != 0:
        return
    name = torch.cuda.get_device_name()
    print(
        f"\nexchange between PE 0 and PE 1 ({name}, torch {torch.__version__}, NVSHMEM "
        f"{'.'.join(map(str, nv.library_info()[1]))}, NCCL "
        f"{'.'.join(map(str, torch.cuda.nccl.version()))}); time per exchange in us "
        f"(median of {NUM_SAMPLES} x {OPS_PER_GRAPH}), bandwidth = bytes / graph time"
    )
    header = (
        f"{'bytes':>10} {'nvshmem graph':>14} {'nccl graph':>11} {'nvshmem eager':>14} "
        f"{'nccl eager':>11} {'nvshmem GB/s':>13} {'nccl GB/s':>10}"
    )
    print(header)
    for r in rows:
        b = r["bytes"]
        print(
            f"{b:>10} {r['nvshmem_graph_us']:>14.2f} {r['nccl_graph_us']:>11.2f} "
            f"{r['nvshmem_eager_us']:>14.2f} {r['nccl_eager_us']:>11.2f} "
            f"{b / r['nvshmem_graph_us'] / 1e3:>13.2f} {b / r['nccl_graph_us'] / 1e3:>10.2f}",
            flush=True,
        )
    if csv_path:
        keys = ["bytes", "nvshmem_graph_us", "nccl_graph_us", "nvshmem_eager_us", "nccl_eager_us"]
        with open(csv_path, "w") as f:
            f.write(f"# gpu={name} torch={torch.__version__} method=exchange put+barrier vs send/recv\n")
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join(str(r[k]) for k in keys) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", action="store_true", help="time NVSHMEM against NCCL")
    parser.add_argument("--csv", help="rank 0 writes the benchmark table here")
    arguments = parser.parse_args()
    main("ch03_put_get.py", lambda: run(arguments))
