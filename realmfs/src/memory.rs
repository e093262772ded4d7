//! Memory trees: a cold run's package streamed into a directory on a tmpfs, served from there
//! while it is persisted into the store behind the run (creating 1,431 names for numpy's
//! skeleton costs 100–350 ms on an ext4 with a busy journal, 6–9 ms on tmpfs).
//!
//! ```text
//! /dev/shm/sigma-supervise-<uid>/                  mode 0700, ours, a tmpfs
//!   <realm key>.<pkg>.<supervisor pid>.<n>/<entries>
//!                      one package's tree, laid out as lib/ (the key: a hash of the realm's
//!                      directory)
//! ```
//!
//! The supervisor makes a package's tree (empty), opens it as a read-only detached clone (a
//! [`Served`], recognised by its mount id) and hands its path to the package's fill process,
//! whose confinement lets it write there and nowhere else outside the cache root. The fill
//! process places the skeleton there and fills each file as it is verified
//! ([`fetcher::RealmCache::fill_in_memory`]); the target is served from the clone, never told
//! the path. Once the package is persisted (`ok`) and the run has ended, the fill process
//! empties the tree. The supervisor holds a shared `flock` on the tree's directory until it
//! exits ([`held_until_exit`]): a tree nobody holds so is a dead supervisor's, whatever pid
//! namespace it ran in (its pid in the name may name another process here, or none). Such a
//! tree is removed, empty, by any later cold or complete start, and with what it holds by one
//! of its realm's once no fill process holds its package's lock.
//!
//! Not used (today's path, the skeleton in lib/): no tmpfs at `/dev/shm`, a cache root on a
//! tmpfs itself (a copy in memory first would only add a copy), a package larger
//! than [`MEMORY_SHARE`] of the memory available or half the tmpfs's free space, or a clone
//! that cannot be made.
#![forbid(unsafe_code)]

use crate::serve::Served;
use fetcher::index::Package;
use sha2::Digest as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// The tmpfs memory trees live on.
pub const MEMORY_FS: &str = "/dev/shm";

/// The largest share of `MemAvailable` one package's unpacked files may take in a memory tree.
pub const MEMORY_SHARE: u64 = 4;

/// One realm's memory trees.
#[derive(Debug, Clone)]
pub struct MemoryRoot {
    /// This user's directory of memory trees (every realm's).
    pub dir: PathBuf,
    /// The realm's key, its trees' names' first part.
    key: String,
    /// The realm's `state/` (its packages' locks).
    state: PathBuf,
}

/// A package's memory tree, opened for serving.
pub struct MemoryTree {
    pub dir: PathBuf,
    pub served: Arc<Served>,
}

/// Tells memory trees of one supervisor apart.
static NEXT: AtomicU32 = AtomicU32::new(0);

impl MemoryRoot {
    /// The memory trees of the realm at `realm_dir` under `base` (normally [`MEMORY_FS`]),
    /// their directory made if needed; `None` (said at debug level) if `base` is no tmpfs, the
    /// realm is on one, or the directory is not this user's alone.
    pub fn for_realm(base: &Path, realm_dir: &Path) -> Option<MemoryRoot> {
        match Self::make(base, realm_dir) {
            Ok(r) => Some(r),
            Err(why) => {
                tracing::debug!("no memory trees: {why}");
                None
            }
        }
    }

