//! Installing one package into a realm's lib dir, its package lock held: undo what a killed
//! install left, take the archive's lock (one download per machine), then one of three ways:
//!
//! ```text
//! staged     GET ─▶ unpack into staging/<pkg>.<pid>.<rand>/tree ─▶ cas/ ─▶ journal
//!                   ─▶ rename each top-level entry into lib/ ─▶ marker
//! linked     (every file in cas/ already) links from cas/ into staging ─▶ journal ─▶ lib/ ─▶ marker
//! placed     (a Placement is set) skeleton into lib/ under the journal ─▶ GET, each file
//!            filled in place as it is verified ─▶ cas/ ─▶ marker
//! in memory  (a fill process given a memory tree) skeleton into the memory tree ─▶ GET,
//!            each file filled there as it is verified ─▶ then, behind the run, copied into
//!            staging ─▶ cas/ ─▶ journal ─▶ lib/ ─▶ marker (the staged install's steps)
//! delegated  (a Delegate too) the placed or in-memory install, run by another process
//! ```

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::delegate::Delegate;
use super::files::{for_each_in_parallel, remove_any, write_renamed};
use super::layout::{marker_path, pending_path, stored, Marker};
use super::locks::{flock_archive, lock};
use super::placement::{FileHook, Placement};
use super::recovery::{stamp_unsynced, undo_killed_install};
use super::stats::Counters;
use super::trees::{link_tree, make_dirs, make_subdirs};
use super::unpack::{link_into_cas, unpack_files, unpack_tree, Hooks};
use crate::config::FetchConfig;
use crate::error::{FetchError, IoContext, Result};
use crate::index::Package;
use crate::progress::Progress;
use crate::store::{next_chunk, Store};

/// What installs of one realm share: where they go, where they fetch from, what they count,
/// and whom they tell.
pub(super) struct Installer {
    pub(super) root: PathBuf,
    pub(super) realm_dir: PathBuf,
    pub(super) lib: PathBuf,
    pub(super) store: Arc<dyn Store>,
    pub(super) cfg: FetchConfig,
    pub(super) counters: Counters,
    /// `<root>/unsynced` names this boot (see the module docs of [`super`]).
    pub(super) stamped: AtomicBool,
    /// See [`super::RealmCache::set_file_hook`].
    pub(super) hook: Mutex<Option<Arc<FileHook>>>,
    /// See [`super::RealmCache::set_placement`].
    pub(super) placement: Mutex<Option<Arc<dyn Placement>>>,
    /// See [`super::RealmCache::set_delegate`].
    pub(super) delegate: Mutex<Option<Arc<dyn Delegate>>>,
}

impl Installer {
    pub(super) fn hook(&self) -> Option<Arc<FileHook>> {
        lock(&self.hook).clone()
    }

