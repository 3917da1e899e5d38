#!/usr/bin/env python3
"""Timeline figures drawn from a real run: a torch.profiler Chrome trace as one lane per CUDA
stream and one rectangle per kernel or copy, coloured by what it does, over one marked step.

    python3 benchmarks/plot_timeline.py TRACE.json [--out PREFIX] [--title TEXT] [--step N]
        [--class NAME=REGEX ...] [--axis-us US]      # writes PREFIX.svg and PREFIX.csv
    python3 benchmarks/plot_timeline_test.py         # its checks, on a synthetic trace

Recording (`record_steps`, what `--timeline` of scripts/ch06_overlap.py and
scripts/moe_layer.py calls on every rank): warm-up calls, then each profiled call, after a
barrier and a synchronize, inside `torch.profiler.record_function("step")` together with a
synchronize, under torch.profiler with CPU and CUDA activity; rank 0 writes the trace
(`export_chrome_trace`).

Reading and classifying: benchmarks/timeline_trace.py.

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
import csv
import io
import math
import os
import re
import sys
from typing import Callable, Dict, Optional, Sequence, Tuple, Union
from xml.sax.saxutils import escape

from timeline_trace import (
    busy_us,
    DEFAULT_CLASSES,
    load_json,
    OTHER,
    OVERLAP,
    overlap_intervals,
    overlap_us,
    read_timeline,
    STEP,
    summary,
    Timeline,
    TraceError,
)

KNOWN_COLOURS = {"compute": "#4c72b0", "communication": "#dd8452", "wait": "#ccb974"}
PALETTE = ("#55a868", "#c44e52", "#64b5cd", "#937860", "#da8bc3")  # for other names
OTHER_COLOUR, BOTH_COLOUR = "#8c8c8c", "#8172b3"


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
    args = parser.parse_args(argv)
    if not args.trace:
        parser.error("give a trace")
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
