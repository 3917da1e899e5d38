"""Chapter 7's table of bad inputs (book/src/ch07-bad-inputs.md), for scripts/gen_book.py."""

from __future__ import annotations

import re
from typing import Dict, List, Sequence, Tuple

from .common import Book, GenError, ROOT, Snippets, read_text, table

# ---- chapter 7: the table of bad inputs ----------------------------------------------------------
#
# Every bad input the buffer refuses, with the test that covers it, generated so that the table
# cannot drift from the tests: the rows refused before a launch are read from the CPU tests of
# src/bad_inputs.rs (each case there spoils good arguments, calls every plan, and names the
# message one of them must give); the rows only the GPU can see come from DEVICE_GUARDS below,
# which names the tests that plant each one.

BAD_INPUTS = "src/bad_inputs.rs"
ERRORS = "src/error.rs"
PY_ERRORS = "python/src/errors.rs"

# The case tables of src/bad_inputs.rs -> the snippet each becomes, in page order. A table there
# that is missing here stops the script, so a new group of cases reaches the book.
CASE_TABLES = {"NORMAL_CASES": "normal", "LL_CASES": "low_latency"}

# The Python call (and a note on how it is called) each plan wrapper of src/bad_inputs.rs stands
# for. The notify plan runs inside a dispatch without a handle; a cached dispatch skips it.
WRAPPER_CALLS = {
    "layout": ("get_dispatch_layout", ""),
    "notify": ("dispatch", "without `handle`"),
    "dispatch": ("dispatch", ""),
    "combine": ("combine", ""),
    "ll_dispatch": ("low_latency_dispatch", ""),
    "ll_combine": ("low_latency_combine", ""),
}
# A call that takes a handle only sometimes: how the table says it was given one.
HANDLE_NOTES = {"dispatch": "with `handle`"}
# Fields of the tests' argument structs that group arguments (the argument is the field after),
# and fields that stand for something other than an argument of their name.
ARG_GROUPS = {"notify_in", "notify_out", "dispatch_in", "dispatch_out", "combine_in", "combine_out", "options", "layout"}
ARG_NAMES = {"phases": "the receive hook", "pending": "the receive hook"}

BEFORE_LAUNCH = "before launch, by its plan"

# The bad inputs only the GPU can see. The kernel records the first in the buffer's input-error
# record, skips what it cannot use and completes the call on every rank; the next check() (or
# call) raises it once, and the buffer stays usable. `variant`: the BufferError of src/error.rs
# that reports it; `message`: a part of that variant's message (checked against it); `tests`:
# (file, function) that plant the input or check its message (checked to exist); `covers`, if
# set, says what the tests cover when it is less than the whole row.
DEVICE_GUARDS: List[Dict[str, object]] = [
    {
        "variant": "RecvOverflow",
        "argument": "`num_worst_tokens`",
        "input": "below the rows this rank receives",
        "calls": "`dispatch`; `combine` with that handle",
        "when": "on the GPU: the rows past the outputs are dropped (the combine sums zeros for them); "
                "raised by the next `check()` or call",
        "message": "Pass num_worst_tokens >= {needed}",
        "tests": [("src/bin/ch07-buffer/guards.rs", "check_worst_tokens_too_small"),
                  ("src/bin/ch07-buffer/guards.rs", "check_combine_past_the_rows"),
                  ("src/error.rs", "a_dispatch_past_num_worst_tokens_names_it_and_the_rows_needed")],
    },
    {
        "variant": "CountsMismatch",
        "argument": "`num_tokens_per_rank`",
        "input": "disagrees with `is_token_in_rank`",
        "calls": "`dispatch` without `handle`",
        "when": "on the GPU: the notify step goes by `is_token_in_rank`; raised by its wait or the "
                "next `check()`",
        "message": "num_tokens_per_rank[{rank}] = {given}, but is_token_in_rank sends {counted} tokens",
        "tests": [("src/bin/ch07-buffer/guards.rs", "check_counts_disagree"),
                  ("src/error.rs", "counts_that_disagree_with_the_routing_name_the_rank_and_both_numbers")],
    },
    {
        "variant": "BadExpert",
        "argument": "`topk_idx`",
        "input": "an expert id outside -1..num_experts",
        "calls": "`get_dispatch_layout`",
        "when": "on the GPU: the entry is skipped; raised by the next `check()`, event wait or call",
        "message": "holds expert {value}, outside -1..{num_experts}",
        "tests": [("scripts/ch07_buffer.py", "bad_input")],
    },
    {
        "variant": "BadExpert",
        "argument": "`topk_idx`",
        "input": "an expert id outside -1..num_experts",
        "calls": "`low_latency_dispatch`, `low_latency_combine`",
        "when": "on the GPU: both kernels skip the entry; raised by the next call, the receive hook "
                "or `check()`",
        "message": "holds expert {value}, outside -1..{num_experts}",
        "tests": [("src/bin/ch08-low-latency/checks.rs", "input_record"),
                  ("scripts/ch08_low_latency.py", "bad_input"),
                  ("scripts/ch08_low_latency.py", "graph_replays")],
    },
    {
        "variant": "SlotsFull",
        "argument": "`topk_idx`",
        "input": "a token names one expert twice (its run of T slots overflows)",
        "calls": "`low_latency_dispatch`",
        "when": "on the GPU: the extra copies are dropped; raised by the next `check()` or call",
        "message": "must not name one expert twice",
        "tests": [("src/bin/ch08-low-latency/checks.rs", "input_record")],
    },
    {
        "variant": "BadHandle",
        "argument": "`handle`",
        "input": "not the handle of the dispatch whose results `x` holds",
        "calls": "`low_latency_combine`",
        "when": "on the GPU: the rows it cannot place are skipped; raised by the next `check()` or call",
        "message": "pass the handle of the dispatch whose results x holds",
        "tests": [("src/bin/ch08-low-latency/guards.rs", "check_bad_handle")],
    },
]

