#!/bin/bash
# x4 call 19 (prepared 2026-11-27, fourth session): issue 37's attempt 4 (dispatch_sender_stream)
# measured cleanly: nothing else runs on the host (c14 ran it beside the soak and its host-timed
# dispatch rows swung 2-3x). Main's wheel and the patch's, both built on the same HEAD
# (buffer_few_sms.md, attempt 4, says how), 3 rounds A B at EP2 and 8 / 12 / 24 SMs, then DeepEP
# v1 timed by the same bench at 24 SMs for the ratio, then DeepEP's test_intranode against the patch.
set -u
. .carry/calls/common.sh 19
MAIN=.carry/wheels/$W SS=.carry/ab/dispatch_sender_stream/$W
install main:$MAIN ss:$SS
build_deepep
background_pack
export CUDA_VISIBLE_DEVICES=0,1 MASTER_PORT=38361
PYTHONPATH=/tmp/site_ss timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/ss_ch07_n2.log 2>&1
el "ss ch07_buffer.py n=2 exit $?: $(grep -a 'passed,' $Z/ss_ch07_n2.log | tail -n 1)"
wait_deepep; el "$(tail -n 1 $Z/deepep_build.log)"  # the build's 64 compile jobs stay out of the timings
AB_MODE=normal AB_NUM_SMS="8 12 24" timeout 330 bash benchmarks/ab_wheels.sh $MAIN $SS $Z/ab_ss_n2 3 2 >$Z/ab_ss_n2.log 2>&1
el "ss A/B n=2 exit $?"
left 470 && { (cd /tmp && PYTHONPATH=/tmp/deepep_v1 timeout 80 python3 $OLDPWD/benchmarks/buffer_bench.py $Z/deepep_ep2.csv \
  --method deepep --num-processes 2 --num-sms 24) >$Z/deepep_ep2.log 2>&1; el "deepep bench EP2 exit $?"; }
left 500 && { PYTHONPATH=/tmp/site_ss COMPAT_TIMEOUT_S=60 timeout $((575 - SECONDS + t0)) bash benchmarks/deepep_compat.sh \
  /tmp/deepep_v1 2 test_intranode.py >$Z/t2.ss.log 2>&1; el "test_intranode n=2 ss exit $?"; }
finish
