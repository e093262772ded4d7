//! The jail's own seccomp filter, stacked under whatever profile the proc runs with (the
//! kernel applies the most restrictive answer of all filters, and ERRNO outranks the profile's
//! user-notify). It refuses, by argument, what the jail's files and terminal must never allow,
//! whatever the profile:
//! - setuid/setgid mode bits (`chmod` family, `open`/`creat` with `O_CREAT` or `O_TMPFILE`,
//!   `mknod`): files the proc writes through an idmapped bind belong to the host user on disk,
//!   and a setuid file there would be a way out (even an empty one: a host process that later
//!   writes into it with `CAP_FSETID`, a root shell's `>` say, keeps the bit);
//! - `openat2` (its mode is in a struct a filter cannot read): ENOSYS, so libcs fall back;
//! - `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)`: pushing input into the terminal the proc shares
//!   with the user's shell;
//! - io_uring (`io_uring_setup`, `_enter`, `_register`): its operations (an open with a mode,
//!   say) never pass through seccomp, so no argument check above would see them;
//! - the kernel's keyrings (`keyctl`, `add_key`, `request_key`): the proc would possess the
//!   keys of the session it was started from (a user's Kerberos or ecryptfs keys).
use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};

const SUID: u64 = libc::S_ISUID as u64;
const SGID: u64 = libc::S_ISGID as u64;
const O_CREAT: u64 = libc::O_CREAT as u64;
/// `O_TMPFILE` whole (it includes `O_DIRECTORY`'s bit): its mode is the unnamed file's, which
/// `linkat` can then give a name.
const O_TMPFILE: u64 = libc::O_TMPFILE as u64;

/// A compiled guard, ready to load in the target.
#[derive(Debug, Clone)]
pub struct Guard {
    prog: notify::CompiledFilter,
}

/// Why the guard could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(transparent)]
    Seccomp(#[from] libseccomp::error::SeccompError),
    #[error(transparent)]
    Export(#[from] notify::NotifyError),
}

fn bit(arg: u32, b: u64) -> ScmpArgCompare {
    ScmpArgCompare::new(arg, ScmpCompareOp::MaskedEqual(b), b)
}

impl Guard {
    /// Build the filter (before fork).
    pub fn new() -> Result<Guard, GuardError> {
        let mut ctx = ScmpFilterContext::new(ScmpAction::Allow)?;
        // No no_new_privs from libseccomp: the jail sets it itself, before.
        ctx.set_ctl_nnp(false)?;
        // A binary tree over syscall numbers (see notify's FilterSpec::compile).
        let _ = ctx.set_ctl_optimize(2);
        let eperm = ScmpAction::Errno(libc::EPERM);
        let mut rule = |name: &str, action: ScmpAction, cmps: &[ScmpArgCompare]| {
            match ScmpSyscall::from_name(name) {
                Ok(sc) => ctx.add_rule_conditional(action, sc, cmps).map(drop),
                // A syscall this architecture lacks (e.g. `open` on arm64) needs no rule.
                Err(_) => Ok(()),
            }
        };
        for (name, mode_arg) in [("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("creat", 1)] {
            rule(name, eperm, &[bit(mode_arg, SUID)])?;
            rule(name, eperm, &[bit(mode_arg, SGID)])?;
        }
        for (name, flags_arg, mode_arg) in [("open", 1, 2), ("openat", 2, 3)] {
            for creates in [O_CREAT, O_TMPFILE] {
                rule(name, eperm, &[bit(flags_arg, creates), bit(mode_arg, SUID)])?;
                rule(name, eperm, &[bit(flags_arg, creates), bit(mode_arg, SGID)])?;
            }
        }
        for (name, mode_arg) in [("mknod", 1), ("mknodat", 2)] {
            rule(name, eperm, &[bit(mode_arg, SUID)])?;
            rule(name, eperm, &[bit(mode_arg, SGID)])?;
        }
        rule("openat2", ScmpAction::Errno(libc::ENOSYS), &[])?;
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "keyctl",
            "add_key",
            "request_key",
        ] {
            rule(name, eperm, &[])?;
        }
        for req in [libc::TIOCSTI, libc::TIOCLINUX] {
            // The request is an int: compare its low 32 bits.
            let cmp = ScmpArgCompare::new(
                1,
                ScmpCompareOp::MaskedEqual(0xffff_ffff),
                // c_ulong with glibc, c_int with musl.
                u64::from(req as u32),
            );
            rule("ioctl", eperm, &[cmp])?;
        }
        // fchmodat2 (Linux 6.6) may be unknown to this libseccomp: by number on x86_64.
        #[cfg(target_arch = "x86_64")]
        for b in [SUID, SGID] {
            ctx.add_rule_conditional(eperm, ScmpSyscall::from(452), &[bit(2, b)])?;
        }
        Ok(Guard {
            prog: notify::filter::export(&ctx)?,
        })
    }

    /// A guard built earlier (its program as [`Guard::program`] gave it).
    pub fn from_program(prog: notify::CompiledFilter) -> Guard {
        Guard { prog }
    }

    pub fn program(&self) -> &notify::CompiledFilter {
        &self.prog
    }

    /// Load it into the calling process (no_new_privs must already be set). No allocation.
    pub fn load(&self) -> nix::Result<()> {
        self.prog.install_stacked()
    }
}
