#!/usr/bin/env bash
#SBATCH --job-name=nvshmem-chapter
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=00:30:00
# Runs one chapter on N nodes under Slurm: one torchrun agent per node, all meeting through a
# c10d rendezvous on the job's first node, every GPU of a node one process (Appendix A).
#
# Usage, from the repository root on a shared file system (every node sees the same binaries
# and the same .venv):
#   sbatch --nodes=N scripts/slurm_chapter.sh CHAPTER [ARGS...]
#   CHAPTER: a binary of BIN_DIR (ch01-bootstrap .. ch08-low-latency, ch05-hier-bench) or a
#   script scripts/chNN_*.py; ARGS go to it.
# Environment:
#   GPUS_PER_NODE  processes per node (default: the GPUs nvidia-smi lists on the first node)
#   RDZV_PORT      c10d rendezvous port on the first node (default 29400)
#   BIN_DIR        where the binaries are (default target/release)
#   PYTHON         interpreter for the scripts (default .venv/bin/python, else python3)
#   TORCHRUN       launcher command (default: torchrun on PATH, else PYTHON -m torch.distributed.run)
#   NIC_LIST       HCAs in local-rank order, e.g. mlx5_0,mlx5_3,...: process LOCAL_RANK gets
#                  NVSHMEM_HCA_LIST=<its entry>:1 (default: NVSHMEM picks the closest NIC)
#   PREFLIGHT      1 (default): scripts/cluster_check.sh --require-rdma on every node first
# Inside the job, torchrun starts `scripts/slurm_chapter.sh --rank-exec CMD...` per process:
# that sets the per-process NIC, then execs the chapter.
set -euo pipefail

die() { printf 'slurm_chapter: error: %s\n' "$*" >&2; exit 1; }

# ANCHOR: rank_exec
# One process of torchrun: pick this local rank's NIC, then become the chapter.
if [[ "${1:-}" == --rank-exec ]]; then
  shift
  if [[ -n "${NIC_LIST:-}" ]]; then
    IFS=, read -r -a nics <<<"$NIC_LIST"
    local_rank=${LOCAL_RANK:?torchrun sets LOCAL_RANK}
    ((local_rank < ${#nics[@]})) || die "NIC_LIST has ${#nics[@]} entries, local rank $local_rank needs one"
    export NVSHMEM_HCA_LIST="${nics[local_rank]}:1"
  fi
  exec "$@"
fi
# ANCHOR_END: rank_exec

# ANCHOR: batch
cd "${SLURM_SUBMIT_DIR:-.}"
[[ -f scripts/slurm_chapter.sh ]] || die "submit from the repository root (no scripts/slurm_chapter.sh in $PWD)"
[[ -n "${SLURM_JOB_ID:-}" ]] || die "not inside a Slurm job: submit with sbatch --nodes=N $0 CHAPTER"
chapter=${1:?usage: sbatch --nodes=N scripts/slurm_chapter.sh CHAPTER [ARGS...]}
shift
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

python=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
if [[ "$chapter" == *.py ]]; then
  [[ -f "$chapter" ]] || die "no script $chapter"
  command=("$python" "$chapter" "$@")
  file=$chapter
else
  file=${BIN_DIR:-target/release}/$chapter
  [[ -x "$file" ]] || die "no binary $file (build on a node: cargo build --release)"
  command=("$file" "$@")
fi
if [[ -n "${TORCHRUN:-}" ]]; then read -r -a torchrun <<<"$TORCHRUN"
elif command -v torchrun >/dev/null; then torchrun=(torchrun)
else torchrun=("$python" -m torch.distributed.run); fi

nodes=${SLURM_JOB_NUM_NODES:?}
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
gpus=${GPUS_PER_NODE:-$(srun --nodes=1 --ntasks=1 -w "$head" nvidia-smi -L | grep -c '^GPU ' || true)}
((gpus > 0)) || die "no GPU on $head"

# The same file on every node: a stale copy on one node fails in ways that look like bugs.
sums=$(srun --ntasks-per-node=1 sha256sum "$file" | cut -d' ' -f1 | sort -u | wc -l)
((sums == 1)) || die "$file differs between the nodes: put the repository on a shared file system"
if [[ "${PREFLIGHT:-1}" == 1 ]]; then
  srun --ntasks-per-node=1 bash scripts/cluster_check.sh --require-rdma >"preflight-$SLURM_JOB_ID.log" 2>&1 ||
    die "a node is not ready for multi-node runs: see preflight-$SLURM_JOB_ID.log"
fi

echo "slurm_chapter: $chapter on $nodes nodes x $gpus GPUs, rendezvous $head:${RDZV_PORT:-29400}"
srun --ntasks-per-node=1 "${torchrun[@]}" --nnodes="$nodes" --nproc-per-node="$gpus" \
  --rdzv-backend=c10d --rdzv-endpoint="$head:${RDZV_PORT:-29400}" --rdzv-id="$SLURM_JOB_ID" \
  --no-python scripts/slurm_chapter.sh --rank-exec "${command[@]}"
# ANCHOR_END: batch
