//! The listener fd: receive, respond, inject fds, check ids.
use crate::NotifyError;
use std::os::fd::{BorrowedFd, OwnedFd};

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

pub struct Listener {
    _fd: OwnedFd,
}

impl Listener {
    pub fn from_fd(fd: OwnedFd) -> Self {
        Listener { _fd: fd }
    }
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        todo!()
    }
    /// SECCOMP_IOCTL_NOTIF_SET_FLAGS(SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP).
    pub fn set_sync_wakeup(&self) -> Result<(), NotifyError> {
        todo!()
    }
    /// Blocks until a notification arrives (retries EINTR and ENOENT).
    pub fn recv(&self) -> Result<Notification, NotifyError> {
        todo!()
    }
    /// ENOENT (the target died or was interrupted) is reported as `NotifyError::Gone`.
    pub fn respond(&self, id: u64, resp: Response) -> Result<(), NotifyError> {
        todo!()
    }
    pub fn id_valid(&self, id: u64) -> bool {
        todo!()
    }
    /// NOTIF_ADDFD with SECCOMP_ADDFD_FLAG_SEND: installs `fd` in the target and answers the
    /// notification with the new fd number in one step.
    pub fn addfd_send(&self, id: u64, fd: BorrowedFd<'_>, cloexec: bool) -> Result<i32, NotifyError> {
        todo!()
    }
}
