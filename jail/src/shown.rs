//! Where a directory of the jail comes from, told from the spec it is built from: a jail path
//! mapped back to the host path its bind shows, and why that bind is there (the working
//! directory, a bind of the program's or the user's, the system view), or that the supervisor
//! fills it. The supervisor words its read-only hints from it.
#![forbid(unsafe_code)]

use crate::JailSpec;
use std::path::{Path, PathBuf};

/// Why a bind is in the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The working directory, shown read-only by `--cwd ro`.
    Cwd,
    /// The script's directory, the program's prefix, a `--bind`: `--bind-rw` shows it writable.
    Bind,
    /// The standard system view (`/usr`, `/etc`, ...), the jail's own root, the supervisor's.
    System,
}

#[derive(Debug)]
struct Shown {
    dst: PathBuf,
    src: PathBuf,
    origin: Origin,
}

/// Jail paths mapped back to the host paths their binds show, with why each bind is there.
#[derive(Debug)]
pub struct JailMap {
    shown: Vec<Shown>,
    /// Host paths that are the supervisor's (cache, buckets, scratch): never suggested.
    hides: Vec<PathBuf>,
    /// Jail directories the supervisor fills (served prefixes).
    served: Vec<PathBuf>,
    /// The working directory `--cwd auto` did not show (an empty directory at its path).
    withheld_cwd: Option<PathBuf>,
}

impl JailMap {
    /// From the jail as it will be built; `cwd_ro`: the working directory was shown read-only
    /// by `--cwd ro`; `withheld_cwd`: the working directory `--cwd auto` did not show;
    /// `user_dsts`: where the user's own `--bind`s are shown.
    pub fn new(
        spec: &JailSpec,
        cwd_ro: bool,
        withheld_cwd: Option<&Path>,
        user_dsts: &[PathBuf],
    ) -> JailMap {
        let mut shown: Vec<Shown> = Vec::new();
        for b in &spec.binds {
            let origin = if user_dsts.contains(&b.dst) {
                Origin::Bind
            } else if cwd_ro && b.src == b.dst && spec.workdir.as_ref() == Some(&b.dst) {
                Origin::Cwd
            } else if crate::view::is_system_path(&b.dst) {
                Origin::System
            } else {
                Origin::Bind
            };
            // The last bind for a destination is the one the jail shows.
            shown.retain(|s| s.dst != b.dst);
            shown.push(Shown {
                dst: b.dst.clone(),
                src: b.src.clone(),
                origin,
            });
        }
        JailMap {
            shown,
            hides: spec.hides.clone(),
            served: spec
                .dirs
                .iter()
                .filter(|d| Some(d.as_path()) != withheld_cwd)
                .cloned()
                .collect(),
            withheld_cwd: withheld_cwd.map(Path::to_path_buf),
        }
    }

    /// Where jail directory `dir` comes from.
    pub fn origin(&self, dir: &Path) -> Came {
        if self.served.iter().any(|p| dir.starts_with(p)) {
            return Came::Supervisors;
        }
        if self.withheld_cwd.as_deref() == Some(dir) {
            return Came::WithheldCwd;
        }
        let Some(s) = self
            .shown
            .iter()
            .filter(|s| dir.starts_with(&s.dst))
            .max_by_key(|s| s.dst.components().count())
        else {
            // The jail's own root, /proc/sys, a generated /etc file, a served prefix.
            return Came::System;
        };
        let rest = dir.strip_prefix(&s.dst).unwrap_or(Path::new(""));
        let host = if rest.as_os_str().is_empty() {
            s.src.clone()
        } else {
            s.src.join(rest)
        };
        if self.hides.iter().any(|h| host.starts_with(h)) {
            return Came::Supervisors;
        }
        match s.origin {
            Origin::System => Came::System,
            Origin::Cwd => Came::Cwd { host },
            Origin::Bind => Came::Bind { host },
        }
    }
}

/// Where a jail directory comes from ([`JailMap::origin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Came {
    /// The supervisor fills it (a served prefix) or it is the supervisor's own (hidden).
    Supervisors,
    /// The working directory the jail did not show (an empty directory at its path).
    WithheldCwd,
    /// The standard system view, the jail's own root.
    System,
    /// The working directory shown read-only, at `host`.
    Cwd { host: PathBuf },
    /// A bind of the program's or the user's, of `host`.
    Bind { host: PathBuf },
}
