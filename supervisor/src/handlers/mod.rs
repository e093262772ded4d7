//! Syscall handlers. Each family module *declares* its syscalls' path arguments ([`Spec`]) and
//! implements what the supervisor does when a path is served ([`ServeFn`], one uniform
//! signature returning `Result<Reply, Errno>`). [`path_call`] is the one routine that reads the
//! paths from the target, resolves them, asks the policy and re-checks the notification id
//! before a serve; handlers never read target memory for paths themselves.
#![forbid(unsafe_code)]

pub mod access;
pub mod exec;
pub mod mkdir;
pub mod open;
pub mod readlink;
pub mod signal;
pub mod socket;
pub mod stat;

use crate::policy::Decide;
use crate::serve::{Lookup, Served};
use crate::stats::Decision;
use crate::supervisor::{answer, Shared};
use nix::errno::Errno;
use notify::mem::TargetMem;
use notify::{Listener, Notification, Response};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a handler did.
pub enum Reply {
    /// Answer the notification with this.
    Respond(Response),
    /// Already answered (NOTIF_ADDFD with SEND), or handed to a worker that will answer.
    Answered,
}

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
    fn moves_cwd(&self) -> bool {
        matches!(self.name, "chdir" | "fchdir")
    }
}

/// What a path call writes, judged from its registers (and, for openat2, its `open_how`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// Reads, queries, exec, chdir: nothing is written.
    No,
    /// open-style flags in argument `flags`: a write when [`open_writes`] says so.
    Open { flags: usize },
    /// openat2: the flags are in the `open_how` that argument 2 points to.
    OpenHow,
    /// creat: `O_CREAT | O_WRONLY | O_TRUNC`.
    Creat,
    /// Makes a new entry (mkdir, mknod, symlink, link): an existing one is EEXIST instead.
    Creates,
    /// Removes or renames an entry (unlink, rmdir, rename): its directory is written.
    Entry,
    /// Changes an existing file's mode, owner, times or size.
    Modifies,
}

/// The open flags that make an open a write: write access, creating, truncating. Used both
/// by the filter (a masked comparison per bit, so read-only opens are never notified for the
/// hint) and by the handler. `O_TMPFILE` needs write access, so it is covered.
pub const OPEN_WRITE_BITS: [u64; 4] = [
    libc::O_WRONLY as u64,
    libc::O_RDWR as u64,
    libc::O_CREAT as u64,
    libc::O_TRUNC as u64,
];

impl Writes {
    /// Whether a call with these registers may write (openat2: its flags are in memory).
    pub fn may_write(self, args: &[u64; 6]) -> bool {
        match self {
            Writes::No => false,
            Writes::Open { flags } => args.get(flags).is_some_and(|&f| open_writes(f)),
            _ => true,
        }
    }
}

/// Whether open flags ask to write (see [`OPEN_WRITE_BITS`]).
pub fn open_writes(flags: u64) -> bool {
    OPEN_WRITE_BITS.iter().any(|b| flags & b != 0)
}

/// mknod/mknodat create only FIFOs and regular files: a device node is refused whatever the
/// path (EPERM, what the kernel answers a caller without CAP_MKNOD). Sockets are made by bind.
fn mknod_fifo_or_file(a: &[u64; 6]) -> Result<(), Errno> {
    fifo_or_file_mode(a[1])
}

fn mknodat_fifo_or_file(a: &[u64; 6]) -> Result<(), Errno> {
    fifo_or_file_mode(a[2])
}

fn fifo_or_file_mode(mode: u64) -> Result<(), Errno> {
    let kind = mode as u32 & libc::S_IFMT;
    if kind == 0 || kind == libc::S_IFREG || kind == libc::S_IFIFO {
        Ok(())
    } else {
        Err(Errno::EPERM)
    }
}

/// Calls that would modify a served (read-only) tree: EROFS, or EEXIST when the call would
/// create an entry that already exists (what `os.makedirs(exist_ok=True)` and friends look for).
pub fn refuse_write(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    if !call.must_exist && stat::open_path(call).is_ok() {
        return Err(Errno::EEXIST);
    }
    Err(Errno::EROFS)
}

/// Calls the supervisor cannot perform for the target (e.g. chdir into a served directory: the
/// target's cwd would have to be a directory it cannot see).
pub fn refuse_unsupported(_call: &ServeCall<'_>) -> Result<Reply, Errno> {
    Err(Errno::EACCES)
}

