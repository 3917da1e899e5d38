"""Chapter 6 (book/src/ch06-overlap.md) and the MoE-layer page (book/src/moe-layer.md): the
overlap benchmarks' tables and the sentences that quote them, at N = 2 and N = 4 side by side,
for scripts/gen_book.py."""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from .common import Book, claim, GenError, MANIFEST, ratio, Result, Snippets, table, us

# The GPU counts both pages show, each a MANIFEST entry: "overlap_n<N>" and "moe_n<N>".
NS = (2, 4)


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _check_n(r: Result, column: str, n: int) -> None:
    found = {x[column] for x in r.rows}
    if found != {str(n)}:
        raise GenError(f"{r.path}: expected {column} = {n} on every row (its MANIFEST entry), found {sorted(found)}")


def _sources(results: Dict[int, Result]) -> str:
    """'N = 2: 2x ..., date, `path`; N = 4: ...' for a caption."""
    return "; ".join(f"N = {n}: {r.provenance()}, `{r.path}`" for n, r in results.items())


# ---- chapter 6: all-gather + GEMM and GEMM + reduce-scatter -----------------------------------
#
# ch06-overlap-bench (Rust, MANIFEST "overlap_n<N>" csv) and scripts/ch06_overlap.py --bench
# (Python with NCCL and torch's fused op, "python"), one device call per N.


class Bench:
    """The Rust benchmark's rows: `variant`, `chunks`, `gemm_sms` (0: every SM) -> us."""

    def __init__(self, r: Result, n: int):
        _check_n(r, "n_pes", n)
        self.r, self.n = r, n

    def has(self, variant: str, chunks: int = 1, gemm_sms: int = 0) -> bool:
        return bool(self.r.select(variant=variant, chunks=chunks, gemm_sms=gemm_sms))

    def us(self, variant: str, chunks: int = 1, gemm_sms: int = 0) -> float:
        return self.r.value("us", variant=variant, chunks=chunks, gemm_sms=gemm_sms)

    def chunk_counts(self, variant: str) -> List[int]:
        return sorted({int(x["chunks"]) for x in self.r.select(variant=variant, gemm_sms=0)})

    def sm_targets(self, variant: str) -> List[int]:
        return sorted({int(x["gemm_sms"]) for x in self.r.select(variant=variant, chunks=1)},
                      key=lambda v: (v != 0, -v))

    def best_overlapped(self, prefix: str) -> float:
        """The fastest overlapped call at every SM, any chunk count, side stream or not."""
        return min(float(x["us"]) for x in self.r.rows
                   if x["variant"].startswith(prefix) and x["gemm_sms"] == "0")


def _same(values: Dict[int, object], what: str) -> object:
    first = next(iter(values.values()))
    if any(v != first for v in values.values()):
        raise GenError(f"chapter 6's runs differ in {what}: {values}; the combined tables need the same")
    return first


def _cells(value: Optional[float], base: Optional[float] = None, eff: Optional[float] = None) -> List[str]:
    """[us, 'serial / this'] for one N's column pair; '-' where the run has no such row."""
    if value is None:
        return ["-", ""]
    if base is None:
        return [us(value), ""]
    text = ratio(base / value)
    return [us(value), text if eff is None else f"{text} (efficiency {_pct(eff)})"]


