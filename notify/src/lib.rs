//! The only crate that touches the seccomp user-notify API and the target's memory.
//!
//! Contract (signatures are relied upon by `policies` and `supervisor`; extend, do not break):
//! - [`filter`]: a [`FilterSpec`] (data) is compiled in the parent into a BPF program
//!   ([`CompiledFilter`]); the child installs it just before `execve` and gets the listener fd.
//! - [`Listener`]: receive notifications, answer them, inject fds, check ids.
//! - [`mem`]: read paths from / write bytes to the target's memory, re-checking the id
//!   (except for a path whose only use is the notification's answer).
//! - [`path`]: resolve dirfd/cwd-relative paths as the target sees them.
//! - [`probe`]: a forked target that makes notified calls on demand (benchmarks, tests).
//!
//! Threads: [`Listener`] is `Send + Sync`; one thread may block in [`Listener::recv`] while
//! others answer, read memory or inject fds. End of run: once every target has exited and been
//! reaped, [`Listener::recv_or_hup`] returns `Ok(None)` (the fd polls POLLHUP).
//! Unsafe code lives in `filter`, `listener`, `probe` and `sys` (readlinkat/statx into
//! caller buffers) only; `mem` and `path` forbid it.

pub mod filter;
pub mod listener;
pub mod mem;
pub mod path;
pub mod probe;
mod sys;

/// The pidfd calls, for the supervisor's own use of them (signals, the listener's hand-over).
pub use sys::{pidfd_getfd, pidfd_open, PIDFD_THREAD};

pub use filter::{Action, ArgCmp, CmpOp, CompiledFilter, FilterSpec, SyscallRule};
pub use listener::{Listener, Notification, Response};
pub use mem::TargetMem;

/// Errors at the crate boundary.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("unknown syscall name `{name}`")]
    UnknownSyscall { name: String },
    #[error("building the seccomp filter failed: {context}")]
    Build {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    #[error("seccomp ioctl {op} failed")]
    Ioctl {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
    /// The notification is no longer valid: the target died or the call was interrupted.
    #[error("notification {id} is no longer valid")]
    Gone { id: u64 },
    /// No task uses the filter any more (every target exited and was reaped): the listener
    /// fd reports POLLHUP and will never deliver another notification.
    #[error("no target uses the seccomp filter any more")]
    NoTargets,
    /// Taking a file descriptor from another process (pidfd_open/pidfd_getfd) failed.
    #[error("taking fd {fd} from pid {pid} failed")]
    TakeFd {
        pid: i32,
        fd: i32,
        #[source]
        source: nix::Error,
    },
}

impl NotifyError {
    /// True when the error only means "the target went away": callers treat it as normal.
    pub fn is_gone(&self) -> bool {
        matches!(self, NotifyError::Gone { .. } | NotifyError::NoTargets)
    }
}
