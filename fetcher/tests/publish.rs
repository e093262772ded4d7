//! Publishing from package directories and real wheels (downloaded with pip, cached outside the
//! repository), then installing them through a realm cache and importing them with CPython.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sigma_fetcher::cli::{run_publish, PublishArgs};
use sigma_fetcher::index::INDEX_KEY;
use sigma_fetcher::publish::{publish, read_index, PublishSource};
use sigma_fetcher::store::local::LocalStore;
use sigma_fetcher::store::Store;
use sigma_fetcher::{FetchConfig, FetchError, RealmCache};

const SIX: &str = "six==1.16.0";
const NUMPY: &str = "numpy==2.1.3";

#[tokio::test]
async fn publish_package_dir_to_minio_merges_and_replaces() {
    let minio = common::Minio::start();
    let cfg = FetchConfig::default();
    let store = minio.bucket("pkgdir", &cfg).await;
    let tmp = tempfile::tempdir().unwrap();
    let a = common::make_pkg(&tmp.path().join("v1"), "alpha", 10_000);
    let b = common::make_pkg(&tmp.path().join("v1"), "beta", 10_000);

    let r = publish(store.as_ref(), &PublishSource::PackageDir(a.clone()), &cfg)
        .await
        .unwrap();
    assert_eq!(r.packages.len(), 1);
    let p = &r.packages[0];
    assert_eq!((p.name.as_str(), p.files, p.uploaded), ("alpha", 4, true));
    assert_eq!(p.top_level, vec!["alpha"]);
    publish(store.as_ref(), &PublishSource::PackageDir(b), &cfg)
        .await
        .unwrap();
    let idx = read_index(store.as_ref(), &cfg).await.unwrap();
    assert_eq!(
        idx.top_level_names(),
        vec!["alpha", "beta"],
        "second publish merged"
    );
    // Every archive the index names exists with the recorded size.
    for pkg in idx.packages().values() {
        assert_eq!(
            store.head(&pkg.archive.key).await.unwrap(),
            Some(pkg.archive.size)
        );
    }
    // Same content again: nothing re-uploaded but the index.
    let again = publish(store.as_ref(), &PublishSource::PackageDir(a.clone()), &cfg)
        .await
        .unwrap();
    assert!(!again.packages[0].uploaded);
    // Changed content: a new archive object, the index entry replaced, the old object kept.
    std::fs::write(a.join("sub/mod.py"), "def f():\n    return 43\n").unwrap();
    let v2 = publish(store.as_ref(), &PublishSource::PackageDir(a), &cfg)
        .await
        .unwrap();
    assert!(v2.packages[0].uploaded);
    assert_ne!(v2.packages[0].archive_key, p.archive_key);
    assert!(store.head(&p.archive_key).await.unwrap().is_some());
    // A different distribution claiming `alpha` is refused before anything is uploaded.
    let clash = tmp.path().join("clash");
    std::fs::create_dir_all(clash.join("alpha")).unwrap();
    std::fs::write(clash.join("alpha/x.py"), "").unwrap();
    std::fs::create_dir_all(clash.join("other-1.0.dist-info")).unwrap();
    std::fs::write(
        clash.join("other-1.0.dist-info/RECORD"),
        "alpha/x.py,,\nother-1.0.dist-info/RECORD,,\n",
    )
    .unwrap();
    let before = store.list("").await.unwrap();
    let e = publish(store.as_ref(), &PublishSource::PackageDir(clash), &cfg)
        .await
        .unwrap_err();
    assert!(matches!(e, FetchError::Conflict { .. }), "{e}");
    assert_eq!(store.list("").await.unwrap(), before);
}

