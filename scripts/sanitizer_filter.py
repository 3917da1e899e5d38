#!/usr/bin/env python3
"""Counts the errors compute-sanitizer reported for one run of scripts/gpu_test.sh, after the
known-noise rules below, and fails on any left.

    python3 scripts/sanitizer_filter.py --tool memcheck LOG_DIR/ch04-collectives-n2
    python3 scripts/sanitizer_filter.py --self-test   # each rule on sample records

A run's prefix P names its logs: P.TOOL.rank<R>.log, compute-sanitizer's own output for rank R
(`--log-file P.TOOL.rank%q{RANK}.log`), and under initcheck P.nvshmem.<pid>.log, NVSHMEM's
INFO log of its memory subsystem (NVSHMEM_DEBUG=INFO NVSHMEM_DEBUG_SUBSYS=MEM
NVSHMEM_DEBUG_FILE=P.nvshmem.%p.log), where each PE's symmetric heap addresses are read.

What counts: every record the tool printed (a line "========= <text>" and the indented lines
under it) is one error unless a rule below matches it exactly. A log with no summary line
(the tool never finished: killed, or its target never started) is one error; a summary that
counts more errors than the log shows (--print-limit) adds the ones not shown. No tool, kernel
or library is dismissed as a whole: each rule names the record's text, the API or address it
is about and why the tool is wrong there, and a record that differs in any of them counts.

Rules (a new one needs its why, here and in benchmarks/notes/reliability.md):

nccl-kernel-probe (memcheck)
    "Program hit <error 98 or 209> ... on CUDA API call to cudaFuncGetAttributes.", whose
    innermost host frame outside the CUDA driver and runtime is in libnccl, and whose stack
    passes through NVSHMEM's host library (its team setup starts NCCL) or torch's CUDA library
    (ProcessGroupNCCL, Python runs over NCCL). Why: NCCL's init (ncclInitKernelsForDevice)
    asks cudaFuncGetAttributes about each of its kernels and skips those built for no
    architecture this GPU runs, ignoring the error by design: "invalid device function" (98) or
    "no kernel image is available" (209). About 24 per run (NCCL's count of such kernels).
    The same error "on CUDA API call to cudaGetLastError." counts as the probe too when that
    innermost frame is ncclInitKernelsForDevice itself: the NCCL that torch loads (2.28,
    enqueue.cc:52-54) clears the probe's error with cudaGetLastError at once, and the tool
    reports the cleared error a second time (one per probe record in torch's Python runs).
initcheck-ipc-heap (initcheck)
    "Uninitialized __global__ memory read of size N bytes" at an address inside this PE's
    NVSHMEM symmetric heap reservation (its own heap or a peer's heap mapped into it), as
    NVSHMEM's INFO log gives them ("heap base: A ... total S", "Peer Heap Base [i]: B"). Why:
    other PEs are other processes, and their stores into this PE's heap travel through CUDA
    IPC mappings; compute-sanitizer documents that initcheck does not support IPC allocations
    and reports false positives there (release notes, known limitations). What initcheck
    cannot see there the programs check themselves: every output is poisoned before each run,
    so a slot no PE wrote fails the program's own check.
initcheck-ipc-heap-copy (initcheck)
    "Host API memory access error at host access to A of size N bytes" whose one detail line
    is "Uninitialized access to B on access by cudaMemcpy source", with all of [A, A + N) inside
    this PE's heap reservation (as above). Why: the same as initcheck-ipc-heap, seen by a copy
    to the host instead of a kernel: the bytes were stored by another PE's process through its
    IPC mapping of this heap (NVSHMEM's team setup reads back what the root PE broadcast into
    the non-root PEs' heaps, 16 records per run on PE 1 in the logs of 2026-11-27; chapter 5
    reads a result its peers wrote). A copy from device memory outside the heaps, or into it
    (a destination), counts.
cublas-kernel-race (racecheck)
    "Error: Race reported between <Read|Write> access at K+<offset>" whose "and <Read|Write>
    access at K'+<offset>" line names the same kernel, K = K', and K is one of cuBLASLt's GEMM
    kernels (its name starts with nvjet_: the moe-layer's expert GEMMs, through cudarc's
    cuBLAS). Why: both accesses are inside NVIDIA's closed kernel, not this project's code, and
    nothing here can change them; shared memory belongs to one block of one kernel, so a race
    between a cuBLAS access and one of ours cannot exist. The moe-layer test checks every GEMM
    output against its CPU reference, and every kernel of ours in the same run is still
    checked. A race that names any other kernel on either side counts.

Output: each log's records, filtered and left (the left ones printed in full), a TSV row per
log with --tsv, and a last line "sanitizer TOOL: E errors after filtering (R records, F
filtered) in L logs". Exit status 0 when E = 0, 1 otherwise (no log at all counts as an
error). Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
PREFIX = "========="

# ---- compute-sanitizer's log -------------------------------------------------------------


@dataclass
class Record:
    """One report: its first line's text and the indented lines under it (prefix removed)."""

    text: str
    lines: List[str] = field(default_factory=list)

    def show(self) -> str:
        return "\n".join([f"{PREFIX} {self.text}"] + [f"{PREFIX}     {line}" for line in self.lines])


