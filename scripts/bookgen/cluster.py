"""Appendix A's cost model and decision guide (book/src/appendix-cluster-model.md), for
scripts/gen_book.py."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

from .collectives import COLL_LABEL, PUTS, Coll, size_table
from .common import Book, claim, gbs, GenError, load_module, MANIFEST, MIB, ROOT, size_label, Snippets, table, us, xspan

# ---- Appendix A: running on a cluster (the cost model) -------------------------------------------
#
# benchmarks/cluster_model.py predicts chapter 5's collectives on nodes of 8 GPUs joined by
# InfiniBand from NVLink figures measured here (the results of record above) and published or
# assumed InfiniBand figures. This section writes its tables and plot (generated/cluster.md,
# generated/cluster_model.svg), and the measured crossovers of chapters 3 and 4 the appendix's
# decision guide quotes. Every table says which figures are predictions.

CLUSTER_MODEL = "benchmarks/cluster_model.py"


def measured_changes(sizes: Sequence[int], first_wins: Callable[[int], bool], first: str, second: str) -> str:
    """'ours at every size measured', or 'ours; NCCL from 16 MiB' over the measured sizes."""
    parts, winner = [], None
    for z in sizes:
        now = first if first_wins(z) else second
        if now != winner:
            parts.append(now if winner is None else f"{now} from {size_label(z)}")
            winner = now
    return f"{parts[0]} at every size measured" if len(parts) == 1 else "; ".join(parts)


def gen_cluster(book: Book) -> None:
    cm = load_module(CLUSTER_MODEL)
    s = Snippets("cluster", "benchmarks/cluster_model.py and the results of record (its MANIFEST)")
    p2p, coll = book.result("p2p"), book.result("coll_n4")
    for key, path in (("p2p", cm.P2P_CSV), ("coll_n4", cm.COLL_CSV)):
        if MANIFEST[key]["csv"] != path:
            raise GenError(f"{CLUSTER_MODEL} reads {path}, the book's {key} is {MANIFEST[key]['csv']}: make them agree")
    inputs = cm.measured(p2p.rows, coll.rows)
    serial, overlapped = cm.params(inputs), cm.params(inputs, overlap=True)
    g = cm.GPUS_PER_NODE

    # The inputs: what was measured, what is published, what is assumed.
    rows = [
        ["Step time: one kernel of a plan, in a graph, entering and leaving a call",
         f"{us(inputs['step_us'], 2)} us", f"measured: chapter 4's `sync_all`, `{coll.path}` ({coll.provenance()})"],
        ["NVLink latency: one put-with-signal, one way",
         f"{us(inputs['nvl_alpha_us'], 2)} us", f"measured: chapter 3's 8-byte ping-pong, `{p2p.path}` ({p2p.provenance()})"],
        ["NVLink bandwidth out of one GPU",
         f"{gbs(inputs['nvl_gbs'])} GB/s",
         f"measured: chapter 3's best put at {size_label(int(inputs['nvl_top_bytes']))}, `{p2p.path}` ({p2p.provenance()})"],
    ]
    for value, unit, what, sources in cm.PUBLISHED.values():
        cited = "; ".join(f"[{text}]({url})" for text, url in sources)
        rows.append([what, f"{value:g} {unit}", f"published: {cited}"])
    for value, unit, what in cm.ASSUMED.values():
        rows.append([what, f"{value:g} {unit}",
                     "assumed (\"a few microseconds per message\"): no published figure for a GPU-initiated "
                     "put-with-signal over ConnectX-7 was found; the sensitivity table halves and doubles it"])
    s.add("inputs_table", table(["input", "value", "where it comes from"], ["l", "r", "l"], rows))
    s.add("step_us", f"{us(inputs['step_us'], 2)} us")
    s.add("nvl_alpha", f"{us(inputs['nvl_alpha_us'], 2)} us")
    s.add("nvl_gbs", f"{gbs(inputs['nvl_gbs'])} GB/s")
    s.add("ib_gbs", f"{cm.PUBLISHED['ib_gbs'][0]:g} GB/s")
    s.add("ib_alpha", f"{cm.ASSUMED['ib_alpha_us'][0]:g} us")
    s.add("measured_on", f"{p2p.device} ({p2p.date}) and {coll.device} ({coll.date})")

    # Predicted times and crossovers.
    caption = (f"*Predicted by `{CLUSTER_MODEL}`, not measured: microseconds per call, flat / hierarchical, "
               f"serial bound ({cm.ASSUMED['ib_alpha_us'][0]:g} us per InfiniBand message), sizes as nccl-tests "
               f"counts them. NVLink inputs from `{p2p.path}` and `{coll.path}`.*")
    for c in cm.COLLECTIVES:
        s.add(f"times_{c}", cm.times_table(c, serial) + "\n\n" + caption)
    lo, hi = cm.SEARCH_RANGE
    s.add("crossover_table", cm.crossover_table(inputs) + "\n\n" +
          f"*Predicted by `{CLUSTER_MODEL}`, not measured: which method takes less time, from "
          f"{size_label(lo)} to {size_label(hi)}, and the sizes where that changes; nodes of {g} GPUs, "
          f"{cm.ASSUMED['ib_alpha_us'][0]:g} us per InfiniBand message.*")
    s.add("sensitivity_table", cm.sensitivity_table(inputs) + "\n\n" +
          f"*Predicted by `{CLUSTER_MODEL}`: crossovers at 2 and {cm.NODE_COUNTS[-1]} nodes with the InfiniBand "
          "latency halved and doubled; rows whose answer does not change are left out.*")
    svg_name = "cluster_model.svg"
    book.files[svg_name] = cm.svg(inputs).encode()
    s.add("plot", f"![Predicted time per call against size for the five collectives, flat and hierarchical, at 2 and "
          f"{cm.PLOT_NODES[-1][0]} nodes of {g} GPUs](generated/{svg_name})\n\n"
          f"*Predicted by `{CLUSTER_MODEL}`, not measured: dashed flat, solid hierarchical, serial bound.*")

    # The sentences of the appendix that the model decides.
    def xo(coll_name: str, nodes: int, p) -> Tuple[str, list]:
        return cm.crossovers(coll_name, nodes, g, p)

    reducing = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    claim(all(xo(c, n, serial) == ("hierarchical", []) for c in reducing for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "under the serial bound the hierarchical all-reduce, all-gather, "
          "reduce-scatter and broadcast win at every size")
    claim(all(xo(c, n, overlapped)[0] == "flat" and [m for _, m in xo(c, n, overlapped)[1]] == ["hierarchical"]
              for c in reducing for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "under the overlapped bound flat wins small sizes, hierarchical large ones")
    a2a = [xo("all_to_all", n, serial) for n in cm.NODE_COUNTS]
    claim(all(first == "hierarchical" and [m for _, m in ch] == ["flat"] for first, ch in a2a)
          and all(a[1][0][0] < b[1][0][0] for a, b in zip(a2a, a2a[1:])),
          "appendix-cluster-model.md", "all-to-all: hierarchical below a crossover that grows with the node count, flat above")
    claim(all(xo("all_to_all", n, overlapped) == ("flat", []) for n in cm.NODE_COUNTS),
          "appendix-cluster-model.md", "all-to-all under the overlapped bound: flat at every size")
    s.add("a2a_flat_from", " and ".join(
        f"{cm.size_text(ch[0][0])} at {n} nodes" for n, (_, ch) in zip(cm.NODE_COUNTS, a2a) if n in (2, 16)))
    over = [xo("all_reduce", n, overlapped)[1][0][0] for n in cm.NODE_COUNTS]
    s.add("all_reduce_overlap_from", f"{cm.size_text(over[0])} at 2 nodes to {cm.size_text(over[-1])} at "
          f"{cm.NODE_COUNTS[-1]}")
    big = 256 * MIB
    ratios = [cm.flat_us("all_reduce", n, g, big, serial) / cm.hier_us("all_reduce", n, g, big, serial)
              for n in cm.NODE_COUNTS]
    s.add("all_reduce_big_ratio", xspan(ratios, 1))
    s.add("big_size", size_label(big))

    # Measured crossovers inside one node, for the decision guide: chapter 4 (ours or NCCL)
    # and chapter 3 (kernel puts or the copy engine).
    runs = [Coll(book.result(key), size_table()) for key in ("coll_n2", "coll_n4")]
    rows = []
    for c in cm.COLLECTIVES:
        cells = [COLL_LABEL[c]]
        for run in runs:
            cells.append(measured_changes(run.sizes(), lambda z, run=run: run.ours(c, z)[0] <= 1.005 * run.us(c, z, "nccl"),
                                          "ours", "NCCL"))
        rows.append(cells)
    s.add("node_table", table(["collective"] + [f"N = {run.n}" for run in runs], ["l"] * (1 + len(runs)), rows) +
          f"\n\n*Measured, one node, {size_label(runs[0].sizes()[0])} to {size_label(runs[0].sizes()[-1])}: the "
          "faster of ours (chapter 4's size table) and NCCL, CUDA-graph replay, ours counted faster within 0.5%. " + "; ".join(f"`{run.r.path}`: {run.r.provenance()}" for run in runs) + ".*")
    sizes = sorted({int(r["num_bytes"]) for r in p2p.select(method="copy_engine")})
    best_put = {z: max(p2p.value("gb_per_s", method=m, num_bytes=z) for m in PUTS) for z in sizes}
    s.add("copy_engine_vs_put", measured_changes(
        sizes, lambda z: p2p.value("gb_per_s", method="copy_engine", num_bytes=z) >= best_put[z],
        "the copy engine", "a kernel put"))
    s.add("p2p_sizes", f"{size_label(sizes[0])} to {size_label(sizes[-1])}")
    book.write(s)
