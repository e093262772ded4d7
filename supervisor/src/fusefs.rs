//! The rootless lazy backend: a realm's libraries as a FUSE filesystem, served by one process
//! per realm.
//!
//! Without `CAP_SYS_ADMIN` on the host there is no loop mount and no fanotify pre-content
//! group ([`crate::lazyfs`]). `/dev/fuse` is usually root's alone, but the setuid `fusermount3`
//! (fuse3) mounts a FUSE filesystem for an ordinary user on a directory of its own, and the
//! proc's jail (a user namespace of that user's) binds it read-only at the prefix. Root's realm
//! is served this way too where no image can be made (a kernel without pre-content events):
//! mounted `allow_other`, as root's procs run as ids of their own.
//!
//! The filesystem is the realm's index snapshot: every directory and every file with its size,
//! read-only, answered from memory (listing, `stat`, `importlib.metadata`'s scans fetch
//! nothing). A file's bytes come from the realm cache's store of verified content: a first read
//! of a file not there waits, off the request loop, while a worker makes sure its package is in
//! the realm cache (the fetcher's single flight and per-file sha256; released as soon as that
//! file is verified, not when the package is), then every waiting read is answered. A fetch
//! that fails answers EIO: an error, never zeros or a wrong byte.
//!
//! Packages the realm has installed from the snapshot's archives are shown from its lib dir
//! over the mount (a bind per top-level entry, as over the root's image): the server serves
//! only what is not installed yet, and a package it fetches is installed, so the runs after
//! its first touch read it from the lib dir. Through FUSE, every `ioctl` reaches the server
//! (Python's `open()` asks `isatty`, ~80 times in `import numpy`) and some mapped pages are
//! read again by each run: the lib dir is the faster path.
//!
//! The kernel keeps what it was told: entries and attributes for a year (a snapshot's names
//! and sizes never change; a new snapshot is a new mount), file pages across opens (`open` and
//! `flush` answered ENOSYS: the kernel stops asking and keeps its cache), directory listings
//! (`opendir` likewise). So a file is read through the server once per mount, and the mount
//! outlives runs: one server process per realm snapshot ([`FUSE_ARG0`], [`main`]), started by
//! the first run that needs it ([`attach`]) and gone, its mount with it, after [`IDLE`] without
//! requests and without a run of the realm (`fuse/users`, held shared by every run that shows
//! the mount). A reader of a server that died gets ENOTCONN, never zeros; its mount is removed
//! by its unmounter ([`unmounter_main`], started beside it once it has mounted), however the
//! server ended (the next server of the snapshot removes what an unmounter killed with it
//! left). Only the server's own user reaches the mount, and a proc reaches it only through its
//! jail's read-only bind.
//!
//! Everything the server is asked comes from procs, so once it has mounted and started its
//! unmounter it confines itself before it starts a thread ([`crate::confine`]): it writes
//! only in the cache, reads only what a fetch reads, and can run nothing.
//!
//! fusermount3 opens `/dev/fuse` as the calling user: the device must be `0666`, as udev makes
//! it on a distribution's machine (a machine without udev leaves it `0600`: then the run is
//! served by notification and `--stats` says why).
#![forbid(unsafe_code)]

use crate::lazyfs::{io, lock, lock_file, LazyError};
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchConfig, Index, RealmCache};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, Request,
};
use nix::fcntl::{Flock, FlockArg};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// argv[0] of a realm's FUSE server ([`main`], started by [`attach`]).
pub const FUSE_ARG0: &str = "sigma-supervise-fuse";

/// argv[0] of a server's unmounter ([`unmounter_main`]).
pub const UNMOUNT_ARG0: &str = "sigma-supervise-unmount";

/// How long a server with no request and no run of its realm stays.
const IDLE: Duration = Duration::from_secs(600);

/// How long a run waits for a server it started to be mounted.
const START_BOUND: Duration = Duration::from_secs(5);