@dataclass
class SanitizerLog:
    records: List[Record]
    summaries: List[str]  # the "... SUMMARY: ..." lines
    summary_errors: int  # what the ERROR/RACECHECK summaries count, added up


SUMMARY = re.compile(r"^(ERROR|RACECHECK|LEAK) SUMMARY:")
ERROR_SUMMARY = re.compile(r"^ERROR SUMMARY: ([\d,]+) errors?")
RACECHECK_SUMMARY = re.compile(r"^RACECHECK SUMMARY: [\d,]+ hazards? displayed \(([\d,]+) errors?, ([\d,]+) warnings?\)")
HEADER = "COMPUTE-SANITIZER"


def number(text: str) -> int:
    return int(text.replace(",", ""))


def parse_log(text: str) -> SanitizerLog:
    """Records start at a prefixed line whose text starts right after one space; lines
    indented further belong to the record above; a bare prefix line ends it."""
    records: List[Record] = []
    summaries: List[str] = []
    summary_errors = 0
    current: Optional[Record] = None
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            current = None  # the program's own output, if it shares the file
            continue
        body = raw[len(PREFIX):]
        if not body.strip():
            current = None
            continue
        if body.startswith(" ") and not body.startswith("  "):
            line = body[1:].rstrip()
            if line == HEADER:
                current = None
            elif SUMMARY.match(line):
                summaries.append(line)
                m = ERROR_SUMMARY.match(line)
                if m:
                    summary_errors += number(m.group(1))
                m = RACECHECK_SUMMARY.match(line)
                if m:
                    summary_errors += number(m.group(1)) + number(m.group(2))
                current = None
            else:
                current = Record(line)
                records.append(current)
        elif current is not None:
            current.lines.append(body.strip())
        else:
            # An indented line with no record above it: keep it visible as a record of its own.
            current = Record(body.strip())
            records.append(current)
    return SanitizerLog(records, summaries, summary_errors)


# ---- NVSHMEM's heap, from its INFO log -----------------------------------------------------

HEAP_BASE = re.compile(r"NVSHMEM INFO \[(\d+)\] heap type: \S+ heap base: (0x[0-9a-fA-F]+) NVSHMEM_SYMMETRIC_SIZE \d+ total (\d+)")
PEER_HEAP_BASE = re.compile(r"NVSHMEM INFO \[(\d+)\] Peer Heap Base \[\d+\]: (0x[0-9a-fA-F]+)")


def heap_ranges(texts: Iterable[str]) -> Dict[int, List[Tuple[int, int]]]:
    """PE -> [begin, end) of its heap and of every peer heap mapped into it (each peer's slot
    is as large as the PE's own heap, NVSHMEM's dynamic VMM layout)."""
    own: Dict[int, List[Tuple[int, int]]] = {}
    peers: Dict[int, List[int]] = {}
    for text in texts:
        for m in HEAP_BASE.finditer(text):
            base, size = int(m.group(2), 16), int(m.group(3))
            own.setdefault(int(m.group(1)), []).append((base, base + size))
        for m in PEER_HEAP_BASE.finditer(text):
            peers.setdefault(int(m.group(1)), []).append(int(m.group(2), 16))
    ranges: Dict[int, List[Tuple[int, int]]] = {}
    for pe, heaps in own.items():
        size = max(end - begin for begin, end in heaps)
        ranges[pe] = heaps + [(base, base + size) for base in peers.get(pe, [])]
    return ranges


# ---- the rules -----------------------------------------------------------------------------

