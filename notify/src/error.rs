//! The crate's error, a leaf every module uses and that imports none of them (lib.rs
//! re-exports it as `sigma_notify::NotifyError`).
#![forbid(unsafe_code)]

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
