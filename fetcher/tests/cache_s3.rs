//! The realm cache against a real MinIO: cold and warm, single flight across tasks, caches and
//! processes, kill -9 mid-download, corrupted objects, shared inodes across realms.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sigma_fetcher::index::INDEX_KEY;
use sigma_fetcher::publish::{publish, read_index, PublishSource};
use sigma_fetcher::store::s3::S3Store;
use sigma_fetcher::store::{get_bytes, Store};
use sigma_fetcher::{FetchConfig, FetchError, RealmCache};

async fn setup(
    minio: &common::Minio,
    bucket: &str,
    big: usize,
) -> (Arc<S3Store>, tempfile::TempDir) {
    let cfg = FetchConfig::default();
    let store = minio.bucket(bucket, &cfg).await;
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo", big);
    publish(store.as_ref(), &PublishSource::PackageDir(pkg), &cfg)
        .await
        .unwrap();
    (store, tmp)
}

fn fetch_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sigma-fetch"))
}

fn fetch_cmd(minio: &common::Minio, root: &Path, realm: &str, bucket: &str) -> Command {
    let mut c = Command::new(fetch_bin());
    c.args([
        "ensure",
        "--root",
        root.to_str().unwrap(),
        "--realm",
        realm,
        "--bucket",
        &format!("s3://{bucket}"),
    ]);
    c.envs(minio.aws_env());
    c.env_remove("AWS_PROFILE");
    c
}

#[tokio::test]
async fn cold_from_minio_then_warm_with_minio_stopped() {
    let mut minio = common::Minio::start();
    let (store, tmp) = setup(&minio, "warm", 200_000).await;
    let root = tmp.path().join("cache");
    let cold = RealmCache::open(&root, "r", store.clone(), FetchConfig::default()).unwrap();
    let out = cold.ensure("demo").await.unwrap();
    assert!(out.fetched && out.bytes > 0);
    assert_eq!(
        std::fs::read(out.dir.join("sub/mod.py")).unwrap(),
        b"def f():\n    return 42\n"
    );

    minio.stop();
    // A new cache object (as after a supervisor restart) on the same root: no network needed.
    let warm = RealmCache::open(&root, "r", store.clone(), FetchConfig::default()).unwrap();
    let t = Instant::now();
    let out = warm.ensure("demo.sub.mod").await.unwrap();
    assert!(!out.fetched && !out.installed);
    assert_eq!(warm.stats().gets, 0);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "warm ensure touched the network"
    );
    // A realm that never fetched its index cannot work without the server: Unavailable, bounded.
    let fresh = RealmCache::open(&root, "other", store, FetchConfig::default()).unwrap();
    let t = Instant::now();
    let e = fresh.ensure("demo").await.unwrap_err();
    assert!(matches!(e, FetchError::Unavailable { .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    assert!(common::tree(&fresh.lib_dir()).is_empty());
}

#[tokio::test]
async fn sixteen_concurrent_ensures_make_one_download() {
    let minio = common::Minio::start();
    let (store, tmp) = setup(&minio, "tasks", 1_000_000).await;
    let cache = Arc::new(
        RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap(),
    );
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let c = cache.clone();
            let name = if i % 2 == 0 { "demo" } else { "demo.sub" };
            tokio::spawn(async move { c.ensure(name).await.unwrap() })
        })
        .collect();
    let outs: Vec<_> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outs.iter().filter(|o| o.fetched).count(), 1);
    let s = cache.stats();
    assert_eq!(s.gets, 2, "index + one archive: {s:?}");
    assert_eq!(s.packages_fetched, 1);
    assert_eq!(s.cache_hits, 15);
}

