#!/bin/bash
# x4 call 1: gpu_test N=2 at HEAD + ch06/MoE at N=2 (issue 36); internode-notify on 2x1, 2x2, 4x1
# and folded 8 (issue 32 step 3); the rs_ag all-reduce A/B at N=4 and 2 with NCCL (issue 38).
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z/ar /tmp/dr; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*"; }
# 1. internode-notify, real GPUs: N=2 (one node: refusal; nodes of 1) and N=4 (2x2, 4x1)
rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
BIN_DIR=.carry/bin LOG_DIR=$Z/in GPU_TEST_NPROCS="2 4" timeout 150 bash scripts/gpu_test.sh internode-notify 2>&1 | tail -12
el "internode-notify 2 4 done"; pack
# 2. gpu_test N=2 at HEAD (Rust + Python), then chapter 6 and the MoE layer at N=2
OUT=/tmp/dr DEVICE_LOGS=$Z/n2 GPU_TEST_NPROCS=2 DEVICE_BENCH="overlap moe" BENCH_NPROCS=2 \
  timeout 300 bash scripts/device_run.sh 2>&1 | tail -8
el "gpu_test n=2 + overlap + moe done"; pack
# 3. rs_ag A/B
for b in ch04-coll-bench ch04-collectives; do xz -dc ".carry/ab/rs_ag/$b.xz" >"/tmp/$b-rs" && chmod +x "/tmp/$b-rs"; done
export NVSHMEM_SYMMETRIC_SIZE=8G
for n in 4 2; do
  timeout 100 torchrun --standalone --nproc_per_node=$n --no-python /tmp/ch04-collectives-rs >$Z/ar/test.n$n.log 2>&1
  el "rs_ag test n=$n exit $?: $(grep -a 'passed,' $Z/ar/test.n$n.log | tail -1)"; pack
done
for n in 4 2; do
  for v in A R A R; do
    ((SECONDS - t0 > 540)) && break
    bin=.carry/bin/ch04-coll-bench; [[ $v == R ]] && bin=/tmp/ch04-coll-bench-rs
    COLL_ONLY=all_reduce timeout 60 torchrun --standalone --nproc_per_node=$n --no-python $bin \
      "$Z/ar/$v.n$n.$SECONDS.csv" >"$Z/ar/$v.n$n.$SECONDS.log" 2>&1
    el "all_reduce $v n=$n exit $?"
  done
  COLL_ONLY=all_reduce timeout 60 torchrun --standalone --nproc_per_node=$n benchmarks/coll_bench.py \
    --peers nccl "$Z/ar/N.n$n.csv" >"$Z/ar/N.n$n.log" 2>&1
  el "nccl n=$n exit $?"; pack
done
el done; pack
