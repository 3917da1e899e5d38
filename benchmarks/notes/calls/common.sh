#!/bin/bash
# Sourced first by the call scripts here (`. .carry/calls/common.sh N`, N naming the call's logs):
# what every call needs. The environment of every run, the one folder a call writes ($Z, packed
# into $OUT/z.tgz after each step: the device tool brings back few files), and the helpers.
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p "$Z"; t0=$SECONDS
W=nvshmem_tutorial-0.1.0-cp39-abi3-linux_x86_64.whl
CALL=${1:-}
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$Z/steps$CALL.log"; }
left() { ((SECONDS - t0 < $1)); }
# Packs every 20 s in the background (a call cut by its bound still brings back its logs) until
# `finish`, which stops it, stamps the end and packs once more.
background_pack() { (while sleep 20; do pack; done) & packer=$!; }
finish() { kill "$packer" 2>/dev/null; el done; pack; }
{ date -u; nvidia-smi -L; git log -1 --format='commit %H %s'; } >"$Z/machine$CALL.txt" 2>&1
# The carried binaries, unpacked into .carry/bin (kept if a call on this machine already did).
unpack_bins() {
  [[ -x .carry/bin/internode-dispatch && -z "${1:-}" ]] && return
  rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
}
# install NAME:WHEEL ...: each wheel into /tmp/site_NAME (kept if there).
install() {
  local w
  for w in "$@"; do
    [[ -d /tmp/site_${w%%:*} ]] || python3 -m pip install -q --no-index --no-deps --target "/tmp/site_${w%%:*}" "${w#*:}"
  done
}
# DeepEP v1 (567632d, carried in .carry/deepep) built in /tmp/deepep_v1 in the background (~75 s
# on 64 cores), unless this machine has it; wait_deepep blocks until the build is over.
build_deepep() {
  if ls /tmp/deepep_v1/deep_ep_cpp*.so >/dev/null 2>&1; then
    echo "deepep build exit 0 (kept)" >"$Z/deepep_build.log"
    return
  fi
  rm -rf /tmp/deepep_v1 && cp -r .carry/deepep /tmp/deepep_v1
  (cd /tmp/deepep_v1 && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=32 TORCH_CUDA_ARCH_LIST=9.0 \
    python3 setup.py build_ext --inplace >"$Z/deepep_build.log" 2>&1
    echo "deepep build exit $?" >>"$Z/deepep_build.log") &
}
wait_deepep() { while ! grep -q "deepep build exit" "$Z/deepep_build.log" 2>/dev/null; do sleep 2; done; }
