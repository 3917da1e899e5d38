"""Chapter 6 (book/src/ch06-overlap.md) and the MoE-layer page (book/src/moe-layer.md): the
overlap benchmarks' tables and the sentences that quote them, for scripts/gen_book.py."""

from __future__ import annotations

from typing import Dict, List

from .common import Book, claim, GenError, MANIFEST, ratio, Result, Snippets, table, us

# ---- chapter 6: all-gather + GEMM and GEMM + reduce-scatter -----------------------------------
#
# ch06-overlap-bench (Rust, MANIFEST "overlap_n2" csv) and scripts/ch06_overlap.py --bench
# (Python with NCCL and torch's fused op, "python"), one device call.


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


class Bench:
    """The Rust benchmark's rows: `variant`, `chunks`, `gemm_sms` (0: every SM) -> us."""

    def __init__(self, r: Result):
        self.r = r

    def us(self, variant: str, chunks: int = 1, gemm_sms: int = 0) -> float:
        return self.r.value("us", variant=variant, chunks=chunks, gemm_sms=gemm_sms)

    def chunk_counts(self, variant: str) -> List[int]:
        return sorted({int(x["chunks"]) for x in self.r.select(variant=variant, gemm_sms=0)})

    def sm_targets(self, variant: str) -> List[int]:
        return sorted({int(x["gemm_sms"]) for x in self.r.select(variant=variant, chunks=1)},
                      key=lambda v: (v != 0, -v))


