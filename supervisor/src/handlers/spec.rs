//! How a handler declares a syscall: its path arguments ([`PathArg`]), what serving it means
//! ([`ServeFn`]) and a check of its registers ([`ArgsCheck`]), in one [`Spec`].
#![forbid(unsafe_code)]

use crate::calls::{PathCall, Writes};
use crate::reply::Reply;
use crate::serve::Served;
use nix::errno::Errno;
use notify::mem::TargetMem;
use notify::{Listener, Notification};
use std::path::Path;

/// Whether the last component of a path is followed when it is a symlink.
#[derive(Debug, Clone, Copy)]
pub enum Follow {
    Yes,
    No,
    /// Followed unless `args[i] & AT_SYMLINK_NOFOLLOW`.
    UnlessAtFlag(usize),
}

/// How a path argument is found in the syscall's arguments.
#[derive(Debug, Clone, Copy)]
pub struct PathArg {
    /// Argument holding the dirfd (`None`: relative to the cwd).
    pub dirfd: Option<usize>,
    /// Argument holding the path pointer.
    pub path: usize,
    pub follow: Follow,
    /// `Some(i)`: an empty path with `args[i] & AT_EMPTY_PATH` means the dirfd itself.
    pub empty_flag: Option<usize>,
    /// The last component must already exist (false for calls that create it).
    pub must_exist: bool,
    /// A NULL path pointer means the dirfd itself (utimensat(fd, NULL, ...) is futimens).
    pub null_is_fd: bool,
}

impl PathArg {
    pub const fn cwd(path: usize, follow: Follow) -> Self {
        PathArg {
            dirfd: None,
            path,
            follow,
            empty_flag: None,
            must_exist: true,
            null_is_fd: false,
        }
    }
    pub const fn at(dirfd: usize, path: usize, follow: Follow) -> Self {
        PathArg {
            dirfd: Some(dirfd),
            path,
            follow,
            empty_flag: None,
            must_exist: true,
            null_is_fd: false,
        }
    }
    pub const fn empty_ok(mut self, flags_arg: usize) -> Self {
        self.empty_flag = Some(flags_arg);
        self
    }
    pub const fn creates(mut self) -> Self {
        self.must_exist = false;
        self
    }
    pub const fn null_is_fd(mut self) -> Self {
        self.null_is_fd = true;
        self
    }
}

/// A served call, as the serve function sees it.
pub struct ServeCall<'a> {
    pub listener: &'a Listener,
    pub notif: &'a Notification,
    pub served: &'a Served,
    /// Path below the served directory (relative, no `..`; empty = the directory itself).
    pub rest: &'a Path,
    pub follow: bool,
    pub must_exist: bool,
}

impl ServeCall<'_> {
    pub fn mem(&self) -> TargetMem<'_> {
        TargetMem {
            listener: self.listener,
            notif: self.notif,
        }
    }
    pub fn arg(&self, i: usize) -> u64 {
        self.notif.args[i]
    }
}

pub type ServeFn = fn(&ServeCall<'_>) -> Result<Reply, Errno>;

/// A check of a call's register arguments before any path is read (registers cannot change
/// after the notification, unlike target memory).
pub type ArgsCheck = fn(&[u64; 6]) -> Result<(), Errno>;

/// One notified syscall: its path arguments and what serving it means.
pub struct Spec {
    pub name: &'static str,
    pub paths: &'static [PathArg],
    pub serve: ServeFn,
    /// Refuse the call outright unless its arguments pass.
    pub check: Option<ArgsCheck>,
    /// How the call writes to the file system through its last path argument (for the
    /// read-only hint, [`crate::readonly`]); never part of a decision.
    pub writes: Writes,
}

impl Spec {
    /// chdir and fchdir: the target's cwd is about to change.
    pub fn moves_cwd(&self) -> bool {
        matches!(self.name, "chdir" | "fchdir")
    }
}

impl Spec {
    /// What the policy is told of this call.
    pub fn describe(&self) -> PathCall {
        PathCall {
            name: self.name,
            writes: self.writes,
            checked: self.check.is_some(),
        }
    }
}
