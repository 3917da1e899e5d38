#!/usr/bin/env bash
# Runs a command as one of several PEs that share a GPU: torchrun's LOCAL_RANK is folded onto
# the FOLD_GPUS GPUs there are (local rank r uses GPU r mod FOLD_GPUS).
#
# Usage (what scripts/gpu_test.sh does with GPU_TEST_PES_PER_GPU):
#   FOLD_GPUS=2 torchrun --standalone --nproc_per_node=8 --no-python scripts/fold_pes.sh BIN
#
# Why: a machine with 2 GPUs can then run the code paths of 4 and 8 PEs (the forwarding of a
# broadcast, the peer loops of the buffer at EP8). NVSHMEM accepts several PEs per GPU and
# its peer pointers work between them. Without MPS the processes take turns on the GPU; under
# MPS (scripts/gpu_test.sh starts it for folded runs) they run at once, each on its share of
# the SMs: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set here to 100 / PEs per GPU (unless set
# already), which is also what NVSHMEM needs to allow teams and collectives. Either way such a
# run checks correctness and says nothing about speed. NCCL refuses two ranks on one GPU, so
# this is for programs that do not use it.
set -euo pipefail
gpus=${FOLD_GPUS:?FOLD_GPUS must say how many GPUs to fold the local ranks onto}
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || { echo "fold_pes: FOLD_GPUS='$gpus' is not a positive integer" >&2; exit 2; }
local_world=${LOCAL_WORLD_SIZE:?not started by torchrun: LOCAL_WORLD_SIZE is not set}
pes_per_gpu=$(((local_world + gpus - 1) / gpus))
export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-$((100 / pes_per_gpu))}
# LOCAL_RANK becomes the GPU ordinal; FOLD_LOCAL_RANK keeps torchrun's (NVSHMEM's node PE).
export FOLD_LOCAL_RANK=${LOCAL_RANK:?not started by torchrun: LOCAL_RANK is not set}
export LOCAL_RANK=$((FOLD_LOCAL_RANK % gpus))
exec "$@"
