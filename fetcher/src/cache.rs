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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::IoContext;
use crate::index::{Encoding, FileEntry, Index, Package, INDEX_KEY};
use crate::progress::Progress;
use crate::store::{get_bytes, local::write_atomic, next_chunk, Store};
use crate::{FetchConfig, FetchError, Result};

/// The default cache root: `$XDG_CACHE_HOME/sigma-supervise`, else `~/.cache/sigma-supervise`.
pub fn default_cache_root() -> PathBuf {
    match default_cache_base() {
        (base, true) => base.join("sigma-supervise"),
        (home, false) => home.join(".cache").join("sigma-supervise"),
    }
}

/// [`default_cache_root`] if it may be made: not when it lies in a home directory that does
/// not exist (a service account's `/nonexistent`), which a run must never create on the
/// host. `XDG_CACHE_HOME` itself is made when missing, as the XDG spec asks.
pub fn default_cache_root_if_home() -> Option<PathBuf> {
    match default_cache_base() {
        (base, true) => Some(base.join("sigma-supervise")),
        (home, false) if home.is_dir() => Some(home.join(".cache").join("sigma-supervise")),
        (_, false) => None,
    }
}

/// `($XDG_CACHE_HOME, true)` when it is set, else `($HOME, false)`.
fn default_cache_base() -> (PathBuf, bool) {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return (PathBuf::from(x), true);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    (PathBuf::from(home), false)
}

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

/// Counters of one [`RealmCache`] (this process only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Packages downloaded.
    pub packages_fetched: u64,
    /// Packages installed into the realm (downloaded or linked from the CAS).
    pub packages_installed: u64,
    /// Bytes downloaded (archives and index).
    pub bytes_fetched: u64,
    /// GET requests made (index and archives).
    pub gets: u64,
    /// `ensure` calls answered without installing anything.
    pub cache_hits: u64,
    /// Wall time spent inside installs (download, verify, link).
    pub fetch_time: Duration,
}

#[derive(Default)]
struct Counters {
    packages_fetched: AtomicU64,
    packages_installed: AtomicU64,
    bytes_fetched: AtomicU64,
    gets: AtomicU64,
    cache_hits: AtomicU64,
    fetch_nanos: AtomicU64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    package: String,
    version: String,
    archive_sha256: String,
    entries: Vec<String>,
}

/// The number of packages of realm `realm` under `root` if its index snapshot exists and every
/// package in it is completely installed (each marker naming the snapshot's archive), else
/// `None`: then nothing is left to fetch, and the realm's lib dir can be handed to a target as
/// it is. Reads only local files (no network, no threads).
///
/// The answer is remembered in `<realm>/complete`, keyed by the identity (inode, size, change
/// and modification times) of the snapshot (written once, by rename) and of every marker, so a
/// warm start reads a directory and a few inodes' metadata and one small file, not the whole
/// index and every marker's file list (~3 ms for numpy). An incomplete realm is remembered as
/// such (`packages -`) under the same key: a marker added or changed is a new key.
pub fn realm_complete(root: &Path, realm: &str) -> Result<Option<usize>> {
    check_realm(realm)?;
    // Markers written before a crash are trusted only after RealmCache::open checked them.
    if needs_recovery(root)? {
        return Ok(None);
    }
    let realm_dir = root.join("realms").join(realm);
    let path = realm_dir.join("index.json");
    let key = complete_key(&realm_dir);
    let stamp = realm_dir.join("complete");
    if let Some(k) = &key {
        if let Ok(s) = std::fs::read_to_string(&stamp) {
            match s.strip_prefix(k.as_str()).map(str::trim) {
                Some("-") => return Ok(None),
                Some(n) => {
                    if let Ok(n) = n.parse() {
                        return Ok(Some(n));
                    }
                }
                None => {}
            }
        }
    }
    let n = realm_complete_slow(&realm_dir, &path)?;
    // Remembered only if nothing changed while the markers were read.
    if let Some(k) = key.filter(|k| complete_key(&realm_dir).as_ref() == Some(k)) {
        let answer = n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        // Only an optimisation: a stamp that cannot be written is built again next time.
        let _ = write_renamed(&stamp, format!("{k}{answer}\n").as_bytes());
    }
    Ok(n)
}

/// A package whose marker says it is completely installed in a realm's lib dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledPackage {
    pub name: String,
    /// The archive it was installed from (its index entry's).
    pub archive_sha256: String,
    /// Its top-level entries in the lib dir.
    pub entries: Vec<String>,
}

/// The packages of realm `realm` under `root` that are completely installed, by their markers
/// (unreadable markers are left out). Empty while the cache awaits its crash check: markers
/// written before a crash are trusted only once [`RealmCache::open`] has checked them. Reads
/// only local files (no network, no threads).
pub fn installed_packages(root: &Path, realm: &str) -> Result<Vec<InstalledPackage>> {
    check_realm(realm)?;
    if needs_recovery(root)? {
        return Ok(Vec::new());
    }
    let state = root.join("realms").join(realm).join("state");
    let entries = match std::fs::read_dir(&state) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FetchError::io("list", state, e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pkg) = name.to_str().and_then(|n| n.strip_suffix(".installed")) else {
            continue;
        };
        let Some(m) = std::fs::read(e.path())
            .ok()
            .and_then(|d| serde_json::from_slice::<Marker>(&d).ok())
            .filter(|m| m.package == pkg)
        else {
            continue;
        };
        out.push(InstalledPackage {
            name: m.package,
            archive_sha256: m.archive_sha256,
            entries: m.entries,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A file's identity for keys of remembered answers: device, inode, size, modification and
/// change times. A file replaced or written since has another (the writers here rename).
pub fn identity(m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt as _;
    format!(
        "{}:{}:{}:{}.{}:{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// What [`realm_complete`]'s remembered answer is keyed by (`None`: no snapshot or no state).
fn complete_key(realm_dir: &Path) -> Option<String> {
    use std::fmt::Write as _;
    let id = identity;
    let mut key = format!(
        "v1 index {}",
        id(&std::fs::metadata(realm_dir.join("index.json")).ok()?)
    );
    let mut markers = Vec::new();
    for e in std::fs::read_dir(realm_dir.join("state")).ok()? {
        let e = e.ok()?;
        markers.push((e.file_name(), id(&e.metadata().ok()?)));
    }
    markers.sort();
    for (name, m) in markers {
        let _ = write!(key, " {}={m}", name.to_string_lossy());
    }
    key.push_str(" packages ");
    Some(key)
}

fn realm_complete_slow(realm_dir: &Path, path: &Path) -> Result<Option<usize>> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FetchError::io("read", path.to_path_buf(), e)),
    };
    let index = Index::from_json(&path.display().to_string(), &data)?;
    for pkg in index.packages().values() {
        let marker = realm_dir
            .join("state")
            .join(format!("{}.installed", pkg.name));
        let m: Marker = match std::fs::read(&marker) {
            Ok(d) => match serde_json::from_slice(&d) {
                Ok(m) => m,
                Err(_) => return Ok(None),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(FetchError::io("read", marker, e)),
        };
        if m.archive_sha256 != pkg.archive.sha256 {
            return Ok(None);
        }
    }
    Ok(Some(index.packages().len()))
}

/// More top-level entries than this and a realm is not shown from trees (one mount each);
/// its own lib dir (one mount) serves it once installed.
pub const MAX_TREE_ENTRIES: usize = 512;

/// One top-level entry of a realm, shown from its package's shared tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// File or directory name at the lib prefix (`numpy`, `six.py`).
    pub name: String,
    pub is_dir: bool,
    /// Distribution that owns it.
    pub package: String,
    /// `<root>/trees/<archive sha256>/<name>`.
    pub source: PathBuf,
}

impl TreeEntry {
    /// The entry as the index lists it.
    pub fn top_level(&self) -> crate::index::TopLevelEntry {
        crate::index::TopLevelEntry {
            name: self.name.clone(),
            is_dir: self.is_dir,
            package: self.package.clone(),
        }
    }
}

/// A realm every package of which has a shared tree ([`realm_trees`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeView {
    /// Sorted by name.
    pub entries: Vec<TreeEntry>,
    /// The cache tag of the bytecode each package with Python sources ships (`None`: none),
    /// by package: a tree holds only what was published, never bytecode compiled for a realm
    /// afterwards.
    pub bytecode: BTreeMap<String, Option<String>>,
}

impl TreeView {
    /// How many packages the entries come from.
    pub fn packages(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.package.as_str())
            .collect::<HashSet<_>>()
            .len()
    }

    /// Whether every package with Python sources ships bytecode for interpreters of cache tag
    /// `tag` (`cpython-311`): else a realm of its own, compiled after install, imports faster.
    pub fn compiled_for(&self, tag: &str) -> bool {
        self.bytecode.values().all(|b| b.as_deref() == Some(tag))
    }
}

/// The realm's libraries as shared trees, if its index snapshot exists and every package of it
/// has a tree (built here from the CAS when all its files are there, ~1,500 links for numpy,
/// once per archive on the machine): then a target can be shown the realm by one read-only
/// mount per top-level entry, and a realm never seen before needs no install of its own.
/// `None`: a package's content is missing (fetch it: notification or lazy path), more than
/// [`MAX_TREE_ENTRIES`] entries, or the cache awaits its crash check.
///
/// Remembered in `<realm>/trees`, keyed by the identity of the snapshot and the modification
/// times of `cas/` and `trees/` (content added anywhere is a new key); a remembered view is used
/// after checking that its trees still exist.
pub fn realm_trees(root: &Path, realm: &str) -> Result<Option<TreeView>> {
    realm_trees_of(root, realm, None)
}

/// [`realm_trees`] for a caller that holds the realm's snapshot parsed already (it has just
/// taken it): not parsed again.
pub fn realm_trees_of(
    root: &Path,
    realm: &str,
    snapshot: Option<&Index>,
) -> Result<Option<TreeView>> {
    check_realm(realm)?;
    if needs_recovery(root)? {
        return Ok(None);
    }
    let realm_dir = root.join("realms").join(realm);
    let snapshot_path = realm_dir.join("index.json");
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| identity(&m));
    let Some(index_id) = id(&snapshot_path) else {
        return Ok(None);
    };
    let key = |root: &Path| {
        format!(
            "v1 index {index_id} cas {} trees {}",
            id(&root.join("cas")).unwrap_or_default(),
            id(&root.join("trees")).unwrap_or_default()
        )
    };
    #[derive(Serialize, Deserialize)]
    struct Stamp {
        key: String,
        view: Option<TreeView>,
    }
    let stamp_path = realm_dir.join("trees");
    let before = key(root);
    if let Some(stamp) = std::fs::read(&stamp_path)
        .ok()
        .and_then(|d| serde_json::from_slice::<Stamp>(&d).ok())
        .filter(|s| s.key == before)
    {
        match stamp.view {
            None => return Ok(None),
            Some(v)
                if v.entries.iter().all(|e| {
                    e.source.starts_with(root.join("trees")) && e.source.symlink_metadata().is_ok()
                }) =>
            {
                return Ok(Some(v))
            }
            Some(_) => {}
        }
    }
    let parsed;
    let index = match snapshot {
        Some(i) => i,
        None => {
            let data = std::fs::read(&snapshot_path).ctx("read", &snapshot_path)?;
            parsed = Index::from_json(&snapshot_path.display().to_string(), &data)?;
            &parsed
        }
    };
    let entries = index.top_level_entries();
    let mut view = None;
    if !index.packages().is_empty() && entries.len() <= MAX_TREE_ENTRIES {
        let mut trees = HashMap::new();
        for pkg in index.packages().values() {
            match ensure_tree(root, pkg)? {
                Some(t) => trees.insert(pkg.name.clone(), t),
                None => {
                    trees.clear();
                    break;
                }
            };
        }
        if trees.len() == index.packages().len() {
            view = Some(TreeView {
                bytecode: index
                    .packages()
                    .values()
                    .filter(|p| p.files.iter().any(|f| f.path.ends_with(".py")))
                    .map(|p| (p.name.clone(), p.bytecode.clone()))
                    .collect(),
                entries: entries
                    .into_iter()
                    .map(|e| TreeEntry {
                        source: trees[&e.package].join(&e.name),
                        name: e.name,
                        is_dir: e.is_dir,
                        package: e.package,
                    })
                    .collect(),
            });
        }
    }
    // Building trees changes `trees/`: keyed by what is there now, so the next run hits.
    let stamp = Stamp {
        key: key(root),
        view: view.clone(),
    };
    // Only an optimisation: a stamp that cannot be written is worked out again next time.
    let _ = write_renamed(&stamp_path, &serde_json::to_vec(&stamp).unwrap_or_default());
    Ok(view)
}