def gen_ch06(book: Book) -> None:
    s = Snippets("ch06")
    rust = {n: Bench(book.result(f"overlap_n{n}"), n) for n in NS}
    py = {n: book.result(f"overlap_n{n}", "python") for n in NS}
    for n, r in py.items():
        _check_n(r, "n_pes", n)
    rusts = {n: b.r for n, b in rust.items()}
    page = "ch06-overlap.md"
    chunks = _same({n: b.chunk_counts("ag_overlapped") for n, b in rust.items()}, "chunk counts")
    targets = _same({n: b.sm_targets("ag_overlapped") for n, b in rust.items()}, "SM targets")
    sms = int(max(targets)) + 8  # the largest target leaves 8 free
    header = ["{}"] + [h for n in NS for h in (f"N = {n}, us", "serial / this")]

    # All-gather + GEMM: one GEMM, the communication, serial, and per chunk count the split
    # GEMMs alone and overlapped.
    ag: Dict[int, Dict[str, float]] = {}
    for n, b in rust.items():
        compute, comm, serial = b.us("ag_compute"), b.us("ag_communicate"), b.us("ag_serial")
        ag[n] = {"compute": compute, "comm": comm, "serial": serial,
                 "bound": (comm + compute) / max(comm, compute)}
    rows = [["the GEMM alone, all rows at once"] + [c for n in NS for c in _cells(ag[n]["compute"])],
            ["the all-gather alone (puts and signals)"] + [c for n in NS for c in _cells(ag[n]["comm"])],
            ["serial: chapter 4's all-gather, then the GEMM"]
            + [c for n in NS for c in _cells(ag[n]["serial"], ag[n]["serial"])]]
    for c in chunks:
        rows.append([f"the overlapped call's GEMMs alone, {c} chunk(s) per shard"]
                    + [x for n in NS for x in _cells(rust[n].us("ag_compute_split", c))])
        cells = []
        for n in NS:
            over, a = rust[n].us("ag_overlapped", c), ag[n]
            cells += _cells(over, a["serial"], (a["serial"] - over) / min(a["comm"], a["compute"]))
        rows.append([f"overlapped, {c} chunk(s) per shard"] + cells)
    bounds = ", ".join(f"{ratio(ag[n]['bound'])} at N = {n}" for n in NS)
    s.add("ag_table", table([header[0].format("all-gather + GEMM")] + header[1:], ["l"] + ["r"] * 4, rows)
          + f"\n\n*Bound (communication + compute) / max(both): {bounds}. {_sources(rusts)}.*")

    for n, b in rust.items():
        a = ag[n]
        split1, over1 = b.us("ag_compute_split", 1), b.us("ag_overlapped", 1)
        best = min(b.us("ag_overlapped", c) for c in chunks)
        s.add(f"ag_bound_n{n}", ratio(a["bound"]))
        s.add(f"ag_comm_n{n}", f"{us(a['comm'])} us against the GEMM's {us(a['compute'])} us")
        s.add(f"ag_split_cost_n{n}", f"{us(split1 - a['compute'])} us")
        s.add(f"ag_hidden_n{n}", f"{us(over1 - split1)} us above its GEMMs alone, against {us(a['comm'])} us "
              "of communication")
        s.add(f"ag_vs_serial_n{n}", ratio(a["serial"] / best))
        s.add(f"ag_serial_comm_n{n}", f"{us(a['serial'] - a['compute'])} us")
        s.add(f"ag_puts_n{n}", f"{us(a['comm'])} us")
        claim(split1 > a["compute"], page, f"at N = {n}, splitting the GEMM costs time by itself")
        claim(over1 - split1 < a["comm"], page, f"at N = {n}, the overlapped call hides part of the all-gather")
        splits = {c: b.us("ag_compute_split", c) for c in chunks}
        claim(max(splits, key=splits.get) == max(chunks), page,
              f"at N = {n}, eight chunks per shard make the dearest split")
        claim(a["comm"] > a["serial"] - a["compute"], page,
              f"at N = {n}, the puts alone are slower than the serial call's all-gather (chapter 4's kernel)")
    claim(ag[4]["bound"] > ag[2]["bound"] and ag[2]["bound"] < 1.2, page,
          "the bound is small on NVLink and grows from N = 2 to N = 4")
    claim(rust[4].us("ag_compute_split", 1) - ag[4]["compute"] > rust[2].us("ag_compute_split", 1) - ag[2]["compute"],
          page, "the split costs more at N = 4 (four GEMMs) than at N = 2 (two)")
    over1, split1 = rust[2].us("ag_overlapped", 1), rust[2].us("ag_compute_split", 1)
    claim(over1 - split1 < ag[2]["comm"] / 2, page, "at N = 2, most of the transfer hides")
    claim(abs(ag[2]["serial"] / min(rust[2].us("ag_overlapped", c) for c in chunks) - 1) < 0.02, page,
          "at N = 2, the split eats what the overlap saved (the best overlapped call level with serial)")
    claim(rust[4].best_overlapped("ag_overlapped") > ag[4]["serial"], page,
          "at N = 4, no overlapped all-gather + GEMM (any chunk count, side stream or not) beats the serial call")

    # GEMM + reduce-scatter.
    rs: Dict[int, Dict[str, float]] = {}
    for n, b in rust.items():
        compute, serial = b.us("rs_compute"), b.us("rs_serial")
        rs[n] = {"compute": compute, "serial": serial, "comm": serial - compute}
    rs_chunks = _same({n: b.chunk_counts("rs_overlapped") for n, b in rust.items()}, "reduce-scatter chunk counts")
    rows = [["the GEMM alone"] + [c for n in NS for c in _cells(rs[n]["compute"])],
            ["serial: the GEMM, then chapter 4's reduce-scatter"]
            + [c for n in NS for c in _cells(rs[n]["serial"], rs[n]["serial"])]]
    for c in rs_chunks:
        if any(b.has("rs_compute_split", c) for b in rust.values()):  # where a run timed them
            rows.append([f"the overlapped call's GEMMs alone, {c} chunk(s) per peer"]
                        + [x for n in NS for x in _cells(rust[n].us("rs_compute_split", c)
                                                         if rust[n].has("rs_compute_split", c) else None)])
        cells = []
        for n in NS:
            over, x = rust[n].us("rs_overlapped", c), rs[n]
            cells += _cells(over, x["serial"], (x["serial"] - over) / min(x["comm"], x["compute"]))
        rows.append([f"overlapped, {c} chunk(s) per peer"] + cells)
    comms = ", ".join(f"{us(rs[n]['comm'])} us at N = {n} (bound "
                      f"{ratio((rs[n]['comm'] + rs[n]['compute']) / max(rs[n]['comm'], rs[n]['compute']))})"
                      for n in NS)
    s.add("rs_table", table([header[0].format("GEMM + reduce-scatter")] + header[1:], ["l"] + ["r"] * 4, rows)
          + f"\n\n*Communication = serial - GEMM: {comms}; \"-\": not timed in that run. {_sources(rusts)}.*")
    effs = {}
    for n, b in rust.items():
        over, x = b.us("rs_overlapped", 1), rs[n]
        effs[n] = (x["serial"] - over) / min(x["comm"], x["compute"])
        s.add(f"rs_gain_n{n}", f"{ratio(x['serial'] / over)} the serial call's speed (efficiency {_pct(effs[n])})")
        s.add(f"rs_comm_n{n}", f"{us(x['comm'])} us")
        claim(over < x["serial"], page, f"at N = {n}, the overlapped GEMM + reduce-scatter beats the serial call")
    claim(effs[4] > effs[2], page, "GEMM + reduce-scatter gains more at N = 4 than at N = 2")
    claim(rs[4]["comm"] > ag[4]["serial"] - ag[4]["compute"], page,
          "at N = 4, the serial call's reduce-scatter costs more than its all-gather")

    # The SM budget: the GEMMs' SM target against the overlapped call's time.
    cells = []
    for target in targets:
        label = "every SM" if target == 0 else f"{target} SMs ({sms - target} left free)"
        cells.append([label] + [us(rust[n].us(v, 1, target)) for n in NS for v in ("ag_overlapped", "rs_overlapped")])
    s.add("sm_table", table(["GEMM SM target (cublasSetSmCountTarget)"]
                            + [f"{what}, N = {n}, us" for n in NS for what in ("all-gather + GEMM", "GEMM + reduce-scatter")],
                            ["l"] + ["r"] * 4, cells)
          + f"\n\n*One chunk per shard. {_sources(rusts)}.*")
    b2, b4 = rust[2], rust[4]
    for variant in ("ag_overlapped", "rs_overlapped"):
        claim(all(b2.us(variant, 1, t) > b2.us(variant, 1, 0) for t in targets if t), page,
              f"at N = 2, every SM taken from the GEMMs makes the overlapped call slower ({variant})")
    claim(all(b4.us("rs_overlapped", 1, t) > b4.us("rs_overlapped", 1, 0) for t in targets if t), page,
          "at N = 4, every SM taken from the GEMMs makes the overlapped GEMM + reduce-scatter slower")
    free8 = sms - 8
    claim(b4.us("ag_overlapped", 1, free8) < b4.us("ag_overlapped", 1, 0), page,
          "at N = 4, the overlapped all-gather + GEMM gains from leaving 8 SMs free")
    claim(b4.us("ag_overlapped", 1, free8) > ag[4]["serial"], page,
          "at N = 4, leaving 8 SMs free does not bring the overlapped all-gather + GEMM under the serial call")
    for n, b in rust.items():
        for variant in ("ag_overlapped", "rs_overlapped"):
            full = b.us(variant, 1, 0)
            claim(all(b.us(variant, 1, t) > 0.9 * full for t in targets), page,
                  f"at N = {n}, the gain from SMs left free, where there is one, is small (under 10%)")
    s.add("sm_gain_n4", f"{us(b4.us('ag_overlapped', 1, free8))} us with {free8} SMs for the GEMMs, "
          f"{us(b4.us('ag_overlapped', 1, 0))} us with every SM, serial {us(ag[4]['serial'])} us")

    _python(book, s, py, rust)
    s.add("timeline", book.figure(
        MANIFEST["overlap_n2"]["timeline"],
        "Timeline of one overlapped all-gather + GEMM call on rank 0: the put on the communication "
        "stream runs under our own rows' GEMM",
        f"`{MANIFEST['overlap_n2']['timeline']}`: torch.profiler on rank 0, one call of "
        f"`scripts/ch06_overlap.py --timeline` drawn by `benchmarks/plot_timeline.py`; {py[2].device}, "
        f"{py[2].date}."))
    for n, b in rust.items():
        s.add(f"run_n{n}", b.r.provenance())
    book.write(s)


