//! A run's side: the realm snapshot's mount, its server started if none serves it.
#![forbid(unsafe_code)]

use super::paths::{is_fuse, mount_dir, packages_file, serving, stats_file, FUSE_ARG0};
use crate::snapshot::{io, lock_file, LazyError};
use nix::fcntl::{Flock, FlockArg};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a run waits for a server it started to be mounted.
pub(super) const START_BOUND: Duration = Duration::from_secs(5);

/// A realm's FUSE mount as a run shows it: bound read-only at the prefix by the jail.
pub struct FuseMount {
    /// The mount on the host (`<realm>/fuse/<key>-<server's pid>`).
    pub mnt: PathBuf,
    /// The server's pid (for `--stats`).
    pub server: u32,
    /// Whether this run started the server.
    pub started: bool,
    /// The server's counters (`Content::record`).
    pub stats: PathBuf,
    /// The snapshot's packages and their archives (package → sha256), as the server wrote
    /// them.
    pub packages: std::collections::HashMap<String, String>,
    /// Top-level entries of installed packages, shown from the lib dir over the mount (set by
    /// the run: [`crate::snapshot::entries_from_lib`]).
    pub lib_entries: Vec<String>,
    /// Why root's run is served by FUSE instead of an image (for `--stats`).
    pub image_note: Option<String>,
    /// `fuse/users`, held shared while this run may show the mount: the server stays.
    pub(super) _users: Flock<std::fs::File>,
}

/// The mount of the realm's snapshot `key`, its server started if none serves it (and waited
/// for: its mount must exist before the jail is made, which copies the host's mounts). Runs
/// before the target is forked: starts a process, no thread.
pub fn attach(
    cache_root: &Path,
    realm_dir: &Path,
    key: &str,
    bucket: &str,
    fetch_timeout: f64,
) -> Result<FuseMount, LazyError> {
    let base = realm_dir.join("fuse");
    std::fs::create_dir_all(&base).map_err(io("create dir", &base))?;
    if let Some(cause) = super::unavailable() {
        return Err(LazyError::Command {
            command: "fusermount3".into(),
            cause,
        });
    }
    // Waits while a server that found itself idle unmounts and exits.
    let users = lock_file(&base.join("users"), FlockArg::LockShared)?;
    // One run at a time looks for a server and starts one.
    let _start = lock_file(&base.join("start"), FlockArg::LockExclusive)?;
    let shown = |server: u32, started: bool, users| FuseMount {
        mnt: mount_dir(&base, key, server),
        server,
        started,
        stats: stats_file(&base, key),
        packages: crate::snapshot::read_packages(&packages_file(&base, key)),
        lib_entries: Vec::new(),
        image_note: None,
        _users: users,
    };
    if let Some(pid) = serving(&base, key) {
        if is_fuse(&mount_dir(&base, key, pid)) {
            return Ok(shown(pid, false, users));
        }
    }
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| io("pipe", &base)(e.into()))?;
    let child = crate::fill::helper_process(FUSE_ARG0)
        .arg(cache_root)
        .arg(realm_dir)
        .arg(key)
        .arg(bucket)
        .arg(fetch_timeout.to_string())
        // Root's procs run as ids of their own: the mount must let other users in (the
        // modes, read-only, decide: as readable on the host as the realm's lib dir beside it).
        .arg(if nix::unistd::geteuid().is_root() {
            "others"
        } else {
            "owner"
        })
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(tx))
        .spawn()
        .map_err(io("start", Path::new(FUSE_ARG0)))?;
    let mut child = child;
    let pid = child.id();
    let line = read_line_within(rx, START_BOUND);
    let ready = line.as_deref() == Some("ready") && is_fuse(&mount_dir(&base, key, pid));
    if !ready {
        // It exits after its `err` line; any other is stopped (nothing in time, or a mount
        // that is not there).
        if !line.as_deref().is_some_and(|l| l.starts_with("err ")) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    // A server that is ready is not waited for: it outlives this run (reaped by init once
    // this process has exited).
    match line.as_deref() {
        Some("ready") if ready => Ok(shown(pid, true, users)),
        other => Err(LazyError::Command {
            command: FUSE_ARG0.into(),
            cause: match other {
                Some(l) => l.strip_prefix("err ").unwrap_or(l).to_owned(),
                None => format!("not mounted within {START_BOUND:?}"),
            },
        }),
    }
}

/// The first line on `rx`, waiting at most `bound` for it.
pub(super) fn read_line_within(rx: OwnedFd, bound: Duration) -> Option<String> {
    use std::os::fd::AsFd as _;
    let deadline = Instant::now() + bound;
    let mut got = Vec::new();
    let mut file = std::fs::File::from(rx);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [nix::poll::PollFd::new(
            file.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(
            &mut fds,
            nix::poll::PollTimeout::try_from(left).unwrap_or(nix::poll::PollTimeout::MAX),
        ) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
        let mut buf = [0u8; 512];
        let n = std::io::Read::read(&mut file, &mut buf).ok()?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.contains(&b'\n') || got.len() > 4096 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    text.lines().next().map(str::to_owned)
}
