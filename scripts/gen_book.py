#!/usr/bin/env python3
"""Writes every measured number the book quotes, from the committed results.

The pages never type a measured number: they include it from a generated snippet,
`{{#include generated/<page>.md:<snippet>}}`, and this script writes those snippets (tables,
single figures, the captions that say which machine and which day) from the CSVs and logs in
benchmarks/results/ and the captures in book/src/output/. It also copies the plots the pages
show into book/src/generated/.

    python3 scripts/gen_book.py           # rewrite book/src/generated/
    python3 scripts/gen_book.py --check   # exit 1 if anything there is stale (scripts/test.sh)

Which file is the result of record for each table is decided in one place, MANIFEST below:
when a new run is committed (say benchmarks/results/coll_h100_4gpu.csv), point its entry at
the new file, run this script, and read the pages it changed. The device and the date a page
quotes come from each result's own `# gpu:` and `# date:` header lines, never from here.

It also writes chapter 7's table of bad inputs (generated/bad_inputs.md) from the tests that
cover them: the cases of src/bad_inputs.rs, read from the source, and DEVICE_GUARDS below for
what only the GPU can see. A named test or message that is gone stops the script.

Some sentences of the book state a comparison ("the copy engine wins from 64 MiB"); where the
data decides such a sentence, a `claim(...)` below checks it, and a result that contradicts the
prose stops the script with a message naming the page to rewrite.

Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "book" / "src" / "generated"
CAPTURES = "book/src/output/captures.tsv"

# ---- the results of record -------------------------------------------------------------------
#
# One entry per table family the book shows. `csv` is the result of record; the other paths
# belong to the same run (written by the same benchmark call). `caveat`, if set, is printed under
# every table from that entry: say there what the reader must know about the run (a kernel that
# changed since), and drop it when the entry points at a run of the current code.
#
# Chapters 4, 7 and 8 quote the 4x H100 calls of 2026-11-26 (binaries of ec48b45): the only runs
# of the current kernels at N = 4, and N = 2 from the same machine and binaries, so a chapter's
# tables compare like with like. Chapter 3 and the PyTorch page have one run each (2x H200).
# The earlier H200 runs of chapters 4, 7 and 8 (coll_h200_*, buffer_h200_*, buffer_ll_h200_*)
# stay in benchmarks/results/ with their notes.
MANIFEST: Dict[str, Dict[str, str]] = {
    # Chapter 3: ch03-p2p-bench through benchmarks/run_p2p.sh (2 GPUs).
    "p2p": {
        "csv": "benchmarks/results/p2p_h200.csv",
        "sweep": "benchmarks/results/p2p_h200_sweep.csv",
        "plot": "benchmarks/results/p2p_h200.png",
    },
    # Chapter 4: benchmarks/run_coll.sh N (ours, NCCL, torch, and NVSHMEM's team collectives).
    "coll_n2": {
        "csv": "benchmarks/results/coll_h100_2gpu.csv",
        "plots": "benchmarks/results/coll_h100_2gpu_{}.png",
    },
    "coll_n4": {
        "csv": "benchmarks/results/coll_h100_4gpu.csv",
        "plots": "benchmarks/results/coll_h100_4gpu_{}.png",
    },
    # Chapter 7: benchmarks/run_buffer.sh DEEPEP_DIR N (buffer_bench.py and DeepEP's
    # test_intranode.py for both, in one device call).
    "buffer_ep2": {
        "csv": "benchmarks/results/buffer_h100_ep2.csv",
        "ours_test": "benchmarks/results/deepep_compat_h100_ep2.log",
        "deepep_test": "benchmarks/results/deepep_test_intranode_deepep_h100_ep2.log",
        "plot": "benchmarks/results/buffer_h100_ep2.png",
    },
    "buffer_ep4": {
        "csv": "benchmarks/results/buffer_h100_ep4.csv",
        "ours_test": "benchmarks/results/deepep_compat_h100_ep4.log",
        "deepep_test": "benchmarks/results/deepep_test_intranode_deepep_h100_ep4.log",
        "plot": "benchmarks/results/buffer_h100_ep4.png",
    },
    # Chapter 8: benchmarks/run_buffer.sh (buffer_ll_bench.py and DeepEP's test_low_latency.py).
    "ll_ep2": {
        "csv": "benchmarks/results/buffer_ll_h100_ep2.csv",
        "ours_test": "benchmarks/results/deepep_compat_ll_h100_ep2.log",
        "deepep_test": "benchmarks/results/deepep_test_low_latency_deepep_h100_ep2.log",
        "plot": "benchmarks/results/buffer_ll_h100_ep2.svg",
    },
    "ll_ep4": {
        "csv": "benchmarks/results/buffer_ll_h100_ep4.csv",
        "ours_test": "benchmarks/results/deepep_compat_ll_h100_ep4.log",
        "deepep_test": "benchmarks/results/deepep_test_low_latency_deepep_h100_ep4.log",
        "plot": "benchmarks/results/buffer_ll_h100_ep4.svg",
    },
    # The PyTorch page: scripts/ch03_put_get.py --bench (2 GPUs).
    "py_exchange": {
        "csv": "benchmarks/results/python_exchange_h200.csv",
    },
}

# Source files whose content a snippet depends on besides the results (the staleness check
# regenerates from all of them).
SIZE_TABLE_SOURCE = "chapters/ch04-collectives/src/algorithm.rs"

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


class GenError(Exception):
    """A result that is missing, malformed, or contradicts a page's prose."""


def claim(condition: bool, page: str, what: str) -> None:
    """Stops the generator when the data no longer supports a sentence of `page`."""
    if not condition:
        raise GenError(f"{page}: the results no longer support: {what}. Rewrite that passage.")


# ---- formatting ----------------------------------------------------------------------------------


def size_label(num_bytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if num_bytes >= scale and num_bytes % scale == 0:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes} B"


