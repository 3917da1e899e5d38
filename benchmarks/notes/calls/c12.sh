#!/bin/bash
# x4 call 12 (2026-11-27 fourth session, first call), binaries and wheel of HEAD (e299382+):
#   1. side by side, one GPU or pair each, bounded together at ~270 s:
#      GPU 0: the soak of chapter 8 at N = 1 (10,000 round trips, 100 buffers made and dropped;
#             issue 28), then chapter 8 folded at 2 on that GPU if the window allows;
#      GPU 1: the soak of chapter 7 folded at N = 2 on one GPU (issue 28);
#      GPUs 2,3: internode-dispatch steps 4-8 at 2 x 1 (issue 32, after ec3a0e8's fix), then
#             chapter 5 under memcheck (issue 35) with NVSHMEM's INFO log, each output line timed,
#             and the processes' state sampled (CPU share, wchan, a host backtrace) while silent;
#   2. all four: internode-dispatch at N = 4 (2 x 2, 4 x 1), ch09_internode_buffer.py at N = 4
#      as 2 x 2 and 4 x 1 (issue 32).
# Expected: internode-dispatch 12,595 checks per rank at 2 x 1 and 4 x 1, 12,596 at 2 x 2;
# ch09_internode_buffer.py 1,824 passed at N = 4; the soaks "0 failed" and 0 KiB lost.
set -u
. .carry/calls/common.sh 12
unpack_bins fresh
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main
SOAK=(--pairs 10000 --create-destroy 100)
# Samples the chapter 5 processes under the sanitizer: who runs, how busy, where they sleep.
sample() {
  {
    echo "== [$((SECONDS - t0)) s] sample $1"
    ps -eo pid,ppid,pcpu,rss,etime,wchan:30,args | grep -E 'ch05-inter-node|compute-sanitizer' | grep -v grep
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader -i 2,3
    local p
    for p in $(pgrep -f '^.carry/bin/ch05-inter-node|/ch05-inter-node$' | head -2); do
      echo "-- pid $p threads:"; ps -L -o tid,pcpu,wchan:30,comm -p "$p" | head -40
      if [[ "$1" == bt ]] && command -v /usr/local/cuda/bin/cuda-gdb >/dev/null; then
        timeout 40 /usr/local/cuda/bin/cuda-gdb -q -batch -p "$p" -ex 'thread apply all bt 12' 2>&1 | head -150
      fi
    done
  } >>$Z/ch05_memcheck_samples.log 2>&1
}
(export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=18361
  timeout 150 torchrun --standalone --nproc_per_node=1 --no-python .carry/bin/ch08-low-latency "${SOAK[@]}" >$Z/soak_ch08_n1.log 2>&1
  el "soak ch08 n=1 exit $?: $(tail -1 $Z/soak_ch08_n1.log)"; pack
  left 130 && { timeout $((265 - SECONDS + t0)) torchrun --standalone --nproc_per_node=2 --no-python \
    env FOLD_GPUS=1 scripts/fold_pes.sh .carry/bin/ch08-low-latency "${SOAK[@]}" >$Z/soak_ch08_n2.log 2>&1
  el "soak ch08 n=2 folded exit $?: $(tail -1 $Z/soak_ch08_n2.log)"; pack; }) &
(export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=19361
  timeout 265 torchrun --standalone --nproc_per_node=2 --no-python \
    env FOLD_GPUS=1 scripts/fold_pes.sh .carry/bin/ch07-buffer "${SOAK[@]}" >$Z/soak_ch07_n2.log 2>&1
  el "soak ch07 n=2 folded exit $?: $(tail -1 $Z/soak_ch07_n2.log)"; pack) &
(export CUDA_VISIBLE_DEVICES=2,3 GPU_TEST_GPUS=2 MASTER_PORT=28361
  GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES=1 GPU_TEST_TIMEOUT_S=110 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp2 \
    timeout 120 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp2.log 2>&1
  el "internode-dispatch n=2 exit $?: $(tail -1 $Z/idisp2.log)"; pack
  b=$((262 - SECONDS + t0))
  NVSHMEM_DEBUG=INFO NVSHMEM_DEBUG_SUBSYS=INIT,BOOTSTRAP,MEM,COLL,TRANSPORT GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 \
    GPU_TEST_SANITIZER=memcheck GPU_TEST_NODE_SIZES=- GPU_TEST_TIMEOUT_S=$((b - 5)) BIN_DIR=.carry/bin LOG_DIR=$Z/san_memcheck \
    timeout $b bash scripts/gpu_test.sh ch05-inter-node 2>&1 |
    while IFS= read -r line; do printf '[%s s] %s\n' "$((SECONDS - t0))" "$line"; done >$Z/ch05_memcheck_timed.log &
  s0=$SECONDS
  for at in 30 60 bt 120; do
    if [[ $at == bt ]]; then sleep 25; else sleep $((at - (SECONDS - s0))); fi
    sample "$at"; pack
  done
  wait
  el "ch05 memcheck: $(tail -1 $Z/ch05_memcheck_timed.log)"; pack) &
wait
el "phase 1 done"; pack
export MASTER_PORT=38361
GPU_TEST_NPROCS=4 GPU_TEST_PYTHON=0 GPU_TEST_NODE_SIZES="2 1" GPU_TEST_TIMEOUT_S=110 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp4 \
  timeout 235 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp4.log 2>&1
el "internode-dispatch n=4 exit $?: $(tail -1 $Z/idisp4.log)"; pack
for g in 2 1; do
  left 535 || break
  NVSHMEM_TUTORIAL_NODE_PES=$g timeout $((575 - SECONDS + t0)) torchrun --standalone --nproc_per_node=4 \
    scripts/ch09_internode_buffer.py >$Z/py_internode_n4_g$g.log 2>&1
  el "ch09_internode_buffer.py n=4 nodes of $g exit $?: $(grep -a 'passed,' $Z/py_internode_n4_g$g.log | tail -1)"; pack
done
el done; pack
