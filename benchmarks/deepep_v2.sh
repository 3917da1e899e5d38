#!/usr/bin/env bash
# DeepEP V2 (deepseek-ai/DeepEP main: `ElasticBuffer` over NCCL's device API "Gin", kernels
# compiled at run time) on N GPUs of this machine, intranode over NVLink, timed by V2's own
# tests/elastic/test_ep.py beside DeepEP v1 and ours. V2 needs NCCL >= 2.30.4 and, before NCCL
# 2.31, the NCCL it runs with must be the one it was compiled against; torch brings 2.28.9, so
# the NCCL carried in CARRY/nccl.tar.xz goes first (LD_PRELOAD, and a sys.path overlay that
# torch's own CUDA-library preloading finds first) and DeepEP checks that only that one is
# mapped. No RDMA NICs here: EP_DISABLE_GIN=1 keeps V2 off Gin (its intranode path, PR #630).
# Steps, each bounded by a timeout: unpack NCCL and copy the source into V2_WORK; build DeepEP
# V2 there in place (a build of the same source found there is reused); preflight (prints the
# NCCL version torch and DeepEP load); then per run in V2_RUNS a test_ep.py run, on a copy whose
# test-mode loop is cut to fp8 then bf16 dispatch (bf16 combine always), no bias, no events:
#   auto        4096 tokens x 7168, top-8 of 256 experts, SMs from V2's get_theoretical_num_sms
#               as test_ep.py calls it (prefer_overlap_with_compute=0: at least 64 SMs)
#   analytical  the same at V2's analytical SM count (prefer_overlap_with_compute=1, the
#               ElasticBuffer default: 22 SMs at EP2 on H100/H200 NVLink)
#   sm24        the same at 24 SMs (DeepEP v1's setting in shared/ANCHORS.md)
#   ll          128 tokens x 7168, top-8 of 288, fp8 dispatch, analytical SMs: V2 has no separate
#               low-latency kernels (one ElasticBuffer API for both); this is its decode shape
#   legacy_ll   (not by default) tests/legacy/test_low_latency.py: v1's NVSHMEM low-latency
#               kernels as kept in V2's tree
# test_ep.py prints per rank "dispatch: .. GB/s (SU), T us" (SU: bytes received over NVLink /
# dispatch kernel time; the copy epilogue to the output tensors is timed apart as "copy:") and
# "combine: .. GB/s (SU), T us | reduce: .." likewise; they are echoed at the end of each run.
#
# Usage: benchmarks/deepep_v2.sh [CARRY] [N] [OUT_DIR]   (defaults: .carry, 2, a temp dir)
#   CARRY holds nccl.tar.xz (nccl/lib/libnccl.so.2 + nccl/include, NCCL 2.30.7 for sm_90) and
#   deepep_v2/ (DeepEP V2 source with the fmt headers); OUT_DIR gets every raw log and
#   deepep_v2_epN.csv (benchmarks/deepep_v2_rows.py: the normal-shape runs as method deepep_v2). Relative
#   paths are taken from the repository root.
# Environment: V2_WORK (default /tmp/deepep_v2; kept on a warm machine, so later calls reuse the
#   build and the JIT cache), V2_RUNS (default "auto analytical sm24 ll"), V2_BUILD_TIMEOUT_S
#   (default 480), V2_TEST_TIMEOUT_S (per run, default 300), PYTHON (default python3),
#   V2_CUDA_HOME (default /usr/local/cuda: nvcc for the build and the JIT, CCCL headers).
# The build (about 2 min on 64 cores, like v1's) and four runs may not fit one 10-minute device
# call: split V2_RUNS over calls to one warm machine (the second reuses V2_WORK's build).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
carry=$(cd "${1:-.carry}" && pwd) || { echo "deepep_v2: no carry folder ${1:-.carry}" >&2; exit 2; }
n=${2:-2}
out=${3:-$(mktemp -d "${TMPDIR:-/tmp}/deepep_v2.XXXXXX")}
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=${V2_WORK:-/tmp/deepep_v2}
py=${PYTHON:-python3}
runs=${V2_RUNS:-auto analytical sm24 ll}
test_timeout=${V2_TEST_TIMEOUT_S:-300}
cuda=${V2_CUDA_HOME:-/usr/local/cuda}
die() { echo "deepep_v2: FAILED at step '$1': $2" >&2; exit 1; }
echo "deepep_v2: carry $carry, EP$n, logs in $out, work dir $work"
echo "deepep_v2: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -"$n" | sort | uniq -c | xargs)"

