//! Confinement of the helper processes that outlive runs and handle hostile input outside any
//! jail, as the supervisor's user: the realm's FUSE server ([`crate::fuse`]: everything it is
//! asked comes from procs) and fill processes ([`crate::fill`]: what they unpack comes from the
//! bucket). Once a helper has what it needs from the rest of the system (the server its mount
//! and its unmounter), it gives up what it never needs again, for itself and every thread it
//! starts after:
//! - Landlock: write only under the cache root (and the realm dir), read only what a fetch
//!   reads (the system's configuration and certificates, `/proc`, `/sys`, the user's AWS
//!   files, a `file://` bucket), execute nothing; no signal to, and no abstract unix socket
//!   of, a process outside it.
//! - seccomp: no exec, no ptrace or access to another process's memory, no new namespaces or
//!   mounts, no BPF, perf, kernel modules, keyrings or io_uring (each fails with EPERM).
//! - `no_new_privs`.
//!
//! Call it while the process has one thread: Landlock and seccomp bind the calling thread and
//! the threads it starts afterwards.
#![forbid(unsafe_code)]

use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::{Path, PathBuf};

/// A `file:///DIR` URL's directory.
pub fn file_url_dir(url: &str) -> Option<PathBuf> {
    url.strip_prefix("file://").map(PathBuf::from)
}

/// Calls no helper needs once confined.
const DENIED: &[&str] = &[
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "personality",
];

/// Namespace flags a `clone` may not carry (`clone3` is refused with ENOSYS: its flags sit
/// behind a pointer, and the C library falls back to `clone`).
const NEW_NAMESPACES: &[i32] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// How far the confinement went (for the server's log and the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landlocked {
    Full,
    Partial,
    /// The kernel has no Landlock: seccomp and `no_new_privs` only.
    Unsupported,
}

/// Confine this process (see the module docs). `writable`: directories it writes beneath;
/// `readable`: further paths it reads (missing ones are skipped).
pub fn confine(writable: &[&Path], readable: &[PathBuf]) -> anyhow::Result<Landlocked> {
    nix::sys::prctl::set_no_new_privs()?;
    let landlocked = landlock(writable, readable)?;
    seccomp()?;
    Ok(landlocked)
}

/// What a helper reads besides `readable`: the system's configuration and certificates, the
/// kernel's views, the devices (`/dev/null`), the user's AWS configuration and the files the
/// standard AWS and TLS variables name.
fn system_reads() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ["/etc", "/usr", "/lib", "/lib64", "/proc", "/sys", "/dev"]
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if let Some(home) = std::env::var_os("HOME") {
        paths.push(Path::new(&home).join(".aws"));
    }
    for var in [
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
        "AWS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    ] {
        if let Some(p) = std::env::var_os(var) {
            paths.push(PathBuf::from(p));
        }
    }
    paths
}

fn landlock(writable: &[&Path], readable: &[PathBuf]) -> anyhow::Result<Landlocked> {
    let abi = ABI::V6;
    let exec = AccessFs::Execute;
    let read = AccessFs::from_read(abi) & !exec;
    let write = AccessFs::from_all(abi) & !exec;
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)?
        .create()?;
    for p in system_reads().iter().chain(readable) {
        if let Ok(fd) = PathFd::new(p) {
            // A file (a certificate bundle, a credentials file) takes a file's rights only.
            let rights = if p.is_dir() {
                read
            } else {
                read & AccessFs::from_file(abi)
            };
            rs = rs.add_rule(PathBeneath::new(fd, rights))?;
        }
    }
    for p in writable {
        let fd = PathFd::new(p)?;
        rs = rs.add_rule(PathBeneath::new(fd, write))?;
    }
    Ok(match rs.restrict_self()?.ruleset {
        RulesetStatus::FullyEnforced => Landlocked::Full,
        RulesetStatus::PartiallyEnforced => Landlocked::Partial,
        RulesetStatus::NotEnforced => Landlocked::Unsupported,
    })
}

fn seccomp() -> anyhow::Result<()> {
    use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
    let eperm = ScmpAction::Errno(libc::EPERM);
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow)?;
    for name in DENIED {
        // A call this kernel's libseccomp does not know is not there to be made.
        if let Ok(nr) = ScmpSyscall::from_name(name) {
            ctx.add_rule(eperm, nr)?;
        }
    }
    ctx.add_rule(
        ScmpAction::Errno(libc::ENOSYS),
        ScmpSyscall::from_name("clone3")?,
    )?;
    let clone = ScmpSyscall::from_name("clone")?;
    for &flag in NEW_NAMESPACES {
        let flag = flag as u64;
        ctx.add_rule_conditional(
            eperm,
            clone,
            &[ScmpArgCompare::new(
                0,
                ScmpCompareOp::MaskedEqual(flag),
                flag,
            )],
        )?;
    }
    ctx.load()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Set in the copy of this test binary that confines itself (the directory it may write).
    const CHILD: &str = "SIGMA_SUPERVISE_CONFINE_TEST_DIR";
    const NAME: &str =
        "confine::tests::a_confined_process_writes_only_beneath_its_dirs_and_runs_nothing";

    #[test]
    fn a_confined_process_writes_only_beneath_its_dirs_and_runs_nothing() {
        if let Some(dir) = std::env::var_os(CHILD) {
            return child(Path::new(&dir));
        }
        // A directory of this test's (beneath /tmp, which a confined process may not read):
        // `w` writable, a secret beside it.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("w")).unwrap();
        std::fs::write(tmp.path().join("secret"), "s3cr3t\n").unwrap();
        // Alone on the main thread (Landlock and seccomp bind the calling thread).
        let o = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD, tmp.path())
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let landlocked = out.contains("landlock Full") || out.contains("landlock Partial");
        if !landlocked {
            eprintln!("SKIPPED (in part): this kernel has no Landlock: {out}");
        }
        for line in [
            "write inside: ok",
            "exec: refused",
            "new user namespace: refused",
            "read /etc/passwd: ok",
        ] {
            assert!(out.contains(line), "{line}: {out}");
        }
        if landlocked {
            for line in ["write outside: refused", "read secret: refused"] {
                assert!(out.contains(line), "{line}: {out}");
            }
            // The effect: nothing written beside the writable directory.
            assert!(!tmp.path().join("outside").exists());
        }
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("w/inside")).unwrap(),
            "in"
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("secret")).unwrap(),
            "s3cr3t\n"
        );
    }

    /// The confined side: each attempt and its outcome on stdout.
    fn child(dir: &Path) {
        let w = dir.join("w");
        let landlocked = confine(&[&w], &[]).unwrap();
        println!("landlock {landlocked:?}");
        let said = |what: &str, ok: bool| {
            println!("{what}: {}", if ok { "ok" } else { "refused" });
        };
        said(
            "write inside",
            std::fs::write(w.join("inside"), "in").is_ok(),
        );
        said(
            "write outside",
            std::fs::write(dir.join("outside"), "out").is_ok(),
        );
        let secret = std::fs::read(dir.join("secret"));
        said("read secret", secret.is_ok());
        said("read /etc/passwd", std::fs::read("/etc/passwd").is_ok());
        said("exec", Command::new("/bin/true").status().is_ok());
        said(
            "new user namespace",
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok(),
        );
    }
}
