"""Chapter 3 (put/get and measuring it) and the PyTorch page, for scripts/gen_book.py."""

from __future__ import annotations

import math
import re

from .collectives import PUTS
from .common import (
    Book,
    claim,
    gbs,
    GenError,
    KIB,
    MANIFEST,
    MIB,
    ratio,
    size_label,
    Snippets,
    span,
    table,
    us,
    xspan,
)

# ---- chapter 3 -----------------------------------------------------------------------------------

P2P_COLUMNS = [
    ("nvshmem_put", "NVSHMEM put"),
    ("bulk_put", "bulk-copy put"),
    ("store_put", "put as stores"),
    ("store_fenced", "stores + fence"),
    ("store", "stores, no fence"),
    ("copy_engine", "copy engine"),
    ("nccl", "NCCL"),
]


def gen_ch03(book: Book) -> None:
    s = Snippets("ch03")
    p2p, sweep = book.result("p2p"), book.result("p2p", "sweep")
    if sweep.date != p2p.date:
        raise GenError(f"{sweep.path} ({sweep.date}) is not from the run of {p2p.path} ({p2p.date})")
    sizes = sorted({int(r["num_bytes"]) for r in p2p.select(method="nvshmem_put")})

    def bw(method: str, size: int) -> float:
        return p2p.value("gb_per_s", method=method, num_bytes=size)

    def t(method: str, size: int) -> float:
        return p2p.value("us", method=method, num_bytes=size)

    def best_put(size: int) -> float:
        return max(bw(m, size) for m in PUTS)

    driver = (p2p.header("driver") or "unknown").split(";")[0]
    versions = f"driver {driver}, NVSHMEM {p2p.header('nvshmem')}, NCCL {p2p.header('nccl')}"
    s.add("run", f"{p2p.device}, {p2p.date} ({versions})")

    rows = []
    for size in sizes:
        cells = [size_label(size)] + [gbs(bw(m, size)) for m, _ in P2P_COLUMNS]
        cells.append(ratio(best_put(size) / bw("store_fenced", size), 3))
        rows.append(cells)
    s.add("bandwidth_table", table(
        ["size"] + [label for _, label in P2P_COLUMNS] + ["best put / stores + fence"],
        ["r"] * (len(P2P_COLUMNS) + 2), rows) + "\n\n" +
        f"*GB/s = bytes moved by one operation / its median time. `{p2p.path}` (each kernel at its "
        f"best launch shape per size; every shape in `{sweep.path}`): {p2p.device}, {p2p.date}.*")

    latency_sizes = sorted({int(r["num_bytes"]) for r in p2p.select(method="put_signal_pingpong")})
    s.add("latency_table", table(
        ["size", "one-way, NVSHMEM putmem_signal ping-pong (one kernel)", "one-way, NCCL send/recv ping-pong (graph)"],
        ["r", "r", "r"],
        [[size_label(z), f"{us(t('put_signal_pingpong', z), 2)} us", f"{us(t('nccl_pingpong', z), 2)} us"]
         for z in latency_sizes]) + "\n\n" + p2p.source())
    s.add("plot", book.figure(
        MANIFEST["p2p"]["plot"],
        "Bandwidth against message size, one line per implementation; one-way latency of the two ping-pongs",
        f"{MANIFEST['p2p']['plot']}: {p2p.device}, {p2p.date}."))

    # One-way latency, quoted on both chapter 3 pages and later.
    ping8, nccl8 = t("put_signal_pingpong", 8), t("nccl_pingpong", 8)
    s.add("pingpong_8b", f"{us(ping8, 2)} us")
    s.add("nccl_pingpong_8b", f"{us(nccl8, 2)} us")
    s.add("nccl_over_put_pingpong", ratio(nccl8 / ping8, 1))
    s.add("pingpong_1k", f"{us(t('put_signal_pingpong', 1024), 2)} us")
    s.add("pingpong_16k_extra", f"{us(t('put_signal_pingpong', 16 * KIB) - ping8, 1)} us")
    claim(abs(t("put_signal_pingpong", 1024) - ping8) < 0.2, "ch03-measuring.md",
          "8 bytes and 1 KiB take the same one-way time")

    # Compare like with like: at 64 KiB and 1 MiB.
    k64, m1 = 64 * KIB, MIB
    s.add("store_64k", f"{us(t('store', k64), 2)} us")
    s.add("puts_64k", f"{span([t(m, k64) for m in PUTS], lambda v: us(v, 2))} us")
    s.add("fence_cost_64k", f"{us(t('store_fenced', k64) - t('store', k64), 2)} us")
    s.add("fenced_64k", f"{us(t('store_fenced', k64), 2)} us")
    s.add("fence_cost_1m", f"{us(t('store_fenced', m1) - t('store', m1), 2)} us")
    lost = next(z for z in sizes if t("store_fenced", z) < 1.05 * t("store", z))
    s.add("fence_lost_from", size_label(lost))
    best_ratios = [best_put(z) / bw("store_fenced", z) for z in sizes]
    s.add("best_put_vs_fenced", xspan(best_ratios, 3))
    claim(min(best_ratios) > 0.95, "ch03-measuring.md",
          "the best put is never more than 5% behind fenced stores")

    # Where NVSHMEM's own put loses.
    small = [z for z in sizes if z <= 4 * MIB]
    large = [z for z in sizes if z >= 16 * MIB]
    s.add("nvshmem_vs_fenced_small", xspan([bw("nvshmem_put", z) / bw("store_fenced", z) for z in small], 2))
    s.add("nvshmem_vs_fenced_large", xspan([bw("nvshmem_put", z) / bw("store_fenced", z) for z in large], 3))
    s.add("nvshmem_extra_small", f"{span([t('nvshmem_put', z) - t('store_fenced', z) for z in small], lambda v: us(v, 2))} us")
    claim(all(bw("nvshmem_put", z) < 1.01 * bw("store_fenced", z) for z in sizes), "ch03-measuring.md",
          "NVSHMEM's put is nowhere faster than fenced stores (by more than 1%)")
    s.add("store_put_64k", f"{us(t('store_put', k64), 2)} us")
    s.add("nvshmem_put_64k", f"{us(t('nvshmem_put', k64), 2)} us")
    claim(t("store_put", k64) < t("store_fenced", k64) < t("nvshmem_put", k64), "ch03-measuring.md",
          "at 64 KiB: put as stores < fenced stores < NVSHMEM put")
    up_to_1m = [z for z in sizes if z <= MIB]
    s.add("nccl_over_nvshmem_small", xspan([t("nccl", z) / t("nvshmem_put", z) for z in up_to_1m], 1))
    top = sizes[-1]
    s.add("top_size", size_label(top))
    s.add("nvshmem_top", f"{gbs(bw('nvshmem_put', top))} GB/s")
    s.add("nccl_top", f"{gbs(bw('nccl', top))} GB/s")
    claim(all(bw("nvshmem_put", z) >= bw("nccl", z) for z in sizes if z != top), "ch03-measuring.md",
          "NVSHMEM's put is at least as fast as NCCL below the largest size")
    claim(abs(bw("nvshmem_put", top) / bw("nccl", top) - 1) < 0.01, "ch03-measuring.md",
          "at the largest size NVSHMEM's put and NCCL are level (within 1%)")

    # The put written as stores.
    others = [z for z in sizes if z != top]
    s.add("store_put_top", f"{gbs(bw('store_put', top))} GB/s")
    behind = max(1 - bw("store_put", z) / best_put(z) for z in others)
    s.add("store_put_within", f"{math.ceil(100 * behind):.0f}%")
    claim(behind < 0.05, "ch03-measuring.md",
          "the put written as stores is within a few percent of the best put below the largest size")
    claim(bw("store_put", top) < 0.98 * best_put(top), "ch03-measuring.md",
          "the put written as stores falls behind at the largest size")

    # The launch-shape sweep at the largest size.
    def shape_bw(method: str, blocks: int, threads: int, size: int = top) -> float:
        found = [float(r["gb_per_s"]) for r in sweep.select(method=method, num_blocks=blocks, threads_per_block=threads, num_bytes=size)]
        if not found:
            raise GenError(f"{sweep.path}: no {method} {blocks}x{threads} at {size} B")
        return max(found)

    s.add("sweep_8x256", gbs(shape_bw("nvshmem_put", 8, 256)))
    s.add("sweep_8x512", gbs(shape_bw("nvshmem_put", 8, 512)))
    s.add("sweep_8x1024", gbs(shape_bw("nvshmem_put", 8, 1024)))
    s.add("sweep_stores_8x256", gbs(shape_bw("store_put", 8, 256)))
    s.add("sweep_unroll_gain", ratio(shape_bw("store_put", 8, 256) / shape_bw("nvshmem_put", 8, 256), 1))
    best_row = max(sweep.select(method="nvshmem_put", num_bytes=top), key=lambda r: float(r["gb_per_s"]))
    s.add("sweep_best", f"{best_row['num_blocks']} blocks x {best_row['threads_per_block']} threads "
          f"({best_row['scope']} scope), {gbs(float(best_row['gb_per_s']))} GB/s")
    claim(shape_bw("nvshmem_put", 8, 512) > 1.7 * shape_bw("nvshmem_put", 8, 256)
          and shape_bw("nvshmem_put", 8, 1024) > 1.7 * shape_bw("nvshmem_put", 8, 512), "ch03-measuring.md",
          "with 8 blocks, NVSHMEM's put bandwidth roughly doubles with the threads per block")
    claim(shape_bw("store_put", 8, 256) > 2 * shape_bw("nvshmem_put", 8, 256), "ch03-measuring.md",
          "four loads in flight per thread move several times more with the same threads")
    shapes = p2p.header("nvshmem_put") or ""
    found = re.findall(r"(\d+):(\w+):(\d+x\d+)", shapes)
    if not found:
        raise GenError(f"{p2p.path}: no '# nvshmem_put: best launch shape per size' line")
    s.add("best_shapes", ", ".join(f"{size_label(int(z))}: {shape.replace('x', ' x ')}" for z, _, shape in found))

    # Small transfers.
    s.add("nvshmem_16k", f"{us(t('nvshmem_put', 16 * KIB), 2)} us")
    s.add("nvshmem_64k", f"{us(t('nvshmem_put', k64), 2)} us")

    # The copy engine.
    big = [z for z in sizes if z >= 64 * MIB]
    s.add("copy_engine_big", f"{span([bw('copy_engine', z) for z in big], gbs)} GB/s")
    kernels = [bw(m, z) for z in big for m in ("nvshmem_put", "bulk_put", "store_put", "store", "store_fenced")]
    s.add("kernels_big", f"{span(kernels, gbs)} GB/s")
    s.add("big_from", size_label(big[0]))
    claim(min(bw("copy_engine", z) for z in big) > max(kernels), "ch03-measuring.md",
          "from 64 MiB the copy engine beats every kernel path")
    s.add("copy_engine_16k", f"{us(t('copy_engine', 16 * KIB), 1)} us")
    s.add("at_1m", f"plain stores {gbs(bw('store', m1))} GB/s without a fence and {gbs(bw('store_fenced', m1))} "
          f"with one, the copy engine {gbs(bw('copy_engine', m1))}")
    claim(all(bw("store", z) > bw("copy_engine", z) for z in sizes if z < 16 * MIB), "ch03-measuring.md",
          "below 16 MiB unfenced stores beat the copy engine")
    claim(bw("store_fenced", m1) < bw("copy_engine", m1) < bw("store", m1), "ch03-measuring.md",
          "at 1 MiB the copy engine sits between fenced and unfenced stores")
    book.write(s)


