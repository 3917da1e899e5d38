"""The buffer's reliability runs of record (book/src/ch07-buffer.md, "When a rank dies" and "Ten
thousand calls in a row"): scripts/dead_rank.py's logs and the soak's, for scripts/gen_book.py."""

from __future__ import annotations

import re
from typing import List, Tuple

from .common import Book, GenError, read_text, Snippets, table

PAGE = "ch07-buffer.md"
# scripts/dead_rank.py's runs: its first line names the machine and date, then one line per
# survivor ("PASS  <mode> n=<N> kill rank <r> run <i>: rank <s> exit <code> <t> s after the
# kill ..."), then "P passed, F failed".
DEAD_RANK_LOGS = ["benchmarks/results/dead_rank_2xh100.log", "benchmarks/results/dead_rank_4xh100.log"]
# The soak's runs of record: (log, how the line its section starts with begins, program, PEs,
# how they ran).
SOAK_RUNS = [
    ("benchmarks/results/soak_folded_1xh100_2026-11-27.log", "# Part 2", "ch07-buffer", 1, "one GPU"),
    ("benchmarks/results/soak_4xh100_2026-11-27.log", "## soak_ch08_n1.log", "ch08-low-latency", 1, "one GPU"),
    ("benchmarks/results/soak_4xh100_2026-11-27.log", "## soak_ch07_n2.log", "ch07-buffer", 2, "folded onto one GPU"),
    ("benchmarks/results/soak_ch08_folded2_4xh100_2026-11-27.log", "## soak_ch08_n2.log", "ch08-low-latency", 2,
     "folded onto one GPU"),
]


def dead_rank(text: str, path: str) -> Tuple[str, float]:
    """One log's runs in words (how many, at which N, both modes, survivors, machine and date) and
    its slowest exit after the kill in s; the log must have passed every check."""
    machine = re.match(r"# (nvidia-[\w-]+).*?, (\d{4}-\d\d-\d\d)", text)
    if not machine:
        raise GenError(f"{path}: its first line names no machine and date")
    rows = re.findall(r"^PASS  (\w+) n=(\d+) kill rank (\d+) run (\d+): rank \d+ exit \d+ ([\d.]+) s after the kill",
                      text, flags=re.MULTILINE)
    total = re.search(r"^(\d+) passed, (\d+) failed$", text, flags=re.MULTILINE)
    if not rows or not total or int(total.group(2)) != 0 or int(total.group(1)) != len(rows):
        raise GenError(f"{path}: the page says every survivor exited in time; the log does not")
    runs = {(mode, n, victim, run) for mode, n, victim, run, _ in rows}
    modes = {"ll": "low-latency", "normal": "normal"}
    both = " and ".join(modes[m] for m in sorted({mode for mode, *_ in rows}, reverse=True))
    ns = " and ".join(sorted({n for _, n, *_ in rows}, key=int))
    words = f"{len(runs)} runs at N = {ns} ({both} mode; {len(rows)} survivors, {machine[1]}, {machine[2]})"
    return words, max(float(t) for *_, t in rows)


def soak_row(text: str, path: str, start: str, program: str, n: int, how: str) -> List[str]:
    """One soak run's row: the calls in a row, its checks, the buffers made and dropped and the
    most memory any PE lost, from the run's section of the log (which must have passed)."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    if first is None:
        raise GenError(f"{path}: no section {start!r}")
    section = []
    for line in lines[first + 1:]:
        if line.startswith(("## ", "soak: ")):
            break
        section.append(line)
    body = "\n".join(section)
    total = re.search(r"^(\d+) passed, (\d+) failed$", body, flags=re.MULTILINE)
    calls = re.search(r"^pe 0: (?:running (\d+) dispatch/combine pairs|(\d+) round trips in a row)", body, flags=re.MULTILINE)
    made = re.findall(r"^pe \d+: (\d+) buffers made and dropped: .*lost after (.*)\)$", body, flags=re.MULTILINE)
    if not total or int(total[2]) != 0 or not calls or len(made) != n:
        raise GenError(f"{path}, {start}: the page says {program} at N = {n} passed its calls and its buffers")
    lost = max(int(kib) for _, after in made for kib in re.findall(r": (\d+) KiB", after))
    return [f"`{program}`", f"{n}, {how}", f"{int(calls[1] or calls[2]):,}", total[1], made[0][0], f"{lost} KiB"]


def gen_reliability(book: Book) -> None:
    s = Snippets("reliability", ", ".join(DEAD_RANK_LOGS + sorted({path for path, *_ in SOAK_RUNS})))
    parts, slowest = [], 0.0
    for path in DEAD_RANK_LOGS:
        words, worst = dead_rank(read_text(path), path)
        parts.append(words)
        slowest = max(slowest, worst)
    s.add("dead_rank", f"In {' and '.join(parts)}, every survivor exited with an error at most {slowest:.1f} s after "
          f"the kill, with a 5 s timeout (`scripts/dead_rank.py`; `{'`, `'.join(DEAD_RANK_LOGS)}`).")
    rows = [soak_row(read_text(path), path, start, program, n, how) for path, start, program, n, how in SOAK_RUNS]
    s.add("soak", table(["program", "PEs", "calls in a row, routing new each time", "checks passed, 0 failed",
                         "buffers made and dropped", "most GPU memory lost, any PE"],
                        ["l", "l", "r", "r", "r", "r"], rows) +
          f"\n\n*H100, 2026-11-27: `{'`, `'.join(sorted({path for path, *_ in SOAK_RUNS}))}`. "
          "A loop counts as one check in the total; every output of every call in it is compared.*")
    book.write(s)
