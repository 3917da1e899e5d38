//! The book never pastes code: it includes it from crates that build and run. This test makes
//! sure every include in `book/src/**/*.md` still points at something:
//!
//! - `{{#include PATH}}`, `{{#include PATH:ANCHOR}}`, `{{#include PATH:START:END}}` (and the
//!   other line-range forms) and `{{#rustdoc_include ...}}` with the same arguments;
//! - PATH is resolved relative to the directory of the `.md` file, as mdBook does;
//! - the file must exist, an ANCHOR must have an `ANCHOR: name` line followed by an
//!   `ANCHOR_END: name` line, and the included text must not be empty or whitespace once
//!   the marker lines of other anchors are dropped.
//!
//! mdBook itself only logs a missing file and silently renders a missing anchor as nothing, so
//! without this check a renamed anchor turns a chapter's code listing into an empty box.
//! The parsing mirrors mdBook 0.5's `links` preprocessor (`find_links`, `parse_range_or_anchor`,
//! `take_lines`, `take_anchored_lines`). Every problem is reported with `file:line`.

use std::fs;
use std::path::{Component, Path, PathBuf};

/// Which part of the file a link includes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selector {
    /// Lines `start..end`, 0-based, end exclusive; `None` means unbounded.
    Lines {
        start: Option<usize>,
        end: Option<usize>,
    },
    Anchor(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LinkKind {
    Include,
    RustdocInclude,
    Playground,
}

/// One `{{#...}}` link found in a markdown file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    /// 1-based line of the `{{` in the markdown file.
    line: usize,
    kind: LinkKind,
    /// The link as written, for messages.
    text: String,
    /// The path as written; `None` when the link has no argument.
    path: Option<String>,
    selector: Selector,
}

/// Finds the include-like links in `md`, skipping escaped ones (`\{{#include ...}}`), the way
/// mdBook's regex does:
/// `\\\{\{\#.*\}\}` | `\{\{\s*\#([a-zA-Z0-9_]+)\s+([^}]+)\}\}`.
fn find_links(md: &str) -> Vec<Link> {
    let bytes = md.as_bytes();
    let mut links = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        // Escaped link: a backslash, `{{#`, then everything up to the last `}}` on the line.
        if md[i..].starts_with("\\{{#") {
            let line_end = md[i..].find('\n').map_or(md.len(), |n| i + n);
            if let Some(close) = md[i..line_end].rfind("}}") {
                i += close + 2;
                continue;
            }
        }
        if md[i..].starts_with("{{")
            && let Some((link, end)) = parse_link_at(md, i)
        {
            if let Some(link) = link {
                links.push(link);
            }
            i = end;
            continue;
        }
        i += md[i..].chars().next().map_or(1, char::len_utf8);
    }
    links
}

/// Parses a link starting at `start` (which holds `{{`). Returns `None` when the text there is
/// not a link at all, `Some((None, end))` for a link of a kind this check ignores (such as
/// `{{#title ...}}`), and `Some((Some(link), end))` otherwise; `end` is just past the `}}`.
fn parse_link_at(md: &str, start: usize) -> Option<(Option<Link>, usize)> {
    let rest = &md[start + 2..];
    let after_ws = rest.trim_start();
    let after_hash = after_ws.strip_prefix('#')?;
    let kind_len = after_hash
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(after_hash.len());
    if kind_len == 0 {
        return None;
    }
    let kind = &after_hash[..kind_len];
    let after_kind = &after_hash[kind_len..];
    if !after_kind.starts_with(char::is_whitespace) {
        return None;
    }
    // `\s+([^}]+)\}\}`: the argument runs up to the first `}`, which must start `}}`.
    let close = after_kind.find('}')?;
    if !after_kind[close..].starts_with("}}") {
        return None;
    }
    let argument = &after_kind[..close];
    let end = md.len() - after_kind.len() + close + 2;
    let text = md[start..end].to_string();
    let line = md[..start].matches('\n').count() + 1;

    let kind = match kind {
        "include" => LinkKind::Include,
        "rustdoc_include" => LinkKind::RustdocInclude,
        "playground" | "playpen" => LinkKind::Playground,
        _ => return Some((None, end)),
    };
    let file_arg = argument.split_whitespace().next();
    let (path, selector) = match (&kind, file_arg) {
        (_, None) => (
            None,
            Selector::Lines {
                start: None,
                end: None,
            },
        ),
        (LinkKind::Playground, Some(arg)) => (
            Some(arg.to_string()),
            Selector::Lines {
                start: None,
                end: None,
            },
        ),
        (_, Some(arg)) => {
            let mut parts = arg.splitn(2, ':');
            let path = parts.next().unwrap_or_default().to_string();
            (Some(path), parse_selector(parts.next()))
        }
    };
    Some((
        Some(Link {
            line,
            kind,
            text,
            path,
            selector,
        }),
        end,
    ))
}

