"""DeepEP V2's timings as rows of buffer_bench's CSV (method `deepep_v2`).

benchmarks/deepep_v2.sh runs V2's own tests/elastic/test_ep.py, which prints per rank, per
dtype, "dispatch: .. GB/s (SU), T us, B bytes | copy: .. GB/s, C us" and "combine: .. , T us,
B bytes | reduce: .., R us" (profiler kernel times). This reads those lines, either from the
script's own log (runs marked "== deepep_v2: run NAME") or from the raw per-run logs it keeps
(v2_NAME_epN.log), and averages them over the ranks. A V2 call is two kernels, the exchange
and its copy into the outputs (dispatch) or its reduce (combine): a row's time is their sum, as
buffer_bench's `dispatch_gpu` / `combine_gpu` rows sum the kernels of our call, and its
bandwidth is V2's own byte count over that time.

    python3 benchmarks/deepep_v2_rows.py --ep 2 --out deepep_v2_h100_ep2.csv LOG [LOG ...]

Rows come from the normal-shape runs (auto, analytical, sm24: 4096 tokens x 7168, top-8 of 256
experts); the `ll` run (the decode shape) has no row here, since the CSV has no shape column.
The book's generator (scripts/bookgen/pages_buffer.py) reads the same logs with `parse_runs`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Dict, List

NORMAL_RUNS = ("auto", "analytical", "sm24")


def parse_runs(log: str, run: str = "") -> Dict[str, Dict[str, float]]:
    """Per run: V2's SM count (`sms`) and, means over ranks, `dispatch_<dtype>` and
    `copy_<dtype>` (us), `dispatch_bytes_<dtype>`, `combine`, `reduce` (us) and
    `combine_bytes`. `run` names the run of a raw log without markers."""
    runs: Dict[str, Dict[str, List[float]]] = {}
    dtype = None
    if run:
        runs[run] = {}
    for line in log.splitlines():
        if m := re.match(r"== deepep_v2: run (\w+)", line):
            run = m.group(1)
            runs[run] = {}
        elif not run:
            continue
        elif m := re.search(r"> #SM: (\d+)", line):
            runs[run]["sms"] = [float(m.group(1))]
        elif m := re.search(r"use_fp8_dispatch=(\d)", line):
            dtype = "fp8" if m.group(1) == "1" else "bf16"
        elif m := re.search(r"dispatch: .*?([\d.]+) us, (\d+) bytes \| copy: .*?([\d.]+) us", line):
            runs[run].setdefault(f"dispatch_{dtype}", []).append(float(m.group(1)))
            runs[run].setdefault(f"dispatch_bytes_{dtype}", []).append(float(m.group(2)))
            runs[run].setdefault(f"copy_{dtype}", []).append(float(m.group(3)))
        elif m := re.search(r"combine: .*?([\d.]+) us, (\d+) bytes \| reduce: .*?([\d.]+) us", line):
            runs[run].setdefault("combine", []).append(float(m.group(1)))
            runs[run].setdefault("combine_bytes", []).append(float(m.group(2)))
            runs[run].setdefault("reduce", []).append(float(m.group(3)))
    return {name: {k: sum(v) / len(v) for k, v in parts.items()} for name, parts in runs.items()}


def csv_rows(runs: Dict[str, Dict[str, float]], ep: int) -> List[str]:
    """buffer_bench's columns (method,op,dtype,ep,num_sms,chunk,us,gb_per_s) for the
    normal-shape runs, whole calls only: exchange + copy, exchange + reduce."""
    out = []
    for name in NORMAL_RUNS:
        v = runs.get(name)
        if not v or "sms" not in v:
            continue
        sms = int(v["sms"])
        for dtype in ("fp8", "bf16"):
            if f"dispatch_{dtype}" in v:
                t = v[f"dispatch_{dtype}"] + v[f"copy_{dtype}"]
                out.append(f"deepep_v2,dispatch_gpu,{dtype},{ep},{sms},0,{t:.2f},{v[f'dispatch_bytes_{dtype}'] / t / 1e3:.2f}")
        if "combine" in v:
            t = v["combine"] + v["reduce"]
            out.append(f"deepep_v2,combine_gpu,bf16,{ep},{sms},0,{t:.2f},{v['combine_bytes'] / t / 1e3:.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("logs", type=Path, nargs="+")
    args = parser.parse_args()
    runs: Dict[str, Dict[str, float]] = {}
    for path in args.logs:
        raw = re.match(r"v2_(\w+?)_ep\d+\.log$", path.name)
        runs.update(parse_runs(path.read_text(errors="replace"), raw.group(1) if raw else ""))
    rows = csv_rows(runs, args.ep)
    if not rows:
        raise SystemExit(f"deepep_v2_rows: no normal-shape run in {[str(p) for p in args.logs]}")
    dates = sorted({m.group(1) for p in args.logs for m in re.finditer(r"deepep_v2: (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", p.read_text(errors="replace"))})
    header = (f"# from: {', '.join(p.name for p in args.logs)}; date: {', '.join(dates) or 'see the logs'}\n"
              "# DeepEP V2 (tests/elastic/test_ep.py through benchmarks/deepep_v2.sh), profiler kernel means over "
              "ranks; us = the exchange + its copy (dispatch) or its reduce (combine); gb_per_s = V2's byte count / us\n"
              "method,op,dtype,ep,num_sms,chunk,us,gb_per_s\n")
    args.out.write_text(header + "\n".join(rows) + "\n")
    print(f"deepep_v2_rows: wrote {args.out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
