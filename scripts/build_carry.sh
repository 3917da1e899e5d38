#!/usr/bin/env bash
# Builds what a call of the lent GPU machine carries (the device tool copies the working tree
# plus the git-ignored paths named in its `carry`, 64 MiB in all; that machine has no Rust and
# no network): the release binaries, stripped and packed with xz (each embeds every cubin, so
# unpacked they exceed the limit), the nvshmem_tutorial wheel, and optionally DeepEP's source.
#
# Usage: scripts/build_carry.sh [--deepep]        (then carry [".carry"] and run
#        scripts/device_run.sh there; it unpacks .carry/bins.tar.xz into .carry/bin)
# --deepep adds DeepEP 567632d's source from the local mirror (`fetch` github:deepseek-ai/DeepEP),
# which device_run.sh builds on the GPU machine for the steps that time it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BINS=(ch01-bootstrap ch01-rendezvous-probe ch02-symmetric-memory ch03-put-get ch03-p2p-bench ch04-collectives
  ch04-coll-bench ch05-inter-node ch05-hier-bench ch06-overlap ch06-overlap-bench ch07-buffer ch08-low-latency
  internode-notify internode-dispatch moe-layer)
carry=.carry
mkdir -p "$carry/wheels"
cargo build --release --workspace --bins --exclude nvshmem-tutorial-python
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin"
for b in "${BINS[@]}"; do strip -o "$stage/bin/$b" "target/release/$b"; done
tar cf - -C "$stage" bin | xz -T0 -6 >"$carry/bins.tar.xz"
rm -rf dist/py "$carry"/wheels/*.whl
(cd python && ../.venv/bin/maturin build --release --quiet -o ../dist/py)
cp dist/py/*.whl "$carry/wheels/"
if [[ "${1:-}" == --deepep ]]; then
  mirror=$(find /work/.mirror/deepseek-ai+DeepEP -mindepth 1 -maxdepth 1 -type d 2>/dev/null | head -1)
  [[ -n "$mirror" ]] || { echo "build_carry: no DeepEP mirror (fetch github:deepseek-ai/DeepEP first)" >&2; exit 1; }
  rm -rf "$carry/deepep" && mkdir -p "$carry/deepep"
  git -C "$mirror" archive 567632d | tar -x -C "$carry/deepep"
fi
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
packed=$(du -sb "$carry" | cut -f1)
echo "build_carry: tracked tree $((tree >> 20)) MiB + $carry $((packed >> 20)) MiB (the device tool carries 64 MiB in all)"