/// mdBook's `parse_range_or_anchor`: `""` whole file, `"N"` line N only, `"N:"` from line N,
/// `":M"` up to line M, `"N:M"` lines N to M (1-based, inclusive), anything else an anchor.
fn parse_selector(spec: Option<&str>) -> Selector {
    let mut parts = spec.unwrap_or("").splitn(3, ':');
    let start = match parts.next() {
        Some("") | None => None,
        Some(first) => match first.parse::<usize>() {
            Ok(line) => Some(line.saturating_sub(1)),
            Err(_) => return Selector::Anchor(first.to_string()),
        },
    };
    let end = parts.next().map(str::parse::<usize>);
    match (start, end) {
        (Some(s), Some(Ok(e))) => Selector::Lines {
            start: Some(s),
            end: Some(e),
        },
        (Some(s), Some(Err(_))) => Selector::Lines {
            start: Some(s),
            end: None,
        },
        (Some(s), None) => Selector::Lines {
            start: Some(s),
            end: Some(s + 1),
        },
        (None, Some(Ok(e))) => Selector::Lines {
            start: None,
            end: Some(e),
        },
        (None, _) => Selector::Lines {
            start: None,
            end: None,
        },
    }
}

/// The name in a line's `ANCHOR: name` (or `ANCHOR_END: name` with that `marker`), matching
/// mdBook's `ANCHOR:\s*([\w_-]+)` anywhere in the line.
fn anchor_name<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(pos) = line[from..].find(marker) {
        let after = line[from + pos + marker.len()..].trim_start();
        let len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(after.len());
        if len > 0 {
            return Some(&after[..len]);
        }
        from += pos + marker.len();
    }
    None
}

fn is_anchor_line(line: &str) -> bool {
    anchor_name(line, "ANCHOR:").is_some() || anchor_name(line, "ANCHOR_END:").is_some()
}

/// The text a link shows from `content`, without anchor marker lines, or what is wrong.
fn selected_text(content: &str, kind: &LinkKind, selector: &Selector) -> Result<String, String> {
    match selector {
        Selector::Lines { start, end } => {
            let start = start.unwrap_or(0);
            let lines: Vec<&str> = content.lines().collect();
            let end = end.unwrap_or(lines.len()).min(lines.len());
            if start >= end {
                return Err(format!(
                    "the line range selects nothing (the file has {} lines)",
                    lines.len()
                ));
            }
            Ok(lines[start..end]
                .iter()
                .filter(|line| !is_anchor_line(line))
                .copied()
                .collect::<Vec<_>>()
                .join("\n"))
        }
        Selector::Anchor(name) => {
            let mut num_starts = 0;
            let mut inside = false;
            let mut closed = false;
            let mut retained = Vec::new();
            for line in content.lines() {
                if inside {
                    if anchor_name(line, "ANCHOR_END:") == Some(name.as_str()) {
                        inside = false;
                        closed = true;
                    } else if !is_anchor_line(line) {
                        retained.push(line);
                    }
                } else if anchor_name(line, "ANCHOR:") == Some(name.as_str()) {
                    num_starts += 1;
                    // mdBook's `include` shows the first section only.
                    inside = num_starts == 1 || *kind == LinkKind::RustdocInclude;
                }
            }
            if num_starts == 0 {
                return Err(format!("no `ANCHOR: {name}` line"));
            }
            if !closed || inside {
                return Err(format!(
                    "`ANCHOR: {name}` has no matching `ANCHOR_END: {name}` after it"
                ));
            }
            if num_starts > 1 && *kind == LinkKind::Include {
                return Err(format!(
                    "`ANCHOR: {name}` appears {num_starts} times; mdBook includes only the first"
                ));
            }
            Ok(retained.join("\n"))
        }
    }
}

