#!/bin/bash
# x4 call 5 (2026-11-27 second session). Two tracks side by side on disjoint GPU pairs:
#   S (GPUs 0,1): compute-sanitizer memcheck over every Rust chapter at N = 2 (issue 35);
#   I (GPUs 2,3): run_coll.sh 2 at HEAD with the wheel on PYTHONPATH (issue 36; c3 left it out),
#     then initcheck over every Rust chapter at N = 2 (issue 35).
set -u
. .carry/calls/common.sh 5
unpack_bins fresh
install main:.carry/wheels/$W
san() {  # san <tool> <log name>
  GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=$1 GPU_TEST_TIMEOUT_S=150 \
    BIN_DIR=.carry/bin LOG_DIR=$Z/san_$1 timeout $((580 - SECONDS + t0)) bash scripts/gpu_test.sh >$Z/san_$1.log 2>&1
  el "$1 exit $?: $(tail -1 $Z/san_$1.log)"; pack
}
track_s() { export CUDA_VISIBLE_DEVICES=0,1 MASTER_PORT=18361; san memcheck; }
track_i() {
  export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=28361
  mkdir -p /tmp/collbin && ln -sf "$PWD/.carry/bin/ch04-coll-bench" /tmp/collbin/ch04-coll-bench
  PYTHONPATH=/tmp/site_main BIN_DIR=/tmp/collbin COLL_OUT=$Z/res COLL_TIMEOUT_S=60 timeout 200 bash benchmarks/run_coll.sh 2 >$Z/coll2.log 2>&1
  el "run_coll 2 exit $?"; pack
  san initcheck
}
track_s & sp=$!
track_i & ip=$!
wait $sp $ip; el done; pack
