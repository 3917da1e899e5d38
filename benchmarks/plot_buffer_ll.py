#!/usr/bin/env python3
"""Merges chapter 8's benchmark CSVs (benchmarks/buffer_ll_bench.py for ours and for DeepEP)
into one CSV and plots the times side by side as SVG: a pair of bars (ours, DeepEP) per op.

Usage: python3 benchmarks/plot_buffer_ll.py OUT.csv IN.csv [IN.csv ...]
"""
import csv
import sys
from pathlib import Path

HEADER = "method,op,ep,timing,us,gb_per_s"


def main():
    out, inputs = Path(sys.argv[1]), [p for p in sys.argv[2:] if Path(p).exists()]
    comments, rows = [], []
    for path in inputs:
        lines = Path(path).read_text().splitlines()
        comments += [line for line in lines if line.startswith("#") and line not in comments]
        rows += list(csv.DictReader(line for line in lines if not line.startswith("#")))
    out.write_text("\n".join(comments + [HEADER] + [",".join(r[k] for k in HEADER.split(",")) for r in rows]) + "\n")
    print(f"plot_buffer_ll: wrote {out} ({len(rows)} rows)")

    svg = out.with_suffix(".svg")
    svg.write_text(bars_svg(rows))
    print(f"plot_buffer_ll: wrote {svg}")


def bars_svg(rows) -> str:
    """A pair of bars (ours, DeepEP) per op, labelled with their times: plain SVG, so that the
    plot needs nothing beyond Python."""
    colors = {"ours": "#1f77b4", "deepep": "#ff7f0e"}
    times = {(r["method"], (r["op"], r["timing"])): float(r["us"]) for r in rows}
    ops = list(dict.fromkeys(key for _, key in times))
    top = max(times.values(), default=1.0) * 1.15
    width, height, left, bottom, plot_h = 120 * max(len(ops), 1) + 80, 360, 60, 300, 250
    ep = rows[0]["ep"] if rows else "?"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13">Low-latency mode, EP{ep}: 128 tokens x 7168, top-8 of 288, fp8 dispatch (us; lower is better)</text>',
        f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="black"/>',
    ]
    for i, op in enumerate(ops):
        x0 = left + 10 + i * 120
        for j, method in enumerate(colors):
            if (method, op) not in times:
                continue
            us = times[(method, op)]
            h = us / top * plot_h
            x = x0 + j * 48
            parts.append(f'<rect x="{x}" y="{bottom - h:.1f}" width="44" height="{h:.1f}" fill="{colors[method]}"/>')
            parts.append(f'<text x="{x + 22}" y="{bottom - h - 3:.1f}" text-anchor="middle">{us:.1f}</text>')
        name, timing = op
        label = name.replace("_", " ") + ("" if timing == "kernel" else f" ({timing})")
        parts.append(f'<text x="{x0 + 46}" y="{bottom + 16}" text-anchor="middle">{label}</text>')
    for j, (method, color) in enumerate(colors.items()):
        parts.append(f'<rect x="{left + j * 110}" y="{bottom + 32}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{left + 16 + j * 110}" y="{bottom + 42}">{"DeepEP v1" if method == "deepep" else "ours"}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    main()
