#!/usr/bin/env python3
"""Merges chapter 4's benchmark CSVs (ours from ch04-coll-bench, the peers from coll_bench.py)
into benchmarks/results/coll_<gpu>_<N>gpu.csv and plots one PNG per collective next to it:
time per call against size, log-log, one line per method and algorithm.

Usage: python3 benchmarks/plot_coll.py OUT.csv IN.csv [IN.csv ...]
       python3 benchmarks/plot_coll.py OUT.csv      (re-plot a merged CSV, which stays as it is)
"""
import csv
import sys
from pathlib import Path

HEADER = ["collective", "algorithm", "method", "timing", "n_pes", "num_bytes", "us", "busbw_gb_per_s"]


def read(path):
    comments, rows = [], []
    with open(path) as f:
        lines = f.read().splitlines()
    comments = [line[2:] for line in lines if line.startswith("# ")]
    body = [line for line in lines if line and not line.startswith("#")]
    for row in csv.DictReader(body):
        rows.append(row)
    return comments, rows


def size_label(num_bytes):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if num_bytes >= 1 << shift:
            return f"{num_bytes >> shift} {unit}"
    return f"{num_bytes} B"


def gpu_label(comments):
    """'4x H100 80GB HBM3' from the header line 'gpu: NVIDIA H100 80GB HBM3 x 4'."""
    for line in comments:
        if line.startswith("gpu: "):
            name, _, count = line[5:].split(";")[0].rpartition(" x ")
            return f"{count}x {name.removeprefix('NVIDIA ')}"
    return "unknown GPU"


def main():
    out, inputs = Path(sys.argv[1]), sys.argv[2:]
    comments, rows = [], []
    for path in inputs or [out]:
        c, r = read(path)
        comments += [line for line in c if line not in comments]
        rows += r
    if inputs:
        with open(out, "w") as f:
            for line in comments:
                f.write(f"# {line}\n")
            f.write(",".join(HEADER) + "\n")
            for row in rows:
                f.write(",".join(row[k] for k in HEADER) + "\n")
        print(f"plot_coll: wrote {out} ({len(rows)} rows)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = gpu_label(comments)
    for collective in sorted({r["collective"] for r in rows if r["num_bytes"] != "0"}):
        lines = {}
        for r in rows:
            if r["collective"] != collective:
                continue
            label = f'{r["method"]} {r["algorithm"]}' if r["method"] == "ours" or r["method"] == "torch_symm" else r["method"]
            if r["timing"] == "eager":
                label += " (eager)"
            lines.setdefault(label, []).append((int(r["num_bytes"]), float(r["us"])))
        if all(len(points) < 2 for points in lines.values()):
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, points in sorted(lines.items()):
            points.sort()
            style = "-" if label.startswith("ours") else "--"
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({p[0] for points in lines.values() for p in points})
        ax.set_xticks(ticks)
        ax.set_xticklabels([size_label(t) for t in ticks], rotation=45, ha="right", fontsize=7)
        ax.set_xlabel("size per rank (nccl-tests definition)")
        ax.set_ylabel("time per call (us, CUDA-graph replay)")
        ax.set_title(f"{collective}, {gpus}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        png = out.with_name(f"{out.stem}_{collective}.png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        print(f"plot_coll: wrote {png}")


if __name__ == "__main__":
    main()
