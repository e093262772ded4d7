//! The lazy backend: a realm's libraries as a filesystem the kernel serves from the first touch.
//!
//! The realm's index snapshot is materialised as placeholders on a dedicated ext4 image
//! (`<realm>/lazy/<key>.img`, loop-mounted at `<realm>/lazy/<key>/`): every directory, every
//! file with its size and no data (sparse). Listing, `stat` and `importlib.metadata`'s directory
//! scans never leave the kernel and fetch nothing. The proc's own mount of the image (its
//! read-only bind at the prefix) carries a fanotify mount mark of its supervisor's pre-content
//! group (`FAN_OPEN_PERM` and `FAN_PRE_ACCESS`: open, read, mmap, execve, and
//! `lseek(SEEK_DATA)` after an open all wait): a first touch blocks the reader in the kernel
//! while [`FillServer`] makes sure the file's package is in the realm cache (the fetcher's single
//! flight and per-file sha256), copies the verified bytes into the placeholder (through the
//! image's root, in the kernel), allows the access and adds an ignore mark, after which that file
//! is ordinary page cache. Packages the realm has installed from the image's archives are shown
//! from its lib dir over their placeholders (a bind per top-level entry,
//! [`entries_from_lib`]): nothing installed is copied into the image. A realm once
//! complete is mounted from its lib dir and its images are detached and removed ([`retire`]).
//! A default run that finds no image made has it made by a process of its own, off its path,
//! for the next run ([`prepare_in_background`]), and is served meanwhile by the realm's FUSE
//! server ([`crate::fusefs`]; by notification where none can be had).
//! A fill that fails (store down, integrity) answers `FAN_DENY_ERRNO(EIO)`: an error, never
//! zeros. Files are identified by inode (the map is written when the image is materialised),
//! never by path.
//!
//! Exactly one process answers a reader's events: its own supervisor, whose mark is on that
//! proc's mount alone ([`LazyImage::watch`]); a reader is never unwatched while its supervisor
//! lives, and its jail dies with that supervisor. Supervisors of a realm that fill the same
//! file take turns (a lock on the placeholder), and the second finds it complete. Fills write
//! through the host mount, which no group watches. The end of a group (its marks destroyed: an
//! SRCU grace period, 5-15 ms) is left to a holder process that exits after the run, so no run
//! waits for it ([`hold`]).
//! Needs `CAP_SYS_ADMIN` in the initial namespace (mount, fanotify); without it the
//! notification path serves the realm.
#![forbid(unsafe_code)]

use fetcher::{Index, RealmCache};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags,
    Response,
};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// `FAN_PRE_ACCESS` (Linux 6.14; not in the libc headers of this toolchain).
const FAN_PRE_ACCESS: u64 = 0x0010_0000;

/// Errors of the lazy backend; the caller falls back to the notification path.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {cause}")]
    Command { command: String, cause: String },
    #[error("fanotify {op}: {source} (needs CAP_SYS_ADMIN and ext4)")]
    Fanotify {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
}

pub(crate) fn io<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LazyError + 'a {
    move |source| LazyError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// One placeholder: the file it stands for.
#[derive(Debug, Clone)]
struct Placeholder {
    /// Path under the lib dir (`numpy/__init__.py`).
    path: String,
    sha256: String,
    size: u64,
}

/// A materialised, mounted image of a realm's index snapshot.
pub struct LazyImage {
    /// Where the image is mounted on the host (the jail binds it read-only at the prefix).
    pub mnt: PathBuf,
    /// `BOOT_ID INODE` per completed file (see [`FillServer::start`]).
    filled_log: PathBuf,
    /// Inode number → placeholder, or where that map is kept (read by the fill server's
    /// thread, off the target's start).
    files: Files,
    /// The pre-content group (its mark is added by [`watch`](Self::watch)), and the mount's
    /// root ([`mark`]).
    group: (Fanotify, std::fs::File),
    /// Package → the archive its placeholders stand for (installed packages of that archive
    /// are shown from the lib dir instead: [`entries_from_lib`]).
    pub(crate) packages: HashMap<String, String>,
    /// Top-level entries shown from the realm's lib dir over the image
    /// ([`entries_from_lib`]).
    pub lib_entries: Vec<String>,
    /// The realm's `lazy-users`, locked shared for as long as this process serves the image.
    users: Flock<std::fs::File>,
}

enum Files {
    Made(HashMap<u64, Placeholder>),
    Map(PathBuf),
}

fn is_mounted(mnt: &Path) -> Result<bool, LazyError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io("read", Path::new("/proc/self/mountinfo")))?;
    let want = mnt.to_string_lossy();
    Ok(info
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_ref())))
}

fn command(cmd: &mut std::process::Command) -> Result<(), LazyError> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| LazyError::Command {
            command: format!("{cmd:?}"),
            cause: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(LazyError::Command {
        command: format!("{cmd:?}"),
        cause: String::from_utf8_lossy(&out.stderr)
            .lines()
            .next()
            .unwrap_or("no output")
            .to_owned(),
    })
}

