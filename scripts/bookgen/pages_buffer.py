"""Chapters 7 and 8: the buffer's normal and low-latency modes against DeepEP, for
scripts/gen_book.py."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from .collectives import PUTS
from .common import Book, claim, gbs, GenError, load_module, MANIFEST, MIB, ratio, Result, Snippets, span, table, us

V2_ROWS = "benchmarks/deepep_v2_rows.py"

# ---- chapter 7 -----------------------------------------------------------------------------------


def test_best(log: str, path: str) -> Dict[str, float]:
    """DeepEP's test_intranode.py printout: its best GB/s per operation, and the layout time."""
    best = {}
    for key, pattern in (("fp8", r"Best dispatch \(FP8\):.*?([\d.]+) GB/s"),
                         ("bf16", r"Best dispatch \(BF16\):.*?([\d.]+) GB/s"),
                         ("combine", r"Best combine:.*?([\d.]+) GB/s")):
        found = re.search(pattern, log)
        if not found:
            raise GenError(f"{path}: no '{pattern}' line")
        best[key] = float(found.group(1))
    found = re.search(r"\[layout\] Kernel performance: ([\d.]+) ms", log)
    if not found:
        raise GenError(f"{path}: no '[layout] Kernel performance' line")
    best["layout_us"] = float(found.group(1)) * 1e3
    return best


def v2_runs(log: str, path: str, wanted: Tuple[str, ...]) -> Dict[str, Dict[str, float]]:
    """benchmarks/deepep_v2.sh's log read by benchmarks/deepep_v2_rows.py (per run, V2's SM
    count and its profiler kernel times in us, means over ranks: dispatch and its copy into the
    outputs per dtype, combine and its reduce). The runs in `wanted` must be there."""
    out = load_module(V2_ROWS).parse_runs(log)
    needs = {"analytical": ("sms", "dispatch_bf16", "dispatch_fp8", "combine"),
             "sm24": ("sms", "dispatch_bf16", "dispatch_fp8", "combine"), "ll": ("dispatch_fp8", "combine")}
    for name in wanted:
        need = needs[name]
        missing = [k for k in need if k not in out.get(name, {})]
        if missing:
            raise GenError(f"{path}: run {name} lacks {missing}")
    return out