/// Entries and attributes never change for one snapshot (a new one is a new mount).
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Files filled at once (each waits for its package's fetch).
const FILL_THREADS: usize = 4;

/// Where fuse3's setuid helper is installed.
const FUSERMOUNT: [&str; 3] = [
    "/usr/bin/fusermount3",
    "/bin/fusermount3",
    "/usr/local/bin/fusermount3",
];

/// A realm's FUSE mount as a run shows it: bound read-only at the prefix by the jail.
pub struct FuseMount {
    /// The mount on the host (`<realm>/fuse/<key>-<server's pid>`).
    pub mnt: PathBuf,
    /// The server's pid (for `--stats`).
    pub server: u32,
    /// Whether this run started the server.
    pub started: bool,
    /// The server's counters ([`Content::record`]).
    pub stats: PathBuf,
    /// The snapshot's packages and their archives (package → sha256), as the server wrote
    /// them.
    pub packages: std::collections::HashMap<String, String>,
    /// Top-level entries of installed packages, shown from the lib dir over the mount (set by
    /// the run: [`crate::lazyfs::entries_from_lib`]).
    pub lib_entries: Vec<String>,
    /// Why root's run is served by FUSE instead of an image (for `--stats`).
    pub image_note: Option<String>,
    /// `fuse/users`, held shared while this run may show the mount: the server stays.
    _users: Flock<std::fs::File>,
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
    if fusermount().is_none() {
        return Err(LazyError::Command {
            command: "fusermount3".into(),
            cause: "not installed (fuse3)".into(),
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
        packages: crate::lazyfs::read_packages(&packages_file(&base, key)),
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
fn read_line_within(rx: OwnedFd, bound: Duration) -> Option<String> {
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

/// Where server `pid` mounts snapshot `key`: a directory of its own, so the unmount of a
/// server that is gone (by its fusermount3, by path, whenever it gets to it) never meets the
/// mount of the next.
fn mount_dir(base: &Path, key: &str, pid: u32) -> PathBuf {
    base.join(format!("{key}-{pid}"))
}

/// The counters of the server of snapshot `key` ([`Content::record`]).
fn stats_file(base: &Path, key: &str) -> PathBuf {
    base.join(format!("{key}.stats"))
}

/// The packages of snapshot `key` ([`crate::lazyfs::packages_text`], written by its server).
fn packages_file(base: &Path, key: &str) -> PathBuf {
    base.join(format!("{key}.packages"))
}

/// The pid of the server of snapshot `key`, if one holds its lock.
fn serving(base: &Path, key: &str) -> Option<u32> {
    match lock_file(
        &base.join(format!("{key}.lock")),
        FlockArg::LockExclusiveNonblock,
    ) {
        // Nobody holds it: no server (let go at once).
        Ok(_) => None,
        Err(_) => std::fs::read_to_string(base.join(format!("{key}.pid")))
            .ok()
            .and_then(|p| p.trim().parse().ok()),
    }
}

/// Whether `mnt` is the root of a FUSE mount.
fn is_fuse(mnt: &Path) -> bool {
    nix::sys::statfs::statfs(mnt)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC)
}

fn fusermount() -> Option<&'static str> {
    FUSERMOUNT.into_iter().find(|p| Path::new(p).exists())
}

/// A server's whole life (argv: `CACHE_ROOT REALM_DIR KEY BUCKET FETCH_TIMEOUT owner|others`;
/// stdout a pipe to the run that started it, told `ready` once mounted or `err <why>`).
pub fn main() -> ! {
    // Nothing else of the supervisor's (its parent's descriptors) stays open here.
    jail::close_fds_from(3);
    // Our memory holds credentials, as the supervisor's does.
    let _ = nix::sys::prctl::set_dumpable(false);
    match start() {
        Ok((session, _holds)) => {
            say("ready");
            // The run that started us reads one line: let go of its pipe.
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = nix::unistd::dup2_stdout(null);
            }
            let mut session = session;
            if let Err(e) = session.run() {
                tracing::debug!("FUSE session ended: {e}");
            }
            std::process::exit(0)
        }
        Err(e) => {
            say(&format!("err {}", e.to_string().replace('\n', " ")));
            std::process::exit(1)
        }
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What the server keeps for as long as it serves: its lock, and the write end of its
/// unmounter's pipe (closed only by its end).
type Holds = (Flock<std::fs::File>, OwnedFd);

fn start() -> Result<(fuser::Session<RealmFs>, Holds), LazyError> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [root, realm_dir, key, bucket, timeout, who] = args.as_slice() else {
        return Err(LazyError::Command {
            command: FUSE_ARG0.into(),
            cause: "usage: CACHE_ROOT REALM_DIR KEY BUCKET FETCH_TIMEOUT owner|others".into(),
        });
    };
    let others = who == "others";
    let (root, realm_dir) = (Path::new(root), Path::new(realm_dir));
    let key = key.to_string_lossy().into_owned();
    let bucket = bucket.to_string_lossy().into_owned();
    let bad = |what: &str| LazyError::Command {
        command: FUSE_ARG0.into(),
        cause: what.to_owned(),
    };
    if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("bad key"));
    }
    let timeout = timeout
        .to_str()
        .and_then(|t| t.parse::<f64>().ok())
        .filter(|t| *t > 0.0 && *t < 3600.0)
        .ok_or_else(|| bad("bad fetch timeout"))?;
    let realm = realm_dir
        .file_name()
        .and_then(OsStr::to_str)
        .ok_or_else(|| bad("bad realm dir"))?
        .to_owned();
    let base = realm_dir.join("fuse");
    let held = lock_file(
        &base.join(format!("{key}.lock")),
        FlockArg::LockExclusiveNonblock,
    )
    .map_err(|_| bad("another server holds this snapshot's lock"))?;
    // What earlier servers of this snapshot left: the mount of one that was killed, empty
    // mount points.
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let ours = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&format!("{key}-")));
        if ours && std::fs::remove_dir(e.path()).is_err() {
            unmount(&e.path());
            let _ = std::fs::remove_dir(e.path());
        }
    }
    let mnt = mount_dir(&base, &key, std::process::id());
    std::fs::create_dir_all(&mnt).map_err(io("create dir", &mnt))?;
    let index = crate::lazyfs::snapshot_index(realm_dir, &bucket)?;
    if crate::lazyfs::LazyImage::key_of(&index) != key {
        return Err(bad("the realm's snapshot changed"));
    }
    let mtime = std::fs::metadata(realm_dir.join("index.json"))
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let tree = Tree::of(&index, mtime);
    fetcher::cache::write_renamed(
        &packages_file(&base, &key),
        crate::lazyfs::packages_text(&index).as_bytes(),
    )
    .map_err(|e| bad(&e.to_string()))?;
    let fd = mount(&mnt, others)?;
    // From here on, however this process ends, its unmounter removes the mount: nobody meets
    // a mount that no process answers for longer than that takes.
    let _unmounter = spawn_unmounter(&mnt).inspect_err(|_| {
        unmount(&mnt);
        let _ = std::fs::remove_dir(&mnt);
    })?;
    // Still one thread, and nothing more to start or mount: give up the rest (the fetch
    // runtime's threads and the workers inherit it).
    let bucket_dir = crate::container::file_url_dir(&bucket);
    let landlocked = crate::confine::confine(&[root, realm_dir], bucket_dir.as_slice())
        .map_err(|e| bad(&format!("confining the server: {e:#}")))?;
    if landlocked != crate::confine::Landlocked::Full {
        tracing::debug!("FUSE server: Landlock {landlocked:?}");
    }
    let cfg = FetchConfig {
        overall_timeout: Duration::from_secs_f64(timeout),
        ..FetchConfig::default()
    };
    let fetch_err = |e: fetcher::FetchError| bad(&e.to_string());
    let served = (|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sigma-fuse-fetch")
            .enable_all()
            .build()
            .map_err(io("start", Path::new("the fetch runtime")))?;
        let store: Arc<dyn fetcher::Store> =
            Arc::new(LazyStore::new(&bucket, &StoreOptions::default(), &cfg).map_err(fetch_err)?);
        let cache = RealmCache::open(root, &realm, store, cfg).map_err(fetch_err)?;
        let fs = RealmFs::start(tree, Arc::new(cache), rt, stats_file(&base, &key))?;
        fs.content.record();
        let pid_file = base.join(format!("{key}.pid"));
        fetcher::cache::write_renamed(&pid_file, format!("{}\n", std::process::id()).as_bytes())
            .map_err(|e| bad(&e.to_string()))?;
        let (idle, users) = (fs.content.clone(), base.join("users"));
        std::thread::Builder::new()
            .name("sigma-fuse-idle".into())
            .spawn(move || idle_exit(&idle, &users))
            .map_err(io("spawn", Path::new("sigma-fuse-idle")))?;
        Ok(fs)
    })();
    // On an error the mount goes with this process (its unmounter).
    let fs = served?;
    let acl = if others {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    let session = fuser::Session::from_fd(fs, fd, acl);
    Ok((session, (held, _unmounter)))
}