impl LazyImage {
    /// The name of `index`'s image: its packages and their archives.
    pub fn key_of(index: &Index) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for p in index.packages().values() {
            (&p.name, &p.archive.sha256).hash(&mut h);
        }
        format!("{:016x}", h.finish())
    }

    /// The image named `key` ([`key_of`](Self::key_of)) under `realm_dir/lazy`: reused if it
    /// is mounted or was completely materialised before, else created from the index `index`
    /// loads (`mkfs.ext4`, loop mount, placeholders). One preparer per realm at a time (a lock).
    pub fn prepare_keyed(
        realm_dir: &Path,
        key: &str,
        index: impl FnOnce() -> Result<Index, LazyError>,
    ) -> Result<LazyImage, LazyError> {
        // Held (shared) while this run may show the image: no run of the realm once complete
        // retires it meanwhile ([`retire`]). Kept beside, not in, the dir a retire removes.
        let users = lock_file(&realm_dir.join("lazy-users"), FlockArg::LockShared)?;
        let base = realm_dir.join("lazy");
        std::fs::create_dir_all(&base).map_err(io("create dir", &base))?;
        let _lock = lock_file(&base.join("lock"), FlockArg::LockExclusive)?;
        let (img, mnt, map) = (
            base.join(format!("{key}.img")),
            base.join(key),
            base.join(format!("{key}.inodes.json")),
        );
        let complete = map.exists() && img.exists();
        let index = if complete { None } else { Some(index()?) };
        if let Some(index) = &index {
            if is_mounted(&mnt)? {
                command(std::process::Command::new("umount").arg(&mnt))?;
            }
            let _ = std::fs::remove_file(&img);
            let files: usize = index.packages().values().map(|p| p.files.len()).sum();
            let bytes: u64 = index.packages().values().map(|p| p.unpacked_size()).sum();
            // Data, one inode and a directory block per file, and slack; sparse until filled.
            let size = bytes
                .saturating_add((files as u64).saturating_mul(8192))
                .saturating_add(64 << 20);
            let f = std::fs::File::create(&img).map_err(io("create", &img))?;
            f.set_len(size).map_err(io("size", &img))?;
            drop(f);
            command(
                std::process::Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-N"])
                    .arg((files * 2 + 256).to_string())
                    .arg(&img),
            )
            .inspect_err(|_| {
                let _ = std::fs::remove_file(&img);
            })?;
        }
        if !is_mounted(&mnt)? {
            std::fs::create_dir_all(&mnt).map_err(io("create dir", &mnt))?;
            command(
                std::process::Command::new("mount")
                    .args(["-o", "loop,nosuid,nodev"])
                    .arg(&img)
                    .arg(&mnt),
            )?;
        }
        let packages_path = base.join(format!("{key}.packages"));
        let (files, packages) = if let Some(index) = &index {
            // mkfs's lost+found would be listed at the prefix (nothing here runs fsck).
            let _ = std::fs::remove_dir(mnt.join("lost+found"));
            let files = materialize(&mnt, index)?;
            // Which archive each package's placeholders stand for: a package installed from the
            // same archive is shown from the realm's lib dir instead (`entries_from_lib`).
            let packages: HashMap<String, String> = index
                .packages()
                .values()
                .map(|p| (p.name.clone(), p.archive.sha256.clone()))
                .collect();
            let text = packages_text(index);
            fetcher::cache::write_renamed(&packages_path, text.as_bytes()).map_err(|e| {
                LazyError::Io {
                    op: "write",
                    path: packages_path.clone(),
                    source: std::io::Error::other(e.to_string()),
                }
            })?;
            // Written last: its presence says the image is complete.
            let tmp = base.join(format!(".{key}.inodes.tmp"));
            let mut text = String::new();
            for (ino, p) in &files {
                text.push_str(&format!("{ino} {} {} {}\n", p.size, p.sha256, p.path));
            }
            std::fs::write(&tmp, text).map_err(io("write", &tmp))?;
            std::fs::rename(&tmp, &map).map_err(io("rename", &map))?;
            (Files::Made(files), packages)
        } else {
            // Missing (an image made by an older build): every package is filled into it.
            let packages = read_packages(&packages_path);
            (Files::Map(map), packages)
        };
        let filled_log = base.join(format!("{key}.filled"));
        if !complete {
            let _ = std::fs::remove_file(&filled_log);
        }
        let group = match mark(&mnt) {
            Ok(g) => g,
            Err(e) => {
                // No pre-content events here (an older kernel): nobody may see the placeholders.
                let _ = nix::mount::umount2(&mnt, nix::mount::MntFlags::MNT_DETACH);
                return Err(e);
            }
        };
        Ok(LazyImage {
            mnt,
            filled_log,
            files,
            group,
            packages,
            lib_entries: Vec::new(),
            users,
        })
    }

    /// Mark the proc's own mount of the image: `prefix` as process `pid` sees it (the jail's
    /// init, or the target itself without a jail), once its view is built and before its
    /// program runs. Only that proc's readers wait on this group and only this supervisor
    /// answers them; fills write through the host mount, which nobody watches; another
    /// supervisor of the realm watches its own proc's mount.
    pub fn watch(&self, pid: i32, prefix: &Path) -> Result<(), LazyError> {
        let (fan, root) = &self.group;
        let path = Path::new("/proc")
            .join(pid.to_string())
            .join("root")
            .join(prefix.strip_prefix("/").unwrap_or(prefix));
        // Set up by the jail (or the child) alone; the proc has not run yet.
        let seen = std::fs::File::open(&path).map_err(io("open", &path))?;
        let (a, b) = (
            seen.metadata().map_err(io("stat", &path))?,
            root.metadata().map_err(io("stat", &self.mnt))?,
        );
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(LazyError::Io {
                op: "watch",
                path,
                source: std::io::Error::other("not the image's root"),
            });
        }
        fan.mark(
            MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_MOUNT,
            mask(),
            &seen,
            None::<&Path>,
        )
        .map_err(|source| LazyError::Fanotify { op: "mark", source })
    }
}