def gen_ch06(book: Book) -> None:
    s = Snippets("ch06")
    rust = Bench(book.result("overlap_n2"))
    py = book.result("overlap_n2", "python")
    r = rust.r
    sms = int(max(rust.sm_targets("ag_overlapped"))) + 8  # the largest target leaves 8 free

    # All-gather + GEMM: one GEMM, the communication, serial, and per chunk count the split
    # GEMMs alone and overlapped.
    compute, comm, serial = rust.us("ag_compute"), rust.us("ag_communicate"), rust.us("ag_serial")
    bound = (comm + compute) / max(comm, compute)
    rows = [["the GEMM alone, all rows at once", "", us(compute), ""],
            ["the all-gather alone (puts and signals)", "", us(comm), ""],
            ["serial: chapter 4's all-gather, then the GEMM", "", us(serial), "1.00x"]]
    for chunks in rust.chunk_counts("ag_overlapped"):
        split = rust.us("ag_compute_split", chunks)
        over = rust.us("ag_overlapped", chunks)
        eff = (serial - over) / min(comm, compute)
        rows.append([f"the overlapped call's GEMMs alone, {chunks} chunk(s) per shard", str(chunks), us(split), ""])
        rows.append([f"overlapped, {chunks} chunk(s) per shard", str(chunks), us(over),
                     f"{ratio(serial / over)} (efficiency {_pct(eff)})"])
    s.add("ag_table", table(["all-gather + GEMM", "chunks", "us per call", "serial / this"],
                            ["l", "r", "r", "r"], rows)
          + f"\n\n*Bound (communication + compute) / max(both): {ratio(bound)}. {rust.r.provenance()}; "
          f"`{r.path}`.*")
    split1, over1 = rust.us("ag_compute_split", 1), rust.us("ag_overlapped", 1)
    s.add("ag_bound", ratio(bound))
    s.add("ag_comm", f"{us(comm)} us against the GEMM's {us(compute)} us")
    s.add("ag_split_cost", f"{us(split1 - compute)} us")
    s.add("ag_hidden", f"{us(over1 - split1)} us above its GEMMs alone, against {us(comm)} us of communication")
    s.add("ag_vs_serial", ratio(serial / min(rust.us("ag_overlapped", c) for c in rust.chunk_counts("ag_overlapped"))))
    claim(split1 > compute, "ch06-overlap.md", "splitting the GEMM costs time by itself")
    claim(over1 - split1 < comm, "ch06-overlap.md", "the overlapped call hides part of the all-gather")
    splits = [rust.us("ag_compute_split", c) for c in rust.chunk_counts("ag_overlapped")]
    claim(all(a <= b * 1.01 for a, b in zip(splits, splits[1:])), "ch06-overlap.md",
          "more chunks make the split GEMMs slower")

    # GEMM + reduce-scatter.
    rs_compute, rs_serial = rust.us("rs_compute"), rust.us("rs_serial")
    rs_comm = rs_serial - rs_compute
    rows = [["the GEMM alone", "", us(rs_compute), ""],
            ["serial: the GEMM, then chapter 4's reduce-scatter", "", us(rs_serial), "1.00x"]]
    for chunks in rust.chunk_counts("rs_overlapped"):
        if r.select(variant="rs_compute_split", chunks=chunks, gemm_sms=0):  # when the run timed them
            rows.append([f"the overlapped call's GEMMs alone, {chunks} chunk(s) per peer", str(chunks),
                         us(rust.us("rs_compute_split", chunks)), ""])
        over = rust.us("rs_overlapped", chunks)
        eff = (rs_serial - over) / min(rs_comm, rs_compute)
        rows.append([f"overlapped, {chunks} chunk(s) per peer", str(chunks), us(over),
                     f"{ratio(rs_serial / over)} (efficiency {_pct(eff)})"])
    s.add("rs_table", table(["GEMM + reduce-scatter", "chunks", "us per call", "serial / this"],
                            ["l", "r", "r", "r"], rows)
          + f"\n\n*Communication = serial - GEMM = {us(rs_comm)} us; bound "
          f"{ratio((rs_comm + rs_compute) / max(rs_comm, rs_compute))}. {r.provenance()}; `{r.path}`.*")

    # The SM budget: the GEMMs' SM target against the overlapped call's time.
    cells = []
    for target in rust.sm_targets("ag_overlapped"):
        label = "every SM" if target == 0 else f"{target} SMs ({sms - target} left free)"
        cells.append([label, us(rust.us("ag_overlapped", 1, target)), us(rust.us("rs_overlapped", 1, target))])
    s.add("sm_table", table(["GEMM SM target (cublasSetSmCountTarget)", "all-gather + GEMM, us",
                             "GEMM + reduce-scatter, us"], ["l", "r", "r"], cells)
          + f"\n\n*One chunk per shard. {r.provenance()}; `{r.path}`.*")
    for variant in ("ag_overlapped", "rs_overlapped"):
        full = rust.us(variant, 1, 0)
        claim(all(rust.us(variant, 1, t) > full for t in rust.sm_targets(variant) if t), "ch06-overlap.md",
              "every SM taken from the GEMMs makes the overlapped call slower")

    # Python against NCCL serial and torch's fused op.
    def py_us(method: str) -> float:
        return py.value("us", method=method)
    ours = {m["method"]: float(m["us"]) for m in py.rows if m["method"].startswith("ours_overlapped_")}
    if not ours:
        raise GenError(f"{py.path}: no ours_overlapped rows")
    best_method = min(ours, key=ours.get)
    best = ours[best_method]
    fused, nccl = py_us("torch_fused"), py_us("nccl_serial")
    nccl_comm, py_compute = py_us("nccl_communicate"), py_us("compute")
    rows = [["torch.matmul alone", us(py_compute), "", ""],
            ["NCCL all_gather_into_tensor alone", us(nccl_comm), "", ""],
            ["NCCL all-gather, then torch.matmul", us(nccl), "1.00x", ratio(fused / nccl)],
            ["torch fused_all_gather_matmul", us(fused), ratio(nccl / fused), "1.00x"]]

    def label(method: str) -> str:  # ours_overlapped_<chunks>[_side]
        chunks, side = method.split("_")[2], method.endswith("_side")
        return f"ours, {chunks} chunk(s) per shard" + (", peers' GEMMs on a side stream" if side else "")
    for method in sorted(ours, key=lambda m: (m.endswith("_side"), int(m.split("_")[2]))):
        rows.append([label(method), us(ours[method]), ratio(nccl / ours[method]), ratio(fused / ours[method])])
    turns = {m["method"].removeprefix("interleaved_"): float(m["us"]) for m in py.rows
             if m["method"].startswith("interleaved_")}
    for method in turns:
        if method.startswith("ours_overlapped_") or method in ("nccl_serial", "torch_fused"):
            name = label(method) if method.startswith("ours") else method.replace("_", " ")
            rows.append([f"in turn: {name}", us(turns[method]), ratio(turns["nccl_serial"] / turns[method]),
                         ratio(turns["torch_fused"] / turns[method])])
    s.add("py_table", table(["all-gather + GEMM from PyTorch", "us per call", "NCCL serial / this",
                             "torch fused / this"], ["l", "r", "r", "r"], rows)
          + f"\n\n*\"In turn\": the GEMM alone, NCCL serial, torch's fused op and ours timed one after the "
          f"other, five rounds, median per method: a GPU clocks down under sustained GEMMs, so rows timed "
          f"one block after the other are not timed alike. {py.provenance()}; `{py.path}`.*")
    if turns:
        tours = min((m for m in turns if m.startswith("ours_overlapped_")), key=turns.get)
        s.add("py_in_turn", f"{ratio(turns[tours] / turns['torch_fused'])} the time of torch's fused op "
              f"({label(tours)}; medians of five rounds in turn)")
        claim(turns[tours] < turns["torch_fused"], "ch06-overlap.md",
              "timed in turn, ours is faster than torch's fused op")
    s.add("py_plot", book.figure(
        MANIFEST["overlap_n2"]["plot"], "Time per call of each all-gather + GEMM method from PyTorch",
        f"`{MANIFEST['overlap_n2']['plot']}`, drawn by `benchmarks/plot_overlap.py` from `{py.path}`: "
        f"{py.device}, {py.date}."))
    s.add("timeline", book.figure(
        MANIFEST["overlap_n2"]["timeline"],
        "Timeline of one overlapped all-gather + GEMM call on rank 0: the put on the communication "
        "stream runs under our own rows' GEMM",
        f"`{MANIFEST['overlap_n2']['timeline']}`: torch.profiler on rank 0, one call of "
        f"`scripts/ch06_overlap.py --timeline` drawn by `benchmarks/plot_timeline.py`; {py.device}, {py.date}."))
    s.add("py_vs_nccl", f"{ratio(nccl / best)} the speed of NCCL's serial path "
          f"(efficiency {_pct((nccl - best) / min(nccl_comm, py_compute))} of NCCL's all-gather hidden)")
    s.add("py_vs_torch", ratio(best / fused))
    s.add("py_comm", f"{us(nccl_comm)} us for NCCL's all-gather, {us(py_us('ours_communicate'))} us for ours")
    claim(py_us("ours_communicate") < nccl_comm, "ch06-overlap.md", "our all-gather alone is faster than NCCL's")
    s.add("run", f"{r.provenance()}")
    book.write(s)


