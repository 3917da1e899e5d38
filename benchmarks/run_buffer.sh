#!/usr/bin/env bash
# Chapters 7 and 8's benchmarks on N GPUs of this machine, in one run: DeepEP v1 built here
# from a checkout (never committed), then per mode DeepEP's own test for DeepEP and for
# nvshmem_tutorial (through benchmarks/deepep_shim) and our benchmark for both:
#   normal: tests/test_intranode.py, benchmarks/buffer_bench.py (num_sms swept, DeepEP's
#           timing) -> buffer_<gpu>_ep<N>.csv and .png
#   ll:     tests/test_low_latency.py, benchmarks/buffer_ll_bench.py (profiler kernel times
#           and CUDA-graph replay) -> buffer_ll_<gpu>_ep<N>.csv and .png
#
# Usage: benchmarks/run_buffer.sh DEEPEP_DIR [N]       (default N: 2)
# Environment: BUFFER_OUT (default benchmarks/results), BUFFER_LOGS (default: a temp dir),
#   BUFFER_MODES (default "normal ll"), BUFFER_SWEEP=0 (normal mode: DeepEP's test only, no sweep).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
deepep=$(cd "${1:?usage: benchmarks/run_buffer.sh DEEPEP_DIR [N]}" && pwd)
n=${2:-2}
out=${BUFFER_OUT:-benchmarks/results}
logs=${BUFFER_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/buffer.XXXXXX")}
mkdir -p "$out" "$logs"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
shim=$PWD/benchmarks/deepep_shim

# A checkout that holds its built extension (deep_ep_cpp*.so, e.g. from an earlier run on
# this kind of machine) is used as it is: the build takes two minutes of GPU-machine time.
if compgen -G "$deepep/deep_ep_cpp*.so" >/dev/null; then
  echo "run_buffer: using the DeepEP build in $deepep ($(basename "$deepep"/deep_ep_cpp*.so))"
else
  echo "run_buffer: building DeepEP in $deepep"
  (cd "$deepep" && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=$(nproc) TORCH_CUDA_ARCH_LIST=9.0 \
    python3 setup.py build_ext --inplace >"$logs/deepep_build.log" 2>&1) || { tail -20 "$logs/deepep_build.log"; exit 1; }
fi

modes=${BUFFER_MODES:-normal ll}
if [[ " $modes " == *" normal "* ]]; then
  echo "run_buffer: DeepEP's test_intranode.py, DeepEP"
  (cd "$deepep/tests" && PYTHONPATH="$deepep${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 test_intranode.py \
    --num-processes "$n" >"$logs/test_intranode_deepep_ep$n.log" 2>&1)
  echo "run_buffer: DeepEP's test_intranode.py, ours"
  COMPAT_TIMEOUT_S=300 bash benchmarks/deepep_compat.sh "$deepep" "$n" >"$logs/test_intranode_ours_ep$n.log" 2>&1
  echo "run_buffer: compat exit $?"

  # BUFFER_SWEEP=0 skips the SM sweep of both systems (DeepEP's test above already prints
  # each one's bandwidth; the sweep draws buffer_<gpu>_ep<N>.csv).
  if [[ "${BUFFER_SWEEP:-1}" != 0 ]]; then
    sweep=(--num-sms 8 12 16 20 24 --chunks 8 --combine-chunks 4)
    (cd /tmp && PYTHONPATH="$deepep${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 "$OLDPWD/benchmarks/buffer_bench.py" \
      --method deepep "$logs/deepep.csv" "${sweep[@]}" --num-processes "$n" >"$logs/bench_deepep.log" 2>&1)
    (cd /tmp && PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 "$OLDPWD/benchmarks/buffer_bench.py" \
      --method ours "$logs/ours.csv" "${sweep[@]}" --num-processes "$n" >"$logs/bench_ours.log" 2>&1)
    python3 benchmarks/plot_buffer.py "$out/buffer_${gpu}_ep$n.csv" "$logs/ours.csv" "$logs/deepep.csv"
  fi
fi

if [[ " $modes " == *" ll "* ]]; then
  echo "run_buffer: DeepEP's test_low_latency.py, DeepEP"
  (cd "$deepep/tests" && PYTHONPATH="$deepep${PYTHONPATH:+:$PYTHONPATH}" timeout 400 python3 test_low_latency.py \
    --num-processes "$n" >"$logs/test_low_latency_deepep_ep$n.log" 2>&1)
  echo "run_buffer: DeepEP exit $?"
  echo "run_buffer: DeepEP's test_low_latency.py, ours"
  COMPAT_TIMEOUT_S=400 bash benchmarks/deepep_compat.sh "$deepep" "$n" test_low_latency.py >"$logs/test_low_latency_ours_ep$n.log" 2>&1
  echo "run_buffer: compat exit $?"
  for method in deepep ours; do
    path=$deepep
    [[ $method == ours ]] && path=$shim
    (cd /tmp && PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 "$OLDPWD/benchmarks/buffer_ll_bench.py" \
      --method "$method" "$logs/ll_$method.csv" --num-processes "$n" >"$logs/bench_ll_$method.log" 2>&1)
    echo "run_buffer: ll bench $method exit $?"
  done
  python3 benchmarks/plot_buffer_ll.py "$out/buffer_ll_${gpu}_ep$n.csv" "$logs/ll_ours.csv" "$logs/ll_deepep.csv"
fi