/// The top-level entries of `installed` packages installed from the archive `packages` names
/// for them (package → archive sha256): shown from the realm's lib dir over a lazy view of the
/// snapshot. An entry is one normal name (the index checks them; checked again, as it names a
/// mount point).
pub fn entries_from_lib(
    packages: &HashMap<String, String>,
    installed: &[fetcher::InstalledPackage],
) -> Vec<String> {
    installed
        .iter()
        .filter(|p| packages.get(&p.name) == Some(&p.archive_sha256))
        .flat_map(|p| p.entries.iter())
        .filter(|e| one_name(e))
        .cloned()
        .collect()
}

/// `NAME SHA256` lines: a snapshot's packages and their archives.
pub fn packages_text(index: &Index) -> String {
    let mut text = String::new();
    for p in index.packages().values() {
        text.push_str(&format!("{} {}\n", p.name, p.archive.sha256));
    }
    text
}

/// [`packages_text`] read back (empty if unreadable).
pub fn read_packages(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(n, sha)| (n.to_owned(), sha.to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// argv[0] of the process that makes a realm's image off the run's path ([`prepare_main`],
/// started by [`prepare_in_background`]).
pub const PREP_ARG0: &str = "sigma-supervise-lazy-prepare";

/// Whether image `key` of the realm in `realm_dir` is complete and mounted: a run then shows it
/// at once ([`LazyImage::prepare_keyed`] has nothing to make).
pub fn image_ready(realm_dir: &Path, key: &str) -> bool {
    let base = realm_dir.join("lazy");
    if !base.join(format!("{key}.inodes.json")).exists() {
        return false;
    }
    // A mount root: statx, not a read of the mount table.
    let Ok(dir) = std::fs::File::open(base.join(key)) else {
        return false;
    };
    crate::sys::statx_fd(std::os::fd::AsFd::as_fd(&dir), 0, libc::STATX_TYPE)
        .is_ok_and(|st| notify::path::is_mount_root(&st))
}

/// Start making image `key` (`mkfs.ext4`, loop mount, placeholders) in a process of its own,
/// so that the run that found none is not the one that waits for it: served by the FUSE server
/// or by notification, it leaves the image to the next run. Nothing is started while another preparer holds the
/// realm's image lock (it is making one). Starts a thread (the reaper): only once the target
/// is forked.
pub fn prepare_in_background(
    cache_root: &Path,
    realm_dir: &Path,
    key: &str,
    bucket: &str,
) -> std::io::Result<()> {
    let base = realm_dir.join("lazy");
    std::fs::create_dir_all(&base)?;
    match lock_file(&base.join("lock"), FlockArg::LockExclusiveNonblock) {
        // Let go at once: the preparer takes it (a second preparer finds the image made).
        Ok(lock) => drop(lock),
        Err(_) => return Ok(()),
    }
    // Its stdin ends when this process exits: the sign that the run is over.
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = crate::fill::helper_process(PREP_ARG0)
        .arg(cache_root)
        .arg(realm_dir)
        .arg(key)
        .arg(bucket)
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::null())
        .spawn()?;
    // Closed by the kernel when this process exits.
    std::mem::forget(tx);
    // Reaped whenever it is done (or by init once this process has exited).
    std::thread::Builder::new()
        .name("sigma-lazy-prep-reap".into())
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        })?;
    Ok(())
}

