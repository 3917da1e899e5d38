#!/usr/bin/env bash
# One compute-sanitizer tool over every chapter at N = 2, the chapters dealt out over this
# machine's GPU pairs and run side by side: scripts/gpu_test.sh once per pair, each with its own
# CUDA_VISIBLE_DEVICES, MASTER_PORT and LOG_DIR. A tool's whole run (memcheck and initcheck take
# ~40-60 s a run, mostly the tool's start; 16 runs) then fits one 10-minute device command on a
# 4-GPU machine. With one GPU the two PEs fold onto it (GPU_TEST_PES_PER_GPU=2, under MPS).
#
# Usage: scripts/sanitize_all.sh TOOL [BIN...]   (TOOL: memcheck, racecheck, synccheck, initcheck;
#                                                 default BINs: `scripts/gpu_test.sh --list`)
# Environment:
#   LOG_DIR          where the logs go (default: a fresh temporary directory): pair K's gpu_test
#                    output in LOG_DIR/pairK.log, its per-run logs and TSV under LOG_DIR/pairK/
#   GPU_TEST_PYTHON  default 0 here; 1 also runs the Python scripts (`gpu_test.sh --list-python`),
#                    dealt out over the pairs like the binaries (GPU_TEST_PY per pair)
#   MASTER_PORT      the first pair's (default 29500); pair K's is MASTER_PORT + 1000 K
#   GPU_TEST_SCRIPT  the suite to run per pair (default scripts/gpu_test.sh; the CPU test fakes it)
#   every other GPU_TEST_* knob and BIN_DIR pass through to each pair's gpu_test.sh.
# Chapters go to pairs in reading order, round robin, which spreads the long ones (chapter 5 and
# the buffer's programs run on two topologies each). The last line printed is "<P> passed, <F>
# failed" over all pairs; the exit code is 0 only when every pair's suite passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { printf 'sanitize_all: error: %s\n' "$*" >&2; exit 2; }
tool=${1:-}
case $tool in
  memcheck | racecheck | synccheck | initcheck) shift ;;
  *) die "the first argument is the tool: memcheck, racecheck, synccheck or initcheck (got '$tool')" ;;
esac
suite=${GPU_TEST_SCRIPT:-scripts/gpu_test.sh}
if (($# > 0)); then
  bins=("$@")
else
  mapfile -t bins < <(bash "$suite" --list)
fi
((${#bins[@]} > 0)) || die "no chapter binaries to run"

if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
else
  command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this runs on a GPU machine"
  mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
fi
((${#gpus[@]} > 0)) || die "no GPU visible"
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sanitize_all.XXXXXX")}
mkdir -p "$LOG_DIR"
port=${MASTER_PORT:-29500}

# Pair k: GPUs 2k and 2k+1 (one GPU alone: both PEs on it), and its chapters.
num_pairs=$((${#gpus[@]} / 2))
fold=0
if ((num_pairs == 0)); then
  num_pairs=1
  fold=1
fi
# No pair without binaries (gpu_test.sh with none runs them all): at most one pair per binary.
((num_pairs <= ${#bins[@]})) || num_pairs=${#bins[@]}
groups=()
for i in "${!bins[@]}"; do
  k=$((i % num_pairs))
  groups[k]="${groups[k]:-} ${bins[i]}"
done
# With GPU_TEST_PYTHON=1 the Python runs are dealt out the same way (GPU_TEST_PY per pair).
python=${GPU_TEST_PYTHON:-0}
py_groups=()
if [[ "$python" == 1 ]]; then
  mapfile -t py_runs < <(bash "$suite" --list-python)
  for i in "${!py_runs[@]}"; do
    k=$((i % num_pairs))
    py_groups[k]="${py_groups[k]:-} ${py_runs[i]}"
  done
fi

pids=()
for ((k = 0; k < num_pairs; k++)); do
  if ((fold)); then
    devices=${gpus[0]} per_gpu=2 num=1
  else
    devices=${gpus[2 * k]},${gpus[2 * k + 1]} per_gpu=1 num=2
  fi
  read -r -a group <<<"${groups[k]}"
  py=${py_groups[k]:-}
  py=${py# }
  echo "sanitize_all: $tool, pair $k on GPU(s) $devices: ${group[*]}${py:+; python: $py} -> $LOG_DIR/pair$k.log"
  CUDA_VISIBLE_DEVICES=$devices GPU_TEST_GPUS=$num GPU_TEST_PES_PER_GPU=$per_gpu GPU_TEST_NPROCS=2 \
    GPU_TEST_SANITIZER=$tool GPU_TEST_PYTHON=$((python == 1 && ${#py} > 0)) GPU_TEST_PY=$py \
    MASTER_PORT=$((port + 1000 * k)) LOG_DIR=$LOG_DIR/pair$k bash "$suite" "${group[@]}" >"$LOG_DIR/pair$k.log" 2>&1 &
  pids+=($!)
done

passed=0
failed=0
for k in "${!pids[@]}"; do
  rc=0
  wait "${pids[k]}" || rc=$?
  grep -E '^(PASS|FAIL|SKIP) ' "$LOG_DIR/pair$k.log" || true
  last=$(tail -n 1 "$LOG_DIR/pair$k.log")
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
    ((rc == 0 || BASH_REMATCH[2] > 0)) || failed=$((failed + 1))
  else
    echo "FAIL  pair $k: its suite ended without a summary (exit code $rc; log $LOG_DIR/pair$k.log)"
    failed=$((failed + 1))
  fi
done
echo "compute-sanitizer $tool, per PE: $LOG_DIR/pair*/sanitizer-$tool.tsv"
echo "$passed passed, $failed failed"
((failed == 0))
