#!/bin/bash
# x4 call 13 (2026-11-27 fourth session): folded at 8 on all four GPUs (2 PEs per GPU, under
# MPS): internode-dispatch steps 4-8 as 2 x 4, 4 x 2, 8 x 1 (issue 32), then chapter 8's 1,000
# round trips per topology as 2 x 4, 4 x 2, 8 x 1 (issue 31) with what is left.
set -u
. .carry/calls/common.sh 13
unpack_bins
export MASTER_PORT=38361
GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="4 2 1" GPU_TEST_TIMEOUT_S=150 \
  BIN_DIR=.carry/bin LOG_DIR=$Z/idisp8 timeout 470 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp8.log 2>&1
el "internode-dispatch folded 8 exit $?: $(tail -1 $Z/idisp8.log)"; pack
GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="4 2 1" GPU_TEST_TIMEOUT_S=150 \
  BIN_DIR=.carry/bin LOG_DIR=$Z/ll8 timeout $((580 - SECONDS + t0)) bash scripts/gpu_test.sh ch08-low-latency >$Z/ll8.log 2>&1
el "ch08 folded 8 exit $?: $(tail -1 $Z/ll8.log)"; el done; pack
