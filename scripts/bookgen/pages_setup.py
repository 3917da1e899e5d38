"""Captions of the captures (every page), chapters 1 and 2, for scripts/gen_book.py."""

from __future__ import annotations

import re

from .common import Book, CAPTURES, claim, GenError, numbers_in, ROOT, size_label, Snippets, span

# ---- captures (every page) -------------------------------------------------------------------------


def gen_captures(book: Book) -> None:
    """One caption per capture: 'machine, captured date at commit X'."""
    s = Snippets("captures")
    for name in sorted(book.captures.rows):
        if not (ROOT / "book/src/output" / name).is_file():
            raise GenError(f"{CAPTURES}: row for {name}, which is not in book/src/output/")
        anchor = re.sub(r"[^a-z0-9]+", "_", name.lower().removesuffix(".txt")).strip("_")
        s.add(anchor, book.captures.caption(name))
    book.write(s)


# ---- chapter 1 -----------------------------------------------------------------------------------


def gen_ch01(book: Book) -> None:
    s = Snippets("ch01")
    times = []
    for name in ("ch01-bootstrap-n1.txt", "ch01-bootstrap-n2.txt"):
        times += numbers_in(book.captures.text(name), r"initialised in ([\d.]+) ms")
    if not times:
        raise GenError("ch01 captures: no 'initialised in X ms' lines")
    s.add("init_ms", f"{span(times, lambda v: f'{v:.0f}')} ms")
    claim(min(times) > 100, "ch01-bootstrap.md", "initialisation takes hundreds of milliseconds")
    book.write(s)


# ---- chapter 2 -----------------------------------------------------------------------------------


def gen_ch02(book: Book) -> None:
    s = Snippets("ch02")
    text = book.captures.text("ch02-symmetric-memory-n2.txt")
    distances = {int(v) for v in numbers_in(text, r"second - first = (\d+) bytes")}
    if len(distances) != 1:
        raise GenError(f"ch02 capture: expected one allocation distance, found {sorted(distances)}")
    distance = distances.pop()
    # The page explains the distance from the request: 1000 bytes aligned to 256 reserve
    # 1000 + 256 bytes, rounded up to NVSHMEM's 512-byte granule.
    claim(distance == -(-(1000 + 256) // 512) * 512, "ch02-symmetric-memory.md",
          "the allocation distance is 1000 + 256 bytes rounded up to 512")
    s.add("distance", f"{distance} bytes")
    words = {int(v) for v in numbers_in(text, r"stored (\d+) words")}
    if len(words) != 1:
        raise GenError("ch02 capture: expected one 'stored N words' count")
    count = words.pop()
    s.add("stored", f"{count:,} words ({size_label(count * 4)})")
    heap = book.captures.text("ch02-symmetric-memory-small-heap.txt")
    claim("NVSHMEM grew the heap" in heap, "ch02-symmetric-memory.md",
          "with a 256 MiB heap, the 512 MiB allocation succeeded")
    book.write(s)
