//! The target without a jail: fork, then in the child only system calls — new mount namespace →
//! hide served dirs → over-mount denied paths → no_new_privs + filter → hand the listener to the
//! parent (it takes it with pidfd_getfd) → wait for "go" → execve. Also what both ways of
//! starting share: the started [`Child`], the stages a setup failure names.
#![forbid(unsafe_code)]

use super::prepared::{handled_signals, Prepared};
use crate::failure::Failure;
use crate::sys;
use anyhow::{anyhow, Context as _};
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// Child → parent messages on the status pipe: (tag, value), 8 bytes each.
pub(super) const MSG_LISTENER: u32 = 0;
pub(super) const STAGES: &[&str] = &[
    "listener",
    "unshare(CLONE_NEWNS)",
    "making / private",
    "hiding a served directory",
    "bind-mounting a directory read-only",
    "over-mounting a denied path",
    "setting CPU affinity",
    "installing the seccomp filter",
    "waiting for the supervisor",
    "execve",
];
pub(super) const STAGE_UNSHARE: u32 = 1;
pub(super) const STAGE_PRIVATE: u32 = 2;
pub(super) const STAGE_HIDE: u32 = 3;
pub(super) const STAGE_BIND: u32 = 4;
pub(super) const STAGE_DENY: u32 = 5;
pub(super) const STAGE_AFFINITY: u32 = 6;
pub(super) const STAGE_FILTER: u32 = 7;
pub(super) const STAGE_HANDOFF: u32 = 8;
pub const STAGE_EXEC: u32 = 9;

pub(super) fn send(fd: &OwnedFd, tag: u32, value: i32) {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&tag.to_ne_bytes());
    msg[4..].copy_from_slice(&value.to_ne_bytes());
    let _ = nix::unistd::write(fd, &msg);
}

