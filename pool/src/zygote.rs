//! One zygote, seen from the pool: `python3 -c <zygote.py, on stdin> FD PRELOADS` with its end of a
//! SEQPACKET pair at FD, its environment the pool's without credentials; "ready"
//! once its preloads are imported and its heap frozen. [`Zygote::hand`] passes it a client's
//! connection.
#![forbid(unsafe_code)]

use crate::{wire, PoolError};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const SOURCE: &str = include_str!("zygote.py");

pub struct Zygote {
    pub python: PathBuf,
    pub preloads: Vec<String>,
    pub startup: Vec<String>,
    pub forks: u64,
    ctl: OwnedFd,
    child: Child,
}

impl Zygote {
    /// Start one and wait until it is ready.
    pub fn start(python: PathBuf, preloads: Vec<String>) -> Result<Zygote, PoolError> {
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
        let mut cmd = Command::new(&python);
        // The source comes on stdin, read at once: `ps` shows one line, `__main__` holds nothing.
        cmd.arg("-c")
            .arg("exec(__import__('sys').stdin.read())")
            .arg(theirs.as_raw_fd().to_string())
            .arg(preloads.join(","))
            .stdin(Stdio::piped())
            .env_clear();
        let env: Vec<_> = std::env::vars_os()
            .filter(|(k, v)| {
                !(jail::env::is_credential(k.as_bytes())
                    || jail::env::carries_password(v.as_bytes()))
            })
            .collect();
        cmd.envs(env.iter().cloned());
        let spawned = cmd.spawn();
        set(FdFlag::FD_CLOEXEC)?;
        drop(theirs);
        let mut child = spawned
            .map_err(|e| PoolError::Setup(format!("cannot start {}: {e}", python.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            let _ = stdin.write_all(SOURCE.as_bytes());
        }
        let z = Zygote {
            startup: crate::choose::startup_env_of(&env),
            python,
            preloads,
            forks: 0,
            ctl: ours,
            child,
        };
        match wire::recv_raw(z.ctl.as_fd())? {
            Some((m, _)) if m == b"ready" => Ok(z),
            _ => Err(PoolError::Setup(format!(
                "the zygote of {} with preloads [{}] ended before it was ready",
                z.python.display(),
                z.preloads.join(",")
            ))),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether it still runs (reaped here if not).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Pass a client's connection to it; Err if it is gone.
    pub fn hand(&mut self, conn: BorrowedFd<'_>) -> Result<(), PoolError> {
        wire::send_raw(self.ctl.as_fd(), b"c", &[conn])?;
        self.forks += 1;
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
