#!/usr/bin/env bash
# DeepEP's own tests, unmodified, against nvshmem_tutorial: `import deep_ep` finds
# benchmarks/deepep_shim first, which re-exports nvshmem_tutorial's Buffer. The tests come
# from a DeepEP checkout given by path (commit 567632d; fetched into a git-ignored folder,
# never committed). They spawn their own processes (not torchrun), so torchrun's variables
# must not be set: DeepEP's init_dist reads WORLD_SIZE and RANK as the node count and rank.
#
# Usage: benchmarks/deepep_compat.sh DEEPEP_DIR N [test_intranode.py ...]
# Environment: COMPAT_TIMEOUT_S (per test, default 300).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
deepep=${1:?usage: benchmarks/deepep_compat.sh DEEPEP_DIR N [test...]}
n=${2:?usage: benchmarks/deepep_compat.sh DEEPEP_DIR N [test...]}
shift 2
tests=("$@")
((${#tests[@]} > 0)) || tests=(test_intranode.py)
[[ -f "$deepep/tests/test_intranode.py" ]] || { echo "deepep_compat: no tests/test_intranode.py under $deepep" >&2; exit 2; }
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE
shim=$PWD/benchmarks/deepep_shim
status=0
for test in "${tests[@]}"; do
  echo "== deepep_compat: DeepEP's tests/$test --num-processes $n against nvshmem_tutorial"
  (cd "$deepep/tests" && PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --kill-after=30 "${COMPAT_TIMEOUT_S:-300}" python3 "$test" --num-processes "$n")
  rc=$?
  echo "== deepep_compat: $test exit $rc"
  ((rc == 0)) || status=1
done
exit "$status"