const CWD_FOLLOW: &[PathArg] = &[PathArg::cwd(0, Follow::Yes)];
const CWD_NOFOLLOW: &[PathArg] = &[PathArg::cwd(0, Follow::No)];
const CWD_CREATE: &[PathArg] = &[PathArg::cwd(0, Follow::No).creates()];
const AT_CREATE: &[PathArg] = &[PathArg::at(0, 1, Follow::No).creates()];
const AT_NOFOLLOW: &[PathArg] = &[PathArg::at(0, 1, Follow::No)];
const TWO_CWD: &[PathArg] = &[
    PathArg::cwd(0, Follow::No),
    PathArg::cwd(1, Follow::No).creates(),
];
const TWO_AT: &[PathArg] = &[
    PathArg::at(0, 1, Follow::No),
    PathArg::at(2, 3, Follow::No).creates(),
];
const SYMLINK: &[PathArg] = &[PathArg::cwd(1, Follow::No).creates()];
const SYMLINKAT: &[PathArg] = &[PathArg::at(1, 2, Follow::No).creates()];
const AT_FLAG3: &[PathArg] = &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).empty_ok(3)];
const AT_FLAG4: &[PathArg] = &[PathArg::at(0, 1, Follow::UnlessAtFlag(4)).empty_ok(4)];

/// Every path-bearing syscall the supervisor knows. A profile that notifies a syscall not listed
/// here gets it refused (with a warning at start), never continued blindly.
pub const SPECS: &[Spec] = &[
    open::OPEN,
    open::OPENAT,
    open::OPENAT2,
    open::CREAT,
    stat::STAT,
    stat::LSTAT,
    stat::NEWFSTATAT,
    stat::STATX,
    access::ACCESS,
    access::FACCESSAT,
    access::FACCESSAT2,
    readlink::READLINK,
    readlink::READLINKAT,
    exec::EXECVE,
    exec::EXECVEAT,
    mkdir::MKDIR,
    mkdir::MKDIRAT,
    Spec {
        name: "rmdir",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "unlink",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "unlinkat",
        paths: AT_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "rename",
        paths: TWO_CWD,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "renameat",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "renameat2",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "link",
        paths: TWO_CWD,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "linkat",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "symlink",
        paths: SYMLINK,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "symlinkat",
        paths: SYMLINKAT,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "mknod",
        paths: CWD_CREATE,
        serve: refuse_write,
        check: Some(mknod_fifo_or_file),
        writes: Writes::Creates,
    },
    Spec {
        name: "mknodat",
        paths: AT_CREATE,
        serve: refuse_write,
        check: Some(mknodat_fifo_or_file),
        writes: Writes::Creates,
    },
    Spec {
        name: "chmod",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "fchmodat",
        paths: AT_FLAG3,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "chown",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "lchown",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "fchownat",
        paths: AT_FLAG4,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "truncate",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "utimensat",
        paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).null_is_fd()],
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "chdir",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    // No path: notified only so that path resolution knows a cwd changes (see
    // `ProcView::set_cwd_changes_seen`); the kernel checks the fd.
    Spec {
        name: "fchdir",
        paths: &[],
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "chroot",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "statfs",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "getxattr",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "lgetxattr",
        paths: CWD_NOFOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "listxattr",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "llistxattr",
        paths: CWD_NOFOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "inotify_add_watch",
        paths: &[PathArg::cwd(1, Follow::Yes)],
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
];

/// Per-call scratch the loop reuses: what was decided and on which path (for trace/stats),
/// and the buffers the path routine reads and resolves into (kept, so a call allocates nothing).
#[derive(Default)]
pub struct CallInfo {
    pub decision: Option<Decision>,
    pub path: Option<PathBuf>,
    /// The path as read from the target.
    raw: Vec<u8>,
    /// The path resolved in the target's view.
    abs: Vec<u8>,
    /// The targets' /proc directories, kept open between calls.
    proc: notify::path::ProcView,
}

impl CallInfo {
    /// `root_fixed`: no target can change its root ([`crate::policy::Policy::root_is_fixed`]);
    /// `cwd_seen`: nor its cwd unheard ([`crate::policy::Policy::cwd_changes_seen`]).
    pub fn new(root_fixed: bool, cwd_seen: bool) -> Self {
        let mut info = CallInfo::default();
        info.proc.set_root_fixed(root_fixed);
        info.proc.set_cwd_changes_seen(cwd_seen);
        info
    }

    /// `path` (as the target passed it) resolved in the target's view, in this loop's buffer.
    pub fn resolve(&mut self, pid: u32, dirfd: i32, path: &[u8]) -> Result<&Path, Errno> {
        self.proc.absolute_into(pid, dirfd, path, &mut self.abs)?;
        Ok(Path::new(OsStr::from_bytes(&self.abs)))
    }