def us(value: float, digits: Optional[int] = None) -> str:
    """Microseconds: 1 decimal, 2 below 10 us when asked for precision."""
    if digits is None:
        digits = 1
    return f"{value:.{digits}f}"


def gbs(value: float) -> str:
    return f"{value:.1f}"


def ratio(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}x"


def span(values: Sequence[float], fmt: Callable[[float], str], sep: str = "-") -> str:
    """'a-b' for the range of values, or one value when they print the same."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}{sep}{hi}"


def xspan(values: Sequence[float], digits: int = 2) -> str:
    """'0.89-0.95x' for a range of ratios."""
    return span(values, lambda v: f"{v:.{digits}f}") + "x"


def table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; `align` holds 'l' or 'r' per column."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" if a == "r" else "---" for a in align) + "|")
    for row in rows:
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# ---- reading results -----------------------------------------------------------------------------

DATE_RE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(?:-\d\d:\d\d)? UTC")


class Result:
    """One CSV with `# ` header lines: its rows, and the device and date its header names."""

    def __init__(self, path: str):
        self.path = path
        full = ROOT / path
        if not full.is_file():
            raise GenError(f"{path}: missing (named in MANIFEST of scripts/gen_book.py)")
        lines = full.read_text().splitlines()
        self.comments = [line[1:].strip() for line in lines if line.startswith("#")]
        body = [line for line in lines if line and not line.startswith("#")]
        self.rows: List[Dict[str, str]] = list(csv.DictReader(body))

    def header(self, key: str) -> Optional[str]:
        for line in self.comments:
            if line.startswith(key + ":"):
                return line[len(key) + 1 :].strip()
        return None

    @property
    def date(self) -> str:
        for line in self.comments:
            if line.startswith("date:"):
                found = DATE_RE.search(line)
                if found:
                    return found.group(0)
        for line in self.comments:  # a first line that says "script, <date>, ..."
            found = DATE_RE.search(line)
            if found:
                return found.group(0)
        raise GenError(f"{self.path}: no '# date: YYYY-MM-DD HH:MM UTC' line in its header")

    @property
    def device(self) -> str:
        """'2x NVIDIA H200' from '# gpu: NVIDIA H200 x 2; ...' (or 'gpu=NVIDIA H200 ...', 'N PEs')."""
        for line in self.comments:
            found = re.match(r"gpu: (.+?) x (\d+)\b", line)
            if found:
                return f"{found.group(2)}x {found.group(1)}"
        for line in self.comments:
            found = re.search(r"gpu=(\S+(?: H\d+\S*)?)", line)
            if found:
                count = next((m.group(1) for c in self.comments for m in [re.search(r"(\d+) PEs", c)] if m), None)
                return f"{count}x {found.group(1)}" if count else found.group(1)
        raise GenError(f"{self.path}: no '# gpu: NAME x N' line in its header")

    def provenance(self) -> str:
        return f"{self.device}, {self.date}"

    def source(self) -> str:
        """The caption under a table: file, device, date."""
        return f"*`{self.path}`: {self.device}, {self.date}.*"

    def select(self, **match: object) -> List[Dict[str, str]]:
        return [r for r in self.rows if all(str(r.get(k)) == str(v) for k, v in match.items())]

    def one(self, **match: object) -> Dict[str, str]:
        found = self.select(**match)
        if len(found) != 1:
            raise GenError(f"{self.path}: expected one row with {match}, found {len(found)}")
        return found[0]

    def value(self, column: str, **match: object) -> float:
        return float(self.one(**match)[column])


def read_text(path: str) -> str:
    full = ROOT / path
    if not full.is_file():
        raise GenError(f"{path}: missing (named in scripts/gen_book.py)")
    return full.read_text()


class Captures:
    """book/src/output/captures.tsv: where and when each capture was recorded."""

    def __init__(self) -> None:
        lines = [line for line in read_text(CAPTURES).splitlines() if line and not line.startswith("#")]
        reader = csv.DictReader(lines, delimiter="\t")
        self.rows = {r["file"]: r for r in reader}

    def caption(self, name: str) -> str:
        row = self.rows.get(name)
        if row is None:
            raise GenError(f"{CAPTURES}: no row for {name} (scripts/capture_outputs.sh writes one)")
        return f"{row['machine']}, captured {row['date']} at commit {row['commit']}"

    def text(self, name: str) -> str:
        return read_text(f"book/src/output/{name}")


# ---- the snippets --------------------------------------------------------------------------------


class Snippets:
    """The snippets of one generated file, book/src/generated/<name>.md."""

    def __init__(self, name: str, origin: str = "the results of record (its MANIFEST)"):
        self.name = name
        self.origin = origin
        self.items: List[Tuple[str, str]] = []

    def add(self, anchor: str, text: str) -> None:
        if any(a == anchor for a, _ in self.items):
            raise GenError(f"generated/{self.name}.md: snippet {anchor} written twice")
        if not re.fullmatch(r"[a-z0-9_]+", anchor):
            raise GenError(f"bad snippet name {anchor!r}")
        self.items.append((anchor, text.strip("\n")))

    def render(self) -> str:
        parts = [
            f"<!-- Generated by scripts/gen_book.py from {self.origin}; do not edit. Pages "
            "include these snippets by anchor. -->"
        ]
        for anchor, text in self.items:
            parts.append(f"<!-- ANCHOR: {anchor} -->\n{text}\n<!-- ANCHOR_END: {anchor} -->")
        return "\n\n".join(parts) + "\n"


class Book:
    """Everything generated: snippet files and copied figures, by path under OUT_DIR."""

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}
        self.results: Dict[str, Result] = {}
        self.captures = Captures()

    def result(self, key: str, part: str = "csv") -> Result:
        name = f"{key}.{part}"
        if name not in self.results:
            entry = MANIFEST.get(key)
            if entry is None or part not in entry:
                raise GenError(f"MANIFEST has no {part!r} for {key!r}")
            self.results[name] = Result(entry[part])
        return self.results[name]

    def log(self, key: str, part: str) -> str:
        return read_text(MANIFEST[key][part])

    def caveat(self, key: str) -> str:
        text = MANIFEST[key].get("caveat")
        return f"\n\n*{text}*" if text else ""

    def figure(self, source: str, alt: str, caption: str) -> str:
        """Copies a plot into generated/ and returns the Markdown that shows it."""
        data = (ROOT / source).read_bytes() if (ROOT / source).is_file() else None
        if data is None:
            raise GenError(f"{source}: missing plot")
        name = Path(source).name
        self.files[name] = data
        return f"![{alt}](generated/{name})\n\n*{caption}*"

    def write(self, snippets: Snippets) -> None:
        self.files[f"{snippets.name}.md"] = snippets.render().encode()


# ---- capture parsing helpers ----------------------------------------------------------------------


def numbers_in(text: str, pattern: str) -> List[float]:
    return [float(m.group(1)) for m in re.finditer(pattern, text)]


def passed_total(text: str) -> Tuple[int, int]:
    """The job's closing 'N passed, M failed' line (the last one without a 'pe i:' prefix)."""
    lines = [line for line in text.splitlines() if re.fullmatch(r"\d+ passed, \d+ failed", line.strip())]
    if not lines:
        raise GenError("capture without a closing 'N passed, M failed' line")
    passed, failed = re.findall(r"\d+", lines[-1])
    return int(passed), int(failed)


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
PUTS = ("nvshmem_put", "bulk_put", "store_put")


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

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
COLL_LABEL = {
    "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
    "broadcast": "broadcast", "all_to_all": "all-to-all",
}
TABLE_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB]
PEER_LABEL = {"nccl": "NCCL", "torch_symm": "torch", "nvshmem": "NVSHMEM"}


