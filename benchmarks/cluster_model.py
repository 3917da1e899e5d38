#!/usr/bin/env python3
"""Appendix A's cost model: chapter 5's collectives, flat and hierarchical, on nodes of 8 GPUs
joined by InfiniBand. A prediction, not a measurement: no cluster was run for it.

An alpha-beta model. Every step of a plan costs a fixed step time (a kernel in a CUDA graph
that enters and leaves a call), plus, per exchange phase, a latency per message and bytes over
bandwidth, for the NVLink and the InfiniBand part of the phase at once (the slower decides),
plus local copies and sums at memory bandwidth. The inputs:

- measured here (read from the committed results, never typed): the step time (chapter 4's
  `sync_all` in a graph), the one-way latency of a put-with-signal over NVLink and the best
  put bandwidth over NVLink (chapter 3);
- published (PUBLISHED below, each with its source): InfiniBand bandwidth per GPU and the
  GPU's memory bandwidth;
- assumed (ASSUMED below): the latency of one put-with-signal across InfiniBand, "a few
  microseconds", with the crossovers also given at half and twice the value.

Two bounds for many messages across InfiniBand in one phase: `serial` pays the latency once
per message (the classic alpha-beta count: Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), 2005); `overlapped` pays it once
per phase, as if every non-blocking put of the phase were in flight together. A real NIC lies
between the two; only a cluster says where.

    python3 benchmarks/cluster_model.py               # inputs, predicted times, crossovers
    python3 benchmarks/cluster_model.py --svg OUT.svg  # and the plot

scripts/gen_book.py imports this file and writes its tables and plot into the book.
Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
P2P_CSV = "benchmarks/results/p2p_h100.csv"  # chapter 3 (the book's result of record)
COLL_CSV = "benchmarks/results/coll_h100_4gpu.csv"  # chapter 4 at N = 4 (idem)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
LABEL = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
         "broadcast": "broadcast", "all_to_all": "all-to-all"}
NODE_COUNTS = [2, 4, 8, 16]
GPUS_PER_NODE = 8
TABLE_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB]
SEARCH_RANGE = (KIB, GIB)  # crossovers are looked for between these sizes

# ANCHOR: published
# Published figures: (value, unit, what it is, [(source, address)]).
PUBLISHED = {
    "ib_gbs": (50.0, "GB/s", "InfiniBand bandwidth per GPU and direction: one ConnectX-7 NIC per GPU at 400 Gb/s", [
        ("DeepEP, docs/legacy.md: H800s each connected to a CX7 InfiniBand 400 Gb/s RDMA network "
         "card (~50 GB/s maximum bandwidth)",
         "https://github.com/deepseek-ai/DeepEP/blob/main/docs/legacy.md"),
        ("NVIDIA DGX H100 User Guide, network connections: eight ConnectX-7 ports for the compute "
         "fabric, each paired with one GPU",
         "https://docs.nvidia.com/dgx/dgxh100-user-guide/"),
    ]),
    "hbm_gbs": (3350.0, "GB/s", "GPU memory bandwidth, for local copies and sums (H100 SXM)", [
        ("NVIDIA H100 Tensor Core GPU, specifications: GPU memory bandwidth 3.35 TB/s (H100 SXM)",
         "https://www.nvidia.com/en-us/data-center/h100/"),
    ]),
}
# Not found in any source this project could read for a GPU-initiated put-with-signal over
# ConnectX-7: an assumption ("a few microseconds per message"), varied in the sensitivity table.
ASSUMED = {"ib_alpha_us": (3.0, "us", "InfiniBand latency: one put-with-signal, issue to signal seen")}
ALPHA_SENSITIVITY = [0.5, 1.0, 2.0]  # multiples of ASSUMED ib_alpha_us
# ANCHOR_END: published


@dataclass(frozen=True)
class Params:
    step_us: float  # one step of a plan: a kernel in a graph that enters and leaves a call
    nvl_alpha_us: float  # one put-with-signal over NVLink, one way
    nvl_gbs: float  # NVLink bandwidth out of one GPU
    ib_alpha_us: float  # one put-with-signal across InfiniBand
    ib_gbs: float  # InfiniBand bandwidth per GPU (its own NIC: a rail-optimised cluster)
    hbm_gbs: float  # local memory bandwidth
    overlap: bool = False  # False: the serial bound; True: the overlapped bound


# ---- measured inputs ------------------------------------------------------------------------------


def read_rows(path: Path) -> Tuple[List[str], List[Dict[str, str]]]:
    """A result CSV: its '# ' header lines and its rows."""
    lines = path.read_text().splitlines()
    comments = [line[1:].strip() for line in lines if line.startswith("#")]
    body = [line for line in lines if line and not line.startswith("#")]
    return comments, list(csv.DictReader(body))


def measured(p2p_rows: Sequence[Dict[str, str]], coll_rows: Sequence[Dict[str, str]]) -> Dict[str, float]:
    """The NVLink figures the model takes from our results (chapter 3's and chapter 4's CSVs)."""
    def only(rows, **match):
        found = [r for r in rows if all(r.get(k) == str(v) for k, v in match.items())]
        if len(found) != 1:
            raise ValueError(f"expected one row with {match}, found {len(found)}")
        return float(found[0]["us"])

    puts = [r for r in p2p_rows if r["method"] in ("nvshmem_put", "bulk_put", "store_put")]
    top = max(int(r["num_bytes"]) for r in puts)
    return {
        "step_us": only(coll_rows, collective="barrier", algorithm="signal", method="ours"),
        "nvl_alpha_us": only(p2p_rows, method="put_signal_pingpong", num_bytes=8),
        "nvl_gbs": max(float(r["gb_per_s"]) for r in puts if int(r["num_bytes"]) == top),
        "nvl_top_bytes": float(top),
    }


def params(inputs: Dict[str, float], overlap: bool = False, alpha_scale: float = 1.0) -> Params:
    return Params(step_us=inputs["step_us"], nvl_alpha_us=inputs["nvl_alpha_us"], nvl_gbs=inputs["nvl_gbs"],
                  ib_alpha_us=ASSUMED["ib_alpha_us"][0] * alpha_scale, ib_gbs=PUBLISHED["ib_gbs"][0],
                  hbm_gbs=PUBLISHED["hbm_gbs"][0], overlap=overlap)


# ---- the model ------------------------------------------------------------------------------------

# ANCHOR: phase
def xfer_us(num_bytes: float, gbs: float) -> float:
    return num_bytes / (gbs * 1e3)  # 1 GB/s moves 1e3 bytes per microsecond


def phase_us(p: Params, ib_msgs: int = 0, ib_bytes: float = 0.0, nvl_msgs: int = 0,
             nvl_bytes: float = 0.0) -> float:
    """One exchange phase of one PE: its puts to other nodes leave through its NIC while its
    puts inside the node go over NVLink, at the same time; the slower part decides. Inside a
    node the puts of all blocks overlap (chapter 4's one-shot kernels cost about one put);
    across nodes the latency is paid per message (serial) or once (overlapped)."""
    ib = 0.0
    if ib_msgs:
        latency = p.ib_alpha_us if p.overlap else ib_msgs * p.ib_alpha_us
        ib = latency + xfer_us(ib_bytes, p.ib_gbs)
    nvl = p.nvl_alpha_us + xfer_us(nvl_bytes, p.nvl_gbs) if nvl_msgs else 0.0
    return max(ib, nvl)


def local_us(p: Params, num_bytes: float) -> float:
    """Bytes read plus bytes written in this GPU's own memory (copies, permutes, sums)."""
    return xfer_us(num_bytes, p.hbm_gbs)
# ANCHOR_END: phase


# ANCHOR: flat
def flat_us(coll: str, nodes: int, g: int, size: float, p: Params) -> float:
    """Method::Flat: one RMA kernel over all n PEs; each PE talks to every PE.
    size: nccl-tests' bytes (all-reduce, broadcast: the buffer; all-gather: the output;
    reduce-scatter: the input; all-to-all: one PE's input)."""
    n = nodes * g
    off, on, part = n - g, g - 1, size / n  # PEs of other nodes, of this node; one PE's part
    exchange = phase_us(p, off, off * part, on, on * part)
    if coll in ("all_gather", "all_to_all"):
        t = exchange
    elif coll == "reduce_scatter":  # part j to member j, summed there over n slots
        t = exchange + local_us(p, size + part)
    elif coll == "all_reduce":  # the same, then each summed part to every member
        t = 2 * exchange + local_us(p, size + part)
    elif coll == "broadcast":  # the root puts the whole buffer into every PE
        t = phase_us(p, off, off * size, on, on * size)
    else:
        raise ValueError(coll)
    return p.step_us + t
# ANCHOR_END: flat


# ANCHOR: hier
def hier_us(coll: str, nodes: int, g: int, size: float, p: Params) -> float:
    """Method::Hierarchical: chapter 5's plans, one term per step (each step a kernel)."""
    n, step = nodes * g, p.step_us
    part, others = size / n, nodes - 1

    def node(num_bytes: float) -> float:  # a chapter 4 call over the node's g PEs
        return step + phase_us(p, nvl_msgs=g - 1, nvl_bytes=num_bytes)

    def rail(msgs: int, num_bytes: float) -> float:  # an RMA kernel over the rail
        return step + phase_us(p, ib_msgs=msgs, ib_bytes=num_bytes)

    if coll == "all_reduce":  # node reduce-scatter, rail all-reduce of 1/g, node all-gather
        chunk = size / g  # this PE's part of its node's sum
        across = others * chunk / nodes  # each of the rail kernel's two phases
        return (node((g - 1) * chunk) + local_us(p, size + chunk)
                + rail(others, across) + phase_us(p, ib_msgs=others, ib_bytes=across)
                + local_us(p, chunk + chunk / nodes) + node((g - 1) * chunk))
    if coll == "reduce_scatter":  # permute, node reduce-scatter, rail reduce-scatter
        chunk = size / g
        return (step + local_us(p, 2 * size) + node((g - 1) * chunk) + local_us(p, size + chunk)
                + rail(others, others * part) + local_us(p, chunk + part))
    if coll == "all_gather":  # rail all-gather, node all-gather, permute
        return rail(others, others * part) + node((g - 1) * size / g) + step + local_us(p, 2 * size)
    if coll == "broadcast":  # the root's rail, then a scatter + all-gather in every node
        return rail(others, others * size) + node(2 * (g - 1) * size / g)
    if coll == "all_to_all":  # one put per node to the rail partner, then the node forward
        return (rail(others, others * size / nodes) + local_us(p, 2 * size / nodes)
                + node((g - 1) * size / g) + local_us(p, 2 * size / g))
    raise ValueError(coll)
# ANCHOR_END: hier


# ---- what the model says ------------------------------------------------------------------------


def crossovers(coll: str, nodes: int, g: int, p: Params) -> Tuple[str, List[Tuple[float, str]]]:
    """(the method faster at the smallest size searched, [(size, method faster above it)])."""
    def faster(size: float) -> str:
        return "flat" if flat_us(coll, nodes, g, size, p) < hier_us(coll, nodes, g, size, p) else "hierarchical"

    lo, hi = SEARCH_RANGE
    grid = [lo * 2 ** (i / 8) for i in range(int(8 * math.log2(hi / lo)) + 1)]
    first, changes = faster(grid[0]), []
    for a, b in zip(grid, grid[1:]):
        if faster(a) != faster(b):
            for _ in range(40):  # bisect on a log scale
                mid = math.sqrt(a * b)
                a, b = (mid, b) if faster(mid) == faster(a) else (a, mid)
            changes.append((b, faster(b)))
    return first, changes


def size_text(num_bytes: float) -> str:
    """Two significant digits: '850 KiB', '7.3 MiB'."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if num_bytes >= scale:
            v = num_bytes / scale
            break
    else:
        unit, v = "B", num_bytes
    digits = 1 - int(math.floor(math.log10(v)))
    v = round(v, digits)
    return f"{v:.{max(0, digits)}f} {unit}"


def table_size(num_bytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if num_bytes >= scale:
            return f"{num_bytes // scale} {unit}"
    return f"{num_bytes} B"


def crossover_text(coll: str, nodes: int, g: int, p: Params) -> str:
    """'hierarchical at every size', or 'flat; hierarchical from 830 KiB' (the method faster
    at the smallest size, then each change)."""
    first, changes = crossovers(coll, nodes, g, p)
    if not changes:
        return f"{first} at every size"
    return "; ".join([first] + [f"{method} from {size_text(size)}" for size, method in changes])


def us_text(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def markdown_table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def times_table(coll: str, p: Params, g: int = GPUS_PER_NODE) -> str:
    rows = []
    for nodes in NODE_COUNTS:
        cells = [f"{nodes} x {g}"]
        for size in TABLE_SIZES:
            cells.append(f"{us_text(flat_us(coll, nodes, g, size, p))} / {us_text(hier_us(coll, nodes, g, size, p))}")
        rows.append(cells)
    return markdown_table(["nodes x GPUs"] + [f"{table_size(z)}: flat / hier." for z in TABLE_SIZES],
                          ["l"] + ["r"] * len(TABLE_SIZES), rows)


def crossover_table(inputs: Dict[str, float], g: int = GPUS_PER_NODE) -> str:
    rows = []
    for coll in COLLECTIVES:
        for overlap, bound in ((False, "serial"), (True, "overlapped")):
            p = params(inputs, overlap=overlap)
            rows.append([LABEL[coll], bound] + [crossover_text(coll, nodes, g, p) for nodes in NODE_COUNTS])
    return markdown_table(["collective", "bound"] + [f"{nodes} x {g}" for nodes in NODE_COUNTS],
                          ["l", "l"] + ["l"] * len(NODE_COUNTS), rows)


def sensitivity_table(inputs: Dict[str, float], g: int = GPUS_PER_NODE) -> str:
    """Crossovers at 2 and 16 nodes for other InfiniBand latencies; a row whose answer is the
    same at every latency is left out."""
    rows = []
    for coll in COLLECTIVES:
        for overlap, bound in ((False, "serial"), (True, "overlapped")):
            for nodes in (NODE_COUNTS[0], NODE_COUNTS[-1]):
                cells = [crossover_text(coll, nodes, g, params(inputs, overlap, scale)) for scale in ALPHA_SENSITIVITY]
                if len(set(cells)) > 1:
                    rows.append([LABEL[coll], bound, f"{nodes} x {g}"] + cells)
    alpha = ASSUMED["ib_alpha_us"][0]
    return markdown_table(["collective", "bound", "nodes x GPUs"] + [f"{alpha * s:g} us per message" for s in ALPHA_SENSITIVITY],
                          ["l", "l", "l"] + ["l"] * len(ALPHA_SENSITIVITY), rows)


# ---- the plot -------------------------------------------------------------------------------------

PLOT_NODES = [(2, "#1f77b4"), (16, "#d62728")]


def time_label(us: float) -> str:
    for unit, scale in (("s", 1e6), ("ms", 1e3)):
        if us >= scale:
            return f"{us / scale:g} {unit}"
    return f"{us:g} us"


def svg(inputs: Dict[str, float], g: int = GPUS_PER_NODE) -> str:
    """Predicted time per call against size, one panel per collective: flat (dashed) and
    hierarchical (solid) at 2 and 16 nodes, serial bound. Plain SVG, written the same way
    every time (the book's generator compares it byte for byte)."""
    p = params(inputs)
    width, height, cols = 960, 600, 3
    pw, ph = width / cols, (height - 40) / 2
    left, right, top, bottom = 62, 14, 26, 40
    lo, hi = SEARCH_RANGE
    sizes = [lo * 2 ** (i / 4) for i in range(int(4 * math.log2(hi / lo)) + 1)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14">Predicted by the cost model, '
           f'not measured: time per call, nodes of {g} GPUs ({ASSUMED["ib_alpha_us"][0]:g} us per InfiniBand '
           f'message, serial bound)</text>']
    for k, coll in enumerate(COLLECTIVES):
        x0, y0 = (k % cols) * pw, 40 + (k // cols) * ph
        series = [(nodes, color, method, [fn(coll, nodes, g, z, p) for z in sizes])
                  for nodes, color in PLOT_NODES for method, fn in (("flat", flat_us), ("hier", hier_us))]
        ymin = 10 ** math.floor(math.log10(min(min(v) for *_, v in series)))
        ymax = 10 ** math.ceil(math.log10(max(max(v) for *_, v in series)))
        ax0, ax1, ay0, ay1 = x0 + left, x0 + pw - right, y0 + ph - bottom, y0 + top

        def px(z: float) -> float:
            return ax0 + (ax1 - ax0) * math.log(z / lo) / math.log(hi / lo)

        def py(v: float) -> float:
            return ay0 - (ay0 - ay1) * math.log(v / ymin) / math.log(ymax / ymin)

        out.append(f'<text x="{(ax0 + ax1) / 2:.1f}" y="{ay1 - 8:.1f}" text-anchor="middle" '
                   f'font-size="12">{LABEL[coll]}</text>')
        out.append(f'<rect x="{ax0:.1f}" y="{ay1:.1f}" width="{ax1 - ax0:.1f}" height="{ay0 - ay1:.1f}" '
                   f'fill="none" stroke="#888"/>')
        for z in (KIB, 32 * KIB, MIB, 32 * MIB, GIB):
            out.append(f'<line x1="{px(z):.1f}" y1="{ay0:.1f}" x2="{px(z):.1f}" y2="{ay1:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{px(z):.1f}" y="{ay0 + 14:.1f}" text-anchor="middle">{table_size(z)}</text>')
        decade = ymin
        while decade <= ymax * 1.001:
            out.append(f'<line x1="{ax0:.1f}" y1="{py(decade):.1f}" x2="{ax1:.1f}" y2="{py(decade):.1f}" '
                       f'stroke="#eee"/>')
            out.append(f'<text x="{ax0 - 4:.1f}" y="{py(decade) + 4:.1f}" text-anchor="end">{time_label(decade)}</text>')
            decade *= 10
        out.append(f'<text x="{(ax0 + ax1) / 2:.1f}" y="{ay0 + 30:.1f}" text-anchor="middle" fill="#555">'
                   f'bytes per call (nccl-tests sizes)</text>')
        for nodes, color, method, values in series:
            points = " ".join(f"{px(z):.1f},{py(v):.1f}" for z, v in zip(sizes, values))
            dash = ' stroke-dasharray="5,3"' if method == "flat" else ""
            out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
    lx, ly = 2 * pw + left, 40 + ph + top + 10
    for i, (nodes, color) in enumerate(PLOT_NODES):
        for j, (method, dash) in enumerate((("flat", ' stroke-dasharray="5,3"'), ("hierarchical", ""))):
            y = ly + 22 * (2 * i + j)
            out.append(f'<line x1="{lx:.1f}" y1="{y:.1f}" x2="{lx + 40:.1f}" y2="{y:.1f}" stroke="{color}" '
                       f'stroke-width="1.6"{dash}/>')
            out.append(f'<text x="{lx + 48:.1f}" y="{y + 4:.1f}">{method}, {nodes} nodes x {g} GPUs</text>')
    out.append(f'<text x="{lx:.1f}" y="{ly + 100:.1f}" fill="#555">NVLink figures measured on one node;</text>')
    out.append(f'<text x="{lx:.1f}" y="{ly + 116:.1f}" fill="#555">InfiniBand figures published or assumed.</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---- command line ---------------------------------------------------------------------------------


def inputs_text(inputs: Dict[str, float]) -> str:
    lines = [
        f"step time (chapter 4's sync_all in a graph, {COLL_CSV}): {inputs['step_us']:.2f} us",
        f"NVLink put-with-signal, one way (8 B ping-pong, {P2P_CSV}): {inputs['nvl_alpha_us']:.2f} us",
        f"NVLink bandwidth (best put at {table_size(int(inputs['nvl_top_bytes']))}, {P2P_CSV}): "
        f"{inputs['nvl_gbs']:.1f} GB/s",
    ]
    for value, unit, what, sources in PUBLISHED.values():
        lines.append(f"{what}: {value:g} {unit} [published: " + "; ".join(url for _, url in sources) + "]")
    for value, unit, what in ASSUMED.values():
        lines.append(f"{what}: {value:g} {unit} [assumed]")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--svg", type=Path, help="also write the plot here")
    args = parser.parse_args(argv)
    _, p2p = read_rows(ROOT / P2P_CSV)
    _, coll = read_rows(ROOT / COLL_CSV)
    inputs = measured(p2p, coll)
    print("# Inputs\n" + inputs_text(inputs))
    p = params(inputs)
    for c in COLLECTIVES:
        print(f"\n# {LABEL[c]}: predicted us per call, flat / hierarchical (serial bound)\n" + times_table(c, p))
    print("\n# Crossovers\n" + crossover_table(inputs))
    print("\n# Crossovers at other InfiniBand latencies (rows that do not change left out)\n" + sensitivity_table(inputs))
    if args.svg:
        args.svg.write_text(svg(inputs))
        print(f"\ncluster_model: wrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
