#!/bin/bash
# x4 call 4 (2026-11-27 second session), all four GPUs, after c3 on the same machine:
#   combine_free_warps at EP4 (issue 38): normal-mode A/B at 24 SMs, then DeepEP's
#     test_intranode.py A B A B (the target is read in its printout);
#   the broadcast's per-warp steps W / V / X (issue 38): their tests at N = 4, then A W V X twice
#     and NCCL (notes/calls/ab_bcast_warp.sh);
#   the internode dispatch at N = 4 (2 x 2, 4 x 1; issue 32 step 4);
#   dispatch_bulk_rows at EP4 (issue 37), one round at 8 12 24 SMs;
#   the internode notify and dispatch folded at 8 under MPS (2 x 4, 4 x 2, 8 x 1), as time allows.
set -u
. .carry/calls/common.sh 4
MAIN=.carry/wheels/$W BULK=.carry/ab/dispatch_bulk_rows/$W COMB=.carry/ab/combine_free_warps/$W
unpack_bins
install main:$MAIN bulk:$BULK comb:$COMB
build_deepep
export MASTER_PORT=38361
AB_MODE=normal AB_NUM_SMS="24" timeout 150 bash benchmarks/ab_wheels.sh $MAIN $COMB $Z/ab_comb_n4 2 4 >$Z/ab_comb_n4.log 2>&1
el "comb A/B n=4 exit $?"; pack
GPU_TEST_NPROCS=4 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=120 BIN_DIR=.carry/bin LOG_DIR=$Z/idisp4 \
  timeout 150 bash scripts/gpu_test.sh internode-dispatch >$Z/idisp4.log 2>&1
el "internode-dispatch n=4 exit $?: $(tail -1 $Z/idisp4.log)"; pack
wait_deepep; el "deepep: $(tail -1 $Z/deepep_build.log)"
for v in main comb main comb; do
  left 330 || break
  PYTHONPATH=/tmp/site_$v COMPAT_TIMEOUT_S=70 bash benchmarks/deepep_compat.sh /tmp/deepep_v1 4 test_intranode.py >>$Z/compat_comb_n4.$v.log 2>&1
  el "DeepEP test_intranode n=4 $v exit $?"; pack
done
left 430 && { BC_TEST_NS=4 OUT=$OUT timeout $((560 - SECONDS + t0)) bash .carry/calls/ab_bcast_warp.sh >$Z/bcast.log 2>&1
  el "broadcast A/B exit $?"; cp -r /tmp/z/bc $Z/ 2>/dev/null; pack; }
left 480 && { AB_MODE=normal AB_NUM_SMS="8 12 24" timeout $((570 - SECONDS + t0)) bash benchmarks/ab_wheels.sh $MAIN $BULK $Z/ab_bulk_n4 1 4 >$Z/ab_bulk_n4.log 2>&1
  el "bulk A/B n=4 exit $?"; pack; }
left 500 && { GPU_TEST_PES_PER_GPU=2 GPU_TEST_NPROCS=8 GPU_TEST_PYTHON=0 GPU_TEST_TIMEOUT_S=60 BIN_DIR=.carry/bin LOG_DIR=$Z/inode8 \
  timeout $((575 - SECONDS + t0)) bash scripts/gpu_test.sh internode-notify internode-dispatch >$Z/inode8.log 2>&1
  el "internode folded 8 exit $?: $(tail -1 $Z/inode8.log)"; }
el done; pack