/// Exit once no request came for [`IDLE`] and no run of the realm shows the mount (`users`
/// taken exclusively: a run starting now waits for it, then starts a server of its own).
fn idle_exit(content: &Content, users: &Path) {
    loop {
        std::thread::sleep(IDLE / 8);
        if content.idle_for() < IDLE {
            continue;
        }
        if let Ok(_last) = lock_file(users, FlockArg::LockExclusiveNonblock) {
            // The unmounter removes the mount once this process is gone.
            std::process::exit(0)
        }
    }
}

/// Mount a FUSE filesystem at `mnt` through fusermount3: its `/dev/fuse` descriptor.
/// `others`: `allow_other` (root's procs run as ids of their own).
fn mount(mnt: &Path, others: bool) -> Result<OwnedFd, LazyError> {
    let helper = fusermount().ok_or_else(|| LazyError::Command {
        command: "fusermount3".into(),
        cause: "not installed".into(),
    })?;
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(io("socketpair", Path::new(helper)))?;
    // Inherited by fusermount3 alone: this process has no other thread yet.
    nix::fcntl::fcntl(
        &theirs,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| io("fcntl", Path::new(helper))(e.into()))?;
    let opts = format!(
        "ro,nodev,nosuid,default_permissions,fsname=sigma-realm,subtype=sigma-realm{}",
        if others { ",allow_other" } else { "" }
    );
    let child = std::process::Command::new(helper)
        .args(["-o", &opts, "--"])
        .arg(mnt)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io("start", Path::new(helper)))?;
    drop(theirs);
    let got = receive_fd(&ours);
    // fusermount3 exits once it has passed the descriptor (or failed).
    let out = child.wait_with_output().ok();
    match got {
        Some(fd) => Ok(fd),
        None => {
            let why = out
                .map(|o| String::from_utf8_lossy(&o.stderr).trim().replace('\n', " "))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "no descriptor received".into());
            Err(LazyError::Command {
                command: format!("{helper} {}", mnt.display()),
                cause: why,
            })
        }
    }
}

