#!/usr/bin/env python3
"""Timeline figures drawn from a real run: a torch.profiler Chrome trace as one lane per CUDA
stream and one rectangle per kernel or copy, coloured by what it does, over one marked step.

    python3 benchmarks/plot_timeline.py TRACE.json [--out PREFIX] [--title TEXT] [--step N]
        [--class NAME=REGEX ...] [--axis-us US]      # writes PREFIX.svg and PREFIX.csv
    python3 benchmarks/plot_timeline.py --self-test  # a synthetic trace, on the CPU

Recording (`record_steps`, what `--timeline` of scripts/ch06_overlap.py and
scripts/moe_layer.py calls on every rank): warm-up calls, then each profiled call, after a
barrier and a synchronize, inside `torch.profiler.record_function("step")` together with a
synchronize, under torch.profiler with CPU and CUDA activity; rank 0 writes the trace
(`export_chrome_trace`).

Reading. GPU operations are the complete events ("ph": "X") whose "cat" is "kernel",
"gpu_memcpy" or "gpu_memset" (Kineto's names now), or "Kernel", "Memcpy", "Memset"
(older Kineto's); their lane is the device ("pid", or args.device) and the stream (args.stream,
else "tid"). The window is one step, from the first start to the last end of: the step's
"gpu_user_annotation" events (Kineto writes one per stream that ran the step's work, spanning
that stream's operations, with the CPU range's "External id"), and the operations launched
from inside the step's CPU range ("user_annotation"), matched through the "correlation" of
their launch ("cuda_runtime" or "cuda_driver" events). Where the CPU range covers all of that
(the step synchronized inside it, as record_steps does), the operations inside the range
count too. With neither annotations nor launches, the window is the CPU range. Operations that
overlap the window are kept.

Classifying: the caller's (name, regex) pairs, tried in order on the operation's full name,
case-insensitive; the first that matches names the class, none: "other". Order matters:
NVSHMEM's wait kernels contain "nvshmem", so WAIT comes before COMMUNICATION. Plain words
such as "put" would also match "compute" or "output" in a demangled name, hence the longer
patterns below.

Output. PREFIX.svg: hand-written SVG (no plotting library), a lane per stream, a time axis in
microseconds from the window's start, a legend, and a strip where two classes (by default
communication and compute) run at once. PREFIX.csv: one row per operation (stream, name,
class, start_us from the window's start, dur_us), after '# ' lines: the caller's (gpu, date),
the trace, the step, window_us, busy_us (per class: the union of its operations' intervals,
so concurrent kernels count once) and overlap_us (the time both classes of the pair run),
which is what the book quotes.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import json
import math
import os
import re
import sys
import tempfile
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union
from xml.sax.saxutils import escape

STEP = "step"  # the record_function name that marks a profiled call

# Class patterns (regular expressions on the full kernel or copy name, case-insensitive).
# cuBLAS on Hopper names its GEMMs nvjet_* or sm90_xmma_*; torch._grouped_mm runs CUTLASS.
COMPUTE = r"gemm|matmul|cutlass|cublas|nvjet|xmma"
# NVSHMEM's on-stream waits and barriers (its static kernels carry their file's name first,
# "..._quiet_on_stream_cu_...", so "quiet" alone would catch the signal kernel too).
WAIT = r"wait_until|barrier_on_stream|sync_on_stream"
# NCCL, NVSHMEM (its signal kernel), our buffer's kernels, and copies between GPUs.
COMMUNICATION = (r"nccl|nvshmem|signal_op|all_?gather|reduce_?scatter|all_?to_?all"
                 r"|moe_(?:layout|notify|scatter|gather)|memcpy ptop")
# NVSHMEM's on-stream puts to a peer on NVLink are copy-engine copies, which CUPTI may report
# as device to device: add this where no local copy runs in the step (chapter 6).
PEER_COPY = r"memcpy (?:dtod|ptop)"
DEFAULT_CLASSES: Tuple[Tuple[str, str], ...] = (
    ("compute", COMPUTE), ("wait", WAIT), ("communication", COMMUNICATION))
OTHER = "other"
OVERLAP = ("communication", "compute")  # the pair whose time at once the figure and CSV give

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
            "memcpy": "memcpy", "memset": "memset"}  # lower-cased "cat" -> kind
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime"}
KNOWN_COLOURS = {"compute": "#4c72b0", "communication": "#dd8452", "wait": "#ccb974"}
PALETTE = ("#55a868", "#c44e52", "#64b5cd", "#937860", "#da8bc3")  # for other names
OTHER_COLOUR, BOTH_COLOUR = "#8c8c8c", "#8172b3"


class TraceError(Exception):
    """A trace this tool cannot draw; the message says what to change where it can."""


class Op(NamedTuple):
    device: Union[int, str]
    stream: Union[int, str]
    name: str
    kind: str  # kernel, memcpy, memset
    start_us: float  # in a Timeline: from the window's start
    dur_us: float
    correlation: Optional[int]
    cls: str = OTHER


class Timeline(NamedTuple):
    ops: List[Op]  # sorted by start; start_us from the window's start
    lanes: List[Tuple[Union[int, str], Union[int, str]]]  # (device, stream), first used first
    span_us: float  # the window's length
    step: int  # 1-based, of `steps`
    steps: int
    source: str  # what gave the window
    classes: List[str]  # the caller's, then OTHER
    trace: str


# ---- reading ---------------------------------------------------------------------------------

def _num(value: object) -> Optional[float]:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _int(value: object) -> Optional[int]:
    """An id as an int: 7, "7", "stream 7", "stream 7 annotations"; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        found = re.search(r"-?\d+", value)
        return int(found.group(0)) if found else None
    return None


