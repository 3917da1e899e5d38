#!/bin/bash
# x4 call 6 (prepared 2026-11-27): compute-sanitizer memcheck (GPUs 0,1) and initcheck (GPUs 2,3)
# side by side at N = 2, one PE per GPU, over the Rust runs c5 did not reach (issue 35; c5 cut
# both at chapter 5): 9 runs per tool at ~55 s each. Chapter 5 alone under memcheck with a long
# bound and NVSHMEM_DEBUG=INFO timestamps is a call of its own (it did not finish in 150 s).
set -u
. .carry/calls/common.sh 6
unpack_bins fresh
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
