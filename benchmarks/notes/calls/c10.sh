#!/bin/bash
# x4 call 10 (2026-11-27 third session, the session's last ~300 s), binaries and wheel of HEAD:
#   1. two pairs side by side: GPUs 0,1 ch06-overlap under initcheck (--calls 2, print limit
#      5000: c6's run passed the old limit), then chapter 5 under memcheck with each output line
#      timed (c5 saw no line in 145 s; racecheck finished it in 31 s), with 4 MiB of NVSHMEM
#      reduce scratch instead of the program's 16 MiB x 32 team slots (the guess: memcheck's
#      shadow of 512 MiB more heap is what stalls the start; N = 2 needs 2.1 MB) /
#      GPUs 2,3 the internode steps 6-8 (fp8, cached, worst tokens, a captured pair) at N = 2 as
#      2 nodes of 1, then the Python internode script at N = 2 as 2 nodes of 1;
#   2. all four: the internode steps at N = 4 (2 x 2, 4 x 1), the Python script at N = 4 (2 x 2);
#   3. with what is left (the budget likely ends it): chapter 8's 1,000 round trips folded at 8 as
#      8 nodes of 1 (issue 31).
# Expected: internode-dispatch 12,595 checks per rank at 2 x 1 and 4 x 1, 12,596 at 2 x 2 (issue 32
# steps 4-8); ch09_internode_buffer.py 912 passed at N = 2, 1824 at N = 4.
set -u
. .carry/calls/common.sh 10
unpack_bins
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main
PY_INTERNODE=scripts/ch09_internode_buffer.py
(export CUDA_VISIBLE_DEVICES=0,1 GPU_TEST_GPUS=2 MASTER_PORT=18361
  GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=initcheck GPU_TEST_TIMEOUT_S=150 BIN_DIR=.carry/bin \
    LOG_DIR=$Z/san_initcheck timeout 170 bash scripts/gpu_test.sh ch06-overlap >$Z/san_initcheck.log 2>&1
  el "ch06 initcheck exit $?: $(tail -1 $Z/san_initcheck.log)"; pack
  NVSHMEM_REDUCE_SCRATCH_SIZE=4M GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_SANITIZER=memcheck GPU_TEST_NODE_SIZES=- GPU_TEST_TIMEOUT_S=75 \
    BIN_DIR=.carry/bin LOG_DIR=$Z/san_memcheck timeout 80 bash scripts/gpu_test.sh ch05-inter-node 2>&1 |
    while IFS= read -r line; do printf '[%s s] %s\n' "$((SECONDS - t0))" "$line"; done >$Z/ch05_memcheck_timed.log
  el "ch05 memcheck: $(tail -1 $Z/ch05_memcheck_timed.log)"; pack) &
(export CUDA_VISIBLE_DEVICES=2,3 GPU_TEST_GPUS=2 MASTER_PORT=28361
  GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES=1 GPU_TEST_TIMEOUT_S=120 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp2 \
    timeout 130 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp2.log 2>&1
  el "internode-dispatch n=2 exit $?: $(tail -1 $Z/idisp2.log)"; pack
  NVSHMEM_TUTORIAL_NODE_PES=1 timeout 90 torchrun --standalone --nproc_per_node=2 $PY_INTERNODE >$Z/py_internode_n2_g1.log 2>&1
  el "$PY_INTERNODE n=2 nodes of 1 exit $?: $(grep -a 'passed,' $Z/py_internode_n2_g1.log | tail -1)"; pack) &
wait
export MASTER_PORT=38361
GPU_TEST_NPROCS=4 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="2 1" GPU_TEST_TIMEOUT_S=120 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp4 \
  timeout 250 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp4.log 2>&1
el "internode-dispatch n=4 exit $?: $(tail -1 $Z/idisp4.log)"; pack
NVSHMEM_TUTORIAL_NODE_PES=2 timeout 90 torchrun --standalone --nproc_per_node=4 $PY_INTERNODE >$Z/py_internode_n4_g2.log 2>&1
el "$PY_INTERNODE n=4 nodes of 2 exit $?: $(grep -a 'passed,' $Z/py_internode_n4_g2.log | tail -1)"; pack
GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES=1 GPU_TEST_TIMEOUT_S=280 \
  BIN_DIR=.carry/bin LOG_DIR=$Z/ll8 timeout 290 bash scripts/gpu_test.sh ch08-low-latency >$Z/ll8.log 2>&1
el "ch08 folded 8 (nodes of 1) exit $?: $(tail -1 $Z/ll8.log)"
el done; pack
