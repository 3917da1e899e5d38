#!/usr/bin/env python3
"""Writes every measured number the book quotes, from the committed results.

The pages never type a measured number: they include it from a generated snippet,
`{{#include generated/<page>.md:<snippet>}}`, and this script writes those snippets (tables,
single figures, the captions that say which machine and which day) from the CSVs and logs in
benchmarks/results/ and the captures in book/src/output/. It also copies the plots the pages
show into book/src/generated/.

    python3 scripts/gen_book.py           # rewrite book/src/generated/
    python3 scripts/gen_book.py --check   # exit 1 if anything there is stale (scripts/test.sh)

Which file is the result of record for each table is decided in one place, MANIFEST in
scripts/bookgen/common.py: when a new run is committed (say benchmarks/results/coll_h100_4gpu.csv), point its entry at
the new file, run this script, and read the pages it changed. The device and the date a page
quotes come from each result's own `# gpu:` and `# date:` header lines, never from here.

It also writes chapter 7's table of bad inputs (generated/bad_inputs.md) from the tests that
cover them: the cases of src/bad_inputs.rs, read from the source, and DEVICE_GUARDS (in
scripts/bookgen/bad_inputs.py) for what only the GPU can see. A named test or message that is gone stops the script.

Some sentences of the book state a comparison ("the copy engine wins from 64 MiB"); where the
data decides such a sentence, a `claim(...)` in its generator checks it, and a result that contradicts the
prose stops the script with a message naming the page to rewrite.

The generators of this file are by chapter; scripts/bookgen/ holds what they share (common.py,
collectives.py) and the two longest: chapter 7's table of bad inputs (bad_inputs.py) and
Appendix A's cost model (cluster.py).

Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from bookgen.bad_inputs import gen_bad_inputs
from bookgen.cluster import gen_cluster
from bookgen.inter_node import gen_ch05
from bookgen.overlap import gen_ch06, gen_moe
from bookgen.collectives import COLL_LABEL, COLLECTIVES, PUTS, Coll, size_table
from bookgen.common import (
    Book,
    CAPTURES,
    claim,
    gbs,
    GenError,
    KIB,
    MANIFEST,
    MIB,
    numbers_in,
    OUT_DIR,
    ratio,
    Result,
    ROOT,
    size_label,
    Snippets,
    span,
    table,
    us,
    xspan,
)

# ---- captures (every page) -------------------------------------------------------------------------


def gen_captures(book: Book) -> None:
    """One caption per capture: 'machine, captured date at commit X'."""
    s = Snippets("captures")
    for name in sorted(book.captures.rows):
        if not (ROOT / "book/src/output" / name).is_file():
            raise GenError(f"{CAPTURES}: row for {name}, which is not in book/src/output/")
        anchor = re.sub(r"[^a-z0-9]+", "_", name.lower().removesuffix(".txt")).strip("_")
        s.add(anchor, book.captures.caption(name))
    book.write(s)


# ---- chapter 1 -----------------------------------------------------------------------------------


def gen_ch01(book: Book) -> None:
    s = Snippets("ch01")
    times = []
    for name in ("ch01-bootstrap-n1.txt", "ch01-bootstrap-n2.txt"):
        times += numbers_in(book.captures.text(name), r"initialised in ([\d.]+) ms")
    if not times:
        raise GenError("ch01 captures: no 'initialised in X ms' lines")
    s.add("init_ms", f"{span(times, lambda v: f'{v:.0f}')} ms")
    claim(min(times) > 100, "ch01-bootstrap.md", "initialisation takes hundreds of milliseconds")
    book.write(s)


# ---- chapter 2 -----------------------------------------------------------------------------------


def gen_ch02(book: Book) -> None:
    s = Snippets("ch02")
    text = book.captures.text("ch02-symmetric-memory-n2.txt")
    distances = {int(v) for v in numbers_in(text, r"second - first = (\d+) bytes")}
    if len(distances) != 1:
        raise GenError(f"ch02 capture: expected one allocation distance, found {sorted(distances)}")
    distance = distances.pop()
    # The page explains the distance from the request: 1000 bytes aligned to 256 reserve
    # 1000 + 256 bytes, rounded up to NVSHMEM's 512-byte granule.
    claim(distance == -(-(1000 + 256) // 512) * 512, "ch02-symmetric-memory.md",
          "the allocation distance is 1000 + 256 bytes rounded up to 512")
    s.add("distance", f"{distance} bytes")
    words = {int(v) for v in numbers_in(text, r"stored (\d+) words")}
    if len(words) != 1:
        raise GenError("ch02 capture: expected one 'stored N words' count")
    count = words.pop()
    s.add("stored", f"{count:,} words ({size_label(count * 4)})")
    heap = book.captures.text("ch02-symmetric-memory-small-heap.txt")
    claim("NVSHMEM grew the heap" in heap, "ch02-symmetric-memory.md",
          "with a 256 MiB heap, the 512 MiB allocation succeeded")
    book.write(s)


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
    claim(min(best_ratios) > 0.99, "ch03-measuring.md",
          "the best put is as fast as fenced stores at every size (within 1%)")

    # Where NVSHMEM's own put loses.
    small = [z for z in sizes if z <= 4 * MIB]
    large = [z for z in sizes if z >= 16 * MIB]
    s.add("nvshmem_vs_fenced_small", xspan([bw("nvshmem_put", z) / bw("store_fenced", z) for z in small], 2))
    s.add("nvshmem_vs_fenced_large", xspan([bw("nvshmem_put", z) / bw("store_fenced", z) for z in large], 3))
    s.add("nvshmem_extra_small", f"{span([t('nvshmem_put', z) - t('store_fenced', z) for z in small], lambda v: us(v, 2))} us")
    claim(all(bw("nvshmem_put", z) < bw("store_fenced", z) for z in sizes), "ch03-measuring.md",
          "NVSHMEM's put is slower than fenced stores at every size")
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
    claim(all(bw("nvshmem_put", z) >= bw("nccl", z) for z in sizes), "ch03-measuring.md",
          "NVSHMEM's put is at least as fast as NCCL at every size")

    # The put written as stores.
    others = [z for z in sizes if z != top]
    s.add("store_put_top", f"{gbs(bw('store_put', top))} GB/s")
    claim(all(bw("store_put", z) >= 0.99 * best_put(z) for z in others), "ch03-measuring.md",
          "the put written as stores is within 1% of the best put below the largest size")
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


# ---- chapter 4 -----------------------------------------------------------------------------------

TABLE_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB]


def coll_table(c: Coll) -> str:
    rows = []
    for size in TABLE_SIZES:
        cells = [size_label(size)]
        for collective in COLLECTIVES:
            ours, _ = c.ours(collective, size)
            peer, label = c.best_peer(collective, size)
            cells.append(f"{us(ours)} / {us(peer)} {label}")
        rows.append(cells)
    return table(["size"] + [f"{COLL_LABEL[x]}: ours / best peer" for x in COLLECTIVES], ["r"] * 6, rows)


def gen_ch04(book: Book) -> None:
    s = Snippets("ch04")
    table_rows = size_table()
    runs = {key: Coll(book.result(key), table_rows) for key in ("coll_n2", "coll_n4")}
    for key, c in runs.items():
        r = c.r
        s.add(f"{key}_run", f"{r.device}, {r.date}")
        s.add(f"{key}_table", coll_table(c) + "\n\n" +
              f"*Time per call in us, CUDA-graph replay; ours: the size table's choice; best peer: the fastest of "
              f"NCCL, torch SymmetricMemory{' and NVSHMEM' if c.has_nvshmem() else ''} at that size. "
              f"`{r.path}`: {r.device}, {r.date}.*" + book.caveat(key))
        ours128 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="direct_128tok")]
        ours4096 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="direct_4096tok")]
        vdev128 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="vdev_128tok")]
        vdev4096 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="vdev_4096tok")]
        if not (ours128 and ours4096 and vdev128 and vdev4096):
            raise GenError(f"{r.path}: all_to_all_v rows missing")
        s.add(f"{key}_a2av", f"128 tokens {us(ours128[0])} us, 4096 tokens {us(ours4096[0])} us, against "
              f"{us(vdev128[0])} and {us(vdev4096[0])} us for torch's NVSHMEM-backed `all_to_all_vdev`")
        sync = r.value("us", collective="barrier", algorithm="signal")
        barrier = r.value("us", collective="barrier", algorithm="barrier_all_on_stream")
        s.add(f"{key}_barriers", f"our `sync_all` {us(sync)} us, `nvshmemx_barrier_all_on_stream` {us(barrier)} us")
        for collective in COLLECTIVES:
            s.add(f"{key}_plot_{collective}", book.figure(
                MANIFEST[key]["plots"].format(collective),
                f"{COLL_LABEL[collective]} time per call against size, every algorithm and peer, {r.device}",
                f"{COLL_LABEL[collective]}: {r.device}, {r.date} (`{MANIFEST[key]['plots'].format(collective)}`)."))

        # NVSHMEM's own team collectives: measured rows, or a plain statement that there are none.
        if c.has_nvshmem():
            rows = []
            for size in TABLE_SIZES:
                cells = [size_label(size)]
                for collective in COLLECTIVES:
                    nv = c.us(collective, size, "nvshmem")
                    ours, _ = c.ours(collective, size)
                    cells.append(f"{us(ours)} / {us(nv)}" if nv is not None else f"{us(ours)} / -")
                rows.append(cells)
            setting = next((line for line in r.comments if line.startswith("nvshmem peer:")), "")
            timed_to = re.search(r"timed up to (\d+ MiB)", setting)
            cap = f"; -: not timed, NVSHMEM's rows stop at {timed_to.group(1)}" if timed_to else ""
            claim("NVSHMEM_DISABLE_NCCL=1" in setting, "ch04-measuring.md",
                  "NVSHMEM's row was timed with NVSHMEM_DISABLE_NCCL=1 (its CSV header says so)")
            s.add(f"{key}_nvshmem", table(["size"] + [f"{COLL_LABEL[x]}: ours / NVSHMEM" for x in COLLECTIVES], ["r"] * 6, rows)
                  + f"\n\n*NVSHMEM's team collectives on the stream over the world team, NVSHMEM_DISABLE_NCCL=1; "
                  f"time per call in us{cap}. `{r.path}`: {r.device}, {r.date}.*")
        else:
            s.add(f"{key}_nvshmem", f"*Not measured yet at N = {c.n}: `{r.path}` ({r.device}, {r.date}) has no "
                  "`nvshmem` rows. `benchmarks/run_coll.sh` records them (`ch04-coll-bench --nvshmem`, with "
                  "NVSHMEM_DISABLE_NCCL=1) from its next run on.*")

    # What the numbers teach (N = 2 and N = 4).
    def ratios(c: Coll, collectives: Sequence[str], sizes: Sequence[int], against: str) -> List[float]:
        out = []
        for collective in collectives:
            for size in sizes:
                ours, _ = c.ours(collective, size)
                peer = c.us(collective, size, "nccl") if against == "nccl" else c.best_peer(collective, size)[0]
                out.append(ours / peer)
        return out

    n2, n4 = runs["coll_n2"], runs["coll_n4"]
    small = [z for z in n2.sizes() if z <= 256 * KIB]
    s.add("small_vs_nccl", " and ".join(
        f"{xspan([1 / x for x in ratios(c, COLLECTIVES, small, 'nccl')], 1)} at N = {c.n}" for c in (n2, n4)))
    s.add("small_us", " and ".join(
        f"{span([c.ours(x, z)[0] for x in COLLECTIVES for z in small], lambda v: us(v))} us at N = {c.n}" for c in (n2, n4)))
    claim(all(r < 1 for c in (n2, n4) for r in ratios(c, COLLECTIVES, small, "best")), "ch04-measuring.md",
          "up to 256 KiB ours beats the best peer for every collective")
    s.add("sync_all_n2", f"{us(n2.r.value('us', collective='barrier', algorithm='signal'))} us")
    s.add("one_shot_1k_n2", f"{us(n2.ours('all_gather', KIB)[0])} us")

    def busbw(c: Coll, collective: str, size: int, method: str, algorithm: Optional[str] = None) -> float:
        rows = [r for r in c.r.select(collective=collective, num_bytes=size, method=method)
                if algorithm is None or r["algorithm"] == algorithm]
        return max(float(r["busbw_gb_per_s"]) for r in rows)

    top = 256 * MIB
    parts = []
    for c in (n2, n4):
        for collective in ("all_gather", "reduce_scatter"):
            _, algorithm = c.ours(collective, top)
            parts.append(f"{COLL_LABEL[collective]} at N = {c.n}: {gbs(busbw(c, collective, top, 'ours', algorithm))} "
                         f"against NCCL's {gbs(busbw(c, collective, top, 'nccl'))}")
    s.add("busbw_top", "; ".join(parts))

    mid = [z for z in n2.sizes() if MIB <= z <= 64 * MIB]
    torch2 = []
    for c in (n2, n4):
        for z in mid:
            t = c.us("all_reduce", z, "torch_symm", "two_shot")
            if t is not None:
                torch2.append((c.n, c.ours("all_reduce", z)[0] / t))
    s.add("allreduce_vs_torch", " and ".join(
        f"{xspan([x for n, x in torch2 if n == c.n], 2)} at N = {c.n}" for c in (n2, n4) if any(n == c.n for n, _ in torch2)))

    # Where we are slower than the best peer, every such cell: the honest list.
    slower = []
    for c in (n2, n4):
        for collective in COLLECTIVES:
            for size in c.sizes():
                ours, _ = c.ours(collective, size)
                peer, label = c.best_peer(collective, size)
                if ours > peer * 1.005:
                    slower.append((c.n, collective, size, ours / peer, label))
    claim(all(n == 4 and ((col == "all_reduce" and z >= 128 * MIB) or (col == "broadcast" and z >= 16 * MIB))
              for n, col, z, _, _ in slower)
          and any(col == "all_reduce" for _, col, _, _, _ in slower)
          and any(col == "broadcast" for _, col, _, _, _ in slower), "ch04-measuring.md",
          "the only misses are the large all-reduce and the broadcast from 16 MiB, both at N = 4")
    closest = {(c.n, z): c.best_peer("all_reduce", z)[1] for c in (n2, n4) for z in small}
    claim(all("torch" in label or "NVSHMEM" in label for label in closest.values())
          and sum("torch" in label for label in closest.values()) > len(closest) / 2, "ch04-measuring.md",
          "torch's symmetric-memory kernels are the closest peer for most small all-reduces, NVSHMEM's for the rest")
    nv_best = [f"{size_label(z)} at N = {n}" for (n, z), label in sorted(closest.items()) if "NVSHMEM" in label]
    s.add("small_allreduce_closest",
          "torch's symmetric-memory kernels, which handshake before they move data, are the closest peer for "
          "all-reduce" + (f" (NVSHMEM's own team all-reduce at {', '.join(nv_best)})" if nv_best else ""))
    if slower:
        lines = [f"- {COLL_LABEL[col]} at N = {n}, {size_label(z)}: {ratio(x)} the time of {label}"
                 for n, col, z, x, label in slower]
        s.add("slower", "\n".join(lines))
    else:
        s.add("slower", "- none: ours is at or below the best peer at every size of every collective measured")

    # Chapter 3's sweep, quoted for the round-robin pieces.
    sweep, p2p = book.result("p2p", "sweep"), book.result("p2p")
    def best_blocks(blocks: int) -> float:
        return max(float(r["gb_per_s"]) for r in sweep.select(method="store_put", num_blocks=blocks, num_bytes=top))
    s.add("slices_132", gbs(best_blocks(132)))
    s.add("slices_528", gbs(best_blocks(528)))
    s.add("p2p_run", f"{p2p.device}, {p2p.date}")
    claim(best_blocks(528) > best_blocks(132), "ch04-collectives.md", "528 slices beat 132 at 256 MiB")
    book.write(s)


# ---- chapter 7 -----------------------------------------------------------------------------------


def test_best(log: str, path: str) -> Dict[str, float]:
    """DeepEP's test_intranode.py printout: its best GB/s per operation, and the layout time."""
    best = {}
    for key, pattern in (("fp8", r"Best dispatch \(FP8\):.*?([\d.]+) GB/s"),
                         ("bf16", r"Best dispatch \(BF16\):.*?([\d.]+) GB/s"),
                         ("combine", r"Best combine:.*?([\d.]+) GB/s")):
        found = re.search(pattern, log)
        if not found:
            raise GenError(f"{path}: no '{pattern}' line")
        best[key] = float(found.group(1))
    found = re.search(r"\[layout\] Kernel performance: ([\d.]+) ms", log)
    if not found:
        raise GenError(f"{path}: no '[layout] Kernel performance' line")
    best["layout_us"] = float(found.group(1)) * 1e3
    return best


