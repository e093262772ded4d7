//! Benchmarks for sigma-supervise (criterion, `cargo bench -p sigma-benches`).
//!
//! - `notify_roundtrip`: one notified syscall round trip (target `getppid` → supervisor recv →
//!   answer → target resumes), answered with CONTINUE, an errno, or NOTIF_ADDFD+SEND, each with
//!   and without SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP, plus a bare `getppid` baseline.
#![forbid(unsafe_code)]

use notify::{Action, CompiledFilter, FilterSpec, SyscallRule};

/// Allow everything, notify `getppid` (the probe's trigger call).
pub fn getppid_notify_filter() -> CompiledFilter {
    FilterSpec {
        default: Action::Allow,
        rules: vec![SyscallRule {
            name: "getppid".into(),
            action: Action::Notify,
            when: vec![],
        }],
    }
    .compile()
    .expect("the getppid notify filter compiles")
}
