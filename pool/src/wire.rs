//! The pool's messages: one JSON value per SEQPACKET datagram, descriptors beside it
//! (SCM_RIGHTS). The same framing on every socket of the pool (client ↔ pool, pool ↔ zygote,
//! client ↔ the forked proc), so the Python side reads it with `socket.recv_fds`.
#![allow(unsafe_code)]

use crate::PoolError;
use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{de::DeserializeOwned, Serialize};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The largest message: a request with the compiled filter and the environment.
pub const MAX_MESSAGE: usize = 1 << 20;

/// Send `value` with `fds` (each stays open here).
pub fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    value: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), PoolError> {
    let bytes = serde_json::to_vec(value).map_err(|e| PoolError::Protocol(e.to_string()))?;
    send_raw(sock, &bytes, fds)
}

/// Send `bytes` as one datagram with `fds`.
pub fn send_raw(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), PoolError> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => {
                return Err(PoolError::Io {
                    what: "sending to the pool's socket",
                    errno: e,
                })
            }
        }
    }
}

/// A datagram's bytes and the descriptors that came with it.
pub type Datagram = (Vec<u8>, Vec<OwnedFd>);

/// One datagram and the descriptors that came with it (owned at once, so none leaks);
/// `Ok(None)` at EOF.
pub fn recv_raw(sock: BorrowedFd<'_>) -> Result<Option<Datagram>, PoolError> {
    // The datagram's length first (MSG_TRUNC), so that the buffer is its size: most messages
    // are a few hundred bytes, and a zeroed MAX_MESSAGE each time cost ~0.3 ms.
    let failed = |errno| PoolError::Io {
        what: "reading the pool's socket",
        errno,
    };
    let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC;
    let len = loop {
        match nix::sys::socket::recv(sock.as_raw_fd(), &mut [], peek) {
            Ok(n) => break n,
            Err(Errno::EINTR) => continue,
            Err(Errno::ECONNRESET) => return Ok(None),
            Err(e) => return Err(failed(e)),
        }
    };
    let mut buf = vec![0u8; len.clamp(1, MAX_MESSAGE)];
    let mut space = nix::cmsg_space!([RawFd; 16]);
    loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => {
                let n = m.bytes;
                let mut fds = Vec::new();
                for c in m.cmsgs().map_err(|e| PoolError::Io {
                    what: "reading descriptors",
                    errno: e,
                })? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for fd in raw {
                            // SAFETY: SCM_RIGHTS just installed `fd` in our table for this
                            // message alone; nothing else owns it.
                            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
                if n == 0 && fds.is_empty() {
                    return Ok(None);
                }
                buf.truncate(n);
                return Ok(Some((buf, fds)));
            }
            Err(Errno::EINTR) => continue,
            Err(Errno::ECONNRESET) => return Ok(None),
            Err(e) => return Err(failed(e)),
        }
    }
}

/// One JSON message and its descriptors; `Ok(None)` at EOF.
pub fn recv<T: DeserializeOwned>(
    sock: BorrowedFd<'_>,
) -> Result<Option<(T, Vec<OwnedFd>)>, PoolError> {
    match recv_raw(sock)? {
        None => Ok(None),
        Some((bytes, fds)) => {
            let v =
                serde_json::from_slice(&bytes).map_err(|e| PoolError::Protocol(e.to_string()))?;
            Ok(Some((v, fds)))
        }
    }
}

/// The first message of a connection to the pool.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// A warm proc of `python` (its real path) for a program that imports `imports`; `startup`
    /// is the client's PYTHON*, LANG and LC_* (read by the interpreter at start-up).
    Run {
        python: String,
        imports: Vec<String>,
        startup: Vec<String>,
        /// A jailed run's view: only a jailed zygote whose view it completes serves it.
        #[serde(default)]
        view: Option<jail::warm::ViewKey>,
        /// A jailed run's profile: its zygote's filter must be that profile's.
        #[serde(default)]
        profile: Option<String>,
    },
    Status,
    Stop,
}

/// The pool's answer to [`Request::Run`]: the connection now belongs to a zygote, or the run
/// takes the cold path and why.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    Warm {
        zygote: String,
        /// A jailed zygote's view (its host ids for the run's idmapped binds). A root pool's
        /// answer carries a user namespace mapping to them (`jail::warm::id_mapper`).
        #[serde(default)]
        view: Option<jail::warm::ViewKey>,
    },
    Cold {
        why: String,
    },
}

