//! The realm cache: packages installed lazily, verified, once, into a per-realm lib dir.
//!
//! ```text
//! <root>/cas/<sha256>                         every verified file, read-only, stored once
//! <root>/trees/<archive-sha256>/<entries>     one package's tree, shared by realms (links)
//! <root>/locks/<archive-sha256>.lock          flock: one download of an archive per machine
//! <root>/unsynced                             boot id under which unflushed installs happened
//! <root>/realms/<realm>/lib/<entries>         what the target sees (hard links into cas/)
//! <root>/realms/<realm>/index.json            the realm's snapshot of the bucket index
//! <root>/realms/<realm>/state/<pkg>.installed marker: the package is complete
//! <root>/realms/<realm>/state/<pkg>.pending   entries being renamed into lib/ (crash journal)
//! <root>/realms/<realm>/state/<pkg>.lock      flock: one installer per package per machine
//! <root>/realms/<realm>/staging/<pkg>.<pid>.<rand>/   the staged tree
//! ```
//!
//! Install: stream the archive from the store straight into the decompressor (no archive file,
//! no archive hash: its size is checked, and every file it holds is hashed once against the
//! index) → unpack into a staged tree → link each file into `cas/` → journal → rename each
//! top-level entry into `lib/` → write the marker. A killed install leaves only staging files
//! and possibly a journal; both are cleaned (and journaled entries removed) before the next
//! install of that package.
//!
//! Durability is off the critical path: nothing is flushed before a reader is released. A
//! file is valid because its hash matches, and the page cache survives a killed process, so
//! only a crash of the machine can lose writes. Before its first unflushed write in a boot, an
//! installer records the boot id in `<root>/unsynced` (flushed, once per boot). Opening a cache
//! whose stamp names another boot re-hashes every `cas/` file, drops the bad ones and the
//! markers of packages whose files are no longer all there, then flushes and removes the stamp:
//! a crash leaves at worst a package to fetch again, never a wrong byte.
//!
//! Single flight: an in-process async mutex per package, then an exclusive `flock` on the
//! package's lock file (other processes and supervisors), then a re-check of the marker. Tasks
//! that waited for an install that failed get its error instead of trying again at once.
//!
//! How a request travels through this module's files (each imports only those below it):
//!
//! ```text
//! mod.rs       RealmCache: the realm's index snapshot; ensure(name) → installed? → single
//!   │          flight (in-process gate, then locks.rs) → install; prefetch; fill (a delegate)
//!   ▼
//! install.rs   one package: undo a killed install (recovery.rs), the archive's lock, then
//!   │          staged / linked / placed (Placement, FileHook) / delegated (Delegate) → marker
//!   ▼
//! unpack.rs    archive bytes → decode → check each entry → workers hash, write, announce → cas/
//!   ▼
//! trees.rs     a package's shared tree from cas/; realm_trees: a realm shown from trees
//! status.rs    realm_complete, installed_packages: local files only, for a warm start
//! recovery.rs  the boot stamp and the check after a crash; a dead install's leftovers
//! layout.rs    names on disk;  files.rs  write-by-rename, remove, flush;  locks.rs  flock;
//! stats.rs     counters;  placement.rs, delegate.rs  what an install tells, who runs it
//! ```

mod delegate;
mod files;
mod install;
mod layout;
mod locks;
mod placement;
mod recovery;
mod stats;
mod status;
mod trees;
mod unpack;

pub use delegate::Delegate;
pub use files::{identity, write_renamed};
pub use layout::{default_cache_root, default_cache_root_if_home, tree_dir};
pub use locks::open_lock;
pub use placement::{FileHook, Placement};
pub use stats::CacheStats;
pub use status::{installed_packages, realm_complete, InstalledPackage};
pub use trees::{ensure_tree, realm_trees, realm_trees_of, TreeEntry, TreeView, MAX_TREE_ENTRIES};

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::FetchConfig;
use crate::error::{FetchError, IoContext, Result};
use crate::index::{Index, Package, INDEX_KEY};
use crate::store::{get_bytes, Store};
use files::persist_first;
use install::Installer;
use layout::check_realm;
use locks::{flock, lock};
use recovery::{recover_after_crash, sweep_dead_staging};
use stats::Counters;

/// What [`RealmCache::ensure`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureOutcome {
    /// Normalised distribution name of the package that provides the name.
    pub package: String,
    /// The lib-dir entry for the requested name (`<lib>/numpy`, `<lib>/six.py`); for a name
    /// that is not itself an entry (e.g. `numpy.core`), the package's first entry.
    pub dir: PathBuf,
    /// True if this call downloaded the package (false: it was installed already, possibly by
    /// another task or process, or every file was already in the shared CAS).
    pub fetched: bool,
    /// True if this call installed the package into the realm (downloaded or linked from CAS).
    pub installed: bool,
    /// Bytes downloaded by this call.
    pub bytes: u64,
    /// Cache tag of the bytecode the package ships (see [`crate::index::Package::bytecode`]).
    pub bytecode: Option<String>,
}