RUST_STRING = r'"((?:[^"\\]|\\[\s\S])*)"'
RUST_SKIP = re.compile(RUST_STRING + r"|//[^\n]*|'(?:[^'\\\n]|\\.)'")  # strings, comments, chars


def rust_string(literal: str) -> str:
    """A Rust string literal's text: line continuations joined, escapes undone."""
    text = re.sub(r"\\\n\s*", "", literal)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


def rust_items(text: str, start: int, path: str, split: bool = False) -> List[str]:
    """The text from `start` (just after an opening bracket) to its closing one, or with `split`
    its top-level comma-separated items. Brackets inside strings, comments and chars are skipped."""
    depth, i, items, item_start = 1, start, [], start
    while i < len(text):
        skip = RUST_SKIP.match(text, i)
        if skip:
            i = skip.end()
            continue
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                items.append(text[item_start:i])
                return [t.strip() for t in items if t.strip()] if split else ["".join(items)]
        elif c == "," and depth == 1 and split:
            items.append(text[item_start:i])
            item_start = i + 1
        i += 1
    raise GenError(f"{path}: unbalanced brackets after offset {start}")


def rust_fns(text: str, path: str) -> Dict[str, Tuple[str, str]]:
    """A file's functions: name -> (whatever precedes `fn` on its lines (attributes), body)."""
    fns = {}
    for m in re.finditer(r"(?m)^((?:[ \t]*#\[[^\n]*\]\n)*)[ \t]*(?:pub(?:\([\w:]+\))? )?fn (\w+)\b", text):
        brace = text.find("{", m.end())
        if brace < 0:
            continue
        fns[m.group(2)] = (m.group(1), rust_items(text, brace + 1, path)[0])
    return fns


def test_exists(path: str, name: str) -> None:
    """Stops the script when a test a row names is gone."""
    pattern = rf"\bdef {name}\(" if path.endswith(".py") else rf"\bfn {name}\b"
    if not re.search(pattern, read_text(path)):
        raise GenError(f"{path}: no {name}, which DEVICE_GUARDS of scripts/bookgen/bad_inputs.py names as a test")


def error_messages() -> Dict[str, str]:
    """BufferError variant -> its #[error("...")] message, from src/error.rs."""
    found = {m.group(2): rust_string(m.group(1)) for m in
             re.finditer(r"#\[error\(\s*" + RUST_STRING + r"\s*\)\]\s*(\w+)\s*[{(]", read_text(ERRORS))}
    if not found:
        raise GenError(f"{ERRORS}: no #[error(\"...\")] variants")
    return found


def python_class(variants: Sequence[str]) -> str:
    """InvalidArgumentError, after checking that Python raises it for these BufferErrors: each is
    in is_invalid_input(), and python/src/errors.rs maps that to InvalidArgumentError."""
    body = rust_fns(read_text(ERRORS), ERRORS).get("is_invalid_input", ("", ""))[1]
    missing = [v for v in variants if not re.search(rf"Self::{v}\b", body)]
    if missing:
        raise GenError(f"{ERRORS}: {', '.join(missing)} not in is_invalid_input(), which the table of bad "
                       "inputs needs for InvalidArgumentError")
    if not re.search(r"is_invalid_input\(\) => Error::Invalid\(", read_text(PY_ERRORS)):
        raise GenError(f"{PY_ERRORS}: is_invalid_input() no longer maps to InvalidArgumentError")
    return "InvalidArgumentError"