def size_table() -> List[Tuple[str, int, str]]:
    """(collective, up to bytes, algorithm) rows of chapter 4's SIZE_TABLE, from the Rust source."""
    text = read_text(SIZE_TABLE_SOURCE)
    body = text[text.index("pub const SIZE_TABLE"):]
    body = body[: body.index("];")]
    rows = []
    names = {"SyncAll": "sync_all", "Broadcast": "broadcast", "AllGather": "all_gather",
             "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce", "AllToAll": "all_to_all",
             "AllToAllV": "all_to_all_v"}
    algos = {"OneShot": "one_shot", "TwoShot": "two_shot", "Direct": "direct", "Ring": "ring",
             "ScatterGather": "scatter_gather", "Pull": "pull", "Signal": "signal"}
    for m in re.finditer(r"\(Collective::(\w+),\s*([^,]+),\s*Algorithm::(\w+)\)", body):
        limit = m.group(2).strip()
        if limit == "usize::MAX":
            up_to = 1 << 62
        else:
            found = re.fullmatch(r"(\d+)\s*<<\s*(\d+)", limit)
            if not found:
                raise GenError(f"{SIZE_TABLE_SOURCE}: cannot read size {limit!r} in SIZE_TABLE")
            up_to = int(found.group(1)) << int(found.group(2))
        rows.append((names[m.group(1)], up_to, algos[m.group(3)]))
    if not rows:
        raise GenError(f"{SIZE_TABLE_SOURCE}: SIZE_TABLE not found")
    return rows


class Coll:
    """One chapter 4 run: ours (the size table's choice), the peers, NVSHMEM's row if any."""

    def __init__(self, result: Result, table_rows: List[Tuple[str, int, str]]):
        self.r = result
        self.table = table_rows
        self.n = int(result.rows[0]["n_pes"])

    def us(self, collective: str, size: int, method: str, algorithm: Optional[str] = None) -> Optional[float]:
        found = [float(r["us"]) for r in self.r.select(collective=collective, num_bytes=size, method=method)
                 if algorithm is None or r["algorithm"] == algorithm]
        return min(found) if found else None

    def ours(self, collective: str, size: int) -> Tuple[float, str]:
        """The table's choice, and the next algorithm when LL did not run at this size."""
        choices = [a for c, up_to, a in self.table if c == collective and size <= up_to]
        choices += [a for c, _, a in self.table if c == collective]
        for algorithm in choices:
            t = self.us(collective, size, "ours", algorithm)
            if t is not None:
                return t, algorithm
        raise GenError(f"{self.r.path}: no row of ours for {collective} at {size} B")

    def peers(self, collective: str, size: int) -> Dict[str, float]:
        out = {}
        for method in ("nccl", "torch_symm", "nvshmem"):
            t = self.us(collective, size, method)
            if t is not None:
                out[method] = t
        return out

    def best_peer(self, collective: str, size: int) -> Tuple[float, str]:
        peers = self.peers(collective, size)
        if not peers:
            raise GenError(f"{self.r.path}: no peer for {collective} at {size} B")
        method = min(peers, key=peers.get)
        label = PEER_LABEL[method]
        if method == "torch_symm":
            algo = min(self.r.select(collective=collective, num_bytes=size, method=method), key=lambda r: float(r["us"]))["algorithm"]
            label = f"torch {algo.replace('_', '-')}"
        return peers[method], label

    def has_nvshmem(self) -> bool:
        return any(r["method"] == "nvshmem" and r["collective"] in COLLECTIVES for r in self.r.rows)

    def sizes(self) -> List[int]:
        return sorted({int(r["num_bytes"]) for r in self.r.select(method="nccl", collective="all_reduce")})


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
            claim("NVSHMEM_DISABLE_NCCL=1" in setting, "ch04-measuring.md",
                  "NVSHMEM's row was timed with NVSHMEM_DISABLE_NCCL=1 (its CSV header says so)")
            s.add(f"{key}_nvshmem", table(["size"] + [f"{COLL_LABEL[x]}: ours / NVSHMEM" for x in COLLECTIVES], ["r"] * 6, rows)
                  + f"\n\n*NVSHMEM's team collectives on the stream over the world team, NVSHMEM_DISABLE_NCCL=1; "
                  f"time per call in us. `{r.path}`: {r.device}, {r.date}.*")
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
    claim(all("torch" in c.best_peer("all_reduce", z)[1] for c in (n2, n4) for z in small), "ch04-measuring.md",
          "torch's symmetric-memory kernels are the closest peer for small all-reduces")
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


