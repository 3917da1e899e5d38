#!/bin/bash
# x4 call 14 (2026-11-27 fourth session, the budget's last ~560 s):
#   GPU 0: the soak of chapter 8 at N = 1; GPU 1: chapter 7 folded at 2 (issue 28; c12 cut both
#   at 150 / 265 s), ~540 s each;
#   GPUs 2,3: dispatch_sender_stream (issue 37, buffer_few_sms.md attempt 4): ch07_buffer.py at
#   N = 2 with the patched wheel, then the A/B at EP2, 8 / 12 / 24 SMs, 2 rounds (main and patch
#   both on a6ba36d: the kernels have not moved since); then GPU 3: chapter 8's soak folded at 2.
# The call packs its logs every 20 s (c13 lost its last step's logs to the call's bound).
set -u
. .carry/calls/common.sh 14
unpack_bins
install main:.carry/ab/main_a6ba36d/$W ss:.carry/ab/dispatch_sender_stream/$W
(while sleep 20; do pack; done) & packer=$!
SOAK=(--pairs 10000 --create-destroy 100)
(export CUDA_VISIBLE_DEVICES=0 MASTER_PORT=18361
  timeout 540 torchrun --standalone --nproc_per_node=1 --no-python .carry/bin/ch08-low-latency "${SOAK[@]}" >$Z/soak_ch08_n1.log 2>&1
  el "soak ch08 n=1 exit $?: $(tail -n 1 $Z/soak_ch08_n1.log)") &
(export CUDA_VISIBLE_DEVICES=1 MASTER_PORT=19361
  timeout 540 torchrun --standalone --nproc_per_node=2 --no-python \
    env FOLD_GPUS=1 scripts/fold_pes.sh .carry/bin/ch07-buffer "${SOAK[@]}" >$Z/soak_ch07_n2.log 2>&1
  el "soak ch07 n=2 folded exit $?: $(tail -n 1 $Z/soak_ch07_n2.log)") &
(export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=28361
  MAIN=.carry/ab/main_a6ba36d/$W SS=.carry/ab/dispatch_sender_stream/$W
  PYTHONPATH=/tmp/site_ss timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/ss_ch07_n2.log 2>&1
  el "ss ch07_buffer.py n=2 exit $?: $(grep -a 'passed,' $Z/ss_ch07_n2.log | tail -n 1)"
  AB_MODE=normal AB_NUM_SMS="8 12 24" timeout 260 bash benchmarks/ab_wheels.sh $MAIN $SS $Z/ab_ss_n2 2 2 >$Z/ab_ss_n2.log 2>&1
  el "ss A/B n=2 exit $?"
  export CUDA_VISIBLE_DEVICES=3 MASTER_PORT=29361
  timeout $((545 - SECONDS + t0)) torchrun --standalone --nproc_per_node=2 --no-python \
    env FOLD_GPUS=1 scripts/fold_pes.sh .carry/bin/ch08-low-latency "${SOAK[@]}" >$Z/soak_ch08_n2.log 2>&1
  el "soak ch08 n=2 folded exit $?: $(tail -n 1 $Z/soak_ch08_n2.log)") &
wait -n; wait -n; wait -n
kill $packer; el done; pack
