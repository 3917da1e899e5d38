"""Chapter 5 (book/src/ch05-running.md): ch05-hier-bench on two GPUs as one node of 2 and as
two virtual nodes of 1, and on four as one node of 4 and as two virtual nodes of 2, beside
NVSHMEM's team collectives, for scripts/gen_book.py."""

from __future__ import annotations

from pathlib import Path

from .collectives import COLL_LABEL, COLLECTIVES, reduce_scatter_room
from typing import List

from .common import Book, claim, GenError, KIB, MIB, read_text, size_label, Snippets, table, us, xspan

SIZES = [KIB, MIB, 64 * MIB]


def gen_ch05(book: Book) -> None:
    s = Snippets("ch05")
    r = book.result("hier_n2")

    def time(collective: str, method: str, layout: str, size: int) -> float:
        rows = r.select(collective=collective, method=method, layout=layout, num_bytes=size)
        if len(rows) != 1:
            raise GenError(f"{r.path}: expected one row {collective} {method} {layout} {size} B, found {len(rows)}")
        return float(rows[0]["us"])

    columns = [("hierarchical", "1x2", "one node of 2 (peer pointers)"),
               ("hierarchical", "2x1", "2 nodes of 1, hierarchical"),
               ("flat", "2x1", "2 nodes of 1, flat"),
               ("nvshmem_teams", "1x2", "NVSHMEM's teams, one node of 2")]
    # NVSHMEM's team reduce-scatter (the node step of both reductions) stages the whole buffer in
    # half of its reduction scratch and does not split larger calls (chapter 4's team.rs):
    # rows past it timed a call that wrote past the scratch. The CSV's header names the scratch
    # (runs before the guard did not: NVSHMEM 3.4.5's default, 512 KiB).
    room = reduce_scatter_room(Path(r.path).read_text())

    def valid(collective: str, method: str, size: int) -> bool:
        return not (method == "nvshmem_teams" and collective in ("all_reduce", "reduce_scatter") and size > room)

    rows = []
    for collective in COLLECTIVES:
        for size in SIZES:
            cells = [f"{COLL_LABEL[collective]}, {size_label(size)}"]
            for method, layout, _ in columns:
                found = r.select(collective=collective, method=method, layout=layout, num_bytes=size)
                cells.append("x" if not valid(collective, method, size) else us(float(found[0]["us"])) if found else "-")
            rows.append(cells)
    s.add("table", table(["us per call"] + [label for _, _, label in columns], ["l", "r", "r", "r", "r"], rows)
          + f"\n\n*Virtual nodes on one host: the \"cross-node\" steps ran over NVLink through NVSHMEM's RMA "
          f"calls, so these rows compare code paths, not networks. NVSHMEM's teams with NVSHMEM_DISABLE_NCCL=1; "
          f"-: not measured; x: its node step, a reduce-scatter of the whole buffer, past half of NVSHMEM's "
          f"reduction scratch ({room // KIB} KiB), which it does not split: not a valid call. {r.provenance()}; `{r.path}`.*")
    ratios = [time(c, "hierarchical", "2x1", KIB) / time(c, "hierarchical", "1x2", KIB) for c in COLLECTIVES]
    s.add("rma_small", f"{min(ratios):.0f}-{max(ratios):.0f}x")
    s.add("rma_1k", f"{us(min(time(c, 'hierarchical', '2x1', KIB) for c in COLLECTIVES))}-"
                    f"{us(max(time(c, 'hierarchical', '2x1', KIB) for c in COLLECTIVES))} us")
    claim(all(x > 2 for x in ratios), "ch05-running.md",
          "at 1 KiB the RMA path across virtual nodes costs several times the in-node kernels")
    reducing = [c for c in COLLECTIVES if c != "all_to_all"]
    claim(all(abs(time(c, "hierarchical", "2x1", z) / time(c, "flat", "2x1", z) - 1) < 0.05
              for c in reducing for z in SIZES), "ch05-running.md",
          "with one PE per node the hierarchical plans match the flat ones, all-to-all aside")
    claim(all(time("all_to_all", "hierarchical", "2x1", z) > time("all_to_all", "flat", "2x1", z) for z in SIZES),
          "ch05-running.md", "all-to-all's hierarchical plan is slower than flat with one PE per node")
    claim(all(time(c, "nvshmem_teams", "1x2", z) > max(time(c, "hierarchical", "2x1", z), time(c, "hierarchical", "1x2", z))
              for c in reducing for z in SIZES if z >= MIB and valid(c, "nvshmem_teams", z)), "ch05-running.md",
          "NVSHMEM's team collectives are slower than both of our paths from 1 MiB")
    s.add("run", r.provenance())
    gen_ch05_n4(book, s)
    book.write(s)


# Four GPUs: the first layout with a node of several PEs on each side of the cut, 2 nodes of 2.
SIZES_N4 = [KIB, MIB, 16 * MIB, 64 * MIB]
# The page's reading of the all-gather and reduce-scatter at 2 x 2 rests on this grid.
EXEC_SOURCE = "chapters/ch05-inter-node/src/exec/mod.rs"
PERMUTE_GRID = "let blocks = (outer * inner).clamp(1, u64::from(self.num_sms)) as u32;"


