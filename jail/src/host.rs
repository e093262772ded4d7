//! What this host gives the jail, found by the calls a run makes (`sigma-supervise doctor`
//! prints them): user namespaces ([`crate::userns_available`], which the spawn checks first),
//! the Landlock ABI ([`crate::landlock_abi`], which decides the second layer), the cgroup
//! hierarchy of `--memory`/`--cpus` ([`crate::limits`]), idmapped binds for a root supervisor
//! (the supervisor's own id-mapping namespace and `mount_setattr`), seccomp user-notify and
//! SYNC_WAKE_UP (a probe target's listener, the call the receive loop makes).
//!
//! Test hooks, read only by these probes: `SIGMA_SUPERVISE_TEST_NO_USERNS=1` and
//! `SIGMA_SUPERVISE_TEST_NO_LANDLOCK=1` make the host look like one without them, for the run
//! and for doctor alike.
#![forbid(unsafe_code)]

use std::path::Path;

/// One line of doctor's report: a feature, what a run uses for it, and what changes a fallback.
#[derive(Debug, Clone)]
pub struct Finding {
    pub feature: &'static str,
    /// Whether a run gets the feature itself (not a fallback).
    pub ok: bool,
    /// What a run uses, and why.
    pub uses: String,
    /// The flag, package or setting that changes a fallback.
    pub fix: Option<String>,
}

impl Finding {
    pub fn new(feature: &'static str, ok: bool, uses: impl Into<String>) -> Self {
        let uses = uses.into();
        Finding {
            feature,
            ok,
            uses,
            fix: None,
        }
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.ok { "ok  " } else { "note" };
        write!(f, "{mark} {}: {}", self.feature, self.uses)?;
        match &self.fix {
            Some(fix) => write!(f, " (to change: {fix})"),
            None => Ok(()),
        }
    }
}

/// The kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "?".into())
}

/// User namespaces for this user: without them no proc can be jailed.
pub fn userns() -> Finding {
    let who = if nix::unistd::geteuid().is_root() {
        "root"
    } else {
        "this user"
    };
    match crate::userns_available() {
        Ok(()) => match crate::userns_probe() {
            Ok(()) => Finding::new(
                "user namespaces",
                true,
                format!("available to {who}: every proc is jailed"),
            ),
            Err((call, errno)) => Finding::new(
                "user namespaces",
                false,
                format!(
                    "allowed by the sysctls but refused to {who} ({call}: {errno}): a proc \
                     cannot be jailed; runs fail"
                ),
            )
            .fix(
                "a security module or a seccomp filter around this process refuses them: \
                 on Ubuntu, sysctl kernel.apparmor_restrict_unprivileged_userns=0 or an \
                 AppArmor profile that allows userns for sigma-supervise",
            ),
        },
        Err(why) => Finding::new(
            "user namespaces",
            false,
            format!("unavailable to {who} ({why}): a proc cannot be jailed; runs fail"),
        )
        .fix(
            "sysctl user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1; \
             --no-jail runs unconfined by namespaces (debugging only)",
        ),
    }
}

/// The Landlock ABI: the jail's second layer, whole at ABI 6.
pub fn landlock() -> Finding {
    use nix::errno::Errno;
    let without = "the jail runs without its second layer (namespaces and seccomp only)";
    match crate::landlock_probe() {
        Err(Errno::ENOSYS) | Ok(0) => Finding::new(
            "Landlock",
            false,
            format!("not available on this kernel: {without}"),
        )
        .fix("a kernel with CONFIG_SECURITY_LANDLOCK and `landlock` in its lsm= list"),
        Err(Errno::EOPNOTSUPP) => Finding::new(
            "Landlock",
            false,
            format!("built into this kernel but not enabled at boot: {without}"),
        )
        .fix("`landlock` in the kernel's lsm= boot parameter"),
        Err(e) => Finding::new(
            "Landlock",
            false,
            format!(
                "refused here ({e}: a seccomp filter or security module this process runs \
                 under): {without}"
            ),
        )
        .fix("run doctor, and runs, outside the filter or container that refuses landlock_create_ruleset"),
        Ok(n) if n < 6 => Finding::new(
            "Landlock",
            false,
            format!(
                "ABI {n} (< 6): files confined; signals and abstract sockets scoped by the pid \
                 and network namespaces only"
            ),
        )
        .fix("Linux 6.12 or later (ABI 6)"),
        Ok(n) => Finding::new(
            "Landlock",
            true,
            format!("ABI {n}: files, signals and abstract sockets"),
        ),
    }
}