def gen_ch07(book: Book) -> None:
    s = Snippets("ch07")
    summary = {}
    for key in ("buffer_ep2", "buffer_ep4"):
        r = book.result(key)
        ep = int(r.rows[0]["ep"])
        ours_log = book.log(key, "ours_test")
        claim("exit 0" in ours_log and " failed" not in ours_log.replace("0 failed", ""), "ch07-measuring.md",
              f"DeepEP's test_intranode.py passes against ours ({MANIFEST[key]['ours_test']})")
        ours_test = test_best(ours_log, MANIFEST[key]["ours_test"])
        deepep_test = test_best(book.log(key, "deepep_test"), MANIFEST[key]["deepep_test"])

        def bench(method: str, op: str, dtype: str, sms: int = 24) -> float:
            return r.value("gb_per_s", method=method, op=op, dtype=dtype, num_sms=sms)

        ops = [("dispatch", "bf16", "bf16"), ("dispatch", "fp8", "fp8"), ("combine", "bf16", "combine")]
        test_row_d = [f"{gbs(deepep_test[k])} GB/s" for _, _, k in ops]
        test_row_o = [f"{gbs(ours_test[k])} GB/s ({ratio(ours_test[k] / deepep_test[k])})" for _, _, k in ops]
        bench_row_d = [gbs(bench("deepep", op, dt)) for op, dt, _ in ops]
        bench_row_o = [f"{gbs(bench('ours', op, dt))} ({ratio(bench('ours', op, dt) / bench('deepep', op, dt))})" for op, dt, _ in ops]
        chunk = {op: r.one(method="deepep", op=op, dtype="bf16", num_sms=24)["chunk"] for op in ("dispatch", "combine")}
        deepep_chunks = f"dispatch chunk {chunk['dispatch']}, combine chunk {chunk['combine']}"
        s.add(f"{key}_table", table(
            [f"24 SMs, EP{ep}", "dispatch bf16", "dispatch fp8", "combine"], ["l", "r", "r", "r"],
            [["DeepEP, its test's best config"] + test_row_d,
             ["ours, the same test"] + test_row_o,
             [f"DeepEP, buffer_bench ({deepep_chunks})"] + bench_row_d,
             ["ours, buffer_bench"] + bench_row_o]) +
            f"\n\n*GB/s = received bytes / time (the test's \"NVL GB/s\"); 4096 tokens x 7168 per rank, top-8 of 256 experts. "
            f"`{r.path}` with DeepEP's printouts `{MANIFEST[key]['deepep_test']}` and ours `{MANIFEST[key]['ours_test']}`: "
            f"{r.device}, {r.date}.*" + book.caveat(key))
        s.add(f"{key}_run", r.provenance())
        s.add(f"{key}_plot", book.figure(MANIFEST[key]["plot"], f"bandwidth against SMs, ours and DeepEP, EP{ep}",
                                         f"`{MANIFEST[key]['plot']}`: {r.device}, {r.date}."))
        summary[ep] = (ours_test, deepep_test, r, bench)
        s.add(f"{key}_test_ratios", " / ".join(ratio(ours_test[k] / deepep_test[k]) for _, _, k in ops))
        # The layout step: ours is slower, in DeepEP's test and in buffer_bench.
        layout_o, layout_d = r.value("us", method="ours", op="layout"), r.value("us", method="deepep", op="layout")
        s.add(f"{key}_layout", f"{us(ours_test['layout_us'], 0)} us against DeepEP's {us(deepep_test['layout_us'], 0)} us "
              f"in DeepEP's test, {us(layout_o)} against {us(layout_d)} us in `buffer_bench`")
        claim(ours_test["layout_us"] > deepep_test["layout_us"], "ch07-measuring.md", "our layout step is slower than DeepEP's")
        # 12 SMs against DeepEP's 24.
        s.add(f"{key}_sms12", ", ".join(
            f"{label} {gbs(bench('ours', op, dt, 12))} GB/s with 12 SMs against DeepEP's {gbs(bench('deepep', op, dt, 12))} with 12 "
            f"and {gbs(bench('deepep', op, dt, 24))} with 24" for (op, dt, _), label in zip(ops, ("bf16 dispatch", "fp8 dispatch", "combine"))))
    o2, d2, _, _ = summary[2]
    o4, d4, _, _ = summary[4]
    claim(all(o2[k] > d2[k] for k in ("fp8", "bf16", "combine")), "ch07-measuring.md", "at EP2 ours beats DeepEP in its own test")
    claim(all(o4[k] > d4[k] for k in ("fp8", "bf16")), "ch07-measuring.md", "at EP4 dispatch beats DeepEP in its own test")
    claim(0.9 < o4["combine"] / d4["combine"] < 1.1, "ch07-measuring.md", "EP4 combine is level with DeepEP's in its test")
    s.add("ep4_combine_ratio", ratio(o4["combine"] / d4["combine"]))
    s.add("ep4_combine", f"{gbs(o4['combine'])} against {gbs(d4['combine'])} GB/s")
    book.write(s)


