//! The supervisor's view of a profile: `policies::Profile` plus the served directories opened
//! once on the host (indexed, so a decision carries no host path) and the denied paths that get
//! a kernel-enforced over-mount in the child.
#![forbid(unsafe_code)]

use crate::calls::{Handled, Writes, OPEN_WRITE_BITS};
use crate::serve::Served;
use anyhow::anyhow;
use policies::{PathAction, PathDecision, Profile};
use std::path::{Path, PathBuf};

pub struct Policy {
    profile: Profile,
    served: Vec<Served>,
    denied: Vec<PathBuf>,
    /// Whether the target runs in the σcontainer (its own PID namespace). Without one, the
    /// signalling calls the profile lets through are notified and confined to the proc's tree
    /// ([`crate::handlers::signal`]).
    jailed: bool,
    /// Whether writes are explained when the jail refuses them as read-only
    /// ([`crate::readonly`]): with elided path calls, the writing ones stay notified.
    read_only_hints: bool,
    /// [`Policy::root_is_fixed`] as the compiled-profile cache recorded it.
    root_fixed: Option<bool>,
    /// See [`Policy::cwd_changes_seen`].
    cwd_seen: bool,
    /// What the handlers serve (see [`crate::calls`]).
    handled: Handled,
}

/// A decision for one resolved path.
pub enum Decide {
    Continue,
    Deny(i32),
    /// `served()[index]`, at `rest` below its directory.
    Serve {
        index: usize,
        rest: PathBuf,
    },
}

/// The rules that notify an open only when its flags (argument `arg`) ask to write: allowed
/// when none of [`OPEN_WRITE_BITS`] is set, notified when any one is. The two
/// sets never overlap, so the order of the rules does not matter.
fn open_write_rules(name: &str, arg: u32) -> Vec<notify::SyscallRule> {
    let mask = OPEN_WRITE_BITS.iter().fold(0, |m, b| m | b);
    let rule = |action, mask, value| notify::SyscallRule {
        name: name.to_owned(),
        action,
        when: vec![notify::ArgCmp {
            arg,
            op: notify::CmpOp::MaskedEq(mask),
            value,
        }],
    };
    let mut rules = vec![rule(notify::Action::Allow, mask, 0)];
    rules.extend(
        OPEN_WRITE_BITS
            .iter()
            .map(|&b| rule(notify::Action::Notify, b, b)),
    );
    rules
}

impl Policy {
    /// Load profile `name` (builtin or file) with `--serve` rules. `audit` notifies refusals so
    /// each refused name is logged (otherwise the kernel refuses them without a notification).
    /// The result assumes a jail ([`Policy::set_jailed`] says otherwise).
    #[cfg(test)]
    pub fn load(name: &str, serves: &[String], audit: bool) -> anyhow::Result<Policy> {
        Policy::from_profile(
            policies::load(name)?,
            serves,
            audit,
            crate::handlers::handled(),
        )
    }

    /// `Policy::load` for a profile already parsed (e.g. from the compiled-profile cache);
    /// `handled` describes the calls the handlers serve.
    pub fn from_profile(
        mut profile: Profile,
        serves: &[String],
        audit: bool,
        handled: Handled,
    ) -> anyhow::Result<Policy> {
        if audit {
            profile.set_logs_denied(true);
        }
        for s in serves {
            profile.add_serve(s)?;
        }
        let mut served = Vec::new();
        let mut denied = Vec::new();
        for rule in profile.path_rules() {
            match &rule.action {
                PathAction::Serve(dir) => {
                    if dir == Path::new("/") {
                        return Err(anyhow!(
                            "serve {}: serving / would hide the whole filesystem",
                            rule.prefix.display()
                        ));
                    }
                    let s = Served::open(rule.prefix.clone(), dir.clone())
                        .map_err(|e| anyhow!("serve {}: {e}", rule.prefix.display()))?;
                    served.push(s);
                }
                PathAction::Deny(_) => denied.push(rule.prefix.clone()),
                PathAction::Continue => {}
            }
        }
        Ok(Policy {
            profile,
            served,
            denied,
            jailed: true,
            read_only_hints: false,
            root_fixed: None,
            cwd_seen: false,
            handled,
        })
    }

    /// Explain writes the jail refuses as read-only (`--trace`, `--stats`). Default: false.
    pub fn set_read_only_hints(&mut self, on: bool) {
        self.read_only_hints = on;
    }

