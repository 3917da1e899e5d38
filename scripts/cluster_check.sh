#!/usr/bin/env bash
# Preflight for multi-node runs (Appendix A of the book): names everything a node lacks before
# NVSHMEM finds out halfway through its initialisation. Run it on every node (the Slurm script
# does, with PREFLIGHT=1). Reads only: it loads no module and changes no setting.
#
# Usage: scripts/cluster_check.sh [--require-rdma]
#   Without the flag it reports and exits 0, on any machine (scripts/test.sh runs it so).
#   With --require-rdma it exits 1 when anything a multi-node run needs is missing: an active
#   RDMA port, GPUDirect RDMA (nvidia-peermem or dma-buf), libibverbs, and the InfiniBand
#   transports of the NVSHMEM install the programs will load.
# Environment: NVSHMEM_HOME (an NVSHMEM install; otherwise the nvidia-nvshmem-cu13 wheel of
# $VIRTUAL_ENV, .venv or python3 on PATH, the order the programs search), IB_SYSFS (default
# /sys/class/infiniband; tests point it elsewhere).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

require_rdma=0
case "${1:-}" in
  "") ;;
  --require-rdma) require_rdma=1 ;;
  -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
  *) printf 'cluster_check: error: unknown argument %q (use --require-rdma or nothing)\n' "$1" >&2; exit 2 ;;
esac

num_ok=0 num_missing=0 num_warn=0
ok() { printf '  ok       %s\n' "$*"; num_ok=$((num_ok + 1)); }
missing() { printf '  MISSING  %s\n' "$*"; num_missing=$((num_missing + 1)); }
warn() { printf '  warn     %s\n' "$*"; num_warn=$((num_warn + 1)); }
section() { printf '\n== %s\n' "$*"; }
have() { command -v "$1" >/dev/null 2>&1; }
loaded() { [[ -d "/sys/module/$1" ]]; }
# A shared library the dynamic loader finds (as NVSHMEM's dlopen would).
findlib() { { ldconfig -p 2>/dev/null || true; } | grep -q "[[:space:]]$1 "; }

# ANCHOR: driver
section "GPU driver and CUDA"
num_gpus=0
if have nvidia-smi && nvidia-smi -L >/dev/null 2>&1; then
  num_gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
  ok "$num_gpus GPU(s), driver ${driver:-?}, CUDA ${cuda:-?} (the wheels need a CUDA 13 driver)"
  if grep -qs 'Open Kernel Module' /proc/driver/nvidia/version; then
    ok "NVIDIA open kernel module (dma-buf export possible)"
  else
    warn "proprietary NVIDIA kernel module: no dma-buf, GPUDirect RDMA needs nvidia-peermem"
  fi
else
  missing "no NVIDIA driver: nvidia-smi is absent or lists no GPU"
fi
# ANCHOR_END: driver

# ANCHOR: rdma
section "RDMA devices"
ib_sysfs=${IB_SYSFS:-/sys/class/infiniband}
devices=()
if [[ -d "$ib_sysfs" ]]; then
  for dev in "$ib_sysfs"/*; do [[ -e "$dev" ]] && devices+=("${dev##*/}"); done
fi
active=0
for dev in "${devices[@]}"; do
  for port in "$ib_sysfs/$dev"/ports/*; do
    [[ -d "$port" ]] || continue
    state=$(cat "$port/state" 2>/dev/null || echo "?")
    layer=$(cat "$port/link_layer" 2>/dev/null || echo "?")
    rate=$(cat "$port/rate" 2>/dev/null || echo "?")
    line="$dev port ${port##*/}: $state, $layer, $rate"
    if [[ "$state" == *ACTIVE* ]]; then ok "$line"; active=$((active + 1)); else warn "$line (not active)"; fi
  done
