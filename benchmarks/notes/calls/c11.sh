#!/bin/bash
# x4 call 11 (prepared 2026-11-27, not run): dispatch_sender_stream (issue 37, few SMs;
# buffer_few_sms.md, attempt 4) against main, modelled on c8's dispatch_self_on_receivers part.
#   1. correctness first: ch07_buffer.py with the patched wheel at N = 2 (GPUs 0,1), and at N = 4
#      (the routing word holds 4 PEs' bytes there: the byte extraction is exercised);
#   2. buffer_bench A/B at 8 / 12 / 24 SMs, EP2, 2 rounds A B A B (the prediction's rows);
#   3. with what is left: EP4, 1 round; then DeepEP's test_intranode at EP2 against the patch.
# Needs in .carry/: main's wheel of the HEAD the patch applies to (.carry/wheels/$W) and the
# patch's wheel (.carry/ab/dispatch_sender_stream/$W): buffer_few_sms.md, attempt 4, says how.
set -u
. .carry/calls/common.sh 11
MAIN=.carry/wheels/$W SS=.carry/ab/dispatch_sender_stream/$W
install main:$MAIN ss:$SS
build_deepep  # in the background, for step 3
export MASTER_PORT=38361
(export CUDA_VISIBLE_DEVICES=0,1
  PYTHONPATH=/tmp/site_ss timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/ss_ch07_n2.log 2>&1
  el "ss ch07_buffer.py n=2 exit $?: $(grep -a 'passed,' $Z/ss_ch07_n2.log | tail -1)"; pack)
PYTHONPATH=/tmp/site_ss timeout 120 torchrun --standalone --nproc_per_node=4 scripts/ch07_buffer.py >$Z/ss_ch07_n4.log 2>&1
el "ss ch07_buffer.py n=4 exit $?: $(grep -a 'passed,' $Z/ss_ch07_n4.log | tail -1)"; pack
(export CUDA_VISIBLE_DEVICES=0,1
  AB_MODE=normal AB_NUM_SMS="8 12 24" timeout 240 bash benchmarks/ab_wheels.sh $MAIN $SS $Z/ab_ss_n2 2 2 >$Z/ab_ss_n2.log 2>&1
  el "ss A/B n=2 exit $?"; pack)
left 420 && { AB_MODE=normal AB_NUM_SMS="8 12 24" timeout $((560 - SECONDS + t0)) bash benchmarks/ab_wheels.sh $MAIN $SS $Z/ab_ss_n4 1 4 >$Z/ab_ss_n4.log 2>&1
  el "ss A/B n=4 exit $?"; pack; }
if left 480; then
  wait_deepep; el "$(tail -1 $Z/deepep_build.log)"
  CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=/tmp/site_ss COMPAT_TIMEOUT_S=60 timeout $((575 - SECONDS + t0)) bash benchmarks/deepep_compat.sh /tmp/deepep_v1 2 test_intranode.py >$Z/t2.ss.log 2>&1
  el "test_intranode n=2 ss exit $?: $(grep -a 'Best dispatch' $Z/t2.ss.log | tail -1)"; pack
fi
el done; pack
