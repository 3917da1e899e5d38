#!/usr/bin/env bash
# Chapter 5 across two torchrun agents on this one host: `torchrun --nnodes=2` twice, meeting
# through a c10d rendezvous on 127.0.0.1. torchrun gives each agent's processes
# LOCAL_WORLD_SIZE = PER_AGENT, so chapter 5's nodes are the agents (virtual nodes), while
# NVSHMEM's node team (the PEs whose host names hash alike) spans the whole host. Chapter 1's
# placement check (check_placement) must call that VirtualNodes, and the hierarchical
# collectives then run across the two "nodes" with NVSHMEM's RMA calls.
#
# GPUs: with 2 x PER_AGENT GPUs or more, each agent gets PER_AGENT of its own
# (CUDA_VISIBLE_DEVICES); with fewer, the agents share the GPUs there are, their processes
# folded onto them (scripts/fold_pes.sh) under CUDA MPS: correctness only.
#
# Usage: scripts/ch05_two_agents.sh [PER_AGENT]   (default 1: two nodes of one PE)
# Environment: BIN_DIR (default target/release), TORCHRUN (launcher command), LOG_DIR (where
# the two agents' logs go; default a fresh temporary folder), TWO_AGENTS_TIMEOUT_S (default
# 300), GPU_TEST_MPS (1 default: start an MPS daemon for folded runs; 0: none).
# Exit status 0 when both agents exit 0, the job's line says "<N> passed, 0 failed", and PE 0
# reported virtual nodes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

die() { printf 'ch05_two_agents: error: %s\n' "$*" >&2; exit 1; }
per_agent=${1:-1}
[[ "$per_agent" =~ ^[1-9][0-9]*$ ]] || die "PER_AGENT '$per_agent' is not a positive integer"
BIN_DIR=${BIN_DIR:-target/release}
bin="$BIN_DIR/ch05-inter-node"
[[ -x "$bin" ]] || die "no $bin (build with: cargo build --release -p ch05-inter-node)"
timeout_s=${TWO_AGENTS_TIMEOUT_S:-300}
if [[ -n "${TORCHRUN:-}" ]]; then
  read -r -a torchrun <<<"$TORCHRUN"
elif command -v torchrun >/dev/null; then
  torchrun=(torchrun)
else
  torchrun=(python3 -m torch.distributed.run)
fi
log_dir=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/two_agents.XXXXXX")}
mkdir -p "$log_dir"
num_gpus=$({ nvidia-smi -L 2>/dev/null || true; } | grep -c '^GPU ' || true)
((num_gpus >= 1)) || die "no NVIDIA GPU visible (nvidia-smi -L lists none)"

# Which GPUs each agent sees, and whether its processes share them.
gpus_per_agent=$((num_gpus >= 2 ? num_gpus / 2 : 1))
((gpus_per_agent > per_agent)) && gpus_per_agent=$per_agent
visible() { # agent a: GPUs a*k .. a*k+k-1 (both agents GPU 0 on a one-GPU machine)
  local a=$1 first list=()
  first=$((num_gpus >= 2 ? a * gpus_per_agent : 0))
  for ((g = first; g < first + gpus_per_agent; g++)); do list+=("$g"); done
  (IFS=,; echo "${list[*]}")
}
fold=()
mps_started=0
if ((per_agent > gpus_per_agent || num_gpus == 1)); then
  # Every PE of a GPU, of both agents, at most its share of it (what NVSHMEM's teams need).
  gpus_used=$((num_gpus >= 2 ? 2 * gpus_per_agent : 1))
  pes_per_gpu=$(((2 * per_agent + gpus_used - 1) / gpus_used))
  fold=(env "FOLD_GPUS=$gpus_per_agent" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / pes_per_gpu))"
    scripts/fold_pes.sh)
  if [[ "${GPU_TEST_MPS:-1}" == 1 && -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]]; then
    command -v nvidia-cuda-mps-control >/dev/null || die "folded agents need CUDA MPS (or GPU_TEST_MPS=0)"
    export CUDA_MPS_PIPE_DIRECTORY="$log_dir/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$log_dir/mps-log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || die "could not start the MPS daemon"
    mps_started=1
  fi
fi
stop_mps() { ((mps_started == 0)) || echo quit | nvidia-cuda-mps-control || true; }
trap stop_mps EXIT

port=$((20000 + RANDOM % 20000))
echo "two agents x $per_agent process(es), GPUs $(visible 0) and $(visible 1)${fold:+, folded}; rendezvous 127.0.0.1:$port"
pids=()
for agent in 0 1; do
  CUDA_VISIBLE_DEVICES=$(visible "$agent") timeout --kill-after=30 "$timeout_s" "${torchrun[@]}" \
    --nnodes=2 --nproc_per_node="$per_agent" --rdzv_backend=c10d \
    --rdzv_endpoint="127.0.0.1:$port" --rdzv_id="ch05-two-agents-$$" --no-python \
    "${fold[@]}" "$bin" >"$log_dir/agent$agent.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
cat "$log_dir/agent0.log" "$log_dir/agent1.log"
((rc == 0)) || die "an agent exited with status $rc (logs: $log_dir/agent0.log, agent1.log)"
grep -hEq '^[0-9]+ passed, 0 failed' "$log_dir/agent0.log" "$log_dir/agent1.log" ||
  die "no '<N> passed, 0 failed' line in the agents' logs"
grep -hq 'placement: Ok(VirtualNodes' "$log_dir/agent0.log" "$log_dir/agent1.log" ||
  die "PE 0 did not report virtual nodes: the agents' nodes were not virtual"
echo "two agents x $per_agent: passed"
