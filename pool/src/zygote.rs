//! One zygote, seen from the pool: `python3 -c <zygote.py, on stdin> FD PRELOADS` with its end of a
//! SEQPACKET pair at FD, its environment the pool's without credentials; "ready"
//! once its preloads are imported and its heap frozen. [`Zygote::hand`] passes it a client's
//! connection. A zygote is started ahead of need ([`Zygote::spawn`], then [`Zygote::poll_ready`]
//! from the pool's loop) and retired without loss ([`Zygote::retire`]: it forks no more, reaps
//! the procs it has and reports how each ended, then exits). After each proc it sends what the
//! proc imported ([`Zygote::reports`], for [`crate::learn`]); a preload that fails to import
//! is named ([`Zygote::failed_preload`]).
#![forbid(unsafe_code)]

use crate::{wire, PoolError};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const SOURCE: &str = include_str!("zygote.py");

/// How a jailed zygote is started (`sigma-supervise --zygote-ctl`): the profile of the runs it
/// serves, and the read-only binds its view adds (`pool --bind`; the runs name them too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jailed {
    pub profile: String,
    pub binds: Vec<String>,
}

pub struct Zygote {
    pub python: PathBuf,
    pub preloads: Vec<String>,
    pub startup: Vec<String>,
    pub forks: u64,
    /// When it said "ready" (its age counts from there).
    pub born: Instant,
    pub ready: bool,
    /// Its preloads were learned ([`crate::learn`]), not given.
    pub learned: bool,
    /// When it last served a run (learned zygotes beyond the cap go least recently used first).
    pub last_used: Instant,
    /// The preload it could not import, if it ended so.
    failed: Option<String>,
    /// In a σcontainer of its own (started through `sigma-supervise --zygote-ctl`), whose
    /// view it said before "ready"; its procs complete their own jails.
    pub jailed: bool,
    pub view: Option<jail::warm::ViewKey>,
    /// A root pool's user namespace mapping to the jailed zygote's host ids, handed to each
    /// client for its binds' trees (`jail::warm::id_mapper`).
    pub mapper: Option<OwnedFd>,
    /// How a jailed zygote was started.
    pub jail: Option<Jailed>,
    ctl: OwnedFd,
    child: Child,
}

impl Zygote {
    /// Start one and wait until it is ready.
    pub fn start(
        python: PathBuf,
        preloads: Vec<String>,
        learned: bool,
        jail: Option<Jailed>,
    ) -> Result<Zygote, PoolError> {
        let mut z = Zygote::spawn(python, preloads, learned, jail)?;
        loop {
            let said = wire::recv_raw(z.ctl.as_fd())?;
            match z.heard(said)? {
                true => return Ok(z),
                false => continue,
            }
        }
    }

    /// What it said before it was ready: its view (a jailed zygote's first word), then
    /// "ready" (true), or why it ended.
    fn heard(&mut self, said: Option<wire::Datagram>) -> Result<bool, PoolError> {
        match said {
            Some((m, _)) if m == b"ready" && self.view.is_some() == self.jailed => {
                self.ready = true;
                self.born = Instant::now();
                Ok(true)
            }
            Some((m, _)) if self.jailed && self.view.is_none() && m.starts_with(b"{") => {
                let view: jail::warm::ViewKey = serde_json::from_slice(&m)
                    .map_err(|e| PoolError::Protocol(format!("the zygote's view: {e}")))?;
                // Without one each client makes its own.
                self.mapper =
                    jail::warm::id_mapper((view.host_uid, view.host_gid)).unwrap_or_else(|e| {
                        tracing::warn!("pool: {e}");
                        None
                    });
                self.view = Some(view);
                Ok(false)
            }
            other => Err(self.never_ready(other.map(|(m, _)| m))),
        }
    }

    /// Its last word was not "ready": "failed NAME[,NAME...]: why" names the preloads it could
    /// not import.
    fn never_ready(&mut self, said: Option<Vec<u8>>) -> PoolError {
        let said = said.map(|m| String::from_utf8_lossy(&m).into_owned());
        if let Some(rest) = said.as_deref().and_then(|m| m.strip_prefix("failed ")) {
            let name = rest.split(':').next().unwrap_or("");
            self.failed = Some(name.to_owned());
            return PoolError::Setup(format!(
                "the zygote of {} cannot preload {rest}",
                self.python.display()
            ));
        }
        PoolError::Setup(format!(
            "the zygote of {} with preloads [{}] ended before it was ready",
            self.python.display(),
            self.preloads.join(",")
        ))
    }

    /// The preloads that a zygote which never got ready could not import, comma-separated.
    pub fn failed_preload(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// What its procs imported, one list per proc that ended since the last call (without
    /// waiting; names as the zygote sent them, the caller validates).
    pub fn reports(&mut self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        // A few at a time: the pool's loop comes back for the rest.
        for _ in 0..64 {
            let mut fds = [PollFd::new(self.ctl.as_fd(), PollFlags::POLLIN)];
            if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
                break;
            }
            match wire::recv_raw(self.ctl.as_fd()) {
                Ok(Some((m, _))) => {
                    if let Ok(r) = serde_json::from_slice::<wire::Imported>(&m) {
                        out.push(r.imported);
                    }
                }
                _ => break,
            }
        }
        out
    }

