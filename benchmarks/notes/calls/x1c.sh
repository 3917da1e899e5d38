#!/bin/bash
# x1 call c: compute-sanitizer over every chapter at N = 2 folded (issues 35 and 31), one tool (SAN).
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z /tmp/dr; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
{ date -u; nvidia-smi -L; } >$Z/machine.txt
OUT=/tmp/dr DEVICE_LOGS=$Z/san DEVICE_GPU_TEST=0 DEVICE_BENCH=sanitizer SANITIZER_TOOLS=${SAN:-racecheck} \
  GPU_TEST_PES_PER_GPU=2 SANITIZER_NPROCS=2 timeout 570 bash scripts/device_run.sh "$@" >$Z/san.out 2>&1
echo "[$((SECONDS - t0)) s] sanitizer exit $?"; tail -5 $Z/san/sanitizer_*.log; pack
