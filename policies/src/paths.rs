//! Path rules: longest-prefix match on path components.
use std::path::{Component, Path, PathBuf};

/// What a path rule does with a matching path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PathAction {
    /// Let the kernel perform the call as the target asked.
    Continue,
    /// Fail the call with this errno.
    Deny(i32),
    /// The supervisor performs the call itself under `dir` (the prefix is replaced by `dir`).
    Serve(PathBuf),
}

/// One `[[path]]` rule (or a `--serve PREFIX=DIR` argument).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PathRule {
    /// Absolute, normalized (no `.`, `..`, repeated or trailing `/`).
    pub prefix: PathBuf,
    pub action: PathAction,
    /// Documentation of the rule, not in the serde form (see [`crate::Profile`]).
    #[serde(skip)]
    pub reason: String,
}

/// The outcome of [`crate::Profile::decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathDecision {
    Continue,
    Deny(i32),
    /// Serve `dir.join(rest)`; `rest` is relative (empty when the path is the prefix itself) and
    /// never contains `..`.
    Serve {
        prefix: PathBuf,
        dir: PathBuf,
        rest: PathBuf,
    },
}

/// Why a prefix is not acceptable in a rule.
pub(crate) fn check_prefix(prefix: &str) -> Result<PathBuf, String> {
    let p = Path::new(prefix);
    if !p.is_absolute() {
        return Err(format!(
            "path prefix `{prefix}` is relative; prefixes must be absolute (start with `/`)"
        ));
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(format!(
                    "path prefix `{prefix}` contains `.` or `..`; write it normalized"
                ))
            }
        }
    }
    Ok(out)
}

/// The normal components of an absolute path, with `.` dropped and `..` applied lexically (the
/// supervisor hands us paths it already resolved; this only guarantees that `rest` can never
/// climb out of a served directory). `None` for a relative path.
fn components(path: &Path) -> Option<Vec<&std::ffi::OsStr>> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Longest matching rule by component count; no match => `Continue`; a relative path (a caller
/// bug: the supervisor must resolve dirfd/cwd first) is refused with `EACCES`.
pub(crate) fn decide(rules: &[PathRule], path: &Path) -> PathDecision {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if is_normal(bytes)
        && rules
            .iter()
            .all(|r| is_normal(r.prefix.as_os_str().as_bytes()))
    {
        return decide_normal(rules, bytes);
    }
    decide_components(rules, path)
}

/// [`decide`] for any path: by its components, `.` and `..` applied lexically.
pub(crate) fn decide_components(rules: &[PathRule], path: &Path) -> PathDecision {
    let Some(comps) = components(path) else {
        return PathDecision::Deny(libc::EACCES);
    };
    let mut best: Option<(usize, &PathRule)> = None;
    for rule in rules {
        let Some(rc) = components(&rule.prefix) else {
            continue;
        };
        if rc.len() <= comps.len()
            && rc.iter().zip(&comps).all(|(a, b)| a == b)
            && best.is_none_or(|(n, _)| rc.len() > n)
        {
            best = Some((rc.len(), rule));
        }
    }
    match best {
        None => PathDecision::Continue,
        Some((n, rule)) => match &rule.action {
            PathAction::Continue => PathDecision::Continue,
            PathAction::Deny(e) => PathDecision::Deny(*e),
            PathAction::Serve(dir) => PathDecision::Serve {
                prefix: rule.prefix.clone(),
                dir: dir.clone(),
                rest: comps[n..].iter().collect(),
            },
        },
    }
}

/// Absolute and already in normal form: no empty, `.` or `..` component, no trailing slash
/// (or exactly `/`). What the supervisor's resolved paths and every rule prefix look like.
fn is_normal(p: &[u8]) -> bool {
    match p {
        [b'/'] => true,
        [b'/', rest @ ..] => rest
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".."),
        _ => false,
    }
}

/// [`decide`] for a normal path and normal prefixes, without allocating unless it serves: a
/// prefix matches at a component boundary, and among the prefixes of one path the one with
/// more components is the longer (the first of equal ones wins, as in [`decide`]).
fn decide_normal(rules: &[PathRule], path: &[u8]) -> PathDecision {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let mut best: Option<(usize, &PathRule)> = None;
    for rule in rules {
        let pre = rule.prefix.as_os_str().as_bytes();
        let matches = pre == b"/"
            || (path.starts_with(pre) && matches!(path.get(pre.len()), None | Some(b'/')));
        if matches && best.is_none_or(|(n, _)| pre.len() > n) {
            best = Some((pre.len(), rule));
        }
    }
    match best {
        None => PathDecision::Continue,
        Some((n, rule)) => match &rule.action {
            PathAction::Continue => PathDecision::Continue,
            PathAction::Deny(e) => PathDecision::Deny(*e),
            PathAction::Serve(dir) => {
                // What follows the prefix and its separating slash ("" for the prefix itself).
                let rest = if n == 1 {
                    &path[1..]
                } else {
                    path.get(n + 1..).unwrap_or(b"")
                };
                PathDecision::Serve {
                    prefix: rule.prefix.clone(),
                    dir: dir.clone(),
                    rest: PathBuf::from(OsStr::from_bytes(rest)),
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(prefix: &str, action: PathAction) -> PathRule {
        PathRule {
            prefix: PathBuf::from(prefix),
            action,
            reason: String::new(),
        }
    }

    #[test]
    fn the_byte_match_agrees_with_the_component_one() {
        let serve = |d: &str| PathAction::Serve(PathBuf::from(d));
        let rule_sets = [
            vec![],
            vec![rule("/", PathAction::Deny(libc::EACCES))],
            vec![
                rule("/etc/pass", PathAction::Deny(libc::EACCES)),
                rule("/etc", PathAction::Deny(libc::EROFS)),
                rule("/etc/ssl", PathAction::Continue),
                rule("/tmp/python/Lib", serve("/var/cache/lib")),
                rule("/tmp/python/Lib", PathAction::Deny(libc::EPERM)),
                rule("/", serve("/srv/all")),
            ],
        ];
        let paths = [
            "/",
            "/etc",
            "/etc/",
            "/etcetera",
            "/etc/pass",
            "/etc/passwd",
            "/etc/pass/x",
            "/etc/ssl",
            "/etc/ssl/certs/a.pem",
            "/tmp",
            "/tmp/python/Lib",
            "/tmp/python/Library",
            "/tmp/python/Lib/json/__init__.py",
            "/usr/lib/x",
            "/a/b/c/d",
        ];
        for rules in &rule_sets {
            for p in paths {
                let p = Path::new(p);
                assert_eq!(decide(rules, p), decide_components(rules, p), "{p:?}");
            }
        }
        assert!(is_normal(b"/") && is_normal(b"/a/b") && is_normal(b"/a/..b"));
        for p in ["", "a", "//", "/a/", "/a//b", "/./a", "/a/..", "/a/./b"] {
            assert!(!is_normal(p.as_bytes()), "{p}");
        }
    }
}