def plan_bodies() -> Dict[str, str]:
    """Every `pub fn plan_*` under src/: name -> body."""
    plans = {}
    for path in sorted((ROOT / "src").rglob("*.rs")):
        text = path.read_text()
        if "pub fn plan_" in text:
            rel = str(path.relative_to(ROOT))
            plans.update({n: body for n, (_, body) in rust_fns(text, rel).items() if n.startswith("plan_")})
    return plans


def code(text: str) -> str:
    if "`" in text or "|" in text:
        raise GenError(f"table of bad inputs: cannot quote {text!r} in a table cell")
    return f"`{text}`"


def join_calls(calls: Sequence[Tuple[str, str]]) -> str:
    """'`dispatch` without `handle`, `combine`': a call's note dropped where it has several."""
    notes: Dict[str, List[str]] = {}
    for call, note in calls:
        notes.setdefault(call, [])
        if note not in notes[call]:
            notes[call].append(note)
    return ", ".join(f"`{c}`" + (f" {n[0]}" if len(n) == 1 and n[0] else "") for c, n in notes.items())


def case_rows(text: str, table_name: str, fns: Dict[str, Tuple[str, str]],
              plans: Dict[str, str]) -> Tuple[str, List[List[str]]]:
    """The rows of one case table of src/bad_inputs.rs, and the #[test] that runs it: each case's
    arguments are the fields its spoiler assigns; the calls refusing it, the plans that take them."""
    start = re.search(rf"const {table_name}: &\[\w+\] = &\[", text)
    if start is None:
        raise GenError(f"{BAD_INPUTS}: no const {table_name}")
    tests = [n for n, (attrs, body) in fns.items() if "#[test]" in attrs and re.search(rf"\b{table_name}\b", body)]
    if len(tests) != 1:
        raise GenError(f"{BAD_INPUTS}: expected one #[test] that runs {table_name}, found {tests}")
    test = tests[0]
    listed = re.search(rf"assert_refused\(\s*{table_name}\s*,.*?&\[([\w,\s]+)\]", fns[test][1], re.S)
    if listed is None:
        raise GenError(f"{BAD_INPUTS}: {test} does not call assert_refused({table_name}, good, &[plans])")
    wrappers = [w.strip() for w in listed.group(1).split(",") if w.strip()]
    for w in wrappers:
        if w not in WRAPPER_CALLS or w not in fns:
            raise GenError(f"{BAD_INPUTS}: plan wrapper {w} (of {test}) is not in WRAPPER_CALLS of scripts/bookgen/bad_inputs.py")
    reads = {w: set(re.findall(r"\ba\.(\w+)", fns[w][1])) for w in wrappers}  # the argument fields it passes
    planned = {w: " ".join(plans.get(p, "") for p in re.findall(r"\b(plan_\w+)\(", fns[w][1])) for w in wrappers}
    case = re.compile(r"\(\s*" + RUST_STRING + r",\s*\|(\w+),\s*(\w+)\|(.*),\s*" + RUST_STRING + r"\s*\)", re.S)
    rows = []
    for item in rust_items(text, start.end(), BAD_INPUTS, split=True):
        m = case.fullmatch(item)
        if m is None:
            raise GenError(f"{BAD_INPUTS}: {table_name}: cannot read the case {item[:60]!r}")
        name, a, spec, spoil, message = rust_string(m.group(1)), m.group(2), m.group(3), m.group(4), rust_string(m.group(5))
        args: List[str] = []
        calls: List[Tuple[str, str]] = []
        for path in re.findall(rf"\b{a}\.([\w.]+)", spoil) if a != "_" else []:
            field, *rest = path.split(".")
            if field == "handle" and rest:
                arg = f"`handle` (`{rest[0]}`)"
            elif field in ARG_GROUPS and rest:
                arg = f"`{rest[0]}`"
            else:
                arg = ARG_NAMES.get(field, f"`{field}`")
            if arg not in args:
                args.append(arg)
            for w in wrappers:
                if field in reads[w]:
                    call, note = WRAPPER_CALLS[w]
                    calls.append((call, HANDLE_NOTES.get(w, note) if field == "handle" else note))
        if spec != "_":
            # The buffer itself: refused by the plans that read the part spoiled (or all of it).
            whole = re.search(rf"\*{spec}\s*=", spoil) is not None
            parts = re.findall(rf"\b{spec}\.([\w.]+)", spoil)
            args += ["the `Buffer`"] if whole else [f"the `Buffer`'s `{p.split('.')[-1]}`" for p in parts]
            for w in wrappers:
                body = planned[w]
                if whole or re.search(r"[(,]\s*spec\s*[,)]", body) or any(f"spec.{p}" in body for p in parts):
                    calls.append(WRAPPER_CALLS[w])
        if not args or not calls:
            raise GenError(f"{BAD_INPUTS}: {table_name}: cannot tell which argument or call {name!r} spoils")
        rows.append([", ".join(args), name, join_calls(calls), BEFORE_LAUNCH, code(message), f"`{test}`"])
    if not rows:
        raise GenError(f"{BAD_INPUTS}: {table_name} is empty")
    return test, rows