API_ERROR = re.compile(r'^Program hit (\w+) \(error (\d+)\) due to "([^"]*)" on CUDA API call to (\w+)\.?$')
SO_NAME = re.compile(r"([\w./+-]*\.so(?:\.\d+)*)(?![\w.])")
IN_MODULE = re.compile(r"\bin (\S+)$")
CUDA_MODULES = ("libcuda.so", "libcudart.so")
UNINIT_GLOBAL_READ = re.compile(r"^Uninitialized __global__ memory read of size [\d,]+ bytes?\b")
ADDRESS = re.compile(r"^Address (0x[0-9a-fA-F]+)\b")
HOST_ACCESS = re.compile(r"^Host API memory access error at host access to (0x[0-9a-fA-F]+) of size ([\d,]+) bytes?$")
UNINIT_COPY_SOURCE = re.compile(r"^Uninitialized access to (0x[0-9a-fA-F]+) on access by cudaMemcpy source$")
RACE = re.compile(r"^(?:Error|Warning): Race reported between (?:Read|Write) access at ([\w$.]+)\+0x[0-9a-fA-F]+")
RACE_OTHER = re.compile(r"^and (?:Read|Write) access at ([\w$.]+)\+0x[0-9a-fA-F]+")
CUBLAS_KERNEL = "nvjet_"


def frame_module(line: str) -> Optional[str]:
    """The library (or program) of a "Host Frame:" line, in the layouts the tool has used:
    "Host Frame:f() [0x12] in libx.so.2", "Host Frame: [0x12] in libx.so.2",
    "Host Frame:/usr/lib/libx.so.2 [0x12]"."""
    if "Host Frame:" not in line:
        return None
    rest = line.split("Host Frame:", 1)[1].strip()
    libs = SO_NAME.findall(rest)
    if libs:
        return os.path.basename(libs[-1])
    m = IN_MODULE.search(rest)
    return os.path.basename(m.group(1)) if m else ""


@dataclass
class Context:
    tool: str
    rank: Optional[int]
    heaps: Dict[int, List[Tuple[int, int]]]


def nccl_kernel_probe(record: Record, ctx: Context) -> bool:
    m = API_ERROR.match(record.text)
    if ctx.tool != "memcheck" or not m:
        return False
    _, code, _, api = m.groups()
    if api not in ("cudaFuncGetAttributes", "cudaGetLastError") or code not in ("98", "209"):
        return False
    frames = [(mod, line) for line in record.lines if (mod := frame_module(line)) is not None]
    callers = [(mod, line) for mod, line in frames if not mod.startswith(CUDA_MODULES)]
    if not callers or not callers[0][0].startswith("libnccl.so"):
        return False
    if api == "cudaGetLastError" and "ncclInitKernelsForDevice(" not in callers[0][1]:
        return False  # the read-back of the probe's error, nowhere else in NCCL
    return any(mod.startswith(("libnvshmem_host.so", "libtorch_cuda.so")) for mod, _ in callers)


def initcheck_ipc_heap(record: Record, ctx: Context) -> bool:
    if ctx.tool != "initcheck" or not UNINIT_GLOBAL_READ.match(record.text) or ctx.rank is None:
        return False
    addresses = [int(m.group(1), 16) for m in map(ADDRESS.match, record.lines) if m]
    if len(addresses) != 1:
        return False
    return in_heap(ctx, addresses[0], 1)


def in_heap(ctx: Context, address: int, size: int) -> bool:
    """[address, address + size) lies inside one of this PE's heap ranges."""
    return any(begin <= address and address + size <= end for begin, end in ctx.heaps.get(ctx.rank, []))


def initcheck_ipc_heap_copy(record: Record, ctx: Context) -> bool:
    m = HOST_ACCESS.match(record.text)
    if ctx.tool != "initcheck" or not m or ctx.rank is None:
        return False
    sources = [c for c in map(UNINIT_COPY_SOURCE.match, record.lines) if c]
    if len(sources) != 1:
        return False
    begin, size = int(m.group(1), 16), number(m.group(2))
    return in_heap(ctx, begin, size) and in_heap(ctx, int(sources[0].group(1), 16), 1)


def cublas_kernel_race(record: Record, ctx: Context) -> bool:
    m = RACE.match(record.text)
    if ctx.tool != "racecheck" or not m or not record.lines:
        return False
    other = RACE_OTHER.match(record.lines[0])
    return bool(other) and m.group(1) == other.group(1) and m.group(1).startswith(CUBLAS_KERNEL)


