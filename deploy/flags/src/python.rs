//! The Python environment the end-to-end tests run (the official `kubernetes` client and the
//! `kopf` operator framework): where its venv lives, which packages it must hold, and whether
//! an installed venv still matches them. `cargo xtask setup` makes it, `cargo xtask doctor`
//! checks it, and the harness (`skiff_tests::python`) runs its interpreter; all three take
//! the path from here.
//!
//! The pins are `tests/python/requirements.txt` (every package with its version and wheel
//! hash, installed with `pip install --require-hashes -r`). Setup leaves a copy of that file
//! in the venv ([`STAMP`]) once pip has succeeded: a venv whose copy differs from the
//! repository's file was made from other pins and is made again.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The pins, relative to the repository root.
pub const REQUIREMENTS: &str = "tests/python/requirements.txt";

/// The file in the venv holding the requirements it was installed from.
pub const STAMP: &str = "skiff-requirements.txt";

/// The packages the tests import, whose pinned versions `doctor` checks.
pub const IMPORTED: &[&str] = &["kubernetes", "kopf"];

/// `${XDG_CACHE_HOME:-$HOME/.cache}/skiff/python`.
pub fn venv_dir() -> PathBuf {
    venv_dir_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

/// [`venv_dir`] for given values of `XDG_CACHE_HOME` and `HOME` (an empty value counts as
/// unset, as the XDG specification says; with neither, `/root` as on these machines).
pub fn venv_dir_from(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> PathBuf {
    let set = |v: Option<OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    let cache = set(xdg_cache_home).unwrap_or_else(|| {
        set(home)
            .unwrap_or_else(|| PathBuf::from("/root"))
            .join(".cache")
    });
    cache.join("skiff").join("python")
}

/// The venv's interpreter.
pub fn python_in(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The requirements file of the repository at `root`.
pub fn requirements_in(root: &Path) -> PathBuf {
    root.join(REQUIREMENTS)
}

/// `name==version` of every requirement, names lower-cased with `_` and `.` as `-`
/// (PEP 503), in file order. Comments, blank lines, options and `--hash` continuation
/// lines are skipped.
pub fn pins(requirements: &str) -> Vec<(String, String)> {
    requirements
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty() && !l.starts_with('-'))
        .filter_map(|l| {
            let spec = l.split_whitespace().next()?;
            let (name, version) = spec.split_once("==")?;
            Some((normalize(name), version.trim_end_matches('\\').to_string()))
        })
        .collect()
}

/// A package name as PEP 503 compares them.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if matches!(c, '_' | '.') { '-' } else { c };
        if !(c == '-' && out.ends_with('-')) {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The pinned version of `package`.
pub fn pinned<'a>(pins: &'a [(String, String)], package: &str) -> Option<&'a str> {
    let package = normalize(package);
    pins.iter()
        .find(|(n, _)| *n == package)
        .map(|(_, v)| v.as_str())
}

/// What an installed venv holds compared with the pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VenvState {
    /// No interpreter there.
    Missing,
    /// An interpreter, but installed from other pins (or never finished installing).
    Stale,
    /// Installed from exactly these pins.
    Current,
}

/// Compares a venv (whether its interpreter exists, and its [`STAMP`] if any) with the
/// requirements file's text.
pub fn venv_state(python_exists: bool, stamp: Option<&str>, requirements: &str) -> VenvState {
    match (python_exists, stamp) {
        (false, _) => VenvState::Missing,
        (true, Some(s)) if s == requirements => VenvState::Current,
        (true, _) => VenvState::Stale,
    }
}

/// [`venv_state`] of the venv at `venv` against the repository at `root`.
pub fn venv_state_at(venv: &Path, root: &Path) -> std::io::Result<VenvState> {
    let requirements = std::fs::read_to_string(requirements_in(root))?;
    let stamp = std::fs::read_to_string(venv.join(STAMP)).ok();
    Ok(venv_state(
        python_in(venv).exists(),
        stamp.as_deref(),
        &requirements,
    ))
}

/// The Python a check runs in the venv: imports every one of [`IMPORTED`] and prints
/// `name version` for each, as installed.
pub fn import_check_script() -> String {
    let names = IMPORTED
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "import importlib, importlib.metadata as m\n\
         for n in [{names}]:\n    importlib.import_module(n)\n    print(n, m.version(n))\n"
    )
}

