"""scripts/sanitize_all.sh on the CPU: how it deals chapters out over GPU pairs and merges the
verdicts, with a fake suite standing in for scripts/gpu_test.sh (GPU_TEST_SCRIPT) that records
what each pair was asked to run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sanitize_all.sh"
PYS = ["pytest", "ch01_bootstrap.py", "ch07_buffer.py"]
BINS = ["ch01-bootstrap", "ch02-symmetric-memory", "ch03-put-get", "ch04-collectives", "ch05-inter-node"]

FAKE_SUITE = """#!/usr/bin/env bash
if [[ "${1:-}" == --list ]]; then printf '%s\\n' BINS; exit 0; fi
if [[ "${1:-}" == --list-python ]]; then printf '%s\\n' PYS; exit 0; fi
mkdir -p "$LOG_DIR"
echo "$CUDA_VISIBLE_DEVICES|$GPU_TEST_GPUS|$GPU_TEST_PES_PER_GPU|$GPU_TEST_NPROCS|$GPU_TEST_SANITIZER|$GPU_TEST_PYTHON|$MASTER_PORT|$*|$GPU_TEST_PY" \\
  >"$LOG_DIR/asked"
[[ -z "${FAKE_SILENT:-}" ]] || exit 3
p=0 f=0
for b in "$@"; do
  if [[ "$b" == "${FAKE_FAIL:-none}" ]]; then echo "FAIL  $b n=2 (exit code 1)"; f=$((f + 1));
  else echo "PASS  $b n=2"; p=$((p + 1)); fi
done
echo "$p passed, $f failed"
[[ -z "${FAKE_RC:-}" ]] || exit "$FAKE_RC"
((f == 0))
""".replace("BINS", " ".join(BINS)).replace("PYS", " ".join(PYS))


def run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    suite = tmp_path / "fake_gpu_test.sh"
    suite.write_text(FAKE_SUITE)
    logs = tmp_path / "logs"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_TEST", "CUDA_VISIBLE", "MASTER_PORT"))}
    full.update(GPU_TEST_SCRIPT=str(suite), LOG_DIR=str(logs), **env)
    out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=60)
    return out, logs


def asked(logs: Path, k: int) -> list[str]:
    return (logs / f"pair{k}" / "asked").read_text().strip().split("|")


def test_four_gpus_make_two_pairs_with_the_chapters_dealt_round_robin(tmp_path):
    out, logs = run(tmp_path, "memcheck", CUDA_VISIBLE_DEVICES="0,1,2,3", MASTER_PORT="30000")
    assert out.returncode == 0, out.stdout + out.stderr
    a, b = asked(logs, 0), asked(logs, 1)
    assert a[:7] == ["0,1", "2", "1", "2", "memcheck", "0", "30000"]
    assert b[:7] == ["2,3", "2", "1", "2", "memcheck", "0", "31000"]
    assert a[7].split() == BINS[0::2] and b[7].split() == BINS[1::2]
    assert out.stdout.strip().splitlines()[-1] == "5 passed, 0 failed"
    assert sum(line.startswith("PASS  ") for line in out.stdout.splitlines()) == 5


def test_with_python_the_scripts_are_dealt_out_too(tmp_path):
    out, logs = run(tmp_path, "memcheck", CUDA_VISIBLE_DEVICES="0,1,2,3", GPU_TEST_PYTHON="1")
    assert out.returncode == 0, out.stdout + out.stderr
    a, b = asked(logs, 0), asked(logs, 1)
    assert (a[5], a[8]) == ("1", "pytest ch07_buffer.py") and (b[5], b[8]) == ("1", "ch01_bootstrap.py")


def test_no_pair_is_left_without_binaries(tmp_path):
    # gpu_test.sh with no binaries would run every chapter: one binary uses one pair only, and
    # the Python runs go to the pairs that have binaries.
    out, logs = run(tmp_path, "memcheck", "ch05-inter-node", CUDA_VISIBLE_DEVICES="0,1,2,3", GPU_TEST_PYTHON="1")
    assert out.returncode == 0, out.stdout + out.stderr
    a = asked(logs, 0)
    assert a[7] == "ch05-inter-node" and a[8].split() == PYS
    assert not (logs / "pair1").exists()


def test_one_gpu_folds_both_pes_onto_it(tmp_path):
    out, logs = run(tmp_path, "racecheck", "ch03-put-get", "ch04-collectives", CUDA_VISIBLE_DEVICES="3")
    assert out.returncode == 0, out.stdout + out.stderr
    a = asked(logs, 0)
    assert a[:6] == ["3", "1", "2", "2", "racecheck", "0"]
    assert a[7].split() == ["ch03-put-get", "ch04-collectives"]
    assert not (logs / "pair1").exists()


def test_a_failed_run_fails_the_whole(tmp_path):
    out, _ = run(tmp_path, "initcheck", CUDA_VISIBLE_DEVICES="0,1,2,3", FAKE_FAIL="ch04-collectives")
    assert out.returncode != 0
    assert "FAIL  ch04-collectives n=2" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "4 passed, 1 failed"


def test_a_suite_that_exits_non_zero_after_a_clean_summary_is_a_failure(tmp_path):
    out, _ = run(tmp_path, "memcheck", CUDA_VISIBLE_DEVICES="0,1", FAKE_RC="1")
    assert out.returncode != 0
    assert out.stdout.strip().splitlines()[-1] == "5 passed, 1 failed"


def test_a_suite_that_ends_without_a_summary_is_a_failure(tmp_path):
    out, _ = run(tmp_path, "synccheck", CUDA_VISIBLE_DEVICES="0,1", FAKE_SILENT="1")
    assert out.returncode != 0
    assert "FAIL  pair 0: its suite ended without a summary (exit code 3" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "0 passed, 1 failed"


def test_an_unknown_tool_is_refused_by_name(tmp_path):
    out, logs = run(tmp_path, "leakcheck", CUDA_VISIBLE_DEVICES="0,1")
    assert out.returncode == 2
    assert "memcheck, racecheck, synccheck or initcheck (got 'leakcheck')" in out.stderr
    assert not logs.exists()
