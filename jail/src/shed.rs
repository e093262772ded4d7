//! Shedding privilege in the target, before the seccomp filter: in this order, each step fatal
//! if it fails: rlimits → securebits (no root magic, locked) → bounding set emptied → ambient
//! cleared → permitted/effective/inheritable cleared → no_new_privs → the jail's seccomp guard
//! ([`crate::guard`]) (all while init builds the root), then in the built root Landlock (second,
//! independent layer) → the working directory; the profile's filter comes after, in the caller.
use crate::plan::{Plan, StageError, SHED_BASE};
use crate::sys;
use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::errno::Errno;
use std::path::{Path, PathBuf};

fn stage(n: u32) -> impl Fn(Errno) -> StageError {
    move |e| StageError {
        step: SHED_BASE + n,
        detail: 0,
        errno: e as i32,
    }
}

// linux/securebits.h
const SECBIT_NOROOT: u64 = 1 << 0;
const SECBIT_NOROOT_LOCKED: u64 = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: u64 = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: u64 = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: u64 = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: u64 = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: u64 = 1 << 7;

/// What Landlock achieved, for the supervisor's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockOutcome {
    Full,
    Partial,
    Unsupported,
    Off,
}

/// Drop every privilege of the calling process (the future target). Returns what Landlock did.
pub fn shed(plan: &Plan) -> Result<LandlockOutcome, StageError> {
    drop_privileges(plan)?;
    confine(plan)
}

/// The steps of [`shed`] that need no root: rlimits, securebits, every capability set,
/// no_new_privs, the jail's seccomp guard. The target takes them while init is still
/// building the root.
pub fn drop_privileges(plan: &Plan) -> Result<(), StageError> {
    if let Some(n) = plan.spec.limits.pids {
        let lim = n as libc::rlim_t;
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, lim, lim)
            .map_err(stage(0))?;
    }
    sys::prctl(
        libc::PR_SET_SECUREBITS,
        SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
        0,
    )
    .map_err(stage(1))?;
    for cap in 0..64 {
        match sys::prctl(libc::PR_CAPBSET_DROP, cap, 0) {
            Ok(_) => {}
            Err(Errno::EINVAL) => break,
            Err(e) => return Err(stage(2)(e)),
        }
    }
    sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )
    .map_err(stage(3))?;
    sys::clear_capabilities().map_err(stage(4))?;
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0).map_err(stage(5))?;
    // The guard refuses nothing the rest of the start needs (Landlock's calls, chdir, seccomp).
    if let Some(g) = &plan.guard {
        g.load().map_err(stage(9))?;
    }
    Ok(())
}

/// The rest of [`shed`], in the finished root: Landlock on its paths, the working directory.
/// Returns what Landlock did.
pub fn confine(plan: &Plan) -> Result<LandlockOutcome, StageError> {
    let landlock = if plan.spec.landlock {
        landlock(plan).map_err(|_| stage(6)(Errno::EPERM))?
    } else {
        LandlockOutcome::Off
    };
    nix::unistd::chdir(plan.workdir.as_c_str()).map_err(stage(7))?;
    Ok(landlock)
}

/// Paths the proc may write (inside the jail): its rw binds, /tmp, /dev/shm, the devices.
fn writable(plan: &Plan) -> Vec<PathBuf> {
    let mut w: Vec<PathBuf> = ["/tmp", "/dev/shm", "/dev/pts"]
        .iter()
        .map(PathBuf::from)
        .collect();
    for (dst, (_, rw)) in plan.source_dsts.iter().zip(&plan.sources) {
        if *rw {
            w.push(dst.clone());
        }
    }
    w
}

/// Landlock: read and execute anywhere in the jail's root (which holds only its binds) and the
/// files handed over by descriptor ([`crate::JailSpec::fd_files`]), write only where the jail is
/// writable; signals and abstract unix sockets scoped to the proc.
fn landlock(plan: &Plan) -> Result<LandlockOutcome, landlock::RulesetError> {
    let abi = ABI::V6;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)?
        .create()?;
    if let Ok(fd) = PathFd::new(Path::new("/")) {
        rs = rs.add_rule(PathBeneath::new(fd, read))?;
    }
    for p in writable(plan) {
        if let Ok(fd) = PathFd::new(&p) {
            rs = rs.add_rule(PathBeneath::new(fd, all))?;
        }
    }
    // A file handed over by descriptor: reached through the proc's own /proc (the jail's).
    for n in &plan.spec.fd_files {
        if let Ok(fd) = PathFd::new(format!("/proc/self/fd/{n}")) {
            rs = rs.add_rule(PathBeneath::new(fd, AccessFs::Execute | AccessFs::ReadFile))?;
        }
    }
    let st = rs.restrict_self()?;
    Ok(match st.ruleset {
        RulesetStatus::FullyEnforced => LandlockOutcome::Full,
        RulesetStatus::PartiallyEnforced => LandlockOutcome::Partial,
        RulesetStatus::NotEnforced => LandlockOutcome::Unsupported,
    })
}
