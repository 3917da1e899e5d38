#!/usr/bin/env bash
# What one call of the GPU machine runs (the device tool, see CONTRIBUTING.md): install the
# carried wheel, run scripts/gpu_test.sh, then optional benchmarks, and pack every log and
# result into $OUT/logs.tgz (the tool brings back few files; one archive holds them all).
#
# Usage: scripts/device_run.sh [gpu_test.sh arguments...]
# Environment: OUT (where results go; required), GPU_TEST_NPROCS, GPU_TEST_PYTHON (as for
#   gpu_test.sh), DEVICE_BENCH (space-separated steps, run in the order given: buffer coll p2p
#   deepep_n1 host_path soak dead_rank sanitizer deepep_v2 overlap moe timeline ab; buffer, coll,
#   overlap (chapter 6's two benchmarks, Rust and Python), moe (scripts/moe_layer.py --bench),
#   timeline (scripts/ch06_overlap.py and scripts/moe_layer.py --timeline: torch.profiler
#   traces of serial and overlapped, drawn by benchmarks/plot_timeline.py as
#   timeline_<script>_<gpu>_<N>gpu_<case>.json/.svg/.csv) and deepep_v2 run once per
#   process count in BENCH_NPROCS (default: GPU_TEST_NPROCS, else 2), buffer the modes in
#   BUFFER_MODES; p2p runs benchmarks/run_p2p.sh on GPUs 0 and 1; sanitizer runs
#   gpu_test.sh once per tool in SANITIZER_TOOLS (default "memcheck racecheck synccheck") at
#   SANITIZER_NPROCS (default 2); deepep_v2 runs benchmarks/deepep_v2.sh; deepep_n1 runs
#   DeepEP's test_low_latency.py at N = 1 for DeepEP and for ours, and our test_intranode.py
#   as far as N = 1 goes; host_path runs benchmarks/host_path.py for both; soak runs the
#   chapter programs with --pairs SOAK_PAIRS (default 10000) and --create-destroy 100, one run
#   per PROGRAM:N in SOAK_RUNS (default chapters 7 and 8 at N = 1, then folded N = 2);
#   dead_rank runs scripts/dead_rank.py with DEAD_RANK_ARGS; ab runs
#   benchmarks/ab_wheels.sh per process count in BENCH_NPROCS, AB_ROUNDS rounds (default 3), of
#   the wheel AB_OLD (default the first in CARRY/ab/*/) against AB_NEW (default the carried one)),
#   DEVICE_GPU_TEST=0 (skip gpu_test.sh), DEVICE_WHEEL and DEVICE_BINS (a wheel and a
#   bins.tar.xz to use instead of the carry's, e.g. a patched build under CARRY/ab/), DEVICE_LOGS (folder
#   for logs and results, default a fresh temporary one), CARRY (default .carry, as
#   scripts/build_carry.sh makes it: bins.tar.xz with the release binaries, unpacked here into
#   bin/; wheels/ with the nvshmem_tutorial wheel; deepep/ with DeepEP's source).
# When buffer is asked for and DeepEP is not built yet, its build (about 80 s on 64 cores)
# starts at once in the background, beside gpu_test.sh, and the buffer benchmark waits for it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
: "${OUT:?set OUT to the folder results go to}"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
carry=${CARRY:-.carry}
logs=${DEVICE_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/device_run.XXXXXX")}
mkdir -p "$logs"
# The archive is rewritten after every step, so a call cut short by its time limit still
# brings back what the finished steps logged.
pack() { tar czf "$OUT/logs.tgz" -C "$logs" . 2>/dev/null || true; }
trap 'pack; echo "device_run: logs in $OUT/logs.tgz"' EXIT

# scripts/build_carry.sh packs the binaries (each embeds every cubin: unpacked they exceed the
# carry limit).
bins=${DEVICE_BINS:-$carry/bins.tar.xz}
if [[ -f "$bins" ]]; then
  rm -rf "${carry:?}/bin"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bins" "$carry"
fi

wheel=${DEVICE_WHEEL:-$(compgen -G "$carry/wheels/*.whl" | head -1)}
if [[ -n "$wheel" ]]; then
  # --upgrade: a later call on the same warm machine may bring another build of the same version.
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$wheel"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{ date -u; nvidia-smi -L; nvidia-smi topo -m; git log -1 --format='commit %H %s' 2>/dev/null
  echo "wheel: ${wheel:-none}; bins: $bins"; } >"$logs/machine.txt" 2>&1