def _first_id(*candidates: object) -> Union[int, str]:
    """The first candidate that reads as an id, else the last one as text."""
    for value in candidates:
        found = _int(value)
        if found is not None:
            return found
    return str(candidates[-1])


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _external_id(event: dict) -> Optional[int]:
    args = _args(event)
    return _int(args.get("External id", args.get("external id")))


def load_json(path: Union[str, os.PathLike]) -> Union[dict, list]:
    """A trace file: .json, or .json.gz (export_chrome_trace compresses for a .gz name)."""
    name = os.fspath(path)
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise TraceError(f"{name}: not a readable Chrome trace: {error}") from error


def load_events(source: Union[str, os.PathLike, dict, list]) -> List[dict]:
    """The trace's events, from a path or from the parsed JSON (an object with "traceEvents",
    as Kineto writes it, or a bare list of events)."""
    data = source if isinstance(source, (dict, list)) else load_json(source)
    name = "trace" if isinstance(source, (dict, list)) else os.fspath(source)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{name}: no traceEvents list (not a Chrome trace)")
    return [e for e in events if isinstance(e, dict)]


def _spans(events: Iterable[dict], cat: str, name: Optional[str] = None) -> List[dict]:
    """Complete events of a category (and name), with numeric ts and dur, by start."""
    found = [e for e in events
             if e.get("ph") == "X" and str(e.get("cat", "")).lower() == cat
             and (name is None or e.get("name") == name)
             and _num(e.get("ts")) is not None and _num(e.get("dur")) is not None]
    return sorted(found, key=lambda e: _num(e["ts"]))


def gpu_ops(events: Iterable[dict]) -> List[Op]:
    ops = []
    for e in events:
        kind = GPU_CATS.get(str(e.get("cat", "")).lower())
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if e.get("ph") != "X" or kind is None or ts is None or dur is None:
            continue
        args = _args(e)
        device = _first_id(args.get("device"), e.get("pid"))
        stream = _first_id(args.get("stream"), e.get("tid"))
        ops.append(Op(device, stream, str(e.get("name", "?")), kind, ts, max(dur, 0.0),
                      _int(args.get("correlation"))))
    return sorted(ops, key=lambda op: op.start_us)


class _Step:
    def __init__(self, cpu: Optional[dict]) -> None:
        self.cpu = cpu
        self.gpu: List[dict] = []

    @property
    def start(self) -> float:
        first = self.cpu if self.cpu is not None else self.gpu[0]
        return _num(first["ts"]) or 0.0


def _steps(events: List[dict], step_name: str) -> List[_Step]:
    """The marked steps in time order, each with its CPU range and its GPU annotations."""
    steps = [_Step(cpu) for cpu in _spans(events, "user_annotation", step_name)]
    by_id = {_external_id(s.cpu): s for s in steps if _external_id(s.cpu) is not None}
    loose: Dict[object, _Step] = {}
    for g in _spans(events, "gpu_user_annotation", step_name):
        step = by_id.get(_external_id(g))
        if step is None and steps:  # no id to match: the last step begun before it on the CPU
            begun = [s for s in steps if _num(s.cpu["ts"]) <= _num(g["ts"]) + 1e-3]
            step = begun[-1] if begun else steps[0]
        if step is None:  # GPU annotations only: one step per id, else one per annotation
            key = _external_id(g)
            step = loose.setdefault(key if key is not None else id(g), _Step(None))
        step.gpu.append(g)
    return sorted(steps + list(loose.values()), key=lambda s: s.start)


def _window(step: _Step, events: List[dict], ops: List[Op]) -> Tuple[float, float, str]:
    """The step's GPU window and what gave it: its GPU annotations and the operations launched
    from inside its CPU range; then, where that range covers them (the step synchronized
    inside its range, as record_steps does, so no other GPU work runs in it), every operation
    inside the range too (one that neither caught); with neither, the CPU range itself."""
    spans: List[Tuple[float, float]] = []
    sources = []
    if step.gpu:
        spans += [(_num(g["ts"]), _num(g["ts"]) + _num(g["dur"])) for g in step.gpu]
        sources.append("its GPU annotations")
    if step.cpu is None:
        return min(a for a, _ in spans), max(b for _, b in spans), sources[0]
    c0 = _num(step.cpu["ts"])
    c1 = c0 + _num(step.cpu["dur"])
    launched = {_int(_args(e).get("correlation")) for e in events
                if e.get("ph") == "X" and str(e.get("cat", "")).lower() in LAUNCH_CATS
                and c0 <= (_num(e.get("ts")) or -1.0) <= c1}
    launched.discard(None)
    mine = [(op.start_us, op.start_us + op.dur_us) for op in ops if op.correlation in launched]
    if mine:
        spans += mine
        sources.append("the operations launched in its CPU range")
    if not spans:
        return c0, c1, "its CPU range"
    if c0 <= min(a for a, _ in spans) and max(b for _, b in spans) <= c1:
        inside = [(op.start_us, op.start_us + op.dur_us) for op in ops
                  if c0 <= op.start_us and op.start_us + op.dur_us <= c1]
        if inside and (min(inside) < min(spans)
                       or max(b for _, b in inside) > max(b for _, b in spans)):
            spans += inside
            sources.append("the operations inside its CPU range")
    return min(a for a, _ in spans), max(b for _, b in spans), " and ".join(sources)


