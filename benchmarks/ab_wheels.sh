#!/usr/bin/env bash
# An A/B of two builds of the nvshmem_tutorial wheel on one machine, in one call: each wheel
# goes into its own folder, then a benchmark runs with each in turn, A B A B ..., ROUNDS
# times, so that both see the same GPU, clocks and temperature. One CSV per run:
# OUT_DIR/<mode>_<a|b>_<round>.csv, then the medians of its rows side by side.
#
# Usage: [AB_MODE=ll|normal] benchmarks/ab_wheels.sh A.whl B.whl OUT_DIR [ROUNDS (default 3)] [NPROCS]
# AB_MODE=ll (default): benchmarks/buffer_ll_bench.py, kernel rows; NPROCS default 1.
# AB_MODE=normal: benchmarks/buffer_bench.py --method ours at AB_NUM_SMS (default "8 12 24"),
#   chunk AB_CHUNK (default 8), combine chunk AB_COMBINE_CHUNK (default 4); NPROCS default 2.
# NPROCS ranks, one per GPU (torchrun through the benchmark's --num-processes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# >= 3)) || { sed -n 2,12p "$0"; exit 2; }
mode=${AB_MODE:-ll}
case $mode in
  ll) default_nprocs=1 ;;
  normal) default_nprocs=2 ;;
  *) echo "ab_wheels: AB_MODE is ll or normal, not $mode" >&2; exit 2 ;;
esac
a=$1 b=$2 out=$3 rounds=${4:-3} nprocs=${5:-$default_nprocs}
for whl in "$a" "$b"; do [[ -f "$whl" ]] || { echo "ab_wheels: no wheel at $whl" >&2; exit 2; }; done
mkdir -p "$out"
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-index --no-deps --target "$site/a" "$a"
python3 -m pip install -q --no-index --no-deps --target "$site/b" "$b"
shim=$PWD/benchmarks/deepep_shim
if [[ $mode == ll ]]; then
  bench=(benchmarks/buffer_ll_bench.py --method ours --num-processes "$nprocs")
  limit=200
else
  read -ra num_sms <<<"${AB_NUM_SMS:-8 12 24}"
  bench=(benchmarks/buffer_bench.py --method ours --num-processes "$nprocs" --num-sms "${num_sms[@]}"
    --chunks "${AB_CHUNK:-8}" --combine-chunks "${AB_COMBINE_CHUNK:-4}")
  limit=400
fi
for r in $(seq "$rounds"); do
  for side in a b; do
    # The CSV path first: buffer_bench.py's list options (--num-sms ...) would take it as theirs.
    (cd /tmp && PYTHONPATH="$shim:$site/$side" timeout "$limit" python3 "$OLDPWD/${bench[0]}" \
      "$out/${mode}_${side}_$r.csv" "${bench[@]:1}") >"$out/${mode}_${side}_$r.log" 2>&1 ||
      echo "ab_wheels: $side round $r failed (log $out/${mode}_${side}_$r.log)"
  done
done
python3 - "$out" "$rounds" "$mode" <<'PY'
import csv, statistics, sys
from pathlib import Path
out, rounds, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
# The columns that name a row: ll's op and timing; normal mode's op, dtype, SMs and chunk.
keys = ("op", "timing") if mode == "ll" else ("op", "dtype", "num_sms", "chunk")
def rows(side):
    got = {}
    for r in range(1, rounds + 1):
        path = out / f"{mode}_{side}_{r}.csv"
        if not path.exists():
            continue
        for row in csv.DictReader(l for l in path.open() if not l.startswith("#")):
            if row.get("method", "ours") != "ours":
                continue  # buffer_bench's NCCL context rows
            got.setdefault(tuple(row[k] for k in keys), []).append(float(row["us"]))
    return got
a, b = rows("a"), rows("b")
print(",".join(keys) + ",a_us_median,b_us_median,b/a")
order = (lambda k: k) if mode == "ll" else (lambda k: (k[0], k[1], int(k[2]), int(k[3])))
for key in sorted(set(a) & set(b), key=order):
    ma, mb = statistics.median(a[key]), statistics.median(b[key])
    print(f"{','.join(key)},{ma:.2f},{mb:.2f},{mb / ma:.3f}")
PY