# 1. Inputs: NCCL unpacked, source copied (the carried folder itself stays as it came).
[[ -f "$carry/nccl.tar.xz" ]] || die inputs "no $carry/nccl.tar.xz"
[[ -f "$carry/deepep_v2/setup.py" && -f "$carry/deepep_v2/tests/elastic/test_ep.py" ]] || die inputs "no DeepEP V2 source in $carry/deepep_v2"
[[ -x "$cuda/bin/nvcc" ]] || die inputs "no $cuda/bin/nvcc (the JIT compiles kernels with it)"
mkdir -p "$work" || die inputs "cannot create $work"
nccl=$work/nccl
rm -rf "$nccl"
# (python's tarfile, as scripts/device_run.sh does: the GPU machine may lack the xz program)
timeout 120 "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
  "$carry/nccl.tar.xz" "$work" || die unpack_nccl "cannot unpack $carry/nccl.tar.xz"
[[ -f "$nccl/lib/libnccl.so.2" && -f "$nccl/include/nccl.h" && -f "$nccl/include/nccl_device.h" ]] ||
  die unpack_nccl "nccl.tar.xz lacks nccl/lib/libnccl.so.2 or nccl/include/{nccl.h,nccl_device.h}"
# Built on Debian 12: needs glibc >= 2.34 and libstdc++ with GLIBCXX_3.4.30 (GCC >= 12).
timeout 60 "$py" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$nccl/lib/libnccl.so.2" >"$out/nccl_load.log" 2>&1 ||
  die load_nccl "the carried libnccl.so.2 does not load here: $(tail -1 "$out/nccl_load.log")"
echo "deepep_v2: carried NCCL $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v = v (v ? "." : "") $3} END {print v}' "$nccl/include/nccl.h")"
# sys.path overlay: torch's _preload_cuda_deps takes the first nvidia/nccl/lib/libnccl.so.* on
# sys.path; this one is the same file as the LD_PRELOAD one, so only one NCCL gets mapped.
mkdir -p "$work/overlay/nvidia/nccl/lib" && ln -sf "$nccl/lib/libnccl.so.2" "$work/overlay/nvidia/nccl/lib/libnccl.so.2"

stamp=$( (cd "$carry/deepep_v2" && find . -type f ! -name '*.so' -print0 | sort -z | xargs -0 sha1sum
  sha1sum <"$carry/nccl.tar.xz") | sha1sum | cut -c1-16)
src=$work/deepep
if compgen -G "$src/deep_ep/_C*.so" >/dev/null && [[ "$(cat "$src/.v2_stamp" 2>/dev/null)" == "$stamp" ]]; then
  echo "deepep_v2: reusing the build in $src ($(basename "$src"/deep_ep/_C*.so))"
else
  { rm -rf "$src" && cp -a "$carry/deepep_v2" "$src"; } || die copy_source "cp $carry/deepep_v2 -> $src failed"
  # 2. Build in place against torch, the NVSHMEM wheel (v1 kernels still in the tree) and the
  # carried NCCL (EP_NCCL_ROOT_DIR; the extension gets an rpath to it).
  echo "deepep_v2: building DeepEP V2 in $src ($(nproc) jobs)"
  t0=$SECONDS
  (cd "$src" && CUDA_HOME=$cuda CPATH=$cuda/include/cccl EP_NCCL_ROOT_DIR=$nccl MAX_JOBS=$(nproc) \
    TORCH_CUDA_ARCH_LIST=9.0 timeout --kill-after=30 "${V2_BUILD_TIMEOUT_S:-480}" "$py" setup.py build_ext --inplace \
    >"$out/build.log" 2>&1) || { tail -30 "$out/build.log" >&2; die build "setup.py build_ext failed or timed out (log: $out/build.log)"; }
  compgen -G "$src/deep_ep/_C*.so" >/dev/null || die build "no deep_ep/_C*.so after the build (log: $out/build.log)"
  echo "$stamp" >"$src/.v2_stamp"
  echo "deepep_v2: built in $((SECONDS - t0)) s"
fi
{ readelf -d "$src"/deep_ep/_C*.so | grep -E 'NEEDED.*(nccl|nvshmem)|R(UN)?PATH'; } >"$out/linkage.txt" 2>&1