def gen_ch05_n4(book: Book, s: Snippets) -> None:
    r = book.result("hier_n4")
    room = reduce_scatter_room(Path(r.path).read_text())

    def time(collective: str, method: str, layout: str, size: int) -> float:
        rows = r.select(collective=collective, method=method, layout=layout, num_bytes=size)
        if len(rows) != 1:
            raise GenError(f"{r.path}: expected one row {collective} {method} {layout} {size} B, found {len(rows)}")
        return float(rows[0]["us"])

    sizes = sorted({int(x["num_bytes"]) for x in r.select(method="flat", layout="2x2")})
    # The flat plan does not depend on the layout: every step crosses by RMA.
    claim(all(abs(time(c, "flat", "2x2", z) / time(c, "flat", "1x4", z) - 1) < 0.1 for c in COLLECTIVES for z in sizes),
          "ch05-running.md", "the flat plans take the same time whatever the layout")

    def hier_vs_flat(c: str, z: int) -> float:
        return time(c, "hierarchical", "2x2", z) / time(c, "flat", "2x2", z)

    def nv_cell(c: str, z: int) -> str:
        if c in ("all_reduce", "reduce_scatter") and z > room:
            return "x"
        found = r.select(collective=c, method="nvshmem_teams", layout="2x2", num_bytes=z)
        return us(float(found[0]["us"])) if found else "-"

    rows = []
    for c in COLLECTIVES:
        for z in SIZES_N4:
            rows.append([f"{COLL_LABEL[c]}, {size_label(z)}", us(time(c, "hierarchical", "1x4", z)),
                         us(time(c, "hierarchical", "2x2", z)), us(time(c, "flat", "2x2", z)),
                         f"{hier_vs_flat(c, z):.2f}", nv_cell(c, z)])
    s.add("table_n4", table(["us per call", "one node of 4 (peer pointers)", "2 nodes of 2, hierarchical",
                             "2 nodes of 2, flat", "hierarchical / flat", "NVSHMEM's teams, 2 nodes of 2"],
                            ["l", "r", "r", "r", "r", "r"], rows)
          + f"\n\n*Virtual nodes on one host, as above: the rail steps ran over NVLink through NVSHMEM's RMA calls. "
          f"NVSHMEM's teams with NVSHMEM_DISABLE_NCCL=1; -: not measured; x: past half of NVSHMEM's reduction "
          f"scratch ({room // KIB} KiB), not a valid call. {r.provenance()}; `{r.path}`.*")
    s.add("run_n4", r.provenance())

    def spread(c: str, keep) -> List[float]:
        return [hier_vs_flat(c, z) for z in sizes if keep(z)]

    small, large = (lambda z: z <= MIB), (lambda z: z >= 4 * MIB)
    claim(all(x < 1 for x in spread("broadcast", lambda z: True)), "ch05-running.md",
          "at 2 nodes of 2 the hierarchical broadcast beats the flat one at every size")
    s.add("n4_broadcast", xspan(spread("broadcast", lambda z: True)))
    claim(all(x < 1 for x in spread("all_reduce", small)) and all(x > 0.98 for x in spread("all_reduce", large)),
          "ch05-running.md", "the hierarchical all-reduce wins up to 1 MiB and is level or slower from 4 MiB")
    s.add("n4_all_reduce_small", xspan(spread("all_reduce", small)))
    s.add("n4_all_reduce_large", xspan(spread("all_reduce", large)))
    gather = [c for c in ("all_gather", "reduce_scatter")]
    level = [x for c in gather for x in spread(c, lambda z: z <= 256 * KIB)]
    worse = [x for c in gather for x in spread(c, lambda z: z >= MIB)]
    claim(all(abs(x - 1) < 0.06 for x in level) and all(x > 1.1 for x in worse), "ch05-running.md",
          "the hierarchical all-gather and reduce-scatter are level with flat up to 256 KiB and slower from 1 MiB")
    s.add("n4_gather_level", xspan(level))
    s.add("n4_gather_worse", xspan(worse))
    # The reading the page gives for it: only these two plans permute the whole buffer at 2 x 2,
    # and at one PE per node (no permutation) the same plans match flat.
    claim(all(abs(time(c, "hierarchical", "4x1", z) / time(c, "flat", "4x1", z) - 1) < 0.1 for c in gather for z in sizes),
          "ch05-running.md", "with one PE per node (no permutation) the hierarchical all-gather and reduce-scatter match flat")
    claim(all(x > 1 for x in spread("all_to_all", lambda z: True)), "ch05-running.md",
          "the hierarchical all-to-all is slower than flat at 2 nodes of 2")
    s.add("n4_all_to_all", xspan(spread("all_to_all", lambda z: True)))
    reducing = [c for c in COLLECTIVES if c != "all_to_all"]
    claim(all(float(nv) > max(time(c, "hierarchical", "2x2", z), time(c, "flat", "2x2", z))
              for c in reducing for z in sizes if z >= MIB for nv in [nv_cell(c, z)] if nv not in ("x", "-")),
          "ch05-running.md", "NVSHMEM's team collectives at 2 nodes of 2 are slower than both our paths from 1 MiB")
    claim(PERMUTE_GRID in read_text(EXEC_SOURCE), "ch05-running.md",
          f"the local permutation runs outer x inner blocks ({EXEC_SOURCE}: {PERMUTE_GRID})")
