#!/bin/bash
# x4 call 6 (prepared 2026-11-27): compute-sanitizer memcheck (GPUs 0,1) and initcheck (GPUs 2,3)
# side by side at N = 2, one PE per GPU, over the Rust runs c5 did not reach (issue 35; c5 cut
# both at chapter 5): 9 runs per tool at ~55 s each. Chapter 5 alone under memcheck with a long
# bound and NVSHMEM_DEBUG=INFO timestamps is a call of its own (it did not finish in 150 s).
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*" | tee -a $Z/steps6.log; }
{ date -u; nvidia-smi -L; git log -1 --format='commit %H %s'; } >$Z/machine6.txt 2>&1
rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
BINS="ch06-overlap ch07-buffer ch08-low-latency internode-notify internode-dispatch moe-layer"
san() {  # san <tool> <pair> <port>
  CUDA_VISIBLE_DEVICES=$2 MASTER_PORT=$3 GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=$1 \
    GPU_TEST_TIMEOUT_S=150 BIN_DIR=.carry/bin LOG_DIR=$Z/san_$1 timeout $((585 - SECONDS + t0)) \
    bash scripts/gpu_test.sh $BINS >$Z/san_$1.log 2>&1
  el "$1 exit $?: $(tail -1 $Z/san_$1.log)"; pack
}
san memcheck 0,1 18361 &
san initcheck 2,3 28361 &
wait
el done; pack