deepep_build=
if [[ " ${DEVICE_BENCH:-} " =~ \ (buffer|deepep_n1|host_path)\  && -d "$carry/deepep" ]] && ! compgen -G "$carry/deepep/deep_ep_cpp*.so" >/dev/null; then
  (cd "$carry/deepep" && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=$(nproc) TORCH_CUDA_ARCH_LIST=9.0 \
    python3 setup.py build_ext --inplace >"$logs/deepep_build.log" 2>&1) &
  deepep_build=$!
fi

if [[ "${DEVICE_GPU_TEST:-1}" == 1 ]]; then
  BIN_DIR="$carry/bin" LOG_DIR="$logs" bash scripts/gpu_test.sh "$@" 2>&1 | tee "$logs/gpu_test.log" | tail -25
  pack
fi
wait_deepep() {
  if [[ -n "$deepep_build" ]]; then
    wait "$deepep_build" || { echo "device_run: DeepEP build failed"; tail -20 "$logs/deepep_build.log"; }
    deepep_build=
  fi
}
# `torchrun` on N local ranks of BIN with ARGS, folded onto the GPUs there are (fold_pes.sh).
fold_run() {
  local n=$1 bin=$2
  shift 2
  local gpus
  gpus=$(nvidia-smi -L | grep -c '^GPU ')
  if ((n > gpus)); then
    torchrun --standalone --nproc_per_node="$n" --no-python env "FOLD_GPUS=$gpus" scripts/fold_pes.sh "$bin" "$@"
  else
    torchrun --standalone --nproc_per_node="$n" --no-python "$bin" "$@"
  fi
}
bench_nprocs=${BENCH_NPROCS:-${GPU_TEST_NPROCS:-2}}
# The GPU in result file names (h100, h200), as benchmarks/run_coll.sh names its CSVs.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
for bench in ${DEVICE_BENCH:-}; do
  case "$bench" in
    deepep_n1)
      wait_deepep
      { (cd "$carry/deepep/tests" && PYTHONPATH="$PWD/..${PYTHONPATH:+:$PYTHONPATH}" timeout 200 python3 test_low_latency.py --num-processes 1)
        echo "deepep_n1: DeepEP test_low_latency exit $?"
        COMPAT_TIMEOUT_S=200 bash benchmarks/deepep_compat.sh "$carry/deepep" 1 test_low_latency.py
        echo "deepep_n1: ours test_low_latency exit $?"
        COMPAT_TIMEOUT_S=60 bash benchmarks/deepep_compat.sh "$carry/deepep" 1 test_intranode.py
        echo "deepep_n1: ours test_intranode exit $? (DeepEP's own stops at its kernel assertion at N = 1)"
      } >"$logs/deepep_n1.log" 2>&1 ;;
    host_path)
      wait_deepep
      { timeout 200 python3 benchmarks/host_path.py --system ours
        (cd /tmp && PYTHONPATH="$OLDPWD/$carry/deepep${PYTHONPATH:+:$PYTHONPATH}" timeout 200 python3 "$OLDPWD/benchmarks/host_path.py" --system deepep)
      } >"$logs/host_path.log" 2>&1 ;;
    soak)
      { for run in ${SOAK_RUNS:-ch07-buffer:1 ch08-low-latency:1 ch07-buffer:2 ch08-low-latency:2}; do
          fold_run "${run#*:}" "$carry/bin/${run%%:*}" --pairs "${SOAK_PAIRS:-10000}" --create-destroy 100
          echo "soak: ${run%%:*} n=${run#*:} exit $?"
          pack
        done
      } >"$logs/soak.log" 2>&1 ;;
    dead_rank)
      # shellcheck disable=SC2086 # DEAD_RANK_ARGS is a list of options
      python3 scripts/dead_rank.py --bin-dir "$carry/bin" --log-dir "$logs/dead_rank" ${DEAD_RANK_ARGS:-} >"$logs/dead_rank.log" 2>&1 ;;
    coll)
      for n in $bench_nprocs; do
        BIN_DIR="$carry/bin" COLL_OUT="$logs" bash benchmarks/run_coll.sh "$n" >"$logs/run_coll_n$n.log" 2>&1
        echo "device_run: coll n=$n exit $?"
        pack
      done ;;
    p2p) CUDA_VISIBLE_DEVICES=0,1 BIN_DIR="$carry/bin" P2P_BENCH_OUT="$logs" bash benchmarks/run_p2p.sh >"$logs/run_p2p.log" 2>&1 ;;
    buffer)
      wait_deepep
      for n in $bench_nprocs; do
        mkdir -p "$logs/buffer_n$n"
        BUFFER_OUT="$logs" BUFFER_LOGS="$logs/buffer_n$n" bash benchmarks/run_buffer.sh "$carry/deepep" "$n" >"$logs/run_buffer_n$n.log" 2>&1
        echo "device_run: buffer n=$n exit $?"
        pack
      done ;;
    overlap)
      for n in $bench_nprocs; do
        { torchrun --standalone --nproc_per_node="$n" --no-python "$carry/bin/ch06-overlap-bench" \
            "$logs/overlap_${gpu}_${n}gpu.csv"
          echo "device_run: ch06-overlap-bench n=$n exit $?"
          torchrun --standalone --nproc_per_node="$n" scripts/ch06_overlap.py --bench \
            "$logs/overlap_py_${gpu}_${n}gpu.csv"
          echo "device_run: ch06_overlap.py --bench n=$n exit $?"
          python3 benchmarks/plot_overlap.py "$logs/overlap_py_${gpu}_${n}gpu.csv"
        } >"$logs/overlap_n$n.log" 2>&1
        pack
      done ;;
    moe)
      for n in $bench_nprocs; do
        torchrun --standalone --nproc_per_node="$n" scripts/moe_layer.py --bench \
          "$logs/moe_layer_${gpu}_${n}gpu.csv" >"$logs/moe_n$n.log" 2>&1
        echo "device_run: moe_layer.py --bench n=$n exit $?"
        pack
      done ;;
    timeline)
      for n in $bench_nprocs; do
        for script in ch06_overlap moe_layer; do
          torchrun --standalone --nproc_per_node="$n" "scripts/$script.py" \
            --timeline "$logs/timeline_${script}_${gpu}_${n}gpu" >"$logs/timeline_${script}_n$n.log" 2>&1
          echo "device_run: $script.py --timeline n=$n exit $?"
          pack
        done
      done ;;
    sanitizer)
      for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
        mkdir -p "$logs/sanitizer_$tool"
        GPU_TEST_SANITIZER=$tool GPU_TEST_NPROCS=${SANITIZER_NPROCS:-2} BIN_DIR="$carry/bin" LOG_DIR="$logs/sanitizer_$tool" \
          bash scripts/gpu_test.sh >"$logs/sanitizer_$tool.log" 2>&1
        echo "device_run: sanitizer $tool exit $?"
        pack
      done ;;
    deepep_v2)
      for n in $bench_nprocs; do
        bash benchmarks/deepep_v2.sh "$carry" "$n" "$logs/deepep_v2_n$n" >"$logs/deepep_v2_n$n.log" 2>&1
        echo "device_run: deepep_v2 n=$n exit $?"
        pack
      done ;;
    ab)
      old=${AB_OLD:-$(compgen -G "$carry/ab/*/*.whl" | head -1)}
      for n in $bench_nprocs; do
        bash benchmarks/ab_wheels.sh "$old" "${AB_NEW:-$(compgen -G "$carry/wheels/*.whl" | head -1)}" "$logs/ab_n$n" \
          "${AB_ROUNDS:-3}" "$n" >"$logs/ab_n$n.log" 2>&1
        echo "device_run: ab n=$n exit $?"
        pack
      done ;;
    *) echo "device_run: unknown benchmark '$bench'" ;;
  esac
  echo "device_run: $bench exit $?"
  pack
done