/// `a/b/../c` -> `a/c` without touching the file system (the file may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Checks every link in one markdown file. `md_path` is how problems name the file (relative
/// to the repository root); `read` loads an included file by its normalized path.
fn check_markdown(
    md_path: &Path,
    md: &str,
    read: &dyn Fn(&Path) -> Result<String, String>,
) -> Vec<String> {
    let md_dir = md_path.parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for link in find_links(md) {
        let at = format!("{}:{}: {}", md_path.display(), link.line, link.text);
        let Some(path) = &link.path else {
            problems.push(format!("{at}: no file given"));
            continue;
        };
        let target = normalize(&md_dir.join(path));
        let content = match read(&target) {
            Ok(content) => content,
            Err(err) => {
                problems.push(format!("{at}: cannot read {}: {err}", target.display()));
                continue;
            }
        };
        match selected_text(&content, &link.kind, &link.selector) {
            Err(why) => problems.push(format!("{at}: {}: {why}", target.display())),
            Ok(text) if text.trim().is_empty() => problems.push(format!(
                "{at}: {}: the included text is empty",
                target.display()
            )),
            Ok(_) => {}
        }
    }
    problems
}

fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            markdown_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            found.push(path);
        }
    }
}

#[test]
fn every_book_include_resolves_to_text() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("book/src");
    let mut files = Vec::new();
    markdown_files(&src, &mut files);
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("SUMMARY.md")),
        "no book/src/SUMMARY.md under {}",
        src.display()
    );

    let read = |path: &Path| fs::read_to_string(root.join(path)).map_err(|e| e.to_string());
    let mut problems = Vec::new();
    let mut num_links = 0;
    for file in &files {
        let md = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let rel = file.strip_prefix(root).unwrap_or(file);
        num_links += find_links(&md).len();
        problems.extend(check_markdown(rel, &md, &read));
    }
    assert!(
        problems.is_empty(),
        "{} broken include(s) in book/src:\n{}",
        problems.len(),
        problems.join("\n")
    );
    println!(
        "{num_links} include link(s) in {} markdown file(s) resolve",
        files.len()
    );
}

// ---- the checker's own tests: it must fail when it should --------------------------------

#[cfg(test)]
mod checker {
    use super::*;
    use std::collections::HashMap;

    const LIB: &str = "\
fn hidden() {}
// ANCHOR: init
fn init() {}
// ANCHOR: inner
fn inner() {}
// ANCHOR_END: inner
// ANCHOR_END: init
// ANCHOR: blank

// ANCHOR_END: inner
// ANCHOR_END: blank
// ANCHOR: open
fn never_closed() {}
";

    /// Runs the check on `md` at `book/src/ch.md` with `chapters/c/src/lib.rs` = LIB.
    fn check(md: &str) -> Vec<String> {
        let files: HashMap<PathBuf, String> =
            HashMap::from([(PathBuf::from("chapters/c/src/lib.rs"), LIB.to_string())]);
        let read = |path: &Path| {
            files
                .get(path)
                .cloned()
                .ok_or_else(|| "No such file or directory".to_string())
        };
        check_markdown(Path::new("book/src/ch.md"), md, &read)
    }

    #[test]
    fn good_anchor_passes() {
        assert_eq!(
            check("# Ch\n```rust\n{{#include ../../chapters/c/src/lib.rs:init}}\n```\n"),
            Vec::<String>::new()
        );
        assert!(check("{{#rustdoc_include ../../chapters/c/src/lib.rs:inner}}").is_empty());
        assert!(check("{{ #include  ../../chapters/c/src/lib.rs:init }}").is_empty());
    }