/// One realm's view of the library bucket, installed on demand under a shared cache root.
pub struct RealmCache {
    root: PathBuf,
    realm: String,
    realm_dir: PathBuf,
    lib: PathBuf,
    store: Arc<dyn Store>,
    cfg: FetchConfig,
    index: tokio::sync::OnceCell<Arc<Index>>,
    /// Packages known complete in this realm.
    installed: Mutex<HashSet<String>>,
    /// One async mutex per package: tasks of this process install one at a time.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The last failed install of each package and when it ended: tasks that waited for it
    /// get its error instead of a second bounded wait.
    failures: Mutex<HashMap<String, (Instant, FetchError)>>,
    /// `<root>/unsynced` names this boot (see the module docs).
    stamped: AtomicBool,
    /// See [`RealmCache::set_file_hook`].
    hook: Mutex<Option<Arc<FileHook>>>,
    /// See [`RealmCache::set_placement`].
    placement: Mutex<Option<Arc<dyn Placement>>>,
    /// See [`RealmCache::set_delegate`].
    delegate: Mutex<Option<Arc<dyn Delegate>>>,
    counters: Counters,
}

impl std::fmt::Debug for RealmCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealmCache")
            .field("root", &self.root)
            .field("realm", &self.realm)
            .field("store", &self.store.name())
            .finish()
    }
}

fn check_realm(realm: &str) -> Result<()> {
    let ok = !realm.is_empty()
        && !realm.starts_with('.')
        && realm.len() <= 128
        && realm
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(FetchError::invalid(
            format!("realm {realm:?}"),
            "realm names use letters, digits, '.', '_', '-' and do not start with '.'",
        ))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded maps are updated by single inserts; a panic cannot leave them inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync dir", dir)
}

fn pid_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(_) => true,
    }
}

/// Name of the boot stamp under the cache root (see the module docs).
const UNSYNCED: &str = "unsynced";

/// Record under `root` that this boot has unflushed writes there (see the module docs).
fn stamp_unsynced(root: &Path) -> Result<()> {
    let boot = boot_id()?;
    let stamp = root.join(UNSYNCED);
    if std::fs::read_to_string(&stamp).map_or(true, |b| b.trim() != boot) {
        write_atomic(&stamp, boot.as_bytes())?;
    }
    Ok(())
}

/// This boot's id, as the kernel reports it.
fn boot_id() -> Result<String> {
    let p = "/proc/sys/kernel/random/boot_id";
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .ctx("read", p)
}

/// True if unflushed installs of an earlier boot may have been lost in a crash.
fn needs_recovery(root: &Path) -> Result<bool> {
    let stamp = root.join(UNSYNCED);
    match std::fs::read_to_string(&stamp) {
        Ok(b) => Ok(b.trim() != boot_id()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FetchError::io("read", stamp, e)),
    }
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// After a crash of the machine, trust nothing that was not flushed: keep the `cas/` files
/// whose content matches their name, keep a package marker only if every file of the package
/// is in the realm's lib dir as a link to a kept `cas/` file, drop index snapshots that do not
/// parse; then flush and remove the stamp. One process does it (a lock); the rest wait.
fn recover_after_crash(root: &Path) -> Result<()> {
    if !needs_recovery(root)? {
        return Ok(());
    }
    let _guard = flock_blocking(&root.join("recover.lock"))?;
    if !needs_recovery(root)? {
        return Ok(());
    }
    tracing::info!(root = %root.display(), "checking the cache after a crash");
    let cas = root.join("cas");
    let mut good: HashMap<String, (u64, u64)> = HashMap::new();
    for e in std::fs::read_dir(&cas).ctx("list", &cas)? {
        let e = e.ctx("list", &cas)?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let ok = name.len() == 64 && sha256_file(&path).is_ok_and(|h| h == name);
        if ok {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&path).ctx("stat", &path)?;
            good.insert(name, (m.dev(), m.ino()));
        } else {
            remove_any(&path)?;
        }
    }
    // Trees link to cas/ inodes, possibly to one just dropped, and may be half written: they
    // are derived from the CAS and built again on demand.
    remove_any(&root.join("trees"))?;
    let realms = root.join("realms");
    let listing = match std::fs::read_dir(&realms) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return finish_recovery(root);
        }
        Err(e) => return Err(FetchError::io("list", realms, e)),
    };
    for realm in listing {
        let realm_dir = realm.ctx("list", &realms)?.path();
        let (state, lib) = (realm_dir.join("state"), realm_dir.join("lib"));
        let snapshot = realm_dir.join("index.json");
        let index = std::fs::read(&snapshot)
            .ok()
            .and_then(|d| Index::from_json(&snapshot.display().to_string(), &d).ok());
        let Some(index) = index else {
            // No usable snapshot: no marker can be checked against it.
            remove_any(&snapshot)?;
            if let Ok(markers) = std::fs::read_dir(&state) {
                for m in markers.flatten() {
                    if m.file_name().to_string_lossy().ends_with(".installed") {
                        remove_any(&m.path())?;
                    }
                }
            }
            continue;
        };
        for pkg in index.packages().values() {
            let marker = state.join(format!("{}.installed", pkg.name));
            if !marker.exists() {
                continue;
            }
            let intact = std::fs::read(&marker)
                .ok()
                .and_then(|d| serde_json::from_slice::<Marker>(&d).ok())
                .is_some_and(|m| m.archive_sha256 == pkg.archive.sha256)
                && pkg.files.iter().all(|f| {
                    use std::os::unix::fs::MetadataExt;
                    std::fs::symlink_metadata(lib.join(&f.path))
                        .is_ok_and(|m| good.get(&f.sha256) == Some(&(m.dev(), m.ino())))
                });
            if !intact {
                remove_any(&marker)?;
            }
        }
    }
    finish_recovery(root)
}

