#!/usr/bin/env bash
# The full check, as CI runs it: setup (toolchain + release build), formatting, clippy, a
# lint of the shell scripts, the book (its generated numbers, its build, and the checks of
# scripts/check_book.py), host-side tests, `pip install ./python` in a fresh
# virtualenv, the kernels for sm_80 as well, then GPU tests when 2+ GPUs are visible.
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

step "shellcheck scripts/*.sh benchmarks/*.sh .ci/run"
.venv/bin/shellcheck scripts/*.sh benchmarks/*.sh .ci/run
echo "shellcheck: clean"

step "book: generated numbers up to date (scripts/gen_book.py --check)"
python3 scripts/gen_book.py --check

step "mdbook build book"
mdbook build book

# Every page as a reader sees it: no development history, no table rendered as pipes, no broken
# link, anchor or image, no listing longer than a screen (scripts/check_book.py says why each).
step "book checks: history, tables, links, listing length (scripts/check_book.py)"
python3 scripts/check_book.py --self-test
python3 scripts/check_book.py

step "cargo test --workspace (includes the book include-anchor check)"
cargo test --workspace

# ---- pip install ./python from a clean virtualenv ------------------------------------------
# What a new user does: clone, make a fresh venv, `pip install ./python`, import. pip builds
# the wheel in its isolated build environment, whose only CUDA compiler and NVSHMEM are the
# wheels python/pyproject.toml requires. So the check builds from an export of the tree (HEAD
# plus uncommitted changes to tracked files, as `git stash create` records them), which has no
# .venv for kernels/build.rs to fall back on. The export, the venv and the cargo target dir
# live in target/pip-check: the export's files carry the commit's time, so an unchanged tree
# does not recompile the kernels (nvcc is most of this step's cost); pip's cache serves the
# wheels.
step "pip install ./python in a fresh virtualenv"
pip_check=$PWD/target/pip-check
tree=$(git stash create 2>/dev/null || true)
rm -rf "$pip_check/src" "$pip_check/venv"
mkdir -p "$pip_check/src"
git archive "${tree:-HEAD}" | tar -x -C "$pip_check/src"
python3 -m venv "$pip_check/venv"
pip_started=$SECONDS
(cd "$pip_check/src" && CARGO_TARGET_DIR="$pip_check/cargo" \
  "$pip_check/venv/bin/python" -m pip install --quiet --disable-pip-version-check ./python)
"$pip_check/venv/bin/python" -c "import nvshmem_tutorial; print(nvshmem_tutorial.__version__)"
echo "pip install ./python: built and imported in $((SECONDS - pip_started)) s"
# ------------------------------------------------------------------------------------------

# ---- kernels for Ampere too --------------------------------------------------------------
# Every kernel must compile for sm_80 (Hopper-only code behind __CUDA_ARCH__ guards, refused at
# run time), so that KERNEL_ARCHS=sm_80,sm_90 is a real option. `cargo check` runs build.rs,
# which is where nvcc compiles; its own target dir leaves the main build untouched.
step "kernels build with KERNEL_ARCHS=sm_80,sm_90"
KERNEL_ARCHS=sm_80,sm_90 CARGO_TARGET_DIR=target/sm80-check cargo check --quiet -p kernels
echo "kernels: every module compiles for sm_80 and sm_90"
# ------------------------------------------------------------------------------------------

# ---- multi-node preflight ---------------------------------------------------------------
# Appendix A's preflight in its reporting mode: it names what a multi-node run would lack
# (here: no RDMA device, said plainly) and exits 0; --require-rdma is for cluster nodes.
step "cluster preflight (scripts/cluster_check.sh, reporting mode)"
bash scripts/cluster_check.sh

# The sanitizer runs' noise filter (scripts/gpu_test.sh GPU_TEST_SANITIZER): its rules against
# sample reports, on the CPU.
step "sanitizer filter self-test (scripts/sanitizer_filter.py)"
python3 scripts/sanitizer_filter.py --self-test

# The timeline figures' reader and drawer (chapter 6, the MoE page): a synthetic torch.profiler
# trace, read, classified, drawn as SVG and CSV, on the CPU.
step "timeline figures self-test (benchmarks/plot_timeline_test.py)"
python3 benchmarks/plot_timeline_test.py
# ------------------------------------------------------------------------------------------

# ---- pytest (Python package) ------------------------------------------------------------
# CPU suite of python/ (import, version, library discovery, errors before init and without a
# GPU). After cargo test: cargo's last lines are the doc-tests of the last crate, often
# "0 passed", so pytest's summary closes a CPU run.
step "pytest python/tests (CPU)"
.venv/bin/python -m pytest -p no:cacheprovider -q python/tests/test_cpu.py python/tests/test_buffer_cpu.py python/tests/test_inter_node_cpu.py python/tests/test_internode_cpu.py python/tests/test_sanitize_all_cpu.py
# ------------------------------------------------------------------------------------------

num_gpus=$(gpu_count)
if ((num_gpus >= 2)); then
  step "GPU tests on $num_gpus GPUs"
  bash scripts/gpu_test.sh
fi