def config_rows(fns: Dict[str, Tuple[str, str]]) -> List[List[str]]:
    """The bad configs: a #[test] that calls a plan with Config::new(...) values, each one field
    away from the good config()."""
    good = re.search(r"Config::new\(([\d,\s]+)\)", fns.get("config", ("", ""))[1])
    struct = re.search(r"pub struct Config \{(.*?)\n\}", read_text("src/config.rs"), re.S)
    fields = re.findall(r"pub (\w+): u32", struct.group(1)) if struct else []
    if good is None or not fields:
        raise GenError(f"{BAD_INPUTS}: no config() = Config::new(...), or src/config.rs no Config fields")
    good_values = [v.strip() for v in good.group(1).split(",")]
    rows = []
    for name, (attrs, body) in fns.items():
        cases = re.findall(r"\(Config::new\(([\d,\s]+)\)\.unwrap\(\),\s*" + RUST_STRING + r"\)", body)
        if not cases:
            continue
        calls = [WRAPPER_CALLS[p] for p in re.findall(r"\bplan_(\w+)\(", body) if p in WRAPPER_CALLS]
        if "#[test]" not in attrs or not calls:
            raise GenError(f"{BAD_INPUTS}: {name} lists bad configs but is not a #[test] that calls a plan")
        for values, message in cases:
            changed = [f"`{f}` = {v.strip()} ({g} passes)"
                       for f, v, g in zip(fields, values.split(","), good_values) if v.strip() != g]
            if len(changed) != 1:
                raise GenError(f"{BAD_INPUTS}: {name}: a bad config must change one field of config()")
            rows.append(["`config`", f"`Config` with {changed[0]}", join_calls(calls), BEFORE_LAUNCH,
                         code(rust_string(message)), f"`{name}`"])
    if not rows:
        raise GenError(f"{BAD_INPUTS}: no #[test] with bad Config::new(...) values")
    return rows


def gen_bad_inputs(book: Book) -> None:
    s = Snippets("bad_inputs", origin=f"{BAD_INPUTS} and DEVICE_GUARDS in scripts/bookgen/bad_inputs.py")
    text = read_text(BAD_INPUTS)
    fns, plans = rust_fns(text, BAD_INPUTS), plan_bodies()
    found = re.findall(r"const (\w+_CASES): &\[", text)
    if sorted(found) != sorted(CASE_TABLES):
        raise GenError(f"{BAD_INPUTS}: case tables {found}, but CASE_TABLES of scripts/bookgen/bad_inputs.py names "
                       f"{list(CASE_TABLES)}")
    header = ["Argument", "What is wrong", "Refused by", "When", "Python raises (message contains)", "Test"]
    py = python_class(["Invalid", "BufferTooSmall"])
    for table_name, anchor in CASE_TABLES.items():
        test, rows = case_rows(text, table_name, fns, plans)
        if anchor == "normal":
            rows += config_rows(fns)
        for row in rows:
            row[4] = f"`{py}`: {row[4]}"
        s.add(anchor, table(header, ["l"] * len(header), rows) +
              f"\n\n*`{BAD_INPUTS}`: each row of `{test}` is a case of `{table_name}`, which spoils good "
              "arguments, calls every plan, and expects one of them to fail with the quoted message.*")
    messages = error_messages()
    rows = []
    for guard in DEVICE_GUARDS:
        variant, message = str(guard["variant"]), str(guard["message"])
        if message not in messages.get(variant, ""):
            raise GenError(f"{ERRORS}: BufferError::{variant}'s message does not say {message!r}: update "
                           "DEVICE_GUARDS in scripts/bookgen/bad_inputs.py")
        tests = []
        for path, name in guard["tests"]:  # type: ignore[attr-defined]
            test_exists(path, name)
            tests.append(f"`{name}` ({path})")
        covers = f" ({guard['covers']})" if guard.get("covers") else ""
        rows.append([str(guard["argument"]), str(guard["input"]), str(guard["calls"]), str(guard["when"]),
                     f"`{python_class([variant])}`: {code(message)}", "; ".join(tests) + covers])
    variants = ", ".join(f"`BufferError::{v}`" for v in dict.fromkeys(str(g["variant"]) for g in DEVICE_GUARDS))
    header[2] = "Found by"
    s.add("device", table(header, ["l"] * len(header), rows) +
          f"\n\n*In Rust: {variants} (`src/error.rs`), after which the buffer stays usable. Braces name "
          "the numbers the message gives.*")
    book.write(s)