# ---- chapter 7: the table of bad inputs ----------------------------------------------------------
#
# Every bad input the buffer refuses, with the test that covers it, generated so that the table
# cannot drift from the tests: the rows refused before a launch are read from the CPU tests of
# src/bad_inputs.rs (each case there spoils good arguments, calls every plan, and names the
# message one of them must give); the rows only the GPU can see come from DEVICE_GUARDS below,
# which names the tests that plant each one.

BAD_INPUTS = "src/bad_inputs.rs"
ERRORS = "src/error.rs"
PY_ERRORS = "python/src/errors.rs"

# The case tables of src/bad_inputs.rs -> the snippet each becomes, in page order. A table there
# that is missing here stops the script, so a new group of cases reaches the book.
CASE_TABLES = {"NORMAL_CASES": "normal", "LL_CASES": "low_latency"}

# The Python call (and a note on how it is called) each plan wrapper of src/bad_inputs.rs stands
# for. The notify plan runs inside a dispatch without a handle; a cached dispatch skips it.
WRAPPER_CALLS = {
    "layout": ("get_dispatch_layout", ""),
    "notify": ("dispatch", "without `handle`"),
    "dispatch": ("dispatch", ""),
    "combine": ("combine", ""),
    "ll_dispatch": ("low_latency_dispatch", ""),
    "ll_combine": ("low_latency_combine", ""),
}
# A call that takes a handle only sometimes: how the table says it was given one.
HANDLE_NOTES = {"dispatch": "with `handle`"}
# Fields of the tests' argument structs that group arguments (the argument is the field after),
# and fields that stand for something other than an argument of their name.
ARG_GROUPS = {"notify_in", "notify_out", "dispatch_in", "dispatch_out", "combine_in", "combine_out", "options", "layout"}
ARG_NAMES = {"phases": "the receive hook", "pending": "the receive hook"}

BEFORE_LAUNCH = "before launch, by its plan"

# The bad inputs only the GPU can see. The kernel records the first in the buffer's input-error
# record, skips what it cannot use and completes the call on every rank; the next check() (or
# call) raises it once, and the buffer stays usable. `variant`: the BufferError of src/error.rs
# that reports it; `message`: a part of that variant's message (checked against it); `tests`:
# (file, function) that plant the input or check its message (checked to exist); `covers`, if
# set, says what the tests cover when it is less than the whole row.
DEVICE_GUARDS: List[Dict[str, object]] = [
    {
        "variant": "RecvOverflow",
        "argument": "`num_worst_tokens`",
        "input": "below the rows this rank receives",
        "calls": "`dispatch`; `combine` with that handle",
        "when": "on the GPU: the rows past the outputs are dropped (the combine sums zeros for them); "
                "raised by the next `check()` or call",
        "message": "Pass num_worst_tokens >= {needed}",
        "tests": [("src/bin/ch07-buffer/guards.rs", "check_worst_tokens_too_small"),
                  ("src/bin/ch07-buffer/guards.rs", "check_combine_past_the_rows"),
                  ("src/buffer.rs", "a_dispatch_past_num_worst_tokens_names_it_and_the_rows_needed")],
    },
    {
        "variant": "CountsMismatch",
        "argument": "`num_tokens_per_rank`",
        "input": "disagrees with `is_token_in_rank`",
        "calls": "`dispatch` without `handle`",
        "when": "on the GPU: the notify step goes by `is_token_in_rank`; raised by its wait or the "
                "next `check()`",
        "message": "num_tokens_per_rank[{rank}] = {given}, but is_token_in_rank sends {counted} tokens",
        "tests": [("src/bin/ch07-buffer/guards.rs", "check_counts_disagree"),
                  ("src/buffer.rs", "counts_that_disagree_with_the_routing_name_the_rank_and_both_numbers")],
    },
    {
        "variant": "BadExpert",
        "argument": "`topk_idx`",
        "input": "an expert id outside -1..num_experts",
        "calls": "`get_dispatch_layout`",
        "when": "on the GPU: the entry is skipped; raised by the next `check()`, event wait or call",
        "message": "holds expert {value}, outside -1..{num_experts}",
        "tests": [("scripts/ch07_buffer.py", "bad_input")],
    },
    {
        "variant": "BadExpert",
        "argument": "`topk_idx`",
        "input": "an expert id outside -1..num_experts",
        "calls": "`low_latency_dispatch`, `low_latency_combine`",
        "when": "on the GPU: both kernels skip the entry; raised by the next call, the receive hook "
                "or `check()`",
        "message": "holds expert {value}, outside -1..{num_experts}",
        "tests": [("src/bin/ch08-low-latency/checks.rs", "input_record"),
                  ("scripts/ch08_low_latency.py", "bad_input"),
                  ("scripts/ch08_low_latency.py", "graph_replays")],
    },
    {
        "variant": "SlotsFull",
        "argument": "`topk_idx`",
        "input": "a token names one expert twice (its run of T slots overflows)",
        "calls": "`low_latency_dispatch`",
        "when": "on the GPU: the extra copies are dropped; raised by the next `check()` or call",
        "message": "must not name one expert twice",
        "tests": [("src/bin/ch08-low-latency/checks.rs", "input_record")],
    },
    {
        "variant": "BadHandle",
        "argument": "`handle`",
        "input": "not the handle of the dispatch whose results `x` holds",
        "calls": "`low_latency_combine`",
        "when": "on the GPU: the rows it cannot place are skipped; raised by the next `check()` or call",
        "message": "pass the handle of the dispatch whose results x holds",
        "tests": [("src/bin/ch08-low-latency/guards.rs", "check_bad_handle")],
    },
]