/// One realm's view of the library bucket, installed on demand under a shared cache root.
pub struct RealmCache {
    realm: String,
    index: tokio::sync::OnceCell<Arc<Index>>,
    /// Packages known complete in this realm.
    installed: Mutex<HashSet<String>>,
    /// One async mutex per package: tasks of this process install one at a time.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The last failed install of each package and when it ended: tasks that waited for it
    /// get its error instead of a second bounded wait.
    failures: Mutex<HashMap<String, (Instant, FetchError)>>,
    /// Where installs go, what they fetch from, count and tell.
    installer: Installer,
}

impl std::fmt::Debug for RealmCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealmCache")
            .field("root", &self.installer.root)
            .field("realm", &self.realm)
            .field("store", &self.installer.store.name())
            .finish()
    }
}

impl RealmCache {
    /// Open (creating if needed) the realm `realm` under the cache root `root`, backed by
    /// `store`. Removes staging leftovers of processes that no longer exist. No network access.
    pub fn open(
        root: impl Into<PathBuf>,
        realm: &str,
        store: Arc<dyn Store>,
        cfg: FetchConfig,
    ) -> Result<RealmCache> {
        check_realm(realm)?;
        let root = root.into();
        let realm_dir = root.join("realms").join(realm);
        let lib = realm_dir.join("lib");
        for d in [
            root.join("cas"),
            root.join("locks"),
            lib.clone(),
            realm_dir.join("state"),
            realm_dir.join("staging"),
        ] {
            std::fs::create_dir_all(&d).ctx("create dir", &d)?;
        }
        let cache = RealmCache {
            realm: realm.to_owned(),
            index: tokio::sync::OnceCell::new(),
            installed: Mutex::new(HashSet::new()),
            inflight: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            installer: Installer {
                root,
                realm_dir,
                lib,
                store,
                cfg,
                counters: Counters::default(),
                stamped: AtomicBool::new(false),
                hook: Mutex::new(None),
                placement: Mutex::new(None),
                delegate: Mutex::new(None),
            },
        };
        recover_after_crash(&cache.installer.root)?;
        sweep_dead_staging(&cache.installer.realm_dir)?;
        Ok(cache)
    }

    /// The realm's lib dir (what the supervisor serves to the target).
    pub fn lib_dir(&self) -> PathBuf {
        self.installer.lib.clone()
    }

