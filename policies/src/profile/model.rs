//! The validated profile: what a run uses, and the questions the supervisor asks of it.

use crate::error::PolicyError;
use crate::paths::{self, PathAction, PathDecision, PathRule};
use notify::ArgCmp;
use std::path::{Path, PathBuf};

/// What happens to a syscall no entry matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DefaultAction {
    Allow,
    /// Fail with `errno`. With `log`, the kernel notifies and the supervisor answers with `errno`
    /// (never continues) and logs the syscall name once.
    Errno {
        errno: i32,
        log: bool,
    },
    Kill,
}

/// What a `[[syscall]]` entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SyscallAction {
    Allow,
    /// The supervisor decides by path ([`Profile::decide`]).
    Notify,
    Errno(i32),
    Kill,
}

/// Where an entry comes from (documentation, checked by tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Origin {
    /// Table 3.1 of the σPy thesis: σOS's 73 allowed syscalls.
    Table31,
    /// Beyond Table 3.1 (with the reason in the entry).
    Addition,
}

/// What a `[[syscall]]` entry may need of the run ([`SyscallEntry::needs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Need {
    /// The σcontainer: its PID and mount namespaces confine the call (`needs = "jail"`).
    Jail,
    /// A network namespace of the proc's own, loopback only: jailed and not `--net host`
    /// (`needs = "own-net"`).
    OwnNet,
}

/// One validated `[[syscall]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyscallEntry {
    pub name: String,
    /// Number on the native architecture.
    pub nr: i32,
    pub action: SyscallAction,
    /// All must hold for the entry to apply; otherwise the default applies.
    pub when: Vec<ArgCmp>,
    /// Why the entry is there: documentation of the profile's text, not in the serde form.
    #[serde(skip)]
    pub reason: String,
    pub origin: Option<Origin>,
    /// What the entry needs of the run to apply (`needs = "jail"` or `"own-net"`); where it
    /// holds, the entry replaces an unconditional one for the same call and arguments
    /// ([`Profile::for_run`]).
    #[serde(default)]
    pub needs: Option<Need>,
    /// Line of the entry's `name` in its file.
    pub line: usize,
}

/// How the supervisor must treat a notification for a syscall number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationKind {
    /// A path-bearing call: read the path, apply [`Profile::decide`].
    Path,
    /// Refused by the profile's default: answer with `errno` (never continue), log the name once.
    Denied { errno: i32 },
}

/// A validated profile. Build it with [`crate::load`] or [`Profile::parse`].
///
/// Its serde form (the supervisor's compiled-profile cache) keeps what a run uses: the
/// descriptions and reasons, which document the profile's text, are left out (they are most of
/// its bytes, and reading them back was most of a cached start's cost).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Profile {
    pub(super) name: String,
    #[serde(skip)]
    pub(super) description: String,
    pub(super) source: String,
    pub(super) default: DefaultAction,
    pub(super) syscalls: Vec<SyscallEntry>,
    pub(super) paths: Vec<PathRule>,
}

impl Profile {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The file the profile came from (for builtins, its path in the repository).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn default_action(&self) -> DefaultAction {
        self.default
    }

    pub fn syscalls(&self) -> &[SyscallEntry] {
        &self.syscalls
    }

    pub fn path_rules(&self) -> &[PathRule] {
        &self.paths
    }

    /// The profile for one run: an entry that [`SyscallEntry::needs`] what the run lacks is
    /// dropped; one whose need holds replaces the entry for the same call and arguments that
    /// needs nothing (e.g. `getxattr` answered ENOTSUP without a jail, allowed in one), and
    /// needs nothing more. Until then such entries apply nowhere ([`Profile::filter_spec`]).
    pub fn for_run(mut self, jailed: bool, own_net: bool) -> Profile {
        let holds = |n: Need| match n {
            Need::Jail => jailed,
            Need::OwnNet => jailed && own_net,
        };
        self.syscalls.retain(|e| e.needs.is_none_or(holds));
        let granted: Vec<(i32, Vec<ArgCmp>)> = self
            .syscalls
            .iter()
            .filter(|e| e.needs.is_some())
            .map(|e| (e.nr, e.when.clone()))
            .collect();
        self.syscalls.retain(|e| {
            e.needs.is_some() || !granted.iter().any(|(nr, w)| *nr == e.nr && *w == e.when)
        });
        for e in &mut self.syscalls {
            e.needs = None;
        }
        self
    }