/// The descriptor fusermount3 sends (one byte with `SCM_RIGHTS`).
fn receive_fd(sock: &std::os::unix::net::UnixStream) -> Option<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    let mut got = None;
    for c in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // Owned at once, so extra ones close.
            for fd in fds.into_iter().map(crate::sys::received_fd) {
                got.get_or_insert(fd);
            }
        }
    }
    got
}

/// Start the unmounter of `mnt` ([`unmounter_main`]): the returned write end of its pipe must
/// stay open exactly as long as this server lives (it is close-on-exec, and this process
/// starts nothing after).
fn spawn_unmounter(mnt: &Path) -> Result<OwnedFd, LazyError> {
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io("pipe", mnt)(e.into()))?;
    crate::fill::helper_process(UNMOUNT_ARG0)
        .arg(mnt)
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(io("start", Path::new(UNMOUNT_ARG0)))?;
    Ok(tx)
}

/// A server's unmounter (argv: `MNT`; stdin the read end of a pipe only its server holds open):
/// waits until the server is gone, however it ended (idle, an error, a kill), then unmounts
/// its mount and removes the directory. fusermount3's own `auto_unmount` would do this, but
/// it cannot see a mount without `allow_other` (which needs `user_allow_other` in
/// `/etc/fuse.conf`), and the server itself can run nothing once confined.
pub fn unmounter_main() -> ! {
    jail::close_fds_from(3);
    // Until end of file (or an error): nothing is ever written to it.
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    if let Some(mnt) = std::env::args_os().nth(1).map(PathBuf::from) {
        // Whether it is still mounted cannot be asked of it (a mount whose server is gone
        // answers ENOTCONN): fusermount3 finds out.
        unmount(&mnt);
        let _ = std::fs::remove_dir(&mnt);
    }
    std::process::exit(0)
}

