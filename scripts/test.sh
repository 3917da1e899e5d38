#!/usr/bin/env bash
# The full check, as CI runs it: setup (toolchain + release build), formatting, clippy, a
# lint of the shell scripts, the book, host-side tests, then GPU tests when 2+ GPUs are visible.
# On a machine without GPUs the last thing printed is pytest's summary (CPU suite of python/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

step() { printf '\n== test: %s\n' "$*"; }

gpu_count() {
  command -v nvidia-smi >/dev/null || { echo 0; return; }
  { nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true
}

step "setup"
bash scripts/setup.sh

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "shellcheck scripts/*.sh .ci/run"
.venv/bin/shellcheck scripts/*.sh .ci/run
echo "shellcheck: clean"

step "mdbook build book"
mdbook build book

step "cargo test --workspace (includes the book include-anchor check)"
cargo test --workspace

# ---- pytest (Python package) ------------------------------------------------------------
# CPU suite of python/ (import, version, library discovery, errors before init and without a
# GPU). After cargo test: cargo's last lines are the doc-tests of the last crate, often
# "0 passed", so pytest's summary closes a CPU run.
step "pytest python/tests (CPU)"
.venv/bin/python -m pytest -p no:cacheprovider -q python/tests/test_cpu.py
# ------------------------------------------------------------------------------------------

num_gpus=$(gpu_count)
if ((num_gpus >= 2)); then
  step "GPU tests on $num_gpus GPUs"
  bash scripts/gpu_test.sh
fi
