//! The realm cache through its API, on the in-memory store: installs, single flight, integrity,
//! sharing between realms, a realm's status, crash recovery, shared trees, the file hook,
//! streaming (placed and delegated) installs, prefetch. Fixtures shared with the files' own
//! tests ([`published`]) are here too.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::layout::UNSYNCED;
use super::recovery::boot_id;
use super::*;
use crate::publish::{publish, PublishSource};
use crate::store::local::write_atomic;
use crate::store::memory::MemoryStore;

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

pub(super) async fn published(tmp: &Path) -> Arc<dyn Store> {
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
    write_atomic(&cache.installer.pending_path("demo"), br#"["demo"]"#).unwrap();
    std::fs::create_dir_all(root.join("realms/r/staging/demo.999999999.deadbeef")).unwrap();
    let out = cache.ensure("demo").await.unwrap();
    assert!(out.installed);
    assert!(!lib.join("demo/partial.py").exists());
    assert!(lib.join("demo/__init__.py").exists());
    assert!(!cache.installer.pending_path("demo").exists());
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
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
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
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
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
            RealmCache::open(&self.root, "r", self.store.clone(), FetchConfig::default()).unwrap();
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
    assert!(nix::fcntl::Flock::lock(again, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok());
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
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
    let names = ["os", "demo", "demo.sub", "nope"].map(String::from);
    let outs = cache.prefetch(&names, 4).await.unwrap();
    assert_eq!(outs.len(), 1, "one package named twice, the rest unknown");
    assert!(outs[0].as_ref().unwrap().fetched);
    assert!(cache.is_installed("demo"));
    assert!(cache.prefetch(&names, 4).await.unwrap()[0]
        .as_ref()
        .is_ok_and(|o| !o.fetched));
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