def _label(method: str) -> str:  # ours_overlapped_<chunks>[_side]
    chunks, side = method.split("_")[2], method.endswith("_side")
    return f"ours, {chunks} chunk(s) per shard" + (", peers' GEMMs on a side stream" if side else "")


def _python(book: Book, s: Snippets, py: Dict[int, Result], rust: Dict[int, Bench]) -> None:
    """Python against NCCL serial and torch's fused op, each N in its own columns."""
    page = "ch06-overlap.md"
    t: Dict[int, Dict[str, float]] = {n: {x["method"]: float(x["us"]) for x in r.rows} for n, r in py.items()}
    for n, r in py.items():
        for method in ("compute", "nccl_serial", "nccl_communicate", "torch_fused", "ours_communicate"):
            if method not in t[n]:
                raise GenError(f"{r.path}: no {method} row")
        if not any(m.startswith("ours_overlapped_") for m in t[n]):
            raise GenError(f"{r.path}: no ours_overlapped rows")

    def row(label: str, method: str, with_ratios: bool = True, prefix: str = "") -> List[str]:
        cells = [label]
        for n in NS:
            value, turns = t[n].get(prefix + method), prefix
            if value is None:
                cells += ["-", "", ""]
            elif with_ratios:
                cells += [us(value), ratio(t[n][turns + "nccl_serial"] / value), ratio(t[n][turns + "torch_fused"] / value)]
            else:
                cells += [us(value), "", ""]
        return cells

    ours = sorted({m for n in NS for m in t[n] if m.startswith("ours_overlapped_")},
                  key=lambda m: (m.endswith("_side"), int(m.split("_")[2])))
    rows = [row("torch.matmul alone", "compute", False),
            row("NCCL all_gather_into_tensor alone", "nccl_communicate", False),
            row("NCCL all-gather, then torch.matmul", "nccl_serial"),
            row("torch fused_all_gather_matmul", "torch_fused")]
    rows += [row(_label(m), m) for m in ours]
    turned = [m.removeprefix("interleaved_") for n in NS for m in t[n] if m.startswith("interleaved_")]
    for method in dict.fromkeys(turned):  # in the runs' order, once each
        if method.startswith("ours_overlapped_") or method in ("nccl_serial", "torch_fused"):
            name = _label(method) if method.startswith("ours") else method.replace("_", " ")
            rows.append(row(f"in turn: {name}", method, prefix="interleaved_"))
    header = ["all-gather + GEMM from PyTorch"] + [h for n in NS for h in
                                                   (f"N = {n}, us", "NCCL serial / this", "torch fused / this")]
    s.add("py_table", table(header, ["l"] + ["r"] * 6, rows)
          + "\n\n*\"In turn\": the GEMM alone, NCCL serial, torch's fused op and ours timed one after the "
          "other, five rounds, median per method: a GPU clocks down under sustained GEMMs, so rows timed "
          f"one block after the other are not timed alike. \"-\": not timed in that run. {_sources(py)}.*")
    s.add("py_plot", "\n\n".join(book.figure(
        MANIFEST[f"overlap_n{n}"]["plot"], f"Time per call of each all-gather + GEMM method from PyTorch, N = {n}",
        f"N = {n}: `{MANIFEST[f'overlap_n{n}']['plot']}`, drawn by `benchmarks/plot_overlap.py` from "
        f"`{py[n].path}`: {py[n].device}, {py[n].date}.") for n in NS))

    for n, r in py.items():
        tn = t[n]
        best = min((m for m in tn if m.startswith("ours_overlapped_")), key=tn.get)
        nccl, fused, nccl_comm = tn["nccl_serial"], tn["torch_fused"], tn["nccl_communicate"]
        s.add(f"py_vs_nccl_n{n}", f"{ratio(nccl / tn[best])} the speed of NCCL's serial path (efficiency "
              f"{_pct((nccl - tn[best]) / min(nccl_comm, tn['compute']))} of NCCL's all-gather hidden)")
        s.add(f"py_vs_torch_n{n}", ratio(tn[best] / fused))
        s.add(f"py_comm_n{n}", f"{us(nccl_comm)} us for NCCL's all-gather, {us(tn['ours_communicate'])} us for ours")
        turns = {m.removeprefix("interleaved_"): v for m, v in tn.items() if m.startswith("interleaved_")}
        if not turns:
            raise GenError(f"{r.path}: no interleaved_ rows (the page quotes the rounds in turn)")
        tours = min((m for m in turns if m.startswith("ours_overlapped_")), key=turns.get)
        s.add(f"py_in_turn_n{n}", f"{ratio(turns[tours] / turns['torch_fused'])} the time of torch's fused op "
              f"({_label(tours)})")
    t2, t4 = t[2], t[4]
    claim(t2["ours_communicate"] < t2["nccl_communicate"], page, "at N = 2, our all-gather alone is faster than NCCL's")
    claim(t4["ours_communicate"] > t4["nccl_communicate"], page, "at N = 4, our all-gather alone is slower than NCCL's")
    claim(min(v for m, v in t2.items() if m.startswith("interleaved_ours_")) < t2["interleaved_torch_fused"], page,
          "at N = 2, timed in turn, ours is faster than torch's fused op")
    turn4 = min(v for m, v in t4.items() if m.startswith("interleaved_ours_")) / t4["interleaved_torch_fused"]
    claim(abs(turn4 - 1) < 0.02, page, "at N = 4, timed in turn, ours is level with torch's fused op (within 2%)")
    # Eight chunks from Python at N = 4: the same schedule as Rust's, far slower: the host's calls.
    py8, rust8 = t4.get("ours_overlapped_8"), rust[4].us("ag_overlapped", 8)
    claim(py8 is not None and py8 > 1.5 * rust8, page,
          "at N = 4, ours at 8 chunks from Python takes far longer than the same schedule from Rust")
    s.add("py_host_n4", f"{us(py8)} us, against {us(rust8)} us for the same schedule from Rust")