/// How long the preparer waits for the run that started it to end before it starts anyway.
const PREP_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The preparer's whole life: wait for the run that started it to end (end of file on stdin;
/// at most [`PREP_AFTER`]), so its work (`mkfs.ext4`, the loop mount, a placeholder per file)
/// does not take a CPU from the run's program, then, in `SCHED_IDLE` where allowed, make the
/// image named on the command line (`CACHE_ROOT REALM_DIR KEY BUCKET`) from the realm's index
/// snapshot; where that fails, remember why in the realm's `lazy-unavailable` (as a run would).
/// Exit status 0 when the image is ready.
pub fn prepare_main() -> ! {
    use std::os::fd::AsFd as _;
    jail::close_fds_from(3);
    let stdin = std::io::stdin();
    let mut fds = [nix::poll::PollFd::new(
        stdin.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout =
        nix::poll::PollTimeout::try_from(PREP_AFTER).unwrap_or(nix::poll::PollTimeout::MAX);
    while let Err(nix::errno::Errno::EINTR) = nix::poll::poll(&mut fds, timeout) {}
    let _ = crate::sys::idle_process();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [_root, realm_dir, key, bucket] = args.as_slice() else {
        std::process::exit(2)
    };
    let (realm_dir, key) = (Path::new(realm_dir), key.to_string_lossy().into_owned());
    let bucket = bucket.to_string_lossy().into_owned();
    match LazyImage::prepare_keyed(realm_dir, &key, || snapshot_index(realm_dir, &bucket)) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            remember_unavailable(realm_dir, &e);
            std::process::exit(1)
        }
    }
}

/// The realm's index snapshot (`REALM_DIR/index.json`), which its image is made from.
pub fn snapshot_index(realm_dir: &Path, bucket: &str) -> Result<Index, LazyError> {
    let snapshot = realm_dir.join("index.json");
    std::fs::read(&snapshot)
        .ok()
        .and_then(|b| Index::from_json(bucket, &b).ok())
        .ok_or_else(|| LazyError::Io {
            op: "read",
            path: snapshot,
            source: std::io::ErrorKind::InvalidData.into(),
        })
}

/// Keep why no image could be made in the realm's `lazy-unavailable` (default runs do not
/// try again for a day).
pub fn remember_unavailable(realm_dir: &Path, e: &LazyError) {
    remember(&realm_dir.join("lazy-unavailable"), e);
}

/// Keep why a lazy backend could not be had in `marker`.
pub fn remember(marker: &Path, e: &LazyError) {
    let _ = fetcher::cache::write_renamed(marker, format!("{e}\n").as_bytes());
}

/// `e` is one normal path component (`numpy`, `six.py`): not empty, `.`, `..` or a path.
fn one_name(e: &str) -> bool {
    let mut c = Path::new(e).components();
    !e.contains('/')
        && matches!(
            (c.next(), c.next()),
            (Some(std::path::Component::Normal(_)), None)
        )
}

/// A pre-content group, and `mnt` opened. Made before the image is shown to anyone, so a
/// kernel without pre-content events (before 6.14) or a filesystem that refuses them is found
/// while the realm can still be served otherwise: a mount mark on `mnt` is added and removed
/// at once. The group's only lasting mark is on the proc's own mount of the image
/// ([`LazyImage::watch`]), made once that mount exists.
fn mark(mnt: &Path) -> Result<(Fanotify, std::fs::File), LazyError> {
    // Read-only event fds: the reader's path is a read-only bind.
    let fan = Fanotify::init(
        InitFlags::FAN_CLASS_PRE_CONTENT | InitFlags::FAN_CLOEXEC,
        EventFFlags::O_RDONLY | EventFFlags::O_LARGEFILE,
    )
    .map_err(|source| LazyError::Fanotify { op: "init", source })?;
    let root = std::fs::File::open(mnt).map_err(io("open", mnt))?;
    let probe = |flags| {
        fan.mark(
            flags | MarkFlags::FAN_MARK_MOUNT,
            mask(),
            &root,
            None::<&Path>,
        )
        .map_err(|source| LazyError::Fanotify { op: "mark", source })
    };
    probe(MarkFlags::FAN_MARK_ADD)?;
    probe(MarkFlags::FAN_MARK_REMOVE)?;
    Ok((fan, root))
}

/// Retire the images of a realm that is now completely installed (and so mounted from its lib
/// dir): each is detached, so nobody new sees it (a run still filling one keeps it through its
/// own descriptors), then `realm_dir/lazy` is removed, under the preparers' lock. Where a
/// detach fails nothing is removed (the image may still be mounted there).
pub fn retire(realm_dir: &Path) {
    let base = realm_dir.join("lazy");
    // The common case: no image was ever made for this realm.
    let Ok(entries) = std::fs::read_dir(&base) else {
        return;
    };
    // Not while any run may still show one of them (it holds `lazy-users` shared), nor wait
    // for them: a later start retires them.
    let Ok(users) = std::fs::File::open(realm_dir.join("lazy-users")) else {
        return;
    };
    let Ok(_users) = Flock::lock(users, FlockArg::LockExclusiveNonblock) else {
        return;
    };
    let Ok(lock_file) = std::fs::File::open(base.join("lock")) else {
        return;
    };
    let Ok(_lock) = Flock::lock(lock_file, FlockArg::LockExclusive) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH) {
            // EINVAL: not a mount point.
            Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
            Err(err) => {
                tracing::debug!(image = %e.path().display(), "image not retired: {err}");
                return;
            }
        }
    }
    if let Err(err) = std::fs::remove_dir_all(&base) {
        tracing::debug!(dir = %base.display(), "images not removed: {err}");
    }
}

