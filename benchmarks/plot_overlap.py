"""Draws chapter 6's PyTorch benchmark (scripts/ch06_overlap.py --bench) as a bar chart: time
per call of every method, the GEMM alone as the floor no overlap can beat, and serial NCCL as
the time overlap must beat. Plain SVG from the standard library (no matplotlib), so it runs
wherever the CSV is.

    python3 benchmarks/plot_overlap.py OVERLAP_PY.csv [OUT.svg]   (default: the CSV's name, .svg)
"""

from __future__ import annotations

import csv
import sys
from html import escape
from pathlib import Path
from typing import List, Tuple

COLORS = {"compute": "#4c72b0", "communicate": "#dd8452", "nccl": "#8c8c8c", "torch": "#937860",
          "ours": "#55a868"}


def kind(method: str) -> str:
    name = method.removeprefix("interleaved_")
    if name == "compute":
        return "compute"
    if name.endswith("communicate"):
        return "communicate"
    return "nccl" if name.startswith("nccl") else "torch" if name.startswith("torch") else "ours"


def label(method: str) -> str:
    name = method.removeprefix("interleaved_")
    turn = " (in turn)" if method.startswith("interleaved_") else ""
    if name.startswith("ours_overlapped_"):
        parts = name.split("_")
        side = ", side stream" if name.endswith("_side") else ""
        return f"ours, {parts[2]} chunk(s){side}{turn}"
    return {"compute": "GEMM alone", "ours_communicate": "ours: all-gather alone",
            "nccl_serial": "NCCL all-gather, then GEMM", "nccl_communicate": "NCCL all-gather alone",
            "torch_fused": "torch fused_all_gather_matmul"}.get(name, name) + turn


def read(path: Path) -> Tuple[List[str], List[Tuple[str, float]]]:
    lines = path.read_text().splitlines()
    header = [l[2:] for l in lines if l.startswith("# ")]
    rows = [(r["method"], float(r["us"])) for r in csv.DictReader(l for l in lines if not l.startswith("#"))]
    if not rows:
        raise SystemExit(f"plot_overlap: {path}: no rows")
    return header, rows


def svg(header: List[str], rows: List[Tuple[str, float]]) -> str:
    left, bar, gap, width = 330, 18, 6, 460
    top = 60
    height = top + len(rows) * (bar + gap) + 50
    top_us = max(us for _, us in rows) * 1.08
    x = lambda us: left + width * us / top_us  # noqa: E731 - a scale
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 90}" height="{height}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect width="100%" height="100%" fill="#fff"/>',
           f'<text x="10" y="20" font-size="14" font-weight="bold">All-gather + GEMM from PyTorch: time per call</text>',
           f'<text x="10" y="38" fill="#555">{escape(header[0] if header else "")}</text>']
    for i, (method, us) in enumerate(rows):
        y = top + i * (bar + gap)
        out.append(f'<text x="{left - 8}" y="{y + bar - 5}" text-anchor="end">{escape(label(method))}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{x(us) - left:.1f}" height="{bar}" fill="{COLORS[kind(method)]}"/>')
        out.append(f'<text x="{x(us) + 4:.1f}" y="{y + bar - 5}" fill="#333">{us:.0f} us</text>')
    floor = dict(rows).get("compute")
    if floor:
        out.append(f'<line x1="{x(floor):.1f}" y1="{top - 6}" x2="{x(floor):.1f}" y2="{height - 40}" '
                   f'stroke="#4c72b0" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{x(floor):.1f}" y="{height - 26}" text-anchor="middle" fill="#4c72b0">'
                   f'the GEMM alone, timed first: the floor</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: List[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    src = Path(argv[1])
    dst = Path(argv[2]) if len(argv) > 2 else src.with_suffix(".svg")
    header, rows = read(src)
    dst.write_text(svg(header, rows))
    print(f"plot_overlap: wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