/// Install the published wheels in a realm and import them with the real interpreter.
#[tokio::test]
async fn publish_real_wheels_then_import_them_from_the_realm() {
    let six = common::wheel(SIX);
    let numpy = common::wheel(NUMPY);
    let minio = common::Minio::start();
    let cfg = FetchConfig::default();
    let store = minio.bucket("wheels", &cfg).await;
    let wheels = tempfile::tempdir().unwrap();
    for w in [&six, &numpy] {
        std::fs::copy(w, wheels.path().join(w.file_name().unwrap())).unwrap();
    }
    let report = publish(
        store.as_ref(),
        &PublishSource::Wheels(wheels.path().into()),
        &cfg,
    )
    .await
    .unwrap();
    eprintln!("{report}");
    let np = report.packages.iter().find(|p| p.name == "numpy").unwrap();
    assert!(np.files > 500, "numpy has many files: {}", np.files);
    assert!(
        np.top_level.contains(&"numpy.libs".to_owned()),
        "{:?}",
        np.top_level
    );
    assert!(np.top_level.contains(&"numpy-2.1.3.dist-info".to_owned()));

    let tmp = tempfile::tempdir().unwrap();
    let cache = RealmCache::open(tmp.path(), "r", store.clone(), cfg).unwrap();
    let idx = cache.index().await.unwrap();
    let names = idx.top_level_names();
    for n in [
        "numpy",
        "numpy.libs",
        "numpy-2.1.3.dist-info",
        "six.py",
        "six-1.16.0.dist-info",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert_eq!(
        idx.package_for_path(Path::new("numpy/_core/multiarray.py"))
            .unwrap()
            .name,
        "numpy"
    );
    assert_eq!(
        idx.package_for_path(Path::new("numpy-2.1.3.dist-info/METADATA"))
            .unwrap()
            .name,
        "numpy"
    );
    // Nothing downloaded by listing.
    assert!(common::tree(&cache.lib_dir()).is_empty());

    let six_out = cache.ensure("six").await.unwrap();
    assert_eq!(six_out.dir, cache.lib_dir().join("six.py"));
    let np_out = cache
        .ensure_path(Path::new("numpy/linalg/__init__.py"))
        .await
        .unwrap()
        .unwrap();
    assert!(np_out.fetched && np_out.bytes == np.archive_bytes);
    assert_eq!(np_out.dir, cache.lib_dir().join("numpy"));
    let libs = cache
        .ensure_path(Path::new("numpy.libs/x.so"))
        .await
        .unwrap()
        .unwrap();
    assert!(!libs.fetched && libs.dir == cache.lib_dir().join("numpy.libs"));
    assert!(cache
        .ensure_path(Path::new("nothing/here.py"))
        .await
        .unwrap()
        .is_none());
    assert!(cache.lib_dir().join("numpy.libs").is_dir());
    assert!(cache
        .lib_dir()
        .join("numpy-2.1.3.dist-info/RECORD")
        .is_file());

    let out = Command::new("python3")
        .args(["-S", "-c", "import six, numpy; print(six.__version__, numpy.__version__, int(numpy.arange(10).sum()))"])
        .env("PYTHONPATH", cache.lib_dir())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1.16.0 2.1.3 45"
    );
}

fn tamper(wheel: &Path, member: &str, dest: &Path) -> PathBuf {
    let out = dest.join(wheel.file_name().unwrap());
    let script = r#"
import sys, zipfile
src, dst, member = sys.argv[1:4]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        data = zin.read(info.filename)
        if info.filename == member:
            data = data + b"\n# tampered\n"
        zout.writestr(info, data)
"#;
    let st = Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .arg(&out)
        .arg(member)
        .status()
        .unwrap();
    assert!(st.success());
    out
}

#[tokio::test]
async fn record_mismatch_is_refused_and_nothing_uploaded() {
    let six = common::wheel(SIX);
    let tmp = tempfile::tempdir().unwrap();
    let bad = tamper(&six, "six.py", tmp.path());
    let store = LocalStore::create(tmp.path().join("bucket")).unwrap();
    let e = publish(&store, &PublishSource::Wheels(bad), &FetchConfig::default())
        .await
        .unwrap_err();
    match &e {
        FetchError::IntegrityMismatch { file, .. } => assert!(file.ends_with(":six.py"), "{e}"),
        _ => panic!("expected IntegrityMismatch, got {e}"),
    }
    assert!(store.list("").await.unwrap().is_empty());
    // The untouched wheel publishes fine.
    publish(&store, &PublishSource::Wheels(six), &FetchConfig::default())
        .await
        .unwrap();
    assert!(store.head(INDEX_KEY).await.unwrap().is_some());
}