RUST_STRING = r'"((?:[^"\\]|\\[\s\S])*)"'
RUST_SKIP = re.compile(RUST_STRING + r"|//[^\n]*|'(?:[^'\\\n]|\\.)'")  # strings, comments, chars


def rust_string(literal: str) -> str:
    """A Rust string literal's text: line continuations joined, escapes undone."""
    text = re.sub(r"\\\n\s*", "", literal)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


def rust_items(text: str, start: int, path: str, split: bool = False) -> List[str]:
    """The text from `start` (just after an opening bracket) to its closing one, or with `split`
    its top-level comma-separated items. Brackets inside strings, comments and chars are skipped."""
    depth, i, items, item_start = 1, start, [], start
    while i < len(text):
        skip = RUST_SKIP.match(text, i)
        if skip:
            i = skip.end()
            continue
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                items.append(text[item_start:i])
                return [t.strip() for t in items if t.strip()] if split else ["".join(items)]
        elif c == "," and depth == 1 and split:
            items.append(text[item_start:i])
            item_start = i + 1
        i += 1
    raise GenError(f"{path}: unbalanced brackets after offset {start}")


def rust_fns(text: str, path: str) -> Dict[str, Tuple[str, str]]:
    """A file's functions: name -> (whatever precedes `fn` on its lines (attributes), body)."""
    fns = {}
    for m in re.finditer(r"(?m)^((?:[ \t]*#\[[^\n]*\]\n)*)[ \t]*(?:pub(?:\([\w:]+\))? )?fn (\w+)\b", text):
        brace = text.find("{", m.end())
        if brace < 0:
            continue
        fns[m.group(2)] = (m.group(1), rust_items(text, brace + 1, path)[0])
    return fns


def test_exists(path: str, name: str) -> None:
    """Stops the script when a test a row names is gone."""
    pattern = rf"\bdef {name}\(" if path.endswith(".py") else rf"\bfn {name}\b"
    if not re.search(pattern, read_text(path)):
        raise GenError(f"{path}: no {name}, which DEVICE_GUARDS of scripts/gen_book.py names as a test")


def error_messages() -> Dict[str, str]:
    """BufferError variant -> its #[error("...")] message, from src/error.rs."""
    found = {m.group(2): rust_string(m.group(1)) for m in
             re.finditer(r"#\[error\(\s*" + RUST_STRING + r"\s*\)\]\s*(\w+)\s*[{(]", read_text(ERRORS))}
    if not found:
        raise GenError(f"{ERRORS}: no #[error(\"...\")] variants")
    return found


def python_class(variants: Sequence[str]) -> str:
    """InvalidArgumentError, after checking that Python raises it for these BufferErrors: each is
    in is_invalid_input(), and python/src/errors.rs maps that to InvalidArgumentError."""
    body = rust_fns(read_text(ERRORS), ERRORS).get("is_invalid_input", ("", ""))[1]
    missing = [v for v in variants if not re.search(rf"Self::{v}\b", body)]
    if missing:
        raise GenError(f"{ERRORS}: {', '.join(missing)} not in is_invalid_input(), which the table of bad "
                       "inputs needs for InvalidArgumentError")
    if not re.search(r"is_invalid_input\(\) => Error::Invalid\(", read_text(PY_ERRORS)):
        raise GenError(f"{PY_ERRORS}: is_invalid_input() no longer maps to InvalidArgumentError")
    return "InvalidArgumentError"


def plan_bodies() -> Dict[str, str]:
    """Every `pub fn plan_*` under src/: name -> body."""
    plans = {}
    for path in sorted((ROOT / "src").rglob("*.rs")):
        text = path.read_text()
        if "pub fn plan_" in text:
            rel = str(path.relative_to(ROOT))
            plans.update({n: body for n, (_, body) in rust_fns(text, rel).items() if n.startswith("plan_")})
    return plans


def code(text: str) -> str:
    if "`" in text or "|" in text:
        raise GenError(f"table of bad inputs: cannot quote {text!r} in a table cell")
    return f"`{text}`"


def join_calls(calls: Sequence[Tuple[str, str]]) -> str:
    """'`dispatch` without `handle`, `combine`': a call's note dropped where it has several."""
    notes: Dict[str, List[str]] = {}
    for call, note in calls:
        notes.setdefault(call, [])
        if note not in notes[call]:
            notes[call].append(note)
    return ", ".join(f"`{c}`" + (f" {n[0]}" if len(n) == 1 and n[0] else "") for c, n in notes.items())