fn finish_recovery(root: &Path) -> Result<()> {
    sync_fs(root)?;
    let stamp = root.join(UNSYNCED);
    remove_any(&stamp)?;
    fsync_dir(root)
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
            root,
            realm: realm.to_owned(),
            realm_dir,
            lib,
            store,
            cfg,
            index: tokio::sync::OnceCell::new(),
            installed: Mutex::new(HashSet::new()),
            inflight: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            stamped: AtomicBool::new(false),
            hook: Mutex::new(None),
            placement: Mutex::new(None),
            delegate: Mutex::new(None),
            counters: Counters::default(),
        };
        recover_after_crash(&cache.root)?;
        cache.sweep_dead_staging()?;
        Ok(cache)
    }

    /// The realm's lib dir (what the supervisor serves to the target).
    pub fn lib_dir(&self) -> PathBuf {
        self.lib.clone()
    }

    /// The realm name.
    pub fn realm(&self) -> &str {
        &self.realm
    }

    /// The store this realm fetches from.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Counters of this cache object.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        CacheStats {
            packages_fetched: c.packages_fetched.load(Ordering::Relaxed),
            packages_installed: c.packages_installed.load(Ordering::Relaxed),
            bytes_fetched: c.bytes_fetched.load(Ordering::Relaxed),
            gets: c.gets.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            fetch_time: Duration::from_nanos(c.fetch_nanos.load(Ordering::Relaxed)),
        }
    }

    /// The realm's index. The first call in a realm downloads the bucket's index and keeps it
    /// as the realm's snapshot (`index.json`, first writer wins), so every process of a realm
    /// sees the same set of packages and a warm realm needs no network at all.
    pub async fn index(&self) -> Result<Arc<Index>> {
        self.index
            .get_or_try_init(|| async {
                let path = self.realm_dir.join("index.json");
                match std::fs::read(&path) {
                    Ok(data) => return Ok(Arc::new(Index::from_json(self.store.name(), &data)?)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(FetchError::io("read", path, e)),
                }
                self.counters.gets.fetch_add(1, Ordering::Relaxed);
                let data = get_bytes(self.store.as_ref(), INDEX_KEY, &self.cfg).await?;
                self.counters
                    .bytes_fetched
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                let parsed = Index::from_json(self.store.name(), &data)?;
                self.stamp_unsynced()?;
                let kept = persist_first(&path, &data)?;
                if kept == data {
                    return Ok(Arc::new(parsed));
                }
                // Another process of the realm took its snapshot first: that one is the realm's.
                Ok(Arc::new(Index::from_json(self.store.name(), &kept)?))
            })
            .await
            .cloned()
    }

    /// Package `name` of the realm's index snapshot, parsed alone (see
    /// [`Index::package_from_json`]): for a fill process, which installs one package of a
    /// snapshot another process took. `None` without a snapshot or without that package.
    pub fn snapshot_package(&self, name: &str) -> Result<Option<Package>> {
        let path = self.realm_dir.join("index.json");
        match std::fs::read(&path) {
            Ok(data) => Index::package_from_json(self.store.name(), &data, name),
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
                bucket: self.store.name().to_owned(),
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
        self.ensure_package(pkg, self.lib.join(entry)).await
    }

    /// Install `pkg` unless it is installed; `dir` is reported back in the outcome.
    async fn ensure_package(&self, pkg: &Package, dir: PathBuf) -> Result<EnsureOutcome> {
        let hit = |cache: &Self| {
            cache.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
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
            .realm_dir
            .join("state")
            .join(format!("{}.lock", pkg.name));
        let flock = flock(&lock_path).await?;
        if self.marker_path(&pkg.name).exists() {
            lock(&self.installed).insert(pkg.name.clone());
            return Ok(hit(self));
        }
        let start = Instant::now();
        let placement = lock(&self.placement).clone();
        let (bytes, delegated) = match self.install_or_delegate(pkg, flock).await {
            Ok(b) => b,
            Err(e) => {
                lock(&self.failures).insert(pkg.name.clone(), (Instant::now(), e.clone()));
                if let Some(p) = placement {
                    p.ended(pkg, Err(&e));
                }
                return Err(e);
            }
        };
        self.counters
            .fetch_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.counters
            .packages_installed
            .fetch_add(1, Ordering::Relaxed);
        lock(&self.installed).insert(pkg.name.clone());
        if let Some(p) = placement {
            p.ended(pkg, Ok(()));
        }
        // The package's shared tree, for realms that meet it later (off the reader's path; a
        // supervisor that exits first leaves a temporary the next builder sweeps). A delegated
        // install's process builds it itself.
        if !delegated && !tree_dir(&self.root, &pkg.archive.sha256).is_dir() {
            let (root, pkg) = (self.root.clone(), pkg.clone());
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
        lock(&self.installed).contains(package) || self.marker_path(package).exists()
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
        *lock(&self.hook) = Some(hook);
    }

    fn hook(&self) -> Option<Arc<FileHook>> {
        lock(&self.hook).clone()
    }

    /// Stream downloads into the lib dir: an install that downloads places its package's
    /// skeleton first (every directory, every file as an empty placeholder), tells `placement`,
    /// then fills each file in place as it is verified (the file hook gets its lib path) and
    /// tells `placement` when the install ended. Whoever serves the lib dir must then serve a
    /// file of a package without marker only once the hook has announced it (see
    /// [`Placement`]). Without a placement, installs are staged and renamed in whole.
    pub fn set_placement(&self, placement: Arc<dyn Placement>) {
        *lock(&self.placement) = Some(placement);
    }

    /// Run downloads that stream into the lib dir (a [`Placement`] is set) in another process
    /// (see [`Delegate`]): an install then outlives this process, and this process's exit
    /// never waits for the rest of a package its target did not need.
    pub fn set_delegate(&self, delegate: Arc<dyn Delegate>) {
        *lock(&self.delegate) = Some(delegate);
    }

    /// The delegate's side of [`Delegate::install`]: install `pkg` here, its lock held by the
    /// process that delegated it (and handed to this one). Streams into the lib dir when a
    /// placement is set. Returns the bytes downloaded (0: installed already, or every file
    /// was in the store).
    pub async fn fill(&self, pkg: &Package) -> Result<u64> {
        if self.marker_path(&pkg.name).exists() {
            return Ok(0);
        }
        let stored = self.in_store(pkg);
        let n = self.install(pkg, stored).await?;
        self.counters
            .packages_installed
            .fetch_add(1, Ordering::Relaxed);
        Ok(n.unwrap_or(0))
    }

    /// Build `pkg`'s shared tree if it has none yet (see [`ensure_tree`]).
    pub fn share_tree(&self, pkg: &Package) -> Result<Option<PathBuf>> {
        ensure_tree(&self.root, pkg)
    }

    /// Record that this boot has unflushed installs under the root (flushed once per boot).
    fn stamp_unsynced(&self) -> Result<()> {
        if self.stamped.load(Ordering::Relaxed) {
            return Ok(());
        }
        stamp_unsynced(&self.root)?;
        self.stamped.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn marker_path(&self, pkg: &str) -> PathBuf {
        self.realm_dir
            .join("state")
            .join(format!("{pkg}.installed"))
    }

    fn pending_path(&self, pkg: &str) -> PathBuf {
        self.realm_dir.join("state").join(format!("{pkg}.pending"))
    }

    /// Whether every file of `pkg` is in the shared content store already (no download needed).
    pub fn in_store(&self, pkg: &Package) -> bool {
        stored(&self.root.join("cas"), pkg)
    }

    /// Where the CAS keeps the verified file with this sha256.
    pub fn cas_path(&self, sha: &str) -> PathBuf {
        self.root.join("cas").join(sha)
    }

    /// Remove staging dirs whose owning process is gone (name: `<pkg>.<pid>.<rand>`).
    fn sweep_dead_staging(&self) -> Result<()> {
        let staging = self.realm_dir.join("staging");
        for e in std::fs::read_dir(&staging).ctx("list", &staging)? {
            let e = e.ctx("list", &staging)?;
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<i32>().ok());
            if pid.is_some_and(|p| p != std::process::id() as i32 && !pid_alive(p)) {
                remove_any(&e.path())?;
            }
        }
        Ok(())
    }

    /// Called with the package lock held: undo what a killed install of `pkg` left.
    fn recover(&self, pkg: &str) -> Result<()> {
        let pending = self.pending_path(pkg);
        match std::fs::read(&pending) {
            Ok(data) => {
                let entries: Vec<String> = serde_json::from_slice(&data).unwrap_or_default();
                for entry in entries {
                    if crate::index::check_rel_path(&entry).is_ok() && !entry.contains('/') {
                        remove_any(&self.lib.join(entry))?;
                    }
                }
                fsync_dir(&self.lib)?;
                std::fs::remove_file(&pending).ctx("remove", &pending)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(FetchError::io("read", pending, e)),
        }
        let staging = self.realm_dir.join("staging");
        let prefix = format!("{pkg}.");
        for e in std::fs::read_dir(&staging).ctx("list", &staging)? {
            let e = e.ctx("list", &staging)?;
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                remove_any(&e.path())?;
            }
        }
        Ok(())
    }

    /// Install `pkg` with its lock `held`: in another process when a [`Delegate`] is set and
    /// the install downloads and streams (then the lock goes with it, see [`Delegate`]), else
    /// here. Returns the bytes downloaded (`None`: every file was already in the CAS) and
    /// whether the install was delegated.
    async fn install_or_delegate(
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
    async fn install(&self, pkg: &Package, mut stored: bool) -> Result<Option<u64>> {
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
        let stage = self.realm_dir.join("staging").join(format!(
            "{}.{}.{:08x}",
            pkg.name,
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir(&stage).ctx("create dir", &stage)?;
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

    /// Download `pkg` straight into the lib dir (see [`set_placement`](Self::set_placement)):
    /// the skeleton is placed under the journal, filled as the archive arrives, linked into the
    /// CAS once complete, then the marker is written. Errors are cleaned up by the caller.
    async fn install_in_place(
        &self,
        pkg: &Package,
        stage: &Path,
        placement: &Arc<dyn Placement>,
    ) -> Result<Option<u64>> {
        let place = Place {
            lib: self.lib.clone(),
            pending: self.pending_path(&pkg.name),
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
                    place_skeleton(&pkg2, &tree, &place.lib, &place.pending)?;
                    place.placement.placed(&pkg2);
                    let past_trace = || place.placement.past_trace(&pkg2);
                    let hooks = Hooks {
                        on_verified: hook.as_deref(),
                        past_trace: Some(&past_trace),
                    };
                    unpack_files(&pkg2, reader, &root, &place.lib, true, hooks)
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

/// Called on one of the unpacker's threads (several at once) with each file's sha256 and
/// staged path as soon as the file is verified against the index (before the rest of its
/// package): a reader waiting for that file can have it now. The staged file is removed after
/// the install; copy, do not keep. With a [`Placement`] the path is the file's place in the
/// lib dir, where it stays.
pub type FileHook = dyn Fn(&str, &Path) + Send + Sync;

/// Told about installs that stream into the lib dir ([`RealmCache::set_placement`]). Between
/// `placed` and `ended`, the package's directories and file names are all in the lib dir (a
/// listing is complete), but a file holds its verified bytes only once the file hook has
/// announced its lib path: until then it is an empty placeholder that must not be served.
/// Called on the installer's threads; must not block.
pub trait Placement: Send + Sync {
    /// `pkg`'s skeleton is in the lib dir.
    fn placed(&self, pkg: &Package);
    /// An install of `pkg` ended (whether or not it placed anything first): with `Ok` the
    /// package is installed (marker written); with `Err` nothing placed is left.
    fn ended(&self, pkg: &Package, result: std::result::Result<(), &FetchError>);
    /// Every file of `pkg`'s import trace ([`Package::traced`]) is verified: what the install
    /// writes from here on, an import does not read at its start. Not called for a package
    /// published without a trace.
    fn past_trace(&self, _pkg: &Package) {}
}

/// Runs a package's streaming download in another process ([`RealmCache::set_delegate`]),
/// so that it outlives the process that asked for it: a supervisor whose target needed only a
/// package's first files exits when the target does, and the rest arrives all the same.
pub trait Delegate: Send + Sync {
    /// Blocking. Start a process that installs `pkg` (its archive is not in the store) into
    /// this realm's lib dir exactly as [`RealmCache::fill`] does, handing it `lock`: the
    /// package's lock file, locked by the caller. The lock is one open file shared by both,
    /// so it holds until both have closed it, and the caller keeps it until this returns.
    /// Report what the process says as it goes: the skeleton placed to `placement`
    /// ([`Placement::placed`], never `ended`) and each verified file to `hook`, with its
    /// lib-dir path.
    ///
    /// `Some(Ok(bytes))` once the package is installed (marker written; the process may go on
    /// to build the package's shared tree); `Some(Err(..))` when the install failed or the
    /// process ended without saying (it is gone then); `None` when no process could be
    /// started (the caller installs itself).
    fn install(
        &self,
        pkg: &Package,
        lock: &std::fs::File,
        placement: &Arc<dyn Placement>,
        hook: Option<&Arc<FileHook>>,
    ) -> Option<Result<u64>>;
}

/// Where an install that streams into the lib dir places its skeleton.
struct Place {
    lib: PathBuf,
    pending: PathBuf,
    placement: Arc<dyn Placement>,
}

/// Build `pkg`'s skeleton in `tree` (every directory; every file empty, owner-writable until
/// filled), journal its top-level entries in `pending`, and rename them into `lib`.
fn place_skeleton(pkg: &Package, tree: &Path, lib: &Path, pending: &Path) -> Result<()> {
    make_dirs(pkg, tree)?;
    for_each_in_parallel(&pkg.files, |f| {
        let dst = tree.join(&f.path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&dst)
            .map(drop)
            .ctx("create", &dst)
    })?;
    move_into_lib(pkg, tree, lib, pending)
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

/// A `Read` that fails once more than `left` bytes have been read: the decompressed stream of
/// an archive is bounded by what its index entry allows (a hostile archive cannot make the
/// unpacker buffer or write without end).
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.left = self.left.checked_sub(k as u64).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "archive unpacks to more than its index lists",
            )
        })?;
        Ok(k)
    }
}

/// Write `data` to `path` through a temporary name and a rename, without flushing: a reader
/// never sees half a file; durability is the boot stamp's concern (see the module docs).
pub fn write_renamed(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .ctx("create temp file in", dir)?;
    tmp.write_all(data).ctx("write", tmp.path())?;
    tmp.persist(path)
        .map_err(|e| FetchError::io("rename into", path, e.error))?;
    Ok(())
}

/// Write `data` at `path` unless a file is already there; return what ends up there.
fn persist_first(path: &Path, data: &[u8]) -> Result<Vec<u8>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .ctx("create temp file in", dir)?;
    tmp.write_all(data).ctx("write", tmp.path())?;
    match std::fs::hard_link(tmp.path(), path) {
        Ok(()) => Ok(data.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(path).ctx("read", path)
        }
        Err(e) => Err(FetchError::io("link", path, e)),
    }
}

/// Whether every file of `pkg` is in the content store `cas`: installing it needs no download.
fn stored(cas: &Path, pkg: &Package) -> bool {
    pkg.files
        .iter()
        .all(|f| cas_has(&cas.join(&f.sha256), f.size))
}

fn cas_has(path: &Path, size: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == size)
}

fn remove_any(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).ctx("remove", path),
        Ok(_) => std::fs::remove_file(path).ctx("remove", path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FetchError::io("stat", path, e)),
    }
}

/// Take the package's file lock (blocking in a worker thread). Released on drop.
async fn flock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || flock_blocking(&path))
        .await
        .map_err(|e| FetchError::invalid("flock", e))?
}

