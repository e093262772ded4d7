//! Filter description (data) and its compilation/installation.
use crate::NotifyError;
use std::os::fd::OwnedFd;

/// What the kernel does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    /// SECCOMP_RET_USER_NOTIF: the supervisor decides.
    Notify,
    Errno(i32),
    KillProcess,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    /// `(arg & mask) == value`
    MaskedEq(u64),
}

/// A condition on one syscall argument (all conditions of a rule must hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCmp {
    pub arg: u32,
    pub op: CmpOp,
    pub value: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallRule {
    /// Syscall name as libseccomp knows it (e.g. `openat`).
    pub name: String,
    pub action: Action,
    pub when: Vec<ArgCmp>,
}

/// The whole filter: a default action and per-syscall rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterSpec {
    pub default: Action,
    pub rules: Vec<SyscallRule>,
}

/// A BPF program ready to install; built in the parent so the child does no allocation.
pub struct CompiledFilter {
    _private: (),
}

impl FilterSpec {
    /// Validate names and build the BPF program (libseccomp export).
    pub fn compile(&self) -> Result<CompiledFilter, NotifyError> {
        todo!()
    }
}

impl CompiledFilter {
    /// In the child, just before execve: no_new_privs, then seccomp(2) with NEW_LISTENER
    /// (+ WAIT_KILLABLE_RECV where supported). Async-signal-safe: no allocation.
    pub fn install(&self) -> Result<OwnedFd, nix::Error> {
        todo!()
    }
}
