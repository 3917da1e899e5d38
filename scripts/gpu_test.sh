#!/usr/bin/env bash
# Run every chapter binary under torchrun on 1, 2, 4 and 8 GPUs (as many as this machine has)
# and check each run: exit code 0 and a line "<N> passed, 0 failed" in its log.
# Never builds: on the GPU machine the binaries are prebuilt and carried in.
#
# Usage: scripts/gpu_test.sh [BIN...]     (default: every binary in CHAPTER_BINS below)
# Environment:
#   BIN_DIR          where the binaries are (default: target/release)
#   LOG_DIR          where the per-run logs go (default: a fresh temporary directory)
#   GPU_TEST_NPROCS  process counts to run, e.g. "2" (default: those of 1 2 4 8 <= GPU count)
#   TORCHRUN         launcher command (default: torchrun on PATH, else python3 -m torch.distributed.run)
#   GPU_TEST_TIMEOUT_S  wall-clock limit of one run, in seconds (default: 300)
#   GPU_TEST_PES_PER_GPU  allow up to this many PEs per GPU (default: 1). Process counts above
#                    the GPU count then run the Rust chapters 2-8 with several PEs sharing a
#                    GPU (scripts/fold_pes.sh): the code paths of 4 and 8 PEs on a 2-GPU
#                    machine, correctness only. Chapter 1 is skipped there (it checks that
#                    NVSHMEM's place of each PE is torchrun's); Python runs at 2 and 4 PEs,
#                    over gloo (NCCL takes one rank per GPU) and without MPS.
#   GPU_TEST_MPS     1 (default): folded runs run under CUDA MPS, so that the PEs of a GPU
#                    run at once (each on its share of the SMs, see scripts/fold_pes.sh), as
#                    NVSHMEM's teams and collectives need; this script starts the MPS daemon
#                    for them and stops it after. 0: folded PEs take turns on the GPU instead.
# Chapter 5 runs once per virtual topology (NODE_SIZES below: N = 4 as 2 nodes of 2, N = 8 as
# 2 nodes of 4 and 4 nodes of 2), logs <bin>-n<N>-g<G>.log, then across two torchrun agents on
# this host (scripts/ch05_two_agents.sh).
# The last line printed is "<P> passed, <F> failed" over all runs; the exit code is 0 only
# when every run passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# NVLink multicast (NVLS) stays off in every layer.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

# Chapter binaries, in reading order. Adding a chapter is one line here.
CHAPTER_BINS=(
  ch01-bootstrap
  ch02-symmetric-memory
  ch03-put-get
  ch04-collectives
  ch05-inter-node
  ch07-buffer
  ch08-low-latency
)

# The node sizes (NVSHMEM_TUTORIAL_NODE_PES) chapter 5 runs at N PEs: "-" is the default
# (torchrun's node: one node of N). Other binaries run once, with the default.
node_sizes() {
  local bin=$1 n=$2
  if [[ "$bin" != ch05-inter-node ]]; then echo -; return; fi
  case $n in
    1) echo - ;;
    2) echo - 1 ;;
    4) echo 2 ;;
    8) echo 4 2 ;;
    *) echo - ;;
  esac
}

step() { printf '\n== gpu_test: %s\n' "$*"; }
die() { printf 'gpu_test: error: %s\n' "$*" >&2; exit 1; }

