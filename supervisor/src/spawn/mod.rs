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

/// Fork the child, let it set itself up, and take its listener. Must run while this process has
/// one thread.
pub fn spawn(mut p: Prepared) -> Result<Child, Failure> {
    p.kept = p.kept_fds();
    match p.jail.take() {
        Some(spec) => jailed::spawn_jailed(p, spec),
        None => child::spawn_bare(p),
    }
}
