#!/usr/bin/env python3
"""Checks the built book (run `mdbook build book` first), as scripts/test.sh does:

1. history   no page tells the project's development history ("v5", "first version", "went
             from 3 to 4"): that belongs in benchmarks/notes/. Checked on the rendered text of
             every page, code listings included, after removing the names in HISTORY_ALLOWED.
2. tables    no table row renders as a paragraph of literal pipes (a blank line or a stray
             line inside a Markdown table ends it; the rows after it print as text).
3. links     every link, anchor (#fragment) and image of every page resolves in the built book.
4. listings  no code listing pulled in by anchor ({{#include path:anchor}}) is longer than
             MAX_LISTING_LINES, except the ones in LISTING_ALLOWED, each with the reason.

    python3 scripts/check_book.py              # all four, on book/build
    python3 scripts/check_book.py --self-test  # shows each check catches what it is for

Python 3.9+, standard library only. Exit status 1 on any problem, each reported as
`file: problem`.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
BOOK_SRC = ROOT / "book" / "src"
BOOK_BUILD = ROOT / "book" / "build"

# ---- 1. development history ------------------------------------------------------------------

HISTORY = re.compile(
    r"\bv[0-9]{1,2}\b|first version|one version before|went from [0-9]|this session"
    r"|earlier version|previous version|before the fix|used to (?:be|take|run)",
    re.IGNORECASE,
)
# Names that look like history and are not. Each pattern is removed from a page's text before
# HISTORY is searched.
HISTORY_ALLOWED = [
    r"DeepEP (?:v1|V2)\b",  # the release of DeepEP this project follows, and its successor
    r"DeepSeek-V[0-9]\b",  # a model whose shapes the benchmarks use
    r"\.v[248]\.",  # PTX vector suffixes: st.volatile.global.v4.u32
    r"\b(?:u|s|b|f)(?:8|16|32|64)x[0-9]+\b",  # vector type names
    r"\bv[0-9] *(?:[-+*/<>=!,;)\]]|\+=|$)",  # a variable named v0, v1 in a listing (v0 < n)
    r"uint[0-9]+_t v[0-9]\b",  # its declaration
]

# ---- 4. listing length -----------------------------------------------------------------------

MAX_LISTING_LINES = 60
# (file included, anchor) -> why it may be longer. Keep this list short: a listing shows the
# lesson, not the harness, and a long one is split by adding anchors around its parts.
LISTING_ALLOWED: Dict[Tuple[str, str], str] = {}

# ---- helpers --------------------------------------------------------------------------------


class PageText(HTMLParser):
    """Collects a page's text (code included, scripts and styles not), its paragraphs' text,
    its link targets and its element ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: List[str] = []
        self.paragraphs: List[str] = []
        self.links: List[Tuple[str, str]] = []  # (tag, target)
        self.ids: Set[str] = set()
        self._skip = 0
        self._paragraph: Optional[List[str]] = None
        self._in_nav = 0

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if values.get("name") and tag == "a":
            self.ids.add(values["name"] or "")
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "nav" or (tag == "div" and "sidebar" in (values.get("class") or "")):
            self._in_nav += 1
        if tag == "p":
            self._paragraph = []
        if tag == "a" and values.get("href") is not None:
            self.links.append(("a", values["href"] or ""))
        if tag == "img" and values.get("src") is not None:
            self.links.append(("img", values["src"] or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if tag == "nav" and self._in_nav:
            self._in_nav -= 1
        if tag == "p" and self._paragraph is not None:
            self.paragraphs.append("".join(self._paragraph))
            self._paragraph = None

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        if self._paragraph is not None:
            self._paragraph.append(data)


def parse_page(path: Path) -> PageText:
    parser = PageText()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def main_text(page_html: str) -> str:
    """The page's own content: what is inside <main>, without the sidebar and navigation."""
    found = re.search(r"<main>(.*)</main>", page_html, re.DOTALL)
    return found.group(1) if found else page_html


def book_pages(build: Path) -> List[Path]:
    """The chapters' HTML pages (not print.html, 404.html or the table of contents)."""
    skip = {"print.html", "404.html", "toc.html"}
    return sorted(p for p in build.glob("*.html") if p.name not in skip)


# ---- 1. history ------------------------------------------------------------------------------


def history_problems(name: str, text: str) -> List[str]:
    cleaned = text
    for pattern in HISTORY_ALLOWED:
        cleaned = re.sub(pattern, " ", cleaned, flags=re.MULTILINE)
    problems = []
    for found in HISTORY.finditer(cleaned):
        start, end = max(0, found.start() - 50), min(len(cleaned), found.end() + 50)
        context = " ".join(cleaned[start:end].split())
        problems.append(f"{name}: development history on the page ({found.group(0)!r}): ...{context}...")
    return problems


# ---- 2. tables -------------------------------------------------------------------------------

PIPE_ROW = re.compile(r"^\s*\|.*\|.*\|\s*$")


def table_problems(name: str, paragraphs: Iterable[str]) -> List[str]:
    problems = []
    for paragraph in paragraphs:
        for line in paragraph.splitlines():
            if PIPE_ROW.match(line):
                problems.append(f"{name}: a table row renders as text (a blank line inside the table?): {line.strip()[:100]}")
                break
    return problems


# ---- 3. links --------------------------------------------------------------------------------


def link_problems(build: Path, pages: List[Path]) -> List[str]:
    parsed: Dict[Path, PageText] = {}

    def page(path: Path) -> PageText:
        if path not in parsed:
            parsed[path] = parse_page(path)
        return parsed[path]

    problems = []
    for path in pages:
        content = PageText()
        content.feed(main_text(path.read_text(encoding="utf-8")))
        for tag, target in content.links:
            parts = urlsplit(html.unescape(target))
            if parts.scheme or parts.netloc or target.startswith(("mailto:", "javascript:")):
                continue  # external: not checked offline
            if not parts.path and not parts.fragment:
                problems.append(f"{path.name}: empty {tag} target")
                continue
            resolved = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            try:
                resolved.relative_to(build.resolve())
            except ValueError:
                problems.append(f"{path.name}: {tag} {target!r} points outside the book")
                continue
            if resolved.is_dir():
                resolved = resolved / "index.html"
            if not resolved.is_file():
                problems.append(f"{path.name}: broken {tag} {target!r} (no {resolved.relative_to(build.resolve())})")
                continue
            if parts.fragment and resolved.suffix == ".html":
                if unquote(parts.fragment) not in page(resolved).ids:
                    problems.append(f"{path.name}: broken anchor {target!r} (no id {parts.fragment!r} in {resolved.name})")
    return problems


# ---- 4. listings -----------------------------------------------------------------------------

INCLUDE = re.compile(r"\{\{\s*#(?:include|rustdoc_include)\s+([^}\s]+)\s*\}\}")
ANCHOR_START = re.compile(r"ANCHOR:\s*([\w-]+)")
ANCHOR_END = re.compile(r"ANCHOR_END:\s*([\w-]+)")


def anchored_lines(text: str, anchor: str) -> Optional[List[str]]:
    """The lines mdBook includes for `anchor` (marker lines of any anchor dropped), or None."""
    lines: List[str] = []
    inside = False
    for line in text.splitlines():
        if inside:
            end = ANCHOR_END.search(line)
            if end and end.group(1) == anchor:
                return lines
            if not ANCHOR_START.search(line) and not ANCHOR_END.search(line):
                lines.append(line)
        else:
            start = ANCHOR_START.search(line)
            if start and start.group(1) == anchor:
                inside = True
    return lines if inside else None


def listing_lengths(src: Path, root: Path) -> List[Tuple[str, str, str, int]]:
    """(page, included file relative to root, anchor, lines) for every anchored include."""
    found = []
    for md in sorted(src.rglob("*.md")):
        if "generated" in md.relative_to(src).parts:
            continue
        for match in INCLUDE.finditer(md.read_text(encoding="utf-8")):
            path, _, anchor = match.group(1).partition(":")
            if not anchor or anchor[0].isdigit() or ":" in anchor:
                continue  # whole files and line ranges: captures and snippets, not listings
            target = (md.parent / path).resolve()
            if "generated" in target.parts or not target.is_file():
                continue  # the anchor check (tests/book_anchors.rs) reports missing files
            lines = anchored_lines(target.read_text(encoding="utf-8"), anchor)
            if lines is None:
                continue
            found.append((md.name, str(target.relative_to(root)), anchor, len(lines)))
    return found


def listing_problems(src: Path, root: Path) -> Tuple[List[str], List[str]]:
    problems, notes = [], []
    used = set()
    for page, path, anchor, count in listing_lengths(src, root):
        if count <= MAX_LISTING_LINES:
            continue
        reason = LISTING_ALLOWED.get((path, anchor))
        if reason:
            used.add((path, anchor))
            notes.append(f"{page}: {path}:{anchor} is {count} lines (allowed: {reason})")
        else:
            problems.append(
                f"{page}: listing {path}:{anchor} is {count} lines (limit {MAX_LISTING_LINES}): "
                "show the lesson, not the harness; split it with more anchors"
            )
    for key, reason in LISTING_ALLOWED.items():
        if key not in used:
            notes.append(f"LISTING_ALLOWED entry {key[0]}:{key[1]} is no longer needed ({reason}): remove it")
    return problems, notes


# ---- driver ----------------------------------------------------------------------------------


def check(build: Path, src: Path, root: Path) -> Tuple[List[str], List[str]]:
    if not build.is_dir():
        return [f"{build}: no built book (run `mdbook build book` first)"], []
    pages = book_pages(build)
    if not pages:
        return [f"{build}: no pages"], []
    problems: List[str] = []
    for path in pages:
        content = PageText()
        content.feed(main_text(path.read_text(encoding="utf-8")))
        problems += history_problems(path.name, "".join(content.text))
        problems += table_problems(path.name, content.paragraphs)
    problems += link_problems(build, pages)
    listing, notes = listing_problems(src, root)
    return problems + listing, notes


def self_test() -> int:
    """Each check on a small made-up book: it must find exactly what was planted."""
    failures = []

    def expect(what: str, problems: List[str], count: int) -> None:
        if len(problems) != count:
            failures.append(f"{what}: expected {count} problem(s), got {problems}")

    expect("history: v5", history_problems("p", "the v5 kernel was faster"), 1)
    expect("history: first version", history_problems("p", "A first version sent it twice"), 1)
    expect("history: went from", history_problems("p", "combine went from 286 to 421"), 1)
    expect("history: allowed names", history_problems(
        "p", "DeepEP v1 and DeepEP V2; DeepSeek-V3; st.volatile.global.v4.u32; for (v0 = x; v0 < n;"), 0)
    expect("tables: broken", table_problems("p", ["| a | b |\n| c | d |"]), 1)
    expect("tables: prose with one pipe", table_problems("p", ["a | b"]), 0)
    with tempfile.TemporaryDirectory() as tmp:
        build = Path(tmp) / "build"
        build.mkdir()
        (build / "a.html").write_text(
            '<main><h2 id="x">X</h2><a href="b.html#y">ok</a><a href="b.html#nope">bad anchor</a>'
            '<a href="c.html">missing page</a><img src="fig.png"><a href="#x">self</a>'
            '<a href="https://example.com">external</a></main>')
        (build / "b.html").write_text('<main><p id="y">Y</p></main>')
        expect("links", link_problems(build, [build / "a.html", build / "b.html"]), 3)
        src = Path(tmp) / "src"
        src.mkdir()
        code = "\n".join(["// ANCHOR: long"] + [f"line {i}" for i in range(61)] + ["// ANCHOR_END: long",
                         "// ANCHOR: short", "one", "// ANCHOR_END: short"])
        (Path(tmp) / "k.cu").write_text(code)
        (src / "ch.md").write_text("{{#include ../k.cu:long}}\n{{#include ../k.cu:short}}\n{{#include ../k.cu}}\n")
        problems, _ = listing_problems(src, Path(tmp))
        expect("listings", problems, 1)
    for failure in failures:
        print(f"check_book: self-test FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("check_book: self-test passed (history, tables, links, listings each catch their case)")
    return 1 if failures else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--build", type=Path, default=BOOK_BUILD)
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    problems, notes = check(args.build, BOOK_SRC, ROOT)
    for note in notes:
        print(f"check_book: note: {note}")
    for problem in problems:
        print(f"check_book: {problem}", file=sys.stderr)
    if problems:
        print(f"check_book: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_book: {len(book_pages(args.build))} pages: no history, no broken tables, links or anchors, listings <= {MAX_LISTING_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