    /// Whether a zygote [`Zygote::spawn`]ed has said "ready" (without waiting); Err if it ended.
    pub fn poll_ready(&mut self) -> Result<bool, PoolError> {
        if self.ready {
            return Ok(true);
        }
        let mut fds = [PollFd::new(self.ctl.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(false),
            Ok(_) => {}
            Err(errno) => {
                return Err(PoolError::Io {
                    what: "poll",
                    errno,
                })
            }
        }
        let said = wire::recv_raw(self.ctl.as_fd())?;
        self.heard(said)
    }

    /// Its control socket, for the pool's poll while it is not yet ready.
    pub fn ctl(&self) -> BorrowedFd<'_> {
        self.ctl.as_fd()
    }

    /// Tell it to fork no more: it reads what was already handed to it, waits for its procs
    /// (reporting how each ended to its client), then exits. Reap it with [`Zygote::alive`].
    pub fn retire(&mut self) {
        let _ = nix::sys::socket::shutdown(self.ctl.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }

    /// Start one; it is ready once [`Zygote::poll_ready`] says so.
    pub fn spawn(
        python: PathBuf,
        preloads: Vec<String>,
        learned: bool,
        jail: Option<Jailed>,
    ) -> Result<Zygote, PoolError> {
        let jailed = jail.is_some();
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|errno| PoolError::Io {
            what: "socketpair",
            errno,
        })?;
        // Inherited by the zygote alone: the pool is single-threaded, so nothing else forks
        // while the flag is off.
        let set = |flags| {
            fcntl(&theirs, FcntlArg::F_SETFD(flags)).map_err(|errno| PoolError::Io {
                what: "fcntl",
                errno,
            })
        };
        set(FdFlag::empty())?;
        let ctl = theirs.as_raw_fd().to_string();
        // Jailed: this very program builds its σcontainer as a cold proc's, says the view on
        // the control socket, and stays its (idle) supervisor.
        let mut cmd = match jailed {
            true => {
                let exe = std::env::current_exe()
                    .map_err(|e| PoolError::Setup(format!("this program's path: {e}")))?;
                let mut c = Command::new(exe);
                let j = jail.as_ref().expect("jailed");
                c.args(["--zygote-ctl", &ctl, "--profile", &j.profile]);
                for b in &j.binds {
                    c.args(["--bind", b]);
                }
                c.arg("--").arg(&python);
                c
            }
            false => Command::new(&python),
        };
        // The source comes on stdin, read at once: `ps` shows one line, `__main__` holds nothing.
        cmd.arg("-c")
            .arg("exec(__import__('sys').stdin.read())")
            .arg(&ctl)
            .arg(preloads.join(","))
            .args(jailed.then_some("jailed"))
            .stdin(Stdio::piped())
            .env_clear();
        let env: Vec<_> = std::env::vars_os()
            .filter(|(k, v)| {
                !(jail::env::is_credential(k.as_bytes())
                    || jail::env::carries_password(v.as_bytes())
                    || crate::server::ACTIVATION.iter().any(|a| k == a))
            })
            .collect();
        cmd.envs(env.iter().cloned());
        // Without restartable sequences, as a cold proc runs: the proc's filter answers rseq
        // ENOSYS, so glibc in a cold proc never registers one; a zygote that had registered
        // would fork a proc whose every new thread fails to (fatal in glibc). The proc's
        // environment is the client's, so it never sees this.
        let tunables = match std::env::var("GLIBC_TUNABLES") {
            Ok(t) if !t.is_empty() => format!("{t}:glibc.pthread.rseq=0"),
            _ => "glibc.pthread.rseq=0".to_owned(),
        };
        cmd.env("GLIBC_TUNABLES", tunables);
        let spawned = cmd.spawn();
        set(FdFlag::FD_CLOEXEC)?;
        drop(theirs);
        let mut child = spawned
            .map_err(|e| PoolError::Setup(format!("cannot start {}: {e}", python.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            let _ = stdin.write_all(SOURCE.as_bytes());
        }
        Ok(Zygote {
            startup: crate::choose::startup_env_of(&env),
            python,
            preloads,
            forks: 0,
            born: Instant::now(),
            ready: false,
            learned,
            last_used: Instant::now(),
            failed: None,
            jailed,
            view: None,
            mapper: None,
            jail,
            ctl: ours,
            child,
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether it still runs (reaped here if not).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Pass a client's connection to it with what the program imports (validated names) and
    /// whether its proc is to say what it imported; Err if it is gone.
    pub fn hand(&mut self, conn: BorrowedFd<'_>, hand: &wire::Hand) -> Result<(), PoolError> {
        wire::send(self.ctl.as_fd(), hand, &[conn])?;
        self.forks += 1;
        self.last_used = Instant::now();
        Ok(())
    }

    /// A short name for `--stats` and `--status`.
    pub fn describe(&self) -> String {
        format!(
            "{} [{}] pid {}",
            self.python.display(),
            self.preloads.join(","),
            self.pid()
        )
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
