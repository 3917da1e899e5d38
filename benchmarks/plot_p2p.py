#!/usr/bin/env python3
"""Plots benchmarks/results/p2p_<gpu>.csv (written by ch03-p2p-bench) next to it as .png.

Left: bandwidth (bytes moved / time, GB/s) against message size, log x. Right: one-way
latency of the two ping-pongs against message size.

Usage: python3 benchmarks/plot_p2p.py benchmarks/results/p2p_h200.csv
"""
import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BANDWIDTH = {
    "put": "best device put (NVSHMEM or bulk-copy, tuned)",
    "store": "stores through nvshmem_ptr",
    "copy_engine": "copy engine (cuMemcpyDtoDAsync)",
    "nccl": "NCCL send/recv",
}
LATENCY = {
    "put_signal_pingpong": "NVSHMEM putmem_signal ping-pong",
    "nccl_pingpong": "NCCL send/recv ping-pong (graph)",
}


def size_label(num_bytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes} B"


def main(path):
    path = Path(path)
    comments, lines = [], []
    for line in path.read_text().splitlines():
        (comments if line.startswith("#") else lines).append(line)
    rows = list(csv.DictReader(lines))
    gpu = next((c.split(":", 1)[1].strip() for c in comments if c.startswith("# gpu:")), path.stem)

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [2, 1]})
    for method, label in BANDWIDTH.items():
        points = sorted((int(r["num_bytes"]), float(r["gb_per_s"])) for r in rows if r["method"] == method)
        if points:
            x, y = zip(*points)
            left.plot(x, y, marker="o", label=label)
    left.set_xscale("log", base=2)
    sizes = sorted({int(r["num_bytes"]) for r in rows if r["method"] in BANDWIDTH})
    left.set_xticks(sizes, [size_label(s) for s in sizes], rotation=30)
    left.set_xlabel("message size")
    left.set_ylabel("GB/s (bytes moved / time)")
    left.set_title(f"PE 0 -> PE 1 bandwidth, {gpu}")
    left.grid(True, alpha=0.3)
    left.legend()

    for method, label in LATENCY.items():
        points = sorted((int(r["num_bytes"]), float(r["us"])) for r in rows if r["method"] == method)
        if points:
            x, y = zip(*points)
            right.plot(x, y, marker="s", label=label)
    right.set_xscale("log", base=2)
    lat_sizes = sorted({int(r["num_bytes"]) for r in rows if r["method"] in LATENCY})
    if lat_sizes:
        right.set_xticks(lat_sizes, [size_label(s) for s in lat_sizes])
    right.set_ylim(bottom=0)
    right.set_xlabel("message size")
    right.set_ylabel("one-way latency (us)")
    right.set_title("one-way latency (round trip / 2)")
    right.grid(True, alpha=0.3)
    right.legend()

    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"plot_p2p: wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: plot_p2p.py benchmarks/results/p2p_<gpu>.csv")
    main(sys.argv[1])