# ---- chapter 8 -----------------------------------------------------------------------------------

LL_ROWS = [
    ("dispatch (kernel)", [("dispatch", "kernel")]),
    ("combine (kernel)", [("combine", "kernel")]),
    ("dispatch send + recv (hook)", [("dispatch_send", "kernel"), ("dispatch_recv", "kernel")]),
    ("combine send + recv (hook)", [("combine_send", "kernel"), ("combine_recv", "kernel")]),
    ("dispatch + combine (CUDA graph replay)", [("dispatch_combine", "graph")]),
    ("dispatch + combine (eager, DeepEP's bench)", [("dispatch_combine", "eager")]),
    ("host CPU per eager pair", [("dispatch_combine", "host")]),
]


def ll_test(log: str) -> Dict[str, List[float]]:
    """DeepEP's test_low_latency.py printout, per rank: the pair, dispatch, combine avg_t (us)."""
    return {
        "pair": [float(x) for x in re.findall(r"Dispatch \+ combine bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "dispatch": [float(x) for x in re.findall(r"Dispatch bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "combine": [float(x) for x in re.findall(r"Combine bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "buffer_mb": [float(x) for x in re.findall(r"Allocating buffer size: ([\d.]+) MB", log)],
    }


def gen_ch08(book: Book) -> None:
    s = Snippets("ch08")
    cells: Dict[int, Tuple[Result, Callable[[str, str, str], float]]] = {}
    for key in ("ll_ep2", "ll_ep4"):
        r = book.result(key)
        ep = int(r.rows[0]["ep"])
        cells[ep] = (r, lambda method, op, timing, r=r: r.value("us", method=method, op=op, timing=timing))
    rows = []
    for label, parts in LL_ROWS:
        row = [label]
        for ep in sorted(cells):
            _, v = cells[ep]
            d = [v("deepep", op, t) for op, t in parts]
            o = [v("ours", op, t) for op, t in parts]
            row += [" + ".join(us(x) for x in d), " + ".join(us(x) for x in o),
                    " / ".join(ratio(a / b) for a, b in zip(o, d))]
        rows.append(row)
    header = [""]
    for ep in sorted(cells):
        header += [f"EP{ep} DeepEP v1", f"EP{ep} ours", "ours / DeepEP"]
    r2, r4 = cells[2][0], cells[4][0]
    s.add("table", table(header, ["l"] + ["r"] * (len(header) - 1), rows) +
          f"\n\n*Microseconds, means over the ranks; 128 tokens x 7168 per rank, top-8 of 288 experts, fp8 dispatch, "
          f"bf16 combine. `{r2.path}`: {r2.provenance()}; `{r4.path}`: {r4.provenance()}.*")
    s.add("ep2_run", r2.provenance())
    s.add("ep4_run", r4.provenance())
    s.add("plot", book.figure(MANIFEST["ll_ep2"]["plot"], "Low-latency times, ours and DeepEP v1, EP2",
                              f"`{MANIFEST['ll_ep2']['plot']}`: {r2.device}, {r2.date}."))
    v2, v4 = cells[2][1], cells[4][1]
    def rr(v, op, timing):
        return v("ours", op, timing) / v("deepep", op, timing)
    # Phrases that read on their own: "0.85x DeepEP's kernel time at EP2 and 0.89x at EP4".
    def both(op: str, timing: str, what: str) -> str:
        return f"{ratio(rr(v2, op, timing))} DeepEP's {what} at EP2 and {ratio(rr(v4, op, timing))} at EP4"
    s.add("combine_ratios", both("combine", "kernel", "kernel time"))
    s.add("graph_ratios", both("dispatch_combine", "graph", "time"))
    s.add("dispatch_ratios", both("dispatch", "kernel", "kernel time"))
    s.add("ep4_dispatch_ratio", f"{ratio(rr(v4, 'dispatch', 'kernel'))} DeepEP's kernel time")
    s.add("ep4_dispatch_send", f"{us(v4('ours', 'dispatch_send', 'kernel'))} against {us(v4('deepep', 'dispatch_send', 'kernel'))} us")
    claim(rr(v2, "combine", "kernel") < 1 and rr(v4, "combine", "kernel") < 1, "ch08-python-graphs.md", "combine beats DeepEP at EP2 and EP4")
    claim(rr(v4, "dispatch", "kernel") > 1, "ch08-python-graphs.md", "dispatch at EP4 is slower than DeepEP's")
    claim(rr(v4, "dispatch_send", "kernel") > rr(v4, "dispatch_recv", "kernel"), "ch08-python-graphs.md",
          "at EP4 the dispatch send, not the receive, is where the gap is")
    # The eager path: ours is slower, with the host time per pair as the reason.
    eager = []
    for ep in sorted(cells):
        v = cells[ep][1]
        eager.append(f"EP{ep}: {us(v('ours', 'dispatch_combine', 'eager'))} us per eager pair against DeepEP's "
                     f"{us(v('deepep', 'dispatch_combine', 'eager'))} ({ratio(rr(v, 'dispatch_combine', 'eager'))}), with "
                     f"{us(v('ours', 'dispatch_combine', 'host'))} against {us(v('deepep', 'dispatch_combine', 'host'))} us "
                     f"of host CPU per pair")
    s.add("eager", "; ".join(eager))
    # DeepEP's own test, for both.
    tests = []
    for key in ("ll_ep2", "ll_ep4"):
        claim("exit 0" in book.log(key, "ours_test"), "ch08-python-graphs.md",
              f"DeepEP's test_low_latency.py passes against ours ({MANIFEST[key]['ours_test']})")
        ours, deepep = ll_test(book.log(key, "ours_test")), ll_test(book.log(key, "deepep_test"))
        for name in ("pair", "dispatch", "combine"):
            if not ours[name] or not deepep[name]:
                raise GenError(f"{MANIFEST[key]['ours_test']} / {MANIFEST[key]['deepep_test']}: no {name} lines")
        ep = int(book.result(key).rows[0]["ep"])
        tests.append([f"EP{ep}", f"{span(ours['dispatch'], us)} / {span(deepep['dispatch'], us)}",
                      f"{span(ours['combine'], us)} / {span(deepep['combine'], us)}",
                      f"{span(ours['pair'], us)} / {span(deepep['pair'], us)}"])
        claim(min(ours["pair"]) > max(deepep["pair"]), "ch08-python-graphs.md",
              "in DeepEP's own test our eager dispatch + combine line is slower")
        if key == "ll_ep2":
            s.add("hint_mb", f"{ours['buffer_mb'][0]:.1f} MB")
            s.add("deepep_hint_mb", f"{deepep['buffer_mb'][0]:.1f} MB")
    s.add("test_table", table(["DeepEP's test_low_latency.py, us per call (range over ranks)", "dispatch: ours / DeepEP",
                               "combine: ours / DeepEP", "\"Dispatch + combine\" line: ours / DeepEP"],
                              ["l", "r", "r", "r"], tests) +
          f"\n\n*The logs: `{MANIFEST['ll_ep2']['ours_test']}`, `{MANIFEST['ll_ep2']['deepep_test']}`, "
          f"`{MANIFEST['ll_ep4']['ours_test']}`, `{MANIFEST['ll_ep4']['deepep_test']}` ({r2.date}; {r4.date}).*")

    # Sizes from the layout formula at DeepEP's test shape (T = 128, H = 7168, E = 288).
    T, H, E = 128, 7168, 288
    half = E * T * (16 + 2 * H)
    s.add("half_mb", f"{half / 1e6:.0f} MB")
    fp8_message = 16 + H + H // 128 * 4
    fp8_message = -(-fp8_message // 16) * 16
    s.add("message_kb", f"{fp8_message / 1e3:.1f} KB")
    total = T * 8 * fp8_message
    s.add("messages_mb", f"{total / 1e6:.1f} MB")
    p2p = book.result("p2p")
    put4m = max(p2p.value("gb_per_s", method=m, num_bytes=4 * MIB) for m in PUTS)
    s.add("crossing", f"about {total / 2 / 1e6:.1f} MB, {us(total / 2 / (put4m * 1e3))} us at the "
          f"{gbs(put4m)} GB/s of chapter 3's best 4 MiB put")
    coll = book.result("coll_n2")
    s.add("launch_us", f"{us(coll.value('us', collective='barrier', algorithm='signal'))} us")
    s.add("put_signal_us", f"{us(p2p.value('us', method='put_signal_pingpong', num_bytes=8), 2)} us")
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

    # One step and one round trip, host-initiated against device-initiated (chapter 3).
    p2p = book.result("p2p")
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


# ---- main ----------------------------------------------------------------------------------------

GENERATORS: List[Callable[[Book], None]] = []  # filled below, in page order


def generate() -> Dict[str, bytes]:
    book = Book()
    for gen in GENERATORS:
        gen(book)
    return book.files


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with book/src/generated/ instead of writing")
    args = parser.parse_args(argv)
    try:
        files = generate()
    except GenError as error:
        print(f"gen_book: error: {error}", file=sys.stderr)
        return 1
    existing = {p.name: p.read_bytes() for p in OUT_DIR.glob("*") if p.is_file()} if OUT_DIR.is_dir() else {}
    if args.check:
        stale = sorted(name for name in files if existing.get(name) != files[name])
        extra = sorted(set(existing) - set(files))
        for name in stale:
            print(f"gen_book: stale or missing: book/src/generated/{name}", file=sys.stderr)
        for name in extra:
            print(f"gen_book: not generated any more: book/src/generated/{name}", file=sys.stderr)
        if stale or extra:
            print("gen_book: run `python3 scripts/gen_book.py` and commit book/src/generated/", file=sys.stderr)
            return 1
        print(f"gen_book: book/src/generated/ is up to date ({len(files)} files)")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in set(existing) - set(files):
        (OUT_DIR / name).unlink()
    changed = 0
    for name, data in sorted(files.items()):
        if existing.get(name) != data:
            (OUT_DIR / name).write_bytes(data)
            changed += 1
    print(f"gen_book: wrote book/src/generated/ ({len(files)} files, {changed} changed)")
    return 0


GENERATORS += [gen_captures, gen_ch01, gen_ch02, gen_ch03, gen_ch04, gen_ch05, gen_ch06, gen_ch07, gen_bad_inputs,
               gen_ch08, gen_moe, gen_python, gen_cluster]




if __name__ == "__main__":
    sys.exit(main())