/// `fusermount3 -u -z mnt`: the mount of a server that is gone.
fn unmount(mnt: &Path) {
    if let Some(helper) = fusermount() {
        let _ = std::process::Command::new(helper)
            .args(["-u", "-z", "-q", "--"])
            .arg(mnt)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// One entry of the snapshot's tree; its inode number is its place in [`Tree::nodes`] plus one.
struct Node {
    parent: u64,
    kind: Kind,
}

enum Kind {
    Dir(BTreeMap<String, u64>),
    File {
        size: u64,
        sha256: String,
        /// The top-level entry it belongs to (`numpy`), which names its package.
        top: String,
    },
}

/// The snapshot's directories and files (the root is inode 1).
struct Tree {
    nodes: Vec<Node>,
    mtime: SystemTime,
    uid: u32,
    gid: u32,
}

impl Tree {
    fn of(index: &Index, mtime: SystemTime) -> Tree {
        let mut t = Tree {
            nodes: vec![Node {
                parent: 1,
                kind: Kind::Dir(BTreeMap::new()),
            }],
            mtime,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        };
        for pkg in index.packages().values() {
            for f in &pkg.files {
                // Index paths are checked relative paths of normal components.
                let parts: Vec<&str> = f.path.split('/').collect();
                let Some((name, dirs)) = parts.split_last() else {
                    continue;
                };
                let mut at = 1u64;
                let mut ok = true;
                for d in dirs {
                    match t.child_or_insert(at, d, || Kind::Dir(BTreeMap::new())) {
                        Some(ino) if matches!(t.node(ino).map(|n| &n.kind), Some(Kind::Dir(_))) => {
                            at = ino
                        }
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                }
                if ok {
                    let top = parts[0].to_owned();
                    let _ = t.child_or_insert(at, name, || Kind::File {
                        size: f.size,
                        sha256: f.sha256.clone(),
                        top,
                    });
                }
            }
        }
        t
    }

    fn node(&self, ino: u64) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i)
    }

    /// The child `name` of directory `dir`, made with `kind` if missing.
    fn child_or_insert(
        &mut self,
        dir: u64,
        name: &str,
        kind: impl FnOnce() -> Kind,
    ) -> Option<u64> {
        let next = self.nodes.len() as u64 + 1;
        let i = usize::try_from(dir.checked_sub(1)?).ok()?;
        let Kind::Dir(children) = &mut self.nodes.get_mut(i)?.kind else {
            return None;
        };
        if let Some(&ino) = children.get(name) {
            return Some(ino);
        }
        children.insert(name.to_owned(), next);
        self.nodes.push(Node {
            parent: dir,
            kind: kind(),
        });
        Some(next)
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.node(ino)?;
        let (kind, perm, size, nlink) = match &n.kind {
            Kind::Dir(_) => (FileType::Directory, 0o555, 0, 2),
            Kind::File { size, .. } => (FileType::RegularFile, 0o444, *size, 1),
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }
}

/// A read waiting for its file's content.
struct Pending {
    offset: u64,
    size: u32,
    reply: ReplyData,
}

/// What the request loop and the fill workers share.
struct Content {
    tree: Tree,
    cache: Arc<RealmCache>,
    rt: tokio::runtime::Runtime,
    /// Inode → its verified content, open.
    open: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    /// Inode being filled → the reads waiting for it.
    waiting: Mutex<HashMap<u64, Vec<Pending>>>,
    /// sha256 → the inodes with that content.
    by_sha: HashMap<String, Vec<u64>>,
    /// Top-level entries whose package a worker has been asked to install.
    installing: Mutex<std::collections::HashSet<String>>,
    /// Top-level entry → the workers installing its package now: a reader answered as soon as
    /// its file was verified may see its run end before the install does, and the counters
    /// then say so (`installing`) rather than show no fetch.
    in_flight: Mutex<HashMap<String, usize>>,
    /// sha256 → where the fetcher verified that content during an install still under way
    /// ([`verified`](Self::verified)); a path gone since (the install moved it) is looked up in
    /// the store instead.
    staged: Mutex<HashMap<String, PathBuf>>,
    born: Instant,
    /// Milliseconds after `born` of the last request.
    last: AtomicU64,
    /// Read requests (the kernel asks only for pages it does not have), files opened in the
    /// store (`waited`: of them, after a fetch), reads answered EIO.
    reads: AtomicU64,
    /// Other requests: lookups (`missed`: of names the snapshot lacks), getattrs, readdirs.
    lookups: AtomicU64,
    missed: AtomicU64,
    getattrs: AtomicU64,
    readdirs: AtomicU64,
    opened: AtomicU64,
    waited: AtomicU64,
    denied: AtomicU64,
    /// Where the counters are kept for the runs' `--stats` ([`record`](Self::record)).
    stats: Option<std::fs::File>,
}

impl Content {
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        self.born
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last.load(Ordering::Relaxed)))
    }

    /// The content of `sha` from the store, if it is there with `size` bytes (the store holds
    /// only verified bytes).
    fn stored(&self, sha: &str, size: u64) -> Option<Arc<std::fs::File>> {
        open_sized(&self.cache.cas_path(sha), size)
    }

    /// Fill `ino`: its package into the realm cache, then its content from the store.
    fn fill(&self, ino: u64) {
        let Some(Kind::File { size, sha256, top }) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        *lock(&self.in_flight).entry(top.clone()).or_default() += 1;
        let ensured = self.rt.block_on(self.cache.ensure(top));
        {
            let mut in_flight = lock(&self.in_flight);
            if let Some(n) = in_flight.get_mut(top) {
                *n -= 1;
                if *n == 0 {
                    in_flight.remove(top);
                }
            }
        }
        let got = match ensured {
            Ok(_) => self.stored(sha256, *size).ok_or_else(
                || tracing::warn!(sha = %sha256, "verified content missing from the store"),
            ),
            Err(e) => {
                tracing::warn!(entry = %top, "fetch failed: {e}");
                Err(())
            }
        };
        self.answer(ino, got);
    }

    /// A file the fetcher just verified (it may still be installing the rest of its package).
    /// Its path is kept for the reads that come later (the store has it only once the package
    /// is installed): under the lock of the waiting reads, so that a read either finds the
    /// path or is waiting when it is kept.
    fn verified(&self, sha: &str, path: &Path) {
        let waiting: Vec<u64> = {
            let w = lock(&self.waiting);
            lock(&self.staged).insert(sha.to_owned(), path.to_owned());
            self.by_sha
                .get(sha)
                .into_iter()
                .flatten()
                .copied()
                .filter(|ino| w.contains_key(ino))
                .collect()
        };
        for ino in waiting {
            if let Some(Kind::File { size, .. }) = self.tree.node(ino).map(|n| &n.kind) {
                if let Some(f) = open_sized(path, *size) {
                    self.answer(ino, Ok(f));
                }
            }
        }
    }

    /// Answer every read waiting for `ino` (once).
    fn answer(&self, ino: u64, got: Result<Arc<std::fs::File>, ()>) {
        if let Ok(f) = &got {
            let mut open = lock(&self.open);
            if let std::collections::hash_map::Entry::Vacant(e) = open.entry(ino) {
                e.insert(f.clone());
                self.opened.fetch_add(1, Ordering::Relaxed);
                self.waited.fetch_add(1, Ordering::Relaxed);
            }
        }
        let waiters = lock(&self.waiting).remove(&ino).unwrap_or_default();
        if got.is_err() {
            self.denied
                .fetch_add(waiters.len() as u64, Ordering::Relaxed);
        }
        // Counted before any reader is released: a run that ends right after its read finds
        // it counted.
        self.record();
        for w in waiters {
            match &got {
                Ok(f) => serve(f, self.size_of(ino), w.offset, w.size, w.reply),
                Err(()) => w.reply.error(libc::EIO),
            }
        }
    }

    /// Keep the counters where runs read them (a first touch's cost, never a cached read's).
    fn record(&self) {
        let c = self.cache.stats();
        let line = format!(
            "{} reads; {} lookups ({} missed), {} getattrs, {} readdirs; opened {} files ({} \
             after a fetch); denied {}; fetched {} packages ({} installing), {} bytes, {} GETs\n",
            self.reads.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
            self.missed.load(Ordering::Relaxed),
            self.getattrs.load(Ordering::Relaxed),
            self.readdirs.load(Ordering::Relaxed),
            self.opened.load(Ordering::Relaxed),
            self.waited.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
            c.packages_fetched,
            lock(&self.in_flight).len(),
            c.bytes_fetched,
            c.gets
        );
        if let Some(f) = &self.stats {
            // One small write in place, padded over the last (no new file per first touch).
            let _ = f.write_all_at(format!("{:<256}", line.trim_end()).as_bytes(), 0);
        }
    }

    fn size_of(&self, ino: u64) -> u64 {
        match self.tree.node(ino).map(|n| &n.kind) {
            Some(Kind::File { size, .. }) => *size,
            _ => 0,
        }
    }
}

