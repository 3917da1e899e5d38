#!/bin/bash
# x4 call 17 (prepared 2026-11-27, fourth session): all four GPUs.
#   1. issue 32's mode sharing at N = 4: scripts/ch09_internode_buffer.py as 2 x 2 and 4 x 1 (550
#      checks per rank: 2,200 passed each, a50249b);
#   2. issue 31: chapter 8's 1,000 round trips per topology folded at 8 (2 PEs per GPU, MPS) as
#      2 x 4, 4 x 2, 8 x 1. c13 cut each at 150 s after its 14 cases; since then the received rows
#      reach the host without an allocation per element (c3b47d8: ~80 ms of each round trip at 8
#      ranks on the CPU) and the loop prints its progress. Prediction: each topology inside 150 s.
set -u
. .carry/calls/common.sh 17
unpack_bins fresh
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main MASTER_PORT=38361
background_pack
for g in 2 1; do
  NVSHMEM_TUTORIAL_NODE_PES=$g timeout 120 torchrun --standalone --nproc_per_node=4 scripts/ch09_internode_buffer.py \
    >$Z/py_internode_n4_g$g.log 2>&1
  el "ch09_internode_buffer.py n=4 nodes of $g exit $?: $(grep -a 'passed,' $Z/py_internode_n4_g$g.log | tail -n 1)"
done
GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="4 2 1" GPU_TEST_TIMEOUT_S=170 \
  BIN_DIR=.carry/bin LOG_DIR=$Z/ll8 timeout $((580 - SECONDS + t0)) bash scripts/gpu_test.sh ch08-low-latency >$Z/ll8.log 2>&1
el "ch08 folded 8 exit $?: $(tail -n 1 $Z/ll8.log)"
finish
