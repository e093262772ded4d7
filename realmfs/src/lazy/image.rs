//! The image: a realm's index snapshot made into placeholders on an ext4 image
//! (`<realm>/lazy/<key>.img`, loop-mounted at `<realm>/lazy/<key>/`), its pre-content group,
//! the mark on the proc's own mount of it, and its retirement once the realm is complete.
#![forbid(unsafe_code)]

use crate::snapshot::{io, lock_file, packages_text, read_packages, LazyError};
use fetcher::Index;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::fanotify::{EventFFlags, Fanotify, InitFlags, MarkFlags, MaskFlags};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `FAN_PRE_ACCESS` (Linux 6.14; not in the libc headers of this toolchain).
pub(super) const FAN_PRE_ACCESS: u64 = 0x0010_0000;

/// One placeholder: the file it stands for.
#[derive(Debug, Clone)]
pub(super) struct Placeholder {
    /// Path under the lib dir (`numpy/__init__.py`).
    pub(super) path: String,
    pub(super) sha256: String,
    pub(super) size: u64,
}

/// A materialised, mounted image of a realm's index snapshot.
pub struct LazyImage {
    /// Where the image is mounted on the host (the jail binds it read-only at the prefix).
    pub mnt: PathBuf,
    /// `BOOT_ID INODE` per completed file (see `FillServer::start`).
    pub(super) filled_log: PathBuf,
    /// Inode number → placeholder, or where that map is kept (read by the fill server's
    /// thread, off the target's start).
    pub(super) files: Files,
    /// The pre-content group (its mark is added by [`watch`](Self::watch)), and the mount's
    /// root ([`mark`]).
    pub(super) group: (Fanotify, std::fs::File),
    /// Package → the archive its placeholders stand for (installed packages of that archive
    /// are shown from the lib dir instead: [`entries_from_lib`](crate::snapshot::entries_from_lib)).
    pub(crate) packages: HashMap<String, String>,
    /// Top-level entries shown from the realm's lib dir over the image
    /// ([`entries_from_lib`](crate::snapshot::entries_from_lib)).
    pub lib_entries: Vec<String>,
    /// The realm's `lazy-users`, locked shared for as long as this process serves the image.
    pub(super) users: Flock<std::fs::File>,
}

pub(super) enum Files {
    Made(HashMap<u64, Placeholder>),
    Map(PathBuf),
}

pub(super) fn is_mounted(mnt: &Path) -> Result<bool, LazyError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io("read", Path::new("/proc/self/mountinfo")))?;
    let want = mnt.to_string_lossy();
    Ok(info
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_ref())))
}

pub(super) fn command(cmd: &mut std::process::Command) -> Result<(), LazyError> {
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
    /// The image named `key` ([`key_of`](crate::snapshot::key_of)) under `realm_dir/lazy`: reused if it
    /// is mounted or was completely materialised before, else created from the index `index`
    /// loads (`mkfs.ext4`, loop mount, placeholders). One preparer per realm at a time (a lock).
    pub fn prepare_keyed(
        realm_dir: &Path,
        key: &str,
        index: impl FnOnce() -> Result<Index, LazyError>,
    ) -> Result<LazyImage, LazyError> {
        Self::prepare_confined(realm_dir, key, index, || Ok(()))
    }

    /// [`prepare_keyed`](Self::prepare_keyed), calling `confine` once the image is mounted
    /// (`mkfs.ext4`, `mount` and `umount` are behind it) and before a placeholder is made from
    /// the index, which came from the bucket.
    pub fn prepare_confined(
        realm_dir: &Path,
        key: &str,
        index: impl FnOnce() -> Result<Index, LazyError>,
        confine: impl FnOnce() -> Result<(), LazyError>,
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
        confine()?;
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

/// A pre-content group, and `mnt` opened. Made before the image is shown to anyone, so a
/// kernel without pre-content events (before 6.14) or a filesystem that refuses them is found
/// while the realm can still be served otherwise: a mount mark on `mnt` is added and removed
/// at once. The group's only lasting mark is on the proc's own mount of the image
/// ([`LazyImage::watch`]), made once that mount exists.
pub(super) fn mark(mnt: &Path) -> Result<(Fanotify, std::fs::File), LazyError> {
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

pub(super) fn mask() -> MaskFlags {
    MaskFlags::from_bits_retain(MaskFlags::FAN_OPEN_PERM.bits() | FAN_PRE_ACCESS)
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

/// Lines `INODE SIZE SHA256 PATH` (paths have no newline: index paths are checked).
pub(super) fn parse_map(text: &str) -> Option<HashMap<u64, Placeholder>> {
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
pub(super) fn materialize(
    mnt: &Path,
    index: &Index,
) -> Result<HashMap<u64, Placeholder>, LazyError> {
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
