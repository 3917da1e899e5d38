#!/usr/bin/env bash
# Run every chapter binary under torchrun on 1, 2, 4 and 8 GPUs (as many as this machine has)
# and check each run: exit code 0 and a line "<N> passed, 0 failed" in its log.
# Never builds: on the GPU machine the binaries are prebuilt and carried in.
#
# Usage: scripts/gpu_test.sh [BIN...]     (default: every binary in CHAPTER_BINS below)
#        scripts/gpu_test.sh --list       (prints CHAPTER_BINS, one a line, and exits;
#                                          --list-python: the Python runs' names)
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
#   GPU_TEST_GPUS    use this many GPUs (default: every GPU nvidia-smi lists), with
#                    CUDA_VISIBLE_DEVICES naming them: two suites side by side on one machine,
#                    e.g. CUDA_VISIBLE_DEVICES=2,3 GPU_TEST_GPUS=2 beside a benchmark on 0 and 1
#   GPU_TEST_MPS     1 (default): folded runs run under CUDA MPS, so that the PEs of a GPU
#                    run at once (each on its share of the SMs, see scripts/fold_pes.sh), as
#                    NVSHMEM's teams and collectives need; this script starts the MPS daemon
#                    for them and stops it after. 0: folded PEs take turns on the GPU instead.
#   GPU_TEST_SANITIZER  memcheck, racecheck, synccheck or initcheck: every chapter run, Rust and
#                    Python, runs each PE under `compute-sanitizer --tool <tool>` (inside
#                    torchrun, after scripts/fold_pes.sh when folded), with smaller sizes and
#                    raised timeouts where a program takes them; a run passes only when
#                    scripts/sanitizer_filter.py counts 0 errors after its documented rules.
#                    Each PE's report: <log>.<tool>.rank<R>.log; one row per PE in
#                    $LOG_DIR/sanitizer-<tool>.tsv. Chapter 5's two-agent launch is skipped.
#   COMPUTE_SANITIZER   the compute-sanitizer binary (default: on PATH, else /usr/local/cuda/bin)
#   GPU_TEST_SANITIZER_TIMEOUT_MS  the bound on every wait a program lets us set, under a
#                    sanitizer (default 300000: 5x the bootstrap's 60 s, 3x the buffer's 100 s)
#   GPU_TEST_SANITIZER_PAIRS  dispatch/combine pairs in a row of ch07-buffer and ch08-low-latency
#                    under a sanitizer (default 4; they run 200 and 50 without one), and of
#                    ch07_buffer.py and ch08_low_latency.py (NVSHMEM_TUTORIAL_PAIRS; 1000 and 200)
#   GPU_TEST_NODE_SIZES  the node sizes to run chapter 5, the low-latency mode and the internode
#                    steps at, instead of the table below (e.g. "4" for 2 nodes of 4 only at
#                    N = 8; "-" is one node): one topology per device call when each is long
#   GPU_TEST_LL_PAIRS  round trips in a row, no cleaning, of ch08-low-latency on each virtual
#                    topology (default 1000; its one-node runs keep their own 50)
#   GPU_TEST_PY      the Python runs to make, by name (e.g. "pytest ch08_low_latency.py@g2";
#                    default: all of them)
# Chapter 5 runs once per virtual topology (NODE_SIZES below: N = 4 as 2 nodes of 2, N = 8 as
# 2 nodes of 4 and 4 nodes of 2), logs <bin>-n<N>-g<G>.log, then across two torchrun agents on
# this host (scripts/ch05_two_agents.sh). The buffer's low-latency mode (ch08-low-latency) runs
# on the same topologies plus nodes of 1 (every peer through NVSHMEM's RMA calls), and the
# Python script ch08_low_latency.py once as 2 nodes of 2 (at N = 4). The internode notify
# (internode-notify, issue 32 step 3) runs on every topology of several nodes: 2 x 1, 2 x 2,
# 4 x 1, 2 x 4, 4 x 2, 8 x 1 (and at N = 1, 2 as one node, where it checks the refusal); the
# internode dispatch and combine (internode-dispatch, steps 4 and 5: 1,000 dispatch and
# combine pairs per topology) on the same.
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
  ch06-overlap
  ch07-buffer
  ch08-low-latency
  internode-notify
  internode-dispatch
  moe-layer
)

