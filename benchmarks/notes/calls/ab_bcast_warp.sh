#!/bin/bash
# The broadcast's per-unit steps (issue 38; benchmarks/notes/patches/broadcast_warp_steps.patch):
# the variant's ch04-collectives at N = 4 and 2 first, then COLL_ONLY=broadcast ch04-coll-bench
# A W A W at N = 4 with NCCL's broadcast after, the extra builds V and X (if carried) between,
# then A W at N = 2. A = main's binaries (.carry/bins.tar.xz), W = 16 blocks x 16 one-warp units,
# V = 64 blocks x 4 four-warp units, X = W with 48 target steps.
set -u
export NVSHMEM_DISABLE_NVLS=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_SYMMETRIC_SIZE=8G
mkdir -p /tmp/z/bc; t0=$SECONDS
pack() { tar czf "$OUT/bc.tgz" -C /tmp/z bc; }  # the caller may pack /tmp/z whole
{ date -u; nvidia-smi -L; git log -1 --format='commit %H %s'; } >/tmp/z/bc/machine.txt 2>&1
rm -rf .carry/bin && python3 -c 'import tarfile; tarfile.open(".carry/bins.tar.xz").extractall(".carry")'
declare -A BIN=([A]=.carry/bin/ch04-coll-bench)
for v in W:bcast_warp V:bcast_warp_v X:bcast_warp_x; do
  d=.carry/ab/${v#*:}; [[ -f $d/ch04-coll-bench.xz ]] || continue
  for b in ch04-coll-bench ch04-collectives; do xz -dc "$d/$b.xz" >"/tmp/$b-${v%%:*}" && chmod +x "/tmp/$b-${v%%:*}"; done
  BIN[${v%%:*}]=/tmp/ch04-coll-bench-${v%%:*}
done
echo "variants: ${!BIN[*]}"
for v in W V X; do
  [[ -x /tmp/ch04-collectives-$v ]] || continue
  for n in ${BC_TEST_NS:-4 2}; do
    timeout 150 torchrun --standalone --nproc_per_node=$n --no-python /tmp/ch04-collectives-$v >/tmp/z/bc/test.$v.n$n.log 2>&1
    echo "test $v n=$n exit $?: $(grep -a 'passed,' /tmp/z/bc/test.$v.n$n.log | tail -1)"; pack
  done
done
k=0
bench() {  # bench <variant> <n>: run k of the call
  k=$((k + 1))
  COLL_ONLY=broadcast timeout 90 torchrun --standalone --nproc_per_node=$2 --no-python ${BIN[$1]} \
    "/tmp/z/bc/r$k.$1.n$2.csv" >"/tmp/z/bc/r$k.$1.n$2.log" 2>&1
  echo "broadcast r$k $1 n=$2 exit $? at $((SECONDS - t0)) s"
}
order="A W"; for v in V X; do [[ -n ${BIN[$v]:-} ]] && order="$order $v"; done
for v in $order $order; do bench $v 4; done; pack
COLL_ONLY=broadcast timeout 90 torchrun --standalone --nproc_per_node=4 benchmarks/coll_bench.py \
  --peers nccl /tmp/z/bc/N.n4.csv >/tmp/z/bc/N.n4.log 2>&1
echo "nccl n=4 exit $? at $((SECONDS - t0)) s"; pack
for v in A W; do bench $v 2; done; pack
echo "done at $((SECONDS - t0)) s"
