//! Which runs may be warm: only those a zygote runs exactly as a cold `python3` would. The
//! client's side ([`cold_reason`]) looks at the command line and environment; the pool's (in
//! [`crate::server`]) at the interpreter, the locale and the preloads, which must be a subset
//! of what the program imports ([`imports_of`]: SOCK's rule, a proc never carries a package
//! it did not ask for).
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;

/// Why `command` (a Python command line) must start cold, if it must: an interpreter option
/// (`-X`, `-I`, ...: only `python3 SCRIPT`, `python3 -c CODE` and `python3 -m MODULE` are
/// forked). (The environment the interpreter reads at start-up is compared by the pool:
/// [`startup_env_of`].)
pub fn cold_reason(command: &[OsString]) -> Option<String> {
    match command.get(1).map(|a| a.as_bytes()) {
        None => return Some("no script (an interactive interpreter)".into()),
        Some(b"-c" | b"-m") if command.len() >= 3 => {}
        Some(a) if a.starts_with(b"-") => {
            return Some(format!(
                "the interpreter option {}",
                String::from_utf8_lossy(a)
            ))
        }
        Some(_) => {}
    }
    None
}

/// The variables the interpreter reads at start-up (`PYTHON*`; the locale's, which decide its
/// stdio encoding): a zygote serves only runs whose are the same as its own.
pub fn startup_env_of(env: &[(OsString, OsString)]) -> Vec<String> {
    let mut v: Vec<String> = env
        .iter()
        .filter(|(k, _)| {
            let k = k.as_bytes();
            k == b"LANG" || k.starts_with(b"LC_") || k.starts_with(b"PYTHON")
        })
        .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
        .collect();
    v.sort();
    v
}

/// Top-level module names the program's source imports (`import a.b, c` and `from a import
/// b` lines, at any indentation): `-c CODE`, or the script's first MiB; `-m MODULE` imports
/// its top-level package (its source is not looked for).
pub fn imports_of(command: &[OsString]) -> Vec<String> {
    let source = match command.get(1).map(|a| a.as_bytes()) {
        Some(b"-c") => command.get(2).map(|c| c.to_string_lossy().into_owned()),
        Some(b"-m") => command
            .get(2)
            .map(|m| format!("import {}", m.to_string_lossy())),
        Some(_) => {
            use std::io::Read as _;
            let mut text = Vec::new();
            let path = &command[1];
            let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
            if let Some(f) = regular.then(|| std::fs::File::open(path).ok()).flatten() {
                let _ = f.take(1 << 20).read_to_end(&mut text);
            }
            Some(String::from_utf8_lossy(&text).into_owned())
        }
        None => None,
    };
    let mut names = Vec::new();
    for stmt in source
        .iter()
        .flat_map(|s| s.lines())
        .flat_map(|l| l.split(';'))
    {
        let words: Vec<&str> = stmt.split_whitespace().collect();
        let joined;
        let mods: Vec<&str> = match words.as_slice() {
            ["import", rest @ ..] => {
                joined = rest.join(" ");
                joined.split(',').map(str::trim).collect()
            }
            ["from", m, "import", ..] => vec![m],
            _ => continue,
        };
        for m in mods {
            let top = m
                .split_whitespace()
                .next()
                .unwrap_or("")
                .split('.')
                .next()
                .unwrap_or("");
            if !top.is_empty() && top.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                names.push(top.to_owned());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// SOCK's rule: a zygote's preloads are all among the program's imports.
pub fn preloads_fit(preloads: &[String], imports: &[String]) -> bool {
    preloads.iter().all(|p| {
        imports
            .iter()
            .any(|i| i == p.split('.').next().unwrap_or(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_of_code() {
        let cmd: Vec<OsString> = [
            "python3",
            "-c",
            "import os, numpy.linalg as la\nfrom json import x; import sys",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        assert_eq!(imports_of(&cmd), ["json", "numpy", "os", "sys"]);
        assert!(preloads_fit(&["numpy".into()], &imports_of(&cmd)));
        assert!(!preloads_fit(&["pandas".into()], &imports_of(&cmd)));
    }

    #[test]
    fn options_and_env_go_cold() {
        let cmd = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(cold_reason(&cmd(&["python3", "-I", "x.py"]))
            .unwrap()
            .contains("-I"));
        assert!(cold_reason(&cmd(&["python3", "x.py"])).is_none());
        assert!(cold_reason(&cmd(&["python3", "-c", "pass"])).is_none());
        assert!(cold_reason(&cmd(&["python3", "-m", "json.tool", "x"])).is_none());
        assert!(cold_reason(&cmd(&["python3", "-m"])).is_some());
        assert_eq!(imports_of(&cmd(&["python3", "-m", "json.tool"])), ["json"]);
        let env = [
            (OsString::from("PYTHONHASHSEED"), OsString::from("0")),
            (OsString::from("HOME"), OsString::from("/root")),
        ];
        assert_eq!(startup_env_of(&env), ["PYTHONHASHSEED=0"]);
    }
}
