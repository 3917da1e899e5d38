"""Chapter 5 (book/src/ch05-running.md): ch05-hier-bench on two GPUs as one node of 2 and as
two virtual nodes of 1, beside NVSHMEM's team collectives, for scripts/gen_book.py."""

from __future__ import annotations

from pathlib import Path

from .collectives import COLL_LABEL, COLLECTIVES, reduce_scatter_room
from .common import Book, claim, GenError, KIB, MIB, size_label, Snippets, table, us

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
    book.write(s)