#[test]
fn four_caches_on_one_root_make_one_download() {
    // Four independent cache objects, each on its own thread and runtime (as four supervisors
    // would be): only the per-package file lock stands between them.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let minio = common::Minio::start();
    let (store, tmp) = rt.block_on(setup(&minio, "caches", 2_000_000));
    let root = tmp.path().join("c");
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (store, root, barrier) = (store.clone(), root.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                let cache = RealmCache::open(&root, "r", store, FetchConfig::default()).unwrap();
                rt.block_on(cache.index()).unwrap();
                barrier.wait();
                let out = rt.block_on(cache.ensure("demo")).unwrap();
                let s = cache.stats();
                (out.fetched, s.packages_fetched, s.gets)
            })
        })
        .collect();
    let results: Vec<(bool, u64, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.0).count(), 1, "{results:?}");
    assert_eq!(results.iter().map(|r| r.1).sum::<u64>(), 1, "{results:?}");
    // GETs: at most one index GET per cache, plus the single archive GET.
    assert!(
        results.iter().map(|r| r.2).sum::<u64>() <= 4 + 1,
        "{results:?}"
    );
}

#[tokio::test]
async fn four_processes_make_one_download() {
    let minio = common::Minio::start();
    let (_store, tmp) = setup(&minio, "procs", 3_000_000).await;
    let root = tmp.path().join("c");
    let children: Vec<_> = (0..4)
        .map(|_| {
            fetch_cmd(&minio, &root, "r", "procs")
                .args(["demo", "--slow-ms", "1"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut fetched = 0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8(out.stdout).unwrap();
        fetched += usize::from(line.contains("\"fetched\":true"));
    }
    assert_eq!(fetched, 1);
}

/// Some file under `dir` has data (tolerates the tree changing underneath).
fn has_bytes(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| match e.file_type() {
            Ok(t) if t.is_dir() => has_bytes(&e.path()),
            Ok(_) => e.metadata().is_ok_and(|m| m.len() > 0),
            Err(_) => false,
        })
    })
}

