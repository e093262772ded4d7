//! What the target's Python command tells: the interpreter to byte-compile with, its bytecode
//! tag, and the modules it is about to import (prefetched).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// The bytecode cache tag of a CPython, from the name its path resolves to (`python3.11` →
/// `cpython-311`); `None` when the name does not tell (then a package is compiled after install).
pub fn cache_tag_of(python: &Path) -> Option<String> {
    let real = std::fs::canonicalize(python).ok()?;
    let version = real.file_name()?.to_str()?.strip_prefix("python")?;
    let (major, minor) = version.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(major) && digits(minor)).then(|| format!("cpython-{major}{minor}"))
}

/// The interpreter to byte-compile with, if PROGRAM is a CPython (`python`, `python3.11`).
pub fn python_of(program: &Path) -> Option<PathBuf> {
    let name = program.file_name()?.to_str()?;
    name.starts_with("python").then(|| program.to_path_buf())
}

/// Top-level module names a Python command line is about to import, for prefetching: the
/// `import` lines of `-c CODE` or of the script (its first MiB), or the `-m` module. A
/// heuristic: a name missed here is fetched when the target first touches it, a name found
/// here that no package provides is ignored.
pub fn imports_of(command: &[std::ffi::OsString]) -> Vec<String> {
    let mut args = command.iter().skip(1).map(|a| a.to_string_lossy());
    let mut source = None;
    while let Some(a) = args.next() {
        match &*a {
            "-c" => {
                source = args.next().map(|c| c.into_owned());
                break;
            }
            "-m" => return args.next().map(|m| top_name(&m)).into_iter().collect(),
            "-X" | "-W" | "--check-hash-based-pycs" => {
                args.next();
            }
            s if s.starts_with("-c") && s.len() > 2 => {
                source = Some(s[2..].to_owned());
                break;
            }
            s if s.starts_with('-') => {}
            _ => {
                // The script: its path as given, not as lossily decoded.
                let script = &command[command.len() - args.len() - 1];
                let mut text = Vec::new();
                // Regular files only: a FIFO or /dev/stdin would block here or eat the
                // target's input.
                let regular = std::fs::metadata(script).is_ok_and(|m| m.is_file());
                if let Some(f) = regular.then(|| std::fs::File::open(script).ok()).flatten() {
                    use std::io::Read as _;
                    let _ = f.take(1 << 20).read_to_end(&mut text);
                }
                source = Some(String::from_utf8_lossy(&text).into_owned());
                break;
            }
        }
    }
    let mut names: Vec<String> = Vec::new();
    for stmt in source.iter().flat_map(|s| s.split(['\n', ';'])) {
        let stmt = stmt.trim();
        let found: Vec<String> = if let Some(rest) = stmt.strip_prefix("import ") {
            rest.split(',')
                .filter_map(|n| n.split_whitespace().next())
                .map(top_name)
                .collect()
        } else if let Some(rest) = stmt.strip_prefix("from ") {
            rest.split_whitespace()
                .next()
                .filter(|m| !m.starts_with('.'))
                .map(top_name)
                .into_iter()
                .collect()
        } else {
            continue;
        };
        for n in found {
            let ident = !n.is_empty()
                && n.chars().all(|c| c.is_alphanumeric() || c == '_')
                && !n.starts_with(|c: char| c.is_ascii_digit());
            if ident && !names.contains(&n) {
                names.push(n);
            }
        }
    }
    names
}

pub(super) fn top_name(dotted: &str) -> String {
    dotted.split('.').next().unwrap_or("").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_tag_follows_links_to_the_versioned_name() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("python3.12");
        std::fs::write(&real, "").unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("python3")).unwrap();
        std::fs::write(tmp.path().join("python"), "").unwrap();
        std::fs::write(tmp.path().join("python3.x"), "").unwrap();
        let tag = |n: &str| cache_tag_of(&tmp.path().join(n));
        assert_eq!(tag("python3").as_deref(), Some("cpython-312"));
        assert_eq!(tag("python3.12").as_deref(), Some("cpython-312"));
        assert_eq!(tag("python"), None, "the name does not tell");
        assert_eq!(tag("python3.x"), None);
        assert_eq!(tag("missing"), None);
    }

    #[test]
    fn imports_named_by_a_python_command() {
        let cmd = |a: &[&str]| imports_of(&a.iter().map(|s| s.into()).collect::<Vec<_>>());
        assert_eq!(
            cmd(&[
                "python3",
                "-I",
                "-c",
                "import numpy as np, six; from pandas.core import x"
            ]),
            ["numpy", "six", "pandas"]
        );
        assert_eq!(
            cmd(&[
                "python3",
                "-X",
                "importtime",
                "-c",
                "from . import x;import a.b"
            ]),
            ["a"]
        );
        assert_eq!(cmd(&["python3", "-m", "pytest.main", "-q"]), ["pytest"]);
        let tmp = tempfile::tempdir().unwrap();
        let script = tmp.path().join("s.py");
        std::fs::write(
            &script,
            "#!/usr/bin/env python3\nimport os\n  import yaml\nx = 'import'\n",
        )
        .unwrap();
        let s = script.to_str().unwrap();
        assert_eq!(
            cmd(&["python3", "-u", s, "-c", "import no"]),
            ["os", "yaml"]
        );
        assert!(cmd(&["python3", "/nonexistent.py"]).is_empty());
        assert!(
            cmd(&["python3", "/dev/stdin"]).is_empty(),
            "never reads a device"
        );
        assert!(cmd(&["python3", tmp.path().to_str().unwrap()]).is_empty());
        assert!(cmd(&["python3"]).is_empty());
    }
}
