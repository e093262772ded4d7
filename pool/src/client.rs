//! The client's side: ask the pool for a proc ([`start`]), or for its state ([`status`],
//! [`stop`]). A warm start gives back what a cold spawn does: the proc's pid and pidfd, its
//! seccomp listener, the "go" and the report of how it ended; the caller supervises it.
#![deny(unsafe_code)]

use crate::{wire, PoolError};
use nix::sys::socket::{
    connect as sys_connect, socket, AddressFamily, SockFlag, SockType, UnixAddr,
};
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A connection to the pool; [`PoolError::NoPool`] when none listens.
pub fn connect() -> Result<OwnedFd, PoolError> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|errno| PoolError::Io {
        what: "socket",
        errno,
    })?;
    let addr = UnixAddr::new(&crate::socket_path()).map_err(|errno| PoolError::Io {
        what: "socket path",
        errno,
    })?;
    match sys_connect(fd.as_raw_fd(), &addr) {
        Ok(()) => Ok(fd),
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ECONNREFUSED) => Err(PoolError::NoPool),
        Err(errno) => Err(PoolError::Io {
            what: "connecting to the pool",
            errno,
        }),
    }
}

/// What the proc is and gets, as the caller prepared it for a cold run.
pub struct WarmRequest<'a> {
    /// The interpreter, resolved.
    pub python: &'a Path,
    pub argv: &'a [&'a [u8]],
    /// `KEY=VALUE` each.
    pub env: &'a [&'a [u8]],
    pub imports: Vec<String>,
    pub startup: Vec<String>,
    /// The proc's compiled filter (native `struct sock_filter` array).
    pub filter: Vec<u8>,
    /// Descriptors the proc inherits at their own numbers (the σOS socket).
    pub fds: Vec<BorrowedFd<'a>>,
    /// The run's σcontainer (a jailed run), as a cold start would build it.
    pub jail: Option<&'a jail::JailSpec>,
    /// The run's profile (a jailed zygote's filter must be that profile's).
    pub profile: &'a str,
    /// The proc is to say its unique memory as it ends ([`unique_memory`]).
    pub stats: bool,
}

/// A proc forked by a zygote, waiting for [`Started::go`].
pub struct Started {
    /// In our pid namespace.
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub listener: OwnedFd,
    /// Write one byte to let the proc run.
    pub go: OwnedFd,
    /// The zygote's two-byte report of how the proc ended (jail::init::Ended's wire form).
    pub ended: OwnedFd,
    pub zygote: String,
}

pub enum Outcome {
    Warm(Started),
    /// The cold path, and why.
    Cold(String),
}