def case_rows(text: str, table_name: str, fns: Dict[str, Tuple[str, str]],
              plans: Dict[str, str]) -> Tuple[str, List[List[str]]]:
    """The rows of one case table of src/bad_inputs.rs, and the #[test] that runs it: each case's
    arguments are the fields its spoiler assigns; the calls refusing it, the plans that take them."""
    start = re.search(rf"const {table_name}: &\[\w+\] = &\[", text)
    if start is None:
        raise GenError(f"{BAD_INPUTS}: no const {table_name}")
    tests = [n for n, (attrs, body) in fns.items() if "#[test]" in attrs and re.search(rf"\b{table_name}\b", body)]
    if len(tests) != 1:
        raise GenError(f"{BAD_INPUTS}: expected one #[test] that runs {table_name}, found {tests}")
    test = tests[0]
    listed = re.search(rf"assert_refused\(\s*{table_name}\s*,.*?&\[([\w,\s]+)\]", fns[test][1], re.S)
    if listed is None:
        raise GenError(f"{BAD_INPUTS}: {test} does not call assert_refused({table_name}, good, &[plans])")
    wrappers = [w.strip() for w in listed.group(1).split(",") if w.strip()]
    for w in wrappers:
        if w not in WRAPPER_CALLS or w not in fns:
            raise GenError(f"{BAD_INPUTS}: plan wrapper {w} (of {test}) is not in WRAPPER_CALLS of scripts/gen_book.py")
    reads = {w: set(re.findall(r"\ba\.(\w+)", fns[w][1])) for w in wrappers}  # the argument fields it passes
    planned = {w: " ".join(plans.get(p, "") for p in re.findall(r"\b(plan_\w+)\(", fns[w][1])) for w in wrappers}
    case = re.compile(r"\(\s*" + RUST_STRING + r",\s*\|(\w+),\s*(\w+)\|(.*),\s*" + RUST_STRING + r"\s*\)", re.S)
    rows = []
    for item in rust_items(text, start.end(), BAD_INPUTS, split=True):
        m = case.fullmatch(item)
        if m is None:
            raise GenError(f"{BAD_INPUTS}: {table_name}: cannot read the case {item[:60]!r}")
        name, a, spec, spoil, message = rust_string(m.group(1)), m.group(2), m.group(3), m.group(4), rust_string(m.group(5))
        args: List[str] = []
        calls: List[Tuple[str, str]] = []
        for path in re.findall(rf"\b{a}\.([\w.]+)", spoil) if a != "_" else []:
            field, *rest = path.split(".")
            if field == "handle" and rest:
                arg = f"`handle` (`{rest[0]}`)"
            elif field in ARG_GROUPS and rest:
                arg = f"`{rest[0]}`"
            else:
                arg = ARG_NAMES.get(field, f"`{field}`")
            if arg not in args:
                args.append(arg)
            for w in wrappers:
                if field in reads[w]:
                    call, note = WRAPPER_CALLS[w]
                    calls.append((call, HANDLE_NOTES.get(w, note) if field == "handle" else note))
        if spec != "_":
            # The buffer itself: refused by the plans that read the part spoiled (or all of it).
            whole = re.search(rf"\*{spec}\s*=", spoil) is not None
            parts = re.findall(rf"\b{spec}\.([\w.]+)", spoil)
            args += ["the `Buffer`"] if whole else [f"the `Buffer`'s `{p.split('.')[-1]}`" for p in parts]
            for w in wrappers:
                body = planned[w]
                if whole or re.search(r"[(,]\s*spec\s*[,)]", body) or any(f"spec.{p}" in body for p in parts):
                    calls.append(WRAPPER_CALLS[w])
        if not args or not calls:
            raise GenError(f"{BAD_INPUTS}: {table_name}: cannot tell which argument or call {name!r} spoils")
        rows.append([", ".join(args), name, join_calls(calls), BEFORE_LAUNCH, code(message), f"`{test}`"])
    if not rows:
        raise GenError(f"{BAD_INPUTS}: {table_name} is empty")
    return test, rows


def config_rows(fns: Dict[str, Tuple[str, str]]) -> List[List[str]]:
    """The bad configs: a #[test] that calls a plan with Config::new(...) values, each one field
    away from the good config()."""
    good = re.search(r"Config::new\(([\d,\s]+)\)", fns.get("config", ("", ""))[1])
    struct = re.search(r"pub struct Config \{(.*?)\n\}", read_text("src/config.rs"), re.S)
    fields = re.findall(r"pub (\w+): u32", struct.group(1)) if struct else []
    if good is None or not fields:
        raise GenError(f"{BAD_INPUTS}: no config() = Config::new(...), or src/config.rs no Config fields")
    good_values = [v.strip() for v in good.group(1).split(",")]
    rows = []
    for name, (attrs, body) in fns.items():
        cases = re.findall(r"\(Config::new\(([\d,\s]+)\)\.unwrap\(\),\s*" + RUST_STRING + r"\)", body)
        if not cases:
            continue
        calls = [WRAPPER_CALLS[p] for p in re.findall(r"\bplan_(\w+)\(", body) if p in WRAPPER_CALLS]
        if "#[test]" not in attrs or not calls:
            raise GenError(f"{BAD_INPUTS}: {name} lists bad configs but is not a #[test] that calls a plan")
        for values, message in cases:
            changed = [f"`{f}` = {v.strip()} ({g} passes)"
                       for f, v, g in zip(fields, values.split(","), good_values) if v.strip() != g]
            if len(changed) != 1:
                raise GenError(f"{BAD_INPUTS}: {name}: a bad config must change one field of config()")
            rows.append(["`config`", f"`Config` with {changed[0]}", join_calls(calls), BEFORE_LAUNCH,
                         code(rust_string(message)), f"`{name}`"])
    if not rows:
        raise GenError(f"{BAD_INPUTS}: no #[test] with bad Config::new(...) values")
    return rows


