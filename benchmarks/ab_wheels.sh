#!/usr/bin/env bash
# An A/B of two builds of the nvshmem_tutorial wheel on one machine, in one call: each wheel
# goes into its own folder, then benchmarks/buffer_ll_bench.py runs with each in turn, A B A B
# ..., ROUNDS times, so that both see the same GPU, clocks and temperature. One CSV per run:
# OUT_DIR/ll_<a|b>_<round>.csv, then the medians of the kernel rows side by side.
#
# Usage: benchmarks/ab_wheels.sh A.whl B.whl OUT_DIR [ROUNDS (default 3)] [NPROCS (default 1)]
# NPROCS ranks, one per GPU (torchrun through buffer_ll_bench.py's --num-processes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# >= 3)) || { sed -n 2,8p "$0"; exit 2; }
a=$1 b=$2 out=$3 rounds=${4:-3} nprocs=${5:-1}
for whl in "$a" "$b"; do [[ -f "$whl" ]] || { echo "ab_wheels: no wheel at $whl" >&2; exit 2; }; done
mkdir -p "$out"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-index --no-deps --target "$site/a" "$a"
python3 -m pip install -q --no-index --no-deps --target "$site/b" "$b"
shim=$PWD/benchmarks/deepep_shim
for r in $(seq "$rounds"); do
  for side in a b; do
    (cd /tmp && PYTHONPATH="$shim:$site/$side" timeout 200 python3 "$OLDPWD/benchmarks/buffer_ll_bench.py" \
      --method ours --num-processes "$nprocs" "$out/ll_${side}_$r.csv") >"$out/ll_${side}_$r.log" 2>&1 ||
      echo "ab_wheels: $side round $r failed (log $out/ll_${side}_$r.log)"
  done
done
python3 - "$out" "$rounds" <<'PY'
import csv, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
def rows(side):
    got = {}
    for r in range(1, rounds + 1):
        path = out / f"ll_{side}_{r}.csv"
        if not path.exists():
            continue
        for row in csv.DictReader(l for l in path.open() if not l.startswith("#")):
            got.setdefault((row["op"], row["timing"]), []).append(float(row["us"]))
    return got
a, b = rows("a"), rows("b")
print("op,timing,a_us_median,b_us_median,b/a")
for key in sorted(set(a) & set(b)):
    ma, mb = statistics.median(a[key]), statistics.median(b[key])
    print(f"{key[0]},{key[1]},{ma:.2f},{mb:.2f},{mb / ma:.3f}")
PY