def classify(name: str, classes: Sequence[Tuple[str, str]]) -> str:
    for cls, pattern in classes:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return OTHER


def read_timeline(trace: Union[str, os.PathLike, dict, list],
                  classes: Sequence[Tuple[str, str]] = DEFAULT_CLASSES, *,
                  step_name: str = STEP, which: int = -1, label: Optional[str] = None) -> Timeline:
    """Step `which` (Python indexing: -1 is the last) of a trace (a path, or its parsed JSON
    named by `label`), its operations classified."""
    events = load_events(trace)
    if label is None:
        named = isinstance(trace, (str, os.PathLike))
        label = os.path.basename(os.fspath(trace)) if named else "trace"
    ops = gpu_ops(events)
    if not ops:
        raise TraceError(f"{label}: no GPU kernel or copy in the trace: profile with "
                         "ProfilerActivity.CUDA, where torch.profiler.supported_activities() "
                         "has it (CUPTI; without it the JSON has no GPU events)")
    steps = _steps(events, step_name)
    if not steps:
        raise TraceError(f"{label}: no '{step_name}' range: wrap each profiled call in "
                         f"torch.profiler.record_function({step_name!r})")
    if not -len(steps) <= which < len(steps):
        raise TraceError(f"{label}: step {which} asked for, the trace has {len(steps)}")
    index = which % len(steps)
    start, end, source = _window(steps[index], events, ops)
    eps = 1e-3  # Kineto widens a GPU annotation by 1 ns on each side
    inside = [op for op in ops
              if (op.start_us < end - eps and op.start_us + op.dur_us > start + eps)
              or (op.dur_us == 0 and start <= op.start_us <= end)]
    if not inside:
        raise TraceError(f"{label}: no GPU operation inside step {index + 1}'s window "
                         f"({source})")
    rel = [op._replace(start_us=op.start_us - start, cls=classify(op.name, classes))
           for op in inside]
    lanes: List[Tuple[Union[int, str], Union[int, str]]] = []
    for op in rel:  # sorted by start: a lane's place is its first operation's
        if (op.device, op.stream) not in lanes:
            lanes.append((op.device, op.stream))
    names = [c for c, _ in classes]
    return Timeline(rel, lanes, end - start, index + 1, len(steps), source,
                    names + ([OTHER] if OTHER not in names else []), label)


# ---- numbers ---------------------------------------------------------------------------------

