//! kill, tkill, tgkill, pidfd_send_signal without a PID namespace (`--no-jail`): a signal may
//! reach only the proc's own process tree (the target and its descendants, including orphans
//! re-parented to the supervisor, which is their subreaper).
//!
//! Inside the σcontainer these calls are plain kernel-allowed (its PID namespace is the proc's
//! tree); this module is only reached when the target runs without one.
//!
//! A signal to the caller's own process or thread is continued: a pid cannot be reused while its
//! process is blocked in this very call. Any other signal is sent by the supervisor itself,
//! through a pidfd opened *before* the descendancy check: if the process dies and its pid is
//! reused between the check and the send, the pidfd still names the dead one and the send fails
//! with ESRCH instead of reaching a stranger. Such signals carry the supervisor's pid as
//! `si_pid` (SI_USER), not the sender's.
#![forbid(unsafe_code)]

use crate::reply::Reply;
use crate::sys;
use nix::errno::Errno;
use notify::{Notification, Response};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// Which signalling call was notified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalCall {
    Kill,
    Tkill,
    Tgkill,
    PidfdSendSignal,
}

impl SignalCall {
    /// The calls this module decides, by syscall name.
    pub const ALL: [(&'static str, SignalCall); 4] = [
        ("kill", SignalCall::Kill),
        ("tkill", SignalCall::Tkill),
        ("tgkill", SignalCall::Tgkill),
        ("pidfd_send_signal", SignalCall::PidfdSendSignal),
    ];
}

/// The proc's tree: processes whose ancestry reaches the main child, or the supervisor (orphans
/// re-parented to it as their subreaper).
#[derive(Debug, Clone, Copy)]
pub struct Tree {
    /// The main child (the target).
    pub root: i32,
    /// The supervisor's own pid.
    pub supervisor: i32,
}

/// The supervisor's own helper processes (a realm's background byte-compile): not the proc's,
/// though they are children of the supervisor like re-parented orphans.
static HELPERS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Mark `pid`, a process the supervisor started for itself, and its descendants as outside
/// the proc's tree (no signal from the proc, no orphan-rule SIGTERM).
pub fn register_helper(pid: i32) {
    let mut h = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
    // Dead helpers' pids are dropped as the list grows; a few are ever alive at once.
    if h.len() >= 64 {
        h.retain(|&p| stat_of(p).is_some());
    }
    h.push(pid);
}

fn is_helper(pid: i32) -> bool {
    HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&pid)
}

/// Longest ancestry walked before giving up (a process tree deeper than this is refused).
const MAX_DEPTH: usize = 4096;
/// Highest signal number (SIGRTMAX on Linux).
const MAX_SIG: i32 = 64;

