#!/usr/bin/env bash
# What one call of the GPU machine runs (the device tool, see CONTRIBUTING.md): install the
# carried wheel, run scripts/gpu_test.sh, then optional benchmarks, and pack every log and
# result into $OUT/logs.tgz (the tool brings back few files; one archive holds them all).
#
# Usage: scripts/device_run.sh [gpu_test.sh arguments...]
# Environment: OUT (where results go; required), GPU_TEST_NPROCS, GPU_TEST_PYTHON (as for
#   gpu_test.sh), DEVICE_BENCH (space-separated, run in this order: buffer coll; buffer runs
#   the modes in BUFFER_MODES), DEVICE_GPU_TEST=0 (skip gpu_test.sh), DEVICE_LOGS (folder
#   for logs and results, default a fresh temporary one), CARRY (default .carry: bin/ with the
#   release binaries, wheels/ with the nvshmem_tutorial wheel, deepep/ with DeepEP's source).
# When buffer is asked for and DeepEP is not built yet, its build (about 80 s on 64 cores)
# starts at once in the background, beside gpu_test.sh, and the buffer benchmark waits for it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
: "${OUT:?set OUT to the folder results go to}"
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
carry=${CARRY:-.carry}
logs=${DEVICE_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/device_run.XXXXXX")}
mkdir -p "$logs"
trap 'tar czf "$OUT/logs.tgz" -C "$logs" . ; echo "device_run: logs in $OUT/logs.tgz"' EXIT

if compgen -G "$carry/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$carry"/wheels/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{ date -u; nvidia-smi -L; nvidia-smi topo -m; git log -1 --format='commit %H %s' 2>/dev/null; } >"$logs/machine.txt" 2>&1

deepep_build=
if [[ " ${DEVICE_BENCH:-} " == *" buffer "* && -d "$carry/deepep" ]] && ! compgen -G "$carry/deepep/deep_ep_cpp*.so" >/dev/null; then
  (cd "$carry/deepep" && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=$(nproc) TORCH_CUDA_ARCH_LIST=9.0 \
    python3 setup.py build_ext --inplace >"$logs/deepep_build.log" 2>&1) &
  deepep_build=$!
fi

if [[ "${DEVICE_GPU_TEST:-1}" == 1 ]]; then
  BIN_DIR="$carry/bin" LOG_DIR="$logs" bash scripts/gpu_test.sh "$@" 2>&1 | tee "$logs/gpu_test.log" | tail -25
fi
for bench in ${DEVICE_BENCH:-}; do
  case "$bench" in
    coll) BIN_DIR="$carry/bin" COLL_OUT="$logs" bash benchmarks/run_coll.sh "${GPU_TEST_NPROCS:-2}" >"$logs/run_coll.log" 2>&1 ;;
    buffer)
      if [[ -n "$deepep_build" ]]; then
        wait "$deepep_build" || { echo "device_run: DeepEP build failed"; tail -20 "$logs/deepep_build.log"; }
      fi
      BUFFER_OUT="$logs" BUFFER_LOGS="$logs" bash benchmarks/run_buffer.sh "$carry/deepep" "${GPU_TEST_NPROCS:-2}" >"$logs/run_buffer.log" 2>&1 ;;
    *) echo "device_run: unknown benchmark '$bench'" ;;
  esac
  echo "device_run: $bench exit $?"
done