/// `path` (created if missing: [`fetcher::cache::open_lock`]), locked `how`.
pub(crate) fn lock_file(path: &Path, how: FlockArg) -> Result<Flock<std::fs::File>, LazyError> {
    let file = fetcher::cache::open_lock(path).map_err(|e| LazyError::Io {
        op: "open",
        path: path.to_owned(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Flock::lock(file, how).map_err(|(_, e)| LazyError::Io {
        op: "flock",
        path: path.to_owned(),
        source: e.into(),
    })
}

/// Lines `INODE SIZE SHA256 PATH` (paths have no newline: index paths are checked).
fn parse_map(text: &str) -> Option<HashMap<u64, Placeholder>> {
    text.lines()
        .map(|l| {
            let mut it = l.splitn(4, ' ');
            let ino = it.next()?.parse().ok()?;
            let size = it.next()?.parse().ok()?;
            let sha256 = it.next()?.to_owned();
            let path = it.next()?.to_owned();
            Some((ino, Placeholder { path, sha256, size }))
        })
        .collect()
}

/// Create every directory and a sparse placeholder of the right size for every file.
fn materialize(mnt: &Path, index: &Index) -> Result<HashMap<u64, Placeholder>, LazyError> {
    let mut dirs = HashSet::new();
    let mut files = HashMap::new();
    for pkg in index.packages().values() {
        for f in &pkg.files {
            // Index paths are checked relative paths of normal components.
            let dst = mnt.join(&f.path);
            if let Some(d) = dst.parent() {
                if dirs.insert(d.to_owned()) {
                    std::fs::create_dir_all(d).map_err(io("create dir", d))?;
                }
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o444)
                .open(&dst)
                .map_err(io("create", &dst))?;
            file.set_len(f.size).map_err(io("size", &dst))?;
            let ino = file.metadata().map_err(io("stat", &dst))?.ino();
            files.insert(
                ino,
                Placeholder {
                    path: f.path.clone(),
                    sha256: f.sha256.clone(),
                    size: f.size,
                },
            );
        }
    }
    Ok(files)
}

/// Counters of one [`FillServer`].
#[derive(Debug, Default)]
pub struct FillStats {
    /// Files filled by this server.
    pub filled: AtomicU64,
    /// Bytes written into placeholders.
    pub bytes: AtomicU64,
    /// Accesses answered with an error.
    pub denied: AtomicU64,
    /// Events for files that were already complete.
    pub present: AtomicU64,
    /// Installs a fill waits for now (see `Server::fill`), and their end.
    installing: Mutex<usize>,
    installed: std::sync::Condvar,
}

impl FillStats {
    fn install_begins(&self) {
        *lock(&self.installing) += 1;
    }

    fn install_ends(&self) {
        let mut n = lock(&self.installing);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.installed.notify_all();
        }
    }

    /// Wait until no fill waits for an install, for at most `bound`.
    pub fn wait_installs(&self, bound: std::time::Duration) {
        let n = lock(&self.installing);
        let _ = self
            .installed
            .wait_timeout_while(n, bound, |n| *n > 0)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Answers the pre-content events of one mounted image: one thread reads events and answers
/// what needs no work; [`FILL_THREADS`] workers fill files (one fill per file, every reader of
/// that file waiting on it).
pub struct FillServer {
    pub stats: Arc<FillStats>,
}

/// Files filled at once.
const FILL_THREADS: usize = 4;

impl FillServer {
    /// Start answering the events of the image's group. `rt` runs the fetcher.
    ///
    /// The group and its mark were made with the image, before the target exists: its first
    /// touch already waits for an answer. Everything else (the image's map, the log of
    /// completed files, the workers) is set up by the event thread while the program loads.
    ///
    /// `jail_init`: a pidfd of the jail's init: leave the group's end to a holder process
    /// ([`spawn_holder`], [`hold`]) that lets go once the supervisor and that init are gone.
    /// Only for a jailed run (it waits for its init alone; without a jail the supervisor reaps
    /// every process it has, and would wait for the holder).
    pub fn start(
        image: LazyImage,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Handle,
        report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
        jail_init: Option<std::os::fd::OwnedFd>,
    ) -> Result<FillServer, LazyError> {
        let stats = Arc::new(FillStats::default());
        let counters = stats.clone();
        std::thread::Builder::new()
            .name("sigma-fanotify".into())
            .spawn(move || {
                let served = Server::new(image, cache, rt, counters, report);
                // Once the server can answer (events wait until then): the group's end (its
                // marks destroyed, an SRCU grace period, 5-15 ms) is left to a holder that
                // outlives this process, so the run's exit does not wait for it. Without one it
                // ends with the run, only later.
                if let Some(init) = jail_init {
                    let fan = match &served {
                        Ok((server, _)) => &server.fan,
                        Err((fan, _)) => fan,
                    };
                    if let Err(e) = spawn_holder(fan, init) {
                        tracing::debug!("the fanotify group ends with the run: {e}");
                    }
                }
                match served {
                    Ok((server, fills)) => server.run(fills),
                    Err((fan, e)) => {
                        // Nothing may read a placeholder's zeros: every first touch fails.
                        tracing::error!(
                            "lazy fills unavailable ({e}): reads of files not yet filled fail \
                             with EIO"
                        );
                        deny_all(&fan)
                    }
                }
            })
            .map_err(io("spawn", Path::new("sigma-fanotify")))?;
        Ok(FillServer { stats })
    }
}

/// argv[0] of the process that holds a run's fanotify group until the run has exited
/// ([`hold`], started by [`spawn_holder`]).
pub const HOLDER_ARG0: &str = "sigma-supervise-hold";

/// Start the holder of `fan`: this binary again, with a duplicate of the group as its stdout
/// and the read end of a pipe as its stdin whose write end only this process holds (until it
/// exits). No other descriptor reaches it (the spawn closes every close-on-exec one).
fn spawn_holder(fan: &Fanotify, init: std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let group = std::os::fd::AsFd::as_fd(fan).try_clone_to_owned()?;
    std::process::Command::new("/proc/self/exe")
        .arg0(HOLDER_ARG0)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::from(group))
        .stderr(std::process::Stdio::from(init))
        .spawn()?;
    // Closed by the kernel when this process exits: the holder's signal to let go.
    std::mem::forget(tx);
    Ok(())
}

/// The holder's whole life: wait for end of file on stdin (the supervisor has exited), then
/// for the jail's init (a pidfd on stderr) to be gone, then exit, which drops the group on
/// stdout. The group's end answers the events still pending in it with "allow", which would
/// show a waiting reader its placeholder's zeros: after a supervisor killed mid-fill, the jail
/// dies with it (init's parent-death signal, then the pid namespace), and only once its init
/// has exited is no reader left to see them. Whatever else the holder inherited from the
/// supervisor's own parent (descriptors that are not close-on-exec) is closed first: it holds
/// nobody's pipe.
pub fn hold() -> ! {
    use std::os::fd::AsFd as _;
    jail::close_fds_from(3);
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    // A pidfd polls readable once its process has exited.
    let init = std::io::stderr();
    let mut fds = [nix::poll::PollFd::new(
        init.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    while let Err(nix::errno::Errno::EINTR) =
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
    {}
    std::process::exit(0)
}

/// Answer every event with EIO (the server could not be set up).
fn deny_all(fan: &Fanotify) {
    loop {
        match fan.read_events() {
            Ok(events) => {
                for ev in events {
                    if let Some(fd) = ev.fd() {
                        let _ = fan.write_response(FanotifyResponse::new(fd, deny_eio()));
                    }
                }
            }
            Err(nix::errno::Errno::EBADF | nix::errno::Errno::EINVAL) => return,
            Err(_) => {}
        }
    }
}

impl Server {
    /// The server of `image`, with its workers started. On failure the group comes back.
    #[allow(clippy::type_complexity)]
    fn new(
        image: LazyImage,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Handle,
        stats: Arc<FillStats>,
        report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
    ) -> Result<(Arc<Server>, std::sync::mpsc::Sender<u64>), (Fanotify, LazyError)> {
        let LazyImage {
            mnt: _,
            filled_log,
            files,
            group: (fan, root),
            users,
            ..
        } = image;
        let files = match files {
            Files::Made(files) => files,
            Files::Map(map) => {
                match std::fs::read_to_string(&map)
                    .ok()
                    .and_then(|t| parse_map(&t))
                {
                    Some(files) => files,
                    None => {
                        // The next run materialises the image again.
                        let _ = std::fs::remove_file(&map);
                        let source = std::io::ErrorKind::InvalidData.into();
                        return Err((
                            fan,
                            LazyError::Io {
                                op: "read",
                                path: map,
                                source,
                            },
                        ));
                    }
                }
            }
        };
        // Files completed earlier in this boot: answered at once from `done`, and given ignore
        // marks (by path: a lookup, not an open) before events are read. After a crash of the
        // machine the log's boot id differs, and each file is verified by its hash on its
        // first touch instead.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|b| b.trim().to_owned())
            .unwrap_or_default();
        let mut done = HashSet::new();
        let mut ignores = Vec::new();
        for line in std::fs::read_to_string(&filled_log)
            .unwrap_or_default()
            .lines()
        {
            let Some((b, ino)) = line.split_once(' ') else {
                continue;
            };
            let Some(p) = ino
                .parse()
                .ok()
                .and_then(|i: u64| files.get(&i).map(|p| (i, p)))
            else {
                continue;
            };
            if b == boot && !boot.is_empty() && done.insert(p.0) {
                ignores.push(p.1.path.clone());
            }
        }
        for path in ignores {
            let _ = fan.mark(ignore_flags(), mask(), &root, Some(Path::new(&path)));
        }
        let log = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&filled_log)
        {
            Ok(log) => log,
            Err(e) => return Err((fan, io("open", &filled_log)(e))),
        };
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let server = Arc::new(Server {
            fan,
            root,
            _users: users,
            by_sha: files.iter().fold(HashMap::new(), |mut m, (ino, p)| {
                m.entry(p.sha256.clone())
                    .or_insert_with(Vec::new)
                    .push(*ino);
                m
            }),
            files,
            cache,
            rt,
            stats,
            done: Mutex::new(done),
            log: Mutex::new(log),
            boot,
            waiting: Mutex::new(HashMap::new()),
            report,
        });
        // Stream: a reader waiting for a file is released as soon as the unpacker has verified
        // that file, not when its whole package is installed.
        let weak = Arc::downgrade(&server);
        server
            .cache
            .set_file_hook(Arc::new(move |sha: &str, staged: &Path| {
                if let Some(server) = weak.upgrade() {
                    server.verified(sha, staged);
                }
            }));
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..FILL_THREADS {
            let (server, rx) = (server.clone(), rx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("sigma-fill-{i}"))
                .spawn(move || loop {
                    let next = lock(&rx).recv();
                    match next {
                        Ok(ino) => server.fill_and_answer(ino),
                        Err(_) => return,
                    }
                });
            if let Err(e) = spawned {
                // Fewer workers fill more slowly; with none the event thread fills.
                tracing::warn!("lazy fills: worker thread {i} not started: {e}");
            }
        }
        Ok((server, tx))
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts and removals: a panic cannot leave these inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An ignore mark for one file: no more events for it in this group.
fn ignore_flags() -> MarkFlags {
    MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_IGNORE | MarkFlags::FAN_MARK_IGNORED_SURV_MODIFY
}

fn mask() -> MaskFlags {
    MaskFlags::from_bits_retain(MaskFlags::FAN_OPEN_PERM.bits() | FAN_PRE_ACCESS)
}

/// FAN_DENY_ERRNO(EIO): the reader sees an I/O error, never zeros.
fn deny_eio() -> Response {
    Response::from_bits_retain(Response::FAN_DENY.bits() | ((libc::EIO as u32 & 0xff) << 24))
}

struct Server {
    fan: Fanotify,
    /// The image's mount, opened (fills write through it).
    root: std::fs::File,
    /// See [`LazyImage::users`].
    _users: Flock<std::fs::File>,
    files: HashMap<u64, Placeholder>,
    /// sha256 → the placeholders with that content.
    by_sha: HashMap<String, Vec<u64>>,
    cache: Arc<RealmCache>,
    rt: tokio::runtime::Handle,
    stats: Arc<FillStats>,
    /// Inodes known complete by this server.
    done: Mutex<HashSet<u64>>,
    /// Appends `BOOT_ID INODE` for every completed file.
    log: Mutex<std::fs::File>,
    boot: String,
    /// Inode being filled → the events (readers) waiting for it.
    waiting: Mutex<HashMap<u64, Vec<FanotifyEvent>>>,
    report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
}

/// Why a fill failed: the reader gets EIO either way.
enum FillError {
    Fetch(fetcher::FetchError),
    Local(std::io::Error),
}

impl Server {
    fn respond(&self, fd: BorrowedFd<'_>, response: Response) {
        if let Err(e) = self.fan.write_response(FanotifyResponse::new(fd, response)) {
            tracing::warn!(error = %e, "fanotify response failed");
        }
    }

    fn run(&self, fills: std::sync::mpsc::Sender<u64>) {
        let mut warned = false;
        loop {
            let events = match self.fan.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e @ (nix::errno::Errno::EBADF | nix::errno::Errno::EINVAL)) => {
                    tracing::error!(error = %e, "fanotify read failed; lazy fills stop");
                    return;
                }
                // One event whose fd could not be opened (the kernel denied it): go on.
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "fanotify event dropped");
                    }
                    continue;
                }
            };
            for ev in events {
                let Some(fd) = ev.fd() else { continue };
                let Ok(st) = nix::sys::stat::fstat(fd) else {
                    self.respond(fd, deny_eio());
                    continue;
                };
                let ino = st.st_ino;
                if !self.files.contains_key(&ino) || lock(&self.done).contains(&ino) {
                    // Not a placeholder (a directory, nothing else lives here) or complete.
                    self.respond(fd, Response::FAN_ALLOW);
                    continue;
                }
                let mut waiting = lock(&self.waiting);
                if let Some(w) = waiting.get_mut(&ino) {
                    w.push(ev);
                    continue;
                }
                waiting.insert(ino, vec![ev]);
                drop(waiting);
                if fills.send(ino).is_err() {
                    // No worker could be started: fill here, one file at a time.
                    self.fill_and_answer(ino);
                }
            }
        }
    }

    fn fill_and_answer(&self, ino: u64) {
        let Some(p) = self.files.get(&ino) else {
            return;
        };
        let result = self.fill(p, ino);
        self.finish(ino, p, result);
    }

    /// A file the unpacker just verified: fill the placeholders readers are waiting for.
    fn verified(&self, sha: &str, staged: &Path) {
        for &ino in self.by_sha.get(sha).into_iter().flatten() {
            if !lock(&self.waiting).contains_key(&ino) || lock(&self.done).contains(&ino) {
                continue;
            }
            let p = &self.files[&ino];
            // On failure the worker fills it from the CAS once the install ends.
            if self.fill_from(p, staged).is_ok() {
                self.finish(ino, p, Ok(()));
            }
        }
    }

    /// Record the outcome for `ino` and answer every reader waiting for it (once).
    fn finish(&self, ino: u64, p: &Placeholder, result: Result<(), FillError>) {
        if result.is_ok() && lock(&self.done).insert(ino) {
            use std::io::Write as _;
            // One short append (atomic for O_APPEND): concurrent supervisors interleave lines.
            let _ = lock(&self.log).write_all(format!("{} {ino}\n", self.boot).as_bytes());
        }
        let events = lock(&self.waiting).remove(&ino).unwrap_or_default();
        match result {
            Ok(()) => {
                // No more events for this file: from now on it is plain page cache.
                if let Some(fd) = events.first().and_then(FanotifyEvent::fd) {
                    if let Err(e) = self.fan.mark(ignore_flags(), mask(), fd, None::<&Path>) {
                        tracing::debug!(error = %e, "ignore mark");
                    }
                }
                for ev in &events {
                    if let Some(fd) = ev.fd() {
                        self.respond(fd, Response::FAN_ALLOW);
                    }
                }
            }
            Err(e) => {
                match e {
                    FillError::Fetch(e) => (self.report)(&e),
                    FillError::Local(e) => {
                        tracing::warn!(path = %p.path, error = %e, "lazy fill failed")
                    }
                }
                for ev in &events {
                    if let Some(fd) = ev.fd() {
                        self.stats.denied.fetch_add(1, Ordering::Relaxed);
                        self.respond(fd, deny_eio());
                    }
                }
            }
        }
    }

    /// The placeholder of `p`, opened through the image's root (not its host path: a run of
    /// the realm once complete detaches the mount while this one may still fill).
    fn open(&self, p: &Placeholder, flags: nix::fcntl::OFlag) -> std::io::Result<std::fs::File> {
        use nix::fcntl::OFlag;
        let fd = nix::fcntl::openat(
            &self.root,
            p.path.as_str(),
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        Ok(std::fs::File::from(fd))
    }

    fn fill(&self, p: &Placeholder, ino: u64) -> Result<(), FillError> {
        let file = self
            .open(p, nix::fcntl::OFlag::O_RDWR)
            .map_err(FillError::Local)?;
        // Filled by an earlier server (or another supervisor of the realm): verify, not refetch.
        if p.size == 0 || content_matches(&file, p).map_err(FillError::Local)? {
            self.stats.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let first = p.path.split('/').next().unwrap_or(&p.path);
        drop(file);
        // Counted while under way: the reader may be released (streamed) before it ends.
        self.stats.install_begins();
        let ensured = self.rt.block_on(self.cache.ensure(first));
        self.stats.install_ends();
        ensured.map_err(FillError::Fetch)?;
        if lock(&self.done).contains(&ino) {
            // Filled from the unpacker while the package streamed in.
            return Ok(());
        }
        // The CAS holds verified bytes (the fetcher hashed them against the index).
        self.fill_from(p, &self.cache.cas_path(&p.sha256))
            .map_err(FillError::Local)
    }

    /// Copy verified bytes from `src` into the placeholder (through the image's root), in the
    /// kernel (`sendfile`: the image and the store are different filesystems).
    /// Another supervisor of the realm may fill the same file for its own proc at the same
    /// time: one fill of a file at a time (a lock on the placeholder), and the second finds
    /// the file complete (its hash checked) and copies nothing.
    fn fill_from(&self, p: &Placeholder, src: &Path) -> std::io::Result<()> {
        use std::io::{Read as _, Seek as _};
        let src = std::fs::File::open(src)?;
        if src.metadata()?.len() != p.size {
            return Err(std::io::Error::other("verified file has another size"));
        }
        let mut file = self.open(p, nix::fcntl::OFlag::O_RDWR)?;
        file.lock()?;
        if content_matches(&file, p)? {
            self.stats.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        file.rewind()?;
        let n = std::io::copy(&mut src.take(p.size), &mut file)?;
        if n != p.size {
            return Err(std::io::Error::other(
                "verified file shrank while it was copied",
            ));
        }
        self.stats.filled.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// Whether `file` already holds the placeholder's bytes. A file without any data block is a
/// placeholder.
fn content_matches(file: &std::fs::File, p: &Placeholder) -> std::io::Result<bool> {
    use sha2::{Digest, Sha256};
    if file.metadata()?.blocks() == 0 {
        return Ok(false);
    }
    let mut h = Sha256::new();
    let n = std::io::copy(&mut &*file, &mut h)?;
    Ok(n == p.size && hex::encode(h.finalize()) == p.sha256)
}

#[cfg(test)]
mod tests {
    use super::one_name;

    #[test]
    fn only_single_names_become_mount_points() {
        for ok in ["numpy", "six.py", "numpy-2.1.3.dist-info", "..x"] {
            assert!(one_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/etc", "numpy/", "../lib", "./x"] {
            assert!(!one_name(bad), "{bad}");
        }
    }
}