# 3. Environment of every run (only the test processes get the LD_PRELOAD, not the build).
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export NCCL_DEBUG=${NCCL_DEBUG:-VERSION}  # each rank prints "NCCL version 2.30.7+cuda.."
export CUDA_HOME=$cuda EP_NCCL_ROOT_DIR=$nccl EP_DISABLE_GIN=1 EP_BUFFER_DEBUG=1 EP_JIT_CACHE_DIR=$work/jit
export PYTHONPATH=$work/overlay:$src${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
preload=$nccl/lib/libnccl.so.2${LD_PRELOAD:+:$LD_PRELOAD}

# 4. Preflight: which NCCL torch and DeepEP really load (DeepEP's import asserts one libnccl,
# byte-identical to the carried one).
LD_PRELOAD=$preload timeout 180 "$py" - >"$out/preflight.log" 2>&1 <<'EOF'
import torch, torch.distributed
v = torch.cuda.nccl.version()
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL loaded by torch: {".".join(map(str, v))}')
import deep_ep
maps = sorted({line.split()[-1] for line in open('/proc/self/maps') if 'libnccl' in line})
print(f'deep_ep {deep_ep.__version__} from {deep_ep.__file__}; libnccl mapped: {maps}')
assert len(maps) == 1, f'more than one NCCL mapped: {maps}'
import ctypes; rv = ctypes.c_int(); ctypes.CDLL(maps[0]).ncclGetVersion(ctypes.byref(rv)); print('NCCL at run time', rv.value); assert rv.value >= 23004, rv.value
EOF
rc=$?
cat "$out/preflight.log"
((rc == 0)) || die preflight "torch/deep_ep import with the carried NCCL failed (log: $out/preflight.log)"

# 5. test_ep.py with its mode loop cut to the two dispatch dtypes (V2_FP8_MODES, read by the
# spawned ranks too).
bench=$src/tests/elastic/test_ep_bench.py
timeout 30 "$py" - "$src/tests/elastic/test_ep.py" "$bench" <<'EOF' || die patch_test "enumerate_ep_modes not found in test_ep.py"
import re, sys
code = open(sys.argv[1]).read()
new = '''def enumerate_ep_modes():
    # deepep_v2.sh: handle copy, alignment 1, fp8 and/or bf16 dispatch, no bias, no events
    for use_fp8_dispatch in [int(v) for v in os.environ.get('V2_FP8_MODES', '1 0').split()]:
        yield (1, 1, use_fp8_dispatch, 0, 0, 0, 0)


'''
code, count = re.subn(r'def enumerate_ep_modes\(\):.*?\n\n\n(?=def launch)', lambda _: new, code, flags=re.S)
assert count == 1
open(sys.argv[2], 'w').write(code)
EOF

std=(--num-processes "$n" --hidden 7168 --num-topk 8 --allow-hybrid-mode 0)
failed=()
port=8361
for run in $runs; do
  fp8_modes="1 0"
  case "$run" in
    auto) args=("${std[@]}" --num-tokens 4096 --num-experts 256 --num-sms 0) ;;
    analytical) args=("${std[@]}" --num-tokens 4096 --num-experts 256 --num-sms 0 --prefer-overlap-with-compute 1) ;;
    sm24) args=("${std[@]}" --num-tokens 4096 --num-experts 256 --num-sms 24) ;;
    ll) args=("${std[@]}" --num-tokens 128 --num-experts 288 --num-sms 0 --prefer-overlap-with-compute 1)
      fp8_modes=1 ;;
    legacy_ll) args=() ;;
    *) echo "deepep_v2: unknown run '$run'"; failed+=("$run"); continue ;;
  esac
  port=$((port + 1))
  log=$out/v2_${run}_ep$n.log
  echo "== deepep_v2: run $run (EP$n) -> $log"
  t0=$SECONDS
  if [[ $run == legacy_ll ]]; then
    (cd "$src/tests/legacy" && MASTER_PORT=$port LD_PRELOAD=$preload timeout --kill-after=30 "$test_timeout" \
      "$py" test_low_latency.py --num-processes "$n" >"$log" 2>&1)
  else
    (cd "$src/tests/elastic" && MASTER_PORT=$port V2_FP8_MODES=$fp8_modes LD_PRELOAD=$preload \
      timeout --kill-after=30 "$test_timeout" "$py" test_ep_bench.py "${args[@]}" >"$log" 2>&1)
  fi
  rc=$?
  echo "deepep_v2: run $run exit $rc in $((SECONDS - t0)) s"
  grep -m2 -h 'NCCL version' "$log"
  grep -h -E '#SM|Testing with|SM approximation|[*@] EP: .*(dispatch|combine):|Dispatch|Combine|Failed to get NVLink' "$log" | head -40
  if ((rc != 0)); then
    tail -15 "$log"
    failed+=("$run")
  fi
done
((${#failed[@]} == 0)) || die "run(s) ${failed[*]}" "see $out/v2_<run>_ep$n.log"
echo "deepep_v2: all runs passed; logs in $out"
# The normal-shape runs as rows of buffer_bench's CSV (method deepep_v2).
if compgen -G "$out/v2_*_ep$n.log" >/dev/null; then
  "$py" benchmarks/deepep_v2_rows.py --ep "$n" --out "$out/deepep_v2_ep$n.csv" "$out"/v2_*_ep"$n".log || true
fi
