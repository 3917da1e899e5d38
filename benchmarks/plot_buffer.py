#!/usr/bin/env python3
"""Merges chapter 7's benchmark CSVs (benchmarks/buffer_bench.py for ours and for DeepEP) into
one CSV and plots bandwidth against SMs: one panel per op and dtype, a line per method.

Usage: python3 benchmarks/plot_buffer.py OUT.csv IN.csv [IN.csv ...]
"""
import csv
import sys
from pathlib import Path


def main():
    out, inputs = Path(sys.argv[1]), sys.argv[2:]
    comments, rows = [], []
    for path in inputs:
        lines = Path(path).read_text().splitlines()
        comments += [line for line in lines if line.startswith("#") and line not in comments]
        rows += list(csv.DictReader(line for line in lines if not line.startswith("#")))
    header = "method,op,dtype,ep,num_sms,chunk,us,gb_per_s"
    out.write_text("\n".join(comments + [header] + [",".join(r[k] for k in header.split(",")) for r in rows]) + "\n")
    print(f"plot_buffer: wrote {out} ({len(rows)} rows)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("dispatch", "bf16"), ("dispatch", "fp8"), ("combine", "bf16")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (op, dtype) in zip(axes, panels):
        for method in ("ours", "deepep"):
            best = {}
            for r in rows:
                if r["method"] == method and r["op"] == op and r["dtype"] == dtype:
                    sms = int(r["num_sms"])
                    best[sms] = max(best.get(sms, 0.0), float(r["gb_per_s"]))
            if best:
                xs = sorted(best)
                ax.plot(xs, [best[x] for x in xs], marker="o", label=method)
        ax.set_title(f"{op} {dtype}, EP{rows[0]['ep'] if rows else '?'}")
        ax.set_xlabel("SMs")
        ax.set_ylabel("GB/s (received bytes / time)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    print(f"plot_buffer: wrote {png}")


if __name__ == "__main__":
    main()
