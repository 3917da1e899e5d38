#!/usr/bin/env bash
# Runs the p2p benchmark (chapter 3) on 2 GPUs of this machine and plots it.
#
# Usage: benchmarks/run_p2p.sh
# Environment:
#   BIN_DIR                 where ch03-p2p-bench is (default: target/release)
#   P2P_BENCH_OUT           where p2p_<gpu>.csv, p2p_<gpu>_sweep.csv and p2p_<gpu>.png go
#                           (default: benchmarks/results)
#   NCCL_LIB                NCCL's libnccl.so.2 (default: the nvidia-nccl wheel of python3)
#   NVSHMEM_SYMMETRIC_SIZE  symmetric heap per PE (default: 4G; the benchmark needs 1 GiB + a bit)
#   P2P_BENCH_TIMEOUT_S     wall-clock limit of the run (default: 480)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# NVLink multicast (NVLS) stays off in every layer.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-4G}
export P2P_BENCH_OUT=${P2P_BENCH_OUT:-benchmarks/results}
BIN_DIR=${BIN_DIR:-target/release}
die() { printf 'run_p2p: error: %s\n' "$*" >&2; exit 1; }

[[ -x "$BIN_DIR/ch03-p2p-bench" ]] || die "no $BIN_DIR/ch03-p2p-bench (build with: cargo build --release -p ch03-put-get)"

# cudarc opens NCCL as libnccl.so (or libnccl.so.13); the wheel ships only libnccl.so.2. A
# private directory with a libnccl.so symlink, first on LD_LIBRARY_PATH, bridges the names.
if [[ -z "${NCCL_LIB:-}" ]]; then
  NCCL_LIB=$(python3 - <<'PY' 2>/dev/null || true
import os, nvidia.nccl
for d in nvidia.nccl.__path__:
    p = os.path.join(d, "lib", "libnccl.so.2")
    if os.path.exists(p):
        print(p)
        break
PY
)
fi
[[ -n "${NCCL_LIB:-}" && -e "$NCCL_LIB" ]] || die "libnccl.so.2 not found: pip install nvidia-nccl-cu13, or set NCCL_LIB"
shim=$(mktemp -d "${TMPDIR:-/tmp}/nccl-shim.XXXXXX")
trap 'rm -rf "$shim"' EXIT
ln -s "$NCCL_LIB" "$shim/libnccl.so"
export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "run_p2p: NCCL $NCCL_LIB; heap $NVSHMEM_SYMMETRIC_SIZE; results in $P2P_BENCH_OUT"

if command -v torchrun >/dev/null; then
  torchrun=(torchrun)
else
  torchrun=(python3 -m torch.distributed.run)
fi
timeout --kill-after=30 "${P2P_BENCH_TIMEOUT_S:-480}" "${torchrun[@]}" --standalone --nproc_per_node=2 \
  --no-python "$BIN_DIR/ch03-p2p-bench"

for csv in "$P2P_BENCH_OUT"/p2p_*.csv; do
  [[ "$csv" == *_sweep.csv ]] && continue
  python3 benchmarks/plot_p2p.py "$csv"
done