fn open_sized(path: &Path, size: u64) -> Option<Arc<std::fs::File>> {
    let f = std::fs::File::open(path).ok()?;
    (f.metadata().ok()?.len() == size).then(|| Arc::new(f))
}

/// Reply with up to `size` bytes of `file` (of `len` bytes) from `offset`.
fn serve(file: &std::fs::File, len: u64, offset: u64, size: u32, reply: ReplyData) {
    let n = len.saturating_sub(offset).min(u64::from(size));
    // At most the kernel's request size (`size`, a u32 it bounds to its max read).
    let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return reply.error(libc::EIO),
        }
    }
    reply.data(&buf[..got]);
}

/// The filesystem the request loop calls.
struct RealmFs {
    content: Arc<Content>,
    fills: std::sync::mpsc::Sender<u64>,
}

impl RealmFs {
    fn start(
        tree: Tree,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Runtime,
        stats: PathBuf,
    ) -> Result<RealmFs, LazyError> {
        let mut by_sha: HashMap<String, Vec<u64>> = HashMap::new();
        for (i, n) in tree.nodes.iter().enumerate() {
            if let Kind::File { sha256, .. } = &n.kind {
                by_sha.entry(sha256.clone()).or_default().push(i as u64 + 1);
            }
        }
        let content = Arc::new(Content {
            tree,
            cache,
            rt,
            open: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            by_sha,
            installing: Mutex::new(std::collections::HashSet::new()),
            in_flight: Mutex::new(HashMap::new()),
            staged: Mutex::new(HashMap::new()),
            born: Instant::now(),
            last: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            getattrs: AtomicU64::new(0),
            readdirs: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            stats: std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&stats)
                .ok(),
        });
        // Stream: a read waiting for a file is answered as soon as the unpacker has verified
        // that file, not when its whole package is installed.
        let weak = Arc::downgrade(&content);
        content
            .cache
            .set_file_hook(Arc::new(move |sha: &str, path: &Path| {
                if let Some(c) = weak.upgrade() {
                    c.verified(sha, path);
                }
            }));
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..FILL_THREADS {
            let (c, rx) = (content.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("sigma-fuse-fill-{i}"))
                .spawn(move || loop {
                    let next = lock(&rx).recv();
                    match next {
                        Ok(ino) => c.fill(ino),
                        Err(_) => return,
                    }
                })
                .map_err(io("spawn", Path::new("sigma-fuse-fill")))?;
        }
        Ok(RealmFs { content, fills: tx })
    }
}

