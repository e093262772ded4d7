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
//! - [`NotifyError`] (`error.rs`): the crate's error, a leaf that imports no other module.
//!
//! Threads: [`Listener`] is `Send + Sync`; one thread may block in [`Listener::recv`] while
//! others answer, read memory or inject fds. End of run: once every target has exited and been
//! reaped, [`Listener::recv_or_hup`] returns `Ok(None)` (the fd polls POLLHUP).
//! Unsafe code lives in `filter`, `listener`, `probe` and `sys` (readlinkat/statx into
//! caller buffers) only; `mem`, `path` and `error` forbid it.

mod error;
pub mod filter;
pub mod listener;
pub mod mem;
pub mod path;
pub mod probe;
mod sys;

/// The pidfd calls, for the supervisor's own use of them (signals, the listener's hand-over).
pub use sys::{pidfd_getfd, pidfd_open, PIDFD_THREAD};

pub use error::NotifyError;
pub use filter::{Action, ArgCmp, CmpOp, CompiledFilter, FilterSpec, SyscallRule};
pub use listener::{Listener, Notification, Response};
pub use mem::TargetMem;
