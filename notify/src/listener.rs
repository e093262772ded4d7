//! The listener fd: receive, respond, inject fds, check ids.
//!
//! All methods take `&self` and issue one ioctl on the shared fd, so one [`Listener`] can be
//! used from several threads at once (one thread in [`Listener::recv`] while others respond).
//!
//! End of targets: when no task uses the filter any more (every target exited *and was
//! reaped* — the kernel drops a task's filter reference in `release_task`), the listener fd
//! polls POLLHUP and `NOTIF_RECV` fails with ENOENT instead of blocking. [`Listener::recv`]
//! reports that as [`NotifyError::NoTargets`]; [`Listener::recv_or_hup`] as `Ok(None)`.
//! The supervisor must therefore keep reaping its children (waitpid) to ever see the hang-up.
use crate::error::NotifyError;
use nix::errno::Errno;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// `SECCOMP_IOCTL_NOTIF_RECV` = `_IOWR('!', 0, struct seccomp_notif)`.
pub const SECCOMP_IOCTL_NOTIF_RECV: libc::c_ulong = 0xc0502100;
/// `SECCOMP_IOCTL_NOTIF_SEND` = `_IOWR('!', 1, struct seccomp_notif_resp)`.
pub const SECCOMP_IOCTL_NOTIF_SEND: libc::c_ulong = 0xc0182101;
/// `SECCOMP_IOCTL_NOTIF_ID_VALID` = `_IOW('!', 2, __u64)`.
pub const SECCOMP_IOCTL_NOTIF_ID_VALID: libc::c_ulong = 0x40082102;
/// `SECCOMP_IOCTL_NOTIF_ADDFD` = `_IOW('!', 3, struct seccomp_notif_addfd)`.
pub const SECCOMP_IOCTL_NOTIF_ADDFD: libc::c_ulong = 0x40182103;
/// `SECCOMP_IOCTL_NOTIF_SET_FLAGS` = `_IOW('!', 4, __u64)` (Linux 6.6); the argument is the
/// flag value itself, not a pointer.
pub const SECCOMP_IOCTL_NOTIF_SET_FLAGS: libc::c_ulong = 0x40082104;
/// `SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP` (Linux 6.6).
pub const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: libc::c_ulong = 1;
/// `SECCOMP_USER_NOTIF_FLAG_CONTINUE`.
pub const SECCOMP_USER_NOTIF_FLAG_CONTINUE: u32 = 1;
/// `SECCOMP_ADDFD_FLAG_SEND` (Linux 5.14).
pub const SECCOMP_ADDFD_FLAG_SEND: u32 = 1 << 1;

// The ioctl numbers encode the struct sizes: keep them honest.
const _: () = assert!(std::mem::size_of::<libc::seccomp_notif>() == 0x50);
const _: () = assert!(std::mem::size_of::<libc::seccomp_notif_resp>() == 0x18);
const _: () = assert!(std::mem::size_of::<libc::seccomp_notif_addfd>() == 0x18);

/// One notification as received.
#[derive(Debug, Clone, Copy)]
pub struct Notification {
    pub id: u64,
    pub pid: u32,
    /// Syscall number (native arch).
    pub syscall: i32,
    pub arch: u32,
    pub ip: u64,
    pub args: [u64; 6],
}

impl Notification {
    /// The syscall's name as libseccomp knows it (`None` for a number it does not know).
    pub fn syscall_name(&self) -> Option<String> {
        libseccomp::ScmpSyscall::from(self.syscall).get_name().ok()
    }
}

/// An answer to a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// Fail the call with this errno.
    Errno(i32),
    /// Return this value without running the call.
    Value(i64),
    /// Let the kernel run the call itself. DANGEROUS: the kernel re-reads target memory the
    /// target may have changed; never use this to grant access decided on a path.
    /// Construct only through [`Response::continue_unchecked`].
    Continue(ContinueToken),
}

/// Proof that the caller chose `Continue` knowingly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContinueToken(());

impl Response {
    /// Let the kernel perform the call. Only for calls whose access is enforced elsewhere.
    pub fn continue_unchecked() -> Self {
        Response::Continue(ContinueToken(()))
    }
}

/// The seccomp listener fd. `Send + Sync`: share it by reference or `Arc` between threads.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

fn ioctl_err(op: &'static str, source: Errno) -> NotifyError {
    NotifyError::Ioctl { op, source }
}

impl Listener {
    pub fn from_fd(fd: OwnedFd) -> Self {
        Listener { fd }
    }

