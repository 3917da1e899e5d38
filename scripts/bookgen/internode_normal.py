"""The normal mode across nodes (book/src/ch09-normal-mode.md): the cost model's tables from
benchmarks/internode_normal_model.py, and the GPU checks of record from the internode test's
log, for scripts/gen_book.py."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from .common import Book, claim, GenError, load_module, read_text, Snippets, table

MODEL = "benchmarks/internode_normal_model.py"
PAGE = "ch09-normal-mode.md"
# The GPU test of record: internode-dispatch (steps 4-8: dispatches, 1,000 dispatch and combine
# pairs, fp8, the cached dispatch, num_worst_tokens, a captured pair) on virtual nodes of one host,
# with its per-run summary lines.
CHECKS_LOG = "benchmarks/results/internode_dispatch_steps4-8_4xh100_2026-11-27.log"
# scripts/ch09_internode_buffer.py (DeepEP's Python API across nodes): its first line names the
# run, the last lines are the script's own.
PYTHON_LOG = "benchmarks/results/ch09_internode_buffer_n4_g2_4xh100_2026-11-27.log"


def gen_ch09_normal(book: Book) -> None:
    m = load_module(MODEL)
    model = m.build()
    s = Snippets("ch09_normal", f"{MODEL} and {CHECKS_LOG}")
    cap = (f"*Predicted by `{MODEL}`, not measured: per rank and op, {m.TOKENS} tokens of hidden {m.HIDDEN}, "
           f"top-{m.TOPK} of {m.EXPERTS} experts, DeepEP's test routing (at most {m.MAX_GROUPS} nodes per token); "
           f"MB = 10^6 bytes.*")
    sizes = [(n, g) for g in m.NODE_SIZES for n in m.EP_SIZES]

    # Inline figures of the prose.
    s.add("shape", f"{m.TOKENS} tokens per rank, hidden {m.HIDDEN}, top-{m.TOPK} of {m.EXPERTS} experts, "
                   f"fp8 dispatch with its scales, bf16 combine")
    s.add("max_groups", f"{m.MAX_GROUPS}")
    s.add("slots", f"{m.dispatch_slot():,} bytes for an fp8 dispatch slot and {m.combine_slot():,} for a "
                   f"combine slot")
    ours, theirs = (m.dispatch_slot(), m.combine_slot()), m.deepep_slots()
    worst_slot = max(abs(o / d - 1) for o, d in zip(ours, theirs))
    claim(worst_slot < 0.002, PAGE, "our slots are DeepEP's within 0.2%")
    s.add("deepep_slots", f"{theirs[0]:,} and {theirs[1]:,}")
    s.add("nvl_over_nic", f"{m.NVL_GBS / m.IB_GBS:.1f}")
    s.add("links", f"{m.IB_GBS:g} GB/s per GPU through its NIC (400 Gb/s) and {m.NVL_GBS:g} GB/s over NVLink "
                   f"(H800)")
    s.add("node_sizes", ", ".join(str(g) for g in m.NODE_SIZES[:-1]) + f" and {m.NODE_SIZES[-1]}")

    # Why a token crosses once: the two-level route's network bytes against a copy per rank.
    rows, saved = [], {}
    for n, g in sizes:
        r = model.routings[(n, g)]
        d, _ = model.ops(n, g)
        saved[(n, g)] = 1 - d.nic_bytes / d.flat_nic_bytes
        rows.append([f"EP{n}", f"{n // g} x {g}", f"{r.remote_nodes:.2f}", f"{r.remote_ranks:.2f}",
                     f"{d.nic_bytes / 1e6:.1f}", f"{d.flat_nic_bytes / 1e6:.1f}", f"{100 * saved[(n, g)]:.0f}%"])
    s.add("once_table", table(["EP", "nodes x G", "other nodes per token", "ranks on other nodes per token",
                               "two-level, MB", "a copy per rank, MB", "saved"], ["l", "l", "r", "r", "r", "r", "r"],
                              rows) + "\n\n" + cap.replace("per rank and op", "dispatch bytes one rank sends "
                                                           "across the network"))
    claim(all(saved[(n, 8)] > saved[(n, 4)] > saved[(n, 2)] for n in m.EP_SIZES), PAGE,
          "forwarding saves more the larger the node, at every EP size")
    s.add("saved_span", f"{100 * min(saved.values()):.0f}% to {100 * max(saved.values()):.0f}%")

    # DeepEP's published figures and what they mean.
    pubs = {n: m.published(model.routings[(n, 8)]) for n in m.EP_SIZES}
    binds = {(n, g): tuple(op.binds for op in model.ops(n, g)) for n, g in sizes}
    claim(binds[(16, 8)] == ("NVLink", "NVLink") and all(b == ("NIC", "NIC") for k, b in binds.items() if k != (16, 8)),
          PAGE, "NVLink binds EP16 in nodes of 8; the NIC binds every other topology")
    s.add("deepep_figures", ", ".join(f"{pubs[n].gbs[0]:g} / {pubs[n].gbs[1]:g} GB/s at EP{n}" for n in m.EP_SIZES))
    s.add("ep16_nic", f"{pubs[16].nic_gbs[0]:.1f} GB/s")
    nic_eff = [model.efficiency[("dispatch", "NIC")], model.efficiency[("combine", "NIC")]]
    nvl_eff = [model.efficiency[("dispatch", "NVLink")], model.efficiency[("combine", "NVLink")]]
    s.add("efficiency", f"{nic_eff[0]:.2f} (dispatch) and {nic_eff[1]:.2f} (combine) of the NIC's floor where the NIC "
                        f"binds, {nvl_eff[0]:.2f} and {nvl_eff[1]:.2f} of NVLink's where NVLink does")
    lo, hi = m.OURS_RANGE
    s.add("ours_range", f"{lo:.1f} to {hi:.1f}")
    worst = max(abs(model.target_us(n, 8)[i] / pubs[n].us[i] - 1) for n in m.EP_SIZES for i in range(2))
    claim(worst < 0.02, PAGE, "the target reproduces DeepEP's published times at nodes of 8 within 2%")

    # The model's table.
    rows = []
    for n, g in sizes:
        d, c = model.ops(n, g)
        td, tc = model.target_us(n, g)
        (dlo, dhi), (clo, chi) = model.ours_us(n, g)
        pub = pubs.get(n) if g == 8 else None
        rows.append([f"EP{n}", f"{n // g} x {g}", f"{d.nic_bytes / 1e6:.0f} / {c.nic_bytes / 1e6:.0f}",
                     f"{d.floor_us:.0f} / {c.floor_us:.0f} ({d.binds})",
                     f"{pub.gbs[0]:g} / {pub.gbs[1]:g} GB/s: {pub.us[0]:.0f} / {pub.us[1]:.0f}" if pub else "-",
                     f"{td:.0f} / {tc:.0f}", f"{dlo:.0f}-{dhi:.0f} / {clo:.0f}-{chi:.0f}"])
    s.add("model_table", table(["EP", "nodes x G", "network MB, d / c", "floor us, d / c (binds)",
                                "DeepEP v1 published, us", "target us", "ours, predicted us"],
                               ["l", "l", "r", "r", "r", "r", "r"], rows) + "\n\n" +
          cap[:-1] + f" Floors: each link alone at {m.IB_GBS:g} GB/s (NIC) and {m.NVL_GBS:g} GB/s (NVLink). DeepEP: "
          f"its README's H800 + ConnectX-7 figures at commit 567632d, as its test counts them, turned into times. "
          f"Nodes of 4 and 2: the same GPUs and NICs. Target: DeepEP's efficiency on the link that binds, applied to "
          f"the row's bytes. Ours: {lo:.1f} to {hi:.1f} of the target's speed.*")

    # Smaller nodes: the network bytes follow the node count.
    t = {k: model.target_us(*k) for k in sizes}
    s.add("ep16_g4_ratio", f"{t[(16, 4)][0] / t[(16, 8)][0]:.2f}x")
    claim(all(abs(t[(16, 4)][i] - t[(32, 8)][i]) < 1e-6 for i in range(2)), PAGE,
          "EP16 in nodes of 4 costs what EP32 in nodes of 8 costs (4 nodes both)")
    s.add("g2_ratios", f"{t[(32, 2)][0] / t[(32, 8)][0]:.2f}x at EP32 and {t[(64, 2)][0] / t[(64, 8)][0]:.2f}x at EP64")

    # What ran: the GPU checks of record, per topology.
    s.add("checks_table", checks_table(read_text(CHECKS_LOG)))
    s.add("python_run", python_run(read_text(PYTHON_LOG)))
    book.write(s)


def python_run(text: str) -> str:
    """The Python script's printout of record (its checks per rank and the total), with where it ran."""
    lines = text.splitlines()
    run = re.search(r"at N = (\d+) as (\d+) nodes of (\d+) .*?, (\d+x NVIDIA [^,(]+?)(?: \([^)]*\))?, (\d{4}-\d\d-\d\d \d\d:\d\d UTC)",
                    lines[0])
    if not run:
        raise GenError(f"{PYTHON_LOG}: its first line names no 'at N = n as k nodes of g ..., <GPUs>, <date>'")
    # Each rank's final tally and the job's total (not the script's progress line before its
    # bad-input and mode-sharing sections, which counts a subset of the same checks).
    printed = [l for l in lines[1:] if re.match(r"^(pe \d+: )?\d+ passed, \d+ failed$", l)]
    total = re.match(r"^(\d+) passed, (\d+) failed$", printed[-1] if printed else "")
    if not total or int(total.group(2)) != 0:
        raise GenError(f"{PYTHON_LOG}: no final 'N passed, 0 failed': the page says the script passed")
    n, nodes, g, gpus, date = run.groups()
    return ("```text\n" + "\n".join(printed) + "\n```\n\n"
            f"*N = {n} as {nodes} nodes of {g}, {gpus}, {date}: `{PYTHON_LOG}`.*")


