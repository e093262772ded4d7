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