    #[test]
    fn missing_anchor_is_reported_with_file_and_line() {
        let problems = check("# Ch\n\n{{#include ../../chapters/c/src/lib.rs:nope}}\n");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("book/src/ch.md:3: "),
            "{}",
            problems[0]
        );
        assert!(
            problems[0].contains("no `ANCHOR: nope` line"),
            "{}",
            problems[0]
        );
        let problems = check("{{#rustdoc_include ../../chapters/c/src/lib.rs:nope}}");
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn missing_file_is_reported() {
        let problems = check("{{#include ../../chapters/c/src/gone.rs:init}}");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("cannot read chapters/c/src/gone.rs"),
            "{}",
            problems[0]
        );
        assert_eq!(check("{{#include ../../nowhere.rs}}").len(), 1);
        assert_eq!(check("{{#playground ../../nowhere.rs editable}}").len(), 1);
    }

    #[test]
    fn unclosed_and_empty_anchors_are_reported() {
        let problems = check("{{#include ../../chapters/c/src/lib.rs:open}}");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("no matching `ANCHOR_END: open`"),
            "{}",
            problems[0]
        );
        // Only a blank line and another anchor's marker between the pair.
        let problems = check("{{#include ../../chapters/c/src/lib.rs:blank}}");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("empty"), "{}", problems[0]);
    }

    #[test]
    fn every_problem_is_listed() {
        let md = "\
{{#include ../../chapters/c/src/lib.rs:init}}
{{#include ../../chapters/c/src/lib.rs:a}}
text {{#include ../../chapters/c/src/lib.rs:b}} text
{{#include ../../chapters/c/src/missing.rs}}
";
        let problems = check(md);
        let lines: Vec<&str> = problems
            .iter()
            .map(|p| p.split(": ").next().unwrap())
            .collect();
        assert_eq!(
            lines,
            ["book/src/ch.md:2", "book/src/ch.md:3", "book/src/ch.md:4"]
        );
    }

    #[test]
    fn line_ranges_follow_mdbook() {
        let lines = |start, end| Selector::Lines { start, end };
        assert_eq!(parse_selector(None), lines(None, None));
        assert_eq!(parse_selector(Some("2")), lines(Some(1), Some(2)));
        assert_eq!(parse_selector(Some("2:")), lines(Some(1), None));
        assert_eq!(parse_selector(Some(":10")), lines(None, Some(10)));
        assert_eq!(parse_selector(Some("2:10")), lines(Some(1), Some(10)));
        assert_eq!(
            parse_selector(Some("init")),
            Selector::Anchor("init".into())
        );

        assert!(check("{{#include ../../chapters/c/src/lib.rs:3:5}}").is_empty());
        assert!(check("{{#include ../../chapters/c/src/lib.rs::1}}").is_empty());
        // Past the end of the file, or only a blank line.
        assert_eq!(
            check("{{#include ../../chapters/c/src/lib.rs:40:50}}").len(),
            1
        );
        assert_eq!(check("{{#include ../../chapters/c/src/lib.rs:9}}").len(), 1);
    }

    #[test]
    fn escaped_and_other_links_are_ignored() {
        assert!(check("\\{{#include ../../nowhere.rs}} is how you write it").is_empty());
        assert!(check("{{#title A title}} and {{ not a link }} and {{#include}}x").is_empty());
        assert_eq!(
            find_links("{{#include a.rs}} {{#rustdoc_include b.rs:x}}").len(),
            2
        );
    }

    #[test]
    fn anchor_markers_match_mdbook() {
        assert_eq!(
            anchor_name("    // ANCHOR: a-b_c1 trailing", "ANCHOR:"),
            Some("a-b_c1")
        );
        assert_eq!(anchor_name("// ANCHOR_END: x", "ANCHOR:"), None);
        assert_eq!(anchor_name("// ANCHOR_END:x", "ANCHOR_END:"), Some("x"));
        assert_eq!(anchor_name("# ANCHOR: ", "ANCHOR:"), None);
    }
}