/// Ask the pool for a proc. Err: no pool, or it failed; `Cold`: the pool (or the zygote)
/// declined before anything of the proc ran.
pub fn start(req: &WarmRequest<'_>) -> Result<Outcome, PoolError> {
    let conn = connect()?;
    let python = req.python.as_os_str().to_string_lossy().into_owned();
    let run = wire::Request::Run {
        python,
        imports: req.imports.clone(),
        startup: req.startup.clone(),
        view: req.jail.map(jail::warm::ViewKey::of),
        profile: req.jail.map(|_| req.profile.to_owned()),
    };
    wire::send(conn.as_fd(), &run, &[])?;
    // The request's body is made while the pool chooses a zygote; the jail's part follows.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    nix::sys::stat::umask(umask);
    let cwd = std::env::current_dir()
        .map_err(|e| PoolError::Setup(format!("the working directory: {e}")))?;
    let mut spawn = wire::Spawn {
        argv: req.argv.iter().map(|a| wire::hex(a)).collect(),
        env: req.env.iter().map(|a| wire::hex(a)).collect(),
        cwd: wire::hex(cwd.as_os_str().as_bytes()),
        umask: umask.bits(),
        filter: wire::hex(&req.filter),
        fds: req.fds.iter().map(|f| f.as_raw_fd()).collect(),
        rlimits: rlimits(),
        // SIGPIPE: ignored by the Rust runtime, not by the user; a cold spawn resets it.
        ignored: signals_of("SigIgn:")
            .into_iter()
            .filter(|&s| s != libc::SIGPIPE)
            .collect(),
        blocked: signals_of("SigBlk:"),
        jail: None,
        stats: req.stats,
    };
    let (zygote, view, mapper) = match wire::recv::<wire::Answer>(conn.as_fd())? {
        Some((wire::Answer::Warm { zygote, view }, fds)) => (zygote, view, fds),
        Some((wire::Answer::Cold { why }, _)) => return Ok(Outcome::Cold(why)),
        None => return Ok(Outcome::Cold("the pool ended the request".into())),
    };
    // A jailed run: its own binds, cloned here (the zygote never sees a host path). Leaving
    // without a Spawn (the connection closed) lets the zygote go on without forking.
    let trees = match (req.jail, view) {
        (None, None) => Vec::new(),
        (Some(spec), Some(view)) => match jailed(spec, &view, mapper.first()) {
            Ok((j, trees)) => {
                spawn.jail = j;
                trees
            }
            Err(why) => return Ok(Outcome::Cold(why)),
        },
        _ => {
            return Ok(Outcome::Cold(
                "the zygote's σcontainer is not the run's".into(),
            ))
        }
    };
    let (ended, ended_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|errno| PoolError::Io {
            what: "pipe2",
            errno,
        })?;
    // The proc's stdio is ours, as a cold child's is.
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let mut fds = vec![i.as_fd(), o.as_fd(), e.as_fd(), ended_tx.as_fd()];
    fds.extend(req.fds.iter().copied());
    fds.extend(trees.iter().map(|t| t.as_fd()));
    wire::send(conn.as_fd(), &spawn, &fds)?;
    drop(trees);
    drop(ended_tx);
    let reply = wire::recv::<serde_json::Value>(conn.as_fd())?;
    let Some((v, mut fds)) = reply else {
        return Ok(Outcome::Cold(format!(
            "the zygote {zygote} ended before the proc started"
        )));
    };
    if fds.len() != 2 {
        return Ok(Outcome::Cold(format!(
            "the zygote's proc failed before it ran: {v}"
        )));
    }
    let listener = fds.pop().expect("two");
    let pidfd = fds.pop().expect("two");
    let pid = pid_of(pidfd.as_fd())
        .ok_or_else(|| PoolError::Setup("the proc's pidfd names no pid".into()))?;
    Ok(Outcome::Warm(Started {
        pid,
        pidfd,
        listener,
        go: conn,
        ended,
        zygote,
    }))
}

/// A jailed run's completion of the zygote's `view`: what the child is told, and the trees of
/// the run's own binds; Err: why it cannot be forked from this zygote.
fn jailed(
    spec: &jail::JailSpec,
    view: &jail::warm::ViewKey,
    mapper: Option<&OwnedFd>,
) -> Result<(Option<wire::SpawnJail>, Vec<OwnedFd>), String> {
    let extra = view.extra_binds(spec)?;
    let ids = (view.host_uid, view.host_gid);
    let trees = jail::warm::request_trees(&extra, ids, mapper.map(|m| m.as_fd()))?;
    let hex = |p: &Path| wire::hex(p.as_os_str().as_bytes());
    let binds = extra
        .iter()
        .map(|b| (hex(&b.dst), b.src.is_dir()))
        .collect();
    let writable = jail::warm::writable_dsts(spec)
        .iter()
        .map(|p| hex(p))
        .collect();
    let hides = jail::warm::hides_under(spec, &extra)
        .iter()
        .map(|p| hex(p))
        .collect();
    let landlock = spec.landlock;
    let tmp_size = spec.tmp_size;
    let j = wire::SpawnJail {
        binds,
        writable,
        hides,
        workdir: spec.workdir.as_deref().map(hex),
        pids: spec.limits.pids,
        landlock,
        tmp_size,
    };
    Ok((Some(j), trees))
}

