#!/bin/bash
# x4 call 20 (2026-11-27, fifth session, the budget's last ~560 s): issue 35's Python runs under
# memcheck, which no call had made: the buffer's four scripts, two per GPU pair, each pair's
# gpu_test.sh given one short chapter run (ch01, ch02) so that it runs only these.
set -u
. .carry/calls/common.sh 20
unpack_bins
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main
background_pack
run_pair() { # K DEVICES BIN PY...
  local k=$1 dev=$2 bin=$3; shift 3
  CUDA_VISIBLE_DEVICES=$dev GPU_TEST_GPUS=2 GPU_TEST_PES_PER_GPU=1 GPU_TEST_NPROCS=2 GPU_TEST_SANITIZER=memcheck \
    GPU_TEST_PYTHON=1 GPU_TEST_PY="$*" MASTER_PORT=$((29500 + 1000 * k)) BIN_DIR=.carry/bin LOG_DIR=$Z/pym/pair$k \
    timeout 450 bash scripts/gpu_test.sh "$bin" >$Z/pym_pair$k.log 2>&1
  el "pair $k memcheck exit $?: $(tail -n 1 $Z/pym_pair$k.log)"
}
run_pair 0 0,1 ch01-bootstrap ch07_buffer.py ch08_low_latency.py &
a=$!
run_pair 1 2,3 ch02-symmetric-memory ch09_internode_buffer.py moe_layer.py &
b=$!
wait $a $b
finish