    /// Record that this boot has unflushed installs under the root (flushed once per boot).
    pub(super) fn stamp_unsynced(&self) -> Result<()> {
        if self.stamped.load(Ordering::Relaxed) {
            return Ok(());
        }
        stamp_unsynced(&self.root)?;
        self.stamped.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn marker_path(&self, pkg: &str) -> PathBuf {
        marker_path(&self.realm_dir, pkg)
    }

    /// A new staging directory of this install's own for `pkg` (removed by the caller).
    fn new_stage(&self, pkg: &Package) -> Result<PathBuf> {
        let stage = self.realm_dir.join("staging").join(format!(
            "{}.{}.{:08x}",
            pkg.name,
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir(&stage).ctx("create dir", &stage)?;
        Ok(stage)
    }

    pub(super) fn pending_path(&self, pkg: &str) -> PathBuf {
        pending_path(&self.realm_dir, pkg)
    }

    /// Called with the package lock held: undo what a killed install of `pkg` left.
    fn recover(&self, pkg: &str) -> Result<()> {
        undo_killed_install(&self.realm_dir, &self.lib, pkg)
    }

    /// Whether every file of `pkg` is in the shared content store already (no download needed).
    pub(super) fn in_store(&self, pkg: &Package) -> bool {
        stored(&self.root.join("cas"), pkg)
    }

    /// Install `pkg` with its lock `held`: in another process when a [`Delegate`] is set and
    /// the install downloads and streams (then the lock goes with it, see [`Delegate`]), else
    /// here. Returns the bytes downloaded (`None`: every file was already in the CAS) and
    /// whether the install was delegated.
    pub(super) async fn install_or_delegate(
        &self,
        pkg: &Package,
        held: nix::fcntl::Flock<std::fs::File>,
    ) -> Result<(Option<u64>, bool)> {
        // One stat per file of the package: asked once.
        let stored = self.in_store(pkg);
        let placement = lock(&self.placement).clone();
        let delegate = lock(&self.delegate).clone();
        let (Some(placement), Some(delegate), false) = (placement, delegate, stored) else {
            return self.install(pkg, stored).await.map(|n| (n, false));
        };
        let (pkg2, hook) = (pkg.clone(), self.hook());
        // Counted as this process's download from the start: it may end after this process.
        let c = &self.counters;
        c.gets.fetch_add(1, Ordering::Relaxed);
        c.packages_fetched.fetch_add(1, Ordering::Relaxed);
        // The lock is moved into the blocking task: whatever becomes of this future, it is
        // held until the delegate's process is done with the install.
        let (got, held) = tokio::task::spawn_blocking(move || {
            let got = delegate.install(&pkg2, &held, &placement, hook.as_ref());
            (got, held)
        })
        .await
        .map_err(|e| FetchError::invalid("delegate", e))?;
        // Not downloaded after all: failed, not started, or linked from the store (another
        // realm's download of the archive ended first).
        if !matches!(got, Some(Ok(n)) if n > 0) {
            c.gets.fetch_sub(1, Ordering::Relaxed);
            c.packages_fetched.fetch_sub(1, Ordering::Relaxed);
        }
        match got {
            Some(Ok(n)) => {
                c.bytes_fetched.fetch_add(n, Ordering::Relaxed);
                Ok((Some(n), true))
            }
            Some(Err(e)) => {
                // The process is gone; what it placed goes (the journal names it) while the
                // lock is still held.
                let _ = self.recover(&pkg.name);
                drop(held);
                Err(e)
            }
            None => self.install(pkg, stored).await.map(|n| (n, false)),
        }
    }

    /// Install `pkg` in this process (package lock held; `stored`: every file is in the CAS).
    /// Returns the bytes downloaded, or `None` if every file was already in the CAS.
    pub(super) async fn install(&self, pkg: &Package, mut stored: bool) -> Result<Option<u64>> {
        self.recover(&pkg.name)?;
        // One download of an archive machine-wide, whichever realms want it at once: the
        // archive's own lock (taken under the package's, never the other way round). Whoever
        // waited for it finds the content stored and only links.
        let _archive = if stored {
            None
        } else {
            let path = self
                .root
                .join("locks")
                .join(format!("{}.lock", pkg.archive.sha256));
            let (held, waited) = flock_archive(&path).await?;
            if waited {
                stored = self.in_store(pkg);
            }
            Some(held)
        };
        let stage = self.new_stage(pkg)?;
        let result = self.install_staged(pkg, &stage, stored).await;
        // Staging is private to this install; whatever happened, it goes.
        let _ = remove_any(&stage);
        result
    }

    async fn install_staged(
        &self,
        pkg: &Package,
        stage: &Path,
        stored: bool,
    ) -> Result<Option<u64>> {
        self.stamp_unsynced()?;
        let placement = lock(&self.placement).clone();
        if let (false, Some(placement)) = (stored, placement) {
            let result = self.install_in_place(pkg, stage, &placement).await;
            if result.is_err() {
                // What was placed goes again (the journal names it); a failure here is
                // cleaned by the next install's own recovery.
                let _ = self.recover(&pkg.name);
            }
            return result;
        }
        let mut downloaded = None;
        if !stored {
            downloaded = Some(self.fetch_unpacked(pkg, stage.join("tree")).await?);
            self.counters
                .packages_fetched
                .fetch_add(1, Ordering::Relaxed);
        }
        let (pkg2, root, stage2, lib) = (
            pkg.clone(),
            self.root.clone(),
            stage.to_owned(),
            self.lib.clone(),
        );
        let marker = self.marker_path(&pkg.name);
        let pending = self.pending_path(&pkg.name);
        tokio::task::spawn_blocking(move || {
            let tree = stage2.join("tree");
            if downloaded.is_none() {
                link_tree(&pkg2, &root, &tree)?;
            }
            move_into_lib(&pkg2, &tree, &lib, &pending)?;
            // Gone before the marker: a run killed after it leaves nothing in staging for a
            // later run to sweep (a complete realm is mounted without opening its cache).
            remove_any(&stage2)?;
            mark_installed(&pkg2, &marker, &pending)
        })
        .await
        .map_err(|e| FetchError::invalid("install", e))??;
        Ok(downloaded)
    }

    /// Download `pkg` straight into the lib dir (see [`set_placement`](super::RealmCache::set_placement)):
    /// the skeleton is placed under the journal, filled as the archive arrives, linked into the
    /// CAS once complete, then the marker is written. Errors are cleaned up by the caller.
    async fn install_in_place(
        &self,
        pkg: &Package,
        stage: &Path,
        placement: &Arc<dyn Placement>,
    ) -> Result<Option<u64>> {
        let place = Place {
            tree: self.lib.clone(),
            pending: Some(self.pending_path(&pkg.name)),
            placement: placement.clone(),
        };
        let n = self
            .fetch_unpacked_into(pkg, stage.join("tree"), Some(place))
            .await?;
        self.counters
            .packages_fetched
            .fetch_add(1, Ordering::Relaxed);
        // Gone before the marker, as in install_staged.
        remove_any(stage)?;
        mark_installed(
            pkg,
            &self.marker_path(&pkg.name),
            &self.pending_path(&pkg.name),
        )?;
        Ok(Some(n))
    }

    /// Install `pkg` through the memory tree `mem` (an empty directory on a tmpfs, private to
    /// this install; package lock held): its skeleton is placed there and each file filled and
    /// announced as it is verified, so a run is served from memory; only then, behind the run,
    /// is the package persisted as a staged install is (copied into staging, linked into the
    /// CAS, journaled, renamed into lib/, marked), crash-safe the same way. Nothing is written
    /// to lib/ before that, so a killed install leaves no placeholder there. The memory tree
    /// stays for its readers; removing it is the caller's. Returns the bytes downloaded (`None`:
    /// every file was in the CAS, and the package was linked from it instead).
    pub(super) async fn install_in_memory(
        &self,
        pkg: &Package,
        mem: &Path,
        placement: &Arc<dyn Placement>,
    ) -> Result<Option<u64>> {
        self.recover(&pkg.name)?;
        let path = self
            .root
            .join("locks")
            .join(format!("{}.lock", pkg.archive.sha256));
        let (held, waited) = flock_archive(&path).await?;
        if waited && self.in_store(pkg) {
            drop(held);
            return self.install(pkg, true).await;
        }
        self.stamp_unsynced()?;
        let place = Place {
            tree: mem.to_owned(),
            pending: None,
            placement: placement.clone(),
        };
        let n = self
            .fetch_unpacked_into(pkg, PathBuf::new(), Some(place))
            .await?;
        self.counters
            .packages_fetched
            .fetch_add(1, Ordering::Relaxed);
        let stage = self.new_stage(pkg)?;
        let (pkg2, root, mem2, stage2, lib) = (
            pkg.clone(),
            self.root.clone(),
            mem.to_owned(),
            stage.clone(),
            self.lib.clone(),
        );
        let (marker, pending) = (self.marker_path(&pkg.name), self.pending_path(&pkg.name));
        let placement = placement.clone();
        let persisted = tokio::task::spawn_blocking(move || {
            placement.before_persist(&pkg2);
            let tree = stage2.join("tree");
            copy_from_memory(&pkg2, &mem2, &tree)?;
            link_into_cas(&pkg2, &root, &tree, false)?;
            move_into_lib(&pkg2, &tree, &lib, &pending)?;
            // Gone before the marker, as in install_staged.
            remove_any(&stage2)?;
            mark_installed(&pkg2, &marker, &pending)
        })
        .await
        .map_err(|e| FetchError::invalid("persist", e))
        .and_then(|r| r);
        let _ = remove_any(&stage);
        if persisted.is_err() {
            // What was renamed into lib/ goes again (the journal names it).
            let _ = self.recover(&pkg.name);
        }
        drop(held);
        persisted.map(|()| Some(n))
    }

    /// GET the package archive and unpack it into `tree` as its bytes arrive: the body is fed
    /// through a bounded channel to a blocking thread that decompresses, verifies every file
    /// against the index and links it into the CAS ([`unpack_tree`]). The archive's size is
    /// checked; its content is judged by the files' hashes. Returns the bytes downloaded.
    async fn fetch_unpacked(&self, pkg: &Package, tree: PathBuf) -> Result<u64> {
        self.fetch_unpacked_into(pkg, tree, None).await
    }

    /// [`fetch_unpacked`](Self::fetch_unpacked), or with `place` the skeleton is built in
    /// `tree`, placed into the lib dir, and the files are filled there.
    async fn fetch_unpacked_into(
        &self,
        pkg: &Package,
        tree: PathBuf,
        place: Option<Place>,
    ) -> Result<u64> {
        let a = &pkg.archive;
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let obj = self.store.get(&a.key).await?;
        let mismatch = |got: String| FetchError::IntegrityMismatch {
            file: format!("{}/{}", self.store.name(), a.key),
            expected: format!("size {}", a.size),
            got,
        };
        if let Some(size) = obj.size {
            if size != a.size {
                return Err(mismatch(format!("size {size}")));
            }
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(32);
        let (pkg2, root, hook) = (pkg.clone(), self.root.clone(), self.hook());
        let unpack = tokio::task::spawn_blocking(move || {
            let reader = ChannelReader {
                rx,
                chunk: bytes::Bytes::new(),
            };
            match place {
                None => unpack_tree(&pkg2, reader, &root, &tree, hook.as_deref()),
                Some(place) => {
                    // The download fills the channel meanwhile.
                    match &place.pending {
                        Some(pending) => place_skeleton(&pkg2, &tree, &place.tree, pending)?,
                        None => {
                            make_subdirs(&pkg2, &place.tree)?;
                            create_placeholders(&pkg2, &place.tree)?;
                        }
                    }
                    place.placement.placed(&pkg2);
                    let past_trace = || place.placement.past_trace(&pkg2);
                    let hooks = Hooks {
                        on_verified: hook.as_deref(),
                        past_trace: Some(&past_trace),
                    };
                    unpack_files(&pkg2, reader, &place.tree, true, hooks)?;
                    // A memory tree reaches the store when it is persisted.
                    match place.pending {
                        Some(_) => link_into_cas(&pkg2, &root, &place.tree, true),
                        None => Ok(()),
                    }
                }
            }
        });
        let mut n = 0u64;
        let mut body = obj.body;
        let mut progress = Progress::new(
            self.cfg.progress,
            self.cfg.progress_after,
            &format!("fetch {}", pkg.name),
            a.size,
        );
        let download: Result<()> = async {
            while let Some(chunk) =
                next_chunk(self.store.name(), &mut body, self.cfg.read_timeout).await?
            {
                n += chunk.len() as u64;
                self.counters
                    .bytes_fetched
                    .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if n > a.size {
                    return Err(mismatch(format!("more than {} bytes", a.size)));
                }
                progress.advance(chunk.len() as u64);
                if tx.send(chunk).await.is_err() {
                    // The unpacker stopped (its error is the one to report).
                    break;
                }
            }
            Ok(())
        }
        .await;
        // End of input for the unpacker (on failure it sees a truncated archive and stops).
        drop(tx);
        let unpacked = unpack.await.map_err(|e| FetchError::invalid("unpack", e))?;
        download?;
        unpacked?;
        if n != a.size {
            return Err(mismatch(format!("size {n}")));
        }
        Ok(n)
    }
}

/// Where an install that streams places its skeleton and fills its files: the lib dir (its
/// entries journaled in `pending`), or a memory tree (`pending` is `None`: nothing in lib/
/// until the package is persisted).
struct Place {
    tree: PathBuf,
    pending: Option<PathBuf>,
    placement: Arc<dyn Placement>,
}

/// Build `pkg`'s skeleton in `tree` (every directory; every file empty, owner-writable until
/// filled), journal its top-level entries in `pending`, and rename them into `lib`.
fn place_skeleton(pkg: &Package, tree: &Path, lib: &Path, pending: &Path) -> Result<()> {
    make_dirs(pkg, tree)?;
    create_placeholders(pkg, tree)?;
    move_into_lib(pkg, tree, lib, pending)
}

/// Every file of `pkg` in `tree`, empty and owner-writable until filled (its directories made).
fn create_placeholders(pkg: &Package, tree: &Path) -> Result<()> {
    for_each_in_parallel(&pkg.files, |f| {
        let dst = tree.join(&f.path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&dst)
            .map(drop)
            .ctx("create", &dst)
    })
}

/// Copy `pkg`'s files, verified in the memory tree `mem`, into a new staged `tree` (read-only,
/// as an unpacked tree's), for [`link_into_cas`] and [`move_into_lib`].
fn copy_from_memory(pkg: &Package, mem: &Path, tree: &Path) -> Result<()> {
    make_dirs(pkg, tree)?;
    for_each_in_parallel(&pkg.files, |f| {
        let (src, dst) = (mem.join(&f.path), tree.join(&f.path));
        let mut from = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&src)
            .ctx("open", &src)?;
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&dst)
            .ctx("create", &dst)?;
        let n = std::io::copy(&mut from, &mut to).ctx("copy into", &dst)?;
        if n != f.size {
            return Err(FetchError::IntegrityMismatch {
                file: src.display().to_string(),
                expected: format!("size {}", f.size),
                got: format!("size {n}"),
            });
        }
        Ok(())
    })
}

/// `pkg` is complete in the lib dir: write its marker, then drop the journal of its entries.
fn mark_installed(pkg: &Package, marker: &Path, pending: &Path) -> Result<()> {
    let m = Marker {
        package: pkg.name.clone(),
        version: pkg.version.clone(),
        archive_sha256: pkg.archive.sha256.clone(),
        entries: pkg.top_level.clone(),
    };
    write_renamed(marker, &serde_json::to_vec_pretty(&m).unwrap_or_default())?;
    std::fs::remove_file(pending).ctx("remove", pending)
}

/// Journal `pkg`'s top-level entries in `pending`, then rename each from `tree` into `lib`
/// (a killed install's next recovery removes what the journal names).
fn move_into_lib(pkg: &Package, tree: &Path, lib: &Path, pending: &Path) -> Result<()> {
    write_renamed(
        pending,
        &serde_json::to_vec(&pkg.top_level).unwrap_or_default(),
    )?;
    for entry in &pkg.top_level {
        let dst = lib.join(entry);
        // Only a stale leftover can be here (no marker, lock held): replace it.
        remove_any(&dst)?;
        std::fs::rename(tree.join(entry), &dst).ctx("rename into", &dst)?;
    }
    Ok(())
}

/// The archive body as a blocking `Read`, for the unpacker's thread.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    chunk: bytes::Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(c) => self.chunk = c,
                None => return Ok(0),
            }
        }
        let k = buf.len().min(self.chunk.len());
        buf[..k].copy_from_slice(&self.chunk.split_to(k));
        Ok(k)
    }
}
