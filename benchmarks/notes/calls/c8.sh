#!/bin/bash
# x4 call 8 (prepared 2026-11-27): two buffer attempts against main, DeepEP v1 timed in the call.
#   combine_grouped_window (issue 38: EP4 combine >= 1.1x in DeepEP's printout): ch07_buffer.py at
#     N = 4, buffer_bench A/B at EP4 and EP2 (24 SMs, 2 rounds), then DeepEP's test_intranode at EP4:
#     DeepEP itself, ours main, ours patched, DeepEP, main, patched (the printout's picked lines).
#   dispatch_self_on_receivers (issue 37: few SMs): ch07_buffer.py at N = 2, buffer_bench A/B at
#     8 12 24 SMs, EP2 (2 rounds) and EP4 (1 round).
set -u
. .carry/calls/common.sh 8
MAIN=.carry/wheels/$W CW=.carry/ab/combine_grouped_window/$W SR=.carry/ab/dispatch_self_on_receivers/$W
install main:$MAIN cw:$CW sr:$SR
build_deepep
export MASTER_PORT=38361
PYTHONPATH=/tmp/site_cw timeout 120 torchrun --standalone --nproc_per_node=4 scripts/ch07_buffer.py >$Z/cw_ch07_n4.log 2>&1
el "cw ch07_buffer.py n=4 exit $?: $(grep -a 'passed,' $Z/cw_ch07_n4.log | tail -1)"
AB_MODE=normal AB_NUM_SMS="24" timeout 150 bash benchmarks/ab_wheels.sh $MAIN $CW $Z/ab_cw_n4 2 4 >$Z/ab_cw_n4.log 2>&1
el "cw A/B n=4 exit $?"; pack
wait_deepep; el "$(tail -1 $Z/deepep_build.log)"
for v in deepep main cw deepep main cw; do
  if [[ $v == deepep ]]; then
    (cd /tmp/deepep_v1/tests && PYTHONPATH=/tmp/deepep_v1 timeout 90 python3 test_intranode.py --num-processes 4) >>$Z/t4.$v.log 2>&1
  else
    PYTHONPATH=/tmp/site_$v COMPAT_TIMEOUT_S=80 bash benchmarks/deepep_compat.sh /tmp/deepep_v1 4 test_intranode.py >>$Z/t4.$v.log 2>&1
  fi
  el "test_intranode n=4 $v exit $?: $(grep -a 'Best combine' $Z/t4.$v.log | tail -1)"; pack
done
left 400 && { AB_MODE=normal AB_NUM_SMS="24" timeout 100 bash benchmarks/ab_wheels.sh $MAIN $CW $Z/ab_cw_n2 2 2 >$Z/ab_cw_n2.log 2>&1
  el "cw A/B n=2 exit $?"; pack; }
export CUDA_VISIBLE_DEVICES=0,1
PYTHONPATH=/tmp/site_sr timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/sr_ch07_n2.log 2>&1
el "sr ch07_buffer.py n=2 exit $?: $(grep -a 'passed,' $Z/sr_ch07_n2.log | tail -1)"
left 450 && { AB_MODE=normal AB_NUM_SMS="8 12 24" timeout $((575 - SECONDS + t0)) bash benchmarks/ab_wheels.sh $MAIN $SR $Z/ab_sr_n2 2 2 >$Z/ab_sr_n2.log 2>&1
  el "sr A/B n=2 exit $?"; pack; }
el done; pack
