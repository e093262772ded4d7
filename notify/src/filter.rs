//! Filter description (data) and its compilation/installation.
//!
//! [`FilterSpec::compile`] runs in the parent: it builds a libseccomp filter context, exports
//! the BPF program and keeps the raw `sock_filter` array. [`CompiledFilter::install`] runs in
//! the forked child just before `execve` and calls `seccomp(2)` itself (libseccomp 2.5.4 cannot
//! ask for `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV`).
//!
//! Architecture: the filter is built for the native architecture (x86_64) only. Its bad-arch
//! action is `KillProcess`: a call made through a foreign ABI (i386 `int 0x80`, x32 syscall
//! numbers with bit 30 set) kills the whole process instead of bypassing the rules.
use crate::error::NotifyError;
use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use nix::errno::Errno;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};

/// `SECCOMP_FILTER_FLAG_NEW_LISTENER` (linux/seccomp.h).
pub const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (linux/seccomp.h, Linux 5.19).
pub const SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV: libc::c_ulong = 1 << 5;
/// The kernel's limit on the length of one classic BPF program.
pub const BPF_MAXINSNS: usize = 4096;

/// What the kernel does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    /// SECCOMP_RET_USER_NOTIF: the supervisor decides.
    Notify,
    Errno(i32),
    KillProcess,
}

impl Action {
    fn to_scmp(self) -> ScmpAction {
        match self {
            Action::Allow => ScmpAction::Allow,
            Action::Notify => ScmpAction::Notify,
            Action::Errno(e) => ScmpAction::Errno(e),
            Action::KillProcess => ScmpAction::KillProcess,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    /// `(arg & mask) == value`
    MaskedEq(u64),
}

/// A condition on one syscall argument (all conditions of a rule must hold).
///
/// Comparisons are on the full 64-bit register value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArgCmp {
    pub arg: u32,
    pub op: CmpOp,
    pub value: u64,
}

impl ArgCmp {
    fn to_scmp(self) -> ScmpArgCompare {
        let op = match self.op {
            CmpOp::Eq => ScmpCompareOp::Equal,
            CmpOp::Ne => ScmpCompareOp::NotEqual,
            CmpOp::MaskedEq(mask) => ScmpCompareOp::MaskedEqual(mask),
        };
        ScmpArgCompare::new(self.arg, op, self.value)
    }
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
#[derive(Clone)]
pub struct CompiledFilter {
    prog: Vec<libc::sock_filter>,
}

impl std::fmt::Debug for CompiledFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledFilter")
            .field("instructions", &self.prog.len())
            .finish()
    }
}

fn build_err(context: impl Into<String>, e: libseccomp::error::SeccompError) -> NotifyError {
    NotifyError::Build {
        context: context.into(),
        source: Some(Box::new(e)),
    }
}

/// Resolve a syscall name on the native architecture; names that do not exist there (or at
/// all) are [`NotifyError::UnknownSyscall`].
pub fn syscall_number(name: &str) -> Result<i32, NotifyError> {
    let unknown = || NotifyError::UnknownSyscall {
        name: name.to_owned(),
    };
    if name.is_empty() || name.contains('\0') {
        return Err(unknown());
    }
    let sys = ScmpSyscall::from_name(name).map_err(|_| unknown())?;
    let nr = i32::from(sys);
    // libseccomp returns negative pseudo numbers for calls that exist only on other
    // architectures (e.g. `socketcall` on x86_64): a rule for them would be a silent no-op.
    if nr < 0 {
        return Err(unknown());
    }
    Ok(nr)
}

impl FilterSpec {
    /// Whether the program allows `name` outright: no condition, no notification, whatever
    /// the arguments.
    pub fn allows_outright(&self, name: &str) -> bool {
        let mut rules = self.rules.iter().filter(|r| r.name == name).peekable();
        if rules.peek().is_none() {
            return self.default == Action::Allow;
        }
        rules.all(|r| r.action == Action::Allow && r.when.is_empty())
    }

    /// Whether no call of `name` runs without the supervisor hearing of it: every rule for it
    /// notifies or refuses, and so does the default, unless an unconditional rule stands in
    /// for it.
    pub fn never_silent(&self, name: &str) -> bool {
        let rules = || self.rules.iter().filter(|r| r.name == name);
        rules().all(|r| r.action != Action::Allow)
            && (rules().any(|r| r.when.is_empty()) || self.default != Action::Allow)
    }