    /// Take the listener fd `remote_fd` out of process `pid` (pidfd_open + pidfd_getfd; needs
    /// ptrace-attach rights over `pid`, which a root parent has). The copy is close-on-exec.
    pub fn take_from(pid: i32, remote_fd: RawFd) -> Result<Self, NotifyError> {
        let err = |source| NotifyError::TakeFd {
            pid,
            fd: remote_fd,
            source,
        };
        let pidfd = crate::sys::pidfd_open(pid, 0).map_err(err)?;
        let fd = crate::sys::pidfd_getfd(pidfd.as_fd(), remote_fd).map_err(err)?;
        Ok(Listener::from_fd(fd))
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// SECCOMP_IOCTL_NOTIF_SET_FLAGS(SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP).
    ///
    /// The target is then woken on the CPU of the supervisor thread answering it (and vice
    /// versa), which avoids the cross-CPU wake-up cost. Needs Linux 6.6; fails with the
    /// ioctl's EINVAL (or ENOTTY) on older kernels.
    pub fn set_sync_wakeup(&self) -> Result<(), NotifyError> {
        // SAFETY: SET_FLAGS takes the flag value itself as the argument (no pointer); the fd
        // is a live seccomp listener owned by self.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
                SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
            )
        };
        if r < 0 {
            return Err(ioctl_err("NOTIF_SET_FLAGS", Errno::last()));
        }
        Ok(())
    }

    /// One NOTIF_RECV ioctl, no retries.
    fn recv_once(&self) -> Result<Notification, Errno> {
        // Zeroed before every call: the kernel refuses a non-zero buffer (EINVAL).
        // SAFETY: seccomp_notif is plain integers, for which all-zero is a valid value.
        let mut raw: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is a live, writable seccomp_notif of the size encoded in the ioctl
        // number; the kernel writes at most that much.
        let r = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                SECCOMP_IOCTL_NOTIF_RECV as _,
                &mut raw as *mut libc::seccomp_notif,
            )
        };
        if r < 0 {
            return Err(Errno::last());
        }
        Ok(Notification {
            id: raw.id,
            pid: raw.pid,
            syscall: raw.data.nr,
            arch: raw.data.arch,
            ip: raw.data.instruction_pointer,
            args: raw.data.args,
        })
    }

    /// True when no task uses the filter any more (POLLHUP without POLLIN). Does not block.
    pub fn poll_hup(&self) -> Result<bool, NotifyError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: `pfd` is one live pollfd on our stack; timeout 0 so poll never blocks.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            if r < 0 {
                let e = Errno::last();
                if e == Errno::EINTR {
                    continue;
                }
                return Err(ioctl_err("poll", e));
            }
            return Ok(pfd.revents & libc::POLLHUP != 0 && pfd.revents & libc::POLLIN == 0);
        }
    }

    /// Blocks until a notification arrives (retries EINTR and ENOENT).
    ///
    /// ENOENT means the notifying target died between notify and recv; it is retried unless
    /// no task uses the filter any more, which is reported as [`NotifyError::NoTargets`].
    pub fn recv(&self) -> Result<Notification, NotifyError> {
        self.recv_or_hup()?.ok_or(NotifyError::NoTargets)
    }

    /// Like [`Listener::recv`], but returns `Ok(None)` once all targets are gone (exited and
    /// reaped): the supervisor's loop ends there.
    pub fn recv_or_hup(&self) -> Result<Option<Notification>, NotifyError> {
        loop {
            match self.recv_once() {
                Ok(n) => return Ok(Some(n)),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOENT) => {
                    if self.poll_hup()? {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(ioctl_err("NOTIF_RECV", e)),
            }
        }
    }

    /// ENOENT (the target died or was interrupted) is reported as `NotifyError::Gone`.
    pub fn respond(&self, id: u64, resp: Response) -> Result<(), NotifyError> {
        let mut raw = libc::seccomp_notif_resp {
            id,
            val: 0,
            error: 0,
            flags: 0,
        };
        match resp {
            Response::Errno(e) => raw.error = -e.abs(),
            Response::Value(v) => raw.val = v,
            Response::Continue(_) => raw.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE,
        }
        loop {
            // SAFETY: `raw` is a live seccomp_notif_resp of the size encoded in the ioctl
            // number; the kernel reads it (the _IOWR direction never writes back here).
            let r = unsafe {
                libc::ioctl(
                    self.fd.as_raw_fd(),
                    SECCOMP_IOCTL_NOTIF_SEND as _,
                    &mut raw as *mut libc::seccomp_notif_resp,
                )
            };
            if r >= 0 {
                return Ok(());
            }
            match Errno::last() {
                Errno::EINTR => continue,
                Errno::ENOENT => return Err(NotifyError::Gone { id }),
                e => return Err(ioctl_err("NOTIF_SEND", e)),
            }
        }
    }

    /// SECCOMP_IOCTL_NOTIF_ID_VALID: the target is still waiting for an answer to `id`.
    pub fn id_valid(&self, id: u64) -> bool {
        loop {
            // SAFETY: the kernel reads one u64 from the pointer, which points at `id` on our
            // stack.
            let r = unsafe {
                libc::ioctl(
                    self.fd.as_raw_fd(),
                    SECCOMP_IOCTL_NOTIF_ID_VALID as _,
                    &id as *const u64,
                )
            };
            if r == 0 {
                return true;
            }
            if Errno::last() != Errno::EINTR {
                return false;
            }
        }
    }

    /// NOTIF_ADDFD with SECCOMP_ADDFD_FLAG_SEND: installs `fd` in the target and answers the
    /// notification with the new fd number in one step.
    ///
    /// `cloexec` sets O_CLOEXEC on the target's copy. Returns the fd number in the target.
    pub fn addfd_send(
        &self,
        id: u64,
        fd: BorrowedFd<'_>,
        cloexec: bool,
    ) -> Result<i32, NotifyError> {
        let raw = libc::seccomp_notif_addfd {
            id,
            flags: SECCOMP_ADDFD_FLAG_SEND,
            srcfd: fd.as_raw_fd() as u32,
            newfd: 0,
            newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
        };
        loop {
            // SAFETY: `raw` is a live seccomp_notif_addfd of the size encoded in the ioctl
            // number, read by the kernel; `srcfd` is borrowed, so it stays open for the call.
            let r = unsafe {
                libc::ioctl(
                    self.fd.as_raw_fd(),
                    SECCOMP_IOCTL_NOTIF_ADDFD as _,
                    &raw as *const libc::seccomp_notif_addfd,
                )
            };
            if r >= 0 {
                return Ok(r);
            }
            match Errno::last() {
                // Interrupted before the target took the fd: the kernel withdrew the request.
                Errno::EINTR => continue,
                Errno::ENOENT => return Err(NotifyError::Gone { id }),
                e => return Err(ioctl_err("NOTIF_ADDFD", e)),
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
