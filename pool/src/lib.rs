//! Warm procs: a resident pool of Python zygotes that fork pre-initialised procs.
//!
//! The pool (`sigma-supervise pool`) runs with its user's rights and serves only that user
//! (SO_PEERCRED) on a socket in a directory only the user can open ([`socket_path`]). For each
//! interpreter it keeps zygotes, each a `python3` that has imported its preloads and frozen its
//! heap, made ahead of any request. A client (`sigma-supervise python3 script.py`) stays the
//! proc's supervisor: it compiles the proc's filter as for a cold run, asks, and gets back the
//! forked proc's pidfd and its own seccomp listener:
//!
//! ```text
//! client ── Run{python, imports, startup} ──▶ pool: peer's uid = ours? a zygote whose preloads ⊆
//!   │                                         │    imports, same interpreter, PYTHON*, locale?
//!   │◀──────────────── Cold{why} ─────────────┤    (no: the client runs cold, and says why)
//!   │◀──────────────── Warm{zygote} ──────────┘    yes: the connection is passed to the zygote
//!   ├─ Spawn{argv, env, cwd, umask, filter} + stdin/stdout/stderr + report pipe ──▶ zygote
//!   │                                                         fork ─▶ proc: stdio, fds closed,
//!   │◀──────────────── {pid} + pidfd + listener ───────────────────── filter (NEW_LISTENER)
//!   ├─ "g" (the client's receive loop is ready) ────────────────────▶ identity, reseed, run
//!   │                                                                 as `python3 script.py`
//!   ◀── report pipe: how the proc ended (two bytes) ◀── zygote reaps it
//! ```
//!
//! Jailed zygotes (the default; `pool --no-jail` keeps unjailed ones for `--no-jail` runs):
//! each zygote is started by this very program as a proc of its own σcontainer
//! (`sigma-supervise --zygote-ctl FD`: a cold proc's jail less the run's own binds, without
//! Landlock, its filter the profile's with nothing notified plus what completes a child's
//! jail, its listener closed so that each child may have one), and says its view
//! ([`jail::warm::ViewKey`]) before "ready". A jailed run is sent to it only when its own view
//! is that plus binds; the client clones those binds (`jail::warm::request_trees`) and sends
//! them with the Spawn. The forked child joins a pid/network/IPC/UTS namespace made ahead,
//! builds a root of its own from the zygote's view and those trees, pivots, enters a user
//! namespace of its own, drops every capability, applies Landlock, then the proc's filter
//! (zygote.py's `_Jail` draws it). A proc whose client dies is killed.
//!
//! What exec would have given a cold proc, the forked one takes before its filter: the
//! client's rlimits, its ignored signals ignored and every other disposition the default, its
//! signal mask, then the interpreter's own start-up handlers; `/proc/self/cmdline` (ps) shows
//! the run's argv (PR_SET_MM_MAP, which needs no privilege while the exe link stays; where the
//! kernel refuses it, the zygote's command line stays). Not taken: `/proc/self/exe` and `comm`
//! are the zygote's interpreter's, as resolved by the pool.
//!
//! Recycling: siblings share their zygote's address-space layout and the interpreter's hash
//! seed (each proc draws anew what a cold start draws at import, for the modules its zygote
//! has: `random`, numpy's legacy global generator, multiprocessing's authentication key; the
//! registry `RESEED` in zygote.py, which also names what needs nothing), so a zygote is replaced after
//! 1000 forks or 15 minutes by default (`pool --recycle-after-forks N --recycle-after-secs S`):
//! the new one is started between requests and the old one retired once the new is ready,
//! never on a request's path; `pool --status` shows each zygote's forks and age.
//!
//! Learning ([`learn`]): each warm proc says at its end which of its program's import names it
//! imported from the interpreter's own path; a set imported by 3 of the last 20 runs gets a
//! zygote of its own, started between requests (at most 2; at the cap it takes the least
//! recently used one's place once more runs imported it;
//! `pool --learn-preloads=off`, `--learn-threshold`, `--learn-window`, `--learned-zygotes`).
//!
//! `wire.rs` is the framing and the messages (a leaf), [`choose`] which runs may be warm,
//! `zygote.rs` + `zygote.py` a zygote, [`server`] the pool, [`client`] the client's side,
//! [`learn`] the preloads learned from use.
//! Nothing here decides syscalls: the filter is the client's, compiled as for a cold run.
#![deny(unsafe_code)]

pub mod ask;
pub mod choose;
pub mod cli;
pub mod client;
pub mod learn;
pub mod server;
pub mod wire;
pub mod zygote;

use std::path::PathBuf;

/// What can go wrong between a client, the pool and its zygotes: one line each.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("no pool is running (start one with `sigma-supervise pool`)")]
    NoPool,
    #[error("{what}: {errno}")]
    Io {
        what: &'static str,
        #[source]
        errno: nix::errno::Errno,
    },
    #[error("the pool's message is not understood: {0}")]
    Protocol(String),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Setup(String),
}

/// The directory of the pool's socket: `$XDG_RUNTIME_DIR/sigma-supervise` (a user's), or
/// `/run/sigma-supervise` for root (and for a user without XDG_RUNTIME_DIR, under /tmp with
/// the uid in the name). Mode 0700: no other user can open the socket.
/// `SIGMA_POOL_DIR` names another (tests, or a second pool).
pub fn socket_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SIGMA_POOL_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let uid = nix::unistd::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/sigma-supervise");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("sigma-supervise"),
        _ => std::env::temp_dir().join(format!("sigma-supervise-{uid}")),
    }
}

/// The pool's socket (SOCK_SEQPACKET).
pub fn socket_path() -> PathBuf {
    socket_dir().join("pool.sock")
}