    /// A notification of target `tid` arrived: see [`notify::path::ProcView::task_seen`].
    pub fn task_seen(&mut self, tid: u32) {
        self.proc.task_seen(tid);
    }

    pub fn reset(&mut self) {
        self.decision = None;
        self.path = None;
    }
}

fn errno_of(e: notify::NotifyError) -> Errno {
    match e {
        notify::NotifyError::Ioctl { source, .. } => source,
        notify::NotifyError::Gone { .. } => Errno::ENOENT,
        _ => Errno::EIO,
    }
}

/// Map a notify error from an fd injection to the errno the call fails with.
pub fn inject_errno(e: notify::NotifyError) -> Errno {
    errno_of(e)
}

/// Whether `arg`'s last symlink is followed in this call.
fn follows(arg: &PathArg, n: &Notification) -> bool {
    match arg.follow {
        Follow::Yes => true,
        Follow::No => false,
        Follow::UnlessAtFlag(i) => n.args[i] & libc::AT_SYMLINK_NOFOLLOW as u64 == 0,
    }
}

/// With read-only hints: when this call writes and the jail shows the directory it writes
/// read-only, the kernel will refuse it with EROFS. Say so in the trace and stats and hint
/// once. The call is continued either way; nothing is looked at for a call that only reads.
/// `abs` gives the last path argument in the target's view.
fn explain_read_only(
    sh: &Shared,
    hints: &crate::readonly::Hints,
    n: &Notification,
    spec: &Spec,
    info: &mut CallInfo,
    abs: impl FnOnce() -> Option<PathBuf>,
) {
    use crate::readonly::{refused_dir, Write};
    let how_flags = || {
        let mut buf = [0u8; 8];
        TargetMem {
            listener: &sh.listener,
            notif: n,
        }
        .read(n.args[2], &mut buf)
        .ok()
        .map(|()| u64::from_ne_bytes(buf))
    };
    let Some(write) = Write::of(spec.writes, &n.args, how_flags) else {
        return;
    };
    let (Some(arg), Some(abs)) = (spec.paths.last(), abs()) else {
        return;
    };
    let Some(dir) = refused_dir(n.pid, &abs, write, follows(arg, n)) else {
        return;
    };
    // The root looked at was this target's only if its notification is still live.
    if !sh.listener.id_valid(n.id) {
        return;
    }
    if sh.timing && info.path.is_none() {
        info.path = Some(abs);
    }
    info.decision = Some(Decision::ReadOnly);
    hints.note(&dir);
}

