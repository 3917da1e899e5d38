#!/usr/bin/env bash
# Start here. Sets everything up, builds every chapter, runs each chapter on all local GPUs
# (or, without GPUs, the host-side tests), and builds the book.
#
# Usage: scripts/tour.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

step() { printf '\n== tour: %s\n' "$*"; }

step "setup: toolchain, CUDA 13.0 + NVSHMEM 3.4.5, release build"
bash scripts/setup.sh

num_gpus=0
if command -v nvidia-smi >/dev/null; then
  num_gpus=$({ nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true)
fi

status=0
if ((num_gpus == 0)); then
  echo
  echo "No NVIDIA GPU is visible here, so the chapters are built but not run: running the host-side checks instead."
  step "host-side checks: cargo test --workspace"
  cargo test --workspace
else
  step "every chapter under torchrun on all $num_gpus local GPU(s)"
  if ((num_gpus == 1)); then
    echo "Only one GPU: each chapter runs as a single PE (its peer is itself); 2+ GPUs show real traffic."
  fi
  GPU_TEST_NPROCS=$num_gpus bash scripts/gpu_test.sh || status=$?
fi

step "book: mdbook build book"
mdbook build book

echo
if ((num_gpus > 0)); then
  if ((status == 0)); then
    echo "Every chapter passed on $num_gpus GPU(s) (per-run summary above)."
  else
    echo "Some chapter runs failed on $num_gpus GPU(s): see the summary and logs above."
  fi
fi
echo "Read the book: $PWD/book/build/index.html"
exit "$status"