# ---- the MoE layer: scripts/moe_layer.py --bench -------------------------------------------------


def gen_moe(book: Book) -> None:
    s = Snippets("moe")
    r = book.result("moe_n2")
    ms: Dict[tuple, float] = {(x["case"], x["quantity"]): float(x["ms"]) for x in r.rows}

    def get(case: str, quantity: str) -> float:
        if (case, quantity) not in ms:
            raise GenError(f"{r.path}: no row ({case}, {quantity})")
        return ms[(case, quantity)]

    rows = []
    for what in ("bf16", "fp8"):
        layer, comm = get(f"{what} layer", "layer_ms"), get(f"{what} layer", "comm_ms")
        rows.append([f"{what} dispatch", f"{layer:.2f}", f"{comm:.2f}", f"{100 * comm / layer:.0f}%"])
    s.add("layer_table", table(["forward + backward, 4096 tokens per rank", "ms per layer",
                                "dispatch + combine, both directions, ms", "share"], ["l", "r", "r", "r"], rows)
          + f"\n\n*DeepSeek-V3 shapes (hidden 7168, 256 experts, top-8, expert FFN 2048), experts as grouped "
          f"GEMMs. {r.provenance()}; `{r.path}`.*")
    rows, lines = [], []
    for case in sorted({c for c, q in ms if q == "serial_ms"}):
        serial, over, compute = get(case, "serial_ms"), get(case, "overlapped_ms"), get(case, "compute_ms")
        comm = serial - compute
        bound = (comm + compute) / max(comm, compute) if comm > 0 else 1.0
        eff = f"{100 * (serial - over) / min(comm, compute):.0f}%" if comm > 0.01 * serial else "-"
        rows.append([case, f"{serial:.2f}", f"{over:.2f}", f"{compute:.2f}", ratio(serial / over), ratio(bound), eff])
        lines.append((case, comm, serial))
    s.add("overlap_table", table(["two micro-batches", "serial, ms", "overlapped, ms", "experts alone, ms",
                                  "serial / overlapped", "bound", "efficiency"], ["l"] + ["r"] * 6, rows)
          + "\n\n*Bound: (communication + experts) / max(both), communication = serial - experts alone; "
          "efficiency: (serial - overlapped) / min(both); \"-\" where the communication is within 1% of the "
          f"serial time. {r.provenance()}; `{r.path}`.*")
    share = get("bf16 layer", "comm_ms") / get("bf16 layer", "layer_ms")
    s.add("comm_share", f"{100 * share:.0f}%")
    claim(share < 0.1, "moe-layer.md", "on two NVLink GPUs the exchanges are under a tenth of the layer")
    s.add("timeline", book.figure(
        MANIFEST["moe_n2"]["timeline"],
        "Timeline of the MoE layer's forward on two micro-batches, overlapped, rank 0",
        f"`{MANIFEST['moe_n2']['timeline']}`: torch.profiler on rank 0, `scripts/moe_layer.py --timeline` "
        f"drawn by `benchmarks/plot_timeline.py`; {r.device}, {r.date}."))
    s.add("run", r.provenance())
    book.write(s)
