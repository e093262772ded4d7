//! The σcontainer: the world one proc runs in.
//!
//! A [`JailSpec`] is one plain value describing that world — identity, the binds of its root,
//! network, limits — filled by the CLI (or a test). [`JailSpec::prepare`] turns it, before any
//! fork, into a [`Plan`]: every path a C string, every step decided. The forked processes then
//! only make system calls, in the order the kernel requires:
//!
//! ```text
//! supervisor ── clone(NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWCGROUP) ──▶ init (pid 1)
//!     writes uid_map/gid_map, moves init     │ forks the target (with limits, once moved
//!     into the limits' cgroup if any         │ into their cgroup), clones the bind sources
//!                                            │ (open_tree), takes the proc's ids once mapped,
//!                                            │ mounts a tmpfs root, attaches binds, /dev,
//!                                            │ /proc, /tmp, curated /etc, hides, pivot_root,
//!                                            │ joins the target's network namespace, "world
//!                                            │ ready", detaches the old root, `/` read-only,
//!                                            │ "final"
//!                                            └─ fork ──▶ target (pid 2)
//!                                                 meanwhile: new network namespace, loopback
//!                                                 up; once mapped: its ids, rlimits →
//!                                                 capabilities dropped (all five sets) →
//!                                                 no_new_privs; on "world ready": Landlock →
//!                                                 guard → seccomp → on "final": execve
//! ```
//!
//! The two halves run at once where there is a second CPU (a network namespace costs more than
//! the root's ~50 mount operations, and needs no id map); pivot_root moves the waiting target
//! into the new root with init, and the old root's detaching (an RCU grace period) overlaps the
//! target's shedding.
//!
//! `spec.rs` holds the [`JailSpec`] value and its parts ([`Bind`], [`GeneratedFile`], [`Net`],
//! [`Limits`]), `error.rs` the [`JailError`] of preparing it: leaves every step reads, importing
//! none of them. Then one file per step: `plan.rs` prepares the [`Plan`], [`view`] chooses what
//! the root shows, [`world`] builds the root (in init), [`shed`] drops privilege (in the
//! target), [`init`] is pid 1's loop (reap, forward signals, end the proc when its program
//! ends), [`limits`] the optional cgroup. For a supervisor started as pid 1 of a pid namespace
//! another made (σOS's trampoline): [`procfs`] mounts that namespace's own `/proc`, [`death`]
//! ends such an init by a fault's signal. Nothing here decides syscalls; that is the
//! supervisor's filter.
#![deny(unsafe_code)]

/// How pid 1 of a pid namespace ends by a fault's signal.
pub mod death;
/// What of the supervisor's environment a proc gets (its credentials are withheld).
pub mod env;
mod error;
pub mod guard;
pub mod host;
pub mod hostid;
mod idmap;
pub mod init;
pub mod limits;
mod plan;
/// Mounting a pid namespace's own /proc.
pub mod procfs;
pub mod shed;
/// Where a directory of the jail comes from (for the supervisor's read-only hints).
pub mod shown;
mod spec;
mod sys;
pub mod view;
pub mod warm;
pub mod world;

pub use error::JailError;
pub use idmap::send_idmapped;
pub use plan::{Plan, StageError, Step};
pub use spec::{Bind, GeneratedFile, JailSpec, Limits, Net};
pub use view::{CwdMode, ViewOptions};

use std::path::PathBuf;

/// The namespaces a jail clones into. The network namespace is not among them: the target
/// makes it while init builds the root ([`world::private_net`]), and init joins it.
pub fn clone_flags(_spec: &JailSpec) -> i32 {
    libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP
}

/// Fork into the jail's namespaces: returns 0 in the child (pid 1 of the new pid namespace, all
/// capabilities in the new user namespace, no id mapped yet), the child's pid in the parent.
///
/// Call only while the process is single-threaded (as before fork(2)): the child then only
/// runs this crate's set-up on data prepared before the call.
#[allow(unsafe_code)]
pub fn clone_into_namespaces(spec: &JailSpec) -> Result<i32, nix::errno::Errno> {
    // SAFETY: the caller guarantees the process is single-threaded (documented precondition);
    // the child continues on a copy of this stack as after fork.
    unsafe { sys::clone_fork(clone_flags(spec)) }
}