/// What the client tells the zygote (with stdin, stdout, stderr and the report pipe's write
/// end): byte strings as hex, as the program sees them.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Spawn {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub umask: u32,
    /// The proc's compiled filter (native `struct sock_filter` array).
    pub filter: String,
    /// The numbers the descriptors after the first four take in the proc.
    pub fds: Vec<i32>,
    /// The client's limits, `[resource, soft, hard]` (`u64::MAX`: unlimited): a cold proc's
    /// are its supervisor's.
    #[serde(default)]
    pub rlimits: Vec<(i32, u64, u64)>,
    /// Signals the client ignores: a cold proc keeps them ignored across exec, every other
    /// disposition is the default's.
    #[serde(default)]
    pub ignored: Vec<i32>,
    /// The client's blocked signals (a cold proc's mask).
    #[serde(default)]
    pub blocked: Vec<i32>,
    /// A jailed proc's completion of its zygote's view.
    #[serde(default)]
    pub jail: Option<SpawnJail>,
    /// Say the proc's unique memory as it ends (`--stats`).
    #[serde(default)]
    pub stats: bool,
}

/// What a jailed zygote's child adds to the view it shares: the run's own binds (their trees
/// follow the inherited descriptors, in this order), where it may write, Landlock.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct SpawnJail {
    /// Each bind's destination (hex) and whether its source is a directory.
    pub binds: Vec<(String, bool)>,
    /// Where Landlock lets the proc write, besides /tmp, /dev/shm and /dev/pts (hex).
    pub writable: Vec<String>,
    /// Paths under those binds hidden as a cold jail hides them (hex).
    #[serde(default)]
    pub hides: Vec<String>,
    pub landlock: bool,
    /// Where the proc starts (hex; `/` when the working directory is not shown).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Most processes the proc may have (RLIMIT_NPROC in its own user namespace).
    #[serde(default)]
    pub pids: Option<u64>,
    /// The private /tmp's size in bytes.
    pub tmp_size: u64,
}

/// A zygote as `--status` shows it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ZygoteStatus {
    pub python: String,
    pub preloads: Vec<String>,
    pub pid: i32,
    pub forks: u64,
    /// Seconds since it was ready.
    #[serde(default)]
    pub age_secs: u64,
    pub alive: bool,
    /// A replacement still starting: the pid of the zygote it will retire.
    #[serde(default)]
    pub replacing: Option<i32>,
    /// Its preloads were learned from runs ([`crate::learn`]), not given.
    #[serde(default)]
    pub learned: bool,
    /// Still starting (not yet serving).
    #[serde(default)]
    pub starting: bool,
}

/// The answer to [`Request::Status`]: the zygotes, and what the pool has learned.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PoolStatus {
    pub zygotes: Vec<ZygoteStatus>,
    pub learning: LearnStatus,
}

/// What `--status` shows of [`crate::learn::Learner`].
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct LearnStatus {
    pub enabled: bool,
    pub threshold: usize,
    pub window: usize,
    pub zygotes: usize,
    /// Runs remembered.
    pub runs: usize,
    /// The most imported names and their counts (at most ten).
    pub counts: Vec<(String, usize)>,
    /// Names dropped because they failed to import in a zygote.
    pub refused: Vec<String>,
}

/// What the pool tells a zygote with a client's connection: the names the program's source
/// imports (validated), which the proc checks against its `sys.modules` at its end when the
/// pool learns ([`crate::learn`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Hand {
    pub imports: Vec<String>,
    pub learn: bool,
}

/// A zygote's report of a proc that ended: the names it imported ([`crate::learn`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Imported {
    pub imported: Vec<String>,
}

/// A descriptor accept4(2) just made, owned.
pub fn accepted(fd: RawFd) -> OwnedFd {
    // SAFETY: called only with the descriptor accept4 returned, which nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The listening socket systemd hands a socket-activated service as descriptor 3, if it is a
/// listening SEQPACKET socket (close-on-exec from here); Err: what it is instead.
pub fn activated_listener() -> Result<OwnedFd, String> {
    use nix::sys::socket::{getsockopt, sockopt};
    // SAFETY: descriptor 3 is only borrowed for the checks, which fail if it is not open.
    let fd = unsafe { BorrowedFd::borrow_raw(3) };
    match (
        getsockopt(&fd, sockopt::SockType),
        getsockopt(&fd, sockopt::AcceptConn),
    ) {
        (Ok(nix::sys::socket::SockType::SeqPacket), Ok(true)) => {}
        (Err(e), _) | (_, Err(e)) => return Err(format!("descriptor 3: {}", e.desc())),
        _ => return Err("descriptor 3 is not a listening SEQPACKET socket".into()),
    }
    nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| format!("descriptor 3: {}", e.desc()))?;
    // SAFETY: descriptor 3 is the socket systemd passed this process for it alone (checked
    // above); nothing else here owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(3) })
}

/// Hex of a byte string (argv, environ and the filter travel as such).
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}