    fn make(base: &Path, realm_dir: &Path) -> Result<MemoryRoot, String> {
        let tmpfs = |p: &Path| {
            nix::sys::statfs::statfs(p)
                .map(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        if !tmpfs(base)? {
            return Err(format!("{} is not a tmpfs", base.display()));
        }
        // A lib dir in memory already gains nothing from a copy in memory first.
        if tmpfs(realm_dir)? {
            return Err("the cache root is on a tmpfs itself".into());
        }
        let uid = nix::unistd::geteuid().as_raw();
        let root = MemoryRoot::of(base, realm_dir);
        private_dir(&root.dir, uid)?;
        root.sweep(None);
        Ok(root)
    }

    /// A new, empty memory tree for `pkg`, opened as a read-only clone served at `prefix`;
    /// `None` when the package is too large for memory now or the clone cannot be made.
    /// Called with the package's lock held: first removes what dead supervisors left of it.
    pub fn tree_for(&self, pkg: &Package, prefix: &Path) -> Option<MemoryTree> {
        self.sweep(Some(&pkg.name));
        let size = pkg.unpacked_size();
        let available = mem_available().unwrap_or(0) / MEMORY_SHARE;
        let free = nix::sys::statvfs::statvfs(&self.dir)
            .map(|s| s.blocks_available().saturating_mul(s.fragment_size()) / 2)
            .unwrap_or(0);
        if size > available.min(free) {
            tracing::debug!(package = %pkg.name, size, available, free, "too large for memory");
            return None;
        }
        let dir = self.dir.join(format!(
            "{}.{}.{}.{}",
            self.key,
            pkg.name,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| tracing::debug!(error = %e, "no memory tree"))
            .ok()?;
        if let Err(e) = held_until_exit(&dir) {
            tracing::debug!(error = %e, "memory tree not held: not used");
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        match Served::open(prefix.to_path_buf(), dir.clone()) {
            Ok(served) if served.mnt_id != 0 => Some(MemoryTree {
                dir,
                served: Arc::new(served),
            }),
            r => {
                tracing::debug!(error = ?r.err(), "memory tree not served");
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }

    /// Remove memory trees whose supervisor is dead (no run serves from them): empty ones, and
    /// those whose package no fill process holds (`held`: its lock is ours; others' are tried
    /// without waiting), for a fill process may still be persisting from one.
    fn sweep(&self, held: Option<&str>) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some((key, who, pid)) = name.to_str().and_then(owner_of) else {
                continue;
            };
            if pid == std::process::id() || is_held(&e.path()) {
                continue;
            }
            // An empty one, any realm's; one with files, only of this realm (its locks).
            if std::fs::remove_dir(e.path()).is_ok() || key != self.key {
                continue;
            }
            let free = held == Some(who) || {
                let lock = self.state.join(format!("{who}.lock"));
                std::fs::File::open(&lock).ok().is_some_and(|f| {
                    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
                })
            };
            if free {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

impl MemoryRoot {
    /// Where this user's memory trees of the realm at `realm_dir` are, under `base`.
    fn of(base: &Path, realm_dir: &Path) -> MemoryRoot {
        let uid = nix::unistd::geteuid().as_raw();
        let digest = sha2::Sha256::digest(realm_dir.as_os_str().as_encoded_bytes());
        MemoryRoot {
            dir: base.join(format!("sigma-supervise-{uid}")),
            key: hex::encode(&digest[..8]),
            state: realm_dir.join("state"),
        }
    }
}

/// Sweep what dead supervisors left in memory trees (see [`MemoryRoot`]), if this user has
/// any: a complete realm's start, which opens no cache.
pub fn retire(realm_dir: &Path) {
    let root = MemoryRoot::of(Path::new(MEMORY_FS), realm_dir);
    if std::fs::symlink_metadata(&root.dir).is_ok_and(|m| m.is_dir()) {
        root.sweep(None);
    }
}

/// The memory trees this process made, each held by a shared `flock` on its directory until
/// the process exits (a supervisor serves a tree for its whole run): the sweep's sign of life.
static HELD: Mutex<Vec<nix::fcntl::Flock<std::fs::File>>> = Mutex::new(Vec::new());

/// Hold `dir` (a new tree of ours) until this process exits. The descriptor is close-on-exec:
/// neither the target nor a fill process inherits it.
fn held_until_exit(dir: &Path) -> std::io::Result<()> {
    let f = std::fs::File::open(dir)?;
    let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(lock);
    Ok(())
}

/// Whether a live supervisor holds the tree at `dir`. A tree that cannot be opened is left
/// alone (held, as far as the sweep knows).
fn is_held(dir: &Path) -> bool {
    let Ok(f) = std::fs::File::open(dir) else {
        return true;
    };
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

/// `<key>.<pkg>.<pid>.<n>` → (key, pkg, pid).
fn owner_of(name: &str) -> Option<(&str, &str, u32)> {
    let (key, rest) = name.split_once('.')?;
    let (rest, n) = rest.rsplit_once('.')?;
    let (pkg, pid) = rest.rsplit_once('.')?;
    n.parse::<u32>().ok()?;
    Some((key, pkg, pid.parse().ok()?))
}

/// Empty the memory tree `dir` (a fill process's last step: the package is persisted and the
/// run that was served from it has ended). Its directory itself is left to [`MemoryRoot`]'s
/// sweep: the fill process may write beneath it only.
pub fn empty_tree(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let _ = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
            _ => std::fs::remove_file(&p),
        };
    }
}

/// `dir` exists, is a directory (not a link), is `uid`'s and no one else's (mode 0700).
fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != uid || m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is not a private directory of uid {uid}",
            dir.display()
        ));
    }
    Ok(())
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names_tell_their_package_and_supervisor() {
        assert_eq!(owner_of("k.numpy.123.0"), Some(("k", "numpy", 123)));
        assert_eq!(
            owner_of("k.zope.interface.77.5"),
            Some(("k", "zope.interface", 77))
        );
        assert_eq!(owner_of("k.numpy.x.0"), None);
        assert_eq!(owner_of("numpy.1.0"), None);
        assert_eq!(owner_of("numpy"), None);
    }

    #[test]
    fn only_a_tmpfs_holds_memory_trees_and_a_dead_supervisors_tree_is_swept() {
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        if nix::sys::statfs::statfs(disk.path())
            .is_ok_and(|s| s.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC)
        {
            assert!(MemoryRoot::for_realm(disk.path(), Path::new("/r")).is_none());
        }
        // A realm whose cache root is in memory already has none.
        let shm = tempfile::tempdir_in(MEMORY_FS);
        if let Ok(shm) = &shm {
            assert!(MemoryRoot::for_realm(Path::new(MEMORY_FS), shm.path()).is_none());
        }
        let Some(root) = MemoryRoot::for_realm(Path::new(MEMORY_FS), disk.path()) else {
            eprintln!("no tmpfs at {MEMORY_FS}, or the crate's directory is on one: skipped");
            return;
        };
        std::fs::create_dir_all(disk.path().join("state")).unwrap();
        let tree = |name: &str| root.dir.join(format!("{}.{name}", root.key));
        // A supervisor that no longer exists (pid_max is at most 2^22).
        let dead = tree("p.4194305.0");
        std::fs::create_dir_all(dead.join("p")).unwrap();
        std::fs::write(dead.join("p/x.py"), "x").unwrap();
        // Another package's, its lock held (a fill process persisting from it), then not.
        let other = tree("q.4194305.1");
        std::fs::create_dir_all(other.join("q")).unwrap();
        let lock = std::fs::File::create(disk.path().join("state/q.lock")).unwrap();
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let empty = tree("r.4194305.2");
        std::fs::create_dir_all(&empty).unwrap();
        // Another realm's: swept when empty, else left to that realm.
        let (elsewhere, elsewhere_empty) = (
            root.dir.join("0000000000000000.t.4194305.4"),
            root.dir.join("0000000000000000.u.4194305.5"),
        );
        std::fs::create_dir_all(elsewhere.join("t")).unwrap();
        std::fs::create_dir_all(&elsewhere_empty).unwrap();
        // A live supervisor's (this process's) stays, whatever it holds.
        let live = tree(&format!("s.{}.3", std::process::id()));
        std::fs::create_dir_all(live.join("s")).unwrap();
        // A live supervisor's in another pid namespace: its pid names no process here, but it
        // holds its trees, empty or not (and no fill process holds the package's lock).
        let (far, far_empty) = (tree("v.4194305.6"), tree("w.4194305.7"));
        std::fs::create_dir_all(far.join("v")).unwrap();
        std::fs::File::create(disk.path().join("state/v.lock")).unwrap();
        std::fs::create_dir_all(&far_empty).unwrap();
        let far_held: Vec<_> = [&far, &far_empty]
            .iter()
            .map(|d| {
                let f = std::fs::File::open(d).unwrap();
                nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockShared).unwrap()
            })
            .collect();
        root.sweep(Some("p"));
        assert!(far.exists() && far_empty.exists(), "held trees stay");
        assert!(!dead.exists());
        assert!(other.exists(), "a tree whose package's lock is held stays");
        assert!(!empty.exists());
        assert!(live.exists());
        assert!(elsewhere.exists());
        assert!(!elsewhere_empty.exists());
        drop(held);
        drop(far_held);
        root.sweep(None);
        assert!(!other.exists());
        assert!(
            !far_empty.exists() && !far.exists(),
            "let go: a dead supervisor's"
        );
        assert!(live.exists());
        for d in [live, elsewhere] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
