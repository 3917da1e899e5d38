#!/usr/bin/env python3
"""Writes every measured number the book quotes, from the committed results.

The pages never type a measured number: they include it from a generated snippet,
`{{#include generated/<page>.md:<snippet>}}`, and this script writes those snippets (tables,
single figures, the captions that say which machine and which day) from the CSVs and logs in
benchmarks/results/ and the captures in book/src/output/. It also copies the plots the pages
show into book/src/generated/.

    python3 scripts/gen_book.py           # rewrite book/src/generated/
    python3 scripts/gen_book.py --check   # exit 1 if anything there is stale (scripts/test.sh)

Which file is the result of record for each table is decided in one place, MANIFEST in
scripts/bookgen/common.py: when a new run is committed (say benchmarks/results/coll_h100_4gpu.csv), point its entry at
the new file, run this script, and read the pages it changed. The device and the date a page
quotes come from each result's own `# gpu:` and `# date:` header lines, never from here.

It also writes chapter 7's table of bad inputs (generated/bad_inputs.md) from the tests that
cover them: the cases of src/bad_inputs.rs, read from the source, and DEVICE_GUARDS (in
scripts/bookgen/bad_inputs.py) for what only the GPU can see. A named test or message that is gone stops the script.

Some sentences of the book state a comparison ("the copy engine wins from 64 MiB"); where the
data decides such a sentence, a `claim(...)` in its generator checks it, and a result that contradicts the
prose stops the script with a message naming the page to rewrite.

This file is the driver: the generators live in scripts/bookgen/, one module per concern
(pages_setup: the captures' captions, chapters 1 and 2; pages_p2p: chapter 3 and the PyTorch
page; pages_coll: chapter 4; inter_node: chapter 5; overlap: chapter 6 and the MoE page;
pages_buffer: chapters 7 and 8; bad_inputs: chapter 7's table of bad inputs; internode_normal:
chapter 9's normal mode across nodes (its cost model and GPU checks); cluster: Appendix A's cost
model), beside what they share (common.py, collectives.py).

Python 3.9+, standard library only.
"""

from __future__ import annotations

import argparse

import sys
from typing import Callable, Dict, List, Optional, Sequence

from bookgen.bad_inputs import gen_bad_inputs
from bookgen.cluster import gen_cluster
from bookgen.common import Book, GenError, OUT_DIR
from bookgen.inter_node import gen_ch05
from bookgen.internode_normal import gen_ch09_normal
from bookgen.overlap import gen_ch06, gen_moe
from bookgen.pages_buffer import gen_ch07, gen_ch08
from bookgen.pages_coll import gen_ch04
from bookgen.pages_p2p import gen_ch03, gen_python
from bookgen.pages_setup import gen_captures, gen_ch01, gen_ch02
from bookgen.reliability import gen_reliability

# ---- main ----------------------------------------------------------------------------------------

GENERATORS: List[Callable[[Book], None]] = []  # filled below, in page order


def generate() -> Dict[str, bytes]:
    book = Book()
    for gen in GENERATORS:
        gen(book)
    return book.files


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with book/src/generated/ instead of writing")
    args = parser.parse_args(argv)
    try:
        files = generate()
    except GenError as error:
        print(f"gen_book: error: {error}", file=sys.stderr)
        return 1
    existing = {p.name: p.read_bytes() for p in OUT_DIR.glob("*") if p.is_file()} if OUT_DIR.is_dir() else {}
    if args.check:
        stale = sorted(name for name in files if existing.get(name) != files[name])
        extra = sorted(set(existing) - set(files))
        for name in stale:
            print(f"gen_book: stale or missing: book/src/generated/{name}", file=sys.stderr)
        for name in extra:
            print(f"gen_book: not generated any more: book/src/generated/{name}", file=sys.stderr)
        if stale or extra:
            print("gen_book: run `python3 scripts/gen_book.py` and commit book/src/generated/", file=sys.stderr)
            return 1
        print(f"gen_book: book/src/generated/ is up to date ({len(files)} files)")
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in set(existing) - set(files):
        (OUT_DIR / name).unlink()
    changed = 0
    for name, data in sorted(files.items()):
        if existing.get(name) != data:
            (OUT_DIR / name).write_bytes(data)
            changed += 1
    print(f"gen_book: wrote book/src/generated/ ({len(files)} files, {changed} changed)")
    return 0


GENERATORS += [gen_captures, gen_ch01, gen_ch02, gen_ch03, gen_ch04, gen_ch05, gen_ch06, gen_ch07, gen_bad_inputs, gen_reliability,
               gen_ch08, gen_ch09_normal, gen_moe, gen_python, gen_cluster]


if __name__ == "__main__":
    sys.exit(main())