def _union(intervals: Iterable[Tuple[float, float]]) -> List[Tuple[float, float]]:
    merged: List[List[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


Intervals = List[Tuple[float, float]]


def _intersect(x: Intervals, y: Intervals) -> Intervals:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _clipped(t: Timeline, ops: Iterable[Op]) -> List[Tuple[float, float]]:
    return _union((max(0.0, op.start_us), min(t.span_us, op.start_us + op.dur_us)) for op in ops)


def busy_intervals(t: Timeline, cls: str) -> List[Tuple[float, float]]:
    return _clipped(t, (op for op in t.ops if op.cls == cls))


def busy_us(t: Timeline, cls: str) -> float:
    """Time at least one operation of `cls` runs in the window (concurrent ones count once)."""
    return sum(b - a for a, b in busy_intervals(t, cls))


def overlap_intervals(t: Timeline, pair: Tuple[str, str] = OVERLAP) -> List[Tuple[float, float]]:
    return _intersect(busy_intervals(t, pair[0]), busy_intervals(t, pair[1]))


def overlap_us(t: Timeline, pair: Tuple[str, str] = OVERLAP) -> float:
    """Time both classes of `pair` run at once (on any streams)."""
    return sum(b - a for a, b in overlap_intervals(t, pair))


def summary(t: Timeline, pair: Tuple[str, str] = OVERLAP) -> str:
    """One line for a log: the window, each class's busy time, the time at once."""
    busy = ", ".join(f"{c} {busy_us(t, c):.1f}" for c in t.classes if busy_us(t, c) > 0)
    return (f"step {t.step} of {t.steps}: {t.span_us:.1f} us on {len(t.lanes)} stream(s); "
            f"busy (us) {busy}; {pair[0]} while {pair[1]} {overlap_us(t, pair):.1f} us")


# ---- drawing ---------------------------------------------------------------------------------

WIDTH, LEFT, RIGHT = 960, 150, 24
LANE_H, LANE_GAP, CHAR_W = 24, 6, 6.1  # CHAR_W: a character of the 10 px labels, roughly


def short_name(name: str) -> str:
    """A kernel's name without return type, template arguments, parameters and namespaces;
    NVSHMEM's static kernels ("__nv_static_..._Z43nvshmemi_signal_wait_...") unmangled."""
    mangled = re.search(r"_Z[LN]?(\d+)", name)
    if mangled and "(" not in name:
        n = int(mangled.group(1))
        return name[mangled.end() : mangled.end() + n] or name
    if name.startswith(("Memcpy", "Memset")):
        return name.split(" (")[0]
    text = re.sub(r"^void ", "", name)
    depth, kept = 0, []
    for ch in text:  # drop <...>, then stop at the parameters
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            if ch == "(" and kept:
                break
            kept.append(ch)
    parts = [p for p in "".join(kept).strip().split("::") if p]
    if not parts:
        return name
    if parts[-1] in ("device_kernel", "kernel") and len(parts) > 1:
        return "::".join(parts[-2:])
    return parts[-1]


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _attr(value: object) -> str:
    return escape(str(value), {'"': "&quot;"})


def _lane_label(t: Timeline, lane: Tuple[Union[int, str], Union[int, str]]) -> str:
    devices = {d for d, _ in t.lanes}
    stream = f"stream {lane[1]}"
    return stream if len(devices) == 1 else f"GPU {lane[0]}, {stream}"


def colours_for(classes: Sequence[str], given: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    unknown = [c for c in classes if c not in KNOWN_COLOURS and c != OTHER]
    out = {c: KNOWN_COLOURS.get(c) or PALETTE[unknown.index(c) % len(PALETTE)]
           for c in classes if c != OTHER}
    out[OTHER] = OTHER_COLOUR
    out.update(given or {})
    return out


def svg_text(t: Timeline, title: str, *, axis_us: Optional[float] = None,
             colours: Optional[Dict[str, str]] = None, pair: Tuple[str, str] = OVERLAP) -> str:
    """The figure: title, a line of numbers, legend, one lane per stream, the strip where
    `pair` runs at once, and the time axis. `axis_us` (at least the window) gives two
    figures the same scale."""
    axis = max(t.span_us, axis_us or 0.0) or 1.0
    colour = colours_for(t.classes, colours)
    plot_w = WIDTH - LEFT - RIGHT

    def x(us: float) -> float:
        return LEFT + max(0.0, min(us, axis)) / axis * plot_w

    both = overlap_intervals(t, pair)
    show_both = busy_us(t, pair[0]) > 0 and busy_us(t, pair[1]) > 0
    top = 78
    rows = len(t.lanes) + (1 if show_both else 0)
    lanes_end = top + rows * (LANE_H + LANE_GAP)
    height = lanes_end + 48
    # a long title gets smaller rather than running off the figure (bold sans: ~0.6 em a letter)
    title_size = max(9.0, min(15.0, (WIDTH - 24) / (0.6 * max(len(title), 1))))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>",
           f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
           f'<text x="12" y="22" font-size="{title_size:.1f}" font-weight="bold">'
           f"{escape(title)}</text>",
           f'<text x="12" y="40" fill="#555555">{escape(_numbers_line(t, pair))}</text>']
    # legend: every class the caller named, "other" where it occurs, and the strip
    legend = [c for c in t.classes if c != OTHER or any(op.cls == OTHER for op in t.ops)]
    lx = 12.0
    for cls in legend:
        out.append(f'<rect x="{lx:.1f}" y="50" width="10" height="10" fill="{colour[cls]}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="59">{escape(cls)}</text>')
        lx += 14 + CHAR_W * len(cls) + 18
    if show_both:
        label = f"{pair[0]} and {pair[1]} at once"
        out.append(f'<rect x="{lx:.1f}" y="50" width="10" height="10" fill="{BOTH_COLOUR}"/>')
        out.append(f'<text x="{lx + 14:.1f}" y="59">{escape(label)}</text>')
    # the step, and the grid
    out.append(f'<rect x="{LEFT}" y="{top - 3}" width="{x(t.span_us) - LEFT:.2f}" '
               f'height="{lanes_end - top}" fill="#f3f3f3"/>')
    tick = _nice_step(axis)
    decimals = max(0, -math.floor(math.log10(tick)))
    ticks = [i * tick for i in range(int(axis / tick + 1e-9) + 1)]
    for v in ticks:
        out.append(f'<line x1="{x(v):.2f}" y1="{top - 3}" x2="{x(v):.2f}" y2="{lanes_end}" '
                   'stroke="#dddddd" stroke-width="0.6"/>')
    # lanes
    for row, lane in enumerate(t.lanes):
        y = top + row * (LANE_H + LANE_GAP)
        mine = [op for op in t.ops if (op.device, op.stream) == lane]
        main = max(t.classes, key=lambda c: busy_us(t._replace(ops=mine), c))
        out.append(f'<text x="{LEFT - 8}" y="{y + 11}" text-anchor="end">'
                   f"{escape(_lane_label(t, lane))}</text>")
        out.append(f'<text x="{LEFT - 8}" y="{y + 22}" text-anchor="end" font-size="9" '
                   f'fill="#777777">mostly {escape(main)}</text>')
        for op in mine:
            x0, x1 = x(op.start_us), x(op.start_us + op.dur_us)
            w = max(x1 - x0, 0.6)  # a kernel of a microsecond stays visible
            tip = (f"{op.name}\n{op.cls}, {op.kind}: {op.dur_us:.1f} us "
                   f"from {op.start_us:.1f} us")
            out.append(f'<rect class="op {_attr(op.cls)}" x="{x0:.2f}" y="{y}" width="{w:.2f}" '
                       f'height="{LANE_H}" fill="{colour.get(op.cls, OTHER_COLOUR)}" '
                       f'stroke="#ffffff" stroke-width="{0.5 if w > 3 else 0}">'
                       f"<title>{escape(tip)}</title></rect>")
            label, fits = short_name(op.name), int((w - 6) / CHAR_W)
            if len(label) > fits >= 6:  # what fits of a long name, marked as cut
                label = label[: fits - 1] + "\u2026"
            if len(label) <= fits:
                out.append(f'<text x="{x0 + 3:.2f}" y="{y + LANE_H / 2 + 3.5:.1f}" '
                           f'font-size="10" fill="#ffffff">{escape(label)}</text>')
    if show_both:
        y = top + len(t.lanes) * (LANE_H + LANE_GAP)
        out.append(f'<text x="{LEFT - 8}" y="{y + 15}" text-anchor="end">both at once</text>')
        for a, b in both:
            out.append(f'<rect class="both" x="{x(a):.2f}" y="{y + 6}" '
                       f'width="{max(x(b) - x(a), 0.6):.2f}" height="{LANE_H - 12}" '
                       f'fill="{BOTH_COLOUR}"/>')
    # axis
    ay = lanes_end + 4
    out.append(f'<line x1="{LEFT}" y1="{ay}" x2="{LEFT + plot_w}" y2="{ay}" stroke="#333333"/>')
    for v in ticks:
        out.append(f'<line x1="{x(v):.2f}" y1="{ay}" x2="{x(v):.2f}" y2="{ay + 4}" '
                   'stroke="#333333"/>')
        out.append(f'<text x="{x(v):.2f}" y="{ay + 16}" text-anchor="middle" font-size="10">'
                   f"{v:.{decimals}f}</text>")
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{ay + 34}" text-anchor="middle" '
               f'fill="#555555">time from the step\'s first GPU operation (\u00b5s)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _numbers_line(t: Timeline, pair: Tuple[str, str]) -> str:
    parts = [f"step {t.step} of {t.steps}: {t.span_us:.1f} \u00b5s"]
    parts += [f"{c} {busy_us(t, c):.1f} \u00b5s" for c in pair if busy_us(t, c) > 0]
    if busy_us(t, pair[0]) > 0 and busy_us(t, pair[1]) > 0:
        parts.append(f"at once {overlap_us(t, pair):.1f} \u00b5s")
    return "; ".join(parts)


def csv_text(t: Timeline, header: Sequence[str] = (), pair: Tuple[str, str] = OVERLAP) -> str:
    """'# ' lines (the caller's, then trace, step, window_us, busy_us, overlap_us), then one
    row per operation: stream, name, class, start_us (from the window's start), dur_us."""
    f = io.StringIO()
    for line in header:
        f.write(f"# {line}\n")
    f.write(f"# trace: {t.trace}\n")
    f.write(f"# step: {t.step} of {t.steps} (window from {t.source})\n")
    f.write(f"# window_us: {t.span_us:.3f}\n")
    f.write("# busy_us: " + " ".join(f"{c}={busy_us(t, c):.3f}" for c in t.classes) + "\n")
    f.write(f"# overlap_us: {pair[0]}&{pair[1]}={overlap_us(t, pair):.3f}\n")
    devices = {d for d, _ in t.lanes}
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["stream", "name", "class", "start_us", "dur_us"])
    for op in t.ops:
        stream = op.stream if len(devices) == 1 else f"{op.device}:{op.stream}"
        w.writerow([stream, op.name, op.cls, f"{op.start_us:.3f}", f"{op.dur_us:.3f}"])
    return f.getvalue()


def draw(t: Timeline, prefix: str, title: str, *, header: Sequence[str] = (),
         axis_us: Optional[float] = None, colours: Optional[Dict[str, str]] = None,
         pair: Tuple[str, str] = OVERLAP) -> Tuple[str, str]:
    """Writes PREFIX.svg and PREFIX.csv; returns their paths."""
    svg_path, csv_path = prefix + ".svg", prefix + ".csv"
    folder = os.path.dirname(prefix)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(svg_path, "w", encoding="utf-8") as f:
        f.write(svg_text(t, title, axis_us=axis_us, colours=colours, pair=pair))
    with open(csv_path, "w", encoding="utf-8") as f:
        f.write(csv_text(t, header, pair))
    return svg_path, csv_path


def draw_all(traces: Dict[str, Tuple[str, str]], prefix: str,
             classes: Sequence[Tuple[str, str]] = DEFAULT_CLASSES, *,
             header: Sequence[str] = (), pair: Tuple[str, str] = OVERLAP) -> Dict[str, Timeline]:
    """Each trace (name -> (title, path)), its last step drawn as PREFIX_<name>.svg and .csv,
    all on the longest step's time scale, so that the figures compare at a glance."""
    timelines = {name: read_timeline(path, classes) for name, (_, path) in traces.items()}
    axis = max(t.span_us for t in timelines.values())
    for name, t in timelines.items():
        draw(t, f"{prefix}_{name}", traces[name][0], header=header, axis_us=axis, pair=pair)
    return timelines


# ---- recording (on the GPU machine; torch is imported only here) ----------------------------

def record_steps(step: Callable[[], object], trace_path: Optional[str], *, steps: int = 3,
                 warmup: int = 3, barrier: Callable[[], object]) -> None:
    """Collective: every rank calls it with the same arguments but `trace_path` (None: do not
    write). A barrier first (the previous call's trace may still be writing on rank 0), then
    `warmup` calls, then `steps` calls under torch.profiler (CPU and CUDA activity), each
    after `barrier()` and a synchronize. Each call and a synchronize run inside
    record_function(STEP): the step's CPU range then holds all of its GPU work and no other,
    which read_timeline uses where Kineto's annotations miss an operation."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, supported_activities

    if ProfilerActivity.CUDA not in supported_activities():  # the same answer on every rank
        raise RuntimeError("torch.profiler cannot trace CUDA here (no CUPTI): "
                           "torch.profiler.supported_activities() lacks ProfilerActivity.CUDA")
    barrier()
    torch.cuda.synchronize()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            barrier()
            torch.cuda.synchronize()
            with record_function(STEP):
                step()
                torch.cuda.synchronize()
    if trace_path:
        folder = os.path.dirname(trace_path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(trace_path)


# ---- self-test -------------------------------------------------------------------------------

GEMM = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<sm90_tile> >(Params)"
NVJET = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
COPY = "Memcpy DtoD (Device -> Device)"
NCCL = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
WAIT_KERNEL = ("__nv_static_40__23788db7_18_quiet_on_stream_cu_8b283494__"
               "Z43nvshmemi_signal_wait_until_on_stream_kernelPVmim")
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)"


def synthetic_trace(steps: int = 3, *, gpu_annotations: bool = True, launches: bool = True,
                    ids: bool = True, synced: bool = True, missed: Sequence[str] = ()) -> dict:
    """What Kineto writes for `steps` profiled calls, each 1000 us after the last: a CPU range
    (500 us: synchronized inside, as record_steps does; else 100 us), on stream 7 (compute) a
    GEMM, a fill, a wait and an nvjet GEMM; on stream 22 a device-to-device copy and an NCCL
    kernel; plus what a real trace has around them. The operations named in `missed` have no
    launch event and no place in the GPU annotations (a launch Kineto did not correlate)."""
    ev: List[dict] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "X", "cat": "Trace", "ts": 0, "dur": 9000, "pid": "Spans", "tid": "PyTorch Profiler",
         "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": 0},
    ]
    # (stream, name, cat, start, duration) from the step's CPU start
    layout = [(22, COPY, "gpu_memcpy", 40, 150), (7, FILL, "kernel", 45, 2),
              (7, GEMM, "kernel", 50, 300), (22, NCCL, "kernel", 200, 100),
              (7, WAIT_KERNEL, "kernel", 352, 6), (7, NVJET, "kernel", 360, 100)]
    correlation = 100
    for k in range(steps):
        base = 1000.0 * (k + 1)
        ext = 10 + k
        # before each step, outside its range: the barrier's kernel
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "pid": 0, "tid": 7, "ts": base - 100, "dur": 20.0,
                   "args": {"stream": 7, "correlation": 1 + k, "device": 0}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": STEP, "pid": 4242, "tid": 4242,
                   "ts": base, "dur": 500.0 if synced else 100.0,
                   "args": {"External id": ext} if ids else {}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242,
                   "ts": base + 5, "dur": 20.0, "args": {"External id": ext + 1000}})
        per_stream: Dict[int, List[float]] = {}
        for i, (stream, name, cat, at, dur) in enumerate(layout):
            correlation += 1
            if k == steps - 1 and name == NVJET:
                cat = "Kernel"  # Kineto's older spelling, read the same
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                       "ts": base + at, "dur": float(dur),
                       "args": {"device": 0, "stream": stream, "correlation": correlation}})
            if launches and name not in missed:
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 4242, "tid": 4242, "ts": base + 10 + i, "dur": 0.5,
                           "args": {"cbid": 211, "correlation": correlation}})
            ev.append({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": base + at,
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})
            if name not in missed:
                lo, hi = per_stream.get(stream, [math.inf, -math.inf])
                per_stream[stream] = [min(lo, base + at), max(hi, base + at + dur)]
        if gpu_annotations:
            for stream, (lo, hi) in per_stream.items():
                ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": STEP, "pid": 0,
                           "tid": stream, "ts": lo - 0.001, "dur": hi - lo + 0.002,
                           "args": {"External id": ext} if ids else {}})
    ev.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
               "ts": 1000.0 * (steps + 1)})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "traceEvents": ev}


def self_test() -> int:
    import xml.etree.ElementTree as ET

    cases: List[Tuple[str, object, object]] = []

    def case(what: str, got: object, want: object) -> None:
        cases.append((what, got, want))

    def near(a: float, b: float) -> bool:
        return abs(a - b) < 0.01

    chapter6 = (("compute", COMPUTE), ("wait", WAIT), ("communication", f"{COMMUNICATION}|{PEER_COPY}"))
    t = read_timeline(synthetic_trace(), chapter6)
    classes = {short_name(op.name): op.cls for op in t.ops}
    case("the last of 3 steps is drawn", (t.step, t.steps), (3, 3))
    case("two lanes, the first used first", t.lanes, [(0, 22), (0, 7)])
    case("the step's six operations, not the barriers between steps", len(t.ops), 6)
    case("the window runs from the copy's start to the GEMM's end", near(t.span_us, 420.0), True)
    case("classes", classes, {"cutlass::device_kernel": "compute", NVJET: "compute",
                              "Memcpy DtoD": "communication", "ncclDevKernel_AllGather_RING_LL":
                              "communication", "nvshmemi_signal_wait_until_on_stream_kernel": "wait",
                              "vectorized_elementwise_kernel": "other"})
    default = {short_name(op.name): op.cls for op in read_timeline(synthetic_trace()).ops}
    case("by default a device-to-device copy is no communication", default["Memcpy DtoD"], "other")
    case("the old 'Kernel' spelling is read", any(op.name == NVJET for op in t.ops), True)
    case("compute busy: 300 + 100 us", near(busy_us(t, "compute"), 400.0), True)
    case("communication busy: copy 150 + NCCL 100 us", near(busy_us(t, "communication"), 250.0), True)
    case("communication while compute: 140 + 100 us", near(overlap_us(t), 240.0), True)
    first = read_timeline(synthetic_trace(), which=0)
    case("step 1 is chosen with which=0", (first.step, len(first.ops), near(first.span_us, 420.0)),
         (1, 6, True))
    no_ids = read_timeline(synthetic_trace(ids=False))
    case("GPU annotations without ids go to the step begun before them",
         (len(no_ids.ops), near(no_ids.span_us, 420.0)), (6, True))
    case("the window: GPU annotations, launches (the CPU range adds nothing)", t.source,
         "its GPU annotations and the operations launched in its CPU range")
    launched = read_timeline(synthetic_trace(gpu_annotations=False, synced=False))
    case("no GPU annotation: the operations launched in the CPU range",
         (launched.source, len(launched.ops), near(launched.span_us, 420.0)),
         ("the operations launched in its CPU range", 6, True))
    cpu_only = read_timeline(synthetic_trace(gpu_annotations=False, launches=False))
    case("nothing to correlate: the CPU range, and what overlaps it",
         (cpu_only.source, len(cpu_only.ops), near(cpu_only.span_us, 500.0)),
         ("its CPU range", 6, True))
    cpu_only = read_timeline(synthetic_trace(gpu_annotations=False, launches=False, synced=False))
    case("nothing to correlate, GPU work past the range: what overlaps the range",
         (cpu_only.source, len(cpu_only.ops), near(cpu_only.span_us, 100.0)),
         ("its CPU range", 3, True))
    missed = read_timeline(synthetic_trace(missed=[COPY]))
    case("a copy neither annotated nor launched, in a synchronized step: kept, window from it",
         (missed.source.endswith("the operations inside its CPU range"), len(missed.ops),
          near(missed.span_us, 420.0)), (True, 6, True))
    unsynced = read_timeline(synthetic_trace(missed=[COPY], synced=False))
    case("the same, unsynchronized: the window starts at the first annotated operation",
         (len(unsynced.ops), near(unsynced.span_us, 415.0)), (6, True))
    bare = read_timeline(synthetic_trace()["traceEvents"])
    case("a bare event list is read", len(bare.ops), 6)

    def error_of(trace: object) -> str:
        try:
            read_timeline(trace)  # type: ignore[arg-type]
        except TraceError as error:
            return str(error)
        return "no error"

    unmarked = [e for e in synthetic_trace()["traceEvents"] if e.get("name") != STEP]
    case("no step: the error names record_function",
         "record_function('step')" in error_of(unmarked), True)
    no_gpu = [e for e in synthetic_trace()["traceEvents"] if e.get("pid") != 0]
    case("no GPU events: the error names ProfilerActivity.CUDA",
         "ProfilerActivity.CUDA" in error_of(no_gpu), True)
    case("a short name from a template", short_name(FILL), "vectorized_elementwise_kernel")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(synthetic_trace(), f)
        svg_path, csv_path = draw(read_timeline(path, chapter6), os.path.join(tmp, "out", "t"),
                                  "Serial & overlapped", header=["gpu: NVIDIA H100 80GB HBM3 x 2",
                                                                 "date: 2026-01-01 00:00 UTC"],
                                  axis_us=840.0)
        root = ET.parse(svg_path).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        rects = root.iter(f"{ns}rect")
        ops = [r for r in rects if (r.get("class") or "").startswith("op ")]
        texts = [el.text or "" for el in root.iter(f"{ns}text")]
        case("the SVG parses and has a rectangle per operation", len(ops), 6)
        case("rectangles are classed", sorted({r.get("class") for r in ops}),
             ["op communication", "op compute", "op other", "op wait"])
        right = max(float(r.get("x")) + float(r.get("width")) for r in ops)
        case("a longer axis: the step fills half the plot",
             near(right, LEFT + (WIDTH - LEFT - RIGHT) / 2), True)
        case("title, escaped", "Serial & overlapped" in texts, True)
        case("legend and lanes",
             all(s in texts for s in ("compute", "communication", "stream 7", "stream 22")), True)
        case("the strip where both run",
             len([r for r in root.iter(f"{ns}rect") if r.get("class") == "both"]), 2)
        case("axis labelled in microseconds", any("\u00b5s" in s for s in texts), True)
        with open(csv_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        comments = [line[2:] for line in lines if line.startswith("# ")]
        rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
        case("CSV rows and columns", (len(rows), list(rows[0])),
             (6, ["stream", "name", "class", "start_us", "dur_us"]))
        case("CSV rows start at 0 and name their stream",
             (rows[0]["start_us"], rows[0]["stream"]), ("0.001", "22"))
        case("CSV header: the caller's lines, window, busy, overlap",
             [c.split(":")[0] for c in comments],
             ["gpu", "date", "trace", "step", "window_us", "busy_us", "overlap_us"])
        case("CSV overlap line", comments[-1], "overlap_us: communication&compute=240.000")
        out = os.path.join(tmp, "cli")
        with contextlib.redirect_stdout(io.StringIO()):
            code = main([path, "--out", out, "--class", "gemm=gemm|nvjet", "--step", "1"])
        with open(out + ".csv", encoding="utf-8") as f:
            cli_rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]
        case("CLI: --class replaces the classes, --step picks step 1",
             (code, sorted({r["class"] for r in cli_rows})), (0, ["gemm", "other"]))
        log = _record_with_a_stand_in_torch(os.path.join(tmp, "rec", "t.json"))
        case("record_steps: barrier, warm-ups, then each step after a barrier, in its range",
             log[:-1], ["barrier", "sync", "call", "call", "sync", "profile CPU,CUDA",
                        "barrier", "sync", "[step", "call", "sync", "step]",
                        "barrier", "sync", "[step", "call", "sync", "step]", "end profile"])
        case("record_steps: the trace it exports reads back", log[-1], "exported 6 operations")
        case("record_steps: no path, no export",
             _record_with_a_stand_in_torch(None)[-1], "end profile")
    failed = [(what, got, want) for what, got, want in cases if got != want]
    for what, got, want in failed:
        print(f"self-test: {what}: got {got!r}, want {want!r}")
    print(f"self-test: {len(cases) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _record_with_a_stand_in_torch(path: Optional[str]) -> List[str]:
    """record_steps's order of calls, under a stand-in for torch and torch.profiler (the CPU
    machine has no torch; the real one is what the GPU runs)."""
    import types

    log: List[str] = []

    class Profile:
        def __init__(self, activities: Sequence[str]) -> None:
            log.append("profile " + ",".join(activities))

        def __enter__(self) -> "Profile":
            return self

        def __exit__(self, *exc: object) -> None:
            log.append("end profile")

        def export_chrome_trace(self, where: str) -> None:
            with open(where, "w", encoding="utf-8") as f:
                json.dump(synthetic_trace(2), f)
            log.append(f"exported {len(read_timeline(where).ops)} operations")

    class Range:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            log.append("[" + self.name)

        def __exit__(self, *exc: object) -> None:
            log.append(self.name + "]")

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        synchronize=lambda: log.append("sync"))
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(  # type: ignore[attr-defined]
        CPU="CPU", CUDA="CUDA")
    profiler.profile = Profile  # type: ignore[attr-defined]
    profiler.record_function = Range  # type: ignore[attr-defined]
    profiler.supported_activities = lambda: {"CPU", "CUDA"}  # type: ignore[attr-defined]
    torch.profiler = profiler  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("torch", "torch.profiler")}
    sys.modules.update({"torch": torch, "torch.profiler": profiler})
    try:
        record_steps(lambda: log.append("call"), path, steps=2, warmup=2,
                     barrier=lambda: log.append("barrier"))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return log


# ---- command line ----------------------------------------------------------------------------

def _class_arg(text: str) -> Tuple[str, str]:
    name, sep, pattern = text.partition("=")
    if not sep or not name or not pattern:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=REGEX")
    try:
        re.compile(pattern)
    except re.error as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from error
    return name, pattern


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", help="Chrome trace from prof.export_chrome_trace")
    parser.add_argument("--out", help="PREFIX of PREFIX.svg and PREFIX.csv (default: the trace's "
                        "path without .json)")
    parser.add_argument("--title", help="the figure's title (default: the trace's name)")
    parser.add_argument("--step", type=int, default=0, help="which step, from 1 (default: the last)")
    parser.add_argument("--class", dest="classes", action="append", type=_class_arg,
                        metavar="NAME=REGEX", help="a class, tried in the order given (default: "
                        + ", ".join(c for c, _ in DEFAULT_CLASSES) + ")")
    parser.add_argument("--axis-us", type=float, help="the axis' length (to match another figure)")
    parser.add_argument("--self-test", action="store_true", help="check on a synthetic trace")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.trace:
        parser.error("give a trace (or --self-test)")
    prefix = args.out or re.sub(r"\.json(\.gz)?$", "", args.trace)
    try:
        raw = load_json(args.trace)
        t = read_timeline(raw, args.classes or DEFAULT_CLASSES, label=os.path.basename(args.trace),
                          which=args.step - 1 if args.step > 0 else -1)
    except TraceError as error:
        print(f"plot_timeline: {error}", file=sys.stderr)
        return 1
    header = []  # the GPU, where the trace names it (Kineto's "deviceProperties")
    props = raw.get("deviceProperties") if isinstance(raw, dict) else None
    if isinstance(props, list) and props and isinstance(props[0], dict) and props[0].get("name"):
        header.append(f"gpu: {props[0]['name']}")
    svg_path, csv_path = draw(t, prefix, args.title or os.path.basename(prefix), header=header,
                              axis_us=args.axis_us)
    print(f"plot_timeline: {summary(t)}; wrote {svg_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