# The Python runs (name:command), by name in GPU_TEST_PY; "name@gG" runs the script again on
# virtual nodes of G PEs (at N = 4 only).
PYTHON_RUNS=(
  "pytest:python3 -m pytest -p no:cacheprovider -q python/tests/gpu"
  "ch01_bootstrap.py:python3 scripts/ch01_bootstrap.py"
  "ch02_symmetric_memory.py:python3 scripts/ch02_symmetric_memory.py"
  "ch03_put_get.py:python3 scripts/ch03_put_get.py"
  "ch04_collectives.py:python3 scripts/ch04_collectives.py"
  "ch05_inter_node.py:python3 scripts/ch05_inter_node.py"
  "ch06_overlap.py:python3 scripts/ch06_overlap.py"
  "ch07_buffer.py:python3 scripts/ch07_buffer.py"
  "ch07_quickstart.py:python3 scripts/ch07_quickstart.py"
  "ch08_low_latency.py:python3 scripts/ch08_low_latency.py"
  "ch08_low_latency.py@g2:python3 scripts/ch08_low_latency.py"
  "ch09_internode_buffer.py:python3 scripts/ch09_internode_buffer.py"
  "ch09_internode_buffer.py@g2:python3 scripts/ch09_internode_buffer.py"
  "moe_layer.py:python3 scripts/moe_layer.py"
)

# `gpu_test.sh --list`: the chapter binaries, one a line; `--list-python`: the Python runs' names
# (scripts/sanitize_all.sh deals both out over GPU pairs).
if [[ "${1:-}" == --list ]]; then
  printf '%s\n' "${CHAPTER_BINS[@]}"
  exit 0
fi
if [[ "${1:-}" == --list-python ]]; then
  printf '%s\n' "${PYTHON_RUNS[@]%%:*}"
  exit 0
fi

# The node sizes (NVSHMEM_TUTORIAL_NODE_PES) chapter 5 and the buffer's low-latency mode run at
# N PEs: "-" is the default (torchrun's node: one node of N). Other binaries run once, with the
# default.
node_sizes() {
  local bin=$1 n=$2
  if [[ -n "${GPU_TEST_NODE_SIZES:-}" ]]; then
    case $bin in
      ch05-inter-node | ch08-low-latency | internode-notify | internode-dispatch) echo "$GPU_TEST_NODE_SIZES" ;;
      *) echo - ;;
    esac
    return
  fi
  case $bin in
    ch05-inter-node)
      case $n in
        1) echo - ;;
        2) echo - 1 ;;
        4) echo 2 ;;
        8) echo 4 2 ;;
        *) echo - ;;
      esac ;;
    ch08-low-latency)
      case $n in
        2) echo - 1 ;;
        4) echo - 2 ;;
        8) echo - 4 2 1 ;;
        *) echo - ;;
      esac ;;
    internode-notify | internode-dispatch)
      # "-" (one node) checks that the buffer is refused; the others run the notify (dispatch).
      case $n in
        2) echo - 1 ;;
        4) echo 2 1 ;;
        8) echo 4 2 1 ;;
        *) echo - ;;
      esac ;;
    *) echo - ;;
  esac
}
step() { printf '\n== gpu_test: %s\n' "$*"; }
die() { printf 'gpu_test: error: %s\n' "$*" >&2; exit 1; }