# ---- the MoE layer: scripts/moe_layer.py --bench -------------------------------------------------

IN_TURN = ", in turn"
# "4 layers x two micro-batches ..., pipelined, in turn[, hidden exchanges on 8 SMs, GEMMs leave 8]"
PIPELINE = re.compile(r"(\d+) layers x .*, pipelined, in turn(?:, hidden exchanges on \d+ SMs, GEMMs leave (\d+))?$")


class MoeRun:
    """One run of scripts/moe_layer.py --bench: (case, quantity) -> ms."""

    def __init__(self, r: Result, n: int):
        self.r, self.n = r, n
        self.ms: Dict[tuple, float] = {(x["case"], x["quantity"]): float(x["ms"]) for x in r.rows}

    def get(self, case: str, quantity: str) -> float:
        if (case, quantity) not in self.ms:
            raise GenError(f"{self.r.path}: no row ({case}, {quantity})")
        return self.ms[(case, quantity)]

    def cases(self) -> List[str]:
        return sorted({c for c, q in self.ms if q == "serial_ms"})

    def overlap(self, case: str) -> Dict[str, float]:
        serial, over, compute = self.get(case, "serial_ms"), self.get(case, "overlapped_ms"), self.get(case, "compute_ms")
        comm = serial - compute
        return {"serial": serial, "over": over, "compute": compute, "comm": comm,
                "bound": (comm + compute) / max(comm, compute) if comm > 0 else 1.0,
                "eff": (serial - over) / min(comm, compute) if comm > 0.01 * serial else float("nan")}