RULES: List[Tuple[str, Callable[[Record, Context], bool]]] = [
    ("nccl-kernel-probe", nccl_kernel_probe),
    ("initcheck-ipc-heap", initcheck_ipc_heap),
    ("initcheck-ipc-heap-copy", initcheck_ipc_heap_copy),
    ("cublas-kernel-race", cublas_kernel_race),
]

# ---- one run -------------------------------------------------------------------------------


@dataclass
class Verdict:
    name: str
    records: int
    filtered: Dict[str, int]
    errors: int
    left: List[Record]
    notes: List[str]


RANK_OF_LOG = re.compile(r"\.rank(\d+)\.log$")


def judge(name: str, text: str, ctx: Context) -> Verdict:
    log = parse_log(text)
    filtered = {rule: 0 for rule, _ in RULES}
    left: List[Record] = []
    for record in log.records:
        rule = next((rule for rule, matches in RULES if matches(record, ctx)), None)
        if rule is None:
            left.append(record)
        else:
            filtered[rule] += 1
    notes: List[str] = []
    errors = len(left)
    if not log.summaries:
        notes.append("no summary line: the tool did not finish (killed, or its target never started)")
        errors += 1
    unseen = log.summary_errors - len(log.records)
    if unseen > 0:
        notes.append(f"the summary counts {log.summary_errors} errors, the log shows {len(log.records)} (--print-limit)")
        errors += unseen
    if ctx.tool == "initcheck" and ctx.rank is not None and ctx.rank not in ctx.heaps and left:
        notes.append(f"no NVSHMEM heap line for PE {ctx.rank}: initcheck-ipc-heap could not apply")
    return Verdict(name, len(log.records), filtered, errors, left, notes)


def judge_run(tool: str, prefix: str) -> List[Verdict]:
    logs = sorted(glob.glob(glob.escape(prefix) + f".{tool}.rank*.log"))
    nvshmem_texts = []
    for path in sorted(glob.glob(glob.escape(prefix) + ".nvshmem.*.log")):
        with open(path, errors="replace") as f:
            nvshmem_texts.append(f.read())
    heaps = heap_ranges(nvshmem_texts)
    verdicts = []
    for path in logs:
        m = RANK_OF_LOG.search(path)
        ctx = Context(tool, int(m.group(1)) if m else None, heaps)
        with open(path, errors="replace") as f:
            verdicts.append(judge(os.path.basename(path), f.read(), ctx))
    return verdicts


def report(tool: str, prefix: str, verdicts: List[Verdict], tsv: Optional[str], label: str) -> int:
    records = sum(v.records for v in verdicts)
    filtered = sum(sum(v.filtered.values()) for v in verdicts)
    errors = sum(v.errors for v in verdicts)
    if not verdicts:
        print(f"sanitizer {tool}: no log {prefix}.{tool}.rank*.log: the run never started the tool")
        errors = 1
    for v in verdicts:
        by_rule = ", ".join(f"{rule} {n}" for rule, n in v.filtered.items() if n) or "none"
        print(f"  {v.name}: {v.records} records, filtered: {by_rule}; {v.errors} errors")
        for note in v.notes:
            print(f"    {note}")
        for record in v.left:
            print(record.show())
    if tsv:
        new = not os.path.exists(tsv)
        with open(tsv, "a") as f:
            if new:
                f.write("\t".join(["run", "log", "records"] + [rule for rule, _ in RULES] + ["errors"]) + "\n")
            for v in verdicts:
                row = [label or prefix, v.name, str(v.records)] + [str(v.filtered[rule]) for rule, _ in RULES]
                f.write("\t".join(row + [str(v.errors)]) + "\n")
    print(
        f"sanitizer {tool}: {errors} errors after filtering ({records} records, {filtered} filtered) "
        f"in {len(verdicts)} logs"
    )
    return 0 if errors == 0 else 1


# ---- self-test -----------------------------------------------------------------------------

NCCL_PROBE = """\
========= COMPUTE-SANITIZER
========= Program hit cudaErrorNoKernelImageForDevice (error 209) due to "no kernel image is available for execution on the device" on CUDA API call to cudaFuncGetAttributes.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x4f5fe5] in libcuda.so.1
=========         Host Frame: ncclInitKernelsForDevice(int, int, unsigned long*) [0x6a2c1] in libnccl.so.2
=========         Host Frame: ncclCommInitRankConfig [0x7b3a0] in libnccl.so.2
=========         Host Frame: nvshmemi_team_init [0x1d2e40] in libnvshmem_host.so.3
=========         Host Frame: main [0x4a1f] in ch04-collectives
=========
"""


