#!/usr/bin/env bash
# Copies what each chapter printed in a GPU run into the book: for every log
# LOG_DIR/<binary>-n<N>.log that scripts/gpu_test.sh wrote, book/src/output/<binary>-n<N>.txt
# gets the program's own lines (torchrun's banner and warnings left out). The book includes
# these files, so its output is always a real run's.
#
# Usage: scripts/capture_outputs.sh LOG_DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log_dir=${1:?usage: scripts/capture_outputs.sh LOG_DIR}
shopt -s nullglob
for log in "$log_dir"/*-n[0-9]*.log; do
  name=$(basename "$log" .log)
  # torchrun's lines start with a glog prefix (W1122 15:27:21...) or are its banner of stars.
  grep -Ev '^[WIEF][0-9]{4} [0-9:.]+ |^\*+$' "$log" >"book/src/output/$name.txt" || true
  echo "capture_outputs: book/src/output/$name.txt"
done
