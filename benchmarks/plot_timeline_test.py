#!/usr/bin/env python3
"""Checks of the timeline figures (benchmarks/timeline_trace.py, benchmarks/plot_timeline.py) on
a synthetic torch.profiler trace, on the CPU, and record_steps under a stand-in for torch.

    python3 benchmarks/plot_timeline_test.py      (scripts/test.sh runs it)
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

from plot_timeline import draw, main, record_steps, short_name, LEFT, RIGHT, WIDTH
from timeline_trace import (
    busy_us,
    COMMUNICATION,
    COMPUTE,
    overlap_us,
    PEER_COPY,
    read_timeline,
    STEP,
    TraceError,
    WAIT,
)

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


if __name__ == "__main__":
    sys.exit(self_test())
