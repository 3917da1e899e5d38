#!/bin/bash
# x4 call 3 (2026-11-27 second session). Two tracks side by side on disjoint GPU pairs:
#   S (GPUs 0,1): compute-sanitizer racecheck, then synccheck, over every Rust chapter at N = 2,
#     one PE per GPU (issue 35), each run bounded at 200 s.
#   B (GPUs 2,3): dispatch_bulk_rows (issue 37) and combine_free_warps (issue 38) wheels: their
#     ch07_buffer.py, then normal-mode A/B against main at EP2 (A B A B); the internode dispatch's
#     first GPU run at N = 2 (issue 32 step 4: 2 x 1 and the one-node refusal); run_coll.sh 2 at
#     HEAD (issue 36); DeepEP's test_intranode.py at EP2 against the bulk_rows wheel.
set -u
. .carry/calls/common.sh 3
MAIN=.carry/wheels/$W BULK=.carry/ab/dispatch_bulk_rows/$W COMB=.carry/ab/combine_free_warps/$W
unpack_bins fresh
install main:$MAIN bulk:$BULK comb:$COMB
build_deepep

track_s() {
  export CUDA_VISIBLE_DEVICES=0,1 MASTER_PORT=18361
  GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=racecheck GPU_TEST_TIMEOUT_S=200 \
    BIN_DIR=.carry/bin LOG_DIR=$Z/san_racecheck timeout $((575 - SECONDS + t0)) bash scripts/gpu_test.sh >$Z/san_racecheck.log 2>&1
  el "S racecheck exit $?: $(tail -1 $Z/san_racecheck.log)"; pack
  left 450 && { GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=synccheck GPU_TEST_TIMEOUT_S=200 \
    BIN_DIR=.carry/bin LOG_DIR=$Z/san_synccheck timeout $((575 - SECONDS + t0)) bash scripts/gpu_test.sh >$Z/san_synccheck.log 2>&1
    el "S synccheck exit $?: $(tail -1 $Z/san_synccheck.log)"; pack; }
}
track_b() {
  export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=28361
  for v in bulk comb; do
    PYTHONPATH=/tmp/site_$v timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/b_${v}_ch07.log 2>&1
    el "B $v ch07_buffer.py exit $?: $(grep -a 'passed,' $Z/b_${v}_ch07.log | tail -1)"
  done
  AB_MODE=normal AB_NUM_SMS="8 12 24" timeout 200 bash benchmarks/ab_wheels.sh $MAIN $BULK $Z/ab_bulk_n2 2 2 >$Z/ab_bulk_n2.log 2>&1
  el "B bulk A/B n=2 exit $?"; pack
  AB_MODE=normal AB_NUM_SMS="24" timeout 100 bash benchmarks/ab_wheels.sh $MAIN $COMB $Z/ab_comb_n2 2 2 >$Z/ab_comb_n2.log 2>&1
  el "B comb A/B n=2 exit $?"; pack
  GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=120 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp2 \
    timeout 150 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp2.log 2>&1
  el "B internode-dispatch n=2 exit $?: $(tail -1 $Z/idisp2.log)"; pack
  mkdir -p /tmp/collbin && ln -sf "$PWD/.carry/bin/ch04-coll-bench" /tmp/collbin/ch04-coll-bench
  left 400 && { BIN_DIR=/tmp/collbin COLL_OUT=$Z/res COLL_TIMEOUT_S=60 timeout $((540 - SECONDS + t0)) bash benchmarks/run_coll.sh 2 >$Z/coll2.log 2>&1
    el "B run_coll 2 exit $?"; pack; }
  wait_deepep
  left 490 && { PYTHONPATH=/tmp/site_bulk COMPAT_TIMEOUT_S=80 timeout $((575 - SECONDS + t0)) bash benchmarks/deepep_compat.sh /tmp/deepep_v1 2 test_intranode.py >$Z/compat_bulk_n2.log 2>&1
    el "B DeepEP test_intranode bulk n=2 exit $?"; }
}
track_s & sp=$!
track_b & bp=$!
wait $sp $bp; el done; pack
