#!/bin/bash
# x4 call 16 (prepared 2026-11-27, fourth session, for the next one): nothing here is timed.
#   GPU 0: issue 28's last soak, ch08-low-latency folded at 2 on one GPU (10,000 round trips, 100
#          buffers made and dropped), 575 s bound; its progress lines say how far it got if cut;
#   GPUs 2,3: issue 32's mode sharing, scripts/ch09_internode_buffer.py at N = 2 as 2 x 1 (the
#          section with one low_latency_mode buffer serving both modes; expected 550 checks per rank,
#          1,100 passed); then issue 35's chapter 5
#          under memcheck and initcheck (both topologies at N = 2) with its 5 MiB scratch
#          (21ce154): the silence after NVSHMEM's pool allocation was 127 s with 16 MiB.
set -u
. .carry/calls/common.sh 16
unpack_bins fresh
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main
background_pack
(export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=18361
  timeout 575 torchrun --standalone --nproc_per_node=2 --no-python env FOLD_GPUS=1 scripts/fold_pes.sh \
    .carry/bin/ch08-low-latency --pairs 10000 --create-destroy 100 >$Z/soak_ch08_n2.log 2>&1
  el "soak ch08 n=2 folded exit $?: $(tail -n 1 $Z/soak_ch08_n2.log)") &
soak=$!
(export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=28361
  NVSHMEM_TUTORIAL_NODE_PES=1 timeout 120 torchrun --standalone --nproc_per_node=2 scripts/ch09_internode_buffer.py \
    >$Z/py_internode_n2_g1.log 2>&1
  el "ch09_internode_buffer.py n=2 nodes of 1 exit $?: $(grep -a 'passed,' $Z/py_internode_n2_g1.log | tail -n 1)"
  for tool in memcheck initcheck; do
    left 380 || break
    NVSHMEM_DEBUG=INFO NVSHMEM_DEBUG_SUBSYS=INIT,MEM BIN_DIR=.carry/bin LOG_DIR=$Z/san_$tool GPU_TEST_TIMEOUT_S=200 \
      timeout $((570 - SECONDS + t0)) bash scripts/sanitize_all.sh $tool ch05-inter-node 2>&1 |
      while IFS= read -r line; do printf '[%s s] %s\n' "$((SECONDS - t0))" "$line"; done >$Z/san_$tool.log
    el "ch05 $tool: $(tail -n 1 $Z/san_$tool.log)"
  done) &
tools=$!
wait $soak $tools # not a bare wait: the background packing never ends
finish