    /// Whether the target gets its own PID namespace (the σcontainer). Default: true.
    pub fn set_jailed(&mut self, jailed: bool) {
        self.jailed = jailed;
    }

    pub fn jailed(&self) -> bool {
        self.jailed
    }

    /// The signalling calls the supervisor decides: without a jail, those the profile lets
    /// the kernel run unconditionally (a refused one stays refused).
    pub fn signal_calls(&self) -> Vec<&'static str> {
        if self.jailed {
            return Vec::new();
        }
        let spec = self.profile.filter_spec();
        self.handled
            .signals
            .iter()
            .copied()
            .filter(|name| {
                let rules: Vec<_> = spec.rules.iter().filter(|r| r.name == *name).collect();
                match rules.as_slice() {
                    [] => spec.default == notify::Action::Allow,
                    [r] => r.when.is_empty() && r.action == notify::Action::Allow,
                    _ => false,
                }
            })
            .collect()
    }

    /// Whether any path rule (deny, serve, continue) exists. Without one every path decision
    /// is `Continue`, so the loop need not read the path at all.
    pub fn has_path_rules(&self) -> bool {
        !self.profile.path_rules().is_empty()
    }

    /// The filter to install. With `elide_paths` (no path rule exists and nothing traces), every
    /// path decision is statically `Continue`, so the notified path calls are allowed in the
    /// kernel instead: the same outcome without a round trip per call. Unlisted syscalls keep the
    /// profile's default (still notified and logged when the profile logs them).
    ///
    /// With read-only hints, elision spares the calls that write: they stay notified, and
    /// open/openat only when their flags ask to write (a masked comparison per flag bit in the
    /// filter), so reads still never reach the supervisor. openat2's flags are in memory the
    /// filter cannot see: it is elided.
    pub fn filter_spec(&self, elide_paths: bool) -> notify::FilterSpec {
        let mut spec = self.profile.filter_spec();
        if elide_paths {
            let writes = |n: &str| self.handled.writes(n);
            // Open calls whose profile rule is one plain notify: notified by their flags.
            let mut by_flags: Vec<(String, u32)> = Vec::new();
            // A call whose handler checks its arguments (mknod: FIFOs and files only) stays
            // notified: the check is not a path decision.
            let notified: Vec<String> =
                self.profile
                    .notified_syscalls()
                    .into_iter()
                    .filter(|n| !self.handled.checked(n))
                    // Without a jail, abstract socket names need their decision (see socket.rs).
                    .filter(|n| self.jailed || !matches!(n.as_str(), "bind" | "connect"))
                    .filter(|n| {
                        if !self.read_only_hints {
                            return true;
                        }
                        match writes(n) {
                            Writes::No | Writes::OpenHow => true,
                            Writes::Open { flags } => {
                                let plain = spec.rules.iter().filter(|r| r.name == *n).all(|r| {
                                    r.action == notify::Action::Notify && r.when.is_empty()
                                });
                                match u32::try_from(flags) {
                                    Ok(arg) if plain => {
                                        by_flags.push((n.clone(), arg));
                                        true
                                    }
                                    // Conditions of the profile's own: no room for ours.
                                    _ => true,
                                }
                            }
                            _ => false,
                        }
                    })
                    .collect();
            spec.rules.retain(|r| !notified.contains(&r.name));
            spec.rules
                .extend(notified.into_iter().map(|name| notify::SyscallRule {
                    name,
                    action: notify::Action::Allow,
                    when: Vec::new(),
                }));
            for (name, arg) in by_flags {
                spec.rules.retain(|r| r.name != name);
                spec.rules.extend(open_write_rules(&name, arg));
            }
            if spec.default == notify::Action::Allow {
                spec.rules.retain(|r| r.action != notify::Action::Allow);
            }
        }
        for name in self.signal_calls() {
            spec.rules.retain(|r| r.name != name);
            if spec.default != notify::Action::Notify {
                spec.rules.push(notify::SyscallRule {
                    name: name.to_owned(),
                    action: notify::Action::Notify,
                    when: Vec::new(),
                });
            }
        }
        spec
    }

    /// Whether no target can change its root directory: with or without the path calls
    /// elided, the filter refuses chroot, pivot_root and setns outright (never notified, so
    /// never continued). Path resolution then reads the targets' root once.
    pub fn root_is_fixed(&self) -> bool {
        self.root_fixed.unwrap_or_else(|| self.root_fixed_by_spec())
    }

    /// Record [`Policy::root_is_fixed`] (kept with the compiled filter: deciding it builds the
    /// filter spec twice).
    pub fn set_root_fixed(&mut self, fixed: bool) {
        self.root_fixed = Some(fixed);
    }

    /// Whether the compiled filter lets no target change its cwd without a notification
    /// (recorded with the filter; false until then).
    pub fn cwd_changes_seen(&self) -> bool {
        self.cwd_seen
    }

    pub fn set_cwd_changes_seen(&mut self, seen: bool) {
        self.cwd_seen = seen;
    }

    fn root_fixed_by_spec(&self) -> bool {
        [false, true].into_iter().all(|elide| {
            let spec = self.filter_spec(elide);
            ["chroot", "pivot_root", "setns"].into_iter().all(|name| {
                let rules: Vec<_> = spec.rules.iter().filter(|r| r.name == name).collect();
                let action = match rules.as_slice() {
                    [] => spec.default,
                    [r] if r.when.is_empty() => r.action,
                    _ => return false,
                };
                matches!(
                    action,
                    notify::Action::Errno(_) | notify::Action::KillProcess
                )
            })
        })
    }

    pub fn served(&self) -> &[Served] {
        &self.served
    }

    /// The served directory whose read-only clone is mount `mnt_id`.
    pub fn served_mount(&self, mnt_id: u64) -> Option<usize> {
        self.served
            .iter()
            .position(|s| s.mnt_id != 0 && s.mnt_id == mnt_id)
    }

    pub fn denied_paths(&self) -> &[PathBuf] {
        &self.denied
    }

    pub fn decide(&self, path: &Path) -> Decide {
        match self.profile.decide(path) {
            PathDecision::Continue => Decide::Continue,
            PathDecision::Deny(e) => Decide::Deny(e),
            PathDecision::Serve { prefix, rest, .. } => {
                match self.served.iter().position(|s| s.prefix == prefix) {
                    Some(index) => Decide::Serve { index, rest },
                    // Every serve rule was opened at load; unreachable unless the profile
                    // changes underneath us. Refuse rather than continue.
                    None => Decide::Deny(libc::EACCES),
                }
            }
        }
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::Action;

    /// The unconditional action of `name` in `spec` (its rule, else the default).
    fn action(spec: &notify::FilterSpec, name: &str) -> Action {
        let rules: Vec<_> = spec.rules.iter().filter(|r| r.name == name).collect();
        match rules.as_slice() {
            [] => spec.default,
            [r] if r.when.is_empty() => r.action,
            other => panic!("{name}: conditional rules {other:?}"),
        }
    }

    #[test]
    fn signals_are_the_kernels_in_a_jail_and_notified_without_one() {
        for elide in [false, true] {
            let mut p = Policy::load("sigmaos", &[], false).unwrap();
            let spec = p.filter_spec(elide);
            for name in ["kill", "tgkill", "tkill", "pidfd_send_signal"] {
                assert_eq!(action(&spec, name), Action::Allow, "{name} jailed");
            }
            p.set_jailed(false);
            let spec = p.filter_spec(elide);
            for name in ["kill", "tgkill", "tkill", "pidfd_send_signal"] {
                assert_eq!(action(&spec, name), Action::Notify, "{name} without a jail");
            }
            let (kinds, warnings) = crate::handlers::kinds(&p, stats_max()).unwrap();
            assert!(warnings.is_empty(), "{warnings:?}");
            let nr = |n: &str| i32::from(libseccomp::ScmpSyscall::from_name(n).unwrap()) as usize;
            assert!(matches!(
                kinds[nr("kill")],
                Some(crate::handlers::Kind::Signal(_))
            ));
            assert!(matches!(
                kinds[nr("connect")],
                Some(crate::handlers::Kind::Socket(_))
            ));
            assert!(matches!(
                kinds[nr("openat")],
                Some(crate::handlers::Kind::Path(_))
            ));
            // Elided path calls run in the kernel, but not mknod (its argument check) nor,
            // without a jail, bind/connect (abstract names).
            if elide {
                assert_eq!(action(&spec, "openat"), Action::Allow);
                for name in ["mknodat", "bind", "connect"] {
                    assert_eq!(action(&spec, name), Action::Notify, "{name}");
                }
            }
        }
        // A profile that refuses kill keeps refusing it without a jail.
        let mut strict = Policy::load("sigmaos-strict", &[], false).unwrap();
        strict.set_jailed(false);
        let spec = strict.filter_spec(false);
        assert_eq!(action(&spec, "kill"), Action::Errno(libc::EPERM));
        assert_eq!(
            action(&spec, "tgkill"),
            Action::Notify,
            "Table 3.1's tgkill"
        );
    }

    #[test]
    fn audit_notifies_refusals() {
        let quiet = Policy::load("sigmaos", &[], false).unwrap();
        assert_eq!(quiet.filter_spec(false).default, Action::Errno(libc::EPERM));
        let (kinds, _) = crate::handlers::kinds(&quiet, stats_max()).unwrap();
        let ptrace = i32::from(libseccomp::ScmpSyscall::from_name("ptrace").unwrap()) as usize;
        assert!(kinds[ptrace].is_none(), "never notified");
        let audit = Policy::load("sigmaos", &[], true).unwrap();
        assert_eq!(audit.filter_spec(false).default, Action::Notify);
        let (kinds, _) = crate::handlers::kinds(&audit, stats_max()).unwrap();
        assert!(matches!(
            kinds[ptrace],
            Some(crate::handlers::Kind::Refused(libc::EPERM))
        ));
    }

    #[test]
    fn read_only_hints_keep_writes_notified_and_reads_elided() {
        use notify::{ArgCmp, CmpOp};
        for profile in ["sigmaos", "sigmaos-strict", "permissive"] {
            let mut p = Policy::load(profile, &[], false).unwrap();
            p.set_read_only_hints(true);
            let spec = p.filter_spec(true);
            spec.compile().unwrap_or_else(|e| panic!("{profile}: {e}"));
            let notified = p.profile.notified_syscalls();
            for name in [
                "newfstatat",
                "statx",
                "access",
                "readlink",
                "execve",
                "openat2",
            ] {
                if notified.iter().any(|n| n == name) {
                    assert_eq!(action(&spec, name), Action::Allow, "{profile} {name}");
                }
            }
            for name in ["mkdir", "mkdirat", "unlink", "rename", "chmod", "truncate"] {
                if notified.iter().any(|n| n == name) {
                    assert_eq!(action(&spec, name), Action::Notify, "{profile} {name}");
                }
            }
            // openat: allowed when no write bit is set, notified when any one is.
            let rules: Vec<_> = spec.rules.iter().filter(|r| r.name == "openat").collect();
            let cmp = |mask: u64, value: u64| {
                vec![ArgCmp {
                    arg: 2,
                    op: CmpOp::MaskedEq(mask),
                    value,
                }]
            };
            let all = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
            let allow = rules.iter().filter(|r| r.action == Action::Allow).count();
            if spec.default != Action::Allow {
                assert!(
                    rules
                        .iter()
                        .any(|r| r.action == Action::Allow && r.when == cmp(all, 0)),
                    "{profile}: {rules:?}"
                );
            }
            for bit in [libc::O_WRONLY, libc::O_RDWR, libc::O_CREAT, libc::O_TRUNC] {
                let bit = bit as u64;
                assert!(
                    rules
                        .iter()
                        .any(|r| r.action == Action::Notify && r.when == cmp(bit, bit)),
                    "{profile}: {rules:?}"
                );
            }
            assert_eq!(rules.len(), 4 + allow, "{profile}: {rules:?}");
        }
        // Without hints nothing changes: every path call runs in the kernel.
        let p = Policy::load("sigmaos", &[], false).unwrap();
        let spec = p.filter_spec(true);
        for name in ["openat", "mkdir", "unlink"] {
            assert_eq!(action(&spec, name), Action::Allow, "{name}");
        }
    }

    #[test]
    fn the_root_is_fixed_only_where_nothing_can_change_it() {
        assert!(Policy::load("sigmaos", &[], false).unwrap().root_is_fixed());
        assert!(Policy::load("sigmaos-strict", &[], false)
            .unwrap()
            .root_is_fixed());
        // --audit notifies refusals: still never run, but not provably so from the filter.
        assert!(!Policy::load("sigmaos", &[], true).unwrap().root_is_fixed());
        assert!(!Policy::load("permissive", &[], false)
            .unwrap()
            .root_is_fixed());
    }

    fn stats_max() -> usize {
        crate::stats::MAX_SYSCALL
    }
}
