"""Chapter 4's measured pages: the collectives against NCCL, torch and NVSHMEM, for
scripts/gen_book.py."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .collectives import COLL_LABEL, COLLECTIVES, Coll, reduce_scatter_room, size_table
from .common import (
    Book,
    claim,
    gbs,
    GenError,
    KIB,
    MANIFEST,
    MIB,
    ratio,
    size_label,
    Snippets,
    span,
    table,
    us,
    xspan,
)

# ---- chapter 4 -----------------------------------------------------------------------------------

TABLE_SIZES = [KIB, 64 * KIB, MIB, 16 * MIB, 256 * MIB]


def coll_table(c: Coll) -> str:
    rows = []
    for size in TABLE_SIZES:
        cells = [size_label(size)]
        for collective in COLLECTIVES:
            ours, _ = c.ours(collective, size)
            peer, label = c.best_peer(collective, size)
            cells.append(f"{us(ours)} / {us(peer)} {label}")
        rows.append(cells)
    return table(["size"] + [f"{COLL_LABEL[x]}: ours / best peer" for x in COLLECTIVES], ["r"] * 6, rows)


def slower_where(runs: Dict[str, Coll], slower: Sequence[Tuple[int, str, int, float, str]], with_ratios: bool) -> str:
    """Where ours is slower than the best peer, one phrase per collective and N: 'broadcast from
    16 MiB (1.05-1.21x NCCL's time)', 'from' when every larger size measured is slower too."""
    by_n = {c.n: c for c in runs.values()}
    groups: Dict[Tuple[int, str], List[Tuple[int, float, str]]] = {}
    for n, col, z, x, label in slower:
        groups.setdefault((n, col), []).append((z, x, label))
    phrases = []
    for (n, col), cells in groups.items():
        sizes = sorted(z for z, _, _ in cells)
        larger = [z for z in by_n[n].sizes() if z >= sizes[0]]
        if sizes == larger and len(sizes) > 1:
            where = f"from {size_label(sizes[0])}"
        else:
            where = "at " + ", ".join(size_label(z) for z in sizes)
        phrase = f"{COLL_LABEL[col]} {where}"
        if with_ratios:
            labels = sorted({label for _, _, label in cells})
            phrase += f" ({xspan([x for _, x, _ in cells])} {' or '.join(labels)}'s time)"
        if len({n for n, _ in groups}) > 1:
            phrase += f" at N = {n}"
        phrases.append(phrase)
    text = ", ".join(phrases[:-1]) + (" and " if len(phrases) > 1 else "") + phrases[-1]
    ns = {n for n, _ in groups}
    if len(ns) == 1:
        text += f", {'both ' if len(phrases) == 2 else ''}at N = {ns.pop()}"
    return text


def unmeasured_note(c: Coll) -> str:
    """A caption's sentence for the cells where the run has no row of the size table's choice."""
    missing = c.unmeasured_choices()
    if not missing:
        return ""
    by_choice: Dict[Tuple[str, str, str], List[int]] = {}
    for collective, size, first, shown in missing:
        by_choice.setdefault((collective, first, shown), []).append(size)
    parts = [f"{COLL_LABEL[col]} at {' and '.join(size_label(z) for z in sorted(zs))}: chapter 4 chooses "
             f"{first}, which this run did not time; the {shown.replace('_', '-')}'s time is shown"
             for (col, first, shown), zs in by_choice.items()]
    text = "; ".join(parts)
    return f" {text[0].upper()}{text[1:]}."


def gen_ch04(book: Book) -> None:
    s = Snippets("ch04")
    table_rows = size_table()
    runs = {key: Coll(book.result(key), table_rows) for key in ("coll_n2", "coll_n4")}
    for key, c in runs.items():
        r = c.r
        s.add(f"{key}_run", f"{r.device}, {r.date}")
        s.add(f"{key}_table", coll_table(c) + "\n\n" +
              f"*Time per call in us, CUDA-graph replay; ours: chapter 4's choice (the size table, and the broadcast's units "
              f"from {size_label(c.units_from)} to {size_label(c.units_up_to)} at more than 2 PEs); best peer: the fastest of "
              f"NCCL, torch SymmetricMemory{' and NVSHMEM' if c.has_nvshmem() else ''} at that size. "
              f"`{r.path}`: {r.device}, {r.date}.{unmeasured_note(c)}*" + book.caveat(key))
        ours128 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="direct_128tok")]
        ours4096 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="direct_4096tok")]
        vdev128 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="vdev_128tok")]
        vdev4096 = [float(x["us"]) for x in r.select(collective="all_to_all_v", algorithm="vdev_4096tok")]
        if not (ours128 and ours4096 and vdev128 and vdev4096):
            raise GenError(f"{r.path}: all_to_all_v rows missing")
        s.add(f"{key}_a2av", f"128 tokens {us(ours128[0])} us, 4096 tokens {us(ours4096[0])} us, against "
              f"{us(vdev128[0])} and {us(vdev4096[0])} us for torch's NVSHMEM-backed `all_to_all_vdev`")
        sync = r.value("us", collective="barrier", algorithm="signal")
        barrier = r.value("us", collective="barrier", algorithm="barrier_all_on_stream")
        s.add(f"{key}_barriers", f"our `sync_all` {us(sync)} us, `nvshmemx_barrier_all_on_stream` {us(barrier)} us")
        for collective in COLLECTIVES:
            s.add(f"{key}_plot_{collective}", book.figure(
                MANIFEST[key]["plots"].format(collective),
                f"{COLL_LABEL[collective]} time per call against size, every algorithm and peer, {r.device}",
                f"{COLL_LABEL[collective]}: {r.device}, {r.date} (`{MANIFEST[key]['plots'].format(collective)}`)."))

        # NVSHMEM's own team collectives: measured rows, or a plain statement that there are none.
        if c.has_nvshmem():
            rows = []
            room = reduce_scatter_room(Path(r.path).read_text())
            for size in TABLE_SIZES:
                cells = [size_label(size)]
                for collective in COLLECTIVES:
                    nv = c.us(collective, size, "nvshmem")
                    ours, _ = c.ours(collective, size)
                    if collective == "reduce_scatter" and size > room:
                        nv_cell = "x"
                    else:
                        nv_cell = us(nv) if nv is not None else "-"
                    cells.append(f"{us(ours)} / {nv_cell}")
                rows.append(cells)
            setting = next((line for line in r.comments if line.startswith("nvshmem peer:")), "")
            timed_to = re.search(r"timed up to (\d+ MiB)", setting)
            cap = f"; -: not timed, NVSHMEM's rows stop at {timed_to.group(1)}" if timed_to else ""
            claim("NVSHMEM_DISABLE_NCCL=1" in setting, "ch04-measuring.md",
                  "NVSHMEM's row was timed with NVSHMEM_DISABLE_NCCL=1 (its CSV header says so)")
            s.add(f"{key}_nvshmem", table(["size"] + [f"{COLL_LABEL[x]}: ours / NVSHMEM" for x in COLLECTIVES], ["r"] * 6, rows)
                  + f"\n\n*NVSHMEM's team collectives on the stream over the world team, NVSHMEM_DISABLE_NCCL=1; "
                  f"time per call in us{cap}; x: a reduce-scatter past half of NVSHMEM's reduction scratch "
                  f"({room >> 10} KiB), which it does not split: not a valid call. `{r.path}`: {r.device}, {r.date}.*")
        else:
            s.add(f"{key}_nvshmem", f"*Not measured yet at N = {c.n}: `{r.path}` ({r.device}, {r.date}) has no "
                  "`nvshmem` rows. `benchmarks/run_coll.sh` records them (`ch04-coll-bench --nvshmem`, with "
                  "NVSHMEM_DISABLE_NCCL=1) from its next run on.*")

    # What the numbers teach (N = 2 and N = 4).
    def ratios(c: Coll, collectives: Sequence[str], sizes: Sequence[int], against: str) -> List[float]:
        out = []
        for collective in collectives:
            for size in sizes:
                ours, _ = c.ours(collective, size)
                peer = c.us(collective, size, "nccl") if against == "nccl" else c.best_peer(collective, size)[0]
                out.append(ours / peer)
        return out

    n2, n4 = runs["coll_n2"], runs["coll_n4"]
    small = [z for z in n2.sizes() if z <= 256 * KIB]
    s.add("small_vs_nccl", " and ".join(
        f"{xspan([1 / x for x in ratios(c, COLLECTIVES, small, 'nccl')], 1)} at N = {c.n}" for c in (n2, n4)))
    s.add("small_us", " and ".join(
        f"{span([c.ours(x, z)[0] for x in COLLECTIVES for z in small], lambda v: us(v))} us at N = {c.n}" for c in (n2, n4)))
    claim(all(r < 1 for c in (n2, n4) for r in ratios(c, COLLECTIVES, small, "best")), "ch04-measuring.md",
          "up to 256 KiB ours beats the best peer for every collective")
    s.add("sync_all_n2", f"{us(n2.r.value('us', collective='barrier', algorithm='signal'))} us")
    s.add("one_shot_1k_n2", f"{us(n2.ours('all_gather', KIB)[0])} us")

    def busbw(c: Coll, collective: str, size: int, method: str, algorithm: Optional[str] = None) -> float:
        rows = [r for r in c.r.select(collective=collective, num_bytes=size, method=method)
                if algorithm is None or r["algorithm"] == algorithm]
        return max(float(r["busbw_gb_per_s"]) for r in rows)

    top = 256 * MIB
    parts = []
    for c in (n2, n4):
        for collective in ("all_gather", "reduce_scatter"):
            _, algorithm = c.ours(collective, top)
            parts.append(f"{COLL_LABEL[collective]} at N = {c.n}: {gbs(busbw(c, collective, top, 'ours', algorithm))} "
                         f"against NCCL's {gbs(busbw(c, collective, top, 'nccl'))}")
    s.add("busbw_top", "; ".join(parts))

    # Where the size table runs our two-shot, the same algorithm as torch's: from 1 MiB to the
    # table's last two-shot size.
    two_shot_up_to = max(up_to for c, up_to, a in table_rows if c == "all_reduce" and a == "two_shot")
    mid = [z for z in n2.sizes() if MIB <= z <= two_shot_up_to]
    s.add("two_shot_range", f"from {size_label(mid[0])} to {size_label(mid[-1])}")
    torch2 = []
    for c in (n2, n4):
        for z in mid:
            t = c.us("all_reduce", z, "torch_symm", "two_shot")
            ours = c.us("all_reduce", z, "ours", "two_shot")
            if t is not None and ours is not None:
                torch2.append((c.n, ours / t))
    s.add("allreduce_vs_torch", " and ".join(
        f"{xspan([x for n, x in torch2 if n == c.n], 2)} at N = {c.n}" for c in (n2, n4) if any(n == c.n for n, _ in torch2)))

    # Where we are slower than the best peer, every such cell: the honest list.
    slower = []
    for c in (n2, n4):
        for collective in COLLECTIVES:
            for size in c.sizes():
                ours, _ = c.ours(collective, size)
                peer, label = c.best_peer(collective, size)
                if ours > peer * 1.005:
                    slower.append((c.n, collective, size, ours / peer, label))
    claim(bool(slower), "introduction.md and ch04-measuring.md", "some size of some collective is slower than its "
          "best peer (both pages name where, from the slower_where and slower_summary snippets)")
    claim(any(col == "broadcast" for _, col, _, _, _ in slower)
          and all(n > 2 for n, col, _, _, _ in slower if col == "broadcast"), "ch04-measuring.md",
          "the broadcast misses, and only where it has forwarders (N > 2): the page's reading of the broadcast")
    closest = {(c.n, z): c.best_peer("all_reduce", z)[1] for c in (n2, n4) for z in small}
    claim(all("torch" in label or "NVSHMEM" in label for label in closest.values())
          and sum("torch" in label for label in closest.values()) > len(closest) / 2, "ch04-measuring.md",
          "torch's symmetric-memory kernels are the closest peer for most small all-reduces, NVSHMEM's for the rest")
    nv_best = [f"{size_label(z)} at N = {n}" for (n, z), label in sorted(closest.items()) if "NVSHMEM" in label]
    s.add("small_allreduce_closest",
          "torch's symmetric-memory kernels, which handshake before they move data, are the closest peer for "
          "all-reduce" + (f" (NVSHMEM's own team all-reduce at {', '.join(nv_best)})" if nv_best else ""))
    lines = [f"- {COLL_LABEL[col]} at N = {n}, {size_label(z)}: {ratio(x)} the time of {label}"
             for n, col, z, x, label in slower]
    s.add("slower", "\n".join(lines))
    s.add("slower_where", slower_where(runs, slower, False))
    s.add("slower_summary", slower_where(runs, slower, True))

    # Chapter 3's sweep, quoted for the round-robin pieces.
    sweep, p2p = book.result("p2p", "sweep"), book.result("p2p")
    def best_blocks(blocks: int) -> float:
        return max(float(r["gb_per_s"]) for r in sweep.select(method="store_put", num_blocks=blocks, num_bytes=top))
    s.add("slices_132", gbs(best_blocks(132)))
    s.add("slices_528", gbs(best_blocks(528)))
    s.add("p2p_run", f"{p2p.device}, {p2p.date}")
    claim(best_blocks(528) > best_blocks(132), "ch04-collectives.md", "528 slices beat 132 at 256 MiB")
    s.add("broadcast_units", broadcast_units(book))
    book.write(s)


def broadcast_units(book: Book) -> str:
    """The 4-warp units (V) against the block pipeline (A) at N = 4: the sentence of
    ch04-collectives.md that says where choose takes them, from the A/B of record."""
    r = book.result("broadcast_units")

    def median_us(variant: str, size: int) -> float:
        times = [float(row["us"]) for row in r.select(variant=variant, n_pes="4", algorithm="scatter_gather",
                                                      num_bytes=str(size))]
        if not times:
            raise GenError(f"{r.path}: no {variant} scatter_gather row at {size} B")
        return statistics.median(times)

    def change(size: int) -> float:
        return median_us("V", size) / median_us("A", size) - 1

    gains = [change(z) for z in (4 * MIB, 16 * MIB)]
    loss = change(1 * MIB)
    claim(all(g < 0 for g in gains) and loss > 0, "ch04-collectives.md",
          "the units are faster at 4 and 16 MiB and slower at 1 MiB")
    return (f"{-max(gains) * 100:.0f}-{-min(gains) * 100:.0f}% faster at 4 and 16 MiB and "
            f"{loss * 100:.0f}% slower at 1 MiB ({r.device}, {r.date}, `{r.path}`)")
