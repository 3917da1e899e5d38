"""What every generator of scripts/gen_book.py shares: the results of record (MANIFEST), the
claims, number formatting, reading results and captures, and the snippets a page includes."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent.parent
OUT_DIR = ROOT / "book" / "src" / "generated"
CAPTURES = "book/src/output/captures.tsv"

# ---- the results of record -------------------------------------------------------------------
#
# One entry per table family the book shows. `csv` is the result of record; the other paths
# belong to the same run (written by the same benchmark call). `caveat`, if set, is printed under
# every table from that entry: say there what the reader must know about the run (a kernel that
# changed since), and drop it when the entry points at a run of the current code.
#
# Where each entry's run comes from (4x H100 machines unless said; one GPU per PE):
# - Chapter 3 (p2p), chapter 4 at N = 2 (coll_n2) and chapter 5 at N = 2 (hier_n2): GPUs 0-1,
#   2026-11-27 03:29-04:01 UTC, binaries of 3fedafa.
# - Chapter 7 (buffer_ep2, buffer_ep4) and DeepEP V2 (deepep_v2_ep2): one call, 2026-11-27
#   03:57-04:05 UTC, wheel of ceaaaff's tree plus the two-vector combine receive (low-latency
#   mode only); DeepEP v1 567632d built on that machine.
# - Chapter 4 at N = 4 (coll_n4) and chapter 5 at N = 4 (hier_n4): 2026-11-27 00:54-00:58 UTC,
#   binaries of 4232e2a, NVSHMEM's team rows included.
# - Chapter 8 (ll_ep2, ll_ep4): 2026-11-27 01:05-01:14 UTC, main + the two low-latency patches of
#   2270782 (their caveat names the change since); DeepEP V2's decode shape (deepep_v2_ll_ep2) in
#   the call after it on the same machine.
# - Chapter 6 and the MoE layer at N = 2: the Rust benchmark from the 2x H100 call of 2026-11-26
#   15:46 UTC (b534934), the Python benchmark and the MoE layer from the 2x H200 call of 18:37 UTC
#   (f9c0aec); at N = 4: all three from 2026-11-27 00:57 UTC (4232e2a). The PyTorch page has one
#   run (2x H200).
# The earlier runs (coll_h200_*, buffer_h200_*, buffer_ll_h200_*, p2p_h200*) stay in
# benchmarks/results/ with their notes.
MANIFEST: Dict[str, Dict[str, str]] = {
    # Chapter 3: ch03-p2p-bench through benchmarks/run_p2p.sh (2 GPUs).
    "p2p": {
        "csv": "benchmarks/results/p2p_h100.csv",
        "sweep": "benchmarks/results/p2p_h100_sweep.csv",
        "plot": "benchmarks/results/p2p_h100.png",
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
    # Chapter 4 at N = 4: the broadcast's block pipeline (A) against its 4-warp units (V, what
    # choose takes from BROADCAST_UNITS_FROM to BROADCAST_UNITS_UP_TO at n > 2), two runs each in one call, NCCL after.
    "broadcast_units": {
        "csv": "benchmarks/results/broadcast_unit_steps_h100_4gpu_2026-11-27.csv",
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
    # Chapter 7: DeepEP V2 (benchmarks/deepep_v2.sh, its tests/elastic/test_ep.py, profiler
    # kernel times) on the GPUs and in the call of buffer_ep2.
    "deepep_v2_ep2": {
        "log": "benchmarks/results/deepep_v2_h100_ep2.log",
    },
    # Chapter 8: DeepEP V2's one path at the decode shape, on the machine of ll_ep2 (the call after it).
    "deepep_v2_ll_ep2": {
        "log": "benchmarks/results/deepep_v2_ll_h100_ep2.log",
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
    # Chapter 5: ch05-hier-bench through benchmarks/run_coll.sh 2 (one node of 2, 2 nodes of 1).
    "hier_n2": {
        "csv": "benchmarks/results/hier_h100_2gpu.csv",
    },
    # ... and benchmarks/run_coll.sh 4 (one node of 4, 2 nodes of 2, 4 nodes of 1).
    "hier_n4": {
        "csv": "benchmarks/results/hier_h100_4gpu.csv",
    },
    # Chapter 6: ch06-overlap-bench and scripts/ch06_overlap.py --bench (DEVICE_BENCH=overlap).
    "overlap_n2": {
        "csv": "benchmarks/results/overlap_h100_2gpu.csv",
        "python": "benchmarks/results/overlap_py_h200_2gpu.csv",
        "plot": "benchmarks/results/overlap_py_h200_2gpu.svg",
        "timeline": "benchmarks/results/timeline_ch06_overlap_h200_2gpu_overlapped.svg",
    },
    "overlap_n4": {
        "csv": "benchmarks/results/overlap_h100_4gpu.csv",
        "python": "benchmarks/results/overlap_py_h100_4gpu.csv",
        "plot": "benchmarks/results/overlap_py_h100_4gpu.svg",
    },
    # The MoE layer: scripts/moe_layer.py --bench (DEVICE_BENCH=moe).
    "moe_n2": {
        "csv": "benchmarks/results/moe_layer_h100_2gpu.csv",
        "timeline": "benchmarks/results/timeline_moe_layer_h200_2gpu_overlapped.svg",
        # The run the timeline comes from (2x H200), for its caption.
        "timeline_csv": "benchmarks/results/moe_layer_h200_2gpu.csv",
    },
    "moe_n4": {
        "csv": "benchmarks/results/moe_layer_h100_4gpu.csv",
    },
    # ... and the four-layer schedule's hidden exchanges at 16 / 12 / 8 / 4 SMs in one run
    # (moe_layer.py --overlap-rounds 5 --hidden-sms 16 12 8 4, N = 4).
    "moe_sms_n4": {
        "csv": "benchmarks/results/moe_hidden_sms_h100_4gpu_2026-11-27.csv",
    },
    # The PyTorch page: scripts/ch03_put_get.py --bench (2 GPUs).
    "py_exchange": {
        "csv": "benchmarks/results/python_exchange_h200.csv",
    },
    # Its ping-pong rows: chapter 3's run on the same kind of GPU as py_exchange (2x H200).
    "py_p2p": {
        "csv": "benchmarks/results/p2p_h200.csv",
    },
}

# Source files whose content a snippet depends on besides the results (the staleness check
# regenerates from all of them).
SIZE_TABLE_SOURCE = "chapters/ch04-collectives/src/algorithm.rs"

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


class GenError(Exception):
    """A result that is missing, malformed, or contradicts a page's prose."""


def load_module(path: str):
    """The Python file at `path` (from the repository root, e.g. one of benchmarks/) as a
    module, so that the book reads results with the code that wrote or models them."""
    import importlib.util
    import sys

    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    if spec is None or spec.loader is None:
        raise GenError(f"{path}: cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


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
            raise GenError(f"{path}: missing (named in MANIFEST of scripts/bookgen/common.py)")
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
        # Rows measured again later say so in a line "rows measured <date>: <which rows>"; the
        # caption then gives both dates.
        later = [f"{m.group(2).strip()}: {m.group(1)}" for line in self.comments
                 for m in [re.match(r"rows measured (\S+ \S+ UTC): ([^;(]+)", line)] if m]
        for line in self.comments:
            if line.startswith("date:"):
                found = DATE_RE.search(line)
                if found:
                    return found.group(0) + (f" ({'; '.join(later)})" if later else "")
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
