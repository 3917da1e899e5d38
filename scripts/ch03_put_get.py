"""Chapter 3 from PyTorch: host-initiated put and get on torch's stream, and a benchmark.

    torchrun --standalone --nproc_per_node=N scripts/ch03_put_get.py [--bench] [--csv PATH]

Mirrors the host-initiated half of chapters/ch03-put-get/examples/ch03_put_get.rs: on a ring
(send to the next PE, receive from the previous), put and get, blocking and non-blocking
(+ quiet), put with a signal that the receiver's stream waits on (no barrier), plain stores
through a peer view, each checked on fresh random data written into
a poisoned destination at an odd offset, with torch kernels producing the source and
consuming the result on the same stream and no host synchronisation in between. Then the
mistakes, each an exception before anything is enqueued. (The device-side put/get of the Rust
chapter needs its kernels, which this package does not expose.)

--bench (2+ PEs, pairs 0<->1, 2<->3, ...): an exchange of N bytes between the two PEs of a
pair, completion included (each PE has sent its N bytes and holds its partner's), timed in
the same run for
  put_signal   NVSHMEM's pairwise idiom: put_signal (data, then add 1 to the partner's signal
               word) + wait_signal (until our word counts this exchange). Only the pair syncs;
  nccl         torch.distributed batch_isend_irecv (send + recv), also pairwise;
  put_barrier  put + a global barrier_all: what a barrier costs when only a pair needed to sync.
Each is timed as K operations captured in one CUDA graph, replayed between CUDA events
(median of several replays), and, for reference, eagerly: one eager NCCL call costs 30-50 us
of host overhead that graph replay removes. Rank 0 prints the table (and writes --csv). Rank 0
prints `N passed, M failed` last.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from ch00_common import Tally, main, nv, print_by_pe, print_now, start

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
    for method in ("put", "put_nbi", "put_signal", "get", "get_nbi", "peer_store"):
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
        if method == "put_signal":
            signal = nv.zeros((1,), torch.uint64)  # our word; the previous PE sets it
        nv.barrier()  # the poison (and the zero signal) land before any peer writes
        src = fresh_words(num_words, me, seed)
        src.bitwise_xor_(0x5A5A5A5A)  # a kernel producing the source right before the put
        if method == "peer_store":
            nv.peer_view(inbox, nxt)[window].copy_(src)
            nv.barrier()  # completes the stores of every PE
        elif method == "put_signal":
            # Pairwise completion: the previous PE's signal arrives after its data, and our
            # stream waits for it. No barrier: no other PE is involved.
            nv.put_signal(inbox[window], src, nxt, signal[0], seed)
            nv.wait_signal(signal[0], seed, cmp="eq")
        else:
            nv.put(inbox[window], src, nxt, nbi=method.endswith("nbi"))
            nv.barrier()  # completes the puts of every PE
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
    # Every rank takes part in the report; only the largest size, or a failure, has a line.
    shown = num_words == SIZES_WORDS[-1] or wrong
    print_by_pe(f"{method} of {num_words} words from pe {source}: {wrong} wrong" if shown else None)
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
    overhang = nv._tensors._tensor_at(sym[1000:].data_ptr(), 100 * 4, sym).view(torch.int32)
    tally.expect_error(
        lambda: nv.put(overhang, local[:100], 0), nv.OutOfBoundsError, "past the end"
    )
    signals = nv.zeros((2,), torch.uint64)
    tally.expect_error(
        lambda: nv.put_signal(sym, local, 0, sym[:1], 1), nv.InvalidArgumentError, "uint64"
    )
    tally.expect_error(
        lambda: nv.put_signal(sym, local, 0, signals, 1), nv.InvalidArgumentError, "one signal"
    )
    tally.expect_error(
        lambda: nv.put_signal(sym, local, n, signals[0], 1), nv.PeOutOfRangeError, "out of range"
    )
    tally.expect_error(
        lambda: nv.put_signal(sym, local, 0, signals[0], 1, op="xor"),
        nv.InvalidArgumentError,
        "op='xor'",
    )
    tally.expect_error(
        lambda: nv.wait_signal(signals[0].cpu(), 1), nv.InvalidArgumentError, "CPU"
    )
    tally.expect_error(
        lambda: nv.wait_signal(signals[0], 1, cmp=">="), nv.InvalidArgumentError, "cmp='>='"
    )
    nv.barrier()  # nothing above reached a stream: the job is healthy
    torch.cuda.synchronize()
    tally.check(True)


# ---- benchmark ------------------------------------------------------------------------------


def time_per_op_us(
    op: Callable[[int], None], graph: bool, reset: Optional[Callable[[], None]] = None
) -> float:
    """Median microseconds per `op`, over NUM_SAMPLES timed batches of OPS_PER_GRAPH.

    A batch calls op(0), ..., op(OPS_PER_GRAPH - 1) (captured once into a CUDA graph and
    replayed, or called eagerly). `reset`, if given, runs before every batch with the GPU idle
    and is followed by a synchronize and a barrier, so that every PE starts a batch from the
    state it resets (the put_signal exchange zeroes its signal words there).
    """
    stream = torch.cuda.current_stream()

    def prepare() -> None:
        if reset is not None:
            reset()
        torch.cuda.synchronize()
        dist.barrier()  # every PE is reset and idle before any PE starts the batch

    prepare()
    for i in range(3):  # warm-up: NCCL creates its p2p communicator here, not in a capture
        op(i)
    torch.cuda.synchronize()
    dist.barrier()
    if graph:
        g = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog and NVSHMEM's proxy threads keep making CUDA calls
        # while we capture; only this thread's calls belong to the graph.
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for i in range(OPS_PER_GRAPH):
                op(i)
        run_batch: Callable[[], None] = g.replay
    else:

        def run_batch() -> None:
            for i in range(OPS_PER_GRAPH):
                op(i)

    prepare()
    run_batch()  # warm replay
    torch.cuda.synchronize()
    samples = []
    for _ in range(NUM_SAMPLES):
        prepare()
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


SYSTEMS = ("put_signal", "nccl", "put_barrier")
MODES = ("graph", "eager")

METHODS = (
    "exchange = each PE of a pair sends N bytes to the other and ends holding the partner's; "
    "time per exchange = CUDA-event time of K back-to-back exchanges / K, median of S batches",
    "put_signal = nv.put_signal(inbox[i%2], src, partner, sig, 1, op='add') + "
    "nv.wait_signal(sig, i+1, cmp='ge'); sig zeroed + barrier before each batch (pairwise sync)",
    "nccl = dist.batch_isend_irecv([isend(src), irecv(recv)]) + wait (pairwise sync)",
    "put_barrier = nv.put(inbox, src, partner) + nv.barrier() (nvshmemx_barrier_all_on_stream: "
    "global sync)",
    "graph = K exchanges captured in one CUDA graph, replayed; eager = K host calls",
    "GB/s = bytes / graph time (one direction, per PE)",
)


def bench(tally: Tally, csv_path: Optional[str]) -> None:
    me, n = nv.my_pe(), nv.n_pes()
    if n < 2 or n % 2:
        print_by_pe("--bench needs an even number of PEs (pairs); skipping")
        return
    if dist.get_backend() != "nccl":
        print_by_pe("--bench skipped: ranks share a GPU (gloo), so its NCCL peer cannot run and "
                    "timings would measure the GPU's scheduler")
        return
    peer = me ^ 1
    rows: List[Dict[str, object]] = []
    for num_bytes in BENCH_SIZES_BYTES:
        inbox = nv.empty((num_bytes,), torch.uint8)
        # Double buffer: exchange i writes slot i % 2. Our wait for the partner's exchange i
        # passing means the partner has finished its wait for exchange i - 1 (it sent i only
        # after that), so exchange i + 1 overwrites a slot the partner is done with.
        signal_inbox = nv.empty((2, num_bytes), torch.uint8)
        words = nv.zeros((1,), torch.uint64)  # our signal word; the partner adds to it
        src = bench_bytes(num_bytes, me)
        recv = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")

        # ANCHOR: exchanges
        def put_signal_exchange(i: int) -> None:
            # The values are baked into a captured graph, so each replay sends the same adds
            # and waits for the same counts 1..K: correct only because the word is zeroed
            # (reset_words) before every batch, after every add of the previous one landed.
            nv.put_signal(signal_inbox[i % 2], src, peer, words[0], 1, op="add")
            nv.wait_signal(words[0], i + 1, cmp="ge")

        def reset_words() -> None:
            # Safe: the previous batch ended with our wait for the partner's last add, so no
            # add to our word is still in flight; the barrier after it (in time_per_op_us)
            # keeps the partner from adding before our zero has landed.
            words.view(torch.int64).zero_()

        def put_barrier_exchange(i: int) -> None:
            nv.put(inbox, src, peer)
            nv.barrier()  # completion: the peer's data is in our inbox

        def nccl_exchange(i: int) -> None:
            ops = [dist.P2POp(dist.isend, src, peer), dist.P2POp(dist.irecv, recv, peer)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        # ANCHOR_END: exchanges

        row: Dict[str, object] = {"bytes": num_bytes}
        for system, op, reset in (
            ("put_signal", put_signal_exchange, reset_words),
            ("nccl", nccl_exchange, None),
            ("put_barrier", put_barrier_exchange, None),
        ):
            for mode in MODES:
                try:
                    row[f"{system}_{mode}_us"] = time_per_op_us(op, mode == "graph", reset)
                except Exception as error:  # noqa: BLE001 - reported, the other systems still run
                    row[f"{system}_{mode}_us"] = float("nan")
                    print_now(f"{system} {mode} timing failed: {error}", error=True)
                    torch.cuda.synchronize()
        torch.cuda.synchronize()
        # The data really moved: every system delivered the peer's bytes, and the last
        # put_signal batch counted exactly K adds (none lost, none left over from a replay).
        expected = bench_bytes(num_bytes, peer)
        tally.check(torch.equal(inbox, expected), f"put_barrier bench data of {num_bytes} B wrong")
        tally.check(torch.equal(recv, expected), f"nccl bench data of {num_bytes} B wrong")
        both_slots = torch.equal(signal_inbox[0], expected) and torch.equal(
            signal_inbox[1], expected
        )
        tally.check(both_slots, f"put_signal bench data of {num_bytes} B wrong")
        count = words.view(torch.int64).item()
        tally.check(
            count == OPS_PER_GRAPH,
            f"put_signal bench: signal word {count} after a batch, expected {OPS_PER_GRAPH}",
        )
        rows.append(row)
        del inbox, signal_inbox, words
        dist.barrier()  # the partner's checks are done before the next size reallocates
    if me != 0:
        return
    report(rows, csv_path)


def report(rows: List[Dict[str, object]], csv_path: Optional[str]) -> None:
    """Rank 0: the table on stdout and, with --csv, the CSV with its provenance."""
    name = torch.cuda.get_device_name()
    nvshmem_version = ".".join(map(str, nv.library_info()[1]))
    nccl_version = ".".join(map(str, torch.cuda.nccl.version()))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"\nexchange between PE 0 and PE 1 ({name}, torch {torch.__version__}, NVSHMEM "
        f"{nvshmem_version}, NCCL {nccl_version}, {date}); time per exchange in us "
        f"(median of {NUM_SAMPLES} x {OPS_PER_GRAPH}), bandwidth = bytes / graph time"
    )
    labels = {
        "put_signal": "put_signal",
        "nccl": "nccl",
        "put_barrier": "put+barrier",
    }
    width = 12 * len(SYSTEMS)
    print(
        f"{'':>10} {' graph (us) '.center(width, '-')} {' eager (us) '.center(width, '-')} "
        f"{' GB/s (graph) '.center(width, '-')}"
    )
    names = "".join(f"{labels[s]:>12}" for s in SYSTEMS)
    print(f"{'bytes':>10} {names} {names} {names}")
    for r in rows:
        b = r["bytes"]
        graph = "".join(f"{r[f'{s}_graph_us']:>12.2f}" for s in SYSTEMS)
        eager = "".join(f"{r[f'{s}_eager_us']:>12.2f}" for s in SYSTEMS)
        rate = "".join(f"{b / r[f'{s}_graph_us'] / 1e3:>12.2f}" for s in SYSTEMS)
        print(f"{b:>10} {graph} {eager} {rate}", flush=True)
    if csv_path:
        keys = ["bytes"] + [f"{s}_{m}_us" for m in MODES for s in SYSTEMS]
        with open(csv_path, "w") as f:
            f.write(f"# scripts/ch03_put_get.py --bench, {date}, 2 PEs (pair 0<->1)\n")
            f.write(
                f"# gpu={name} torch={torch.__version__} nccl={nccl_version} "
                f"nvshmem={nvshmem_version} K={OPS_PER_GRAPH} S={NUM_SAMPLES}\n"
            )
            for method in METHODS:
                f.write(f"# {method}\n")
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join(str(r[k]) for k in keys) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bench", action="store_true", help="time put_signal, put+barrier and NCCL exchanges"
    )
    parser.add_argument("--csv", help="rank 0 writes the benchmark table here")
    arguments = parser.parse_args()
    main("ch03_put_get.py", lambda: run(arguments))