    /// The filter of a process that forks procs which stack this spec's own filter (a pool's
    /// zygote): nothing notified (with stacked filters a notification would reach the
    /// zygote's listener, not the proc's: the kernel takes the newest filter's answer only
    /// among equal actions), every notified call allowed (the kernel's own checks decide it,
    /// as its view is the proc's), and `extra` allowed whatever the arguments. Each proc's own
    /// filter refuses `extra` again.
    pub fn for_forking(&self, extra: &[&str]) -> FilterSpec {
        let allow = |a: Action| {
            if a == Action::Notify {
                Action::Allow
            } else {
                a
            }
        };
        let mut rules: Vec<SyscallRule> = self
            .rules
            .iter()
            .filter(|r| !extra.contains(&r.name.as_str()))
            .map(|r| SyscallRule {
                action: allow(r.action),
                ..r.clone()
            })
            .collect();
        rules.extend(extra.iter().map(|n| SyscallRule {
            name: (*n).to_owned(),
            action: Action::Allow,
            when: Vec::new(),
        }));
        FilterSpec {
            default: allow(self.default),
            rules,
        }
    }

    /// Validate names and build the BPF program (libseccomp export).
    ///
    /// A rule whose action equals the default action is redundant and skipped (libseccomp
    /// refuses such rules). Two conditions on the same argument in one rule are refused by
    /// libseccomp and reported as [`NotifyError::Build`].
    pub fn compile(&self) -> Result<CompiledFilter, NotifyError> {
        let mut ctx = ScmpFilterContext::new(self.default.to_scmp())
            .map_err(|e| build_err("creating the filter context", e))?;
        ctx.set_act_badarch(ScmpAction::KillProcess)
            .map_err(|e| build_err("setting the bad-arch action", e))?;
        // A binary tree over syscall numbers instead of a linear chain: on load the kernel runs
        // the program once per syscall number to build its always-allow cache, so the chain
        // made installing the filter cost ~260 µs (335 instructions) against ~90 µs, and every
        // call decided by the program walks log n comparisons instead of n. Older libseccomp
        // (< 2.5) lacks the attribute and keeps the chain.
        let _ = ctx.set_ctl_optimize(2);
        for rule in &self.rules {
            let nr = syscall_number(&rule.name)?;
            if rule.action == self.default {
                continue;
            }
            let cmps: Vec<ScmpArgCompare> = rule.when.iter().map(|c| c.to_scmp()).collect();
            if let Some(bad) = rule.when.iter().find(|c| c.arg > 5) {
                return Err(NotifyError::Build {
                    context: format!("rule for `{}`: argument index {} > 5", rule.name, bad.arg),
                    source: None,
                });
            }
            ctx.add_rule_conditional(rule.action.to_scmp(), ScmpSyscall::from(nr), &cmps)
                .map_err(|e| build_err(format!("adding the rule for `{}`", rule.name), e))?;
        }
        export(&ctx)
    }
}

