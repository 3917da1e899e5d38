#!/bin/bash
# x4 call 2. Phase 1, two tracks side by side (disjoint GPU pairs, own MASTER_PORTs):
#   X (GPUs 0,1): dispatch_bulk_rows correctness (ch07_buffer.py) and normal-mode A/B at EP2
#     (issue 37), then the Python runs of gpu_test left at N = 2 with main's wheel (issue 36);
#   Y (GPUs 2,3): ll_expert_publish correctness (ch08_low_latency.py) and LL A/B at EP2, LL mode
#     beside DeepEP at EP2 (run_buffer ll), DeepEP's LL test as 2 nodes of 1 (issue 31), the MoE
#     overlap rounds at N = 2 (issue 34).
# Phase 2, all 4 GPUs: run_buffer ll EP4, MoE rounds N = 4, all-reduce rows of record at N = 4,
#   LL A/B EP4 and normal A/B EP4 as time allows.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*" | tee -a $Z/steps.log; }
left() { (( SECONDS - t0 < $1 )); }
W=nvshmem_tutorial-0.1.0-cp39-abi3-linux_x86_64.whl
MAIN=.carry/wheels/$W BULK=.carry/ab/dispatch_bulk_rows/$W LLP=.carry/ab/ll_expert_publish/$W
{ date -u; nvidia-smi -L; git log -1 --format='commit %H %s'; } >$Z/machine.txt 2>&1
rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
for w in main:$MAIN bulk:$BULK llp:$LLP; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/site_${w%%:*} "${w#*:}"; done
rm -rf /tmp/deepep_v1 && cp -r .carry/deepep /tmp/deepep_v1
(cd /tmp/deepep_v1 && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=32 TORCH_CUDA_ARCH_LIST=9.0 \
  python3 setup.py build_ext --inplace >$Z/deepep_build.log 2>&1; echo "deepep build exit $?" >>$Z/deepep_build.log) &
bpid=$!
wait_deepep() { while ! grep -q "deepep build exit" $Z/deepep_build.log 2>/dev/null; do sleep 2; done; }

track_x() {
  export CUDA_VISIBLE_DEVICES=0,1 MASTER_PORT=18361
  PYTHONPATH=/tmp/site_bulk timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch07_buffer.py >$Z/x_bulk_ch07.log 2>&1
  el "X bulk ch07_buffer.py exit $?: $(grep -a 'passed,' $Z/x_bulk_ch07.log | tail -1)"
  AB_MODE=normal AB_NUM_SMS="8 12 24" timeout 180 bash benchmarks/ab_wheels.sh $MAIN $BULK $Z/ab_normal_n2 1 2 >$Z/ab_normal_n2.log 2>&1
  el "X normal A/B n=2 exit $?"; pack
  left 250 && { PYTHONPATH=/tmp/site_main GPU_TEST_GPUS=2 GPU_TEST_NPROCS=2 BIN_DIR=.carry/bin LOG_DIR=$Z/py2 \
    GPU_TEST_PY="ch06_overlap.py ch07_buffer.py ch07_quickstart.py ch08_low_latency.py moe_layer.py" \
    timeout $((290 - SECONDS + t0)) bash scripts/gpu_test.sh ch01-bootstrap >$Z/py2.log 2>&1
    el "X python n=2 exit $?: $(tail -1 $Z/py2.log)"; }
}
track_y() {
  export CUDA_VISIBLE_DEVICES=2,3 MASTER_PORT=28361
  PYTHONPATH=/tmp/site_llp timeout 90 torchrun --standalone --nproc_per_node=2 scripts/ch08_low_latency.py >$Z/y_llp_ch08.log 2>&1
  el "Y llp ch08_low_latency.py exit $?: $(grep -a 'passed,' $Z/y_llp_ch08.log | tail -1)"
  timeout 150 bash benchmarks/ab_wheels.sh $MAIN $LLP $Z/ab_ll_n2 2 2 >$Z/ab_ll_n2.log 2>&1
  el "Y LL A/B n=2 exit $?"; pack
  wait_deepep
  PYTHONPATH=/tmp/site_main BUFFER_MODES=ll BUFFER_OUT=$Z/res BUFFER_LOGS=$Z/bufll_n2 timeout 200 bash benchmarks/run_buffer.sh /tmp/deepep_v1 2 >$Z/bufll_n2.log 2>&1
  el "Y run_buffer ll n=2 exit $?"; pack
  left 250 && { PYTHONPATH=/tmp/site_main NVSHMEM_TUTORIAL_NODE_PES=1 COMPAT_TIMEOUT_S=100 bash benchmarks/deepep_compat.sh /tmp/deepep_v1 2 test_low_latency.py >$Z/compat_ll_g1.log 2>&1
    el "Y DeepEP test_low_latency as 2 nodes of 1 exit $?"; }
  left 240 && { PYTHONPATH=/tmp/site_main timeout $((295 - SECONDS + t0)) torchrun --standalone --nproc_per_node=2 scripts/moe_layer.py --bench $Z/moe_turns_n2.csv --overlap-rounds 5 >$Z/moe_turns_n2.log 2>&1
    el "Y moe rounds n=2 exit $?"; }
}
track_x & xp=$!
track_y & yp=$!
wait $xp $yp; el "phase 1 done"; pack
wait_deepep
export PYTHONPATH=/tmp/site_main
PYTHONPATH=/tmp/site_main BUFFER_MODES=ll BUFFER_OUT=$Z/res BUFFER_LOGS=$Z/bufll_n4 timeout 150 bash benchmarks/run_buffer.sh /tmp/deepep_v1 4 >$Z/bufll_n4.log 2>&1
el "run_buffer ll n=4 exit $?"; pack
mkdir -p /tmp/collbin && ln -sf "$PWD/.carry/bin/ch04-coll-bench" /tmp/collbin/ch04-coll-bench
left 500 && { COLL_ONLY=all_reduce BIN_DIR=/tmp/collbin COLL_OUT=$Z/res COLL_TIMEOUT_S=40 timeout $((560 - SECONDS + t0)) bash benchmarks/run_coll.sh 4 >$Z/coll4.log 2>&1
  el "run_coll all_reduce n=4 exit $?"; pack; }
left 490 && { timeout $((565 - SECONDS + t0)) torchrun --standalone --nproc_per_node=4 scripts/moe_layer.py --bench $Z/moe_turns_n4.csv --overlap-rounds 5 >$Z/moe_turns_n4.log 2>&1
  el "moe rounds n=4 exit $?"; pack; }
left 520 && { timeout $((570 - SECONDS + t0)) bash benchmarks/ab_wheels.sh $MAIN $LLP $Z/ab_ll_n4 1 4 >$Z/ab_ll_n4.log 2>&1
  el "LL A/B n=4 exit $?"; }
el done; pack