/// A warm proc's unique memory as it ended, in KiB (asked with [`WarmRequest::stats`]): read
/// from `conn` (a copy of [`Started::go`]) once the proc has ended, without waiting.
pub fn unique_memory(conn: BorrowedFd<'_>) -> Option<u64> {
    let mut fds = [nix::poll::PollFd::new(conn, nix::poll::PollFlags::POLLIN)];
    if !matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0) {
        return None;
    }
    let (said, _) = wire::recv::<serde_json::Value>(conn).ok()??;
    said.get("unique_kib")?.as_u64()
}

/// Our limits, each `(resource, soft, hard)`, as a cold proc inherits them.
fn rlimits() -> Vec<(i32, u64, u64)> {
    use nix::sys::resource::{getrlimit, Resource};
    [
        Resource::RLIMIT_CPU,
        Resource::RLIMIT_FSIZE,
        Resource::RLIMIT_DATA,
        Resource::RLIMIT_STACK,
        Resource::RLIMIT_CORE,
        Resource::RLIMIT_RSS,
        Resource::RLIMIT_NPROC,
        Resource::RLIMIT_NOFILE,
        Resource::RLIMIT_MEMLOCK,
        Resource::RLIMIT_AS,
        Resource::RLIMIT_LOCKS,
        Resource::RLIMIT_SIGPENDING,
        Resource::RLIMIT_MSGQUEUE,
        Resource::RLIMIT_NICE,
        Resource::RLIMIT_RTPRIO,
        Resource::RLIMIT_RTTIME,
    ]
    .into_iter()
    .filter_map(|r| getrlimit(r).ok().map(|(soft, hard)| (r as i32, soft, hard)))
    .collect()
}

/// The signals of this thread's `FIELD` mask in /proc (`SigIgn:` ignored, `SigBlk:` blocked).
fn signals_of(field: &str) -> Vec<i32> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    (1..=64).filter(|s| mask & (1 << (s - 1)) != 0).collect()
}

/// The pid a pidfd refers to, in our pid namespace (its fdinfo).
fn pid_of(pidfd: BorrowedFd<'_>) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|p| p.trim().parse().ok())
        .filter(|&p| p > 0)
}

/// Pass `sig` on to a warm proc by its pidfd (pidfd_send_signal, no siginfo: it reads as a
/// kill(2) from us). A warm proc is outside the terminal's foreground group, so a terminal's
/// ^C reaches only its client, which passes it on; the proc then ends as a cold one would.
#[allow(unsafe_code)]
pub fn forward_signal(pidfd: BorrowedFd<'_>, sig: i32) -> Result<(), PoolError> {
    // SAFETY: pidfd_send_signal with a descriptor we hold open for the call and a null
    // siginfo; the kernel reads no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(PoolError::Io {
            what: "pidfd_send_signal",
            errno: nix::errno::Errno::last(),
        });
    }
    Ok(())
}

/// The pool's zygotes and what it has learned.
pub fn status() -> Result<wire::PoolStatus, PoolError> {
    let conn = connect()?;
    wire::send(conn.as_fd(), &wire::Request::Status, &[])?;
    match wire::recv(conn.as_fd())? {
        Some((v, _)) => Ok(v),
        None => Err(PoolError::Refused(
            "the pool refused the request (another uid's pool?)".into(),
        )),
    }
}

/// Ask the pool to stop.
pub fn stop() -> Result<(), PoolError> {
    let conn = connect()?;
    wire::send(conn.as_fd(), &wire::Request::Stop, &[])?;
    let _ = wire::recv_raw(conn.as_fd())?;
    Ok(())
}

/// The environment as `(key, value)` pairs, for [`crate::choose`].
pub fn env_pairs(env: &[&[u8]]) -> Vec<(OsString, OsString)> {
    env.iter()
        .map(|kv| {
            let (k, v) = match kv.iter().position(|&b| b == b'=') {
                Some(i) => (&kv[..i], &kv[i + 1..]),
                None => (&kv[..], &b""[..]),
            };
            (
                std::ffi::OsStr::from_bytes(k).to_owned(),
                std::ffi::OsStr::from_bytes(v).to_owned(),
            )
        })
        .collect()
}