def checks_table(text: str) -> str:
    """Per topology, what every rank of the whole program passed (all steps, and of them the
    dispatch and combine pairs'), summed over the ranks, and the run's time, from the log's
    per-run lines and gpu_test's summary."""
    header = text.splitlines()[1] if len(text.splitlines()) > 1 else ""
    found = re.search(r"(\d+x NVIDIA [^,(]+?)(?: \([^)]*\))?, (\d{4}-\d\d-\d\d)", header)
    if not found:
        raise GenError(f"{CHECKS_LOG}: its second line names no '<N>x NVIDIA <GPU>, <date>'")
    device, date = found.groups()
    run = r"^internode-dispatch-n(\d+)-g(\d+)\.log: "
    totals = {(int(n), int(g)): (int(p), int(f))
              for n, g, p, f in re.findall(run + r"(\d+) passed, (\d+) failed$", text, flags=re.MULTILINE)}
    per_rank = {(int(n), int(g)): int(p)
                for n, g, p in re.findall(run + r"pe 0: (\d+) passed, 0 failed$", text, flags=re.MULTILINE)}
    pairs = {(int(n), int(g)): (int(k), int(p))
             for n, g, k, p in re.findall(run + r"pe 0: (\d+) dispatch and combine pairs: (\d+) checks passed, 0 failed$",
                                          text, flags=re.MULTILINE)}
    took = {(int(n), int(g)): (t, folded) for n, g, t, folded in
            re.findall(r"^PASS  internode-dispatch n=(\d+) \(nodes of (\d+)\) \((\d+) s(?:; folded onto (\d+) GPU)?",
                       text, flags=re.MULTILINE)}
    if not totals:
        raise GenError(f"{CHECKS_LOG}: no per-run 'internode-dispatch-n<N>-g<G>.log: <n> passed, <f> failed' line")
    counts = {k for k, _ in pairs.values()}
    if len(counts) != 1:
        raise GenError(f"{CHECKS_LOG}: expected one count of dispatch and combine pairs, found {sorted(counts)}")
    rows = []
    for key in sorted(totals, key=lambda k: (k[0], -k[1])):
        n, g = key
        passed, failed = totals[key]
        if failed or key not in per_rank or key not in pairs or key not in took:
            raise GenError(f"{CHECKS_LOG}: {n // g} x {g}: a failed check, or no pe 0 lines, or no PASS line: "
                           "the page says every check passed")
        seconds, folded = took[key]
        on = f"{folded} GPUs, {n // int(folded)} ranks each" if folded else f"{n} GPUs"
        rows.append([f"{n // g} x {g}", f"{n}", on, f"{per_rank[key]:,}", f"{pairs[key][1]:,}", f"{passed:,}",
                     f"{seconds} s"])
    return (table(["nodes x G", "ranks", "on", "checks per rank", f"of them, {counts.pop():,} dispatch and combine pairs",
                   "checks, all ranks", "run"], ["l", "r", "l", "r", "r", "r", "r"], rows) +
            f"\n\n*Measured: correctness, not speed. {device}, {date}, one host: the \"network\" is NVSHMEM's "
            f"peer-to-peer transport over NVLink under the same RMA calls. No check failed; folded ranks "
            f"ran under MPS. `{CHECKS_LOG}`.*")
