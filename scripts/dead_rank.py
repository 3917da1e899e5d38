#!/usr/bin/env python3
"""A rank dies mid-loop: the others must fail and exit, not wait.

Launches N ranks of a chapter program (ch07-buffer: normal mode; ch08-low-latency:
low-latency mode) without torchrun (nothing else may kill the survivors), each running
dispatch/combine pairs in a loop with a short per-buffer timeout, SIGKILLs one rank once the
loop runs, and times how soon every survivor exits. A survivor passes when it exits non-zero
within the timeout plus 10 seconds of the kill; one still running then is a hang (it is killed
and counted as such).

Usage: scripts/dead_rank.py [--bin-dir DIR] [--nprocs 2 4] [--modes normal ll]
                            [--victims first last] [--runs 5] [--timeout-ms 5000]
Ranks are folded onto the GPUs there are (rank r on GPU r % GPUs, as scripts/fold_pes.sh).
Ends with one line `P passed, F failed` (one check per survivor per run).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

PROGRAMS = {"normal": "ch07-buffer", "ll": "ch08-low-latency"}
# A rank's loop has started once it prints this (ch07-buffer before its pairs, ch08-low-latency
# after each of its first cases).
STARTED = ("dispatch/combine pairs in a row", "checks passed")
GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def num_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 1
    return max(1, sum(line.startswith("GPU ") for line in out.splitlines()))


def launch(binary: str, n: int, gpus: int, timeout_ms: int, logs: str) -> list:
    """N ranks with torchrun's variables; rank r on GPU r % gpus."""
    port = free_port()
    procs = []
    for rank in range(n):
        env = dict(os.environ)
        env.update(
            RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank % gpus), LOCAL_WORLD_SIZE=str(n),
            FOLD_LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
            NVSHMEM_DISABLE_NVLS="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        )
        log = open(os.path.join(logs, f"rank{rank}.log"), "w+")
        cmd = [binary, "--pairs", "1000000", "--timeout-ms", str(timeout_ms)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    return procs


def started(log) -> bool:
    log.flush()
    with open(log.name) as f:
        text = f.read()
    return any(mark in text for mark in STARTED)


def one_run(binary: str, n: int, victim: int, gpus: int, timeout_ms: int, logs: str) -> list:
    """Per survivor: (rank, exit code or None for a hang, seconds from the kill to its exit)."""
    procs = launch(binary, n, gpus, timeout_ms, logs)
    try:
        deadline = time.monotonic() + 120
        while not all(started(log) for _, log in procs):
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs):
                raise RuntimeError("the ranks did not all reach their loop")
            time.sleep(0.2)
        time.sleep(1.0)  # well inside the loop
        procs[victim][0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        limit = killed + timeout_ms / 1000 + GRACE_S
        results = {}
        while len(results) < n - 1 and time.monotonic() < limit:
            for rank, (p, _) in enumerate(procs):
                if rank != victim and rank not in results and p.poll() is not None:
                    results[rank] = (p.returncode, time.monotonic() - killed)
            time.sleep(0.05)
        return [(r, *results.get(r, (None, time.monotonic() - killed))) for r in range(n) if r != victim]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default="target/release")
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--modes", nargs="+", default=["normal", "ll"], choices=sorted(PROGRAMS))
    ap.add_argument("--victims", nargs="+", default=["first", "last"], choices=["first", "last"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout-ms", type=int, default=5000)
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    gpus = num_gpus()
    log_root = args.log_dir or tempfile.mkdtemp(prefix="dead_rank.")
    passed = failed = 0
    for mode in args.modes:
        binary = os.path.join(args.bin_dir, PROGRAMS[mode])
        for n in args.nprocs:
            for victim_name in args.victims:
                victim = 0 if victim_name == "first" else n - 1
                for run in range(args.runs):
                    logs = os.path.join(log_root, f"{mode}-n{n}-kill{victim}-run{run}")
                    os.makedirs(logs, exist_ok=True)
                    try:
                        survivors = one_run(binary, n, victim, gpus, args.timeout_ms, logs)
                    except RuntimeError as e:
                        print(f"FAIL  {mode} n={n} kill rank {victim} run {run}: {e} (logs {logs})")
                        failed += n - 1
                        continue
                    for rank, code, seconds in survivors:
                        ok = code is not None and code != 0
                        what = "hung" if code is None else f"exit {code}"
                        print(f"{'PASS' if ok else 'FAIL'}  {mode} n={n} kill rank {victim} run {run}: "
                              f"rank {rank} {what} {seconds:.1f} s after the kill (logs {logs})")
                        passed += ok
                        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
