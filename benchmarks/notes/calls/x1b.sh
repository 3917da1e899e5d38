#!/bin/bash
# x1 call b: the soak left (issue 28): ch08 at N = 1, ch07 and ch08 folded at N = 2 (10,000 pairs
# with changing routing, every result checked, then 100 buffers made and dropped).
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z /tmp/dr; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*"; }
{ date -u; nvidia-smi -L; } >$Z/machine.txt
OUT=/tmp/dr DEVICE_LOGS=$Z/soak DEVICE_GPU_TEST=0 DEVICE_BENCH=soak SOAK_RUNS="ch08-low-latency:1 ch07-buffer:2 ch08-low-latency:2" \
  timeout 570 bash scripts/device_run.sh >$Z/soak.out 2>&1
el "soak exit $?"; grep -a "soak:" $Z/soak/soak.log; pack