/// Take the lock of an archive: at once if free, else waiting for it (in a worker thread).
/// Returns the lock and whether it had to be waited for.
async fn flock_archive(path: &Path) -> Result<(nix::fcntl::Flock<std::fs::File>, bool)> {
    use nix::fcntl::{Flock, FlockArg};
    match Flock::lock(open_lock(path)?, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok((held, false)),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            let path = path.to_owned();
            tokio::task::spawn_blocking(move || {
                Flock::lock(file, FlockArg::LockExclusive)
                    .map(|held| (held, true))
                    .map_err(|(_, errno)| FetchError::io("flock", &path, errno.into()))
            })
            .await
            .map_err(|e| FetchError::invalid("flock", e))?
        }
        Err((_, errno)) => Err(FetchError::io("flock", path, errno.into())),
    }
}

/// Take an exclusive lock on the file `path` (created if missing), waiting for it.
fn flock_blocking(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    nix::fcntl::Flock::lock(open_lock(path)?, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| FetchError::io("flock", path, errno.into()))
}

/// Open (creating if missing) the lock file `path`, to flock.
pub fn open_lock(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx("open lock", path)
}

/// File data read out of an archive and not yet written, at most: the parser waits for the
/// workers beyond it, so memory stays bounded whatever sizes the index and the archive name.
const IN_FLIGHT: u64 = 64 << 20;

/// A file larger than this goes to its worker in pieces as it is decoded ([`Body::Pieces`]):
/// the worker hashes and writes one piece while the parser decodes the next, so a large
/// file is ready about when its last piece is decoded, not a whole decode and a whole write
/// later, and no file-sized buffer is allocated.
const PIECE_ABOVE: u64 = 1 << 20;
/// Bytes of one piece, and how many pieces wait for their worker at most.
const PIECE: usize = 256 << 10;
const PIECES_QUEUED: usize = 8;

/// Unpack an archive straight into the staged tree: every entry must be a regular file the
/// index lists, with the listed sha256 and size, and every listed file must be present. Each
/// verified file is linked into the CAS (a file the CAS already holds is replaced by a link to
/// the stored copy, so identical files share an inode). No file is created twice, none is
/// deleted on the first install of its content, nothing is flushed (see the module docs).
/// Bytes that do not decode are an integrity failure. Runs in a blocking thread.
///
/// A pipeline, so a cold install uses every core: this thread decodes the stream and checks
/// each entry against the index ([`parse_entries`]); a few workers hash, write and announce
/// the files ([`write_job`]). The first error stops both sides and is the one returned; the
/// CAS sees nothing until every worker is done and every listed file was verified.
fn unpack_tree(
    pkg: &Package,
    archive: impl Read + Send,
    root: &Path,
    tree: &Path,
    on_verified: Option<&FileHook>,
) -> Result<()> {
    std::fs::create_dir(tree).ctx("create dir", tree)?;
    let hooks = Hooks {
        on_verified,
        past_trace: None,
    };
    unpack_files(pkg, archive, root, tree, false, hooks)
}

/// What an install tells as it goes: each verified file, and that the files of the import
/// trace are all verified (see [`Placement::past_trace`]).
#[derive(Clone, Copy)]
struct Hooks<'h> {
    on_verified: Option<&'h FileHook>,
    past_trace: Option<&'h (dyn Fn() + Sync)>,
}

/// [`unpack_tree`] into an existing `tree`; `in_place`: the tree is a placed skeleton
/// ([`place_skeleton`]) whose empty files are filled (and made read-only) instead of created.
fn unpack_files(
    pkg: &Package,
    archive: impl Read + Send,
    root: &Path,
    tree: &Path,
    in_place: bool,
    hooks: Hooks<'_>,
) -> Result<()> {
    // Tar framing: a header and up to one block of padding per file, pax records, two end
    // blocks; generous, and still a bound.
    let framing = (pkg.files.len() as u64).saturating_mul(4096) + (1 << 20);
    // With cores to spare, frames are decoded by a few threads and read in order (see
    // `crate::frames`); else one decoder reads the frames as one stream.
    let decoders = decode_threads();
    let (decoded, split): (Box<dyn Read>, _) = match pkg.archive.encoding {
        Encoding::TarZstd if decoders > 0 => {
            let (frames, splitter, pool) = crate::frames::frames(archive);
            (Box::new(frames), Some((splitter, pool)))
        }
        Encoding::TarZstd => (
            Box::new(zstd::Decoder::new(archive).map_err(undecodable(pkg))?),
            None,
        ),
        Encoding::Tar => (Box::new(archive), None),
    };
    let reader = Bounded {
        inner: decoded,
        left: pkg.unpacked_size().saturating_add(framing),
    };
    let workers = install_threads();
    let queue = Queue::new(workers * 4, IN_FLIGHT);
    // The archive's first `traced` files: once all are verified, the install is past the trace.
    let traced = pkg
        .traced
        .map_or(0, |n| n.min(pkg.files.len() as u64) as usize);
    let trace_left = AtomicUsize::new(traced);
    let parsed = std::thread::scope(|s| {
        if let Some((splitter, pool)) = split {
            s.spawn(move || splitter.run());
            let pool = Arc::new(pool);
            for _ in 0..decoders {
                let pool = pool.clone();
                s.spawn(move || pool.work());
            }
        }
        for _ in 0..workers {
            s.spawn(|| {
                let _stop = StopOnPanic(&queue);
                while let Some(job) = queue.pop() {
                    let result = write_job(pkg, &job, in_place, hooks.on_verified);
                    if result.is_ok()
                        && job.traced
                        && trace_left.fetch_sub(1, Ordering::AcqRel) == 1
                    {
                        if let Some(past_trace) = hooks.past_trace {
                            past_trace();
                        }
                    }
                    queue.done(job.reserved, result);
                }
            });
        }
        let _stop = StopOnPanic(&queue);
        let parsed = parse_entries(pkg, reader, tree, (in_place, traced), &queue);
        if let Err(e) = &parsed {
            queue.fail(e.clone());
        }
        queue.close();
        parsed
    });
    // The first error of either side (the parser's own is among them).
    queue.into_result()?;
    let seen = parsed?;
    if let Some(f) = pkg.files.iter().find(|f| !seen.contains(f.path.as_str())) {
        return Err(bad(
            pkg,
            &f.path,
            "present in archive".into(),
            "missing".into(),
        ));
    }
    // Only a complete, verified package reaches the CAS.
    let cas = root.join("cas");
    for_each_in_parallel(&pkg.files, |f| {
        let (dst, stored) = (tree.join(&f.path), cas.join(&f.sha256));
        match std::fs::hard_link(&dst, &stored) {
            Ok(()) => Ok(()),
            // Stored before (by another package, or a copy in this one, maybe on another
            // thread just now): share that inode.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && in_place => {
                // The file may be served already: replace it in one step, never remove it.
                let tmp = dst.with_file_name(format!(
                    ".{}.cas",
                    dst.file_name()
                        .map_or_else(Default::default, |n| n.to_string_lossy())
                ));
                let _ = std::fs::remove_file(&tmp);
                std::fs::hard_link(&stored, &tmp).ctx("link from cas", &stored)?;
                std::fs::rename(&tmp, &dst).ctx("rename into", &dst)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&dst).ctx("remove", &dst)?;
                std::fs::hard_link(&stored, &dst).ctx("link from cas", &stored)
            }
            Err(e) => Err(FetchError::io("link into", stored, e)),
        }
    })
}

/// The bytes of `file` in `pkg`'s archive are not what the index says.
fn bad(pkg: &Package, file: &str, expected: String, got: String) -> FetchError {
    FetchError::IntegrityMismatch {
        file: format!("{} ({})", file, pkg.archive.key),
        expected,
        got,
    }
}

/// An archive stream that does not decode (zstd or tar framing) is an integrity failure.
fn undecodable(pkg: &Package) -> impl Fn(std::io::Error) -> FetchError + '_ {
    move |e| {
        bad(
            pkg,
            "archive",
            format!("{:?} data", pkg.archive.encoding),
            e.to_string(),
        )
    }
}

/// The file at `path` hashed to `got` over `n` bytes: fine only if the index says so.
fn check_file(
    pkg: &Package,
    path: &str,
    (sha, size): (&str, u64),
    got: &str,
    n: u64,
) -> Result<()> {
    if got != sha || n != size {
        return Err(bad(
            pkg,
            path,
            format!("sha256 {sha} size {size}"),
            format!("sha256 {got} size {n}"),
        ));
    }
    Ok(())
}

/// Create a file of the staged tree: read-only, and never over an existing one. `in_place`:
/// open the placed placeholder instead (never a new name, never through a link).
fn create_staged(dst: &Path, in_place: bool) -> Result<std::fs::File> {
    if in_place {
        return std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(dst)
            .ctx("open", dst);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(dst)
        .ctx("create", dst)
}

/// A filled placeholder becomes read-only like every stored file (a staged file is created so).
fn seal(out: &std::fs::File, dst: &Path, in_place: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if in_place {
        out.set_permissions(std::fs::Permissions::from_mode(0o444))
            .ctx("chmod", dst)?;
    }
    Ok(())
}

/// Read the archive's entries in order and check each against the index (listed, a regular
/// file, seen once, no longer than listed) before its bytes go to a worker. Returns the index
/// paths seen; whether each file's content matches is the workers' concern.
fn parse_entries<'a>(
    pkg: &'a Package,
    reader: impl Read,
    tree: &Path,
    (in_place, traced): (bool, usize),
    queue: &Queue<'a>,
) -> Result<HashSet<&'a str>> {
    let expected: HashMap<&str, (&str, u64)> = pkg
        .files
        .iter()
        .map(|f| (f.path.as_str(), (f.sha256.as_str(), f.size)))
        .collect();
    let undecodable = undecodable(pkg);
    let mut tar = tar::Archive::new(reader);
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    let mut seen = HashSet::new();
    for entry in tar.entries().map_err(&undecodable)? {
        let mut entry = entry.map_err(&undecodable)?;
        let path = entry
            .path()
            .map_err(&undecodable)?
            .to_string_lossy()
            .into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        // Index paths are checked relative paths (no `..`, no absolute): safe to join.
        let Some((&key, &(sha, size))) = expected.get_key_value(path.as_str()) else {
            return Err(bad(
                pkg,
                &path,
                "no such file in the index".into(),
                "present in archive".into(),
            ));
        };
        if !kind.is_file() {
            return Err(bad(pkg, &path, "regular file".into(), format!("{kind:?}")));
        }
        if !seen.insert(key) {
            return Err(bad(pkg, &path, "one copy".into(), "duplicate entry".into()));
        }
        let dst = tree.join(key);
        if let Some(dir) = dst.parent() {
            if !in_place && !dirs.contains(dir) {
                std::fs::create_dir_all(dir).ctx("create dir", dir)?;
                dirs.insert(dir.to_owned());
            }
        }
        let too_long = || {
            bad(
                pkg,
                key,
                format!("size {size}"),
                format!("more than {size} bytes"),
            )
        };
        if size > PIECE_ABOVE {
            let budget = (PIECE * PIECES_QUEUED) as u64;
            queue.reserve(budget)?;
            let (tx, rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED);
            let (spare_tx, spare_rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED + 1);
            queue.push(Job {
                path: key,
                sha,
                size,
                dst,
                traced: seen.len() <= traced,
                reserved: budget,
                body: Body::Pieces {
                    rx,
                    spare: spare_tx,
                },
            })?;
            let sent = send_pieces(pkg, &mut entry, size, &tx, &spare_rx, queue, too_long);
            if let Err(e) = sent {
                // Recorded before the worker sees its file cut short, so this is the error
                // the install reports.
                queue.fail(e.clone());
                return Err(e);
            }
            continue;
        }
        queue.reserve(size)?;
        // `size` comes from the index, not the archive: at most PIECE_ABOVE, and reserved. The
        // decoder writes straight into the buffer.
        let mut data = vec![0u8; size as usize];
        let n = read_full(&mut entry, &mut data).map_err(&undecodable)?;
        data.truncate(n);
        if entry.read(&mut [0u8]).map_err(&undecodable)? > 0 {
            return Err(too_long());
        }
        queue.push(Job {
            path: key,
            sha,
            size,
            dst,
            traced: seen.len() <= traced,
            reserved: size,
            body: Body::Whole(data),
        })?;
    }
    Ok(seen)
}