def gen_bad_inputs(book: Book) -> None:
    s = Snippets("bad_inputs", origin=f"{BAD_INPUTS} and DEVICE_GUARDS in scripts/gen_book.py")
    text = read_text(BAD_INPUTS)
    fns, plans = rust_fns(text, BAD_INPUTS), plan_bodies()
    found = re.findall(r"const (\w+_CASES): &\[", text)
    if sorted(found) != sorted(CASE_TABLES):
        raise GenError(f"{BAD_INPUTS}: case tables {found}, but CASE_TABLES of scripts/gen_book.py names "
                       f"{list(CASE_TABLES)}")
    header = ["Argument", "What is wrong", "Refused by", "When", "Python raises (message contains)", "Test"]
    py = python_class(["Invalid", "BufferTooSmall"])
    for table_name, anchor in CASE_TABLES.items():
        test, rows = case_rows(text, table_name, fns, plans)
        if anchor == "normal":
            rows += config_rows(fns)
        for row in rows:
            row[4] = f"`{py}`: {row[4]}"
        s.add(anchor, table(header, ["l"] * len(header), rows) +
              f"\n\n*`{BAD_INPUTS}`: each row of `{test}` is a case of `{table_name}`, which spoils good "
              "arguments, calls every plan, and expects one of them to fail with the quoted message.*")
    messages = error_messages()
    rows = []
    for guard in DEVICE_GUARDS:
        variant, message = str(guard["variant"]), str(guard["message"])
        if message not in messages.get(variant, ""):
            raise GenError(f"{ERRORS}: BufferError::{variant}'s message does not say {message!r}: update "
                           "DEVICE_GUARDS in scripts/gen_book.py")
        tests = []
        for path, name in guard["tests"]:  # type: ignore[attr-defined]
            test_exists(path, name)
            tests.append(f"`{name}` ({path})")
        covers = f" ({guard['covers']})" if guard.get("covers") else ""
        rows.append([str(guard["argument"]), str(guard["input"]), str(guard["calls"]), str(guard["when"]),
                     f"`{python_class([variant])}`: {code(message)}", "; ".join(tests) + covers])
    variants = ", ".join(f"`BufferError::{v}`" for v in dict.fromkeys(str(g["variant"]) for g in DEVICE_GUARDS))
    header[2] = "Found by"
    s.add("device", table(header, ["l"] * len(header), rows) +
          f"\n\n*In Rust: {variants} (`src/error.rs`), after which the buffer stays usable. Braces name "
          "the numbers the message gives.*")
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
        claim(rr(v, "dispatch_combine", "eager") > 1 and rr(v, "dispatch_combine", "host") > 1, "ch08-python-graphs.md",
              "the eager pair and its host time are slower than DeepEP's")
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


GENERATORS += [gen_captures, gen_ch01, gen_ch02, gen_ch03, gen_ch04, gen_ch07, gen_bad_inputs, gen_ch08,
               gen_python]


# ---- Appendix A: running on a cluster (the cost model) -------------------------------------------
#
# benchmarks/cluster_model.py predicts chapter 5's collectives on nodes of 8 GPUs joined by
# InfiniBand from NVLink figures measured here (the results of record above) and published or
# assumed InfiniBand figures. This section writes its tables and plot (generated/cluster.md,
# generated/cluster_model.svg), and the measured crossovers of chapters 3 and 4 the appendix's
# decision guide quotes. Every table says which figures are predictions.

CLUSTER_MODEL = "benchmarks/cluster_model.py"