/// Fields of `/proc/<pid>/stat` after the command name: (state, ppid, pgrp).
fn stat_of(pid: i32) -> Option<(u8, i32, i32)> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything: split at the last ')'.
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(s.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = f.next()?.bytes().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Thread group of thread `tid` (`Tgid:` in `/proc/<tid>/status`).
fn tgid_of(tid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

impl Tree {
    /// Whether process `pid` belongs to the proc's tree (the supervisor itself does not).
    pub fn contains(&self, pid: i32) -> bool {
        if pid <= 0 || pid == self.supervisor {
            return false;
        }
        let mut cur = pid;
        for _ in 0..MAX_DEPTH {
            if cur == self.root {
                return true;
            }
            if is_helper(cur) {
                return false;
            }
            let Some((_, ppid, _)) = stat_of(cur) else {
                return false;
            };
            if ppid == self.supervisor {
                return true;
            }
            if ppid <= 1 {
                return false;
            }
            cur = ppid;
        }
        false
    }

    /// Every live process of the tree, found by walking /proc (unreaped zombies left out).
    pub fn members(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&p| stat_of(p).is_some_and(|(state, _, _)| state != b'Z'))
            .filter(|&p| self.contains(p))
            .collect()
    }

    /// Send `sig` to `pid` if it is in the tree: EPERM if it is not, ESRCH if it is gone.
    pub fn send(&self, pid: i32, sig: i32) -> Result<(), Errno> {
        let pidfd = match sys::pidfd_open(pid, 0) {
            // A thread id that is not a group leader: kill(2) signals its whole process.
            Err(Errno::EINVAL) => {
                let tgid = tgid_of(pid).ok_or(Errno::ESRCH)?;
                sys::pidfd_open(tgid, 0)?
            }
            r => r?,
        };
        self.send_checked(&pidfd, pid, sig, 0)
    }

    /// Send through `pidfd` (opened first, so pid reuse cannot redirect it) after checking
    /// that `pid`, the process it was opened for, is in the tree.
    fn send_checked(&self, pidfd: &OwnedFd, pid: i32, sig: i32, flags: u32) -> Result<(), Errno> {
        if !self.contains(pid) {
            return Err(if stat_of(pid).is_some() {
                Errno::EPERM
            } else {
                Errno::ESRCH
            });
        }
        sys::pidfd_send_signal(pidfd.as_fd(), sig, flags)
    }

    /// kill(pid <= 0): every member of process group `pgrp` (or of the whole tree for `None`,
    /// kill(-1)) that is in the tree, except `skip`. Members outside the tree are left alone;
    /// EPERM if the group has members but none in the tree, ESRCH if it has none.
    fn send_group(&self, pgrp: Option<i32>, sig: i32, skip: Option<i32>) -> Result<(), Errno> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Err(Errno::ESRCH);
        };
        let (mut seen, mut sent) = (false, false);
        for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
            if Some(pid) == skip {
                continue;
            }
            let Some((_, _, g)) = stat_of(pid) else {
                continue;
            };
            if pgrp.is_some_and(|want| want != g) {
                continue;
            }
            if pgrp.is_some() {
                seen = true;
            }
            if !self.contains(pid) {
                continue;
            }
            seen = true;
            if self.send(pid, sig).is_ok() {
                sent = true;
            }
        }
        match (seen, sent) {
            (_, true) => Ok(()),
            (true, false) => Err(Errno::EPERM),
            (false, false) => Err(Errno::ESRCH),
        }
    }
}

/// The signal number argument: 0..=64 (the kernel's own EINVAL otherwise).
fn signal_arg(v: u64) -> Result<i32, Errno> {
    let sig = v as i32;
    if (0..=MAX_SIG).contains(&sig) {
        Ok(sig)
    } else {
        Err(Errno::EINVAL)
    }
}

/// Decide one notified signalling call.
pub fn handle(tree: &Tree, n: &Notification, call: SignalCall) -> Result<Reply, Errno> {
    let caller_tid = n.pid as i32;
    // The caller is blocked in this call, so its thread and process cannot go away unnoticed:
    // if they are gone, nobody waits for the answer.
    let caller = tgid_of(caller_tid).ok_or(Errno::ESRCH)?;
    let continue_ = || Ok(Reply::Respond(Response::continue_unchecked()));
    match call {
        SignalCall::Kill => {
            // The kernel reads pid and sig as ints.
            let pid = n.args[0] as i32;
            let sig = signal_arg(n.args[1])?;
            match pid {
                p if p == caller => continue_(),
                p if p > 0 => tree
                    .send(p, sig)
                    .map(|()| Reply::Respond(Response::Value(0))),
                0 => {
                    let (_, _, pgrp) = stat_of(caller).ok_or(Errno::ESRCH)?;
                    tree.send_group(Some(pgrp), sig, None)
                        .map(|()| Reply::Respond(Response::Value(0)))
                }
                -1 => tree
                    .send_group(None, sig, Some(caller))
                    .map(|()| Reply::Respond(Response::Value(0))),
                p => tree
                    .send_group(Some(p.checked_neg().ok_or(Errno::ESRCH)?), sig, None)
                    .map(|()| Reply::Respond(Response::Value(0))),
            }
        }
        SignalCall::Tkill | SignalCall::Tgkill => {
            let (want_tgid, tid, sig) = if call == SignalCall::Tgkill {
                (
                    Some(n.args[0] as i32),
                    n.args[1] as i32,
                    signal_arg(n.args[2])?,
                )
            } else {
                (None, n.args[0] as i32, signal_arg(n.args[1])?)
            };
            if tid <= 0 || want_tgid.is_some_and(|g| g <= 0) {
                return Err(Errno::EINVAL);
            }
            if tid == caller_tid && want_tgid.is_none_or(|g| g == caller) {
                return continue_();
            }
            let pidfd = sys::pidfd_open(tid, sys::PIDFD_THREAD)?;
            let tgid = tgid_of(tid).ok_or(Errno::ESRCH)?;
            if want_tgid.is_some_and(|g| g != tgid) {
                return Err(Errno::ESRCH);
            }
            tree.send_checked(&pidfd, tgid, sig, 0)?;
            Ok(Reply::Respond(Response::Value(0)))
        }
        SignalCall::PidfdSendSignal => {
            let sig = signal_arg(n.args[1])?;
            if n.args[2] != 0 {
                // A caller-made siginfo cannot be forwarded faithfully; refuse rather than lie.
                return Err(Errno::EPERM);
            }
            let flags = u32::try_from(n.args[3]).map_err(|_| Errno::EINVAL)?;
            let fd = i32::try_from(n.args[0]).map_err(|_| Errno::EBADF)?;
            let caller_fd = sys::pidfd_open(caller, 0)?;
            // Our own copy of the caller's pidfd: the same process, whatever happens to its pid.
            let ours = sys::pidfd_getfd(caller_fd.as_fd(), fd).map_err(|_| Errno::EBADF)?;
            let pid = pidfd_pid(&ours).ok_or(Errno::EBADF)?;
            if pid < 0 {
                return Err(Errno::ESRCH);
            }
            tree.send_checked(&ours, pid, sig, flags)?;
            Ok(Reply::Respond(Response::Value(0)))
        }
    }
}