#[tokio::test]
async fn kill_9_mid_download_leaves_nothing_visible() {
    let minio = common::Minio::start();
    let (_store, tmp) = setup(&minio, "kill", 8_000_000).await;
    let root = tmp.path().join("c");
    let mut child = fetch_cmd(&minio, &root, "r", "kill")
        .args(["demo", "--slow-ms", "20"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let staging = root.join("realms/r/staging");
    let deadline = Instant::now() + Duration::from_secs(20);
    // The archive streams into the staged tree: kill once some file there has bytes.
    loop {
        let started = has_bytes(&staging);
        if started {
            break;
        }
        assert!(Instant::now() < deadline, "download never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "fetch finished before it could be killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let lib = root.join("realms/r/lib");
    assert!(
        common::tree(&lib).is_empty(),
        "visible after kill: {:?}",
        common::tree(&lib)
    );
    assert!(!root.join("realms/r/state/demo.installed").exists());

    let out = fetch_cmd(&minio, &root, "r", "kill")
        .arg("demo")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"fetched\":true"));
    assert_eq!(
        std::fs::metadata(lib.join("demo/blob.bin")).unwrap().len(),
        8_000_000
    );
    assert!(
        common::tree(&staging).is_empty(),
        "temp names not cleaned: {:?}",
        common::tree(&staging)
    );
}

#[tokio::test]
async fn corrupted_object_in_bucket_is_refused() {
    let minio = common::Minio::start();
    let (store, tmp) = setup(&minio, "corrupt", 100_000).await;
    let cfg = FetchConfig::default();
    let idx = read_index(store.as_ref(), &cfg).await.unwrap();
    let key = idx.package("demo").unwrap().archive.key.clone();
    let mut data = get_bytes(store.as_ref(), &key, &cfg)
        .await
        .unwrap()
        .to_vec();
    let last = data.len() - 10;
    data[last] ^= 1;
    store.put(&key, data.into()).await.unwrap();
    let cache = RealmCache::open(tmp.path().join("c"), "r", store.clone(), cfg).unwrap();
    let e = cache.ensure("demo").await.unwrap_err();
    match &e {
        FetchError::IntegrityMismatch {
            file,
            expected,
            got,
        } => {
            assert!(file.contains(&key), "{e}");
            assert_ne!(expected, got);
        }
        _ => panic!("expected IntegrityMismatch, got {e}"),
    }
    assert!(common::tree(&cache.lib_dir()).is_empty());
    assert!(!cache.is_installed("demo"));
    // A truncated object is refused the same way.
    store
        .put(&key, bytes::Bytes::from_static(b"short"))
        .await
        .unwrap();
    assert!(matches!(
        cache.ensure("demo").await,
        Err(FetchError::IntegrityMismatch { .. })
    ));
    assert!(common::tree(&cache.lib_dir()).is_empty());
}

#[tokio::test]
async fn two_realms_share_files_but_not_dirs() {
    let minio = common::Minio::start();
    let (store, tmp) = setup(&minio, "realms", 500_000).await;
    let root = tmp.path().join("c");
    let a = RealmCache::open(&root, "alpha", store.clone(), FetchConfig::default()).unwrap();
    let b = RealmCache::open(&root, "beta", store.clone(), FetchConfig::default()).unwrap();
    let oa = a.ensure("demo").await.unwrap();
    let ob = b.ensure("demo").await.unwrap();
    assert!(oa.fetched && !ob.fetched && ob.installed);
    assert_ne!(a.lib_dir(), b.lib_dir());
    for f in ["blob.bin", "__init__.py", "sub/mod.py"] {
        let (ma, mb) = (
            std::fs::metadata(oa.dir.join(f)).unwrap(),
            std::fs::metadata(ob.dir.join(f)).unwrap(),
        );
        assert_eq!((ma.dev(), ma.ino()), (mb.dev(), mb.ino()), "{f}");
        assert_eq!(ma.mode() & 0o777, 0o444, "{f} must be read-only");
    }
    assert_ne!(
        std::fs::metadata(&oa.dir).unwrap().ino(),
        std::fs::metadata(&ob.dir).unwrap().ino()
    );
}

#[tokio::test]
async fn wrong_credentials_reach_the_caller_as_permission_denied() {
    let minio = common::Minio::start();
    let (_store, tmp) = setup(&minio, "creds", 1000).await;
    let mut opts = minio.opts();
    opts.credentials = Some(("intruder".into(), "nope-nope".into()));
    let bad: Arc<dyn Store> = Arc::new(
        S3Store::connect("creds", "", &opts, &FetchConfig::default())
            .await
            .unwrap(),
    );
    let cache = RealmCache::open(tmp.path().join("c"), "r", bad, FetchConfig::default()).unwrap();
    let e = cache.ensure("demo").await.unwrap_err();
    assert!(matches!(e, FetchError::PermissionDenied { .. }), "{e}");
    assert!(!tmp.path().join("c/realms/r/index.json").exists());
    let _ = INDEX_KEY;
}

/// Needs util-linux `script` to give the fetch a terminal; fails (does not skip) without it.
#[tokio::test]
async fn progress_bar_only_on_a_terminal_for_slow_downloads() {
    let minio = common::Minio::start();
    let (_store, tmp) = setup(&minio, "progress", 1_000_000).await;
    let root = tmp.path().join("c");
    let cmd_line = |realm: &str, slow: &str| {
        let c = fetch_cmd(&minio, &root, realm, "progress");
        let mut parts = vec![c.get_program().to_string_lossy().into_owned()];
        parts.extend(c.get_args().map(|a| a.to_string_lossy().into_owned()));
        parts.extend(["demo".into(), "--slow-ms".into(), slow.into()]);
        parts.join(" ")
    };
    // Under a pseudo-terminal, a download slower than 0.5 s draws a bar naming the package.
    let out = Command::new("script")
        .args(["-qec", &cmd_line("tty", "80"), "/dev/null"])
        .envs(minio.aws_env())
        .output()
        .expect("util-linux `script` is needed for this test");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("fetch demo"),
        "no progress bar on a terminal: {text}"
    );
    // Without a terminal: nothing on stderr.
    let out = fetch_cmd(&minio, &root, "notty", "progress")
        .args(["demo", "--slow-ms", "10"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