impl Plan {
    /// Map the proc's ids (from the parent, after [`clone_into_namespaces`]). `setgroups` is
    /// denied first, as an unprivileged parent must, and so the proc can never drop a group.
    pub fn write_id_maps(&self, pid: i32) -> Result<(), JailError> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| JailError::Io { what, source }
        };
        let base = PathBuf::from(format!("/proc/{pid}"));
        std::fs::write(base.join("setgroups"), "deny").map_err(io("writing setgroups"))?;
        std::fs::write(base.join("uid_map"), &self.uid_map).map_err(io("writing uid_map"))?;
        std::fs::write(base.join("gid_map"), &self.gid_map).map_err(io("writing gid_map"))?;
        Ok(())
    }
}

/// Whether a test hook takes `what` away (`SIGMA_SUPERVISE_TEST_NO_<WHAT>=1`; see [`host`]).
fn test_hook(what: &str) -> bool {
    std::env::var_os(format!("SIGMA_SUPERVISE_TEST_NO_{what}")).is_some_and(|v| v == "1")
}

/// Whether user namespaces can be made here; the reason when not.
pub fn userns_available() -> Result<(), String> {
    if test_hook("USERNS") {
        return Err("SIGMA_SUPERVISE_TEST_NO_USERNS=1".into());
    }
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Err("user.max_user_namespaces is 0".into());
    }
    if nix::unistd::geteuid().as_raw() != 0
        && read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0")
    {
        return Err("kernel.unprivileged_userns_clone is 0".into());
    }
    Ok(())
}

/// Whether user and mount namespaces can be made and used here, tried for real: a child clones
/// into both and mounts a tmpfs, as init does first. A security module can refuse this where
/// the sysctls [`userns_available`] reads allow it (AppArmor's
/// `kernel.apparmor_restrict_unprivileged_userns`, a seccomp filter around the caller); the
/// run then fails at its first mount. Which call failed, and its errno, when it does.
#[allow(unsafe_code)]
pub fn userns_probe() -> Result<(), (&'static str, nix::errno::Errno)> {
    use nix::sys::wait::{waitpid, WaitStatus};
    // SAFETY: the child makes raw system calls only (mount(2) on static strings, _exit), so it
    // takes no lock and allocates nothing another thread of the parent could have held.
    let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) }
        .map_err(|e| ("clone(CLONE_NEWUSER|CLONE_NEWNS)", e))?;
    if pid == 0 {
        sys::exit_now(sys::probe_mounts());
    }
    match waitpid(nix::unistd::Pid::from_raw(pid), None) {
        Ok(WaitStatus::Exited(_, 0)) => Ok(()),
        Ok(WaitStatus::Exited(_, e)) => Err((
            "mount in the new namespaces",
            nix::errno::Errno::from_raw(e),
        )),
        Ok(_) => Err(("the probe child", nix::errno::Errno::ECHILD)),
        Err(e) => Err(("waitpid", e)),
    }
}

/// Close every descriptor from `first` up: init keeps none of the target's (a socket held open
/// by init would outlive the program).
pub fn close_fds_from(first: u32) {
    sys::close_from(first)
}

/// Close every fd from `first` up except `keep`.
pub fn close_fds_from_except(first: u32, keep: std::os::fd::BorrowedFd<'_>) {
    sys::close_from_except(first, std::os::fd::AsRawFd::as_raw_fd(&keep) as u32)
}

/// Mark every fd from `first` up close-on-exec except those in `keep` (sorted, deduplicated).
/// No allocation: safe between fork and exec.
pub fn cloexec_fds_from_except(first: u32, keep: &[u32]) {
    sys::close_range_except(first, keep, libc::CLOSE_RANGE_CLOEXEC)
}

/// The Landlock ABI version of this kernel (0 when Landlock is off, missing or refused). Signal
/// and abstract-socket scoping need 6.
pub fn landlock_abi() -> i64 {
    landlock_probe().unwrap_or(0)
}