#[tokio::test]
async fn cli_publishes_requirements_wheels_and_dirs_to_a_file_bucket() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = tmp.path().join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    let req = tmp.path().join("requirements.txt");
    std::fs::write(&req, "six==1.16.0\n").unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "gamma", 1000);
    let args = PublishArgs {
        bucket: format!("file://{}", bucket.display()),
        requirements: vec![req],
        python: None,
        no_compile: false,
        no_trace: false,
        tar_layout: false,
        paths: vec![pkg.clone()],
    };
    let reports = run_publish(&args, &FetchConfig::default()).await.unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].packages[0].name, "six");
    assert_eq!(reports[1].index_packages, 2);
    // The default python3 byte-compiled both: its tag is in the report and the index.
    let tag = python_cache_tag();
    assert_eq!(
        reports[0].packages[0].bytecode.as_deref(),
        Some(tag.as_str())
    );
    assert_eq!(
        reports[1].packages[0].bytecode.as_deref(),
        Some(tag.as_str())
    );
    let store: Arc<dyn Store> = Arc::new(LocalStore::new(&bucket));
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, FetchConfig::default()).unwrap();
    let out = cache.ensure("gamma.sub.mod").await.unwrap();
    assert!(out.fetched);
    assert_eq!(out.bytecode.as_deref(), Some(tag.as_str()));
    let pyc = cache
        .lib_dir()
        .join(format!("gamma/sub/__pycache__/mod.{tag}.pyc"));
    let data = std::fs::read(&pyc).unwrap_or_else(|e| panic!("{}: {e}", pyc.display()));
    // PEP 552 header: magic, then flags 0b01 (hash-based, source not checked).
    assert_eq!(u32::from_le_bytes(data[4..8].try_into().unwrap()), 1);
    cache.ensure("six").await.unwrap();
    assert!(cache
        .lib_dir()
        .join(format!("__pycache__/six.{tag}.pyc"))
        .is_file());

    // --no-compile ships sources only; an interpreter that cannot run fails the publish.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let mut args = PublishArgs {
        bucket: format!("file://{}", plain.display()),
        requirements: vec![],
        python: None,
        no_compile: true,
        no_trace: false,
        tar_layout: false,
        paths: vec![pkg],
    };
    let r = run_publish(&args, &FetchConfig::default()).await.unwrap();
    assert_eq!(r[0].packages[0].bytecode, None);
    assert!(!r[0].to_string().contains("bytecode"), "{}", r[0]);
    args.no_compile = false;
    args.python = Some(tmp.path().join("no-such-python"));
    let e = run_publish(&args, &FetchConfig::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no-such-python"), "{e}");

    let none = PublishArgs {
        bucket: "file:///x".into(),
        requirements: vec![],
        python: None,
        no_compile: false,
        no_trace: false,
        tar_layout: false,
        paths: vec![],
    };
    let e = run_publish(&none, &FetchConfig::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nothing to publish"), "{e}");
}

/// `sys.implementation.cache_tag` of the `python3` on PATH.
fn python_cache_tag() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.implementation.cache_tag)"])
        .output()
        .expect("python3 runs");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The files of a published archive, in archive order, and the number of zstd frames (the
/// frame index's skippable frame not counted).
fn archive_layout(data: &[u8]) -> (Vec<String>, usize) {
    use sigma_fetcher::frame_index as fi;
    let mut frames = 0;
    if data[..4] == fi::MAGIC.to_le_bytes() {
        let prefix: [u8; fi::PREFIX] = data[..fi::PREFIX].try_into().unwrap();
        let n = fi::payload_len(&prefix, u64::MAX).unwrap();
        let rest = &data[fi::PREFIX + n..];
        let count = u32::from_le_bytes(data[16..20].try_into().unwrap()) as usize;
        let entries = fi::decode(&data[fi::PREFIX..fi::PREFIX + n], count, rest.len() as u64)
            .expect("a valid frame index");
        for e in &entries {
            let frame = &rest[e.offset as usize..(e.offset + e.compressed) as usize];
            fi::check_frame(frame, e.size).expect("one frame per file");
            frames += 1;
        }
        return (entries.into_iter().map(|e| e.path).collect(), frames);
    }
    let mut rest = data;
    while !rest.is_empty() {
        let n = zstd::zstd_safe::find_frame_compressed_size(rest).expect("a whole zstd frame");
        rest = &rest[n..];
        frames += 1;
    }
    let raw = zstd::decode_all(data).unwrap();
    let mut tar = tar::Archive::new(&raw[..]);
    let names = tar
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    (names, frames)
}

#[tokio::test]
async fn the_import_trace_puts_what_an_import_reads_first_each_file_a_frame_of_its_own() {
    traced_first(false).await;
}

/// The old layout (one tar in frames), as packages published before the frame index are:
/// the traced files end a frame of their own, and it still installs.
#[tokio::test]
async fn the_import_trace_puts_what_an_import_reads_first_in_a_frame_of_its_own() {
    traced_first(true).await;
}

async fn traced_first(tar_layout: bool) {
    use sigma_fetcher::publish::publish_with;
    use sigma_fetcher::store::memory::MemoryStore;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("src/tracedpkg");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(
        d.join("__init__.py"),
        "from .sub import mod\nNAME = 'traced'\n",
    )
    .unwrap();
    std::fs::write(d.join("sub/__init__.py"), "").unwrap();
    std::fs::write(d.join("sub/mod.py"), "X = 1\n").unwrap();
    std::fs::write(
        d.join("aaa_unused.py"),
        "raise SystemExit('never imported')\n",
    )
    .unwrap();
    std::fs::write(d.join("blob.bin"), vec![7u8; 100_000]).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new("t"));
    let cfg = FetchConfig::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let opts = sigma_fetcher::publish::PublishOptions {
        tar_layout,
        ..traced_directly(&runs)
    };
    let r = publish_with(store.as_ref(), &PublishSource::PackageDir(d), &cfg, &opts)
        .await
        .unwrap();
    assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 1);
    let tag = python_cache_tag();
    let key = &r.packages[0].archive_key;
    let data = sigma_fetcher::store::get_bytes(store.as_ref(), key, &cfg)
        .await
        .unwrap();
    let (names, frames) = archive_layout(&data);
    // What `import tracedpkg` reads, in the order it reads it (a source before its bytecode),
    // then everything else in path order.
    let pyc = |dir: &str, m: &str| format!("tracedpkg/{dir}__pycache__/{m}.{tag}.pyc");
    let traced = [
        "tracedpkg/__init__.py".to_string(),
        pyc("", "__init__"),
        "tracedpkg/sub/__init__.py".to_string(),
        pyc("sub/", "__init__"),
        "tracedpkg/sub/mod.py".to_string(),
        pyc("sub/", "mod"),
    ];
    assert_eq!(names[..traced.len()], traced, "{names:?}");
    let mut rest = names[traced.len()..].to_vec();
    let sorted = {
        let mut s = rest.clone();
        s.sort();
        s
    };
    assert_eq!(rest, sorted, "the rest in path order");
    rest.retain(|n| n.contains("aaa_unused") || n.ends_with("blob.bin"));
    assert_eq!(rest.len(), 3, "{rest:?}");
    match tar_layout {
        true => assert_eq!(frames, 2, "the traced files end a frame of their own"),
        false => assert_eq!(frames, names.len(), "a frame per file"),
    }
    assert_eq!(key.ends_with(".tar.zst"), tar_layout, "{key}");

    // The index says how many files the trace put first.
    let index = sigma_fetcher::publish::read_index(store.as_ref(), &cfg)
        .await
        .unwrap();
    let pkg = index.package("tracedpkg").unwrap();
    assert_eq!(pkg.traced, Some(traced.len() as u64));

    // The frames are one stream to a reader: the package installs and verifies. Streamed into
    // the lib dir, the install says once that it is past the trace, when every traced file
    // has been announced (verified) and before it ends.
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, cfg).unwrap();
    let watch = Arc::new(PastTrace {
        lib: cache.lib_dir(),
        ..PastTrace::default()
    });
    cache.set_placement(watch.clone());
    let w2 = watch.clone();
    cache.set_file_hook(Arc::new(move |_sha: &str, path: &Path| {
        let rel = path.strip_prefix(&w2.lib).unwrap().display().to_string();
        w2.announced.lock().unwrap().push(rel);
    }));
    let out = cache.ensure("tracedpkg").await.unwrap();
    assert!(out.fetched);
    assert_eq!(
        std::fs::read(out.dir.join("blob.bin")).unwrap(),
        vec![7u8; 100_000]
    );
    let at = watch.at_past_trace.lock().unwrap().clone();
    assert_eq!(at.len(), 1, "once: {at:?}");
    let (announced, ended) = &at[0];
    assert!(!ended, "past the trace before the install ended");
    for t in &traced {
        assert!(announced.contains(t), "{t} not verified yet: {announced:?}");
    }
    assert_eq!(watch.ended.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// What a streamed install says about its import trace (see `Placement::past_trace`).
#[derive(Default)]
struct PastTrace {
    lib: PathBuf,
    announced: std::sync::Mutex<Vec<String>>,
    ended: std::sync::atomic::AtomicUsize,
    /// At each `past_trace`: the files announced so far, and whether the install had ended.
    at_past_trace: std::sync::Mutex<Vec<(Vec<String>, bool)>>,
}

impl sigma_fetcher::Placement for PastTrace {
    fn placed(&self, _pkg: &sigma_fetcher::index::Package) {}
    fn ended(
        &self,
        _pkg: &sigma_fetcher::index::Package,
        _result: Result<(), &sigma_fetcher::FetchError>,
    ) {
        self.ended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn past_trace(&self, _pkg: &sigma_fetcher::index::Package) {
        let announced = self.announced.lock().unwrap().clone();
        let ended = self.ended.load(std::sync::atomic::Ordering::Relaxed) > 0;
        self.at_past_trace.lock().unwrap().push((announced, ended));
    }
}

#[tokio::test]
async fn publishing_twice_makes_the_same_archive() {
    use sigma_fetcher::publish::{publish_with, PublishOptions};
    use sigma_fetcher::store::memory::MemoryStore;
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "twice", 5_000);
    let cfg = FetchConfig::default();
    let opts = PublishOptions {
        compile_with: Some("python3".into()),
        compile_required: true,
        trace: None,
        tar_layout: false,
    };
    let mut keys = Vec::new();
    for _ in 0..2 {
        let store = MemoryStore::new("t");
        let r = publish_with(&store, &PublishSource::PackageDir(pkg.clone()), &cfg, &opts)
            .await
            .unwrap();
        assert!(r.packages[0].bytecode.is_some(), "compiled");
        keys.push(r.packages[0].archive_key.clone());
    }
    assert_eq!(
        keys[0], keys[1],
        "content-addressed: one object for the same content"
    );
}

#[tokio::test]
async fn a_dependency_s_files_that_another_package_s_import_reads_come_within_its_trace() {
    use sigma_fetcher::publish::publish_with;
    use sigma_fetcher::store::memory::MemoryStore;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // `import depa` reads its __init__ only; `import usesa` reads depa.extra too.
    let depa = src.join("a/depa");
    std::fs::create_dir_all(&depa).unwrap();
    std::fs::write(depa.join("__init__.py"), "X = 1\n").unwrap();
    std::fs::write(depa.join("extra.py"), "Y = 2\n").unwrap();
    std::fs::write(depa.join("aaa_unused.py"), "Z = 3\n").unwrap();
    let usesa = src.join("b/usesa");
    std::fs::create_dir_all(&usesa).unwrap();
    std::fs::write(usesa.join("__init__.py"), "import depa.extra\n").unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new("t"));
    let cfg = FetchConfig::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let opts = traced_directly(&runs);
    let source = PublishSource::Several(vec![
        PublishSource::PackageDir(depa),
        PublishSource::PackageDir(usesa),
    ]);
    let r = publish_with(store.as_ref(), &source, &cfg, &opts)
        .await
        .unwrap();
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "one trace each"
    );
    let tag = python_cache_tag();
    let key = &r
        .packages
        .iter()
        .find(|p| p.name == "depa")
        .unwrap()
        .archive_key;
    let data = sigma_fetcher::store::get_bytes(store.as_ref(), key, &cfg)
        .await
        .unwrap();
    let (names, _) = archive_layout(&data);
    // Its own import's files, then what usesa's import read of it, then the rest.
    let traced = [
        "depa/__init__.py".to_string(),
        format!("depa/__pycache__/__init__.{tag}.pyc"),
        "depa/extra.py".to_string(),
        format!("depa/__pycache__/extra.{tag}.pyc"),
    ];
    assert_eq!(names[..traced.len()], traced, "{names:?}");
    let index = read_index(store.as_ref(), &cfg).await.unwrap();
    assert_eq!(
        index.package("depa").unwrap().traced,
        Some(traced.len() as u64)
    );
    // usesa's import read depa: recorded, and fetched with it.
    assert_eq!(index.package("usesa").unwrap().reads, ["depa"]);
    assert!(index.package("depa").unwrap().reads.is_empty());
    let cache = RealmCache::open(tmp.path().join("c"), "r", store, cfg).unwrap();
    let outs = cache.prefetch(&["usesa".to_string()], 4).await.unwrap();
    assert_eq!(outs.len(), 2, "usesa and what it reads");
    assert!(outs.iter().all(|o| o.as_ref().is_ok_and(|o| o.fetched)));
    assert!(cache.is_installed("depa") && cache.is_installed("usesa"));
}

/// Publish options that compile with `python3` and trace each import with it directly,
/// counting the traces in `runs`: for this file's own packages, which are trusted (the
/// supervisor's publish runs a trace in its jail).
fn traced_directly(
    runs: &Arc<std::sync::atomic::AtomicUsize>,
) -> sigma_fetcher::publish::PublishOptions {
    let runs = runs.clone();
    let runner =
        sigma_fetcher::TraceRunner(Arc::new(move |python: &Path, _dir: &Path, args: &[_]| {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut c = Command::new(python);
            c.args(args);
            c
        }));
    sigma_fetcher::publish::PublishOptions {
        compile_with: Some("python3".into()),
        compile_required: true,
        trace: Some(runner),
        tar_layout: false,
    }
}