impl Filesystem for RealmFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // As much read-ahead as the kernel allows: a file is read through us once per mount.
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let c = &self.content;
        c.touch();
        c.lookups.fetch_add(1, Ordering::Relaxed);
        let found = match (c.tree.node(parent).map(|n| &n.kind), name.to_str()) {
            (Some(Kind::Dir(children)), Some(name)) => children.get(name).copied(),
            (Some(_), _) => None,
            (None, _) => return reply.error(libc::ENOENT),
        };
        match (found.and_then(|ino| c.tree.attr(ino)), c.tree.attr(1)) {
            (Some(attr), _) => reply.entry(&TTL, &attr, 0),
            // Node 0: "no such name" that the kernel keeps (a negative entry) for as long as
            // any other; an error would be asked again at every lookup.
            (None, Some(root)) => {
                c.missed.fetch_add(1, Ordering::Relaxed);
                reply.entry(&TTL, &FileAttr { ino: 0, ..root }, 0)
            }
            (None, None) => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        self.content.touch();
        self.content.getattrs.fetch_add(1, Ordering::Relaxed);
        match self.content.tree.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    /// ENOSYS: the kernel opens without asking from now on and keeps each file's pages.
    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }

    /// ENOSYS: likewise for directories, whose listings the kernel then keeps.
    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let c = &self.content;
        c.touch();
        c.reads.fetch_add(1, Ordering::Relaxed);
        let Some(Kind::File {
            size: len,
            sha256,
            top,
        }) = c.tree.node(ino).map(|n| &n.kind)
        else {
            return reply.error(libc::EISDIR);
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        if *len == 0 || offset >= *len {
            return reply.data(&[]);
        }
        let known = lock(&c.open).get(&ino).cloned();
        if let Some(f) = known.or_else(|| {
            let f = c.stored(sha256, *len)?;
            if lock(&c.open).insert(ino, f.clone()).is_none() {
                c.opened.fetch_add(1, Ordering::Relaxed);
                // In the store (another realm's download) but not installed in this realm:
                // installed now, off the loop (links from the store), so that the next runs
                // show it from the lib dir and ask the server nothing.
                if lock(&c.installing).insert(top.clone()) {
                    let _ = self.fills.send(ino);
                }
            }
            Some(f)
        }) {
            // The kernel asks only for pages it lacks: a first touch, never a cached read.
            // Counted before the reader is released (see `answer`).
            c.record();
            return serve(&f, *len, offset, size, reply);
        }
        let mut waiting = lock(&c.waiting);
        // Verified already by an install still under way: read where it was verified.
        let staged = lock(&c.staged).get(sha256).cloned();
        if let Some(f) = staged.and_then(|p| open_sized(&p, *len)) {
            drop(waiting);
            if lock(&c.open).insert(ino, f.clone()).is_none() {
                c.opened.fetch_add(1, Ordering::Relaxed);
            }
            c.record();
            return serve(&f, *len, offset, size, reply);
        }
        let first = !waiting.contains_key(&ino);
        waiting.entry(ino).or_default().push(Pending {
            offset,
            size,
            reply,
        });
        drop(waiting);
        if first && self.fills.send(ino).is_err() {
            c.answer(ino, Err(()));
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let c = &self.content;
        c.touch();
        c.readdirs.fetch_add(1, Ordering::Relaxed);
        let Some(node) = c.tree.node(ino) else {
            return reply.error(libc::ENOENT);
        };
        let Kind::Dir(children) = &node.kind else {
            return reply.error(libc::ENOTDIR);
        };
        let dots = [
            (ino, FileType::Directory, "."),
            (node.parent, FileType::Directory, ".."),
        ];
        let entries = dots.into_iter().chain(children.iter().map(|(name, &i)| {
            let kind = match c.tree.node(i).map(|n| &n.kind) {
                Some(Kind::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            (i, kind, name.as_str())
        }));
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (e_ino, kind, name)) in entries.enumerate().skip(skip) {
            if reply.add(e_ino, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