/// Read into all of `buf` unless the input ends first; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Decode a large file's bytes into pieces for the worker that took its job (see
/// [`PIECE_ABOVE`]), reusing the buffers it hands back. The file ends when its sender is
/// dropped: after its last piece if it was complete, else early, and the worker then writes
/// nothing more of it and announces nothing.
fn send_pieces(
    pkg: &Package,
    entry: &mut impl Read,
    size: u64,
    tx: &std::sync::mpsc::SyncSender<(Vec<u8>, usize)>,
    spare: &std::sync::mpsc::Receiver<Vec<u8>>,
    queue: &Queue<'_>,
    too_long: impl Fn() -> FetchError,
) -> Result<()> {
    let mut total = 0u64;
    loop {
        let mut buf = spare.try_recv().unwrap_or_else(|_| vec![0u8; PIECE]);
        let n = read_full(entry, &mut buf).map_err(undecodable(pkg))?;
        total += n as u64;
        if total > size {
            return Err(too_long());
        }
        if n > 0 && tx.send((buf, n)).is_err() {
            // The worker stopped: its error is the queue's.
            return Err(queue
                .failure()
                .unwrap_or_else(|| FetchError::invalid("unpack", "a file's worker stopped")));
        }
        if n < PIECE {
            return Ok(());
        }
    }
}

/// One file read out of the archive, for a worker to verify and write.
struct Job<'a> {
    /// As the index lists it.
    path: &'a str,
    sha: &'a str,
    size: u64,
    dst: PathBuf,
    /// One of the archive's first [`Package::traced`] files.
    traced: bool,
    /// Bytes of the queue's budget this job holds until it is done.
    reserved: u64,
    body: Body,
}

/// A job's bytes: all of them, or pieces arriving from the parser.
enum Body {
    Whole(Vec<u8>),
    Pieces {
        /// A piece and how many of its bytes are the file's; ends when the parser drops it.
        rx: std::sync::mpsc::Receiver<(Vec<u8>, usize)>,
        /// Written pieces go back to the parser for the next ones.
        spare: std::sync::mpsc::SyncSender<Vec<u8>>,
    },
}

/// Write a file's bytes into the staged tree, hashing them on the way, check them against the
/// index and hand the file to the hook. In pieces: each is hashed and copied while it is in
/// this core's cache (one whole-file `write` reads the buffer from memory twice).
fn write_job(
    pkg: &Package,
    job: &Job,
    in_place: bool,
    on_verified: Option<&FileHook>,
) -> Result<()> {
    let mut out = create_staged(&job.dst, in_place)?;
    let mut hasher = Sha256::new();
    let mut write = |data: &[u8]| -> Result<()> {
        for piece in data.chunks(64 << 10) {
            hasher.update(piece);
            out.write_all(piece).ctx("write", &job.dst)?;
        }
        Ok(())
    };
    let n = match &job.body {
        Body::Whole(data) => {
            write(data)?;
            data.len() as u64
        }
        Body::Pieces { rx, spare } => {
            let mut n = 0u64;
            for (buf, len) in rx {
                write(&buf[..len])?;
                n += len as u64;
                let _ = spare.try_send(buf);
            }
            n
        }
    };
    let got = hex::encode(hasher.finalize());
    // A file cut short (the parser stopped) fails here and is never announced.
    check_file(pkg, job.path, (job.sha, job.size), &got, n)?;
    seal(&out, &job.dst, in_place)?;
    drop(out);
    if let Some(hook) = on_verified {
        hook(job.sha, &job.dst);
    }
    Ok(())
}

/// The hand-off from the parser to the workers: at most `max_jobs` files waiting and
/// `max_bytes` of file data reserved by the parser and not yet written by a worker. The
/// first error recorded wins and stops both sides; every change wakes everyone (a handful of
/// threads, a few thousand files).
struct Queue<'a> {
    state: Mutex<QueueState<'a>>,
    changed: Condvar,
    max_jobs: usize,
    max_bytes: u64,
}

struct QueueState<'a> {
    jobs: VecDeque<Job<'a>>,
    bytes: u64,
    /// The parser is done: the workers stop once the queue is empty.
    closed: bool,
    failed: Option<FetchError>,
}

impl<'a> Queue<'a> {
    fn new(max_jobs: usize, max_bytes: u64) -> Self {
        Queue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                bytes: 0,
                closed: false,
                failed: None,
            }),
            changed: Condvar::new(),
            max_jobs,
            max_bytes,
        }
    }

    /// Wait until a job slot and `n` bytes are free (any `n` once nothing is in flight), and
    /// take them. Fails with the recorded error once the pipeline has failed.
    fn reserve(&self, n: u64) -> Result<()> {
        let state = lock(&self.state);
        let mut state = self
            .changed
            .wait_while(state, |s| {
                s.failed.is_none()
                    && (s.jobs.len() >= self.max_jobs
                        || (s.bytes > 0 && s.bytes.saturating_add(n) > self.max_bytes))
            })
            .unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        state.bytes += n;
        Ok(())
    }

    /// Queue a job whose bytes were reserved (only the parser adds: the slot is still free).
    fn push(&self, job: Job<'a>) -> Result<()> {
        let mut state = lock(&self.state);
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        state.jobs.push_back(job);
        self.changed.notify_all();
        Ok(())
    }

    /// The next job, or `None` once the queue is closed and empty or the pipeline failed.
    fn pop(&self) -> Option<Job<'a>> {
        let state = lock(&self.state);
        let mut state = self
            .changed
            .wait_while(state, |s| {
                s.failed.is_none() && s.jobs.is_empty() && !s.closed
            })
            .unwrap_or_else(|e| e.into_inner());
        if state.failed.is_some() {
            return None;
        }
        let job = state.jobs.pop_front();
        self.changed.notify_all();
        job
    }

    /// A worker finished a job of `n` reserved bytes.
    fn done(&self, n: u64, result: Result<()>) {
        let mut state = lock(&self.state);
        state.bytes = state.bytes.saturating_sub(n);
        if let Err(e) = result {
            state.failed.get_or_insert(e);
        }
        self.changed.notify_all();
    }

    /// The error that stopped the pipeline, if one did.
    fn failure(&self) -> Option<FetchError> {
        lock(&self.state).failed.clone()
    }

    /// Record `e` unless an earlier error was, and stop everyone.
    fn fail(&self, e: FetchError) {
        lock(&self.state).failed.get_or_insert(e);
        self.changed.notify_all();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_all();
    }

    fn into_result(self) -> Result<()> {
        let state = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        state.failed.map_or(Ok(()), Err)
    }
}

/// Fails the pipeline if its thread panics, so the others stop instead of waiting for it
/// (the panic itself reaches the caller when the thread scope ends).
struct StopOnPanic<'q, 'a>(&'q Queue<'a>);

impl Drop for StopOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .fail(FetchError::invalid("unpack", "a pipeline thread panicked"));
        }
    }
}

/// Flush the whole filesystem holding `dir` (data and metadata of every file on it).
fn sync_fs(dir: &Path) -> Result<()> {
    let d = std::fs::File::open(dir).ctx("open", dir)?;
    nix::unistd::syncfs(&d).map_err(|e| FetchError::io("syncfs", dir, e.into()))
}

/// Where the store keeps the shared, read-only tree of the package whose archive has this
/// sha256 (see [`ensure_tree`]).
pub fn tree_dir(root: &Path, archive_sha256: &str) -> PathBuf {
    root.join("trees").join(archive_sha256)
}

/// The package's shared tree, `<root>/trees/<archive sha256>/` (its top-level entries, every
/// file a hard link to the verified `cas/` copy): built from the CAS when every file of the
/// package is there, else `None`. A tree appears whole or not at all (built under a temporary
/// name and renamed into place; concurrent builders race harmlessly and the loser's copy goes)
/// and is never changed afterwards, so a realm whose packages all have trees can show them
/// to its target by bind-mounting each top-level entry, with nothing of its own to install.
/// Trees are shared by every realm of the root, as the CAS is: realms share directories, not
/// only files.
pub fn ensure_tree(root: &Path, pkg: &Package) -> Result<Option<PathBuf>> {
    let dir = tree_dir(root, &pkg.archive.sha256);
    if dir.is_dir() {
        return Ok(Some(dir));
    }
    if !stored(&root.join("cas"), pkg) {
        return Ok(None);
    }
    stamp_unsynced(root)?;
    let trees = root.join("trees");
    std::fs::create_dir_all(&trees).ctx("create dir", &trees)?;
    sweep_dead_trees(&trees);
    let tmp = trees.join(format!(
        ".tmp.{}.{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    let built = link_tree(pkg, root, &tmp).and_then(|()| {
        std::fs::rename(&tmp, &dir).or_else(|e| {
            // Another builder got there first: its tree is the same.
            if dir.is_dir() {
                Ok(())
            } else {
                Err(FetchError::io("rename into", &dir, e))
            }
        })
    });
    let _ = remove_any(&tmp);
    built.map(|()| Some(dir))
}

/// Remove tree builds left by processes that no longer exist (`.tmp.<pid>.<rand>`).
fn sweep_dead_trees(trees: &Path) {
    let Ok(list) = std::fs::read_dir(trees) else {
        return;
    };
    for e in list.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(".tmp.")
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| p != std::process::id() as i32 && !pid_alive(p)) {
            let _ = remove_any(&e.path());
        }
    }
}

/// Build the package's tree under `tree` from hard links into the CAS.
fn link_tree(pkg: &Package, root: &Path, tree: &Path) -> Result<()> {
    make_dirs(pkg, tree)?;
    let cas = root.join("cas");
    for_each_in_parallel(&pkg.files, |f| {
        let src = cas.join(&f.sha256);
        std::fs::hard_link(&src, tree.join(&f.path)).ctx("link from cas", &src)
    })
}

/// Create `tree` and every directory of `pkg` in it.
fn make_dirs(pkg: &Package, tree: &Path) -> Result<()> {
    std::fs::create_dir(tree).ctx("create dir", tree)?;
    let mut dirs: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    for f in &pkg.files {
        let mut p = Path::new(&f.path).parent();
        while let Some(d) = p.filter(|d| !d.as_os_str().is_empty()) {
            if !dirs.insert(tree.join(d)) {
                break;
            }
            p = d.parent();
        }
    }
    // BTreeSet order puts parents before children.
    for d in &dirs {
        std::fs::create_dir(d).ctx("create dir", d)?;
    }
    Ok(())
}