done
if ((${#devices[@]} == 0)); then
  missing "no RDMA device in $ib_sysfs: this machine cannot run across nodes (one node is unaffected)"
elif ((active == 0)); then
  missing "RDMA devices (${devices[*]}) but no active port: check the cable and the subnet manager"
fi
if have ibv_devinfo; then
  ok "ibv_devinfo lists: $(ibv_devinfo -l 2>/dev/null | tail -n +2 | xargs echo)"
fi
if findlib libibverbs.so.1; then ok "libibverbs.so.1 (NVSHMEM's IB transports load it)"
else missing "libibverbs.so.1 not found by the loader: install rdma-core (libibverbs1)"; fi
if findlib libmlx5.so.1; then ok "libmlx5.so.1 (IBGDA drives mlx5 NICs only)"
else warn "libmlx5.so.1 not found: IBGDA needs a Mellanox mlx5 NIC and its provider library"; fi
# ANCHOR_END: rdma

# ANCHOR: gpudirect
section "GPUDirect RDMA (the NIC reads and writes GPU memory)"
if loaded nvidia_peermem || [[ -e /sys/kernel/mm/memory_peers/nvidia-peermem/version ]]; then
  ok "nvidia-peermem loaded"
  gdr=1
elif loaded nv_peer_mem; then
  ok "nv_peer_mem loaded (the older module)"
  gdr=1
elif grep -qs 'Open Kernel Module' /proc/driver/nvidia/version && findlib libibverbs.so.1; then
  warn "no nvidia-peermem: NVSHMEM must register GPU memory by dma-buf (open module, rdma-core with ibv_reg_dmabuf_mr)"
  gdr=1
else
  missing "neither nvidia-peermem nor dma-buf: NVSHMEM's IB transports skip with \"neither nv_peer_mem, or nvidia_peermem detected\" (modprobe nvidia-peermem)"
  gdr=0
fi
section "GDRCopy (optional: CPU-driven NIC handler, NVSHMEM_IBGDA_NIC_HANDLER=cpu)"
if [[ -e /dev/gdrdrv ]] || loaded gdrdrv; then ok "gdrdrv loaded"
else warn "no gdrdrv: NVSHMEM_IBGDA_NIC_HANDLER=cpu fails; auto and gpu do not need it"; fi
if findlib libgdrapi.so.2; then ok "libgdrapi.so.2"
else warn "libgdrapi.so.2 not found by the loader"; fi
# ANCHOR_END: gpudirect

# ANCHOR: transports
section "NVSHMEM and its transports"
nvshmem_lib=""
if [[ -n "${NVSHMEM_HOME:-}" ]]; then
  nvshmem_lib=$NVSHMEM_HOME/lib
else
  for py in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} .venv/bin/python python3; do
    have "$py" || [[ -x "$py" ]] || continue
    dir=$("$py" -c 'import importlib.util as u; s = u.find_spec("nvidia.nvshmem"); print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null || true)
    if [[ -n "$dir" ]]; then nvshmem_lib=$dir/lib; break; fi
  done
fi
ib_transports=0
if [[ -n "$nvshmem_lib" && -e "$nvshmem_lib/libnvshmem_host.so.3" ]]; then
  ok "NVSHMEM host library: $nvshmem_lib/libnvshmem_host.so.3"
  for t in ibgda ibrc ibdevx ucx libfabric; do
    if compgen -G "$nvshmem_lib/nvshmem_transport_$t.so*" >/dev/null; then
      ok "transport $t"
      [[ "$t" == ibgda || "$t" == ibrc ]] && ib_transports=$((ib_transports + 1))
    else
      warn "transport $t absent"
    fi
  done
  ((ib_transports > 0)) || missing "no InfiniBand transport (ibgda, ibrc) in $nvshmem_lib"
else
  missing "no NVSHMEM found (NVSHMEM_HOME, or the nvidia-nvshmem-cu13 wheel: scripts/setup.sh)"
fi
# ANCHOR_END: transports

# ANCHOR: topology
section "GPU and NIC topology (nvidia-smi topo -m)"
if ((num_gpus > 0)); then
  nvidia-smi topo -m 2>/dev/null || warn "nvidia-smi topo -m failed"
  echo "  each GPU wants one NIC marked PIX or PXB (same PCIe switch); SYS or NODE means the CPU is in the path"
else
  warn "no GPU: no topology to show"
fi

section "NVLink multicast kept off (set by every script of this project)"
for var in NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1; do
  name=${var%%=*}
  if [[ "${!name:-}" == "${var#*=}" ]]; then ok "$var"; else warn "$name is '${!name:-}', not ${var#*=}: export $var"; fi
done
# ANCHOR_END: topology

# ANCHOR: verdict
section "Verdict"
echo "cluster_check: $num_ok ok, $num_missing missing, $num_warn warnings"
if ((${#devices[@]} == 0)); then
  echo "cluster_check: no RDMA device on this machine: runs across nodes are not possible here;" \
    "runs on one node (NVLink) do not need one"
fi
rdma_ready=$((active > 0 && gdr == 1 && ib_transports > 0))
if ((require_rdma)); then
  if ((num_missing > 0 || rdma_ready == 0)); then
    echo "cluster_check: --require-rdma: this node is NOT ready for multi-node runs" >&2
    exit 1
  fi
  echo "cluster_check: --require-rdma: this node is ready for multi-node runs"
fi
exit 0
# ANCHOR_END: verdict
