//! The shared path routine ([`path_call`]): read each declared path from the target, resolve it,
//! ask the policy, and re-check the notification id before a serve. Handlers never read target
//! memory for paths themselves.
#![forbid(unsafe_code)]

use super::context::Context;
use super::spec::{Follow, PathArg, ServeCall, Spec};
use crate::policy::Decide;
use crate::reply::{answer, Reply};
use crate::serve::{Lookup, Served};
use crate::stats::Decision;
use nix::errno::Errno;
use notify::mem::TargetMem;
use notify::{Notification, Response};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    sh: &Context,
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
    sh: &Arc<Context>,
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
            if let Some(index) = proc.mount_id(n.pid, dirfd).ok().and_then(|m| {
                sh.policy.served_mount(m).or_else(|| {
                    let prefix = sh.resolver.mount_prefix(m)?;
                    sh.policy.served().iter().position(|s| s.prefix == prefix)
                })
            }) {
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
    let served: &Served = match &lookup {
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
                    // Fetched: served where the resolver now says (a memory tree, say).
                    let now = match sh2.resolver.lookup(served, &rest) {
                        Lookup::Fail(e) => return Err(e),
                        l => l,
                    };
                    let served: &Served = match &now {
                        Lookup::At(other) => other,
                        _ => served,
                    };
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