def gen_ch07(book: Book) -> None:
    s = Snippets("ch07")
    summary = {}
    for key in ("buffer_ep2", "buffer_ep4"):
        r = book.result(key)
        ep = int(r.rows[0]["ep"])
        ours_log = book.log(key, "ours_test")
        claim("exit 0" in ours_log and " failed" not in ours_log.replace("0 failed", ""), "ch07-measuring.md",
              f"DeepEP's test_intranode.py passes against ours ({MANIFEST[key]['ours_test']})")
        ours_test = test_best(ours_log, MANIFEST[key]["ours_test"])
        deepep_test = test_best(book.log(key, "deepep_test"), MANIFEST[key]["deepep_test"])

        def bench(method: str, op: str, dtype: str, sms: int = 24) -> float:
            return r.value("gb_per_s", method=method, op=op, dtype=dtype, num_sms=sms)

        ops = [("dispatch", "bf16", "bf16"), ("dispatch", "fp8", "fp8"), ("combine", "bf16", "combine")]
        test_row_d = [f"{gbs(deepep_test[k])} GB/s" for _, _, k in ops]
        test_row_o = [f"{gbs(ours_test[k])} GB/s ({ratio(ours_test[k] / deepep_test[k])})" for _, _, k in ops]
        bench_row_d = [gbs(bench("deepep", op, dt)) for op, dt, _ in ops]
        bench_row_o = [f"{gbs(bench('ours', op, dt))} ({ratio(bench('ours', op, dt) / bench('deepep', op, dt))})" for op, dt, _ in ops]
        chunk = {op: r.one(method="deepep", op=op, dtype="bf16", num_sms=24)["chunk"] for op in ("dispatch", "combine")}
        deepep_chunks = f"dispatch chunk {chunk['dispatch']}, combine chunk {chunk['combine']}"
        s.add(f"{key}_table", table(
            [f"24 SMs, EP{ep}", "dispatch bf16", "dispatch fp8", "combine"], ["l", "r", "r", "r"],
            [["DeepEP, its test's best config"] + test_row_d,
             ["ours, the same test"] + test_row_o,
             [f"DeepEP, buffer_bench ({deepep_chunks})"] + bench_row_d,
             ["ours, buffer_bench"] + bench_row_o]) +
            f"\n\n*GB/s = received bytes / time (the test's \"NVL GB/s\"); 4096 tokens x 7168 per rank, top-8 of 256 experts. "
            f"`{r.path}` with DeepEP's printouts `{MANIFEST[key]['deepep_test']}` and ours `{MANIFEST[key]['ours_test']}`: "
            f"{r.device}, {r.date}.*" + book.caveat(key))
        s.add(f"{key}_run", r.provenance())
        s.add(f"{key}_plot", book.figure(MANIFEST[key]["plot"], f"bandwidth against SMs, ours and DeepEP, EP{ep}",
                                         f"`{MANIFEST[key]['plot']}`: {r.device}, {r.date}."))
        summary[ep] = (ours_test, deepep_test, r, bench)
        s.add(f"{key}_test_ratios", " / ".join(ratio(ours_test[k] / deepep_test[k]) for _, _, k in ops))
        # The layout step: ours is slower, in DeepEP's test and in buffer_bench.
        layout_o, layout_d = r.value("us", method="ours", op="layout"), r.value("us", method="deepep", op="layout")
        s.add(f"{key}_layout", f"{us(ours_test['layout_us'], 0)} us against DeepEP's {us(deepep_test['layout_us'], 0)} us "
              f"in DeepEP's test, {us(layout_o)} against {us(layout_d)} us in `buffer_bench`")
        claim(ours_test["layout_us"] > deepep_test["layout_us"], "ch07-measuring.md", "our layout step is slower than DeepEP's")
        # 12 SMs against DeepEP's 24.
        s.add(f"{key}_sms12", ", ".join(
            f"{label} {gbs(bench('ours', op, dt, 12))} GB/s with 12 SMs against DeepEP's {gbs(bench('deepep', op, dt, 12))} with 12 "
            f"and {gbs(bench('deepep', op, dt, 24))} with 24" for (op, dt, _), label in zip(ops, ("bf16 dispatch", "fp8 dispatch", "combine"))))
    o2, d2, _, _ = summary[2]
    o4, d4, _, _ = summary[4]
    claim(all(o2[k] > d2[k] for k in ("fp8", "bf16", "combine")), "ch07-measuring.md", "at EP2 ours beats DeepEP in its own test")
    claim(all(o4[k] > d4[k] for k in ("fp8", "bf16")), "ch07-measuring.md", "at EP4 dispatch beats DeepEP in its own test")
    claim(0.9 < o4["combine"] / d4["combine"] < 1.1, "ch07-measuring.md", "EP4 combine is level with DeepEP's in its test")
    # DeepEP V2 at EP2, in the same call as buffer_ep2: its kernel times (with the copy into its
    # outputs and its combine's reduce, its own test's split) against ours in buffer_bench.
    _, _, r2, bench2 = summary[2]
    v2 = v2_runs(book.log("deepep_v2_ep2", "log"), MANIFEST["deepep_v2_ep2"]["log"], ("analytical", "sm24"))
    def v2_us(run: str, op: str) -> float:
        v = v2[run]
        return v["combine"] + v["reduce"] if op == "combine" else v[f"dispatch_{op}"] + v[f"copy_{op}"]
    # buffer_bench's *_gpu rows (the call's kernels, summed, as V2's test times it) when the run
    # has them; else its eager rows (the whole call, host included: a bound that favours V2).
    on_gpu = any(row["op"] == "dispatch_gpu" for row in r2.rows)
    rows, faster = [], {}
    for op, dt, label in (("dispatch", "bf16", "dispatch bf16"), ("dispatch", "fp8", "dispatch fp8"), ("combine", "bf16", "combine")):
        key = dt if op == "dispatch" else "combine"
        ours_us = r2.value("us", method="ours", op=f"{op}_gpu" if on_gpu else op, dtype=dt, num_sms=24)
        faster[key] = v2_us("sm24", key) / ours_us
        rows.append([label, us(v2_us("analytical", key)), us(v2_us("sm24", key)), us(ours_us), ratio(faster[key])])
    s.add("v2_table", table(
        ["EP2, us", f"DeepEP V2, {v2['analytical']['sms']:.0f} SMs (its own count)", "DeepEP V2, 24 SMs", "ours, 24 SMs",
         "DeepEP V2's time / ours, 24 SMs"], ["l", "r", "r", "r", "r"], rows) +
        f"\n\n*DeepEP V2: profiler kernel times from its `tests/elastic/test_ep.py` (dispatch plus its copy into the "
        f"outputs; combine plus its reduce), 4096 tokens x 7168, top-8 of 256 experts, `{MANIFEST['deepep_v2_ep2']['log']}`. "
        + (f"Ours: `buffer_bench`'s `*_gpu` rows (the kernels of a whole call, notify included, summed; the "
           f"same profiler), `{r2.path}`. " if on_gpu else
           f"Ours: `buffer_bench` (DeepEP v1's eager bench: the whole call, host and notify included), `{r2.path}`. ") +
        f"The same call: {r2.device}, {r2.date}.*")
    s.add("v2_ours_how", "the summed kernel times of our whole call" if on_gpu else "our whole call's time (host included)")
    s.add("v2_faster", ", ".join(f"{label} {ratio(faster[k])}" for k, label in
                                (("bf16", "bf16 dispatch"), ("fp8", "fp8 dispatch"), ("combine", "combine"))))
    claim(faster["combine"] > 1.1, "ch07-measuring.md", "with 24 SMs our combine takes less time than V2's kernels")
    claim(abs(faster["bf16"] - 1) < 0.05, "ch07-measuring.md", "bf16 dispatch is level with V2 (within 5%)")
    claim(faster["fp8"] < 0.95, "ch07-measuring.md", "V2's fp8 dispatch takes less time than ours")
    claim(v2["analytical"]["sms"] < 24 and all(abs(v2_us("analytical", k) / v2_us("sm24", k) - 1) < 0.05
                                              for k in ("bf16", "fp8", "combine")), "ch07-measuring.md",
          "V2 at its own (smaller) SM count is within 5% of its times at 24 SMs")
    s.add("ep4_combine_ratio", ratio(o4["combine"] / d4["combine"]))
    s.add("ep4_combine", f"{gbs(o4['combine'])} against {gbs(d4['combine'])} GB/s")
    book.write(s)


