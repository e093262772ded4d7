//! Which handler answers which syscall number ([`kinds`], built once from the policy), and what
//! the policy is told of the handlers ([`handled`]).
#![forbid(unsafe_code)]

use super::signal::SignalCall;
use super::socket::SocketCall;
use super::spec::Spec;
use super::table::SPECS;
use crate::calls::Handled;
use crate::policy::Policy;
use anyhow::{anyhow, Context as _};

/// How the loop answers a syscall number.
#[derive(Clone, Copy)]
pub enum Kind {
    Path(&'static Spec),
    /// A signal without a PID namespace: delivered only within the proc's tree.
    Signal(SignalCall),
    /// bind/connect of a local socket, decided by its path.
    Socket(SocketCall),
    /// Outside the allow-list: the profile's errno, logged once per name.
    Refused(i32),
}

/// The calls the handlers serve, as the policy is told of them.
pub fn handled() -> Handled {
    Handled {
        paths: SPECS.iter().map(Spec::describe).collect(),
        signals: SignalCall::ALL.iter().map(|(name, _)| *name).collect(),
    }
}

/// The answer kind for every syscall number below `max`, and warnings for notified syscalls
/// no handler serves (those are refused, never continued).
pub fn kinds(policy: &Policy, max: usize) -> anyhow::Result<(Vec<Option<Kind>>, Vec<String>)> {
    let profile = policy.profile();
    let mut table = vec![None; max];
    let mut warnings = Vec::new();
    let refused = profile.denied_errno().unwrap_or(libc::EPERM);
    if profile.logs_denied() {
        for k in table.iter_mut() {
            *k = Some(Kind::Refused(refused));
        }
    }
    // The profile resolved each name to its native number when it was parsed.
    let notified = profile.notified_syscalls();
    for (name, nr) in notified.into_iter().zip(profile.notified_syscall_nrs()) {
        let nr = usize::try_from(nr)
            .ok()
            .filter(|n| *n < max)
            .ok_or_else(|| anyhow!("syscall `{name}` has no native number"))?;
        let socket = SocketCall::ALL.into_iter().find(|(n, _)| *n == name);
        match SPECS.iter().find(|s| s.name == name) {
            Some(spec) => table[nr] = Some(Kind::Path(spec)),
            None if socket.is_some() => {
                table[nr] = socket.map(|(_, call)| Kind::Socket(call));
            }
            None => {
                warnings.push(format!(
                    "profile notifies `{name}` but the supervisor has no handler for it: \
                     it will fail with EPERM"
                ));
                table[nr] = Some(Kind::Refused(libc::EPERM));
            }
        }
    }
    for name in policy.signal_calls() {
        let Some(call) = SignalCall::ALL
            .into_iter()
            .find_map(|(n, c)| (n == name).then_some(c))
        else {
            continue;
        };
        let nr = libseccomp::ScmpSyscall::from_name(name)
            .with_context(|| format!("syscall `{name}`"))?;
        if let Some(k) = usize::try_from(i32::from(nr))
            .ok()
            .and_then(|n| table.get_mut(n))
        {
            *k = Some(Kind::Signal(call));
        }
    }
    Ok((table, warnings))
}