def self_test() -> int:
    heap_log = (
        "h:1:1 [0] NVSHMEM INFO [1] heap type: N25nvshmemi_symmetric_heap_vidmem_dynamic_vmmE "
        "heap base: 0x7f0000000000 NVSHMEM_SYMMETRIC_SIZE 1073741824 total 2147483648 heapextra 1\n"
        "h:1:1 [0] NVSHMEM INFO [1] Peer Heap Base [0]: 0x7f0080000000\n"
    )
    heaps = heap_ranges([heap_log])
    memcheck, initcheck = Context("memcheck", 0, {}), Context("initcheck", 1, heaps)

    def errors(text: str, ctx: Context) -> int:
        return judge("sample", text, ctx).errors

    summary = "========= ERROR SUMMARY: {} errors\n"
    uninit = (
        "========= Uninitialized __global__ memory read of size 8 bytes\n"
        "=========     at coll_all_to_all_v+0x1a30 in coll_all_to_all.cu:71\n"
        "=========     by thread (0,0,0) in block (0,0,0)\n"
        "=========     Address {}\n=========\n"
    )
    race = (
        "========= Error: Race reported between Write access at coll_all_to_all_v+0x1b0 in coll_all_to_all.cu:89\n"
        "=========     and Read access at coll_all_to_all_v+0x1a0 in coll_all_to_all.cu:83 [508 hazards]\n=========\n"
    )
    def probe(old: str = "", new: str = "", reported: int = 1) -> str:
        return NCCL_PROBE.replace(old, new) + summary.format(reported) if old else NCCL_PROBE + summary.format(reported)

    host_copy = (
        "========= Host API memory access error at host access to {} of size 128 bytes\n"
        "=========     Uninitialized access to {} on access by cudaMemcpy {}\n"
        "=========     Saved host backtrace up to driver entry point at error\n"
        "=========     Host Frame: nvshmemi_team_init_nccl_comm(nvshmemi_team_v3*) [0x12ae94] in libnvshmem_host.so.3\n"
        "=========\n"
    )

    def copy(at: str = "0x7f0000001000", kind: str = "source") -> str:
        return host_copy.format(at, at, kind) + summary.format(1)

    nvjet = "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT"
    gemm_race = (
        f"========= Error: Race reported between Read access at {nvjet}+0xab0\n"
        "=========     and Write access at {}+0x2cd0 [512 hazards]\n=========\n"
    )
    racecheck, synccheck = Context("racecheck", 0, {}), Context("synccheck", 0, {})
    race_summary = "========= RACECHECK SUMMARY: {} hazard displayed ({} error, 0 warnings)\n"
    oob = "========= Invalid __global__ write of size 4 bytes\n=========     at k+0x10 in k.cu:3\n"
    oob += "=========     Address 0x10 is out of bounds\n=========\n"
    err98 = ("cudaErrorNoKernelImageForDevice (error 209)", "cudaErrorInvalidDeviceFunction (error 98)")
    old_frame = "Host Frame:/usr/lib/x86_64-linux-gnu/libnccl.so.2 [0x5a2b1]"
    in_heap = uninit.format("0x7f0000001000") + summary.format(1)
    cases = [
        ("NCCL's probe from NVSHMEM's team setup is filtered", errors(probe(), memcheck), 0),
        ("the probe's error 98 spelling is filtered", errors(probe(*err98), memcheck), 0),
        ("the same error from another API counts", errors(probe("cudaFuncGetAttributes", "cudaLaunchKernel"), memcheck), 1),
        ("the probe's error read back by cudaGetLastError is filtered",
         errors(probe("cudaFuncGetAttributes", "cudaGetLastError"), memcheck), 0),
        ("cudaGetLastError's error elsewhere in NCCL counts",
         errors(probe("cudaFuncGetAttributes.", "cudaGetLastError.").replace("ncclInitKernelsForDevice", "ncclLaunchKernel"), memcheck), 1),
        ("another error code from the probe counts", errors(probe("(error 209)", "(error 2)"), memcheck), 1),
        ("the probe called from our binary, not NCCL, counts", errors(probe("in libnccl.so.2", "in ch04"), memcheck), 1),
        ("NCCL's probe outside NVSHMEM and torch counts", errors(probe("libnvshmem_host.so.3", "libfoo.so"), memcheck), 1),
        ("the probe under another tool counts", errors(probe(), synccheck), 1),
        ("an out-of-bounds write counts", errors(oob + summary.format(1), memcheck), 1),
        ("an uninitialized read in this PE's heap is filtered", errors(in_heap, initcheck), 0),
        ("an uninitialized read in a mapped peer heap is filtered", errors(uninit.format("0x7f0080000010") + summary.format(1), initcheck), 0),
        ("an uninitialized read outside the heaps counts", errors(uninit.format("0x7f0200000000") + summary.format(1), initcheck), 1),
        ("an uninitialized read in another PE's heap counts", errors(in_heap, Context("initcheck", 0, heaps)), 1),
        ("an uninitialized read with no heap log counts", errors(in_heap, Context("initcheck", 1, {})), 1),
        ("a host copy from this PE's heap is filtered", errors(copy(), initcheck), 0),
        ("a host copy from a mapped peer heap is filtered", errors(copy("0x7f0080000010"), initcheck), 0),
        ("a host copy from outside the heaps counts", errors(copy("0x7f0200000000"), initcheck), 1),
        ("a host copy running past the heap's end counts", errors(copy("0x7f00fffffff0"), initcheck), 1),
        ("an uninitialized copy destination counts", errors(copy(kind="destination"), initcheck), 1),
        ("a host copy from another PE's heap counts", errors(copy(), Context("initcheck", 0, heaps)), 1),
        ("a host copy under memcheck counts", errors(copy(), memcheck), 1),
        ("a race inside one cuBLAS kernel is filtered", errors(gemm_race.format(nvjet) + race_summary.format(1, 1), racecheck), 0),
        ("a race between cuBLAS and another kernel counts", errors(gemm_race.format("moe_scatter") + race_summary.format(1, 1), racecheck), 1),
        ("a cuBLAS race under synccheck counts", errors(gemm_race.format(nvjet) + summary.format(1), synccheck), 1),
        ("a race in our kernel counts", errors(race + race_summary.format(1, 1), racecheck), 1),
        ("a clean racecheck log passes", errors("========= COMPUTE-SANITIZER\n" + race_summary.format(0, 0), racecheck), 0),
        ("a log with no summary counts (the tool did not finish)", errors("========= COMPUTE-SANITIZER\n", memcheck), 1),
        ("errors past --print-limit count", errors(probe(reported=5), memcheck), 4),
        ("the program's own output is not a record", errors("120 passed, 0 failed\n" + summary.format(0), memcheck), 0),
        ("a frame in the old layout (path first) is read", frame_module(old_frame), "libnccl.so.2"),
    ]
    failed = [(what, got, want) for what, got, want in cases if got != want]
    for what, got, want in failed:
        print(f"self-test: {what}: got {got!r}, want {want!r}")
    with tempfile.TemporaryDirectory() as tmp:  # the files as gpu_test.sh names them
        prefix = os.path.join(tmp, "ch04-collectives-n2")
        with open(prefix + ".memcheck.rank0.log", "w") as f:
            f.write(NCCL_PROBE + summary.format(1))
        verdicts = judge_run("memcheck", prefix)
        if [(v.records, v.errors) for v in verdicts] != [(1, 0)]:
            failed.append(("judge_run", verdicts, "one log, one record, filtered"))
            print(f"self-test: judge_run found {[(v.name, v.records, v.errors) for v in verdicts]}")
    print(f"self-test: {len(cases) + 1 - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", nargs="?", help="the run's log prefix (LOG_DIR/<bin>-n<N>)")
    parser.add_argument("--tool", choices=TOOLS)
    parser.add_argument("--tsv", help="append one row per log to this TSV file")
    parser.add_argument("--label", default="", help="the run's name in the TSV (default: the prefix)")
    parser.add_argument("--self-test", action="store_true", help="check each rule on sample records")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.prefix or not args.tool:
        parser.error("give --tool and the run's log prefix (or --self-test)")
    return report(args.tool, args.prefix, judge_run(args.tool, args.prefix), args.tsv, args.label)


if __name__ == "__main__":
    sys.exit(main())