# ---- the PyTorch page ------------------------------------------------------------------------------


def gen_python(book: Book) -> None:
    s = Snippets("python")
    ex = book.result("py_exchange")
    sizes = [int(r["bytes"]) for r in ex.rows]

    def cell(size: int, column: str) -> float:
        return float(ex.one(bytes=size)[column])

    columns = [("put_signal_graph_us", "put_signal (graph)"), ("nccl_graph_us", "NCCL (graph)"),
               ("put_barrier_graph_us", "put + barrier (graph)"), ("put_signal_eager_us", "put_signal (eager)"),
               ("nccl_eager_us", "NCCL (eager)")]
    s.add("run", ex.provenance())
    s.add("exchange_table", table(["bytes"] + [label for _, label in columns], ["r"] * 6,
          [[size_label(z)] + [us(cell(z, c)) for c, _ in columns] for z in sizes]) +
          "\n\n*Microseconds per exchange, median of 7 batches. " + ex.source()[1:])
    big = [z for z in sizes if z >= 4 * MIB]
    claim(all(cell(z, "put_signal_graph_us") < cell(z, "nccl_graph_us") for z in big), "python.md",
          "from 4 MiB up NVSHMEM's puts win")
    top = max(sizes)
    s.add("big_from", size_label(big[0]))
    s.add("gbs_top", f"{size_label(top)}: {gbs(top / cell(top, 'put_signal_graph_us') / 1e3)} GB/s per direction "
          f"against NCCL's {gbs(top / cell(top, 'nccl_graph_us') / 1e3)}")
    small = [z for z in sizes if z <= 256 * KIB]
    s.add("nccl_small_lead", f"{span([cell(z, 'put_signal_graph_us') - cell(z, 'nccl_graph_us') for z in small], lambda v: us(v))} us")
    claim(all(cell(z, "nccl_graph_us") < cell(z, "put_signal_graph_us") for z in small), "python.md",
          "up to 256 KiB NCCL's exchange is faster")

    # One step and one round trip, host-initiated against device-initiated (chapter 3's run on
    # the exchange rows' GPU).
    p2p = book.result("py_p2p")
    step_ps, step_nccl = cell(8, "put_signal_graph_us"), cell(8, "nccl_graph_us")
    ping_nccl = p2p.value("us", method="nccl_pingpong", num_bytes=8)
    ping_put = p2p.value("us", method="put_signal_pingpong", num_bytes=8)
    rows = [
        ["host-initiated put_signal + wait_signal exchange, graph", f"{us(step_ps)} us", f"{us(2 * step_ps)} us"],
        ["NCCL `batch_isend_irecv` exchange, graph", f"{us(step_nccl)} us", f"{us(2 * step_nccl)} us"],
        ["NCCL send/recv ping-pong, graph (chapter 3)", f"{us(ping_nccl, 2)} us", f"{us(2 * ping_nccl, 2)} us"],
        ["device-initiated put-with-signal ping-pong, one kernel (chapter 3)", f"{us(ping_put, 2)} us", f"{us(2 * ping_put, 2)} us"],
    ]
    s.add("step_table", table(["8 bytes", "one step (waits for one message from the partner)", "round trip (two steps)"],
                              ["l", "r", "r"], rows) +
          f"\n\n*Exchanges: `{ex.path}` ({ex.provenance()}); ping-pongs: `{p2p.path}` ({p2p.provenance()}).*")
    s.add("step_put_signal", f"{us(step_ps)} us")
    s.add("ping_put", f"{us(ping_put, 2)} us")
    claim(step_ps > 3 * ping_put, "python.md", "a host-initiated step costs several times a device-initiated one")
    book.write(s)