/// Threads that decode an archive's frames in parallel: none on a machine of two cores or
/// fewer, where the proc, the parser and the writers already use every core. Measured on 2
/// vCPUs (cold numpy, 9 alternating runs against MinIO): decoding in parallel cost 25 ms more
/// CPU per run (every decoded byte copied once more, fresh frame buffers) for no gain in time.
fn decode_threads() -> usize {
    let forced = FORCE_DECODERS.load(Ordering::Relaxed);
    if forced > 0 {
        return forced;
    }
    std::thread::available_parallelism().map_or(0, |n| match n.get() {
        0..=2 => 0,
        n => (n - 2).min(4),
    })
}

/// Tests: decode in parallel with this many threads whatever the machine (0: by the cores).
static FORCE_DECODERS: AtomicUsize = AtomicUsize::new(0);

/// How many threads an install uses: every core, up to 4.
fn install_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 4))
}

/// Run `f` on every file, the list split among [`install_threads`] threads: links into or
/// out of the CAS are independent once the directories exist, and a package is mostly these
/// calls (~1,500 link(2) for numpy). Each thread stops at its first error; that of the
/// earliest part is returned.
fn for_each_in_parallel(
    files: &[FileEntry],
    f: impl Fn(&FileEntry) -> Result<()> + Sync,
) -> Result<()> {
    let chunk = files.len().div_ceil(install_threads()).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                let f = &f;
                s.spawn(move || part.iter().try_for_each(f))
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(FetchError::invalid("link", "a link thread failed")))
            })
            .collect::<Result<Vec<()>>>()
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::{publish, PublishSource};
    use crate::store::memory::MemoryStore;
    use std::os::unix::fs::MetadataExt;

    fn make_pkgdir(root: &Path) -> PathBuf {
        let d = root.join("src").join("demo");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("__init__.py"), "X = 1\n").unwrap();
        std::fs::write(d.join("sub/mod.py"), "Y = 2\n").unwrap();
        std::fs::write(d.join("data.bin"), vec![7u8; 100_000]).unwrap();
        // Same content as data.bin: one stored copy.
        std::fs::write(d.join("sub/copy.bin"), vec![7u8; 100_000]).unwrap();
        d
    }

    async fn published(tmp: &Path) -> Arc<dyn Store> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new("t"));
        let dir = make_pkgdir(tmp);
        publish(
            store.as_ref(),
            &PublishSource::PackageDir(dir),
            &FetchConfig::default(),
        )
        .await
        .unwrap();
        store
    }

    #[tokio::test]
    async fn ensure_installs_once_and_verifies() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cache =
            RealmCache::open(tmp.path().join("c"), "r1", store, FetchConfig::default()).unwrap();
        let out = cache.ensure("demo.sub.mod").await.unwrap();
        assert!(out.fetched && out.installed && out.bytes > 0);
        assert_eq!(out.dir, cache.lib_dir().join("demo"));
        assert_eq!(
            std::fs::read_to_string(out.dir.join("sub/mod.py")).unwrap(),
            "Y = 2\n"
        );
        let again = cache.ensure("demo").await.unwrap();
        assert!(!again.fetched && !again.installed);
        let s = cache.stats();
        assert_eq!((s.packages_fetched, s.gets, s.cache_hits), (1, 2, 1));
        assert!(matches!(
            cache.ensure("nope").await.unwrap_err(),
            FetchError::NoSuchPackage { .. }
        ));
        // Nothing but the package in lib/, nothing left in staging.
        let names: Vec<_> = std::fs::read_dir(cache.lib_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("demo")]);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("c/realms/r1/staging"))
                .unwrap()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn sixteen_tasks_one_download() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cache = Arc::new(
            RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap(),
        );
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let c = cache.clone();
                tokio::spawn(async move { c.ensure("demo").await.unwrap() })
            })
            .collect();
        let mut fetched = 0;
        for t in tasks {
            fetched += usize::from(t.await.unwrap().fetched);
        }
        assert_eq!(fetched, 1);
        let s = cache.stats();
        assert_eq!(s.packages_fetched, 1);
        assert_eq!(s.gets, 2, "one index GET and one archive GET");
        assert_eq!(s.cache_hits, 15);
    }

    /// Flip one byte in the middle of `package`'s archive in `store`.
    async fn corrupt_archive(store: &dyn Store, package: &str) {
        let cfg = FetchConfig::default();
        let idx = crate::publish::read_index(store, &cfg).await.unwrap();
        let key = idx.package(package).unwrap().archive.key.clone();
        let mut data = get_bytes(store, &key, &cfg).await.unwrap().to_vec();
        let mid = data.len() / 2;
        data[mid] ^= 0xff;
        store.put(&key, data.into()).await.unwrap();
    }

    /// A cache of realm `r` under `tmp/c` whose bucket's `demo` archive is corrupt.
    async fn cache_of_corrupt_demo(tmp: &Path) -> RealmCache {
        let store = published(tmp).await;
        corrupt_archive(store.as_ref(), "demo").await;
        RealmCache::open(tmp.join("c"), "r", store, FetchConfig::default()).unwrap()
    }

    #[tokio::test]
    async fn corrupted_archive_is_refused_and_nothing_installed() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = cache_of_corrupt_demo(tmp.path()).await;
        let err = cache.ensure("demo").await.unwrap_err();
        assert!(matches!(err, FetchError::IntegrityMismatch { .. }), "{err}");
        assert_eq!(std::fs::read_dir(cache.lib_dir()).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("c/cas")).unwrap().count(),
            0
        );
        assert!(!cache.is_installed("demo"));
    }

    #[tokio::test]
    async fn archive_that_lies_about_a_file_is_refused() {
        // The archive matches its own recorded sha256, but a file inside does not match the index.
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cfg = FetchConfig::default();
        let mut idx = crate::publish::read_index(store.as_ref(), &cfg)
            .await
            .unwrap();
        let mut pkg = idx.package("demo").unwrap().clone();
        pkg.files
            .iter_mut()
            .find(|f| f.path == "demo/__init__.py")
            .unwrap()
            .sha256 = "0".repeat(64);
        idx.insert("t", pkg).unwrap();
        store.put(INDEX_KEY, idx.to_json().into()).await.unwrap();
        let cache = RealmCache::open(tmp.path().join("c"), "r", store, cfg).unwrap();
        match cache.ensure("demo").await.unwrap_err() {
            FetchError::IntegrityMismatch { file, .. } => {
                assert!(file.contains("demo/__init__.py"), "{file}")
            }
            e => panic!("{e}"),
        }
        assert_eq!(std::fs::read_dir(cache.lib_dir()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn two_realms_share_inodes_not_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let root = tmp.path().join("c");
        let a = RealmCache::open(&root, "a", store.clone(), FetchConfig::default()).unwrap();
        let b = RealmCache::open(&root, "b", store, FetchConfig::default()).unwrap();
        let oa = a.ensure("demo").await.unwrap();
        let ob = b.ensure("demo").await.unwrap();
        assert!(oa.fetched);
        assert!(
            ob.installed && !ob.fetched,
            "second realm links from the CAS"
        );
        assert_ne!(oa.dir, ob.dir);
        let ia = std::fs::metadata(oa.dir.join("data.bin")).unwrap();
        let ib = std::fs::metadata(ob.dir.join("data.bin")).unwrap();
        assert_eq!((ia.dev(), ia.ino()), (ib.dev(), ib.ino()));
        let copy = std::fs::metadata(oa.dir.join("sub/copy.bin")).unwrap();
        assert_eq!(
            copy.ino(),
            ia.ino(),
            "identical files in one package share the inode"
        );
        // The package's shared tree is built in the background after the first install.
        let tree = wait_for_tree(&root);
        assert_eq!(
            ia.ino(),
            std::fs::metadata(tree.join("demo/data.bin")).unwrap().ino()
        );
        assert_eq!(
            std::fs::metadata(oa.dir.join("data.bin")).unwrap().nlink(),
            7,
            "cas + two paths in each of two realms and in the shared tree"
        );
        assert_eq!(ia.mode() & 0o777, 0o444);
        assert_ne!(
            std::fs::metadata(&oa.dir).unwrap().ino(),
            std::fs::metadata(&ob.dir).unwrap().ino()
        );
    }

    #[tokio::test]
    async fn complete_only_when_every_package_of_the_snapshot_is_installed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let root = tmp.path().join("c");
        assert_eq!(realm_complete(&root, "a").unwrap(), None, "no realm yet");
        let a = RealmCache::open(&root, "a", store, FetchConfig::default()).unwrap();
        a.index().await.unwrap();
        assert_eq!(
            realm_complete(&root, "a").unwrap(),
            None,
            "snapshot, nothing installed"
        );
        let stamp = root.join("realms/a/complete");
        assert!(std::fs::read_to_string(&stamp)
            .unwrap()
            .ends_with(" packages -\n"));
        assert_eq!(realm_complete(&root, "a").unwrap(), None, "remembered");
        a.ensure("demo").await.unwrap();
        assert_eq!(realm_complete(&root, "a").unwrap(), Some(1));
        // Remembered, and answered again from the stamp; a stamp of other files is ignored.
        assert!(std::fs::read_to_string(&stamp)
            .unwrap()
            .ends_with(" packages 1\n"));
        assert_eq!(realm_complete(&root, "a").unwrap(), Some(1));
        std::fs::write(&stamp, "v1 index 0:0:0:0.0:0.0 packages 7\n").unwrap();
        assert_eq!(realm_complete(&root, "a").unwrap(), Some(1));
        // A marker for another archive (the snapshot changed under it) is not complete.
        let marker = root.join("realms/a/state/demo.installed");
        let text = std::fs::read_to_string(&marker).unwrap();
        let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
        m["archive_sha256"] = "0".repeat(64).into();
        std::fs::write(&marker, m.to_string()).unwrap();
        assert_eq!(realm_complete(&root, "a").unwrap(), None);
        assert!(realm_complete(&root, "../x").is_err());
    }

    #[tokio::test]
    async fn crash_leftovers_are_recovered() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let root = tmp.path().join("c");
        let cache = RealmCache::open(&root, "r", store.clone(), FetchConfig::default()).unwrap();
        cache.index().await.unwrap();
        // Simulate an install killed between renaming entries and writing the marker.
        let lib = cache.lib_dir();
        std::fs::create_dir_all(lib.join("demo")).unwrap();
        std::fs::write(lib.join("demo/partial.py"), "").unwrap();
        write_atomic(&cache.pending_path("demo"), br#"["demo"]"#).unwrap();
        std::fs::create_dir_all(root.join("realms/r/staging/demo.999999999.deadbeef")).unwrap();
        let out = cache.ensure("demo").await.unwrap();
        assert!(out.installed);
        assert!(!lib.join("demo/partial.py").exists());
        assert!(lib.join("demo/__init__.py").exists());
        assert!(!cache.pending_path("demo").exists());
        assert_eq!(
            std::fs::read_dir(root.join("realms/r/staging"))
                .unwrap()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn a_crash_of_the_machine_costs_a_refetch_never_a_wrong_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let root = tmp.path().join("c");
        let cache = RealmCache::open(&root, "r", store.clone(), FetchConfig::default()).unwrap();
        cache.ensure("demo").await.unwrap();
        wait_for_tree(&root);
        assert_eq!(
            std::fs::read_to_string(root.join(UNSYNCED)).unwrap(),
            boot_id().unwrap(),
            "unflushed installs are stamped with this boot"
        );
        assert_eq!(realm_complete(&root, "r").unwrap(), Some(1));
        drop(cache);
        // As if the machine went down before the page cache reached the disk: the stamp names
        // another boot and one stored file lost its data (same size, zeros).
        std::fs::write(root.join(UNSYNCED), "a-boot-that-crashed").unwrap();
        let init = cache_file(&root, "demo/__init__.py", &store).await;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o644)).unwrap();
        let len = std::fs::metadata(&init).unwrap().len() as usize;
        std::fs::write(&init, vec![0u8; len]).unwrap();
        let other = cache_file(&root, "demo/sub/mod.py", &store).await;
        assert_eq!(
            realm_complete(&root, "r").unwrap(),
            None,
            "nothing unflushed is trusted before the check"
        );

        let cache = RealmCache::open(&root, "r", store, FetchConfig::default()).unwrap();
        assert!(!root.join(UNSYNCED).exists(), "checked, flushed, unstamped");
        assert!(!init.exists(), "the damaged file left the CAS");
        assert!(
            !root.join("trees").exists(),
            "trees, which may link the damaged file, are dropped"
        );
        assert!(other.exists(), "intact files stay");
        assert!(
            !cache.is_installed("demo"),
            "its package must be installed again"
        );
        let out = cache.ensure("demo").await.unwrap();
        assert!(out.installed && out.fetched);
        assert_eq!(
            std::fs::read_to_string(cache.lib_dir().join("demo/__init__.py")).unwrap(),
            "X = 1\n"
        );
    }

    /// The one shared tree under `root`, once it is built and no build is under way.
    fn wait_for_tree(root: &Path) -> PathBuf {
        let trees = root.join("trees");
        for _ in 0..500 {
            let names: Vec<String> = std::fs::read_dir(&trees)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            if let [name] = names.as_slice() {
                if !name.starts_with('.') {
                    return trees.join(name);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no shared tree under {}", trees.display());
    }

    #[tokio::test]
    async fn a_realm_whose_content_is_all_stored_is_shown_from_shared_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let root = tmp.path().join("c");
        assert_eq!(realm_trees(&root, "b").unwrap(), None, "no snapshot");
        let b = RealmCache::open(&root, "b", store.clone(), FetchConfig::default()).unwrap();
        b.index().await.unwrap();
        assert_eq!(realm_trees(&root, "b").unwrap(), None, "no content yet");
        assert!(
            !root.join("trees").exists(),
            "nothing is built without content"
        );

        let a = RealmCache::open(&root, "a", store.clone(), FetchConfig::default()).unwrap();
        a.ensure("demo").await.unwrap();
        let view = realm_trees(&root, "b")
            .unwrap()
            .expect("every package has its content");
        assert_eq!(view.packages(), 1);
        let names: Vec<&str> = view.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["demo"]);
        let demo = &view.entries[0];
        assert!(demo.is_dir && demo.source.starts_with(root.join("trees")));
        assert_eq!(
            std::fs::read_to_string(demo.source.join("__init__.py")).unwrap(),
            "X = 1\n"
        );
        let stored = cache_file(&root, "demo/sub/mod.py", &store).await;
        let shown = std::fs::metadata(demo.source.join("sub/mod.py")).unwrap();
        assert_eq!(shown.ino(), std::fs::metadata(&stored).unwrap().ino());
        assert_eq!(shown.mode() & 0o777, 0o444);
        assert!(
            !b.lib_dir().join("demo").exists(),
            "the realm installs nothing of its own"
        );
        // Remembered, and whole: a second answer is the same, no temporary is left behind.
        assert_eq!(realm_trees(&root, "b").unwrap().as_ref(), Some(&view));
        wait_for_tree(&root);
        // A tree that went away is built again, not shown missing.
        std::fs::remove_dir_all(demo.source.parent().unwrap()).unwrap();
        let again = realm_trees(&root, "b")
            .unwrap()
            .expect("rebuilt from the CAS");
        assert!(again.entries[0].source.join("sub/mod.py").is_file());
        assert_eq!(
            again.bytecode.get("demo"),
            Some(&None),
            "published without bytecode"
        );
        assert!(!again.compiled_for("cpython-311"));

        // A hostile snapshot cannot point a tree outside the store (the index checks every
        // archive digest), and a package whose content is missing shows nothing.
        let idx = std::fs::read_to_string(root.join("realms/b/index.json")).unwrap();
        let sha = &view.entries[0]
            .source
            .parent()
            .unwrap()
            .file_name()
            .unwrap();
        let bad = idx.replace(sha.to_str().unwrap(), "../../../../etc");
        std::fs::write(root.join("realms/b/index.json"), bad).unwrap();
        assert!(realm_trees(&root, "b").is_err());
    }

    /// The CAS path of the file `rel` of the published package.
    async fn cache_file(root: &Path, rel: &str, store: &Arc<dyn Store>) -> PathBuf {
        let idx = crate::publish::read_index(store.as_ref(), &FetchConfig::default())
            .await
            .unwrap();
        let f = idx
            .package("demo")
            .unwrap()
            .files
            .iter()
            .find(|f| f.path == rel)
            .unwrap()
            .clone();
        root.join("cas").join(f.sha256)
    }

    #[tokio::test]
    async fn the_file_hook_sees_each_verified_file_before_the_install_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cache =
            RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
        type Seen = Mutex<Vec<(String, Vec<u8>)>>;
        let seen: Arc<Seen> = Arc::default();
        let s2 = seen.clone();
        cache.set_file_hook(Arc::new(move |sha: &str, path: &Path| {
            lock(&s2).push((sha.to_owned(), std::fs::read(path).unwrap()));
        }));
        cache.ensure("demo").await.unwrap();
        let seen = lock(&seen);
        assert_eq!(seen.len(), 4, "every file once");
        for (sha, data) in seen.iter() {
            let got = hex::encode(Sha256::digest(data));
            assert_eq!(&got, sha, "the hook gets verified bytes");
        }
    }

    /// Records what an install that streams into the lib dir shows, at each step.
    #[derive(Default)]
    struct Watch {
        lib: PathBuf,
        /// At `placed`: every file under the lib dir with its size and mode.
        placed: Mutex<Vec<(String, u64, u32)>>,
        /// At each announcement: the lib path, its bytes' sha256, its mode.
        verified: Mutex<Vec<(String, String, u32)>>,
        ended: Mutex<Vec<std::result::Result<(), String>>>,
        /// At `past_trace`: how many files had been announced.
        past_trace: Mutex<Vec<usize>>,
    }

    impl Placement for Watch {
        fn past_trace(&self, _pkg: &Package) {
            let announced = lock(&self.verified).len();
            lock(&self.past_trace).push(announced);
        }

        fn placed(&self, _pkg: &Package) {
            let mut files = Vec::new();
            let mut dirs = vec![self.lib.clone()];
            while let Some(d) = dirs.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        dirs.push(e.path());
                    } else {
                        let rel = e.path().strip_prefix(&self.lib).unwrap().to_owned();
                        files.push((rel.display().to_string(), m.len(), m.mode() & 0o777));
                    }
                }
            }
            files.sort();
            *lock(&self.placed) = files;
        }

        fn ended(&self, _pkg: &Package, result: std::result::Result<(), &FetchError>) {
            lock(&self.ended).push(result.map_err(|e| e.to_string()));
        }
    }

    fn watched(cache: &RealmCache) -> Arc<Watch> {
        let w = Arc::new(Watch {
            lib: cache.lib_dir(),
            ..Watch::default()
        });
        cache.set_placement(w.clone());
        let w2 = w.clone();
        cache.set_file_hook(Arc::new(move |_sha: &str, path: &Path| {
            let data = std::fs::read(path).unwrap();
            let mode = std::fs::metadata(path).unwrap().mode() & 0o777;
            let rel = path.strip_prefix(&w2.lib).unwrap().display().to_string();
            lock(&w2.verified).push((rel, hex::encode(Sha256::digest(data)), mode));
        }));
        w
    }

    #[tokio::test]
    async fn a_placed_install_shows_every_name_first_and_each_file_once_verified() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cache =
            RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
        let w = watched(&cache);
        let out = cache.ensure("demo").await.unwrap();
        assert!(out.fetched && out.installed);
        let index = cache.index().await.unwrap();
        let pkg = index.package("demo").unwrap();
        // Placed: every name of the package, each an empty placeholder, before any content.
        let mut listed: Vec<(String, u64, u32)> = pkg
            .files
            .iter()
            .map(|f| (f.path.clone(), 0, 0o644))
            .collect();
        listed.sort();
        assert_eq!(*lock(&w.placed), listed);
        // Announced: each file once, in its place in the lib dir, with its verified bytes.
        let mut verified = lock(&w.verified).clone();
        verified.sort();
        let mut expected: Vec<(String, String, u32)> = pkg
            .files
            .iter()
            .map(|f| (f.path.clone(), f.sha256.clone(), 0o444))
            .collect();
        expected.sort();
        assert_eq!(verified, expected);
        assert_eq!(*lock(&w.ended), [Ok(())]);
        assert!(cache.is_installed("demo"));
        assert!(
            lock(&w.past_trace).is_empty(),
            "published without an import trace: never past one"
        );
        // In the CAS, sharing inodes: the two identical files are one stored copy.
        let a = std::fs::metadata(cache.lib_dir().join("demo/data.bin")).unwrap();
        let b = std::fs::metadata(cache.lib_dir().join("demo/sub/copy.bin")).unwrap();
        assert_eq!(a.ino(), b.ino());
        assert_eq!(
            std::fs::read_dir(tmp.path().join("c/cas")).unwrap().count(),
            3
        );
        // Nothing left beside the files: no journal, no temporary link, no staging.
        let realm = tmp.path().join("c/realms/r");
        assert!(!realm.join("state/demo.pending").exists());
        assert_eq!(std::fs::read_dir(realm.join("staging")).unwrap().count(), 0);
        let names: Vec<String> = std::fs::read_dir(cache.lib_dir().join("demo/sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    }

    /// Installs in a second cache on the same root, as a fill process would, after checking
    /// that the lock it was handed is held; or declines.
    struct Elsewhere {
        root: PathBuf,
        store: Arc<dyn Store>,
        decline: bool,
    }

    impl Delegate for Elsewhere {
        fn install(
            &self,
            pkg: &Package,
            lock_file: &std::fs::File,
            placement: &Arc<dyn Placement>,
            hook: Option<&Arc<FileHook>>,
        ) -> Option<Result<u64>> {
            if self.decline {
                return None;
            }
            // The handed lock is the package's, and it is held: another open of it must wait.
            let path = self
                .root
                .join("realms/r/state")
                .join(format!("{}.lock", pkg.name));
            let again = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            assert!(matches!(
                nix::fcntl::Flock::lock(again, nix::fcntl::FlockArg::LockExclusiveNonblock),
                Err((_, nix::errno::Errno::EWOULDBLOCK))
            ));
            assert!(lock_file.metadata().is_ok());
            let other =
                RealmCache::open(&self.root, "r", self.store.clone(), FetchConfig::default())
                    .unwrap();
            other.set_placement(placement.clone());
            if let Some(h) = hook {
                other.set_file_hook(h.clone());
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            Some(rt.block_on(other.fill(pkg)))
        }
    }

    /// A watched cache of `tmp` whose installs go to [`Elsewhere`].
    async fn delegating(tmp: &Path, decline: bool) -> (RealmCache, Arc<Watch>, PathBuf) {
        let store = published(tmp).await;
        let root = tmp.join("c");
        let cache = RealmCache::open(&root, "r", store.clone(), FetchConfig::default()).unwrap();
        let w = watched(&cache);
        cache.set_delegate(Arc::new(Elsewhere {
            root: root.clone(),
            store,
            decline,
        }));
        (cache, w, root)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delegated_install_streams_from_the_other_process_and_is_counted_here() {
        let tmp = tempfile::tempdir().unwrap();
        let (cache, w, root) = delegating(tmp.path(), false).await;
        let out = cache.ensure("demo").await.unwrap();
        assert!(out.fetched && out.installed);
        let index = cache.index().await.unwrap();
        let pkg = index.package("demo").unwrap();
        // The other side's placement and announcements reached this side's watchers.
        assert_eq!(lock(&w.placed).len(), pkg.files.len());
        let mut verified: Vec<String> = lock(&w.verified).iter().map(|v| v.0.clone()).collect();
        verified.sort();
        let mut expected: Vec<String> = pkg.files.iter().map(|f| f.path.clone()).collect();
        expected.sort();
        assert_eq!(verified, expected);
        assert_eq!(*lock(&w.ended), [Ok(())]);
        assert!(cache.is_installed("demo"));
        let st = cache.stats();
        assert_eq!(st.packages_fetched, 1);
        assert_eq!(st.bytes_fetched, pkg.archive.size + index_bytes(&root));
        // The lock is free again once the install is over.
        let path = root.join("realms/r/state/demo.lock");
        let again = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        assert!(
            nix::fcntl::Flock::lock(again, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
        );
    }

    #[tokio::test]
    async fn a_delegate_that_cannot_start_leaves_the_install_here() {
        let tmp = tempfile::tempdir().unwrap();
        let (cache, w, _) = delegating(tmp.path(), true).await;
        let out = cache.ensure("demo").await.unwrap();
        assert!(out.fetched && out.installed);
        assert!(!lock(&w.placed).is_empty(), "streamed here");
        assert_eq!(*lock(&w.ended), [Ok(())]);
        assert_eq!(cache.stats().packages_fetched, 1);
    }

    fn index_bytes(root: &Path) -> u64 {
        std::fs::metadata(root.join("realms/r/index.json"))
            .unwrap()
            .len()
    }

    #[tokio::test]
    async fn a_placed_install_that_fails_takes_its_names_away_again() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = cache_of_corrupt_demo(tmp.path()).await;
        let w = watched(&cache);
        let err = cache.ensure("demo").await.unwrap_err();
        assert!(matches!(err, FetchError::IntegrityMismatch { .. }), "{err}");
        assert_eq!(lock(&w.placed).len(), 4, "the skeleton was placed first");
        assert!(
            lock(&w.verified).len() < 4,
            "a corrupt file is never announced"
        );
        assert_eq!(lock(&w.ended).len(), 1);
        assert!(lock(&w.ended)[0].is_err());
        // Nothing of the package stays: no name in the lib dir, nothing in the CAS, no journal.
        assert_eq!(std::fs::read_dir(cache.lib_dir()).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("c/cas")).unwrap().count(),
            0
        );
        assert!(!tmp.path().join("c/realms/r/state/demo.pending").exists());
        assert!(!cache.is_installed("demo"));
    }

    #[tokio::test]
    async fn prefetch_installs_named_packages_and_skips_unknown_names() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cache =
            RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
        let names = ["os", "demo", "demo.sub", "nope"].map(String::from);
        let outs = cache.prefetch(&names, 4).await.unwrap();
        assert_eq!(outs.len(), 1, "one package named twice, the rest unknown");
        assert!(outs[0].as_ref().unwrap().fetched);
        assert!(cache.is_installed("demo"));
        assert!(cache.prefetch(&names, 4).await.unwrap()[0]
            .as_ref()
            .is_ok_and(|o| !o.fetched));
    }

    #[tokio::test]
    async fn an_archive_that_unpacks_to_more_than_its_index_lists_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cfg = FetchConfig::default();
        let idx = crate::publish::read_index(store.as_ref(), &cfg)
            .await
            .unwrap();
        let mut pkg = idx.package("demo").unwrap().clone();
        // 64 MiB of zeros compresses to a few KiB: a decompression bomb in one tar entry.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(
            &mut h,
            "demo/__init__.py",
            std::io::repeat(0).take(64 << 20),
        )
        .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, FetchError::IntegrityMismatch { .. }), "{err}");
        // The same bytes with a size the index allows get as far as the hash check.
        pkg.files.truncate(1);
        pkg.files[0].size = 64 << 20;
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t2"),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");

        // A large file goes to its worker in pieces, with the same checks.
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        let big = (64 << 20) + 1;
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(big);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, "demo/__init__.py", std::io::repeat(0).take(big))
            .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let zeros = {
            let mut h = Sha256::new();
            std::io::copy(&mut std::io::repeat(0).take(big), &mut h).unwrap();
            hex::encode(h.finalize())
        };
        pkg.files[0].size = big + 1;
        pkg.files[0].sha256 = zeros.clone();
        let err = unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t3"), None).unwrap_err();
        assert!(err.to_string().contains(&format!("size {big}")), "{err}");
        // An entry longer than the index says is cut off after the pieces it may have, and
        // its worker announces nothing.
        pkg.files[0].size = 2 << 20;
        let announced = Arc::new(AtomicU64::new(0));
        let a2 = announced.clone();
        let count = move |_: &str, _: &Path| {
            a2.fetch_add(1, Ordering::Relaxed);
        };
        let err =
            unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t5"), Some(&count)).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        assert_eq!(announced.load(Ordering::Relaxed), 0);
        pkg.files[0].size = big;
        let hooked = Arc::new(AtomicU64::new(0));
        let h2 = hooked.clone();
        let hook = move |_: &str, p: &Path| {
            h2.store(std::fs::metadata(p).unwrap().len(), Ordering::Relaxed);
        };
        unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t4"), Some(&hook)).unwrap();
        assert_eq!(hooked.load(Ordering::Relaxed), big);
        assert!(root.join("cas").join(&zeros).exists());
    }

    /// A package of `n` files `demo/fNN.bin` whose archive holds other bytes for file `bad`.
    fn package_with_a_corrupt_file(n: usize, bad: usize) -> (Package, Vec<u8>) {
        let mut tar = tar::Builder::new(Vec::new());
        let mut files = Vec::new();
        for i in 0..n {
            let path = format!("demo/f{i:02}.bin");
            let data = vec![i as u8; 1000 + 37 * i];
            files.push(crate::index::FileEntry {
                path: path.clone(),
                sha256: hex::encode(Sha256::digest(&data)),
                size: data.len() as u64,
            });
            let mut stored = data;
            if i == bad {
                stored[500] ^= 1;
            }
            let mut h = tar::Header::new_ustar();
            h.set_size(stored.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, &path, &stored[..]).unwrap();
        }
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let pkg = Package {
            name: "demo".into(),
            version: "1".into(),
            source: "test".into(),
            top_level: vec!["demo".into()],
            archive: crate::index::Archive {
                key: "pkgs/demo.tar.zst".into(),
                sha256: hex::encode(Sha256::digest(&data)),
                size: data.len() as u64,
                encoding: Encoding::TarZstd,
            },
            files,
            bytecode: None,
            traced: None,
            reads: Vec::new(),
        };
        (pkg, data)
    }

    #[test]
    fn a_corrupt_file_among_many_stops_the_pipeline_and_nothing_reaches_the_cas() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        // Many more files than workers, the bad one in the middle.
        let (pkg, data) = package_with_a_corrupt_file(40, 20);
        let hooked: Arc<Mutex<Vec<String>>> = Arc::default();
        let h2 = hooked.clone();
        let hook = move |sha: &str, _: &Path| lock(&h2).push(sha.to_owned());
        let err =
            unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t"), Some(&hook)).unwrap_err();
        match &err {
            FetchError::IntegrityMismatch { file, expected, .. } => {
                assert!(file.starts_with("demo/f20.bin "), "{err}");
                assert!(expected.contains(&pkg.files[20].sha256), "{err}");
            }
            e => panic!("{e}"),
        }
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 0);
        assert!(
            !lock(&hooked).contains(&pkg.files[20].sha256),
            "the hook never sees the corrupt file"
        );

        // The same package intact: every file verified, announced once and stored.
        let (pkg, data) = package_with_a_corrupt_file(40, usize::MAX);
        lock(&hooked).clear();
        unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t2"), Some(&hook)).unwrap();
        let mut hooked = std::mem::take(&mut *lock(&hooked));
        hooked.sort();
        let mut listed: Vec<_> = pkg.files.iter().map(|f| f.sha256.clone()).collect();
        listed.sort();
        assert_eq!(hooked, listed);
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 40);
        for f in &pkg.files {
            let got = std::fs::read(tmp.path().join("t2").join(&f.path)).unwrap();
            assert_eq!(hex::encode(Sha256::digest(&got)), f.sha256);
        }
    }

    #[test]
    fn frames_decoded_in_parallel_install_the_same_and_a_corrupt_file_still_stops_all() {
        // Decoding threads whatever this machine has (others tests may take that path too:
        // both paths are correct).
        FORCE_DECODERS.store(2, Ordering::Relaxed);
        let reframed = |data: &[u8]| -> Vec<u8> {
            let raw = zstd::decode_all(data).unwrap();
            raw.chunks(8 << 10)
                .flat_map(|c| zstd::bulk::compress(c, 1).unwrap())
                .collect()
        };
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        let (pkg, data) = package_with_a_corrupt_file(40, 20);
        let err = unpack_tree(
            &pkg,
            &reframed(&data)[..],
            &root,
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&err, FetchError::IntegrityMismatch { file, .. } if file.starts_with("demo/f20.bin ")),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 0);
        let (pkg, data) = package_with_a_corrupt_file(40, usize::MAX);
        let framed = reframed(&data);
        assert!(framed.len() > data.len(), "many frames");
        unpack_tree(&pkg, &framed[..], &root, &tmp.path().join("t2"), None).unwrap();
        for f in &pkg.files {
            let got = std::fs::read(tmp.path().join("t2").join(&f.path)).unwrap();
            assert_eq!(hex::encode(Sha256::digest(&got)), f.sha256);
        }
        FORCE_DECODERS.store(0, Ordering::Relaxed);
    }

    #[test]
    fn a_tar_header_larger_than_the_package_is_refused_before_it_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let (pkg, _) = package_with_a_corrupt_file(2, usize::MAX);
        // A GNU long-name record of 64 MiB: the tar reader would hold it in memory whole.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(64 << 20);
        h.set_cksum();
        tar.append_data(
            &mut h,
            "././@LongLink",
            std::io::repeat(b'a').take(64 << 20),
        )
        .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        assert!(data.len() < 64 << 10, "a small archive");
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("archive unpacks to more than its index lists"),
            "{err}"
        );
    }

    #[test]
    fn bad_realm_names_are_refused() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new("t"));
        for bad in ["", "..", "a/b", ".hidden"] {
            assert!(
                RealmCache::open("/tmp/x", bad, store.clone(), FetchConfig::default()).is_err(),
                "{bad}"
            );
        }
    }
}
