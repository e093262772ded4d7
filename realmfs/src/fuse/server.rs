//! The server process's life: mount through fusermount3, start the unmounter, confine itself,
//! serve until idle.
#![forbid(unsafe_code)]

use super::content::Content;
use super::fs::RealmFs;
use super::paths::{fusermount, mount_dir, packages_file, stats_file, FUSE_ARG0, UNMOUNT_ARG0};
use super::tree::Tree;
use crate::snapshot::{io, lock_file, LazyError};
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchConfig, RealmCache};
use nix::fcntl::{Flock, FlockArg};
use std::ffi::OsStr;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long a server with no request and no run of its realm stays.
pub(super) const IDLE: Duration = Duration::from_secs(600);

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

pub(super) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What the server keeps for as long as it serves: its lock, and the write end of its
/// unmounter's pipe (closed only by its end).
pub(super) type Holds = (Flock<std::fs::File>, OwnedFd);

pub(super) fn start() -> Result<(fuser::Session<RealmFs>, Holds), LazyError> {
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
    let index = crate::snapshot::snapshot_index(realm_dir, &bucket)?;
    if crate::snapshot::key_of(&index) != key {
        return Err(bad("the realm's snapshot changed"));
    }
    let mtime = std::fs::metadata(realm_dir.join("index.json"))
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let tree = Tree::of(&index, mtime);
    fetcher::cache::write_renamed(
        &packages_file(&base, &key),
        crate::snapshot::packages_text(&index).as_bytes(),
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
    let bucket_dir = crate::confine::file_url_dir(&bucket);
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
pub(super) fn idle_exit(content: &Content, users: &Path) {
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
pub(super) fn mount(mnt: &Path, others: bool) -> Result<OwnedFd, LazyError> {
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
pub(super) fn receive_fd(sock: &std::os::unix::net::UnixStream) -> Option<OwnedFd> {
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
pub(super) fn spawn_unmounter(mnt: &Path) -> Result<OwnedFd, LazyError> {
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
pub(super) fn unmount(mnt: &Path) {
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