# ---- chapter 8 -----------------------------------------------------------------------------------

LL_ROWS = [
    ("dispatch (kernel)", [("dispatch", "kernel")]),
    ("combine (kernel)", [("combine", "kernel")]),
    ("dispatch send + recv (hook)", [("dispatch_send", "kernel"), ("dispatch_recv", "kernel")]),
    ("combine send + recv (hook)", [("combine_send", "kernel"), ("combine_recv", "kernel")]),
    ("dispatch + combine (CUDA graph replay)", [("dispatch_combine", "graph")]),
    ("dispatch + combine (eager, DeepEP's bench)", [("dispatch_combine", "eager")]),
    ("host CPU per eager pair", [("dispatch_combine", "host")]),
]


def ll_test(log: str) -> Dict[str, List[float]]:
    """DeepEP's test_low_latency.py printout, per rank: the pair, dispatch, combine avg_t (us)."""
    return {
        "pair": [float(x) for x in re.findall(r"Dispatch \+ combine bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "dispatch": [float(x) for x in re.findall(r"Dispatch bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "combine": [float(x) for x in re.findall(r"Combine bandwidth: [\d.]+ GB/s, avg_t=([\d.]+) us", log)],
        "buffer_mb": [float(x) for x in re.findall(r"Allocating buffer size: ([\d.]+) MB", log)],
    }


def gen_ch08(book: Book) -> None:
    s = Snippets("ch08")
    cells: Dict[int, Tuple[Result, Callable[[str, str, str], float]]] = {}
    for key in ("ll_ep2", "ll_ep4"):
        r = book.result(key)
        ep = int(r.rows[0]["ep"])
        cells[ep] = (r, lambda method, op, timing, r=r: r.value("us", method=method, op=op, timing=timing))
    rows = []
    for label, parts in LL_ROWS:
        row = [label]
        for ep in sorted(cells):
            _, v = cells[ep]
            d = [v("deepep", op, t) for op, t in parts]
            o = [v("ours", op, t) for op, t in parts]
            row += [" + ".join(us(x) for x in d), " + ".join(us(x) for x in o),
                    " / ".join(ratio(a / b) for a, b in zip(o, d))]
        rows.append(row)
    header = [""]
    for ep in sorted(cells):
        header += [f"EP{ep} DeepEP v1", f"EP{ep} ours", "ours / DeepEP"]
    r2, r4 = cells[2][0], cells[4][0]
    s.add("table", table(header, ["l"] + ["r"] * (len(header) - 1), rows) +
          f"\n\n*Microseconds, means over the ranks; 128 tokens x 7168 per rank, top-8 of 288 experts, fp8 dispatch, "
          f"bf16 combine. `{r2.path}`: {r2.provenance()}; `{r4.path}`: {r4.provenance()}.*"
          + book.caveat("ll_ep2"))
    s.add("ep2_run", r2.provenance())
    s.add("ep4_run", r4.provenance())
    s.add("plot", book.figure(MANIFEST["ll_ep2"]["plot"], "Low-latency times, ours and DeepEP v1, EP2",
                              f"`{MANIFEST['ll_ep2']['plot']}`: {r2.device}, {r2.date}."))
    v2, v4 = cells[2][1], cells[4][1]
    def rr(v, op, timing):
        return v("ours", op, timing) / v("deepep", op, timing)
    # Phrases that read on their own: "0.85x DeepEP's kernel time at EP2 and 0.89x at EP4".
    def both(op: str, timing: str, what: str) -> str:
        return f"{ratio(rr(v2, op, timing))} DeepEP's {what} at EP2 and {ratio(rr(v4, op, timing))} at EP4"
    s.add("combine_ratios", both("combine", "kernel", "kernel time"))
    s.add("graph_ratios", both("dispatch_combine", "graph", "time"))
    s.add("dispatch_ratios", both("dispatch", "kernel", "kernel time"))
    s.add("ep4_dispatch_send", f"{us(v4('ours', 'dispatch_send', 'kernel'))} against {us(v4('deepep', 'dispatch_send', 'kernel'))} us")
    claim(all(rr(v, "combine", "kernel") < 1 and rr(v, "dispatch_combine", "graph") < 1 for v in (v2, v4)),
          "ch08-python-graphs.md", "combine and the graph-replayed pair are faster than DeepEP's at EP2 and EP4")
    claim(rr(v2, "dispatch", "kernel") < 1 and rr(v4, "dispatch", "kernel") < 1.05, "ch08-python-graphs.md",
          "dispatch is faster than DeepEP's at EP2 and within 5% at EP4")
    claim(rr(v4, "dispatch_send", "kernel") > 1, "ch08-python-graphs.md", "at EP4 our dispatch send is slower than DeepEP's")
    # DeepEP V2 has no separate low-latency kernels: its one dispatch and combine at the decode
    # shape (128 tokens x 7168, top-8 of 288, fp8 dispatch), profiler kernel times as ours.
    dv2 = v2_runs(book.log("deepep_v2_ll_ep2", "log"), MANIFEST["deepep_v2_ll_ep2"]["log"], ("ll",))["ll"]
    v2_d, v2_c = dv2["dispatch_fp8"] + dv2["copy_fp8"], dv2["combine"] + dv2["reduce"]
    s.add("v2_decode", f"dispatch {us(v2_d)} us (its copy into the outputs included) against our "
          f"{us(v2('ours', 'dispatch', 'kernel'))}, combine {us(v2_c)} us (its reduce included) against our "
          f"{us(v2('ours', 'combine', 'kernel'))}")
    claim(v2_d < v2("ours", "dispatch", "kernel") and v2_c < v2("ours", "combine", "kernel"), "ch08-python-graphs.md",
          "at the decode shape V2's kernels take less time than our low-latency kernels at EP2")
    # The eager path: ours is slower, with the host time per pair as the reason.
    eager = []
    for ep in sorted(cells):
        v = cells[ep][1]
        eager.append(f"EP{ep}: {us(v('ours', 'dispatch_combine', 'eager'))} us per eager pair against DeepEP's "
                     f"{us(v('deepep', 'dispatch_combine', 'eager'))} ({ratio(rr(v, 'dispatch_combine', 'eager'))}), with "
                     f"{us(v('ours', 'dispatch_combine', 'host'))} against {us(v('deepep', 'dispatch_combine', 'host'))} us "
                     f"of host CPU per pair")
    s.add("eager", "; ".join(eager))
    # DeepEP's own test, for both.
    tests = []
    for key in ("ll_ep2", "ll_ep4"):
        claim("exit 0" in book.log(key, "ours_test"), "ch08-python-graphs.md",
              f"DeepEP's test_low_latency.py passes against ours ({MANIFEST[key]['ours_test']})")
        ours, deepep = ll_test(book.log(key, "ours_test")), ll_test(book.log(key, "deepep_test"))
        for name in ("pair", "dispatch", "combine"):
            if not ours[name] or not deepep[name]:
                raise GenError(f"{MANIFEST[key]['ours_test']} / {MANIFEST[key]['deepep_test']}: no {name} lines")
        ep = int(book.result(key).rows[0]["ep"])
        tests.append([f"EP{ep}", f"{span(ours['dispatch'], us)} / {span(deepep['dispatch'], us)}",
                      f"{span(ours['combine'], us)} / {span(deepep['combine'], us)}",
                      f"{span(ours['pair'], us)} / {span(deepep['pair'], us)}"])
        claim(min(ours["pair"]) > max(deepep["pair"]), "ch08-python-graphs.md",
              "in DeepEP's own test our eager dispatch + combine line is slower")
        if key == "ll_ep2":
            s.add("hint_mb", f"{ours['buffer_mb'][0]:.1f} MB")
            s.add("deepep_hint_mb", f"{deepep['buffer_mb'][0]:.1f} MB")
    s.add("test_table", table(["DeepEP's test_low_latency.py, us per call (range over ranks)", "dispatch: ours / DeepEP",
                               "combine: ours / DeepEP", "\"Dispatch + combine\" line: ours / DeepEP"],
                              ["l", "r", "r", "r"], tests) +
          f"\n\n*The logs: `{MANIFEST['ll_ep2']['ours_test']}`, `{MANIFEST['ll_ep2']['deepep_test']}`, "
          f"`{MANIFEST['ll_ep4']['ours_test']}`, `{MANIFEST['ll_ep4']['deepep_test']}` ({r2.date}; {r4.date}).*")

    # Sizes from the layout formula at DeepEP's test shape (T = 128, H = 7168, E = 288).
    T, H, E = 128, 7168, 288
    half = E * T * (16 + 2 * H)
    s.add("half_mb", f"{half / 1e6:.0f} MB")
    fp8_message = 16 + H + H // 128 * 4
    fp8_message = -(-fp8_message // 16) * 16
    s.add("message_kb", f"{fp8_message / 1e3:.1f} KB")
    total = T * 8 * fp8_message
    s.add("messages_mb", f"{total / 1e6:.1f} MB")
    p2p = book.result("p2p")
    put4m = max(p2p.value("gb_per_s", method=m, num_bytes=4 * MIB) for m in PUTS)
    s.add("crossing", f"about {total / 2 / 1e6:.1f} MB, {us(total / 2 / (put4m * 1e3))} us at the "
          f"{gbs(put4m)} GB/s of chapter 3's best 4 MiB put")
    coll = book.result("coll_n2")
    s.add("launch_us", f"{us(coll.value('us', collective='barrier', algorithm='signal'))} us")
    s.add("put_signal_us", f"{us(p2p.value('us', method='put_signal_pingpong', num_bytes=8), 2)} us")
    book.write(s)
