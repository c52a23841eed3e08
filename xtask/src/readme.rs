//! README.md stays a five-minute read whose links hold. A test fails when the README is over
//! [`MAX_BYTES`], when one of its relative markdown links (`[text](path)`, `path#anchor`)
//! names a file, directory or heading that does not exist or leaves the repository, or when
//! its capability table (the first table under `## What works`) has fewer than
//! [`MIN_ROWS`] rows or a row that links no test file (under `tests/` or
//! `control/<crate>/tests/`).
//!
//! Links inside fenced code blocks and inline code spans are not links and are skipped;
//! `http(s)://`, `mailto:` and in-page `#anchor` links are not checked.

use std::path::{Component, Path};

/// The README's size limit, in bytes.
pub const MAX_BYTES: usize = 15_000;

/// The capability table's minimum number of rows.
pub const MIN_ROWS: usize = 15;

/// The heading the capability table follows.
const TABLE_HEADING: &str = "## What works";

/// `markdown` without its fenced code blocks, line by line, with inline code spans blanked.
fn prose_lines(markdown: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push(String::new());
            continue;
        }
        if in_fence {
            out.push(String::new());
            continue;
        }
        // Blank what is between backticks: odd-numbered pieces are code spans.
        let prose: String = line
            .split('`')
            .enumerate()
            .map(|(i, piece)| if i % 2 == 0 { piece } else { "" })
            .collect::<Vec<_>>()
            .join("``");
        out.push(prose);
    }
    out
}

/// The targets of the markdown links `[text](target)` in one line of prose, in order.
fn line_links(line: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        // `[text](target "title")`: the target is the first word.
        let target = after[..end].split_whitespace().next().unwrap_or("");
        if !target.is_empty() {
            links.push(target.to_string());
        }
        rest = &after[end + 1..];
    }
    links
}

/// Every link target in `markdown` outside code.
pub fn links(markdown: &str) -> Vec<String> {
    prose_lines(markdown)
        .iter()
        .flat_map(|l| line_links(l))
        .collect()
}

/// Whether `target` is a link into the repository (not a URL, not an in-page anchor).
fn is_relative(target: &str) -> bool {
    !(target.starts_with('#') || target.contains("://") || target.starts_with("mailto:"))
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `markdown`'s headings (outside code blocks).
fn anchors(markdown: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && line.starts_with('#') {
            out.push(anchor_of(line.trim_start_matches('#')));
        }
    }
    out
}

/// What is wrong with one relative link `target`, resolved against `root`, if anything.
fn link_problem(root: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let rel = Path::new(path);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Some(format!("link ({target}) leaves the repository"));
    }
    let full = root.join(rel);
    if !full.exists() {
        return Some(format!("link ({target}): {path} does not exist"));
    }
    if let Some(anchor) = anchor {
        let is_markdown = full.extension().is_some_and(|e| e == "md");
        if is_markdown {
            let text = std::fs::read_to_string(&full).unwrap_or_default();
            if !anchors(&text).iter().any(|a| a == anchor) {
                return Some(format!("link ({target}): {path} has no heading #{anchor}"));
            }
        }
    }
    None
}

/// Whether `target` is a test file: under `tests/` or `control/<crate>/tests/`.
fn is_test_file(target: &str) -> bool {
    let parts: Vec<&str> = target.split('/').collect();
    match parts.as_slice() {
        ["tests", .., file] | ["control", _, "tests", .., file] => !file.is_empty(),
        _ => false,
    }
}

