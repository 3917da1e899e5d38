#!/usr/bin/env python3
"""Low-latency mode across nodes, on paper: bytes, floors and predicted times of one decode step.

A model, not a measurement: no RDMA network was run for it. It answers issue 31's "Performance,
on paper" for benchmarks/notes/buffer_internode.md:

- bytes that cross the network per rank in one decode step (128 tokens per rank, hidden 7168,
  top-8, fp8 dispatch with its scales and header, bf16 combine) under uniform random routing,
  in DeepEP's message format and in ours (one dispatch message per (token, destination rank),
  all of a destination's messages in one put-with-signal), and the NIC operations each needs;
- the floor: one message latency plus those bytes at 400 Gb/s per GPU;
- DeepEP v1's published H800 + ConnectX-7 times beside the floors, and the fraction it reaches;
- a two-parameter fit of DeepEP's times (fixed cost + bytes / effective bandwidth) and our
  design's predicted times from it, for nodes of 8, 4 and 2 GPUs;
- the low-latency region's size (get_low_latency_rdma_size_hint) up to 256 ranks: today's
  formula, the design's, and DeepEP's.

Inputs are constants of our code and DeepEP's (cited where defined), DeepEP's published figures
(cited), and two figures shared with Appendix A's model (benchmarks/cluster_model.py: the
InfiniBand bandwidth per GPU, published; the InfiniBand latency of one put-with-signal, an
assumption). The routing statistics are exact (hypergeometric); the busiest rank's bytes come
from a seeded Monte Carlo draw of the same routing.

    python3 benchmarks/internode_model.py              # every table
    python3 benchmarks/internode_model.py --trials 50  # fewer Monte Carlo draws

Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import random
import sys
from math import comb
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_model import ASSUMED, PUBLISHED  # noqa: E402  (one source for the InfiniBand figures)

# ---- the decode step (DeepEP's test_low_latency.py defaults, tests/test_low_latency.py:318-321) ----
TOKENS = 128  # T: tokens per rank (num_max_dispatch_tokens_per_rank)
HIDDEN = 7168
TOPK = 8
EXPERTS = 256  # divides every rank count up to 256; 288 (the test's default) where it divides the ranks
FP8_GROUP = 128  # channels per fp8 scale (kernels/contract/defs.rs:35)

# ---- message formats ------------------------------------------------------------------------------
LL_MSG_HEADER_BYTES = 16  # kernels/contract/defs.rs:56
MAX_TOPK = 32  # kernels/contract/defs.rs:33
MAX_LL_EXPERTS = 2048  # kernels/contract/defs.rs:51


def round16(n: int) -> int:
    return (n + 15) // 16 * 16


def fp8_row_bytes(h: int) -> int:
    return h + h // FP8_GROUP * 4  # fp8 channels, then one f32 scale per 128


def deepep_dispatch_msg(h: int) -> int:
    """internode_ll.cu:181: sizeof(int4) + hidden + scales (fp8)."""
    return 16 + fp8_row_bytes(h)


def ours_today_dispatch_msg(h: int) -> int:
    """ll_dispatch.cu:10-13 (dispatch_msg_bytes): 16-byte header, row, scales, rounded to 16."""
    return round16(LL_MSG_HEADER_BYTES + fp8_row_bytes(h))


def ours_dispatch_msg(h: int, k: int) -> int:
    """The design: [16-byte header: token, K, pad x 2][K x u32 entries, padded to 16][row][scales]."""
    return LL_MSG_HEADER_BYTES + round16(4 * k) + round16(fp8_row_bytes(h))


def combine_row(h: int) -> int:
    """bf16 row, no header: internode_ll.cu:848 (num_send_bytes) and ll_combine.cu:133."""
    return 2 * h


def counts_row(l: int) -> int:
    """The design's counts row in front of a destination's messages: [messages: u32][count per
    local expert: u32 x L], padded to 16 bytes."""
    return round16(4 * (1 + l))


# ---- hardware figures -----------------------------------------------------------------------------
IB_GBS = PUBLISHED["ib_gbs"][0]  # 50 GB/s per GPU: DeepEP README.md:28 (CX7 400 Gb/s, ~50 GB/s)
IB_ALPHA_US = ASSUMED["ib_alpha_us"][0]  # 3 us, an assumption (cluster_model.py ASSUMED)
H800_NVL_GBS = 160.0  # DeepEP README.md:15 at 567632d: "H800 (~160 GB/s NVLink maximum bandwidth)"
HBM_GBS = PUBLISHED["hbm_gbs"][0]  # 3350 GB/s, H100 SXM (cluster_model.py PUBLISHED): local staging copies

# ---- DeepEP v1's published low-latency figures (H800 + CX7 400 Gb/s, 128 tokens, top-8) -----------
# README.md:30-37 at 567632d. The EP8-EP64 rows were rewritten on 2025-06-05 (de8cfca, "Update
# readme.") in the commit that announced NVLink inside a node for the low-latency kernels (#173);
# EP128/EP256 kept the rows of the first commit (ebfe47e), whose whole table was pure RDMA.
DEEPEP_NVL = {8: (77.0, 114.0), 16: (118.0, 195.0), 32: (155.0, 273.0), 64: (173.0, 314.0)}
DEEPEP_PURE_RDMA = {8: (163.0, 318.0), 16: (173.0, 329.0), 32: (182.0, 350.0), 64: (186.0, 353.0),
                    128: (192.0, 369.0), 256: (194.0, 360.0)}  # ebfe47e README.md:30-35

EP_SIZES = [16, 32, 64]
NODE_SIZES = [8, 4, 2]


# ---- routing statistics (uniform: K distinct experts of E per token, as DeepEP's test draws them) ----

def p_rank_hit(e: int, l: int, k: int) -> float:
    """P(a given rank, holding l of the e experts, is among a token's destinations)."""
    return 1.0 - comb(e - l, k) / comb(e, k)


def routing(n: int, g: int, e: int = EXPERTS, k: int = TOPK) -> Dict[str, float]:
    nodes, l = n // g, e // n
    hit = p_rank_hit(e, l, k)
    node_hit = p_rank_hit(e, e // nodes, k)
    return {
        "nodes": nodes, "L": l,
        "remote_fraction": (n - g) / n,  # of a token's top-k entries, on another node
        "remote_entries": k * (n - g) / n,
        "p_rank_hit": hit,
        "distinct_ranks": n * hit,
        "distinct_remote_ranks": (n - g) * hit,
        "distinct_node_ranks": (g - 1) * hit,  # same node, not this rank
        "distinct_remote_nodes": (nodes - 1) * node_hit,
    }


def step_bytes(n: int, g: int, e: int = EXPERTS) -> Dict[str, float]:
    """Expected bytes and NIC operations of one rank towards other nodes in one decode step (by
    the symmetry of uniform routing, also what it receives)."""
    r = routing(n, g, e)
    t, l = TOKENS, e // n
    remote_ranks = n - g
    return {
        "d_deepep": t * r["remote_entries"] * deepep_dispatch_msg(HIDDEN),
        "d_ours": t * r["distinct_remote_ranks"] * ours_dispatch_msg(HIDDEN, TOPK) + remote_ranks * counts_row(l),
        "c_rows": t * r["remote_entries"] * combine_row(HIDDEN),
        # Records: DeepEP one per (token, expert); ours one per (token, rank) in dispatch.
        "d_records_deepep": t * r["remote_entries"],
        "d_records_ours": t * r["distinct_remote_ranks"],
        "c_records": t * r["remote_entries"],
        # NIC operations. DeepEP: one RDMA write per record (internode_ll.cu:267, :912), one atomic
        # per (expert on another node) in dispatch (:337) and per (local expert, rank on another
        # node) in combine (:926). Ours: one put-with-signal per rank on another node and op: one
        # write, one atomic add (NVSHMEM 3.4.5 ibgda_device.cuh: an RC SIGNAL_ADD is one WQE).
        "d_writes_deepep": t * r["remote_entries"], "d_amo_deepep": e * (n - g) / n,
        "c_writes_deepep": t * r["remote_entries"], "c_amo_deepep": l * remote_ranks,
        "writes_ours": remote_ranks, "amo_ours": remote_ranks,
        # Inside the node (NVLink stores): DeepEP per entry, ours per distinct rank.
        "d_nvl_ours": t * r["distinct_node_ranks"] * ours_dispatch_msg(HIDDEN, TOPK),
        "c_nvl": t * TOPK * (g - 1) / n * combine_row(HIDDEN),
        # Local staging before each destination's put: dispatch writes its messages once per
        # remote rank; combine reads and writes each remote row once.
        "d_stage": t * r["distinct_remote_ranks"] * ours_dispatch_msg(HIDDEN, TOPK),
        "c_stage": 2 * t * r["remote_entries"] * combine_row(HIDDEN),
    }


def monte_carlo(n: int, g: int, trials: int, seed: int, e: int = EXPERTS) -> Dict[str, float]:
    """Mean over draws of the busiest rank's bytes across nodes (max of what it sends and what it
    receives: the NIC is full duplex), per format; and, as a check on the exact expectation,
    the mean rank's. Every rank routes TOKENS tokens to TOPK distinct experts drawn uniformly.
    Message bytes only (ours without its counts rows, a few hundred bytes)."""
    rng = random.Random(seed)
    l = e // n
    d_msg_d, d_msg_o, c_row = deepep_dispatch_msg(HIDDEN), ours_dispatch_msg(HIDDEN, TOPK), combine_row(HIDDEN)
    acc = {"d_deepep": 0.0, "d_ours": 0.0, "c_rows": 0.0}
    experts = range(e)
    for _ in range(trials):
        sent = {key: [0] * n for key in acc}
        recv = {key: [0] * n for key in acc}
        for src in range(n):
            node = src // g
            for _ in range(TOKENS):
                dsts = [x // l for x in rng.sample(experts, TOPK)]
                for d in dsts:
                    if d // g != node:
                        sent["d_deepep"][src] += d_msg_d
                        recv["d_deepep"][d] += d_msg_d
                        # combine goes back the other way: d sends, src receives
                        sent["c_rows"][d] += c_row
                        recv["c_rows"][src] += c_row
                for d in set(dsts):
                    if d // g != node:
                        sent["d_ours"][src] += d_msg_o
                        recv["d_ours"][d] += d_msg_o
        for key in list(sent):
            acc[key] += max(max(sent[key]), max(recv[key]))
            acc["mean_" + key] = acc.get("mean_" + key, 0.0) + sum(sent[key]) / n
    return {key: v / trials for key, v in acc.items()}


# ---- time ----------------------------------------------------------------------------------------

def us(num_bytes: float, gbs: float) -> float:
    return num_bytes / (gbs * 1e3)  # 1 GB/s moves 1e3 bytes per microsecond


def floor_us(num_bytes: float) -> float:
    """One message's latency (the pipeline's fill; later messages overlap it) plus the bytes at
    the NIC's rate."""
    return IB_ALPHA_US + us(num_bytes, IB_GBS)


def fit(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """Least squares t = t0 + bytes / B: returns (t0 in us, B in GB/s)."""
    xs, ys = [x / 1e3 for x, _ in points], [y for _, y in points]  # x in KB -> slope in us per KB
    m = len(xs)
    mx, my = sum(xs) / m, sum(ys) / m
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, 1.0 / slope  # 1 / (us per KB) = KB per us = GB/s


# ---- region sizes --------------------------------------------------------------------------------

def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def hint_today(t: int, h: int, n: int, e: int) -> int:
    """src/low_latency/regions.rs:35, 281-287, 319-333 (MAX_PES = 8 in the control words)."""
    control = align(2 * 8 * 8 + 2 * MAX_LL_EXPERTS * 8, 256)
    half = align(e * t * round16(LL_MSG_HEADER_BYTES + 2 * h), 256)
    return align(control + 3 * half, 128)


MAX_LL_RANKS = 256  # the design's limit


def hint_design(t: int, h: int, n: int, e: int) -> int:
    """The design's region (notes, section 5.7): the control words, then three equal parts as
    today (two halves and the combine staging), so that every offset follows from the region's
    size. A half holds one area per rank at a fixed stride; a call receives into half k & 1 and
    stages its puts in the other half's area of the same index."""
    l = e // n
    control = align(2 * MAX_LL_RANKS * 8, 256)  # arrivals[2][MAX_LL_RANKS] u64
    slot = LL_MSG_HEADER_BYTES + 4 * MAX_TOPK + 2 * h  # a bf16 message, entries for MAX_TOPK
    dispatch_area = counts_row(l) + t * slot  # counts row, T messages
    combine_area = t * min(MAX_TOPK, l) * 2 * h  # the rows of one source, compact
    half = n * align(max(dispatch_area, combine_area), 256)
    staging = align(e * t * 2 * h, 256)  # L x (n x T) x H bf16, get_next_low_latency_combine_buffer
    return align(control + 3 * max(half, staging), 128)


def hint_deepep(t: int, h: int, n: int, e: int) -> int:
    """csrc/config.hpp:136-193 at 567632d (LowLatencyLayout, get_low_latency_rdma_size_hint)."""
    scales = h // 128
    disp = 16 + max(h * 2, h + scales * 4)
    comb_msg = scales * 4 + h * 2
    send = max(t * disp, e * t * comb_msg)
    recv = max(e * t * disp, e * t * comb_msg)
    signal = align(e * 4, 128)
    total = 2 * send + 2 * recv + 2 * signal
    return (total + 128) // 128 * 128


# ---- report --------------------------------------------------------------------------------------

def mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="Monte Carlo draws per topology")
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args(list(argv) or None)

    print("# Inputs")
    print(f"T = {TOKENS} tokens per rank, hidden {HIDDEN}, top-{TOPK} of {EXPERTS} experts, uniform routing")
    print(f"dispatch message: DeepEP {deepep_dispatch_msg(HIDDEN)} B (int4 header + fp8 row + scales), "
          f"ours today {ours_today_dispatch_msg(HIDDEN)} B (LL_MSG_HEADER_BYTES {LL_MSG_HEADER_BYTES}), "
          f"ours by design {ours_dispatch_msg(HIDDEN, TOPK)} B (+ {round16(4 * TOPK)} B of top-{TOPK} entries)")
    print(f"combine row: {combine_row(HIDDEN)} B (bf16, both)")
    print(f"InfiniBand: {IB_GBS:g} GB/s per GPU [published]; latency of one put-with-signal "
          f"{IB_ALPHA_US:g} us [assumed, cluster_model.py]; H800 NVLink {H800_NVL_GBS:g} GB/s [published]")

    print("\n# Routing (exact): per token, E = 256")
    rows = []
    for g in NODE_SIZES:
        for n in EP_SIZES:
            r = routing(n, g)
            rows.append([f"EP{n}", f"{r['nodes']} x {g}", f"{r['L']}", f"{r['remote_fraction']:.3f}",
                         f"{r['remote_entries']:.2f}", f"{r['p_rank_hit']:.4f}", f"{r['distinct_ranks']:.2f}",
                         f"{r['distinct_remote_ranks']:.2f}", f"{r['distinct_remote_nodes']:.2f}"])
    print(table(["EP", "nodes x G", "L", "remote fraction", "remote entries", "P(rank hit)",
                 "distinct ranks", "distinct remote ranks", "distinct remote nodes"], rows))
    rows = []
    for n in [16, 32]:
        for g in NODE_SIZES:
            r = routing(n, g, 288)
            rows.append([f"EP{n}", f"{r['nodes']} x {g}", f"{r['L']}", f"{r['distinct_ranks']:.2f}",
                         f"{r['distinct_remote_ranks']:.2f}"])
    print("\nE = 288 (DeepEP's test default; divides EP16 and EP32 only):")
    print(table(["EP", "nodes x G", "L", "distinct ranks", "distinct remote ranks"], rows))

    print("\n# Bytes and NIC operations per rank per decode step, to other nodes (expected; MB = 1e6 B)")
    rows, mc = [], {}
    for g in NODE_SIZES:
        for n in EP_SIZES:
            b = step_bytes(n, g)
            mc[(n, g)] = monte_carlo(n, g, args.trials, args.seed)
            rows.append([f"EP{n}", f"{n // g} x {g}", mb(b["d_deepep"]), mb(b["d_ours"]),
                         f"{100 * (1 - b['d_ours'] / b['d_deepep']):.1f}%", mb(b["c_rows"]),
                         f"{b['d_records_deepep']:.0f} / {b['d_records_ours']:.0f}",
                         f"{b['d_writes_deepep']:.0f} + {b['d_amo_deepep']:.0f}",
                         f"{b['c_writes_deepep']:.0f} + {b['c_amo_deepep']:.0f}",
                         f"{b['writes_ours']} + {b['amo_ours']}"])
    print(table(["EP", "nodes x G", "dispatch DeepEP MB", "dispatch ours MB", "saved", "combine (both) MB",
                 "dispatch records DeepEP / ours", "DeepEP dispatch writes + atomics",
                 "DeepEP combine writes + atomics", "ours, each op: writes + atomics"], rows))

    print(f"\n# Floors: {IB_ALPHA_US:g} us + bytes / {IB_GBS:g} GB/s, us (mean rank; busiest rank, "
          f"Monte Carlo, {args.trials} draws, seed {args.seed})")
    rows = []
    for g in NODE_SIZES:
        for n in EP_SIZES:
            b, m = step_bytes(n, g), mc[(n, g)]
            rows.append([f"EP{n}", f"{n // g} x {g}",
                         f"{floor_us(b['d_deepep']):.1f} / {floor_us(m['d_deepep']):.1f}",
                         f"{floor_us(b['d_ours']):.1f} / {floor_us(m['d_ours']):.1f}",
                         f"{floor_us(b['c_rows']):.1f} / {floor_us(m['c_rows']):.1f}"])
    print(table(["EP", "nodes x G", "dispatch DeepEP format", "dispatch ours", "combine (both)"], rows))
    worst = max(abs(mc[key]["mean_" + f] / v - 1.0)
                for key in mc for f, v in [("d_deepep", step_bytes(*key)["d_deepep"]),
                                           ("c_rows", step_bytes(*key)["c_rows"]),
                                           ("d_ours", step_bytes(*key)["d_ours"] - (key[0] - key[1]) * counts_row(EXPERTS // key[0]))])
    print(f"check: the Monte Carlo mean rank is within {100 * worst:.2f}% of the exact expectation everywhere")
    print("forwarding through the rail peer (not this design): one copy per destination node instead of rank, "
          "dispatch bytes saved: " + ", ".join(
              f"EP{n} {n // g}x{g} {100 * (1 - routing(n, g)['distinct_remote_nodes'] / routing(n, g)['distinct_remote_ranks']):.0f}%"
              for g in NODE_SIZES for n in EP_SIZES))
    b64 = step_bytes(64, 8)
    print(f"for contrast, the latency paid once per RDMA write in series (no pipelining), EP64 nodes of 8: "
          f"DeepEP dispatch {b64['d_writes_deepep']:.0f} x {IB_ALPHA_US:g} = {b64['d_writes_deepep'] * IB_ALPHA_US:.0f} us, "
          f"ours {b64['writes_ours']} x {IB_ALPHA_US:g} = {b64['writes_ours'] * IB_ALPHA_US:.0f} us; "
          f"alpha is {100 * IB_ALPHA_US / max(floor_us(step_bytes(n, g)['c_rows']) for g in NODE_SIZES for n in EP_SIZES):.0f}-"
          f"{100 * IB_ALPHA_US / min(floor_us(step_bytes(n, g)['d_ours']) for g in NODE_SIZES for n in EP_SIZES):.0f}% "
          f"of the mean-rank floors above")

    print("\n# DeepEP v1 published (H800 + CX7, NVLink inside a node: README at 567632d) against its floor")
    rows, d_pts, c_pts = [], [], []
    for n in [8] + EP_SIZES:
        b, (td, tc) = step_bytes(n, 8), DEEPEP_NVL[n]
        if n == 8:
            nvl_d = TOKENS * TOPK * 7 / 8 * deepep_dispatch_msg(HIDDEN)
            nvl_c = TOKENS * TOPK * 7 / 8 * combine_row(HIDDEN)
            rows.append(["EP8", "1 x 8", "0", f"{td:g}", "-", "0", f"{tc:g}", "-"])
            ep8_note = (f"EP8, one node: {mb(nvl_d)} MB dispatch / {mb(nvl_c)} MB combine to the 7 other GPUs "
                        f"in {td:g} / {tc:g} us = {nvl_d / td / 1e3:.0f} / {nvl_c / tc / 1e3:.0f} GB/s, "
                        f"more than one {IB_GBS:g} GB/s NIC carries: those rows use NVLink")
            continue
        m = mc[(n, 8)]
        fd, fc = floor_us(b["d_deepep"]), floor_us(b["c_rows"])
        fdm, fcm = floor_us(m["d_deepep"]), floor_us(m["c_rows"])
        d_pts.append((b["d_deepep"], td))
        c_pts.append((b["c_rows"], tc))
        rows.append([f"EP{n}", f"{n // 8} x 8", f"{fd:.1f} ({fdm:.1f})", f"{td:g}",
                     f"{fd / td:.2f} ({fdm / td:.2f})", f"{fc:.1f} ({fcm:.1f})", f"{tc:g}",
                     f"{fc / tc:.2f} ({fcm / tc:.2f})"])
    print(table(["EP", "nodes x G", "dispatch floor us (busiest)", "DeepEP us", "floor / DeepEP",
                 "combine floor us (busiest)", "DeepEP us", "floor / DeepEP"], rows))
    print(ep8_note)

    print("\n# DeepEP v1's first table (ebfe47e, pure RDMA: every other rank through the NIC) against "
          "its floor (bytes to all n - 1 other ranks)")
    rows = []
    for n, (td, tc) in DEEPEP_PURE_RDMA.items():
        bd = TOKENS * TOPK * (n - 1) / n * deepep_dispatch_msg(HIDDEN)
        bc = TOKENS * TOPK * (n - 1) / n * combine_row(HIDDEN)
        rows.append([f"EP{n}", mb(bd), f"{floor_us(bd):.1f}", f"{td:g}", f"{floor_us(bd) / td:.2f}",
                     mb(bc), f"{floor_us(bc):.1f}", f"{tc:g}", f"{floor_us(bc) / tc:.2f}"])
    print(table(["EP", "dispatch MB", "floor us", "DeepEP us", "fraction", "combine MB", "floor us",
                 "DeepEP us", "fraction"], rows))

    (d0, dB), (c0, cB) = fit(d_pts), fit(c_pts)
    print("\n# Fit of DeepEP's EP16-EP64 times (nodes of 8): t = t0 + bytes / B")
    print(f"dispatch: t0 = {d0:.1f} us, B = {dB:.1f} GB/s; residuals "
          + ", ".join(f"{t - (d0 + us(x, dB)):+.1f}" for x, t in d_pts) + " us")
    print(f"combine:  t0 = {c0:.1f} us, B = {cB:.1f} GB/s; residuals "
          + ", ".join(f"{t - (c0 + us(x, cB)):+.1f}" for x, t in c_pts) + " us")

    print("\n# Predicted us: DeepEP's fit applied to each design's bytes (same engine, same fixed cost); ours "
          f"adds its local staging before each destination's put, in series (at {HBM_GBS:g} GB/s)")
    rows = []
    for g in NODE_SIZES:
        for n in EP_SIZES:
            b = step_bytes(n, g)
            dd = d0 + us(b["d_deepep"], dB)
            do = d0 + us(b["d_ours"], dB) + us(b["d_stage"], HBM_GBS)
            cd = c0 + us(b["c_rows"], cB)
            co = cd + us(b["c_stage"], HBM_GBS)
            pub = DEEPEP_NVL.get(n) if g == 8 else None
            nvl = max(us(b["d_nvl_ours"], H800_NVL_GBS), us(b["c_nvl"], H800_NVL_GBS))
            rows.append([f"EP{n}", f"{n // g} x {g}", f"{pub[0]:g}" if pub else "-", f"{dd:.0f}", f"{do:.0f}",
                         f"{do / dd:.2f}", f"{pub[1]:g}" if pub else "-", f"{cd:.0f}", f"{co:.0f}",
                         f"{co / cd:.2f}", f"{nvl:.0f}"])
    print(table(["EP", "nodes x G", "dispatch DeepEP published", "DeepEP model", "ours", "ours / DeepEP",
                 "combine DeepEP published", "DeepEP model", "ours", "ours / DeepEP",
                 "NVLink us, ours (busier op)"], rows))

    print("\n# get_low_latency_rdma_size_hint(128, 7168, n, E), MB (1e6 B)")
    rows = []
    for n in [8, 16, 32, 64, 128, 256]:
        for e in [256, 288, MAX_LL_EXPERTS]:
            if e % n:
                continue
            rows.append([f"{n}", f"{e}", mb(hint_today(TOKENS, HIDDEN, n, e)), mb(hint_design(TOKENS, HIDDEN, n, e)),
                         mb(hint_deepep(TOKENS, HIDDEN, n, e))])
    print(table(["ranks", "experts", "today's formula (control words for 8 ranks)", "the design", "DeepEP"], rows))
    slot = LL_MSG_HEADER_BYTES + 4 * MAX_TOPK + 2 * HIDDEN
    print(f"design: area = align256(max(counts row + T x {slot}, T x min({MAX_TOPK}, L) x {2 * HIDDEN})), "
          f"part = max(n x area, align256(E x T x {2 * HIDDEN})), region = control + 3 x part")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
