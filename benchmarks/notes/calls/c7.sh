#!/bin/bash
# x4 call 7 (prepared 2026-11-27): the soak (issue 28) on GPUs 0,1 (ch08 at N = 1, ch07 and ch08 at
# N = 2: 10,000 pairs with changing routing, every result checked, then 100 buffers made and
# dropped), beside chapter 8's 1,000 round trips per topology folded at 8 on GPUs 2,3 would need
# MPS for the whole machine, so it runs after, on all four GPUs (2 PEs per GPU, MPS: 2 x 4, 4 x 2,
# 8 x 1; issue 31).
set -u
. .carry/calls/common.sh 7
mkdir -p /tmp/dr
unpack_bins fresh
CUDA_VISIBLE_DEVICES=0,1 OUT=/tmp/dr DEVICE_LOGS=$Z/soak DEVICE_GPU_TEST=0 DEVICE_BENCH=soak \
  SOAK_RUNS="ch08-low-latency:1 ch07-buffer:2 ch08-low-latency:2" timeout 330 bash scripts/device_run.sh >$Z/soak.out 2>&1
el "soak exit $?: $(grep -a 'soak:' $Z/soak/soak.log | tr '\n' ' ')"; pack
GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="4 2 1" GPU_TEST_TIMEOUT_S=200 \
  BIN_DIR=.carry/bin LOG_DIR=$Z/ll8 timeout $((585 - SECONDS + t0)) bash scripts/gpu_test.sh ch08-low-latency >$Z/ll8.log 2>&1
el "ch08 folded 8 exit $?: $(tail -1 $Z/ll8.log)"; pack
