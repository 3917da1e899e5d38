#!/usr/bin/env python3
"""Plots benchmarks/results/p2p_<gpu>.csv (written by ch03-p2p-bench) next to it as .png.

Left: bandwidth (bytes moved / time, GB/s) against message size, log x, one line per
implementation. The kernels (NVSHMEM's put, the bulk-copy put, the put written as stores,
plain stores without and with a closing fence) come from
the launch-shape sweep beside the CSV (p2p_<gpu>_sweep.csv): each line is the best of that
kernel's shapes per size. The copy engine and NCCL come from the CSV. Right: one-way latency
of the two ping-pongs against message size.

Usage: python3 benchmarks/plot_p2p.py benchmarks/results/p2p_h100.csv
"""
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Kernel implementations, keyed by the sweep's (method, scope). Sweeps recorded before the
# benchmark named one row per implementation (2026-11-22) call NVSHMEM's put "put" with
# scope warp or block, and the bulk-copy put "put" with scope "bulk".
KERNELS = {
    "nvshmem_put": "NVSHMEM put (nvshmemx_putmem_nbi_{warp,block} + quiet)",
    "bulk_put": "bulk-copy (TMA) put through nvshmem_ptr",
    "store_put": "block put written as stores (one fence per block)",
    "store": "plain int4 stores through nvshmem_ptr (no fence)",
    "store_fenced": "plain int4 stores + system fence per thread",
}
OTHERS = {
    "copy_engine": "copy engine (cuMemcpyDtoDAsync)",
    "nccl": "NCCL send/recv",
}
LATENCY = {
    "put_signal_pingpong": "NVSHMEM putmem_signal ping-pong",
    "nccl_pingpong": "NCCL send/recv ping-pong (graph)",
}


def kernel_of(method, scope):
    """The KERNELS key of a sweep row."""
    if method == "put":
        return "bulk_put" if scope == "bulk" else "nvshmem_put"
    return method


def read_csv(path):
    """(comment lines, rows as dicts) of a CSV whose comments start with '#'."""
    comments, lines = [], []
    for line in path.read_text().splitlines():
        (comments if line.startswith("#") else lines).append(line)
    return comments, list(csv.DictReader(lines))


def best_per_size(sweep_rows):
    """{kernel: {num_bytes: best gb_per_s}} over every launch shape of the sweep."""
    best = {}
    for r in sweep_rows:
        per_size = best.setdefault(kernel_of(r["method"], r["scope"]), {})
        size, gb_per_s = int(r["num_bytes"]), float(r["gb_per_s"])
        per_size[size] = max(gb_per_s, per_size.get(size, 0.0))
    return best


def size_label(num_bytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes} B"


def plot_lines(axis, lines, marker, legend_columns):
    """Draws each (label, {size: value}) of `lines`; returns the sizes drawn. The legend goes
    below the axes, never over the curves."""
    sizes = set()
    for label, points in lines:
        if points:
            x = sorted(points)
            axis.plot(x, [points[s] for s in x], marker=marker, label=label)
            sizes.update(x)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted(sizes), [size_label(s) for s in sorted(sizes)], rotation=30)
    axis.set_xlabel("message size")
    axis.grid(True, alpha=0.3)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=legend_columns, fontsize=8, frameon=False)


def main(path):
    path = Path(path)
    comments, rows = read_csv(path)
    sweep_path = path.with_name(path.stem + "_sweep.csv")
    _, sweep_rows = read_csv(sweep_path)
    gpu = next((c.split(":", 1)[1].strip() for c in comments if c.startswith("# gpu:")), path.stem)
    date = next((c.split(":", 1)[1].split(";")[0].strip() for c in comments if c.startswith("# date:")), "")

    def column(method, value):
        return {int(r["num_bytes"]): float(r[value]) for r in rows if r["method"] == method}

    kernels = best_per_size(sweep_rows)
    bandwidth = [(label, kernels.get(key, {})) for key, label in KERNELS.items()]
    bandwidth += [(label, column(key, "gb_per_s")) for key, label in OTHERS.items()]
    latency = [(label, column(key, "us")) for key, label in LATENCY.items()]

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6.2), gridspec_kw={"width_ratios": [2, 1]})
    plot_lines(left, bandwidth, "o", legend_columns=2)
    left.set_ylabel("GB/s (bytes moved / time)")
    left.set_title(f"PE 0 -> PE 1 bandwidth, {gpu}, {date}\n(kernels: best launch shape per size)", fontsize=10)
    plot_lines(right, latency, "s", legend_columns=1)
    right.set_ylim(bottom=0)
    right.set_ylabel("one-way latency (us)")
    right.set_title("one-way latency (round trip / 2)")

    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"plot_p2p: wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot_p2p.py benchmarks/results/p2p_<gpu>.csv")
    main(sys.argv[1])