def load_cluster_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cluster_model", ROOT / CLUSTER_MODEL)
    if spec is None or spec.loader is None:
        raise GenError(f"{CLUSTER_MODEL}: cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cluster_model"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def measured_changes(sizes: Sequence[int], first_wins: Callable[[int], bool], first: str, second: str) -> str:
    """'ours at every size measured', or 'ours; NCCL from 16 MiB' over the measured sizes."""
    parts, winner = [], None
    for z in sizes:
        now = first if first_wins(z) else second
        if now != winner:
            parts.append(now if winner is None else f"{now} from {size_label(z)}")
            winner = now
    return f"{parts[0]} at every size measured" if len(parts) == 1 else "; ".join(parts)


def gen_cluster(book: Book) -> None:
    cm = load_cluster_model()
    s = Snippets("cluster", "benchmarks/cluster_model.py and the results of record (its MANIFEST)")
    p2p, coll = book.result("p2p"), book.result("coll_n4")
    for key, path in (("p2p", cm.P2P_CSV), ("coll_n4", cm.COLL_CSV)):
        if MANIFEST[key]["csv"] != path:
            raise GenError(f"{CLUSTER_MODEL} reads {path}, the book's {key} is {MANIFEST[key]['csv']}: make them agree")
    inputs = cm.measured(p2p.rows, coll.rows)
    serial, overlapped = cm.params(inputs), cm.params(inputs, overlap=True)
    g = cm.GPUS_PER_NODE

    # The inputs: what was measured, what is published, what is assumed.
    rows = [
        ["Step time: one kernel of a plan, in a graph, entering and leaving a call",
         f"{us(inputs['step_us'], 2)} us", f"measured: chapter 4's `sync_all`, `{coll.path}` ({coll.provenance()})"],
        ["NVLink latency: one put-with-signal, one way",
         f"{us(inputs['nvl_alpha_us'], 2)} us", f"measured: chapter 3's 8-byte ping-pong, `{p2p.path}` ({p2p.provenance()})"],
        ["NVLink bandwidth out of one GPU",
         f"{gbs(inputs['nvl_gbs'])} GB/s",
         f"measured: chapter 3's best put at {size_label(int(inputs['nvl_top_bytes']))}, `{p2p.path}` ({p2p.provenance()})"],
    ]
    for value, unit, what, sources in cm.PUBLISHED.values():
        cited = "; ".join(f"[{text}]({url})" for text, url in sources)
        rows.append([what, f"{value:g} {unit}", f"published: {cited}"])
    for value, unit, what in cm.ASSUMED.values():
        rows.append([what, f"{value:g} {unit}",
                     "assumed (\"a few microseconds per message\"): no published figure for a GPU-initiated "
                     "put-with-signal over ConnectX-7 was found; the sensitivity table halves and doubles it"])
    s.add("inputs_table", table(["input", "value", "where it comes from"], ["l", "r", "l"], rows))
    s.add("step_us", f"{us(inputs['step_us'], 2)} us")
    s.add("nvl_alpha", f"{us(inputs['nvl_alpha_us'], 2)} us")
    s.add("nvl_gbs", f"{gbs(inputs['nvl_gbs'])} GB/s")
    s.add("ib_gbs", f"{cm.PUBLISHED['ib_gbs'][0]:g} GB/s")
    s.add("ib_alpha", f"{cm.ASSUMED['ib_alpha_us'][0]:g} us")
    s.add("measured_on", f"{p2p.device} ({p2p.date}) and {coll.device} ({coll.date})")

    # Predicted times and crossovers.
    caption = (f"*Predicted by `{CLUSTER_MODEL}`, not measured: microseconds per call, flat / hierarchical, "
               f"serial bound ({cm.ASSUMED['ib_alpha_us'][0]:g} us per InfiniBand message), sizes as nccl-tests "
               f"counts them. NVLink inputs from `{p2p.path}` and `{coll.path}`.*")
    for c in cm.COLLECTIVES:
        s.add(f"times_{c}", cm.times_table(c, serial) + "\n\n" + caption)
    lo, hi = cm.SEARCH_RANGE
    s.add("crossover_table", cm.crossover_table(inputs) + "\n\n" +
          f"*Predicted by `{CLUSTER_MODEL}`, not measured: which method takes less time, from "
          f"{size_label(lo)} to {size_label(hi)}, and the sizes where that changes; nodes of {g} GPUs, "
          f"{cm.ASSUMED['ib_alpha_us'][0]:g} us per InfiniBand message.*")
    s.add("sensitivity_table", cm.sensitivity_table(inputs) + "\n\n" +
          f"*Predicted by `{CLUSTER_MODEL}`: crossovers at 2 and {cm.NODE_COUNTS[-1]} nodes with the InfiniBand "
          "latency halved and doubled; rows whose answer does not change are left out.*")
    svg_name = "cluster_model.svg"
    book.files[svg_name] = cm.svg(inputs).encode()
    s.add("plot", f"![Predicted time per call against size for the five collectives, flat and hierarchical, at 2 and "
          f"{cm.PLOT_NODES[-1][0]} nodes of {g} GPUs](generated/{svg_name})\n\n"
          f"*Predicted by `{CLUSTER_MODEL}`, not measured: dashed flat, solid hierarchical, serial bound.*")

    # The sentences of the appendix that the model decides.
    def xo(coll_name: str, nodes: int, p) -> Tuple[str, list]:
        return cm.crossovers(coll_name, nodes, g, p)

    reducing = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    claim(all(xo(c, n, serial) == ("hierarchical", []) for c in reducing for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "under the serial bound the hierarchical all-reduce, all-gather, "
          "reduce-scatter and broadcast win at every size")
    claim(all(xo(c, n, overlapped)[0] == "flat" and [m for _, m in xo(c, n, overlapped)[1]] == ["hierarchical"]
              for c in reducing for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "under the overlapped bound flat wins small sizes, hierarchical large ones")
    a2a = [xo("all_to_all", n, serial) for n in cm.NODE_COUNTS]
    claim(all(first == "hierarchical" and [m for _, m in ch] == ["flat"] for first, ch in a2a)
          and all(a[1][0][0] < b[1][0][0] for a, b in zip(a2a, a2a[1:])),
          "appendix-cluster-model.md", "all-to-all: hierarchical below a crossover that grows with the node count, flat above")
    claim(all(xo("all_to_all", n, overlapped) == ("flat", []) for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "all-to-all under the overlapped bound: flat at every size")
    s.add("a2a_flat_from", " and ".join(
        f"{cm.size_text(ch[0][0])} at {n} nodes" for n, (_, ch) in zip(cm.NODE_COUNTS, a2a) if n in (2, 16)))
    over = [xo("all_reduce", n, overlapped)[1][0][0] for n in cm.NODE_COUNTS]
    s.add("all_reduce_overlap_from", f"{cm.size_text(over[0])} at 2 nodes to {cm.size_text(over[-1])} at "
          f"{cm.NODE_COUNTS[-1]}")
    big = 256 * MIB
    ratios = [cm.flat_us("all_reduce", n, g, big, serial) / cm.hier_us("all_reduce", n, g, big, serial)
              for n in cm.NODE_COUNTS]
    s.add("all_reduce_big_ratio", xspan(ratios, 1))
    s.add("big_size", size_label(big))

    # Measured crossovers inside one node, for the decision guide: chapter 4 (ours or NCCL)
    # and chapter 3 (kernel puts or the copy engine).
    runs = [Coll(book.result(key), size_table()) for key in ("coll_n2", "coll_n4")]
    rows = []
    for c in cm.COLLECTIVES:
        cells = [COLL_LABEL[c]]
        for run in runs:
            cells.append(measured_changes(run.sizes(), lambda z, run=run: run.ours(c, z)[0] <= 1.005 * run.us(c, z, "nccl"),
                                          "ours", "NCCL"))
        rows.append(cells)
    s.add("node_table", table(["collective"] + [f"N = {run.n}" for run in runs], ["l"] * (1 + len(runs)), rows) +
          f"\n\n*Measured, one node, {size_label(runs[0].sizes()[0])} to {size_label(runs[0].sizes()[-1])}: the "
          "faster of ours (chapter 4's size table) and NCCL, CUDA-graph replay, ours counted faster within 0.5%. " + "; ".join(f"`{run.r.path}`: {run.r.provenance()}" for run in runs) + ".*")
    sizes = sorted({int(r["num_bytes"]) for r in p2p.select(method="copy_engine")})
    best_put = {z: max(p2p.value("gb_per_s", method=m, num_bytes=z) for m in PUTS) for z in sizes}
    s.add("copy_engine_vs_put", measured_changes(
        sizes, lambda z: p2p.value("gb_per_s", method="copy_engine", num_bytes=z) >= best_put[z],
        "the copy engine", "a kernel put"))
    s.add("p2p_sizes", f"{size_label(sizes[0])} to {size_label(sizes[-1])}")
    book.write(s)


GENERATORS += [gen_cluster]


if __name__ == "__main__":
    sys.exit(main())