    /// The realm name.
    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// The store this realm fetches from.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.installer.store
    }

    /// Counters of this cache object.
    pub fn stats(&self) -> CacheStats {
        self.installer.counters.snapshot()
    }

    /// The realm's index. The first call in a realm downloads the bucket's index and keeps it
    /// as the realm's snapshot (`index.json`, first writer wins), so every process of a realm
    /// sees the same set of packages and a warm realm needs no network at all.
    pub async fn index(&self) -> Result<Arc<Index>> {
        self.index
            .get_or_try_init(|| async {
                let path = self.installer.realm_dir.join("index.json");
                match std::fs::read(&path) {
                    Ok(data) => {
                        return Ok(Arc::new(Index::from_json(
                            self.installer.store.name(),
                            &data,
                        )?))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(FetchError::io("read", path, e)),
                }
                self.installer.counters.gets.fetch_add(1, Ordering::Relaxed);
                let data = get_bytes(
                    self.installer.store.as_ref(),
                    INDEX_KEY,
                    &self.installer.cfg,
                )
                .await?;
                self.installer
                    .counters
                    .bytes_fetched
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                let parsed = Index::from_json(self.installer.store.name(), &data)?;
                self.installer.stamp_unsynced()?;
                let kept = persist_first(&path, &data)?;
                if kept == data {
                    return Ok(Arc::new(parsed));
                }
                // Another process of the realm took its snapshot first: that one is the realm's.
                Ok(Arc::new(Index::from_json(
                    self.installer.store.name(),
                    &kept,
                )?))
            })
            .await
            .cloned()
    }

    /// Package `name` of the realm's index snapshot, parsed alone (see
    /// [`Index::package_from_json`]): for a fill process, which installs one package of a
    /// snapshot another process took. `None` without a snapshot or without that package.
    pub fn snapshot_package(&self, name: &str) -> Result<Option<Package>> {
        let path = self.installer.realm_dir.join("index.json");
        match std::fs::read(&path) {
            Ok(data) => Index::package_from_json(self.installer.store.name(), &data, name),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FetchError::io("read", path, e)),
        }
    }

    /// Make sure the package providing `name` (an import name such as `numpy` or `numpy.core`,
    /// or a top-level entry such as `six.py`, `numpy.libs`, `numpy-2.1.3.dist-info`) is installed
    /// and verified in this realm. Exactly one download happens machine-wide for concurrent
    /// first calls.
    pub async fn ensure(&self, name: &str) -> Result<EnsureOutcome> {
        let index = self.index().await?;
        let pkg = index
            .package_for_name(name)
            .ok_or_else(|| FetchError::NoSuchPackage {
                bucket: self.installer.store.name().to_owned(),
                name: name.to_owned(),
            })?;
        let first = name.split('.').next().unwrap_or(name);
        let entry = pkg
            .top_level
            .iter()
            .find(|e| *e == name)
            .or_else(|| {
                pkg.top_level.iter().find(|e| {
                    let is_dir = pkg
                        .files
                        .iter()
                        .any(|f| f.path.starts_with(&format!("{e}/")));
                    crate::index::import_name_of(e, is_dir) == Some(first)
                })
            })
            .unwrap_or(&pkg.top_level[0]);
        self.ensure_package(pkg, self.installer.lib.join(entry))
            .await
    }

    /// Install `pkg` unless it is installed; `dir` is reported back in the outcome.
    async fn ensure_package(&self, pkg: &Package, dir: PathBuf) -> Result<EnsureOutcome> {
        let hit = |cache: &Self| {
            cache
                .installer
                .counters
                .cache_hits
                .fetch_add(1, Ordering::Relaxed);
            EnsureOutcome {
                package: pkg.name.clone(),
                dir: dir.clone(),
                fetched: false,
                installed: false,
                bytes: 0,
                bytecode: pkg.bytecode.clone(),
            }
        };
        if lock(&self.installed).contains(&pkg.name) {
            return Ok(hit(self));
        }
        let gate = lock(&self.inflight)
            .entry(pkg.name.clone())
            .or_default()
            .clone();
        let waited_from = Instant::now();
        let _inproc = gate.lock().await;
        if lock(&self.installed).contains(&pkg.name) {
            return Ok(hit(self));
        }
        if let Some((at, e)) = lock(&self.failures).get(&pkg.name) {
            if *at >= waited_from {
                return Err(e.clone());
            }
        }
        let lock_path = self
            .installer
            .realm_dir
            .join("state")
            .join(format!("{}.lock", pkg.name));
        let flock = flock(&lock_path).await?;
        if self.installer.marker_path(&pkg.name).exists() {
            lock(&self.installed).insert(pkg.name.clone());
            return Ok(hit(self));
        }
        let start = Instant::now();
        let placement = lock(&self.installer.placement).clone();
        let (bytes, delegated) = match self.installer.install_or_delegate(pkg, flock).await {
            Ok(b) => b,
            Err(e) => {
                lock(&self.failures).insert(pkg.name.clone(), (Instant::now(), e.clone()));
                if let Some(p) = placement {
                    p.ended(pkg, Err(&e));
                }
                return Err(e);
            }
        };
        self.installer
            .counters
            .fetch_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.installer
            .counters
            .packages_installed
            .fetch_add(1, Ordering::Relaxed);
        lock(&self.installed).insert(pkg.name.clone());
        if let Some(p) = placement {
            p.ended(pkg, Ok(()));
        }
        // The package's shared tree, for realms that meet it later (off the reader's path; a
        // supervisor that exits first leaves a temporary the next builder sweeps). A delegated
        // install's process builds it itself.
        if !delegated && !tree_dir(&self.installer.root, &pkg.archive.sha256).is_dir() {
            let (root, pkg) = (self.installer.root.clone(), pkg.clone());
            tokio::task::spawn_blocking(move || {
                if let Err(e) = ensure_tree(&root, &pkg) {
                    tracing::debug!(error = %e, package = %pkg.name, "no shared tree");
                }
            });
        }
        Ok(EnsureOutcome {
            package: pkg.name.clone(),
            dir,
            fetched: bytes.is_some(),
            installed: true,
            bytes: bytes.unwrap_or(0),
            bytecode: pkg.bytecode.clone(),
        })
    }

    /// [`ensure`](Self::ensure) the package owning a path under the lib dir
    /// (`numpy/core/x.py`); `Ok(None)` if no package owns it.
    pub async fn ensure_path(&self, rel: &Path) -> Result<Option<EnsureOutcome>> {
        let index = self.index().await?;
        if index.package_for_path(rel).is_none() {
            return Ok(None);
        }
        // package_for_path accepted it, so the first component is a plain name.
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        self.ensure(&first).await.map(Some)
    }

    /// Whether the package is completely installed in this realm (no network access).
    pub fn is_installed(&self, package: &str) -> bool {
        lock(&self.installed).contains(package) || self.installer.marker_path(package).exists()
    }

    /// Install the packages providing `names` (import or top-level entry names; names no
    /// package provides are skipped), `parallel` at a time: what a supervisor starts before its
    /// target asks for anything. Returns each attempted install's outcome.
    pub async fn prefetch(
        &self,
        names: &[String],
        parallel: usize,
    ) -> Result<Vec<Result<EnsureOutcome>>> {
        use futures::StreamExt as _;
        let index = self.index().await?;
        let mut seen = HashSet::new();
        let mut wanted: Vec<String> = names
            .iter()
            .filter(|n| {
                index
                    .package_for_name(n)
                    .is_some_and(|p| seen.insert(p.name.clone()))
            })
            .cloned()
            .collect();
        // And what their imports read of other packages (recorded at publish), by a
        // top-level name of each: fetched now rather than when the import first touches them.
        let reads: Vec<String> = wanted
            .iter()
            .filter_map(|n| index.package_for_name(n))
            .flat_map(|p| p.reads.iter())
            .filter_map(|r| index.package(r))
            .filter(|p| seen.insert(p.name.clone()))
            .filter_map(|p| p.top_level.first().cloned())
            .collect();
        wanted.extend(reads);
        Ok(futures::stream::iter(wanted)
            .map(|n| async move { self.ensure(&n).await })
            .buffer_unordered(parallel.max(1))
            .collect()
            .await)
    }

    /// Have `hook` called with every file a download of this cache verifies, as it is verified.
    pub fn set_file_hook(&self, hook: Arc<FileHook>) {
        *lock(&self.installer.hook) = Some(hook);
    }

    /// Stream downloads into the lib dir: an install that downloads places its package's
    /// skeleton first (every directory, every file as an empty placeholder), tells `placement`,
    /// then fills each file in place as it is verified (the file hook gets its lib path) and
    /// tells `placement` when the install ended. Whoever serves the lib dir must then serve a
    /// file of a package without marker only once the hook has announced it (see
    /// [`Placement`]). Without a placement, installs are staged and renamed in whole.
    pub fn set_placement(&self, placement: Arc<dyn Placement>) {
        *lock(&self.installer.placement) = Some(placement);
    }

    /// Run downloads that stream into the lib dir (a [`Placement`] is set) in another process
    /// (see [`Delegate`]): an install then outlives this process, and this process's exit
    /// never waits for the rest of a package its target did not need.
    pub fn set_delegate(&self, delegate: Arc<dyn Delegate>) {
        *lock(&self.installer.delegate) = Some(delegate);
    }

    /// The delegate's side of [`Delegate::install`]: install `pkg` here, its lock held by the
    /// process that delegated it (and handed to this one). Streams into the lib dir when a
    /// placement is set. Returns the bytes downloaded (0: installed already, or every file
    /// was in the store).
    pub async fn fill(&self, pkg: &Package) -> Result<u64> {
        if self.installer.marker_path(&pkg.name).exists() {
            return Ok(0);
        }
        let stored = self.in_store(pkg);
        let n = self.installer.install(pkg, stored).await?;
        self.installer
            .counters
            .packages_installed
            .fetch_add(1, Ordering::Relaxed);
        Ok(n.unwrap_or(0))
    }

    /// [`fill`](Self::fill) through the memory tree `mem`, an empty directory on a tmpfs
    /// private to this install (see `install.rs`, "in memory"): the placement is told of a
    /// skeleton placed there and the hook of each file verified there; the package is in lib/
    /// once this returns. Needs a placement ([`set_placement`](Self::set_placement)).
    pub async fn fill_in_memory(&self, pkg: &Package, mem: &Path) -> Result<u64> {
        if self.installer.marker_path(&pkg.name).exists() {
            return Ok(0);
        }
        let placement = lock(&self.installer.placement)
            .clone()
            .ok_or_else(|| FetchError::invalid("fill in memory", "no placement set"))?;
        let n = match self.in_store(pkg) {
            true => self.installer.install(pkg, true).await?,
            false => {
                self.installer
                    .install_in_memory(pkg, mem, &placement)
                    .await?
            }
        };
        self.installer
            .counters
            .packages_installed
            .fetch_add(1, Ordering::Relaxed);
        Ok(n.unwrap_or(0))
    }

    /// Build `pkg`'s shared tree if it has none yet (see [`ensure_tree`]).
    pub fn share_tree(&self, pkg: &Package) -> Result<Option<PathBuf>> {
        ensure_tree(&self.installer.root, pkg)
    }

    /// Whether every file of `pkg` is in the shared content store already (no download needed).
    pub fn in_store(&self, pkg: &Package) -> bool {
        self.installer.in_store(pkg)
    }

    /// Where the CAS keeps the verified file with this sha256.
    pub fn cas_path(&self, sha: &str) -> PathBuf {
        self.installer.root.join("cas").join(sha)
    }
}

#[cfg(test)]
mod tests;