def sm_sweep(book: Book, page: str, table_eff8: Optional[float]) -> str:
    """The four-layer schedule with the hidden exchanges on 16 / 12 / 8 / 4 SMs in one run (N = 4):
    more SMs for the exchanges hide no more than 8. `table_eff8`: what the table's run hid on 8."""
    run = MoeRun(book.result("moe_sms_n4"), 4)
    eff = {int(m.group(2)): run.overlap(c)["eff"] for c in run.cases() for m in [PIPELINE.match(c)] if m and m.group(2)}
    claim(sorted(eff) == [4, 8, 12, 16], page, "the SM sweep has the rows at 4, 8, 12 and 16 SMs")
    claim(max(eff[12], eff[16]) <= eff[8] + 0.05, page, "12 and 16 SMs for the exchanges hide no more than 8")
    claim(eff[4] < eff[8], page, "4 SMs hide less than 8")
    hid = ", ".join(f"{_pct(eff[k]) if eff[k] > 0 else 'nothing'} on {k}" for k in (16, 12, 8, 4))
    return (f"Giving the hidden exchanges more SMs does not hide more. In a run at N = 4 that times the "
            f"four layers with the exchanges on 16, 12, 8 and 4 SMs (the GEMMs leaving as many), they hide "
            f"{hid} ({run.r.provenance()}, `{run.r.path}`)"
            + (f"; the table's run hid {_pct(table_eff8)} on 8, so one run's share is good to about "
               f"{100 * abs(table_eff8 - eff[8]):.0f} points either way, and only the ranking inside a run counts"
               if table_eff8 is not None and abs(table_eff8 - eff[8]) > 0.05 else "")
            + ". What stays exposed is not the exchanges' speed but what they "
            "take from the GEMMs beside them: every row they move is read and written in HBM, which the "
            "expert GEMMs of a 2048-token micro-batch also need.")


