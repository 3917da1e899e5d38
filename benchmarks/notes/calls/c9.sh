#!/bin/bash
# x4 call 9 (2026-11-27 third session), binaries and wheel of HEAD (machine$CALL.txt names it):
#   1. the internode combine's first GPU run (issue 32 step 5: internode-dispatch now runs 1,000
#      dispatch + combine pairs per topology) at N = 4 (2 x 2, 4 x 1);
#   2. DeepEP's own test_intranode and test_low_latency at EP4 against HEAD's wheel (the layout and
#      notify arguments became contract structs after the last compat run), while DeepEP builds;
#   3. two pairs side by side: the internode combine at N = 2 (GPUs 0,1) / DeepEP's two tests at
#      EP2 (GPUs 2,3);
#   4. the broadcast's 4-warp units (issue 38): ch04-collectives at N = 4, then COLL_ONLY=broadcast
#      ch04-coll-bench twice and NCCL's broadcast (prediction in notes/collectives.md);
#   5. run_p2p.sh (the few-SM rows that decide buffer_few_sms.md's attempt 3);
#   6. the MoE layer's hidden-SM sweep at N = 4 (issue 34; prediction in notes/overlap.md);
#   7. the internode notify + dispatch/combine folded at 8 under MPS (2 x 4, 4 x 2, 8 x 1).
set -u
. .carry/calls/common.sh 9
MAIN=.carry/wheels/$W
unpack_bins
install main:$MAIN
export PYTHONPATH=/tmp/site_main MASTER_PORT=38361
GPU_TEST_NPROCS=4 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=150 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp4 \
  timeout 330 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp4.log 2>&1
el "internode-dispatch n=4 exit $?: $(tail -1 $Z/idisp4.log)"; pack
for t in test_intranode.py test_low_latency.py; do
  COMPAT_TIMEOUT_S=100 bash benchmarks/deepep_compat.sh .carry/deepep 4 $t >$Z/compat4.$t.log 2>&1
  el "DeepEP $t n=4 exit $?"; pack
done
(export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=38461
  for t in test_intranode.py test_low_latency.py; do
    COMPAT_TIMEOUT_S=90 bash benchmarks/deepep_compat.sh .carry/deepep 2 $t >$Z/compat2.$t.log 2>&1
    el "DeepEP $t n=2 exit $?"
  done) &
CUDA_VISIBLE_DEVICES=0,1 GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=120 BIN_DIR=.carry/bin \
  LOG_DIR=$Z/idisp2 timeout 200 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp2.log 2>&1
el "internode-dispatch n=2 exit $?: $(tail -1 $Z/idisp2.log)"
wait; pack
mkdir -p $Z/bc
NVSHMEM_SYMMETRIC_SIZE=8G timeout 120 torchrun --standalone --nproc_per_node=4 --no-python .carry/bin/ch04-collectives >$Z/bc/test.n4.log 2>&1
el "ch04-collectives n=4 exit $?: $(grep -a 'passed,' $Z/bc/test.n4.log | tail -1)"
for k in 1 2; do
  COLL_ONLY=broadcast NVSHMEM_SYMMETRIC_SIZE=8G timeout 90 torchrun --standalone --nproc_per_node=4 --no-python \
    .carry/bin/ch04-coll-bench $Z/bc/r$k.n4.csv >$Z/bc/r$k.n4.log 2>&1
  el "broadcast bench r$k n=4 exit $?"
done
COLL_ONLY=broadcast timeout 90 torchrun --standalone --nproc_per_node=4 benchmarks/coll_bench.py --peers nccl $Z/bc/N.n4.csv >$Z/bc/N.n4.log 2>&1
el "nccl broadcast n=4 exit $?"; pack
left 420 && { mkdir -p $Z/p2p; BIN_DIR=.carry/bin P2P_BENCH_OUT=$Z/p2p P2P_BENCH_TIMEOUT_S=60 timeout 70 bash benchmarks/run_p2p.sh >$Z/p2p.log 2>&1; el "run_p2p exit $?"; pack; }
left 440 && { timeout $((540 - SECONDS + t0)) torchrun --standalone --nproc_per_node=4 scripts/moe_layer.py --bench $Z/moe_sms_n4.csv \
  --overlap-rounds 5 --hidden-sms 16 12 8 4 >$Z/moe_sms_n4.log 2>&1; el "moe_layer sweep n=4 exit $?"; pack; }
left 520 && { GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=60 BIN_DIR=.carry/bin LOG_DIR=$Z/inode8 \
  timeout $((580 - SECONDS + t0)) bash scripts/gpu_test.sh internode-dispatch >$Z/inode8.log 2>&1
  el "internode-dispatch folded 8 exit $?: $(tail -1 $Z/inode8.log)"; }
el done; pack