/// The Landlock ABI version, or why there is none: ENOSYS (not built into this kernel),
/// EOPNOTSUPP (built, but not enabled at boot), anything else (the call refused: a seccomp
/// filter this process runs under, or another LSM).
pub fn landlock_probe() -> Result<i64, nix::errno::Errno> {
    if test_hook("LANDLOCK") {
        return Err(nix::errno::Errno::ENOSYS);
    }
    sys::landlock_abi()
}

/// A detached, read-only (nosuid, nodev), recursive clone of the mount tree at `dir`
/// (open_tree + mount_setattr): what is opened beneath it cannot be written through.
///
/// Both calls need CAP_SYS_ADMIN over the caller's mount namespace. An ordinary user has it
/// only in a namespace of its own: then a short-lived helper makes the clone in a new user and
/// mount namespace and hands the descriptor back (see `readonly_view_rootless`); the clone
/// outlives the helper, and opening through it works from any namespace.
pub fn readonly_tree(dir: &std::ffi::CStr) -> Result<std::os::fd::OwnedFd, nix::errno::Errno> {
    match readonly_here(dir) {
        Err(nix::errno::Errno::EPERM) if !nix::unistd::geteuid().is_root() => {
            readonly_view_rootless(dir)
        }
        r => r,
    }
}

fn readonly_here(dir: &std::ffi::CStr) -> Result<std::os::fd::OwnedFd, nix::errno::Errno> {
    use std::os::fd::AsFd;
    let fd = sys::clone_tree(dir)?;
    sys::set_tree_attrs(
        fd.as_fd(),
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )?;
    Ok(fd)
}

/// [`readonly_tree`] for an ordinary user. Call while single-threaded (it forks).
#[allow(unsafe_code)]
fn readonly_view_rootless(dir: &std::ffi::CStr) -> Result<std::os::fd::OwnedFd, nix::errno::Errno> {
    use nix::sys::socket::{
        recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
        SockFlag, SockType,
    };
    use std::os::fd::{AsRawFd, FromRawFd};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    // SAFETY: the caller is single-threaded (documented); the child only makes system calls on
    // `dir` and the socket, then exits.
    let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) }?;
    if pid == 0 {
        drop(ours);
        // Every capability in the new user namespace, which owns the new mount namespace:
        // enough for open_tree and mount_setattr, and no id mapping is needed for either.
        let (code, fd) = match readonly_here(dir) {
            Ok(fd) => (0i32, Some(fd)),
            Err(e) => (e as i32, None),
        };
        let raw: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let bytes = code.to_ne_bytes();
        let iov = [std::io::IoSlice::new(&bytes)];
        let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
        let _ = sendmsg::<()>(theirs.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None);
        sys::exit_now(0)
    }
    drop(theirs);
    let mut buf = [0u8; 4];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let got = {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map(|m| {
            let fds: Vec<i32> = m
                .cmsgs()
                .into_iter()
                .flatten()
                .filter_map(|c| match c {
                    ControlMessageOwned::ScmRights(f) => Some(f),
                    _ => None,
                })
                .flatten()
                .collect();
            (m.bytes, fds)
        })
    };
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    let (n, fds) = got?;
    // SAFETY: each fd was just received with SCM_RIGHTS: new descriptors nobody else owns.
    let mut owned: Vec<std::os::fd::OwnedFd> = fds
        .into_iter()
        .map(|f| unsafe { std::os::fd::OwnedFd::from_raw_fd(f) })
        .collect();
    if n != 4 {
        return Err(nix::errno::Errno::EIO);
    }
    match i32::from_ne_bytes(buf) {
        0 => owned.pop().ok_or(nix::errno::Errno::EIO),
        e => Err(nix::errno::Errno::from_raw(e)),
    }
}

/// Whether [`mark`] prints (for marks whose label costs something to build).
pub fn marking() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SIGMA_SUPERVISE_TIMELINE").is_some())
}

/// Start-up timeline for measurement: with `SIGMA_SUPERVISE_TIMELINE=1` in the environment,
/// each mark prints `timeline PID LABEL MICROS` (CLOCK_MONOTONIC) to stderr.
pub fn mark(label: &str) {
    if marking() {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(|t| t.tv_sec() * 1_000_000 + t.tv_nsec() / 1000)
            .unwrap_or(0);
        let line = format!("timeline {} {label} {t}\n", std::process::id());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
}
