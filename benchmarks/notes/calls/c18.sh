#!/bin/bash
# x4 call 18 (prepared 2026-11-27, fourth session): issue 38's N = 4 collectives with every peer
# (run_coll.sh 4: ours, NVSHMEM's, NCCL, torch; c15 lacked the wheel on PYTHONPATH), then DeepEP's
# own tests against HEAD's wheel at EP4 and EP2 (the last compat run was at dd814ab; mode sharing
# and the internode calls came after), DeepEP v1 built in the background from the start.
set -u
. .carry/calls/common.sh 18
unpack_bins fresh
install main:.carry/wheels/$W
export PYTHONPATH=/tmp/site_main
build_deepep
background_pack
BIN_DIR=.carry/bin COLL_OUT=$Z/coll COLL_TIMEOUT_S=150 timeout 330 bash benchmarks/run_coll.sh 4 >$Z/coll.log 2>&1
el "run_coll 4 exit $?"
wait_deepep; el "$(tail -n 1 $Z/deepep_build.log)"
for n in 4 2; do
  left 420 || break
  COMPAT_TIMEOUT_S=120 timeout $((575 - SECONDS + t0)) bash benchmarks/deepep_compat.sh /tmp/deepep_v1 $n \
    test_intranode.py test_low_latency.py >$Z/compat_ep$n.log 2>&1
  el "deepep_compat EP$n exit $?"
done
finish
