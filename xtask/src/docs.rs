//! ARCHITECTURE.md stays a map that is true: a test fails when the file grows past
//! [`MAX_BYTES`] or [`MAX_LINES`], or when it names a repository path that does not exist.
//!
//! A repository path is a backticked token with a `/` that ends in one of [`EXTENSIONS`]
//! (a file) or in `/` (a directory). Every such token is resolved against the repository
//! root, never against a crate: write `node/agent/src/proxy/`, not `src/proxy/`. Tokens
//! that start with `/` are host paths (`/sys/fs/bpf/...`) and are not checked. In a path,
//! `{a,b}` stands for each of `a` and `b`, and a component with `<placeholder>` or `*`
//! matches any entry of its directory that has the component's literal parts
//! (`control/controllers/src/<name>.rs` needs some `.rs` file there).

use std::path::{Path, PathBuf};

/// ARCHITECTURE.md fits on one screen's worth of scrolling.
pub const MAX_BYTES: usize = 20_000;
/// See [`MAX_BYTES`].
pub const MAX_LINES: usize = 250;
/// What a backticked file path ends with.
pub const EXTENSIONS: [&str; 6] = [".rs", ".md", ".toml", ".proto", ".sh", ".py"];

/// Every backticked token of `markdown` that names a repository path, braces expanded.
pub fn repo_paths(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Fenced code blocks are pictures, not references.
    let mut in_fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 1 && looks_like_repo_path(token) {
                out.extend(expand_braces(token));
            }
        }
    }
    out
}

fn looks_like_repo_path(token: &str) -> bool {
    token.contains('/')
        && !token.starts_with('/')
        && !token.contains(char::is_whitespace)
        && !token.contains("::")
        && (token.ends_with('/') || EXTENSIONS.iter().any(|e| token.ends_with(e)))
}

/// `a/{b,c}/d` → `a/b/d`, `a/c/d` (one level of braces per group, groups in any number).
fn expand_braces(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_string()];
    };
    if close < open {
        return vec![token.to_string()];
    }
    let (head, tail) = (&token[..open], &token[close + 1..]);
    token[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}")))
        .collect()
}

/// Whether a path component with placeholders (`<name>.rs`, `*.proto`) matches `name`.
fn component_matches(pattern: &str, name: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = pattern;
    loop {
        let cut = rest.find(['<', '*']);
        let Some(at) = cut else {
            literals.push(rest);
            break;
        };
        literals.push(&rest[..at]);
        rest = if rest[at..].starts_with('<') {
            match rest[at..].find('>') {
                Some(end) => &rest[at + end + 1..],
                None => "",
            }
        } else {
            &rest[at + 1..]
        };
    }
    let (first, last) = (literals[0], literals[literals.len() - 1]);
    if literals.len() == 1 {
        return name == first;
    }
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut middle = &name[first.len()..name.len() - last.len()];
    for lit in &literals[1..literals.len() - 1] {
        match middle.find(lit) {
            Some(at) => middle = &middle[at + lit.len()..],
            None => return false,
        }
    }
    true
}

/// Whether `path` (relative, possibly with placeholders) names something under `root`:
/// a directory when it ends with `/`, a file otherwise.
pub fn exists(root: &Path, path: &str) -> bool {
    let want_dir = path.ends_with('/');
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut candidates: Vec<PathBuf> = vec![root.to_path_buf()];
    for part in &parts {
        let mut next = Vec::new();
        for dir in &candidates {
            if part.contains(['<', '*']) {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if component_matches(part, &entry.file_name().to_string_lossy()) {
                        next.push(entry.path());
                    }
                }
            } else {
                let p = dir.join(part);
                if p.exists() {
                    next.push(p);
                }
            }
        }
        candidates = next;
    }
    candidates
        .iter()
        .any(|p| if want_dir { p.is_dir() } else { p.is_file() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_md_is_short_and_names_only_paths_that_exist() {
        let root = crate::util::repo_root();
        let md = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        assert!(
            md.len() <= MAX_BYTES,
            "ARCHITECTURE.md is {} bytes, more than {MAX_BYTES}: move detail into module docs",
            md.len()
        );
        let lines = md.lines().count();
        assert!(
            lines <= MAX_LINES,
            "ARCHITECTURE.md has {lines} lines, more than {MAX_LINES}"
        );
        let paths = repo_paths(&md);
        assert!(
            paths.len() >= 10,
            "ARCHITECTURE.md names only {} paths: {paths:?}",
            paths.len()
        );
        let missing: Vec<&String> = paths.iter().filter(|p| !exists(&root, p)).collect();
        assert!(
            missing.is_empty(),
            "ARCHITECTURE.md names paths that do not exist (relative to the repository root): {missing:?}"
        );
    }

    #[test]
    fn paths_are_extracted_expanded_and_resolved() {
        let md = "see `a/b.rs` and `x/{y,z}/` but not `a::b`, `/sys/fs/x/`, `pods/binding`,\n\
                  `two words/x.rs` or `Cargo.toml`\n```\n`in/fence.rs`\n```\n`c/<name>.rs`";
        assert_eq!(
            repo_paths(md),
            ["a/b.rs", "x/y/", "x/z/", "c/<name>.rs"].map(String::from)
        );
        assert!(component_matches("<name>.rs", "gc.rs"));
        assert!(component_matches("*.proto", "core.proto"));
        assert!(component_matches("pre<x>mid*.rs", "pre1mid2.rs"));
        assert!(!component_matches("<name>.rs", "gc.toml"));
        assert!(!component_matches("lib.rs", "main.rs"));

        let root = crate::util::repo_root();
        assert!(exists(&root, "xtask/src/docs.rs"));
        assert!(exists(&root, "xtask/src/"));
        assert!(exists(&root, "xtask/src/<name>.rs"));
        assert!(exists(&root, "control/*/tests/"));
        assert!(
            !exists(&root, "xtask/src/docs.rs/"),
            "a file is not a directory"
        );
        assert!(!exists(&root, "xtask/src"), "a directory is not a file");
        assert!(!exists(&root, "xtask/src/no_such_file.rs"));
        assert!(
            !exists(&root, "src/docs.rs"),
            "paths resolve from the repository root"
        );
    }
}
