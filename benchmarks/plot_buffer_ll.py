#!/usr/bin/env python3
"""Merges chapter 8's benchmark CSVs (benchmarks/buffer_ll_bench.py for ours and for DeepEP)
into one CSV and plots the times side by side: a pair of bars (ours, DeepEP) per op.

Usage: python3 benchmarks/plot_buffer_ll.py OUT.csv IN.csv [IN.csv ...]
"""
import csv
import sys
from pathlib import Path

HEADER = "method,op,ep,timing,us,gb_per_s"
OPS = ["dispatch", "combine", "dispatch_send", "dispatch_recv", "combine_send", "combine_recv", "dispatch_combine"]


def main():
    out, inputs = Path(sys.argv[1]), [p for p in sys.argv[2:] if Path(p).exists()]
    comments, rows = [], []
    for path in inputs:
        lines = Path(path).read_text().splitlines()
        comments += [line for line in lines if line.startswith("#") and line not in comments]
        rows += list(csv.DictReader(line for line in lines if not line.startswith("#")))
    out.write_text("\n".join(comments + [HEADER] + [",".join(r[k] for k in HEADER.split(",")) for r in rows]) + "\n")
    print(f"plot_buffer_ll: wrote {out} ({len(rows)} rows)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.4
    for i, method in enumerate(("ours", "deepep")):
        times = {r["op"]: float(r["us"]) for r in rows if r["method"] == method}
        xs = [j + (i - 0.5) * width for j, op in enumerate(OPS) if op in times]
        bars = ax.bar(xs, [times[op] for op in OPS if op in times], width, label=method)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(OPS)), [op.replace("_", "\n") for op in OPS])
    ax.set_ylabel("us (kernel; dispatch_combine: graph replay)")
    ax.set_title(f"Low-latency mode, EP{rows[0]['ep'] if rows else '?'}: 128 tokens x 7168, top-8 of 288, fp8 dispatch")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    print(f"plot_buffer_ll: wrote {png}")


if __name__ == "__main__":
    main()
