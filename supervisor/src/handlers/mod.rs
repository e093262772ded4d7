//! Syscall handlers. Each family module *declares* its syscalls' path arguments ([`spec::Spec`]) and
//! implements what the supervisor does when a path is served ([`spec::ServeFn`], one uniform
//! signature returning `Result<Reply, Errno>`). [`path_call`] is the one routine that reads the
//! paths from the target, resolves them, asks the policy and re-checks the notification id
//! before a serve; handlers never read target memory for paths themselves.
//!
//! ```text
//! supervisor (event loop) ─ Kind ─▶ path::path_call ── reads, resolves ──▶ policy::decide
//!        │                     │          │ Serve                           (Continue/Deny/Serve)
//!        │                     │          ▼
//!        │                     │    Spec.serve (open, stat, access, readlink, refuse)
//!        │                     ├──▶ socket::handle, signal::handle
//!        ▼                     ▼
//!   reply::answer ◀── Result<Reply, Errno>
//! ```
//!
//! Files: `spec.rs` (the declaration types), `table.rs` (every `Spec`), `path.rs` (the
//! shared routine), `context.rs` (what the handlers share with the loop), `dispatch.rs` (a
//! syscall number to its handler), `refuse.rs`, and one file per family.
#![forbid(unsafe_code)]

pub mod access;
mod context;
mod dispatch;
pub mod exec;
pub mod mkdir;
pub mod open;
mod path;
pub mod readlink;
mod refuse;
pub mod signal;
pub mod socket;
mod spec;
pub mod stat;
mod table;

pub use context::Context;
pub use dispatch::{handled, kinds, Kind};
pub use path::{path_call, CallInfo};
#[cfg(test)]
pub use table::SPECS;