/// The shared path routine: read each declared path, resolve it against the target's cwd or
/// dirfd, decide, and for a serve re-check the notification id before acting on the host.
pub fn path_call(
    sh: &Arc<Shared>,
    n: &Notification,
    spec: &'static Spec,
    info: &mut CallInfo,
) -> Result<Reply, Errno> {
    if let Some(check) = spec.check {
        check(&n.args).inspect_err(|e| info.decision = Some(Decision::Error(*e as i32)))?;
    }
    if spec.moves_cwd() {
        info.proc.cwd_changes(n.pid);
    }
    let mem = TargetMem {
        listener: &sh.listener,
        notif: n,
    };
    if !sh.read_paths {
        // No path rule exists and nobody traces: every decision would be `Continue`.
        info.decision = Some(Decision::Continue);
        if let Some(hints) = &sh.hints {
            explain_read_only(sh, hints, n, spec, info, || {
                let arg = spec.paths.last()?;
                if arg.null_is_fd && n.args[arg.path] == 0 {
                    return None;
                }
                let raw = mem.read_path(n.args[arg.path]).ok()?;
                if raw.is_empty() {
                    return None;
                }
                let dirfd = arg.dirfd.map_or(libc::AT_FDCWD, |i| n.args[i] as i32);
                notify::path::absolute(n.pid, dirfd, &raw).ok()
            });
        }
        return Ok(Reply::Respond(Response::continue_unchecked()));
    }
    let CallInfo {
        decision: info_decision,
        path: info_path,
        raw,
        abs,
        proc,
    } = info;
    // The first serve decision (if any) with its arg; a deny anywhere wins.
    let mut serve: Option<(usize, PathBuf, &PathArg)> = None;
    // The last path argument, resolved: the one a writing call writes (for the hint).
    let mut last_abs: Option<PathBuf> = None;
    let keep_last = sh.hints.is_some() && spec.writes.may_write(&n.args);
    for (i, arg) in spec.paths.iter().enumerate() {
        if arg.null_is_fd && n.args[arg.path] == 0 {
            // The call is on an fd the target already holds: nothing to decide.
            continue;
        }
        // Unchecked: a serve checks the id before it acts, the hint checks it, and a continue
        // or refusal only answers this notification (see `read_path_for_answer`).
        mem.read_path_for_answer(n.args[arg.path], raw)
            .inspect_err(|e| {
                *info_decision = Some(Decision::Error(*e as i32));
            })?;
        if raw.is_empty() {
            match arg.empty_flag {
                Some(f) if n.args[f] & libc::AT_EMPTY_PATH as u64 != 0 => {
                    // The call is on an fd the target already holds: nothing to decide.
                    continue;
                }
                _ => {
                    *info_decision = Some(Decision::Error(libc::ENOENT));
                    return Err(Errno::ENOENT);
                }
            }
        }
        let dirfd = match arg.dirfd {
            Some(i) => n.args[i] as i32,
            None => libc::AT_FDCWD,
        };
        proc.absolute_into(n.pid, dirfd, raw, abs)
            .inspect_err(|e| {
                *info_decision = Some(Decision::Error(*e as i32));
            })?;
        let abs_path = Path::new(OsStr::from_bytes(abs));
        let mut decision = sh.policy.decide(abs_path);
        // Relative to a directory the supervisor served (an injected fd used as dirfd, or as
        // cwd after fchdir): the path is below that served directory, not in the jail's tree.
        if raw.first() != Some(&b'/')
            && !sh.policy.served().is_empty()
            && !(dirfd == libc::AT_FDCWD && proc.cwd_is_start())
        {
            if let Some(index) = proc
                .mount_id(n.pid, dirfd)
                .ok()
                .and_then(|m| sh.policy.served_mount(m))
            {
                let rest = abs_path.strip_prefix("/").unwrap_or(abs_path).to_path_buf();
                decision = Decide::Serve { index, rest };
            }
        }
        if info_path.is_none() && sh.timing {
            *info_path = Some(abs_path.to_path_buf());
        }
        if keep_last && i + 1 == spec.paths.len() {
            last_abs = Some(abs_path.to_path_buf());
        }
        match decision {
            Decide::Continue => {}
            Decide::Deny(e) => {
                *info_decision = Some(Decision::Deny(e));
                if sh.timing {
                    *info_path = Some(abs_path.to_path_buf());
                }
                return Err(Errno::from_raw(e));
            }
            Decide::Serve { index, rest } => {
                if serve.is_none() {
                    serve = Some((index, rest, arg));
                }
            }
        }
    }
    let Some((index, rest, arg)) = serve else {
        info.decision = Some(Decision::Continue);
        if let Some(hints) = &sh.hints {
            explain_read_only(sh, hints, n, spec, info, || last_abs);
        }
        // Access is the kernel's job here (allow-list + mount namespace): no rule grants anything.
        return Ok(Reply::Respond(Response::continue_unchecked()));
    };
    // The cwd/dirfd reads above were for this target only if its notification is still live.
    if !sh.listener.id_valid(n.id) {
        info.decision = Some(Decision::Error(libc::ENOENT));
        return Err(Errno::ENOENT);
    }
    let follow = follows(arg, n);
    let must_exist = arg.must_exist;
    let served = &sh.policy.served()[index];
    let lookup = sh.resolver.lookup(served, &rest);
    let served = match lookup {
        Lookup::At(other) => other,
        _ => served,
    };
    match lookup {
        Lookup::Fail(e) => {
            info.decision = Some(Decision::Serve(Some(e as i32)));
            Err(e)
        }
        Lookup::Local | Lookup::At(_) => {
            let call = ServeCall {
                listener: &sh.listener,
                notif: n,
                served,
                rest: &rest,
                follow,
                must_exist,
            };
            let r = (spec.serve)(&call);
            info.decision = Some(Decision::Serve(r.as_ref().err().map(|e| *e as i32)));
            r
        }
        Lookup::Fetch => {
            let sh2 = Arc::clone(sh);
            let n2 = *n;
            sh.deferred.submit(Box::new(move || {
                let served = &sh2.policy.served()[index];
                let r = sh2.resolver.fetch(served, &rest).and_then(|()| {
                    (spec.serve)(&ServeCall {
                        listener: &sh2.listener,
                        notif: &n2,
                        served,
                        rest: &rest,
                        follow,
                        must_exist,
                    })
                });
                answer(&sh2.listener, n2.id, r);
            }));
            info.decision = Some(Decision::Serve(None));
            Ok(Reply::Answered)
        }
    }
}