/// Where `--memory`/`--cpus` would put their group (`limits::hierarchy`).
pub fn cgroup() -> Finding {
    let of = |ctrl| crate::limits::hierarchy(ctrl);
    match (of("memory"), of("cpu")) {
        (Some((p, true)), Some(_)) => Finding::new(
            "cgroups",
            true,
            format!(
                "v2 at {} (memory and cpu delegated): --memory and --cpus apply",
                p.display()
            ),
        ),
        (Some((p, false)), Some(_)) => Finding::new(
            "cgroups",
            true,
            format!(
                "v1 controllers (memory at {}): --memory and --cpus apply",
                p.display()
            ),
        ),
        (m, c) => {
            let missing = [("memory", m.is_none()), ("cpu", c.is_none())]
                .iter()
                .filter(|x| x.1)
                .map(|x| x.0)
                .collect::<Vec<_>>()
                .join(" and ");
            Finding::new(
                "cgroups",
                false,
                format!(
                    "no writable hierarchy with {missing}: a run given --memory or --cpus fails; \
                     --pids falls back to RLIMIT_NPROC"
                ),
            )
            .fix("run as root, or under a delegated cgroup v2 subtree (systemd-run --user -p Delegate=yes)")
        }
    }
}

/// Idmapped binds, which a root supervisor makes of `dir` (the working directory, the
/// script's): the supervisor's id-mapping namespace and `mount_setattr(MOUNT_ATTR_IDMAP)`.
pub fn idmap(dir: &Path) -> Finding {
    if !nix::unistd::geteuid().is_root() {
        return Finding::new(
            "idmapped mounts",
            true,
            "not needed: the proc's ids map to this user's own",
        );
    }
    match crate::idmap::probe(dir) {
        Ok(()) => Finding::new(
            "idmapped mounts",
            true,
            format!(
                "{}: root's files there are shown as the proc's own",
                dir.display()
            ),
        ),
        Err(why) => Finding::new(
            "idmapped mounts",
            false,
            format!(
                "{} cannot be idmapped ({why}): shown plainly, root's files foreign to the proc",
                dir.display()
            ),
        )
        .fix("Linux 5.12 or later, a filesystem that supports idmapped mounts (ext4, xfs, btrfs, tmpfs 6.3+)"),
    }
}

/// Whether this process runs under a seccomp filter of its own (mode 2), as a proc does.
fn under_seccomp_filter() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.strip_prefix("Seccomp:").is_some_and(|v| v.trim() == "2"))
    })
}

/// Seccomp user-notify and SYNC_WAKE_UP, on a probe target's listener: the filter a proc
/// installs and the flag the receive loop sets ([`notify::Listener::set_sync_wakeup`]).
pub fn seccomp() -> Vec<Finding> {
    use notify::{Action, FilterSpec, SyscallRule};
    let filter = FilterSpec {
        default: Action::Allow,
        rules: vec![SyscallRule {
            name: "getppid".into(),
            action: Action::Notify,
            when: vec![],
        }],
    }
    .compile();
    let opts = notify::probe::ProbeOptions {
        close_results: true,
        ..Default::default()
    };
    let child = filter.and_then(|f| notify::probe::ProbeChild::spawn(&f, opts));
    let child = match child {
        Ok(c) => c,
        Err(e) if under_seccomp_filter() => {
            return vec![Finding::new(
                "seccomp user-notify",
                false,
                format!(
                    "unavailable here ({e}): this process already runs under a seccomp filter \
                     (Seccomp: 2 in /proc/self/status), which refuses what building one needs: \
                     nothing can be supervised"
                ),
            )
            .fix("run doctor, and runs, outside the filter or container that refuses seccomp")]
        }
        Err(e) => {
            return vec![Finding::new(
                "seccomp user-notify",
                false,
                format!("unavailable ({e}): nothing can be supervised"),
            )
            .fix("Linux 5.9 or later with CONFIG_SECCOMP_FILTER")]
        }
    };
    // One notified call answered as the open handler answers: a descriptor injected by
    // NOTIF_ADDFD with SECCOMP_ADDFD_FLAG_SEND.
    let injected = (|| -> Result<(), String> {
        child.start(1).map_err(|e| e.to_string())?;
        let n = child.listener().recv().map_err(|e| e.to_string())?;
        let null = std::fs::File::open("/dev/null").map_err(|e| e.to_string())?;
        let sent = child
            .listener()
            .addfd_send(n.id, std::os::fd::AsFd::as_fd(&null), true);
        sent.map(drop).map_err(|e| e.to_string())?;
        child.finish().map(drop).map_err(|e| e.to_string())
    })();
    let notify = match injected {
        Ok(()) => Finding::new(
            "seccomp user-notify",
            true,
            "a listener per proc; opens served by ADDFD with SECCOMP_ADDFD_FLAG_SEND",
        ),
        Err(e) => Finding::new(
            "seccomp user-notify",
            false,
            format!("ADDFD with SECCOMP_ADDFD_FLAG_SEND fails ({e}): served opens fail"),
        )
        .fix("Linux 5.14 or later"),
    };
    let wake = match child.listener().set_sync_wakeup() {
        Ok(()) => Finding::new(
            "SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP",
            true,
            "set: the target is woken on the answering thread's CPU",
        ),
        Err(e) => Finding::new(
            "SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP",
            false,
            format!("unsupported ({e}): each notification pays a cross-CPU wakeup"),
        )
        .fix("Linux 6.6 or later"),
    };
    vec![notify, wake]
}
