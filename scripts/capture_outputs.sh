#!/usr/bin/env bash
# Copies what each chapter printed in a GPU run into the book: for every log
# LOG_DIR/<binary>-n<N>.log that scripts/gpu_test.sh wrote, book/src/output/<binary>-n<N>.txt
# gets the program's own lines (torchrun's banner and warnings left out). The book includes
# these files, so its output is always a real run's. Each capture's date, machine and commit go
# into book/src/output/captures.tsv, which the book quotes beside it; run
# `python3 scripts/gen_book.py` afterwards to refresh the generated pages.
#
# Usage: scripts/capture_outputs.sh LOG_DIR
# Environment: CAPTURE_MACHINE, CAPTURE_DATE ("YYYY-MM-DD HH:MM UTC") and CAPTURE_COMMIT say
#   where, when and from which commit's binaries the logs came, when this runs after the call
#   (default: this machine's GPUs, now, and HEAD).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log_dir=${1:?usage: scripts/capture_outputs.sh LOG_DIR}
table=book/src/output/captures.tsv
date_utc=${CAPTURE_DATE:-$(date -u '+%Y-%m-%d %H:%M UTC')}
gpus=$({ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true; } | sort | uniq -c |
  awk '{count = $1; $1 = ""; sub(/^ /, ""); printf "%s%sx %s", (NR > 1 ? " + " : ""), count, $0}')
machine=${CAPTURE_MACHINE:-${gpus:-unknown GPU}}
commit=${CAPTURE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
shopt -s nullglob
for log in "$log_dir"/*-n[0-9]*.log; do
  name=$(basename "$log" .log)
  # torchrun's lines start with a glog prefix (W1122 15:27:21...) or are its banner of stars.
  grep -Ev '^[WIEF][0-9]{4} [0-9:.]+ |^\*+$' "$log" >"book/src/output/$name.txt" || true
  # One row per file: drop the old one, append the new one.
  awk -F'\t' -v f="$name.txt" '$1 != f' "$table" >"$table.tmp"
  printf '%s\t%s\t%s\t%s\n' "$name.txt" "$date_utc" "$machine" "$commit" >>"$table.tmp"
  mv "$table.tmp" "$table"
  echo "capture_outputs: book/src/output/$name.txt ($machine, $date_utc)"
done
