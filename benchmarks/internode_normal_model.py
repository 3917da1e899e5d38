#!/usr/bin/env python3
"""Normal mode across nodes, on paper: bytes, floors and predicted times of one dispatch and one
combine in DeepEP's benchmark shape (issue 32, "Performance, on paper").

A model, not a measurement: no RDMA network was run for it. It writes the tables of
benchmarks/notes/buffer_internode.md section 8, and the book's page on the normal mode across
nodes generates its table from the same functions (scripts/bookgen/internode_normal.py).

- The shape: DeepEP's tests/test_internode.py at 567632d (:374-383): 4096 tokens per rank, hidden 7168,
  top-8 of 256 experts, fp8 dispatch with its scales, bf16 combine.
- The routing: the test's (`tests/test_internode.py:40-44`): experts in groups, one group per
  node; a token takes the top min(N, 4) groups by their best score, then its top-8 experts
  inside them, from random scores. So a token reaches at most 4 nodes. Drawn here by a seeded
  Monte Carlo (the group choice makes the experts inside the chosen groups non-uniform; below
  5 nodes it is uniform, and the draw is checked against the exact expectation there).
- The route: the two-level one of DeepEP and ours. A token crosses the network once per
  destination node other than its own, to the rail peer (same local index), which forwards it
  over NVLink to the destination ranks of its node; combine returns the same way.
- The floors: the NIC at 50 GB/s per GPU (400 Gb/s, published) and NVLink at 160 GB/s per
  GPU (H800, published), each link alone; an op takes at least the larger.
- DeepEP v1's published H800 + ConnectX-7 figures (README.md:17-22 at 567632d), turned into
  times with the test's own byte count (which counts a token's own node too:
  `tests/test_internode.py:58-61, 222, 237-240`).
- The prediction: DeepEP's efficiency on the link that binds (from its published rows) applied
  to each topology's bytes is the target, since our slots and chunks move the same bytes with
  the same NIC operations; our design is predicted within OURS_RANGE of it (reasons in the
  notes, section 8.5).

    python3 benchmarks/internode_normal_model.py              # every table
    python3 benchmarks/internode_normal_model.py --tokens 5000  # fewer Monte Carlo tokens

Python 3.9+, standard library only; about a second.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_model import PUBLISHED  # noqa: E402  (one source for the InfiniBand figure)

# ---- the shape (DeepEP tests/test_internode.py defaults at 567632d, :374-383) ---------------------
TOKENS = 4096  # T: tokens per rank
HIDDEN = 7168
TOPK = 8
EXPERTS = 256
MAX_GROUPS = 4  # the test's num_topk_groups = min(num_nodes, 4)
FP8_GROUP = 128  # channels per fp8 scale


def a16(n: int) -> int:
    return (n + 15) // 16 * 16


# ANCHOR: slots
# One slot per (token, destination node) crosses the network; the same slot is forwarded over
# NVLink. src/config.rs internode_dispatch_slot_bytes and src/regions.rs combine_slot_bytes.
def dispatch_slot(hidden: int = HIDDEN, k: int = TOPK) -> int:
    """fp8 row, then {source node, in-node mask}, top-k ids and weights, the row's scales."""
    return a16(hidden) + a16(8 + 8 * k + 4 * (hidden // FP8_GROUP))


def combine_slot(hidden: int = HIDDEN, k: int = TOPK) -> int:
    """bf16 row (a node's sum), then the top-k weights."""
    return a16(2 * hidden) + a16(4 * k)


def deepep_slots(hidden: int = HIDDEN, k: int = TOPK) -> Tuple[int, int]:
    """DeepEP's slots, dispatch fp8 and combine: row, SourceMeta (8 B), scales, top-k ids and
    weights, 16-aligned (csrc/kernels/internode.cu:42-46; combine without ids or scales, :1753)."""
    return a16(hidden + 8 + 4 * (hidden // FP8_GROUP) + 8 * k), a16(2 * hidden + 8 + 4 * k)


def deepep_counted(hidden: int = HIDDEN) -> Tuple[float, float]:
    """Bytes DeepEP's test counts per (token, node hit), dispatch fp8 and combine bf16:
    hidden x 2 x (1 + 4/128) / 2 and hidden x 2 (tests/test_internode.py:222, 237-240)."""
    return hidden * 2 * (1 + 4 / FP8_GROUP) / 2, hidden * 2.0
# ANCHOR_END: slots


# ---- hardware -----------------------------------------------------------------------------------
IB_GBS = PUBLISHED["ib_gbs"][0]  # 50 GB/s per GPU: a ConnectX-7 at 400 Gb/s (cluster_model.py)
NVL_GBS = 160.0  # H800 NVLink per GPU, DeepEP README.md:15 at 567632d ("~160 GB/s")

# ---- DeepEP v1's published normal-mode figures (README.md:17-22 at 567632d) ----------------------
# "Bottleneck bandwidth" of the internode rows, dispatch / combine, GB/s, as its test prints it
# ("GB/s (RDMA)": the bytes above times the tokens' nodes, own node included, over the time).
DEEPEP_RDMA_GBS = {16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
DEEPEP_INTRANODE_NVL_GBS = (153.0, 158.0)  # the EP8 row, for reference

EP_SIZES = [16, 32, 64]
NODE_SIZES = [8, 4, 2]

# Our design against the target (DeepEP's engine on the same bytes), as a speed fraction: from
# 0.8 (a 32-token window barrier where DeepEP releases slots without one, warp copies where it
# uses TMA, NVSHMEM's queue-pair choice where DeepEP pins one per channel) to 1.0 (the same
# bytes and NIC operations per chunk). A judgment, written before any cluster run.
OURS_RANGE = (0.8, 1.0)


# ---- routing ------------------------------------------------------------------------------------

@dataclass
class Routing:
    n: int
    g: int
    nodes_hit: float  # distinct nodes per token, its own included when hit
    ranks_hit: float  # distinct ranks per token

    @property
    def nodes(self) -> int:
        return self.n // self.g

    @property
    def remote_nodes(self) -> float:
        """Destination nodes per token other than the sender's: by symmetry (N - 1) / N of them."""
        return self.nodes_hit * (self.nodes - 1) / self.nodes

    @property
    def remote_ranks(self) -> float:
        """Destination ranks per token on other nodes: what a one-level route sends across."""
        return self.ranks_hit * (self.n - self.g) / self.n


def draw_routing(n: int, g: int, tokens: int, seed: int, e: int = EXPERTS, k: int = TOPK) -> Routing:
    """The test's routing, drawn. Scores are i.i.d., so only their order matters: walk the experts
    from the best score down (a random order); the chosen groups are the first min(N, 4) groups
    met, and a token's top-k are the experts of those groups met first. Once the groups are
    known, the order of the experts not yet met is uniform, so the rest of the top-k is a uniform
    sample of them."""
    nodes, l = n // g, e // n
    per_group = e // nodes
    want = min(nodes, MAX_GROUPS)
    rng = random.Random(seed)
    nodes_sum = ranks_sum = 0
    for _ in range(tokens):
        seen: List[int] = []
        seen_set = set()
        groups: List[int] = []
        while len(groups) < want:
            x = rng.randrange(e)
            if x in seen_set:
                continue
            seen_set.add(x)
            seen.append(x)
            if x // per_group not in groups:
                groups.append(x // per_group)
        chosen = [x for x in seen if x // per_group in groups][:k]
        if len(chosen) < k:
            rest = [x for grp in groups for x in range(grp * per_group, (grp + 1) * per_group) if x not in seen_set]
            chosen += rng.sample(rest, k - len(chosen))
        nodes_sum += len({x // per_group for x in chosen})
        ranks_sum += len({x // l for x in chosen})
    return Routing(n, g, nodes_sum / tokens, ranks_sum / tokens)


def exact_uniform(n: int, g: int, e: int = EXPERTS, k: int = TOPK) -> Tuple[float, float]:
    """Expected distinct nodes and ranks per token when the top-k are uniform over all experts
    (the test's routing below 5 nodes): a unit of m experts is hit unless all k picks miss it."""
    nodes = n // g

    def hit(m: int) -> float:
        return 1.0 - comb(e - m, k) / comb(e, k)

    return nodes * hit(e // nodes), n * hit(e // n)


# ---- bytes, floors, times -----------------------------------------------------------------------

def us(num_bytes: float, gbs: float) -> float:
    return num_bytes / (gbs * 1e3)  # 1 GB/s moves 1e3 bytes per microsecond


@dataclass
class Op:
    """One op (dispatch or combine) of one rank in one topology."""
    nic_bytes: float  # sent across the network (by symmetry also received)
    nvl_bytes: float  # forwarded over NVLink to other GPUs of the node
    flat_nic_bytes: float  # what a one-level route (a copy per destination rank) would send across

    @property
    def nic_us(self) -> float:
        return us(self.nic_bytes, IB_GBS)

    @property
    def nvl_us(self) -> float:
        return us(self.nvl_bytes, NVL_GBS)

    @property
    def floor_us(self) -> float:
        return max(self.nic_us, self.nvl_us)

    @property
    def binds(self) -> str:
        return "NIC" if self.nic_us >= self.nvl_us else "NVLink"


# ANCHOR: op_bytes
def op_bytes(r: Routing, slot: int) -> Op:
    """A token crosses the network once per destination node other than its own (the rail peer
    forwards it), and NVLink once per destination rank that is not its forwarder (1 in G of
    them is: a destination with the sender's local index)."""
    return Op(nic_bytes=TOKENS * r.remote_nodes * slot,
              nvl_bytes=TOKENS * r.ranks_hit * (r.g - 1) / r.g * slot,
              flat_nic_bytes=TOKENS * r.remote_ranks * slot)
# ANCHOR_END: op_bytes


@dataclass
class Published:
    """DeepEP's published row at EP n (nodes of 8) turned into a time per op."""
    gbs: Tuple[float, float]
    us: Tuple[float, float]
    nic_gbs: Tuple[float, float]  # what its NIC carried: bytes to other nodes / time


def published(r: Routing) -> Published:
    counted = deepep_counted()
    gbs = DEEPEP_RDMA_GBS[r.n]
    times = tuple(TOKENS * r.nodes_hit * counted[i] / (gbs[i] * 1e3) for i in range(2))
    ops = (op_bytes(r, dispatch_slot()), op_bytes(r, combine_slot()))
    return Published(gbs, times, tuple(ops[i].nic_bytes / times[i] / 1e3 for i in range(2)))


@dataclass
class Model:
    routings: Dict[Tuple[int, int], Routing]
    efficiency: Dict[Tuple[str, str], float]  # (op, link) -> DeepEP's floor / time, averaged

    def ops(self, n: int, g: int) -> Tuple[Op, Op]:
        r = self.routings[(n, g)]
        return op_bytes(r, dispatch_slot()), op_bytes(r, combine_slot())

    def target_us(self, n: int, g: int) -> Tuple[float, float]:
        """DeepEP's efficiency on each link, applied to this topology's bytes: the slower link."""
        out = []
        for name, op in zip(("dispatch", "combine"), self.ops(n, g)):
            out.append(max(op.nic_us / self.efficiency[(name, "NIC")], op.nvl_us / self.efficiency[(name, "NVLink")]))
        return out[0], out[1]

    def ours_us(self, n: int, g: int) -> Tuple[Tuple[float, float], Tuple[float, float]]:
        """(dispatch, combine), each (fastest, slowest) predicted."""
        lo, hi = OURS_RANGE
        return tuple((t / hi, t / lo) for t in self.target_us(n, g))  # type: ignore[return-value]

    def counted_gbs(self, n: int, g: int, t_us: float, op: int) -> float:
        """The bandwidth DeepEP's test would print for time t: its counted bytes over t."""
        return TOKENS * self.routings[(n, g)].nodes_hit * deepep_counted()[op] / (t_us * 1e3)


def build(tokens: int = 20000, seed: int = 32) -> Model:
    routings = {(n, g): draw_routing(n, g, tokens, seed) for g in NODE_SIZES for n in EP_SIZES}
    # DeepEP's efficiency per op and link: its floor over its time, over the rows that link binds.
    acc: Dict[Tuple[str, str], List[float]] = {}
    for n in EP_SIZES:
        r = routings[(n, 8)]
        pub = published(r)
        for i, (name, slot) in enumerate((("dispatch", dispatch_slot()), ("combine", combine_slot()))):
            op = op_bytes(r, slot)
            acc.setdefault((name, op.binds), []).append(op.floor_us / pub.us[i])
    efficiency = {key: sum(v) / len(v) for key, v in acc.items()}
    for name in ("dispatch", "combine"):
        for link in ("NIC", "NVLink"):
            if (name, link) not in efficiency:
                raise SystemExit(f"no published row where {link} binds the {name}: the model has no efficiency for it")
    return Model(routings, efficiency)


# ---- the tables (the notes print them; the book's generator formats the same rows) ---------------

def label(n: int, g: int) -> Tuple[str, str]:
    return f"EP{n}", f"{n // g} x {g}"


def per_topology(row: Callable[[int, int], List[str]]) -> List[List[str]]:
    """One table row per topology (node sizes, then EP sizes): its label, then `row(n, g)`."""
    return [[*label(n, g), *row(n, g)] for g in NODE_SIZES for n in EP_SIZES]


def routing_rows(m: Model) -> List[List[str]]:
    def row(n: int, g: int) -> List[str]:
        r = m.routings[(n, g)]
        return [f"{min(r.nodes, MAX_GROUPS)} of {r.nodes}", f"{r.nodes_hit:.2f}", f"{r.remote_nodes:.2f}",
                f"{r.ranks_hit:.2f}", f"{r.remote_ranks:.2f}"]
    return per_topology(row)


ROUTING_HEADER = ["EP", "nodes x G", "groups chosen", "nodes per token", "other nodes", "ranks per token",
                  "ranks on other nodes"]


def bytes_rows(m: Model) -> List[List[str]]:
    def row(n: int, g: int) -> List[str]:
        d, c = m.ops(n, g)
        return [f"{d.nic_bytes / 1e6:.1f}", f"{c.nic_bytes / 1e6:.1f}", f"{d.flat_nic_bytes / 1e6:.1f}",
                f"{100 * (1 - d.nic_bytes / d.flat_nic_bytes):.0f}%", f"{d.nvl_bytes / 1e6:.1f}",
                f"{c.nvl_bytes / 1e6:.1f}"]
    return per_topology(row)


BYTES_HEADER = ["EP", "nodes x G", "network, dispatch MB", "network, combine MB", "one-level route, dispatch MB",
                "saved by forwarding", "NVLink, dispatch MB", "NVLink, combine MB"]


def floor_rows(m: Model) -> List[List[str]]:
    def row(n: int, g: int) -> List[str]:
        d, c = m.ops(n, g)
        return [f"{d.nic_us:.0f} / {c.nic_us:.0f}", f"{d.nvl_us:.0f} / {c.nvl_us:.0f}", f"{d.binds} / {c.binds}"]
    return per_topology(row)


FLOOR_HEADER = ["EP", "nodes x G", "NIC floor us, d / c", "NVLink floor us, d / c", "binds"]


def published_rows(m: Model) -> List[List[str]]:
    rows = []
    for n in EP_SIZES:
        r = m.routings[(n, 8)]
        pub = published(r)
        d, c = m.ops(n, 8)
        rows.append([*label(n, 8), f"{pub.gbs[0]:g} / {pub.gbs[1]:g}", f"{pub.us[0]:.0f} / {pub.us[1]:.0f}",
                     f"{pub.nic_gbs[0]:.1f} / {pub.nic_gbs[1]:.1f}",
                     f"{d.floor_us / pub.us[0]:.2f} / {c.floor_us / pub.us[1]:.2f} ({d.binds} / {c.binds})"])
    return rows


PUBLISHED_HEADER = ["EP", "nodes x G", "DeepEP GB/s, d / c (its count)", "DeepEP us, d / c",
                    "its NIC carried GB/s", "floor / DeepEP (binds)"]


def prediction_rows(m: Model) -> List[List[str]]:
    def row(n: int, g: int) -> List[str]:
        d, c = m.ops(n, g)
        td, tc = m.target_us(n, g)
        (dlo, dhi), (clo, chi) = m.ours_us(n, g)
        pub = published(m.routings[(n, g)]) if g == 8 else None
        return [f"{d.floor_us:.0f} / {c.floor_us:.0f}", f"{pub.us[0]:.0f} / {pub.us[1]:.0f}" if pub else "-",
                f"{td:.0f} / {tc:.0f}", f"{dlo:.0f}-{dhi:.0f} / {clo:.0f}-{chi:.0f}",
                f"{m.counted_gbs(n, g, dhi, 0):.0f}-{m.counted_gbs(n, g, dlo, 0):.0f} / "
                f"{m.counted_gbs(n, g, chi, 1):.0f}-{m.counted_gbs(n, g, clo, 1):.0f}"]
    return per_topology(row)


PREDICTION_HEADER = ["EP", "nodes x G", "floor us, d / c", "DeepEP published us", "target us (DeepEP's efficiency)",
                     "ours, predicted us", "ours, GB/s as DeepEP's test counts"]


def uniform_check(m: Model) -> float:
    """Largest relative gap between the draw and the exact expectation where the routing is
    uniform (at most 4 nodes), over nodes and ranks per token."""
    worst = 0.0
    for (n, g), r in m.routings.items():
        if n // g <= MAX_GROUPS:
            nodes, ranks = exact_uniform(n, g)
            worst = max(worst, abs(r.nodes_hit / nodes - 1), abs(r.ranks_hit / ranks - 1))
    return worst


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=20000, help="Monte Carlo tokens per topology")
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args(list(argv) or None)
    m = build(args.tokens, args.seed)

    print("# Inputs")
    print(f"T = {TOKENS} tokens per rank, hidden {HIDDEN}, top-{TOPK} of {EXPERTS} experts; routing: DeepEP's test "
          f"(a group per node, top min(N, {MAX_GROUPS}) groups, then top-{TOPK}), {args.tokens} tokens drawn, "
          f"seed {args.seed}")
    print(f"slots: dispatch {dispatch_slot()} B (fp8 row, meta, top-k ids and weights, scales), combine "
          f"{combine_slot()} B (bf16 row, weights); DeepEP's test counts {deepep_counted()[0]:.0f} / "
          f"{deepep_counted()[1]:.0f} B per (token, node hit); DeepEP's slots {deepep_slots()[0]} / {deepep_slots()[1]} B")
    print(f"NIC {IB_GBS:g} GB/s per GPU, NVLink {NVL_GBS:g} GB/s per GPU [published]")
    print("\n# Routing per token")
    print(table(ROUTING_HEADER, routing_rows(m)))
    print(f"check: at most {MAX_GROUPS} nodes the draw is within {100 * uniform_check(m):.2f}% of the exact "
          "(uniform) expectation")
    print("\n# Bytes per rank and op (MB = 1e6 B; by symmetry also what a rank receives)")
    print(table(BYTES_HEADER, bytes_rows(m)))
    print("\n# Floors per op, each link alone")
    print(table(FLOOR_HEADER, floor_rows(m)))
    print("\n# DeepEP v1 published (H800 + CX7, nodes of 8, README at 567632d) as times")
    print(table(PUBLISHED_HEADER, published_rows(m)))
    print("efficiency (DeepEP's floor / time, mean over the rows each link binds): " + ", ".join(
        f"{op} {link} {v:.3f}" for (op, link), v in sorted(m.efficiency.items())))
    print(f"\n# Prediction: target = max(NIC floor / its efficiency, NVLink floor / its efficiency); ours "
          f"{OURS_RANGE[0]:g}-{OURS_RANGE[1]:g}x the target's speed")
    print(table(PREDICTION_HEADER, prediction_rows(m)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