/// Read one 8-byte message; `None` on EOF (the child exec'd or died).
pub fn recv_msg(fd: &OwnedFd) -> Option<(u32, i32)> {
    let mut msg = [0u8; 8];
    let mut got = 0;
    while got < msg.len() {
        match nix::unistd::read(fd, &mut msg[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
    let tag = u32::from_ne_bytes(msg[..4].try_into().expect("4 bytes"));
    let value = i32::from_ne_bytes(msg[4..].try_into().expect("4 bytes"));
    Some((tag, value))
}

/// The low byte of a setup message's tag is the stage; the rest the index of the mount.
pub(super) fn stage_tag(stage: u32, index: usize) -> u32 {
    stage | ((index as u32) << 8)
}

pub(super) fn describe_stage(p: &Prepared, tag: u32, errno: i32) -> String {
    let (stage, index) = (tag & 0xff, (tag >> 8) as usize);
    let what = STAGES.get(stage as usize).copied().unwrap_or("setup");
    let target = match stage {
        STAGE_HIDE => p.hides.get(index).map(|c| c.to_string_lossy().into_owned()),
        STAGE_BIND => p
            .binds
            .get(index)
            .map(|(_, t)| t.to_string_lossy().into_owned()),
        STAGE_DENY => p
            .denies
            .get(index)
            .map(|d| d.target.to_string_lossy().into_owned()),
        _ => None,
    };
    let target = target.map(|t| format!(" {t}")).unwrap_or_default();
    format!(
        "{what}{target} failed in the child: {}",
        Errno::from_raw(errno).desc()
    )
}

/// The started child: its listener is ours; it waits for `Child::go` before execve.
pub struct Child {
    /// The process the supervisor waits for: the target itself, or the jail's init.
    pub pid: i32,
    pub display: String,
    pub listener: OwnedFd,
    /// Where the exec result arrives: an errno message, or EOF once execve succeeded.
    pub(super) status_rx: OwnedFd,
    pub(super) go_tx: Option<OwnedFd>,
    /// Where the jail's init writes the proc's exit status once nothing of it is left, before
    /// its own exit tears down the namespaces (see jail::init).
    pub ended_rx: Option<OwnedFd>,
    /// The jail's cgroup, removed when dropped (keep it until the run ends).
    pub cgroup: Option<jail::limits::Cgroup>,
    /// The lock that keeps the proc's host id its own (keep it until the run ends).
    pub host_lock: Option<std::sync::Arc<jail::hostid::Lock>>,
    /// `pid` is the init of the proc's pid namespace (else the target, with no jail).
    pub jailed: bool,
    /// A warm proc's pidfd: not our child nor in the terminal's foreground group, so every
    /// signal we are to pass on (a terminal's ^C too) goes to it by this.
    pub warm: Option<OwnedFd>,
}

impl Child {
    /// Let the child execve. Whatever it does from then on that is notified waits in the kernel
    /// until the notification thread reads it, so the supervisor releases the child first and
    /// starts its threads while the program loads.
    pub fn release(&mut self) {
        if let Some(go) = self.go_tx.take() {
            jail::mark("go");
            let _ = nix::unistd::write(&go, b"g");
        }
    }

    /// Wait until the child has exec'd (released first if it was not); the exec failure
    /// (errno) if there was one.
    pub fn exec_result(mut self) -> Result<(), i32> {
        self.release();
        match recv_msg(&self.status_rx) {
            Some((STAGE_EXEC, errno)) => Err(errno),
            _ => Ok(()),
        }
    }
}

/// Bind `src` at `target` read-only, nosuid, nodev (child-safe: two system calls).
pub(super) fn bind_read_only(src: &CStr, target: &CStr) -> nix::Result<()> {
    jail::world::bind_read_only(src, target, MsFlags::empty())
}

/// Pin the calling process to `cpu` (the notification thread gets the same one).
pub(super) fn pin_to(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

fn child_main(p: &Prepared, status_tx: &OwnedFd, go_rx: &OwnedFd, old_mask: &SigSet) -> ! {
    let _ = old_mask.thread_set_mask();
    sys::default_disposition(Signal::SIGPIPE);
    let _ = sys::set_parent_death_kill();
    let fail = |stage: u32, e: Errno| -> ! {
        send(status_tx, stage, e as i32);
        sys::exit_now(125)
    };
    // A mount namespace only when there is something to hide or over-mount (its setup and
    // teardown cost a little on every run).
    if !p.hides.is_empty() || !p.denies.is_empty() || !p.binds.is_empty() {
        if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
            fail(STAGE_UNSHARE, e)
        }
        if let Err(e) = mount(
            None::<&CStr>,
            c"/",
            None::<&CStr>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&CStr>,
        ) {
            fail(STAGE_PRIVATE, e)
        }
    }
    for (i, (src, target)) in p.binds.iter().enumerate() {
        if let Err(e) = bind_read_only(src, target) {
            fail(stage_tag(STAGE_BIND, i), e)
        }
    }
    for (i, dir) in p.hides.iter().enumerate() {
        if let Err(e) = mount(
            Some(c"tmpfs"),
            dir.as_c_str(),
            Some(c"tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(c"mode=0555,size=4k"),
        ) {
            fail(stage_tag(STAGE_HIDE, i), e)
        }
    }
    if let Some(scratch) = &p.scratch {
        for (i, d) in p.denies.iter().enumerate() {
            let src = if d.is_dir {
                scratch.subdir.as_c_str()
            } else {
                scratch.file.as_c_str()
            };
            if let Err(e) = bind_read_only(src, &d.target) {
                fail(stage_tag(STAGE_DENY, i), e)
            }
        }
    }
    if let Some(cpu) = p.pin_cpu {
        if let Err(e) = pin_to(cpu) {
            fail(STAGE_AFFINITY, e)
        }
    }
    // From here on the filter applies: only read/write/close (allowed by every profile) until
    // execve. Where a path rule has execve notified, the parent's notification thread is
    // running before the parent waits for the exec (see supervisor::supervise).
    let listener = match p.filter.install() {
        Ok(fd) => fd,
        Err(e) => fail(STAGE_FILTER, e),
    };
    send(status_tx, MSG_LISTENER, listener.as_raw_fd());
    let mut b = [0u8; 1];
    match nix::unistd::read(go_rx, &mut b) {
        Ok(1) => {}
        Ok(_) => sys::exit_now(125),
        Err(e) => fail(STAGE_HANDOFF, e),
    }
    drop(listener);
    // Nothing of the supervisor's caller but stdio and what was asked for.
    jail::cloexec_fds_from_except(3, &p.kept);
    let e = sys::execve(&p.path, &p.argv_ptrs, &p.envp_ptrs);
    send(status_tx, STAGE_EXEC, e as i32);
    sys::exit_now(if e == Errno::ENOENT { 127 } else { 126 })
}

/// Fork the child, let it set itself up, and take its listener. Must run while this process has
/// one thread.
pub fn spawn_bare(p: Prepared) -> Result<Child, Failure> {
    sys::set_child_subreaper().context("PR_SET_CHILD_SUBREAPER")?;
    sys::default_disposition(Signal::SIGCHLD);
    let old_mask = handled_signals()
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .context("blocking signals")?;
    let (status_rx, status_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let pid = sys::fork().context("fork")?;
    if pid == 0 {
        drop(status_rx);
        drop(go_tx);
        child_main(&p, &status_tx, &go_rx, &old_mask)
    }
    drop(status_tx);
    drop(go_rx);
    let setup_failed = |msg: String| -> Failure {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        anyhow!("cannot start {}: {msg}", p.display).into()
    };
    let fd = match recv_msg(&status_rx) {
        Some((MSG_LISTENER, fd)) => fd,
        Some((tag, errno)) => return Err(setup_failed(describe_stage(&p, tag, errno))),
        None => return Err(setup_failed("the child exited during setup".into())),
    };
    let pidfd = sys::pidfd_open(pid, 0).context("pidfd_open")?;
    let listener = sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(|e| {
        setup_failed(format!(
            "taking the seccomp listener (pidfd_getfd): {}",
            e.desc()
        ))
    })?;
    Ok(Child {
        pid,
        display: p.display.clone(),
        listener,
        status_rx,
        go_tx: Some(go_tx),
        ended_rx: None,
        cgroup: None,
        host_lock: None,
        jailed: false,
        warm: None,
    })
    // `p` (with the scratch bind sources) drops here: the child's mounts are made (the listener
    // only comes after them) and keep the inodes alive.
}
