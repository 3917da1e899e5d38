"""The trace model behind the timeline figures (benchmarks/plot_timeline.py draws them): a
torch.profiler Chrome trace read into one step's GPU operations, each with its stream and its
class, and the numbers the book quotes (busy time per class, the time two classes run at once).

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
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

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