    /// The errno unlisted syscalls fail with, if the default is to fail them.
    pub fn denied_errno(&self) -> Option<i32> {
        match self.default {
            DefaultAction::Errno { errno, .. } => Some(errno),
            _ => None,
        }
    }

    /// Whether unlisted syscalls reach the supervisor (as notifications) to be denied and logged.
    pub fn logs_denied(&self) -> bool {
        matches!(self.default, DefaultAction::Errno { log: true, .. })
    }

    /// Turn logging of denied calls on or off (e.g. `--no-log-denied`, or a test without a
    /// supervisor). Has no effect unless the default is an errno.
    pub fn set_logs_denied(&mut self, on: bool) {
        if let DefaultAction::Errno { log, .. } = &mut self.default {
            *log = on;
        }
    }

    /// Names of the syscalls notified for a path decision.
    pub fn notified_syscalls(&self) -> Vec<String> {
        self.notified().map(|e| e.name.clone()).collect()
    }

    /// Native numbers of the syscalls notified for a path decision.
    pub fn notified_syscall_nrs(&self) -> Vec<i32> {
        self.notified().map(|e| e.nr).collect()
    }

    fn notified(&self) -> impl Iterator<Item = &SyscallEntry> {
        self.syscalls
            .iter()
            .filter(|e| e.action == SyscallAction::Notify)
    }

    /// How to treat a notification for syscall number `nr`; `None` if this profile's filter
    /// never notifies it (the supervisor should then refuse it with EPERM and log loudly).
    pub fn notification_kind(&self, nr: i32) -> Option<NotificationKind> {
        if self.notified().any(|e| e.nr == nr) {
            return Some(NotificationKind::Path);
        }
        match self.default {
            DefaultAction::Errno { errno, log: true } => Some(NotificationKind::Denied { errno }),
            _ => None,
        }
    }

    /// The decision for an absolute, resolved path: the rule with the longest prefix (counted in
    /// components, so `/etc/pass` does not match `/etc/passwd`) applies; no rule => `Continue`.
    pub fn decide(&self, path: &Path) -> PathDecision {
        paths::decide(&self.paths, path)
    }

    /// Add a serve rule (from `--serve PREFIX=DIR`); it replaces a file rule for the same prefix.
    pub fn add_serve(&mut self, arg: &str) -> Result<(), PolicyError> {
        let (prefix, dir) = parse_serve_arg(arg)?;
        self.paths.retain(|r| r.prefix != prefix);
        self.paths.push(PathRule {
            prefix,
            action: PathAction::Serve(dir),
            reason: format!("--serve {arg}"),
        });
        Ok(())
    }
}

/// Parse `PREFIX=DIR`: PREFIX absolute and normalized; DIR made absolute against the current
/// directory.
pub fn parse_serve_arg(arg: &str) -> Result<(PathBuf, PathBuf), PolicyError> {
    let bad = |message: String| PolicyError::Serve {
        arg: arg.to_owned(),
        message,
    };
    let Some((prefix, dir)) = arg.split_once('=') else {
        return Err(bad(
            "expected PREFIX=DIR, e.g. /tmp/python/Lib=/var/cache/realm/lib".into(),
        ));
    };
    let prefix = paths::check_prefix(prefix).map_err(bad)?;
    if dir.is_empty() {
        return Err(bad("DIR is empty".into()));
    }
    let dir = std::path::absolute(dir).map_err(|e| bad(format!("DIR: {e}")))?;
    Ok((prefix, dir))
}