def gen_moe(book: Book) -> None:
    s = Snippets("moe")
    page = "moe-layer.md"
    runs = {n: MoeRun(book.result(f"moe_n{n}"), n) for n in NS}
    results = {n: run.r for n, run in runs.items()}

    rows = []
    for what in ("bf16", "fp8"):
        for n, run in runs.items():
            layer, comm = run.get(f"{what} layer", "layer_ms"), run.get(f"{what} layer", "comm_ms")
            rows.append([f"{what} dispatch", str(n), f"{layer:.2f}", f"{comm:.2f}", f"{100 * comm / layer:.0f}%"])
    s.add("layer_table", table(["forward + backward, 4096 tokens per rank", "N", "ms per layer",
                                "dispatch + combine, both directions, ms", "share"], ["l", "r", "r", "r", "r"], rows)
          + f"\n\n*DeepSeek-V3 shapes (hidden 7168, 256 experts, top-8, expert FFN 2048), experts as grouped "
          f"GEMMs. {_sources(results)}.*")

    # With rows timed in turn (moe_layer.py --overlap-rounds), the table shows those: each
    # schedule once per round, the order rotating, medians; a clock that drops under sustained
    # GEMMs cannot then favour whichever schedule ran first.
    shown = {n: [c for c in run.cases() if IN_TURN in c or c.startswith("low-latency")] or run.cases()
             for n, run in runs.items()}
    rows = []
    for case in sorted({c for cs in shown.values() for c in cs}, key=lambda c: (PIPELINE.match(c) is not None, c)):
        for n, run in runs.items():
            if case not in shown[n]:
                continue
            o = run.overlap(case)
            eff = "-" if o["eff"] != o["eff"] else f"{100 * o['eff']:.0f}%"
            rows.append([case, str(n), f"{o['serial']:.2f}", f"{o['over']:.2f}", f"{o['compute']:.2f}",
                         ratio(o["serial"] / o["over"]), ratio(o["bound"]), eff])
    s.add("overlap_table", table(["two micro-batches", "N", "serial, ms", "overlapped, ms", "experts alone, ms",
                                  "serial / overlapped", "bound", "efficiency"], ["l"] + ["r"] * 7, rows)
          + "\n\n*Bound: (communication + experts) / max(both), communication = serial - experts alone; "
          "efficiency: (serial - overlapped) / min(both); \"-\" where the communication is within 1% of the "
          "serial time. \"In turn\": every schedule timed once per round, five rounds, the order rotating, "
          "medians. A row with fewer SMs for the exchanges (the GEMMs leaving SMs free through "
          "`torch._C._set_sm_carveout_experimental`) shares its serial and experts-alone times with the row "
          f"without it. {_sources(results)}.*")

    shares = {n: run.get("bf16 layer", "comm_ms") / run.get("bf16 layer", "layer_ms") for n, run in runs.items()}
    forward = "two micro-batches of 2048 tokens, forward"
    one = {n: forward + IN_TURN if forward + IN_TURN in run.cases() else forward for n, run in runs.items()}
    effs = {n: run.overlap(one[n])["eff"] for n, run in runs.items()}
    for n in NS:
        s.add(f"comm_share_n{n}", _pct(shares[n]))
        s.add(f"mb_hidden_n{n}", "none of it" if effs[n] <= 0.02 else f"{_pct(effs[n])} of what could hide")
        claim(shares[n] < 0.1, page, f"on NVLink at N = {n}, the exchanges are under a tenth of the layer")
    claim(shares[4] > shares[2], page, "the exchanges' share of the layer grows from N = 2 to N = 4")
    claim(all(e < 0.3 for e in effs.values()), page, "inside one layer, two micro-batches hide little of the exchanges")

    # Two micro-batches pipelined through a stack of layers (the rows "<L> layers x ..."): the
    # page's paragraph is written here, so that a run without those rows leaves no sentence behind.
    text = ""
    pipe = {n: {int(m.group(2) or 0): run.overlap(c) for c in run.cases() for m in [PIPELINE.match(c)] if m}
            for n, run in runs.items()}
    if all(pipe.values()):
        layers = int(next(PIPELINE.match(c).group(1) for c in runs[4].cases() if PIPELINE.match(c)))
        best = {n: max(p, key=lambda k: p[k]["eff"]) for n, p in pipe.items()}
        claim(all(b > 0 for b in best.values()), page,
              "pipelined through layers, the exchanges hide best when the GEMMs leave them SMs")
        claim(all(pipe[n][best[n]]["eff"] > effs[n] + 0.1 for n in NS), page,
              "pipelined through layers, two micro-batches hide more than inside one layer")
        b4, o4 = best[4], pipe[4][best[4]]
        others = " and ".join((_pct(pipe[4][k]["eff"]) if pipe[4][k]["eff"] > 0 else "nothing")
                              + f" with {k if k else 'no'} SMs left free" for k in sorted(pipe[4]) if k != b4)
        text = (f"Two things change that (the table's pipelined rows). Layers: inside one layer the first "
                f"micro-batch's dispatch and the last one's combine have nothing to run beside, while through a "
                f"stack of {layers} layers only 2 of the {4 * layers} exchanges sit at the ends. And SMs of "
                f"their own: the grouped GEMMs leave {b4} SMs free, and the exchanges that run beside them use "
                f"those {b4}. Together, the forward of {layers} layers hides {_pct(o4['eff'])} of what could hide "
                f"at N = 4 ({o4['over']:.2f} ms against {o4['serial']:.2f} serial and {o4['compute']:.2f} for the "
                f"experts alone) and {_pct(pipe[2][best[2]]['eff'])} at N = 2. At N = 4 the other settings hide "
                f"{others}: on fewer SMs each exchange takes longer than the experts beside it, and with none "
                "left free the exchanges and the GEMMs share the SMs again.")
    s.add("pipeline", text)
    s.add("sm_sweep", sm_sweep(book, page, pipe[4].get(8, {}).get("eff")))
    s.add("timeline", book.figure(
        MANIFEST["moe_n2"]["timeline"],
        "Timeline of the MoE layer's forward on two micro-batches, overlapped, rank 0",
        f"`{MANIFEST['moe_n2']['timeline']}`: torch.profiler on rank 0, `scripts/moe_layer.py --timeline` "
        f"drawn by `benchmarks/plot_timeline.py`; {book.result('moe_n2', 'timeline_csv').device}, "
        f"{book.result('moe_n2', 'timeline_csv').date}."))
    for n, run in runs.items():
        s.add(f"run_n{n}", run.r.provenance())
    book.write(s)