/// Versions the import check printed that differ from the pins: `(package, found, pinned)`
/// for each of [`IMPORTED`], `found` empty when the package printed nothing.
pub fn version_mismatches(
    printed: &str,
    pins: &[(String, String)],
) -> Vec<(&'static str, String, String)> {
    IMPORTED
        .iter()
        .filter_map(|&package| {
            let found = printed
                .lines()
                .filter_map(|l| l.split_once(' '))
                .find(|(n, _)| normalize(n) == normalize(package))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default();
            let want = pinned(pins, package).unwrap_or_default().to_string();
            (found != want || want.is_empty()).then_some((package, found, want))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: &str = "# a comment\n\
        \n\
        aiohttp==3.14.5 \\\n    --hash=sha256:50a1\n\
        Kubernetes==37.0.2 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n\
        typing_extensions==4.16.0  # inline comment\n\
        --require-hashes\n\
        kopf==1.45.2\n";

    #[test]
    fn venv_goes_under_the_cache_dir() {
        assert_eq!(
            venv_dir_from(Some("/c".into()), Some("/home/u".into())),
            Path::new("/c/skiff/python")
        );
        assert_eq!(
            venv_dir_from(None, Some("/home/u".into())),
            Path::new("/home/u/.cache/skiff/python")
        );
        assert_eq!(
            venv_dir_from(Some("".into()), Some("/home/u".into())),
            Path::new("/home/u/.cache/skiff/python")
        );
        assert_eq!(
            venv_dir_from(None, None),
            Path::new("/root/.cache/skiff/python")
        );
        assert_eq!(
            python_in(Path::new("/v")),
            Path::new("/v/bin/python").to_path_buf()
        );
    }

    #[test]
    fn pins_are_read_without_hashes_comments_or_options() {
        assert_eq!(
            pins(REQ),
            [
                ("aiohttp", "3.14.5"),
                ("kubernetes", "37.0.2"),
                ("typing-extensions", "4.16.0"),
                ("kopf", "1.45.2"),
            ]
            .map(|(n, v)| (n.to_string(), v.to_string()))
        );
        let p = pins(REQ);
        assert_eq!(pinned(&p, "Typing.Extensions"), Some("4.16.0"));
        assert_eq!(pinned(&p, "requests"), None);
    }

    #[test]
    fn names_normalize_as_pep_503() {
        assert_eq!(normalize("PyYAML"), "pyyaml");
        assert_eq!(normalize("python_json.logger"), "python-json-logger");
        assert_eq!(normalize("a__b"), "a-b");
    }

    #[test]
    fn the_stamp_must_be_the_same_file() {
        assert_eq!(venv_state(false, Some(REQ), REQ), VenvState::Missing);
        assert_eq!(venv_state(true, None, REQ), VenvState::Stale);
        assert_eq!(
            venv_state(true, Some(&REQ.replace("1.45.2", "1.45.1")), REQ),
            VenvState::Stale
        );
        assert_eq!(venv_state(true, Some(REQ), REQ), VenvState::Current);
    }

    #[test]
    fn the_repository_pins_what_the_tests_import() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(requirements_in(&root)).expect("requirements");
        let p = pins(&text);
        for package in IMPORTED {
            assert!(pinned(&p, package).is_some(), "{package} is not pinned");
        }
        // Every pin carries a hash (pip's --require-hashes refuses the file otherwise).
        let hashes = text.matches("--hash=sha256:").count();
        assert!(hashes >= p.len(), "{hashes} hashes for {} pins", p.len());
    }

    #[test]
    fn the_import_check_reports_other_versions() {
        let p = pins(REQ);
        let script = import_check_script();
        assert!(script.contains("\"kubernetes\", \"kopf\""), "{script}");
        assert!(version_mismatches("kubernetes 37.0.2\nkopf 1.45.2\n", &p).is_empty());
        assert_eq!(
            version_mismatches("kubernetes 36.0.0\nkopf 1.45.2\n", &p),
            [("kubernetes", "36.0.0".to_string(), "37.0.2".to_string())]
        );
        assert_eq!(
            version_mismatches("kubernetes 37.0.2\n", &p),
            [("kopf", String::new(), "1.45.2".to_string())]
        );
    }
}
