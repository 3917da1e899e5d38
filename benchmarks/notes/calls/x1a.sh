#!/bin/bash
# x1 call a: chapter 5 and chapter 8 folded at 8 on one GPU under MPS (issue 28: ch05 at the
# 2026-11-26 setting; issue 31: 1,000 round trips per topology at 8); chapter 8 folded at 4 without
# MPS (issue 31 step 3); host_path A/B main vs new_empty, A B A B, then DeepEP (issue 26).
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
Z=/tmp/z; mkdir -p $Z/hp; t0=$SECONDS
pack() { tar czf "$OUT/z.tgz" -C /tmp z 2>/dev/null; }
el() { echo "[$((SECONDS - t0)) s] $*"; }
rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
(cd .carry/deepep && CPATH=/usr/local/cuda/include/cccl MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 \
  python3 setup.py build_ext --inplace >$Z/deepep_build.log 2>&1; echo "deepep build exit $?" >>$Z/deepep_build.log) &
bpid=$!
{ date -u; nvidia-smi -L; } >$Z/machine.txt
GPU_TEST_PYTHON=0 GPU_TEST_PES_PER_GPU=8 GPU_TEST_NPROCS=8 GPU_TEST_TIMEOUT_S=240 BIN_DIR=.carry/bin LOG_DIR=$Z/f8 \
  timeout 330 bash scripts/gpu_test.sh ch05-inter-node ch08-low-latency >$Z/f8.log 2>&1
el "folded 8 exit $?: $(tail -1 $Z/f8.log)"; pack
GPU_TEST_PYTHON=0 GPU_TEST_MPS=0 GPU_TEST_PES_PER_GPU=4 GPU_TEST_NPROCS=4 GPU_TEST_LL_PAIRS=50 BIN_DIR=.carry/bin LOG_DIR=$Z/nomps4 \
  timeout 120 bash scripts/gpu_test.sh ch08-low-latency >$Z/nomps4.log 2>&1
el "no-MPS 4 exit $?: $(tail -1 $Z/nomps4.log)"; pack
for v in main new main new; do
  w=$(compgen -G ".carry/wheels/*.whl" | head -1); [[ $v == new ]] && w=$(compgen -G ".carry/ab/new_empty/*.whl" | head -1)
  rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --target /tmp/site_$v "$w"
  PYTHONPATH=/tmp/site_$v timeout 100 python3 benchmarks/host_path.py --system ours --breakdown >$Z/hp/$v.$SECONDS.log 2>&1
  el "host_path $v exit $?"
done
wait $bpid; el "$(tail -1 $Z/deepep_build.log)"
(cd /tmp && PYTHONPATH="$OLDPWD/.carry/deepep" timeout 100 python3 "$OLDPWD/benchmarks/host_path.py" --system deepep) >$Z/hp/deepep.log 2>&1
el "host_path deepep exit $?"; pack
el done
