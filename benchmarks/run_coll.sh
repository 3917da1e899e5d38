#!/usr/bin/env bash
# Chapter 4's benchmark on N GPUs of this machine: ours (ch04-coll-bench), NVSHMEM's own team
# collectives (ch04-coll-bench --nvshmem, with NVSHMEM_DISABLE_NCCL=1: NVSHMEM 3.4.5 otherwise
# hands them to NCCL), NCCL and torch SymmetricMemory (benchmarks/coll_bench.py; torch's
# NVSHMEM-backed all_to_all_vdev in a process of its own, since it loads its own NVSHMEM), all
# timed as CUDA-graph replay in this one run; then the merged CSV and the plots.
# Folded runs (several PEs per GPU) need CUDA MPS for NVSHMEM's team collectives (without it
# NVSHMEM refuses them: "limited MPG"); their timings are never speed.
#
# Usage: benchmarks/run_coll.sh [N]            (default: 2)
# Environment:
#   BIN_DIR        where ch04-coll-bench is (default: target/release)
#   COLL_OUT       where coll_<gpu>_<N>gpu.csv and its plots go (default: benchmarks/results)
#   COLL_TIMEOUT_S wall-clock limit of each of the three runs (default: 300)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# NVLink multicast (NVLS) stays off in every layer.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-8G}
n=${1:-2}
BIN_DIR=${BIN_DIR:-target/release}
out_dir=${COLL_OUT:-benchmarks/results}
timeout_s=${COLL_TIMEOUT_S:-300}
die() { printf 'run_coll: error: %s\n' "$*" >&2; exit 1; }
[[ -x "$BIN_DIR/ch04-coll-bench" ]] || die "no $BIN_DIR/ch04-coll-bench (build with: cargo build --release -p ch04-collectives)"
mkdir -p "$out_dir"
work=$(mktemp -d "${TMPDIR:-/tmp}/coll.XXXXXX")
trap 'rm -rf "$work"' EXIT

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
run() { timeout --kill-after=30 "$timeout_s" torchrun --standalone --nproc_per_node="$n" "$@"; }
run --no-python "$BIN_DIR/ch04-coll-bench" "$work/ours.csv"
inputs=("$work/ours.csv")
# NVSHMEM's own collectives; the CSV's header records NVSHMEM_DISABLE_NCCL.
if NVSHMEM_DISABLE_NCCL=1 run --no-python "$BIN_DIR/ch04-coll-bench" --nvshmem "$work/nvshmem.csv"; then
  inputs+=("$work/nvshmem.csv")
else
  echo "run_coll: warning: NVSHMEM's team collectives failed (above); the CSV has no nvshmem rows" >&2
fi
run benchmarks/coll_bench.py --peers nccl,torch "$work/peers.csv"
run benchmarks/coll_bench.py --peers torch_nvshmem "$work/vdev.csv"
run benchmarks/coll_bench.py --peers ours "$work/ours_python.csv"
inputs+=("$work/peers.csv" "$work/vdev.csv" "$work/ours_python.csv")
python3 benchmarks/plot_coll.py "$out_dir/coll_${gpu}_${n}gpu.csv" "${inputs[@]}"

# Chapter 5 (ch05-hier-bench, when built): every collective hierarchical and flat, and the
# hierarchical plans on NVSHMEM's node and rail teams, on each topology of N PEs: one node of
# N, and virtual nodes of every smaller divisor G (NVSHMEM_TUTORIAL_NODE_PES). On one host the
# "cross-node" steps run over NVLink: these rows compare algorithms, not networks. Each run's
# CSV keeps its own header (layout, GPU, date); they go one after the other into
# hier_<gpu>_<N>gpu.csv.
if [[ -x "$BIN_DIR/ch05-hier-bench" ]]; then
  hier_out="$out_dir/hier_${gpu}_${n}gpu.csv"
  : >"$hier_out"
  for ((g = n; g >= 1; g--)); do
    ((n % g == 0)) || continue
    for peer in ours nvshmem; do
      csv="$work/hier_${peer}_g$g.csv"
      flags=()
      [[ "$peer" == nvshmem ]] && flags=(--nvshmem)
      if NVSHMEM_DISABLE_NCCL=1 NVSHMEM_TUTORIAL_NODE_PES=$g run --no-python \
        "$BIN_DIR/ch05-hier-bench" "${flags[@]}" "$csv"; then
        cat "$csv" >>"$hier_out"
      else
        echo "run_coll: warning: ch05-hier-bench ($peer, nodes of $g) failed (above)" >&2
      fi
    done
  done
  echo "run_coll: chapter 5 rows in $hier_out"
fi