/// The BPF program of a libseccomp filter context, exported through a memfd (libseccomp 2.5
/// has no in-memory export).
pub fn export(ctx: &ScmpFilterContext) -> Result<CompiledFilter, NotifyError> {
    let io_err = |context: &str, e: std::io::Error| NotifyError::Build {
        context: context.to_owned(),
        source: Some(Box::new(e)),
    };
    let fd =
        nix::sys::memfd::memfd_create(c"sigma-seccomp-bpf", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(|e| io_err("memfd_create for the BPF export", e.into()))?;
    let mut file = std::fs::File::from(fd);
    ctx.export_bpf(&file)
        .map_err(|e| build_err("exporting the BPF program", e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| io_err("rewinding the BPF export", e))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| io_err("reading the BPF export", e))?;
    CompiledFilter::from_bytes(&bytes)
}

impl CompiledFilter {
    /// Parse a raw classic-BPF program (native-endian `struct sock_filter` array).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, NotifyError> {
        const INSN: usize = std::mem::size_of::<libc::sock_filter>();
        if bytes.is_empty() || !bytes.len().is_multiple_of(INSN) {
            return Err(NotifyError::Build {
                context: format!(
                    "BPF program of {} bytes is not a whole number of instructions",
                    bytes.len()
                ),
                source: None,
            });
        }
        let prog: Vec<libc::sock_filter> = bytes
            .chunks_exact(INSN)
            .map(|c| libc::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        if prog.len() > BPF_MAXINSNS {
            return Err(NotifyError::Build {
                context: format!(
                    "BPF program has {} instructions, the kernel allows {BPF_MAXINSNS}",
                    prog.len()
                ),
                source: None,
            });
        }
        Ok(CompiledFilter { prog })
    }

    /// The program as installed.
    pub fn instructions(&self) -> &[libc::sock_filter] {
        &self.prog
    }

    /// The program as native-endian bytes (what `seccomp_export_bpf` writes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prog.len() * 8);
        for i in &self.prog {
            out.extend_from_slice(&i.code.to_ne_bytes());
            out.push(i.jt);
            out.push(i.jf);
            out.extend_from_slice(&i.k.to_ne_bytes());
        }
        out
    }

    /// In the child, just before execve: no_new_privs, then seccomp(2) with NEW_LISTENER
    /// (+ WAIT_KILLABLE_RECV where supported). Async-signal-safe: no allocation.
    ///
    /// No TSYNC: the filter applies to the calling thread (the child is single-threaded after
    /// fork). Returns the listener fd (close-on-exec, as the kernel creates it).
    pub fn install(&self) -> Result<OwnedFd, nix::Error> {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes only integer arguments and touches no
        // memory of ours.
        let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            return Err(Errno::last());
        }
        let prog = libc::sock_fprog {
            // compile/from_bytes guarantee 1..=BPF_MAXINSNS instructions, so this fits in u16.
            len: self.prog.len() as libc::c_ushort,
            filter: self.prog.as_ptr().cast_mut(),
        };
        let mut flags = SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
        loop {
            // SAFETY: `prog` lives on our stack for the duration of the call and points at
            // `self.prog`, a live Vec of `len` sock_filter entries; the kernel only reads
            // (copies) it.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
                    flags,
                    &prog as *const libc::sock_fprog,
                )
            };
            if r >= 0 {
                // SAFETY: with NEW_LISTENER a successful seccomp(2) returns a fresh fd that
                // nothing else owns.
                return Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) });
            }
            let e = Errno::last();
            if e == Errno::EINVAL && flags & SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV != 0 {
                // Kernel older than 5.19: no WAIT_KILLABLE_RECV.
                flags &= !SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
                continue;
            }
            return Err(e);
        }
    }

    /// Install the program as one more filter of the calling thread, without a listener (a
    /// filter that never notifies, e.g. the jail's guard). no_new_privs (or CAP_SYS_ADMIN) must
    /// already be in place. Async-signal-safe: no allocation.
    pub fn install_stacked(&self) -> Result<(), nix::Error> {
        let prog = libc::sock_fprog {
            // compile/from_bytes guarantee 1..=BPF_MAXINSNS instructions, so this fits in u16.
            len: self.prog.len() as libc::c_ushort,
            filter: self.prog.as_ptr().cast_mut(),
        };
        // SAFETY: `prog` lives on our stack for the duration of the call and points at
        // `self.prog`, a live Vec of `len` sock_filter entries; the kernel only reads (copies) it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
                0 as libc::c_ulong,
                &prog as *const libc::sock_fprog,
            )
        };
        if r < 0 {
            return Err(Errno::last());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, action: Action, when: Vec<ArgCmp>) -> SyscallRule {
        SyscallRule {
            name: name.into(),
            action,
            when,
        }
    }

    #[test]
    fn allows_outright_only_without_conditions_or_notification() {
        let cond = ArgCmp {
            arg: 0,
            op: CmpOp::Eq,
            value: 3,
        };
        let spec = |default, rules| FilterSpec { default, rules };
        // No rule of its own: the default decides.
        assert!(spec(Action::Allow, vec![]).allows_outright("sendmsg"));
        assert!(!spec(Action::Errno(1), vec![]).allows_outright("sendmsg"));
        let allow = rule("sendmsg", Action::Allow, vec![]);
        assert!(spec(Action::Errno(1), vec![allow.clone()]).allows_outright("sendmsg"));
        // Another call's rule says nothing about this one.
        assert!(
            !spec(Action::Errno(1), vec![rule("write", Action::Allow, vec![])])
                .allows_outright("sendmsg")
        );
        // Allowed only for some arguments, or notified: not outright.
        let some = rule("sendmsg", Action::Allow, vec![cond]);
        assert!(!spec(Action::Errno(1), vec![some]).allows_outright("sendmsg"));
        let notified = rule("sendmsg", Action::Notify, vec![]);
        assert!(!spec(Action::Allow, vec![notified]).allows_outright("sendmsg"));
        let mixed = vec![allow, rule("sendmsg", Action::Notify, vec![cond])];
        assert!(!spec(Action::Allow, mixed).allows_outright("sendmsg"));
    }
}