/// The pid a pidfd of ours refers to (`Pid:` in its fdinfo; -1 once it exited), or the pid of
/// a `/proc/<pid>` directory fd (which pidfd_send_signal also accepts); `None` for other fds.
fn pidfd_pid(fd: &OwnedFd) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    if let Some(pid) = s
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
    {
        return Some(pid);
    }
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let rest = link.to_str()?.strip_prefix("/proc/")?;
    rest.parse().ok()
}

/// The orphan rule: signal every process left in the tree. Returns how many were signalled.
pub fn signal_all(tree: &Tree, sig: i32) -> usize {
    tree.members()
        .into_iter()
        .filter(|&p| tree.send(p, sig).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_names_with_spaces_and_parens() {
        let me = std::process::id() as i32;
        let (state, ppid, pgrp) = stat_of(me).unwrap();
        assert!(state.is_ascii_uppercase());
        assert_eq!(ppid, nix::unistd::getppid().as_raw());
        assert_eq!(pgrp, nix::unistd::getpgrp().as_raw());
        assert_eq!(tgid_of(me), Some(me));
        assert_eq!(stat_of(-5), None);
    }

    #[test]
    fn tree_contains_descendants_only() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let me = std::process::id() as i32;
        // The child as the tree's root.
        let tree = Tree {
            root: pid,
            supervisor: -1,
        };
        assert!(tree.contains(pid));
        assert!(!tree.contains(me), "the parent is not in the tree");
        assert!(!tree.contains(1));
        // The supervisor's children (re-parented orphans) are in the tree; the supervisor is not.
        let tree = Tree {
            root: i32::MAX,
            supervisor: me,
        };
        assert!(tree.contains(pid));
        assert!(!tree.contains(me));
        assert!(tree.members().contains(&pid));
        // A helper of the supervisor is not the proc's, though it is the supervisor's child.
        let mut helper = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        register_helper(helper.id() as i32);
        assert!(!tree.contains(helper.id() as i32));
        helper.kill().unwrap();
        helper.wait().unwrap();
        // Outside the tree: refused, nothing sent.
        let other = Tree {
            root: i32::MAX,
            supervisor: i32::MAX - 1,
        };
        assert_eq!(other.send(pid, libc::SIGKILL), Err(Errno::EPERM));
        assert_eq!(child.try_wait().unwrap(), None, "still alive");
        tree.send(pid, libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert_eq!(tree.send(pid, 0), Err(Errno::ESRCH));
    }
}
