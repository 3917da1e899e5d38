"""Chapters 3 and 4's results as the generators read them (the chapter pages and Appendix A's
model alike): the put variants, the collectives, chapter 4's size table and one run of its
benchmark."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from .common import SIZE_TABLE_SOURCE, GenError, Result, read_text

PUTS = ("nvshmem_put", "bulk_put", "store_put")

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
COLL_LABEL = {
    "all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
    "broadcast": "broadcast", "all_to_all": "all-to-all",
}
PEER_LABEL = {"nccl": "NCCL", "torch_symm": "torch", "nvshmem": "NVSHMEM"}


def reduce_scatter_room(text: str) -> int:
    """The input bytes NVSHMEM's team reduce-scatter can take in the run whose CSV is `text`:
    half of its reduction scratch, which its header names (chapter 4's team.rs); runs that do
    not name it had NVSHMEM 3.4.5's default, 512 KiB. Rows past it timed a call that wrote past
    the scratch: not valid calls."""
    found = re.search(r"NVSHMEM_REDUCE_SCRATCH_SIZE=(\d+) bytes", text)
    return (int(found.group(1)) if found else 512 << 10) // 2


def size_table() -> List[Tuple[str, int, str]]:
    """(collective, up to bytes, algorithm) rows of chapter 4's SIZE_TABLE, from the Rust source."""
    text = read_text(SIZE_TABLE_SOURCE)
    body = text[text.index("pub const SIZE_TABLE"):]
    body = body[: body.index("];")]
    rows = []
    names = {"SyncAll": "sync_all", "Broadcast": "broadcast", "AllGather": "all_gather",
             "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce", "AllToAll": "all_to_all",
             "AllToAllV": "all_to_all_v"}
    algos = {"OneShot": "one_shot", "TwoShot": "two_shot", "Direct": "direct", "Ring": "ring",
             "ScatterGather": "scatter_gather", "Pull": "pull", "Signal": "signal",
             "RsAg": "rs_ag"}
    for m in re.finditer(r"\(Collective::(\w+),\s*([^,]+),\s*Algorithm::(\w+)\)", body):
        limit = m.group(2).strip()
        if limit == "usize::MAX":
            up_to = 1 << 62
        else:
            found = re.fullmatch(r"(\d+)\s*<<\s*(\d+)", limit)
            if not found:
                raise GenError(f"{SIZE_TABLE_SOURCE}: cannot read size {limit!r} in SIZE_TABLE")
            up_to = int(found.group(1)) << int(found.group(2))
        rows.append((names[m.group(1)], up_to, algos[m.group(3)]))
    if not rows:
        raise GenError(f"{SIZE_TABLE_SOURCE}: SIZE_TABLE not found")
    return rows


def broadcast_units_range() -> Tuple[int, int]:
    """BROADCAST_UNITS_FROM and BROADCAST_UNITS_UP_TO of chapter 4's algorithm.rs: between these
    sizes at more than 2 PEs, `choose` turns the table's scatter_gather broadcast into
    scatter_gather_units."""
    source = read_text(SIZE_TABLE_SOURCE)
    ends = []
    for name in ("BROADCAST_UNITS_FROM", "BROADCAST_UNITS_UP_TO"):
        found = re.search(rf"pub const {name}: usize = (\d+)\s*<<\s*(\d+);", source)
        if not found:
            raise GenError(f"{SIZE_TABLE_SOURCE}: {name} not found")
        ends.append(int(found.group(1)) << int(found.group(2)))
    return ends[0], ends[1]


class Coll:
    """One chapter 4 run: ours (`choose`'s choice: the size table, then its rule for the
    broadcast's units), the peers, NVSHMEM's row if any."""

    def __init__(self, result: Result, table_rows: List[Tuple[str, int, str]]):
        self.r = result
        self.table = table_rows
        self.n = int(result.rows[0]["n_pes"])
        self.units_from, self.units_up_to = broadcast_units_range()

    def choices(self, collective: str, size: int) -> List[str]:
        """`choose`'s algorithm first, then the table's others (a run older than a change of
        the table, or LL past its scratch, falls back to them in this order)."""
        out = [a for c, up_to, a in self.table if c == collective and size <= up_to]
        if (collective == "broadcast" and out and out[0] == "scatter_gather" and self.n > 2
                and self.units_from <= size <= self.units_up_to):
            out.insert(0, "scatter_gather_units")
        return out + [a for c, _, a in self.table if c == collective]

    def us(self, collective: str, size: int, method: str, algorithm: Optional[str] = None) -> Optional[float]:
        found = [float(r["us"]) for r in self.r.select(collective=collective, num_bytes=size, method=method)
                 if algorithm is None or r["algorithm"] == algorithm]
        return min(found) if found else None

    def ours(self, collective: str, size: int) -> Tuple[float, str]:
        """`choose`'s choice, and the next algorithm when it did not run at this size."""
        for algorithm in self.choices(collective, size):
            t = self.us(collective, size, "ours", algorithm)
            if t is not None:
                return t, algorithm
        raise GenError(f"{self.r.path}: no row of ours for {collective} at {size} B")

    def unmeasured_choices(self) -> List[Tuple[str, int, str, str]]:
        """(collective, size, the table's choice, the algorithm shown instead) wherever this run
        has no row of the table's choice: a run older than a change of the table. The LL
        fallback (one_shot past its scratch) is the table's own rule, not listed."""
        out = []
        for r in self.r.select(method="ours"):
            collective, size = r["collective"], int(r["num_bytes"])
            first = next(iter(self.choices(collective, size)), None)
            if collective not in COLLECTIVES or first is None or first == "one_shot":
                continue
            if self.us(collective, size, "ours", first) is None:
                out.append((collective, size, first, self.ours(collective, size)[1]))
        return sorted(set(out))

    def peers(self, collective: str, size: int) -> Dict[str, float]:
        out = {}
        for method in ("nccl", "torch_symm", "nvshmem"):
            t = self.us(collective, size, method)
            if t is not None:
                out[method] = t
        return out

    def best_peer(self, collective: str, size: int) -> Tuple[float, str]:
        peers = self.peers(collective, size)
        if not peers:
            raise GenError(f"{self.r.path}: no peer for {collective} at {size} B")
        method = min(peers, key=peers.get)
        label = PEER_LABEL[method]
        if method == "torch_symm":
            algo = min(self.r.select(collective=collective, num_bytes=size, method=method), key=lambda r: float(r["us"]))["algorithm"]
            label = f"torch {algo.replace('_', '-')}"
        return peers[method], label

    def has_nvshmem(self) -> bool:
        return any(r["method"] == "nvshmem" and r["collective"] in COLLECTIVES for r in self.r.rows)

    def sizes(self) -> List[int]:
        return sorted({int(r["num_bytes"]) for r in self.r.select(method="nccl", collective="all_reduce")})