if (($# > 0)); then
  bins=("$@")
else
  bins=("${CHAPTER_BINS[@]}")
fi

num_gpus=0
if command -v nvidia-smi >/dev/null; then
  num_gpus=$({ nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true)
fi
((num_gpus >= 1)) || die "no NVIDIA GPU visible (nvidia-smi -L lists none); these tests need GPUs"

pes_per_gpu=${GPU_TEST_PES_PER_GPU:-1}
[[ "$pes_per_gpu" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_PES_PER_GPU: '$pes_per_gpu' is not a positive integer"
nprocs=()
for n in ${GPU_TEST_NPROCS:-1 2 4 8}; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_NPROCS: '$n' is not a positive integer"
  if ((n <= num_gpus * pes_per_gpu)); then nprocs+=("$n"); fi
done
((${#nprocs[@]} > 0)) || die "no process count in '${GPU_TEST_NPROCS:-}' fits $num_gpus GPU(s) x $pes_per_gpu PE(s)"

BIN_DIR=${BIN_DIR:-target/release}
timeout_s=${GPU_TEST_TIMEOUT_S:-300}
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_TIMEOUT_S: '$timeout_s' is not a positive integer"
if [[ -n "${LOG_DIR:-}" ]]; then
  mkdir -p "$LOG_DIR"
else
  LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu_test.XXXXXX")
fi

if [[ -n "${TORCHRUN:-}" ]]; then
  read -r -a torchrun <<<"$TORCHRUN"
elif command -v torchrun >/dev/null; then
  torchrun=(torchrun)
elif python3 -c 'import torch.distributed.run' 2>/dev/null; then
  torchrun=(python3 -m torch.distributed.run)
else
  die "torchrun not found: install PyTorch, or set TORCHRUN to the launcher command"
fi

step "$num_gpus GPU(s); process counts: ${nprocs[*]}"
echo "binaries: $BIN_DIR"
echo "logs:     $LOG_DIR"
echo "launcher: ${torchrun[*]}"

# ---- CUDA MPS for folded runs ----------------------------------------------------------------
use_mps=${GPU_TEST_MPS:-1}
[[ "$use_mps" == 0 || "$use_mps" == 1 ]] || die "GPU_TEST_MPS: '$use_mps' is not 0 or 1"
mps_on=0
mps_start() {
  ((use_mps == 1 && mps_on == 0)) || return 0
  command -v nvidia-cuda-mps-control >/dev/null ||
    die "GPU_TEST_MPS=1 but nvidia-cuda-mps-control is not on PATH (GPU_TEST_MPS=0 runs folded PEs without MPS)"
  export CUDA_MPS_PIPE_DIRECTORY="$LOG_DIR/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$LOG_DIR/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || die "could not start the MPS daemon (logs: $CUDA_MPS_LOG_DIRECTORY)"
  mps_on=1
  echo "MPS daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY)"
}
mps_stop() {
  ((mps_on == 1)) || return 0
  echo quit | nvidia-cuda-mps-control || true
  # The daemon exits once its clients are gone; later runs must not connect to it.
  for _ in $(seq 50); do pgrep -f nvidia-cuda-mps-control >/dev/null || break; sleep 0.1; done
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  mps_on=0
}
trap mps_stop EXIT
# ------------------------------------------------------------------------------------------

passed=0
failed=0
results=()
for bin in "${bins[@]}"; do
  if [[ ! -x "$BIN_DIR/$bin" ]]; then
    echo "skipped: $bin (no executable $BIN_DIR/$bin)"
    results+=("SKIP  $bin")
    continue
  fi
  for run in $(for n in "${nprocs[@]}"; do for g in $(node_sizes "$bin" "$n"); do echo "$n:$g"; done; done); do
    n=${run%%:*} g=${run#*:}
    log="$LOG_DIR/$bin-n$n.log"
    node_env=()
    if [[ "$g" != - ]]; then
      log="$LOG_DIR/$bin-n$n-g$g.log"
      node_env=(env "NVSHMEM_TUTORIAL_NODE_PES=$g")
    fi
    fold=()
    where="$n GPU(s)"
    if ((n > num_gpus)); then
      [[ "$bin" != ch01-bootstrap ]] || continue
      fold=(env "FOLD_GPUS=$num_gpus" scripts/fold_pes.sh)
      where="$num_gpus GPU(s), folded: correctness only"
      mps_start
      ((mps_on == 0)) || where="$where, under MPS"
    else
      mps_stop
    fi
    label="$bin n=$n"
    [[ "$g" == - ]] || label="$label (nodes of $g)"
    step "$label, $n PEs on $where -> $log"
    rc=0
    started=$SECONDS
    timeout --kill-after=30 "$timeout_s" "${node_env[@]}" "${torchrun[@]}" --standalone \
      --nproc_per_node="$n" --no-python "${fold[@]}" "$BIN_DIR/$bin" 2>&1 | tee "$log" || rc=$?
    took="$((SECONDS - started)) s"
    if ((${#fold[@]} > 0)); then
      took="$took; folded onto $num_gpus GPU(s)"
      ((mps_on == 0)) || took="$took, MPS"
    fi
    if ((rc == 0)) && grep -Eq '^[0-9]+ passed, 0 failed' "$log"; then
      passed=$((passed + 1))
      results+=("PASS  $label ($took)")
    else
      failed=$((failed + 1))
      if ((rc == 0)); then
        why="no '<N> passed, 0 failed' line"
      elif ((rc == 124 || rc == 137)); then
        why="timed out after $timeout_s s"
      else
        why="exit code $rc"
      fi
      results+=("FAIL  $label ($why; $took; log $log)")
    fi
  done
done

mps_stop

# ---- chapter 5 across two torchrun agents on this host ---------------------------------------
# Two agents (--nnodes=2, c10d rendezvous) of 1 and of 2 processes each, where they fit: their
# nodes are virtual (NVSHMEM's node team spans the host), which chapter 1's placement check and
# chapter 5's topology must accept.
if [[ " ${bins[*]} " == *" ch05-inter-node "* && -x "$BIN_DIR/ch05-inter-node" ]]; then
  for per_agent in 1 2; do
    ((2 * per_agent <= num_gpus * pes_per_gpu)) || continue
    log="$LOG_DIR/ch05-two-agents-x$per_agent.log"
    step "ch05-inter-node across two torchrun agents of $per_agent process(es) -> $log"
    rc=0
    LOG_DIR="$LOG_DIR" BIN_DIR="$BIN_DIR" TORCHRUN="${torchrun[*]}" TWO_AGENTS_TIMEOUT_S="$timeout_s" \
      GPU_TEST_MPS="$use_mps" scripts/ch05_two_agents.sh "$per_agent" 2>&1 | tee "$log" || rc=$?
    if ((rc == 0)); then
      passed=$((passed + 1))
      results+=("PASS  ch05-inter-node two agents x $per_agent")
    else
      failed=$((failed + 1))
      results+=("FAIL  ch05-inter-node two agents x $per_agent (exit code $rc; log $log)")
    fi
  done
fi
# ------------------------------------------------------------------------------------------

# ---- GPU pytest (Python package under torchrun) -----------------------------------------
# The nvshmem_tutorial package, installed or on PYTHONPATH (on the GPU machine: the wheel
# unpacked with pip --target and PYTHONPATH pointing there). Runs with GPU_TEST_PYTHON=0 off.
if [[ "${GPU_TEST_PYTHON:-1}" == 1 ]]; then
  if ! python3 -c 'import nvshmem_tutorial, torch' 2>/dev/null; then
    echo "skipped: python (nvshmem_tutorial or torch not importable by python3)"
    results+=("SKIP  python")
  else
    py_runs=("pytest:python3 -m pytest -p no:cacheprovider -q python/tests/gpu"
      "ch01_bootstrap.py:python3 scripts/ch01_bootstrap.py"
      "ch02_symmetric_memory.py:python3 scripts/ch02_symmetric_memory.py"
      "ch03_put_get.py:python3 scripts/ch03_put_get.py"
      "ch04_collectives.py:python3 scripts/ch04_collectives.py"
      "ch05_inter_node.py:python3 scripts/ch05_inter_node.py"
      "ch07_buffer.py:python3 scripts/ch07_buffer.py"
      "ch07_quickstart.py:python3 scripts/ch07_quickstart.py"
      "ch08_low_latency.py:python3 scripts/ch08_low_latency.py")
    for n in "${nprocs[@]}"; do
      ((n >= 2)) || continue # the suite and the scripts exchange data between PEs
      py_fold=()
      if ((n > num_gpus)); then
        # Folded: torch.distributed over gloo (NCCL takes one rank per GPU; the package picks
        # the backend, nv.process_group_backend). The buffer's scripts take turns on the GPU
        # (no MPS: its default 20 SMs fit a quarter of a GPU, not a quarter of an MPS
        # client's); the others run under MPS (below).
        ((n <= 4)) || continue
        py_fold=(env "FOLD_GPUS=$num_gpus" scripts/fold_pes.sh python3)
      fi
      for entry in "${py_runs[@]}"; do
        name=${entry%%:*}
        read -r -a cmd <<<"${entry#*:}"
        log="$LOG_DIR/py-$name-n$n.log"
        rc=0
        # `python3 -m x` runs as `torchrun ... -m x`; a script path runs as itself; folded,
        # both run as `torchrun --no-python scripts/fold_pes.sh python3 ...`.
        # Folded PEs may use NVSHMEM's on-stream synchronisation and teams only under MPS
        # ("not supported with limited MPG"); the buffer's scripts run folded without it (see
        # above).
        if ((${#py_fold[@]} > 0)) && [[ "$name" != ch07_* && "$name" != ch08_* ]]; then
          mps_start
        else
          mps_stop
        fi
        if ((${#py_fold[@]} > 0)); then
          how="folded over gloo"
          ((mps_on == 0)) || how="$how, under MPS"
          step "python $name, $n PEs on $num_gpus GPU(s), $how -> $log"
          launch=(--no-python "${py_fold[@]}" "${cmd[@]:1}")
        elif [[ "${cmd[1]}" == -m ]]; then
          step "python $name on $n GPU(s) -> $log"
          launch=(-m "${cmd[@]:2}")
        else
          step "python $name on $n GPU(s) -> $log"
          launch=("${cmd[@]:1}")
        fi
        timeout --kill-after=30 "$timeout_s" "${torchrun[@]}" --standalone \
          --nproc_per_node="$n" "${launch[@]}" 2>&1 | tee "$log" || rc=$?
        # pytest: torchrun's exit code says every rank passed; scripts also print the line.
        if ((rc == 0)) && { [[ "$name" == pytest ]] || grep -Eq '^[0-9]+ passed, 0 failed' "$log"; }; then
          passed=$((passed + 1))
          results+=("PASS  python $name n=$n${py_fold:+ (folded over gloo)}")
        else
          failed=$((failed + 1))
          results+=("FAIL  python $name n=$n (exit code $rc; log $log)")
        fi
      done
    done
  fi
fi
# ------------------------------------------------------------------------------------------

step "summary (logs in $LOG_DIR)"
printf '%s\n' "${results[@]}"
if ((passed + failed == 0)); then
  echo "nothing ran: no binary found in $BIN_DIR (build with: cargo build --release --workspace)"
  failed=1
fi
echo "$passed passed, $failed failed"
((failed == 0))