ll_pairs=${GPU_TEST_LL_PAIRS:-1000}
[[ "$ll_pairs" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_LL_PAIRS: '$ll_pairs' is not a positive integer"

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
if [[ -n "${GPU_TEST_GPUS:-}" ]]; then
  if ! [[ "$GPU_TEST_GPUS" =~ ^[1-9][0-9]*$ ]] || ((GPU_TEST_GPUS > num_gpus)); then
    die "GPU_TEST_GPUS: '$GPU_TEST_GPUS' is not a GPU count from 1 to $num_gpus"
  fi
  [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]] ||
    die "GPU_TEST_GPUS=$GPU_TEST_GPUS needs CUDA_VISIBLE_DEVICES naming those GPUs (e.g. 2,3)"
  num_gpus=$GPU_TEST_GPUS
fi

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

# ---- compute-sanitizer (GPU_TEST_SANITIZER) -------------------------------------------------
# Each PE is one process: `torchrun --no-python [fold_pes.sh] compute-sanitizer ... PROGRAM`.
# The tool's flags (compute-sanitizer --help; its manual for the record formats):
#   --target-processes all   also the processes a PE starts (python3's, say)
#   --log-file F.rank%q{RANK}.log   the tool's reports, one file per PE, apart from the output
#   --print-limit 5000       enough for the known noise (about 24 records a PE; ch06-overlap's
#                            heap copies under initcheck, ~500 a call, hence its --calls 2); a
#                            summary that counts more than the log shows fails the run
#                            (sanitizer_filter.py: an unprinted record cannot be classified)
#   --show-backtrace yes     the host stack of an API error: the NCCL rule reads it
#   memcheck:  --report-api-errors explicit   errors of API calls made by code (ours, NVSHMEM's,
#              NCCL's); not the runtime's internal calls nor the driver's log ("extended")
#   racecheck: --racecheck-report analysis    one record per race (a pair of accesses), each an
#              error or a warning; warnings count as errors here
#   initcheck: --check-api-memory-access yes  also cudaMemcpy/cudaMemset reading unset memory;
#              NVSHMEM's INFO log (NVSHMEM_DEBUG=INFO, subsystem MEM) records each PE's heap
#              addresses for the filter's IPC rule
#   synccheck: the defaults
# No --error-exitcode: the tool would exit non-zero on the known noise too, and torchrun ends
# the other PEs when one exits non-zero, cutting their reports short. The verdict is
# sanitizer_filter.py's count of what is left after its rules (each rule, with its why, is in
# that file's docstring); a PE whose program fails still fails the run by its exit code.
# Under a sanitizer the programs run many times slower (the tool's known limitations), so every
# timeout a program takes is raised (NVSHMEM_TUTORIAL_TIMEOUT_MS, the bootstrap;
# NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS, the Python buffer; --timeout-ms, the Rust buffer) and the
# soak loops run GPU_TEST_SANITIZER_PAIRS pairs (--pairs). Chapters 1-5 have no such knobs:
# their sizes stay, and so do the in-kernel 10 s bounds of chapters 3-5.
sanitizer=${GPU_TEST_SANITIZER:-}
san_cmd=()
if [[ -n "$sanitizer" ]]; then
  case $sanitizer in
    memcheck) san_tool_args=(--report-api-errors explicit) ;;
    racecheck) san_tool_args=(--racecheck-report analysis) ;;
    initcheck) san_tool_args=(--check-api-memory-access yes) ;;
    synccheck) san_tool_args=() ;;
    *) die "GPU_TEST_SANITIZER: '$sanitizer' is not memcheck, racecheck, synccheck or initcheck" ;;
  esac
  compute_sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  [[ -x "$compute_sanitizer" ]] ||
    die "compute-sanitizer not found (not on PATH nor in /usr/local/cuda/bin): set COMPUTE_SANITIZER to it"
  san_timeout_ms=${GPU_TEST_SANITIZER_TIMEOUT_MS:-300000}
  san_pairs=${GPU_TEST_SANITIZER_PAIRS:-4}
  [[ "$san_timeout_ms" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_SANITIZER_TIMEOUT_MS: '$san_timeout_ms' is not a positive integer"
  [[ "$san_pairs" =~ ^[1-9][0-9]*$ ]] || die "GPU_TEST_SANITIZER_PAIRS: '$san_pairs' is not a positive integer"
  san_cmd=("$compute_sanitizer" --tool "$sanitizer" --target-processes all --print-limit 5000
    --show-backtrace yes "${san_tool_args[@]}")
  export NVSHMEM_TUTORIAL_TIMEOUT_MS=$san_timeout_ms NVSHMEM_TUTORIAL_BUFFER_TIMEOUT_MS=$san_timeout_ms
  # The Python scripts' pairs in a row (ch07_buffer.py 1000, ch08_low_latency.py 200), as the
  # Rust programs take --pairs (scripts/ch00_common.py's pairs_in_a_row).
  export NVSHMEM_TUTORIAL_PAIRS=$san_pairs
fi

# The compute-sanitizer command of one run whose logs start with PREFIX (none without a
# sanitizer), in san_run; stale reports of an earlier run into the same LOG_DIR go first.
sanitize() {
  local prefix=$1
  san_run=()
  [[ -n "$sanitizer" ]] || return 0
  rm -f "$prefix.$sanitizer".rank*.log "$prefix".nvshmem.*.log
  san_run=("${san_cmd[@]}" --log-file "$prefix.$sanitizer.rank%q{RANK}.log")
  if [[ "$sanitizer" == initcheck ]]; then
    san_run=(env NVSHMEM_DEBUG=INFO NVSHMEM_DEBUG_SUBSYS=MEM "NVSHMEM_DEBUG_FILE=$prefix.nvshmem.%p.log"
      "${san_run[@]}")
  fi
}

# Under a sanitizer: the errors of the run at PREFIX (label LABEL) after the documented rules,
# appended to its log; non-zero status when any is left. Without one: nothing, status 0.
sanitizer_verdict() {
  local prefix=$1 label=$2
  [[ -n "$sanitizer" ]] || return 0
  python3 scripts/sanitizer_filter.py --tool "$sanitizer" --tsv "$LOG_DIR/sanitizer-$sanitizer.tsv" \
    --label "$label" "$prefix" 2>&1 | tee -a "$prefix.log"
}
# The filter's last line for a run's log ("sanitizer TOOL: E errors after filtering (...)").
sanitizer_line() { grep -E '^sanitizer [a-z]+: [0-9]+ errors after filtering' "$1" | tail -1 || true; }
# ------------------------------------------------------------------------------------------

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
if [[ -n "$sanitizer" ]]; then
  echo "sanitizer: ${san_cmd[*]} (waits bounded at $san_timeout_ms ms, $san_pairs soak pairs)"
fi

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
  # A server that a faulted or killed client left behind does not quit: it would fail every
  # later run ("could not open the GPU"), so it goes by force.
  if pgrep -f 'nvidia-cuda-mps-(control|server)' >/dev/null; then
    echo "MPS daemon did not quit: killed"
    pkill -9 -f 'nvidia-cuda-mps-(control|server)' || true
    sleep 1
  fi
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
    sanitize "${log%.log}"
    args=() # the soak options of chapters 7 and 8 (src/bin/shared/soak.rs)
    if [[ "$bin" == ch08-low-latency && "$g" != - ]]; then
      args=(--pairs "$ll_pairs") # the issue's 1,000 round trips with no cleaning, per topology
    fi
    if [[ -n "$sanitizer" ]]; then
      where="$where, under compute-sanitizer $sanitizer"
      if [[ "$bin" == ch07-buffer || "$bin" == ch08-low-latency || "$bin" == internode-notify ||
        "$bin" == internode-dispatch ]]; then
        args=(--pairs "$san_pairs" --timeout-ms "$san_timeout_ms")
      elif [[ "$bin" == ch06-overlap ]]; then
        args=(--calls 2) # each call copies peers' heap rows: initcheck's ipc-heap-copy records
      fi
    fi
    step "$label, $n PEs on $where -> $log"
    rc=0
    started=$SECONDS
    timeout --kill-after=30 "$timeout_s" "${node_env[@]}" "${torchrun[@]}" --standalone \
      --nproc_per_node="$n" --no-python "${fold[@]}" "${san_run[@]}" "$BIN_DIR/$bin" "${args[@]}" 2>&1 |
      tee "$log" || rc=$?
    took="$((SECONDS - started)) s"
    if ((${#fold[@]} > 0)); then
      took="$took; folded onto $num_gpus GPU(s)"
      ((mps_on == 0)) || took="$took, MPS"
    fi
    san_rc=0
    sanitizer_verdict "${log%.log}" "$label" || san_rc=$?
    [[ -z "$sanitizer" ]] || took="$took; $(sanitizer_line "$log")"
    if ((rc == 0 && san_rc == 0)) && grep -Eq '^[0-9]+ passed, 0 failed' "$log"; then
      passed=$((passed + 1))
      results+=("PASS  $label ($took)")
    else
      failed=$((failed + 1))
      if ((rc == 0 && san_rc != 0)) && grep -Eq '^[0-9]+ passed, 0 failed' "$log"; then
        why="compute-sanitizer $sanitizer found errors"
      elif ((rc == 0)); then
        why="no '<N> passed, 0 failed' line"
      elif ((rc == 124 || rc == 137)); then
        why="timed out after $timeout_s s"
      else
        why="exit code $rc"
      fi
      results+=("FAIL  $label ($why; $took; log $log)")
      # A failed run under MPS can leave the server faulted: a fresh one for the next run.
      mps_stop
    fi
  done
done

mps_stop

# ---- chapter 5 across two torchrun agents on this host ---------------------------------------
# Two agents (--nnodes=2, c10d rendezvous) of 1 and of 2 processes each, where they fit: their
# nodes are virtual (NVSHMEM's node team spans the host), which chapter 1's placement check and
# chapter 5's topology must accept.
# Not under a sanitizer: scripts/ch05_two_agents.sh launches its own torchrun agents.
if [[ -n "$sanitizer" && " ${bins[*]} " == *" ch05-inter-node "* ]]; then
  echo "skipped: ch05-inter-node two agents (not under a sanitizer: ch05_two_agents.sh starts its own torchrun)"
  results+=("SKIP  ch05-inter-node two agents (not under compute-sanitizer)")
elif [[ " ${bins[*]} " == *" ch05-inter-node "* && -x "$BIN_DIR/ch05-inter-node" ]]; then
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
    # The suite and most scripts exchange data between PEs: they start at 2. Chapter 5's
    # script also runs alone (one node of one PE: every method's path through one PE), and so
    # do chapter 6's and the MoE layer's (their own rows only; the peers skipped, and said so).
    runs_alone=" ch05_inter_node.py ch06_overlap.py moe_layer.py "
    for n in "${nprocs[@]}"; do
      py_fold=()
      if ((n > num_gpus)); then
        # Folded: torch.distributed over gloo (NCCL takes one rank per GPU; the package picks
        # the backend, nv.process_group_backend). The buffer's scripts take turns on the GPU
        # (no MPS: its default 20 SMs fit a quarter of a GPU, not a quarter of an MPS
        # client's); the others run under MPS (below).
        ((n <= 4)) || continue
        py_fold=(env "FOLD_GPUS=$num_gpus" scripts/fold_pes.sh)
      fi
      for entry in "${PYTHON_RUNS[@]}"; do
        name=${entry%%:*}
        ((n >= 2)) || [[ "$runs_alone" == *" $name "* ]] || continue
        [[ -z "${GPU_TEST_PY:-}" || " $GPU_TEST_PY " == *" $name "* ]] || continue
        read -r -a cmd <<<"${entry#*:}"
        log="$LOG_DIR/py-$name-n$n.log"
        # name@gG: the script again on virtual nodes of G PEs (at N = 4 only: 2 nodes of 2).
        py_node=()
        if [[ "$name" == *@g* ]]; then
          ((n == 4)) || continue
          py_node=(env "NVSHMEM_TUTORIAL_NODE_PES=${name##*@g}")
        fi
        rc=0
        # `python3 -m x` runs as `torchrun ... -m x`; a script path runs as itself; folded,
        # both run as `torchrun --no-python scripts/fold_pes.sh python3 ...`; under a sanitizer,
        # as `torchrun --no-python [scripts/fold_pes.sh] compute-sanitizer ... python3 ...`.
        # Folded PEs may use NVSHMEM's on-stream synchronisation and teams only under MPS
        # ("not supported with limited MPG"); the buffer's scripts run folded without it (see
        # above).
        if ((${#py_fold[@]} > 0)) && [[ "$name" != ch07_* && "$name" != ch08_* && "$name" != moe_* ]]; then
          mps_start
        else
          mps_stop
        fi
        sanitize "${log%.log}"
        under=""
        [[ -z "$sanitizer" ]] || under=", under compute-sanitizer $sanitizer"
        if ((${#py_fold[@]} > 0)); then
          how="folded over gloo"
          ((mps_on == 0)) || how="$how, under MPS"
          step "python $name, $n PEs on $num_gpus GPU(s), $how$under -> $log"
          launch=(--no-python "${py_fold[@]}" "${san_run[@]}" "${cmd[@]}")
        elif [[ -n "$sanitizer" ]]; then
          step "python $name on $n GPU(s)$under -> $log"
          launch=(--no-python "${san_run[@]}" "${cmd[@]}")
        elif [[ "${cmd[1]}" == -m ]]; then
          step "python $name on $n GPU(s) -> $log"
          launch=(-m "${cmd[@]:2}")
        else
          step "python $name on $n GPU(s) -> $log"
          launch=("${cmd[@]:1}")
        fi
        timeout --kill-after=30 "$timeout_s" "${py_node[@]}" "${torchrun[@]}" --standalone \
          --nproc_per_node="$n" "${launch[@]}" 2>&1 | tee "$log" || rc=$?
        san_rc=0
        sanitizer_verdict "${log%.log}" "python $name n=$n" || san_rc=$?
        san_note=""
        [[ -z "$sanitizer" ]] || san_note="; $(sanitizer_line "$log")"
        # pytest: torchrun's exit code says every rank passed; scripts also print the line.
        if ((rc == 0 && san_rc == 0)) && { [[ "$name" == pytest ]] || grep -Eq '^[0-9]+ passed, 0 failed' "$log"; }; then
          passed=$((passed + 1))
          results+=("PASS  python $name n=$n${py_fold:+ (folded over gloo)}$san_note")
        else
          failed=$((failed + 1))
          results+=("FAIL  python $name n=$n (exit code $rc$san_note; log $log)")
        fi
      done
    done
  fi
fi
# ------------------------------------------------------------------------------------------

step "summary (logs in $LOG_DIR)"
printf '%s\n' "${results[@]}"
[[ -z "$sanitizer" ]] || echo "compute-sanitizer $sanitizer, per PE: $LOG_DIR/sanitizer-$sanitizer.tsv"
if ((passed + failed == 0)); then
  echo "nothing ran: no binary found in $BIN_DIR (build with: cargo build --release --workspace)"
  failed=1
fi
echo "$passed passed, $failed failed"
((failed == 0))
