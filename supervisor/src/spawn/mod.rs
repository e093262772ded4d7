//! Starting the target: everything is built before fork ([`prepared`]) (C strings, pointer arrays, the compiled
//! filter, the list of mounts); the child then only makes system calls:
//! new mount namespace → hide served dirs → over-mount denied paths → no_new_privs + filter →
//! hand the listener to the parent (it takes it with pidfd_getfd) → wait for "go" → execve.
//! (A jailed target may pass the listener itself and exec at once: [`Prepared::pass_listener`].)
//!
//! ```text
//! prepare ─▶ Prepared ─▶ spawn ─┬─ no jail: child::spawn_bare (fork; the child mounts, filters, execs)
//!   (argv, env, mounts)         └─ jailed:  jailed::spawn_jailed (init in new namespaces → target)
//!                                      ─▶ Child (pid, listener, "go", exec result) ─▶ supervisor
//! ```
//!
//! Files: `prepared.rs` (what is built before fork), `child.rs` (the target without a jail, and
//! the [`Child`] both ways return), `jailed.rs` (the target in its σcontainer).
#![forbid(unsafe_code)]

mod child;
mod jailed;
mod prepared;

pub use child::Child;
pub use prepared::{find_program, handled_signals, prepare, Prepared, Programs};

use crate::failure::Failure;
use anyhow::Context as _;
use std::os::fd::AsFd as _;

/// Fork the child, let it set itself up, and take its listener. Must run while this process has
/// one thread.
pub fn spawn(mut p: Prepared) -> Result<Child, Failure> {
    p.kept = p.kept_fds();
    match p.jail.take() {
        Some(spec) => jailed::spawn_jailed(p, spec),
        None => child::spawn_bare(p),
    }
}

/// Which start a run took, for `--stats`: its line, and a warm proc's word of its memory.
pub struct Start {
    said: String,
    memory: Option<std::os::fd::OwnedFd>,
}

impl Start {
    /// The `--stats` line, once the proc has ended.
    pub fn line(&self) -> String {
        let kib = (self.memory.as_ref()).and_then(|c| pool::client::unique_memory(c.as_fd()));
        match kib {
            Some(kib) => format!(
                "{}; its own memory at its end {:.1} MiB (the rest shared with its zygote)",
                self.said,
                kib as f64 / 1024.0
            ),
            None => self.said.clone(),
        }
    }
}

/// The proc from a pool's zygote if sigma-pool finds the run may be warm (`warm`: it must),
/// else [`spawn`]; and the start it took, for `--stats` (`stats`).
pub fn warm_or_cold(
    p: Prepared,
    sendmsg: bool,
    (warm, stats): (bool, bool),
    profile: &str,
) -> Result<(Child, Start), Failure> {
    let mounts = !(p.hides.is_empty() && p.binds.is_empty() && p.denies.is_empty());
    let run = pool::ask::Run {
        argv: p._argv.iter().map(|a| a.as_bytes()).collect(),
        env: p._envp.iter().map(|a| a.as_bytes()).collect(),
        filter: p.filter.to_bytes(),
        fds: p.inherited.iter().map(|f| f.as_fd()).collect(),
        unlike: [mounts, !p.passed.is_empty(), !sendmsg],
        jail: p.jail.as_ref(),
        profile,
        stats,
    };
    let (s, said) = pool::ask::ask(run, warm).map_err(anyhow::Error::from)?;
    let Some(s) = s else {
        let memory = None;
        return Ok((spawn(p)?, Start { said, memory }));
    };
    let memory = stats.then(|| s.go.try_clone().ok()).flatten();
    handled_signals().thread_block().context("sigmask")?;
    let (status_rx, _) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    // Not our child (`jailed`: only its report, the zygote's, tells how it ended).
    let (listener, go_tx, ended_rx) = (s.listener, Some(s.go), Some(s.ended));
    let (pid, display, cgroup, host_lock, jailed) = (s.pid, p.display, None, None, true);
    let child = Child {
        pid,
        display,
        listener,
        status_rx,
        go_tx,
        ended_rx,
        cgroup,
        host_lock,
        jailed,
        warm: Some(s.pidfd),
    };
    Ok((child, Start { said, memory }))
}