/// The rows of the first table after the `## What works` heading (header and separator
/// rows left out), or `None` without heading or table.
fn capability_rows(markdown: &str) -> Option<Vec<&str>> {
    let start = markdown
        .lines()
        .position(|l| l.trim_end() == TABLE_HEADING)?;
    let table: Vec<&str> = markdown
        .lines()
        .skip(start + 1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    if table.len() < 2 {
        return None;
    }
    // The header row, then the `|---|` separator.
    Some(table[2..].to_vec())
}

/// Every problem of README text `markdown` whose relative links resolve against `root`.
pub fn problems(markdown: &str, root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    if markdown.len() > MAX_BYTES {
        problems.push(format!(
            "README.md is {} bytes, over the {MAX_BYTES}-byte limit",
            markdown.len()
        ));
    }
    for target in links(markdown).iter().filter(|t| is_relative(t)) {
        problems.extend(link_problem(root, target));
    }
    match capability_rows(markdown) {
        None => problems.push(format!("no table under {TABLE_HEADING:?}")),
        Some(rows) => {
            if rows.len() < MIN_ROWS {
                problems.push(format!(
                    "the capability table has {} rows, fewer than {MIN_ROWS}",
                    rows.len()
                ));
            }
            for row in rows {
                let linked: Vec<String> = prose_lines(row)
                    .iter()
                    .flat_map(|l| line_links(l))
                    .collect();
                if !linked.iter().any(|t| is_test_file(t)) {
                    problems.push(format!("capability row links no test file: {row}"));
                }
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: usize, link: &str) -> String {
        let mut md = String::from("# T\n\n## What works\n\n| A | B | C |\n|---|---|---|\n");
        for i in 0..rows {
            md.push_str(&format!("| row {i} | does | [proof]({link}) |\n"));
        }
        md
    }

    #[test]
    fn readme_is_short_and_its_links_hold() {
        let root = crate::util::repo_root();
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        let problems = problems(&readme, &root);
        assert!(
            problems.is_empty(),
            "README.md:\n  {}",
            problems.join("\n  ")
        );
    }

    #[test]
    fn links_in_code_are_not_links() {
        let md = "a [x](one.md) `[y](two.md)` b\n```\n[z](three.md)\n```\n[w](four.md \"t\")";
        assert_eq!(links(md), ["one.md", "four.md"]);
    }

    #[test]
    fn a_good_table_passes() {
        let root = crate::util::repo_root();
        let md = table(MIN_ROWS, "tests/tests/kubectl.rs");
        assert_eq!(problems(&md, &root), Vec::<String>::new());
        let md = table(MIN_ROWS, "control/store/tests/conformance.rs");
        assert_eq!(problems(&md, &root), Vec::<String>::new());
    }

    #[test]
    fn a_missing_file_fails() {
        let root = crate::util::repo_root();
        let md = table(MIN_ROWS, "tests/tests/no_such_test.rs");
        let found = problems(&md, &root);
        assert_eq!(found.len(), MIN_ROWS, "{found:?}");
        assert!(found[0].contains("does not exist"), "{found:?}");
    }

    #[test]
    fn links_leaving_the_repository_fail() {
        let root = crate::util::repo_root();
        for target in ["../shared/platform.md", "/etc/hostname"] {
            let md = format!(
                "[x]({target})\n{}",
                table(MIN_ROWS, "tests/tests/kubectl.rs")
            );
            let found = problems(&md, &root);
            assert!(
                found.len() == 1 && found[0].contains("leaves the repository"),
                "{target}: {found:?}"
            );
        }
    }

    #[test]
    fn a_missing_heading_fails_and_a_present_one_passes() {
        let root = crate::util::repo_root();
        let good = format!(
            "[x](README.md#what-works)\n{}",
            table(MIN_ROWS, "tests/tests/kubectl.rs")
        );
        assert_eq!(problems(&good, &root), Vec::<String>::new());
        let bad = format!(
            "[x](README.md#no-such-heading)\n{}",
            table(MIN_ROWS, "tests/tests/kubectl.rs")
        );
        let found = problems(&bad, &root);
        assert!(
            found.len() == 1 && found[0].contains("no heading"),
            "{found:?}"
        );
    }

    #[test]
    fn a_short_table_or_rows_without_a_test_fail() {
        let root = crate::util::repo_root();
        let short = problems(&table(MIN_ROWS - 1, "tests/tests/kubectl.rs"), &root);
        assert!(
            short.len() == 1 && short[0].contains("fewer than"),
            "{short:?}"
        );
        let untested = problems(&table(MIN_ROWS, "README.md"), &root);
        assert_eq!(untested.len(), MIN_ROWS, "{untested:?}");
        assert!(untested[0].contains("links no test file"), "{untested:?}");
        let none = problems("# T\n\nno table\n", &root);
        assert!(none.len() == 1 && none[0].contains("no table"), "{none:?}");
    }

    #[test]
    fn an_oversized_readme_fails() {
        let root = crate::util::repo_root();
        let mut md = table(MIN_ROWS, "tests/tests/kubectl.rs");
        md.push_str(&"x".repeat(MAX_BYTES));
        let found = problems(&md, &root);
        assert!(
            found.len() == 1 && found[0].contains("over the"),
            "{found:?}"
        );
    }

    #[test]
    fn anchors_follow_github() {
        assert_eq!(anchor_of(" Known gaps"), "known-gaps");
        assert_eq!(
            anchor_of(" `skiff` CLI: what's in it"),
            "skiff-cli-whats-in-it"
        );
    }
}
