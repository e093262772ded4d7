//! Realm libraries end to end: the real `sigma-supervise` binary publishes to a bucket (a
//! `file://` directory, or a real MinIO on 127.0.0.1 started here) and runs real CPython under
//! the real filter with `--realm/--bucket`; `import X` finds the realm's libraries at
//! `/sigma/lib`, fetched on first use into a cache root the target cannot see.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

// The fetcher's MinIO/wheel/package harness, shared rather than copied (it names the crate
// `sigma_fetcher`; here the dependency is called `fetcher`).
extern crate fetcher as sigma_fetcher;
#[path = "../../fetcher/tests/common/mod.rs"]
mod common;

const PREFIX: &str = "/sigma/lib";

mod interp;
use interp::{show, stderr, stdout};

/// `sigma-supervise` with the real interpreter first on PATH and no inherited PYTHONPATH.
fn sup() -> Command {
    let mut c = interp::supervisor();
    // These tests are about realms served by notification and by mounts; the lazy backend (a
    // root supervisor's default from an incomplete realm's second run) has tests/lazy.rs.
    c.env_remove("PYTHONPATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("SIGMA_SUPERVISE_LAZY", "never");
    c
}

/// A realm run: `sigma-supervise --stats --realm R --bucket B --cache-dir C python3 -c CODE`.
struct Realm<'a> {
    name: &'a str,
    bucket: &'a str,
    cache: &'a Path,
    env: Vec<(&'static str, String)>,
}

impl Realm<'_> {
    fn cmd(&self, code: &str) -> Command {
        let mut c = sup();
        // Fetches happen only where a test's target asks (no prefetch, no completion of a
        // realm in the background; tested on their own).
        c.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["--stats", "--no-prefetch", "--realm", self.name])
            .args(["--bucket", self.bucket])
            .arg("--cache-dir")
            .arg(self.cache)
            .args(["python3", "-c", code]);
        c
    }
    /// Run `code`; then wait for the run's fill processes, so the next step finds what this
    /// run installed (a run ends without waiting for them).
    fn py(&self, code: &str) -> Output {
        let out = self.cmd(code).output().expect("run sigma-supervise");
        show(&out);
        interp::settled(self.cache);
        out
    }
    fn lib(&self) -> PathBuf {
        self.cache.join("realms").join(self.name).join("lib")
    }
}

/// The counter `fetched N packages` from the `--stats` realm line.
fn fetched(o: &Output) -> u64 {
    let err = stderr(o);
    let line = err
        .lines()
        .find(|l| l.starts_with("sigma-supervise realm "))
        .unwrap_or_else(|| panic!("no realm stats line in:\n{err}"));
    let n = line
        .split("fetched ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok());
    n.unwrap_or_else(|| panic!("cannot read the fetched count in {line:?}"))
}

fn cache_hits(o: &Output) -> u64 {
    let err = stderr(o);
    err.lines()
        .find(|l| l.starts_with("sigma-supervise realm "))
        .and_then(|l| l.split("cache hits ").nth(1))
        .and_then(|s| s.split(';').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no cache hits in:\n{err}"))
}

fn publish(bucket: &str, env: &[(&'static str, String)], what: &[&Path]) {
    let out = sup()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["publish", "--bucket", bucket])
        .args(what)
        .stdin(Stdio::null())
        .output()
        .expect("run sigma-supervise publish");
    show(&out);
    assert!(out.status.success(), "publish failed");
}

fn listdir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A `file://` bucket at `dir/bucket` with `what` published.
fn bucket_with(dir: &Path, what: &[&Path]) -> String {
    let bucket_dir = dir.join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], what);
    bucket
}

/// A `file://` bucket under `dir` with two small packages published, `demo_a` and `demo_b`.
fn two_package_bucket(dir: &Path) -> String {
    let src = dir.join("src");
    let a = common::make_pkg(&src, "demo_a", 10_000);
    let b = common::make_pkg(&src, "demo_b", 10_000);
    bucket_with(dir, &[&a, &b])
}

#[test]
fn a_single_module_is_published_and_imported_from_the_realm() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let module = src.join("onefile_mod.py");
    std::fs::write(&module, "V = 7\n").unwrap();
    let bucket = bucket_with(tmp.path(), &[&module]);
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "m",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    let o = r.py("import onefile_mod; print(onefile_mod.V, onefile_mod.__file__)");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("7 {PREFIX}/onefile_mod.py\n"));
}

/// A package published before the frame index (one tar in zstd frames: `--tar-layout`)
/// installs beside one published with a frame per file, and both import.
#[test]
fn an_old_layout_package_installs_beside_a_frame_per_file_one() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let old = common::make_pkg(&src, "demo_old", 20_000);
    let new = common::make_pkg(&src, "demo_new", 20_000);
    let bucket_dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], &[Path::new("--tar-layout"), &old]);
    publish(&bucket, &[], &[&new]);
    let keys = listdir(&bucket_dir.join("sigma-lib/pkgs"));
    let layout = |name: &str, ext: &str| keys.iter().any(|k| k.contains(name) && k.ends_with(ext));
    assert!(layout("demo-old-", ".tar.zst"), "{keys:?}");
    assert!(layout("demo-new-", ".zsf"), "{keys:?}");
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    let code = "import demo_old.sub.mod as a, demo_new.sub.mod as b, demo_old, demo_new\n\
                print(demo_old.NAME, demo_new.NAME, a.f() + b.f(), \
                len(open('/sigma/lib/demo_old/blob.bin', 'rb').read()))";
    let o = r.py(code);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "demo_old demo_new 84 20000\n");
    // Again from what the first run stored.
    let o = r.py(code);
    assert_eq!(stdout(&o), "demo_old demo_new 84 20000\n", "{}", stderr(&o));
}

#[test]
fn file_bucket_listing_import_cache_hit_and_hidden_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = two_package_bucket(tmp.path());
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r1",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };

    // The listing shows every package of the index and fetches nothing.
    let o = r.py(&format!(
        "import os; print(sorted(os.listdir({PREFIX:?}))); print(os.path.isdir({PREFIX:?}))"
    ));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.contains("'demo_a'") && out.contains("'demo_b'"),
        "{out}"
    );
    assert!(out.ends_with("True\n"), "{out}");
    assert_eq!(fetched(&o), 0);
    assert!(
        listdir(&r.lib()).is_empty(),
        "the listing installed something"
    );

    // First import fetches the package; the target cannot reach the host cache itself.
    let host_file = r.lib().join("demo_a/__init__.py");
    let code = format!(
        r#"
import os, demo_a
from demo_a.sub.mod import f
print(demo_a.NAME, f(), demo_a.__file__)
try:
    os.stat({host:?}); print("visible")
except FileNotFoundError:
    print("hidden")
print(os.path.exists({root:?}) and os.listdir({root:?}))
"#,
        host = host_file.display().to_string(),
        root = cache.display().to_string(),
    );
    let o = r.py(&code);
    assert_eq!(o.status.code(), Some(0));
    let lines: Vec<_> = stdout(&o).lines().map(String::from).collect();
    assert_eq!(lines[0], format!("demo_a 42 {PREFIX}/demo_a/__init__.py"));
    // The host path of the realm file: hidden (the cache root is an empty tmpfs for the target).
    assert_eq!(lines[1], "hidden");
    assert_eq!(
        lines[2], "False",
        "the cache root does not exist for the target"
    );
    assert_eq!(fetched(&o), 1);
    assert!(host_file.is_file(), "installed on the host");

    // Second run: the realm cache answers, nothing is fetched.
    let o = r.py("import demo_a; print(demo_a.NAME)");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "demo_a\n");
    assert_eq!(fetched(&o), 0);
    assert!(cache_hits(&o) > 0);

    // An unknown module fails quickly, without a fetch.
    let o = r.py(&format!(
        r#"
import time
t = time.monotonic()
try:
    import no_such_module
except ImportError as e:
    print("ImportError", type(e).__name__, round(time.monotonic() - t, 3) < 5)
try:
    open("{PREFIX}/no_such_module/x.py")
except FileNotFoundError:
    print("ENOENT")
"#
    ));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "ImportError ModuleNotFoundError True\nENOENT\n");
    assert_eq!(fetched(&o), 0);
    assert!(!r.lib().join("demo_b").exists());

    // A second realm on the same root shares the files by inode, not the directories, and its
    // target cannot see the first realm's directory.
    let r2 = Realm {
        name: "r2",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    let first = r.lib().join("demo_a");
    let o = r2.py(&format!(
        r#"
import os, demo_a
print(demo_a.NAME)
try:
    os.listdir({first:?}); print("visible")
except FileNotFoundError:
    print("hidden")
"#,
        first = first.display().to_string()
    ));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "demo_a\nhidden\n");
    assert_eq!(
        fetched(&o),
        0,
        "the second realm links from the shared store"
    );
    let ia = std::fs::metadata(r.lib().join("demo_a/blob.bin")).unwrap();
    let ib = std::fs::metadata(r2.lib().join("demo_a/blob.bin")).unwrap();
    assert_eq!((ia.dev(), ia.ino()), (ib.dev(), ib.ino()));
    assert_ne!(
        std::fs::metadata(r.lib().join("demo_a")).unwrap().ino(),
        std::fs::metadata(r2.lib().join("demo_a")).unwrap().ino()
    );

    // Once every package of the realm is installed nothing is left to decide: the lib dir is
    // mounted read-only at the prefix and the kernel answers, without a single path
    // notification; the host cache stays hidden and the lib cannot be written.
    let o = r.py("import demo_b; print(demo_b.NAME)");
    assert_eq!((o.status.code(), fetched(&o)), (Some(0), 1));
    assert!(
        !stderr(&o).contains("served by the kernel"),
        "{}",
        stderr(&o)
    );
    let o = r.py(&format!(
        r#"
import os, demo_a, demo_b
from demo_b.sub.mod import f
print(demo_a.NAME, demo_b.NAME, f(), demo_b.__file__)
print(sorted(os.listdir({PREFIX:?})))
try:
    open("{PREFIX}/demo_a/new.py", "w"); print("written")
except OSError as e:
    print("refused", e.errno == 30)
print(os.path.exists({root:?}) and os.listdir({root:?}))
"#,
        root = cache.display().to_string(),
    ));
    assert_eq!(o.status.code(), Some(0));
    let lines: Vec<_> = stdout(&o).lines().map(String::from).collect();
    assert_eq!(
        lines[0],
        format!("demo_a demo_b 42 {PREFIX}/demo_b/__init__.py")
    );
    assert!(lines[1].contains("'demo_a'") && lines[1].contains("'demo_b'"));
    assert_eq!(lines[2], "refused True", "EROFS");
    assert_eq!(
        lines[3], "False",
        "the cache root does not exist for the target"
    );
    let err = stderr(&o);
    assert!(
        err.contains("realm r1 (") && err.contains("all 2 packages installed"),
        "{err}"
    );
    // No read is notified; only the refused write is (--stats keeps writes notified for its
    // read-only hint), and hinted.
    for call in ["openat", "newfstatat", "statx"] {
        assert!(
            !err.lines()
                .any(|l| l.trim_start().starts_with(call) && l != "  openat read-only 1"),
            "{call} was notified:\n{err}"
        );
    }
    assert!(
        err.lines().any(|l| l
            == format!(
                "sigma-supervise: {PREFIX}/demo_a is read-only in the jail: the supervisor \
                 serves it (realm libraries, --serve) and no flag makes it writable"
            )),
        "{err}"
    );
    assert!(!r.lib().join("demo_a/new.py").exists());
}

#[test]
fn a_new_realm_on_a_warm_store_is_shown_from_shared_trees() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = two_package_bucket(tmp.path());
    let cache = tmp.path().join("cache");
    let realm = |name| Realm {
        name,
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    let o = realm("r1").py("import demo_a, demo_b");
    assert_eq!((o.status.code(), fetched(&o)), (Some(0), 2));

    // A realm never seen before: its snapshot is taken before the start, every package's
    // content is in the store, so each entry is mounted from the package's shared tree. No
    // install of its own, not one notification, the same bytes.
    let r2 = realm("r2");
    let o = r2.py(&format!(
        r#"
import os, demo_a, demo_b
from demo_b.sub.mod import f
print(demo_a.NAME, demo_b.NAME, f(), demo_b.__file__)
print(sorted(os.listdir({PREFIX:?})))
print(len(open("{PREFIX}/demo_a/blob.bin", "rb").read()))
try:
    open("{PREFIX}/demo_a/new.py", "w"); print("written")
except OSError as e:
    print("refused", e.errno == 30)
print(os.path.exists({root:?}))
"#,
        root = cache.display().to_string(),
    ));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        format!(
            "demo_a demo_b 42 {PREFIX}/demo_b/__init__.py\n['demo_a', 'demo_b']\n10000\n\
             refused True\nFalse\n"
        )
    );
    let err = stderr(&o);
    assert!(
        err.contains("realm r2 (") && err.contains("shared package trees mounted read-only"),
        "{err}"
    );
    assert!(
        err.contains("sigma-supervise stats: 1 notifications"),
        "only the refused write is notified (for its hint): {err}"
    );
    assert_eq!(
        listdir(&r2.lib()),
        Vec::<String>::new(),
        "nothing installed"
    );
    let trees = listdir(&cache.join("trees"));
    assert_eq!(trees.len(), 2, "one tree per package: {trees:?}");
    let in_tree = std::fs::metadata(
        cache
            .join("trees")
            .join(
                trees
                    .iter()
                    .find(|t| cache.join("trees").join(t).join("demo_a").exists())
                    .unwrap(),
            )
            .join("demo_a/blob.bin"),
    )
    .unwrap();
    let in_r1 = std::fs::metadata(realm("r1").lib().join("demo_a/blob.bin")).unwrap();
    assert_eq!(in_tree.ino(), in_r1.ino(), "the tree links the stored file");

    // The next run of that realm is answered from what it remembered.
    let o = r2.py("import demo_a; print(demo_a.NAME)");
    assert_eq!(stdout(&o), "demo_a\n");
    assert!(stderr(&o).contains("shared package trees"));
}

#[test]
fn a_run_completes_a_realm_it_has_mostly_installed_and_the_next_start_is_a_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = two_package_bucket(tmp.path());
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    // Without --no-prefetch: the command's import is fetched before it asks, and what is left
    // of the realm (demo_b, a few KB) during the run.
    let run = |code: &str| {
        let o = sup()
            .args(["--stats", "--realm", "r", "--bucket", &bucket])
            .arg("--cache-dir")
            .arg(&cache)
            .args(["python3", "-c", code])
            .output()
            .unwrap();
        show(&o);
        interp::settled(&cache);
        o
    };
    // (The completion is abandoned if the target exits first; this one stays a moment.)
    let o = run("import demo_a, time; print(demo_a.NAME); time.sleep(1)");
    assert_eq!(stdout(&o), "demo_a\n");
    assert_eq!(
        fetched(&o),
        2,
        "demo_a asked for, demo_b to complete the realm"
    );
    assert!(r.lib().join("demo_b/__init__.py").is_file());
    let o = run("import demo_b; print(demo_b.NAME)");
    assert_eq!(stdout(&o), "demo_b\n");
    let err = stderr(&o);
    assert!(
        err.contains("all 2 packages installed; lib dir mounted read-only"),
        "{err}"
    );
    assert!(
        err.contains("sigma-supervise stats: 0 notifications"),
        "{err}"
    );
}

#[test]
fn corrupted_object_is_refused_and_nothing_installed() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo_c", 50_000);
    let bucket_dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], &[&pkg]);
    let pkgs = bucket_dir.join("sigma-lib/pkgs");
    let archive = std::fs::read_dir(&pkgs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("demo"))
        .expect("published archive");
    let mut data = std::fs::read(&archive).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&archive, data).unwrap();

    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    };
    // A package is served file by file as it arrives: the corrupt file is never read as
    // anything but an I/O error, and once the install has failed, nothing of it is served.
    let o = r.py(r#"
for _ in range(2):
    try:
        with open("/sigma/lib/demo_c/blob.bin", "rb") as f:
            f.read()
        print("read")
    except OSError as e:
        print("OSError", e.errno)
try:
    import demo_c
    print("imported")
except ImportError as e:
    print("ImportError")
"#);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "OSError 5\nOSError 5\nImportError\n");
    let err = stderr(&o);
    let lines: Vec<_> = err
        .lines()
        .filter(|l| l.contains("integrity mismatch"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per cause:\n{err}");
    assert!(lines[0].contains(&bucket), "names the bucket: {}", lines[0]);
    assert!(listdir(&r.lib()).is_empty(), "nothing installed");
    assert!(listdir(&cache.join("cas")).is_empty(), "nothing stored");
    // The package was streamed into a memory tree (a fill process's); nothing is left there.
    assert_eq!(memory_left(&cache, "r"), Vec::<String>::new());
}

/// What is left in the memory trees of realm `realm` of the cache root `cache` (this user's,
/// on /dev/shm): `tree/entry` for every entry of a tree (an empty tree's directory is left
/// for the next run's sweep).
fn memory_left(cache: &Path, realm: &str) -> Vec<String> {
    memory_left_of(cache, realm, nix::unistd::geteuid().as_raw())
}

/// The memory trees of realm `realm` (their names, `<realm key>.<package>.<supervisor pid>.<n>`),
/// for user `uid`, and their directory.
fn memory_trees(cache: &Path, realm: &str, uid: u32) -> (PathBuf, Vec<String>) {
    use sha2::Digest as _;
    let realm_dir = cache.join("realms").join(realm);
    let key = hex::encode(&sha2::Sha256::digest(realm_dir.as_os_str().as_encoded_bytes())[..8]);
    let dir = Path::new("/dev/shm").join(format!("sigma-supervise-{uid}"));
    let trees = listdir(&dir)
        .into_iter()
        .filter(|t| t.starts_with(&format!("{key}.")))
        .collect();
    (dir, trees)
}

/// [`memory_left`] for user `uid`.
fn memory_left_of(cache: &Path, realm: &str, uid: u32) -> Vec<String> {
    let (dir, trees) = memory_trees(cache, realm, uid);
    trees
        .into_iter()
        .flat_map(|t| {
            listdir(&dir.join(&t))
                .into_iter()
                .map(move |e| format!("{t}/{e}"))
        })
        .collect()
}

/// Whether `path` is on a tmpfs (a cache root there has no memory trees: it is memory).
fn on_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// The counts of `served from memory N files verified there, M calls` in a `--stats` output.
fn served_from_memory(o: &Output) -> (u64, u64) {
    let err = stderr(o);
    let rest = err
        .split("served from memory ")
        .nth(1)
        .unwrap_or_else(|| panic!("no memory counts in:\n{err}"));
    let n = |s: &str| s.split(' ').next().and_then(|n| n.parse().ok()).unwrap();
    let files = n(rest);
    let calls = n(rest.split("there, ").nth(1).unwrap());
    (files, calls)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// MinIO with a fresh bucket `libs`; the binary must be installed (`scripts/minio.sh install`).
fn minio_bucket() -> (common::Minio, String) {
    let m = common::Minio::start();
    rt().block_on(m.bucket("libs", &fetcher::FetchConfig::default()));
    (m, "s3://libs".to_string())
}

/// Credentials from the standard chain (here a profile file, no key in the environment) with a
/// plain-HTTP endpoint: S3 gets a client of its own without certificate authorities, the
/// credential providers the loader's (with them, for an STS or SSO over HTTPS).
#[test]
fn minio_credentials_from_a_profile_file_reach_a_plain_http_endpoint() {
    let (m, bucket) = minio_bucket();
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "profpkg", 10_000);
    publish(&bucket, &m.aws_env(), &[&pkg]);
    let creds = tmp.path().join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            common::USER,
            common::PASS
        ),
    )
    .unwrap();
    let env: Vec<(&'static str, String)> = m
        .aws_env()
        .into_iter()
        .filter(|(k, _)| !["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"].contains(k))
        .chain([
            ("AWS_SHARED_CREDENTIALS_FILE", creds.display().to_string()),
            ("AWS_CONFIG_FILE", "/dev/null".into()),
        ])
        .collect();
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env,
    };
    let o = r.py("import profpkg; print(profpkg.NAME)");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "profpkg\n");
    assert_eq!(fetched(&o), 1);
}

#[test]
fn minio_numpy_cold_warm_offline_and_down() {
    let (mut m, bucket) = minio_bucket();
    let env = m.aws_env();
    let tmp = tempfile::tempdir().unwrap();
    let pure = common::make_pkg(&tmp.path().join("src"), "purepkg", 20_000);
    // Never imported while the server is up: its content is in no cache when it goes down.
    let lonely = common::make_pkg(&tmp.path().join("src"), "lonely", 30_000);
    let numpy = common::wheel("numpy==2.1.3");
    publish(&bucket, &env, &[&numpy, &pure, &lonely]);
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r1",
        bucket: &bucket,
        cache: &cache,
        env: env.clone(),
    };
    let code = r#"
import numpy, purepkg
from purepkg.sub.mod import f
print(numpy.__file__, int(numpy.arange(10).sum()), purepkg.NAME, f())
"#;
    let expect = format!("{PREFIX}/numpy/__init__.py 45 purepkg 42\n");
    // Cold: both packages fetched from MinIO; modules load from the bytecode published with
    // them (python -v says where each code object came from), nothing is compiled.
    let o = r.cmd(code).env("PYTHONVERBOSE", "1").output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), expect);
    assert_eq!(fetched(&o), 2);
    let err = stderr(&o);
    for m in [
        "numpy/__init__",
        "numpy/_core/multiarray",
        "purepkg/sub/mod",
    ] {
        let (dir, name) = m.rsplit_once('/').unwrap();
        let from = format!("# code object from '{PREFIX}/{dir}/__pycache__/{name}.cpython-");
        assert!(err.contains(&from), "{m} not loaded from shipped bytecode");
    }

    // A second realm: no download (shared content), same inode, its own directories.
    let r2 = Realm {
        name: "r2",
        bucket: &bucket,
        cache: &cache,
        env: env.clone(),
    };
    let o = r2.py(code);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), expect);
    assert_eq!(fetched(&o), 0);
    let f1 = std::fs::metadata(r.lib().join("numpy/__init__.py")).unwrap();
    let f2 = std::fs::metadata(r2.lib().join("numpy/__init__.py")).unwrap();
    assert_eq!((f1.dev(), f1.ino()), (f2.dev(), f2.ino()));

    // A third realm lists (takes its index snapshot) but installs nothing yet.
    let r3 = Realm {
        name: "r3",
        bucket: &bucket,
        cache: &cache,
        env: env.clone(),
    };
    let o = r3.py(&format!(
        "import os; print('numpy' in os.listdir({PREFIX:?}))"
    ));
    assert_eq!(stdout(&o), "True\n");
    assert_eq!(fetched(&o), 0);

    // Server gone: the cached realm still imports.
    m.stop();
    let o = r.py(code);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), expect);
    assert_eq!(fetched(&o), 0);

    // Server gone, package in no cache (another realm's content would be linked, no network):
    // ImportError within the fetch bound, one line naming the
    // bucket, never a hang.
    let probe = r#"
import time, os
t = time.monotonic()
try:
    import lonely
    print("imported")
except ImportError:
    print("ImportError", time.monotonic() - t)
"#;
    let started = std::time::Instant::now();
    let mut child = r3
        .cmd(probe)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = started + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the target hangs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    show(&o);
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.starts_with("ImportError "), "{out}");
    let secs: f64 = out.trim().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        secs < 10.0 && took < Duration::from_secs(10),
        "{secs} s in the target, {took:?} in all"
    );
    let err = stderr(&o);
    let lines: Vec<_> = err.lines().filter(|l| l.contains("unavailable")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("s3://libs"), "{}", lines[0]);

    // Server gone, realm never seen: no index, an empty library, ImportError.
    let r4 = Realm {
        name: "r4",
        bucket: &bucket,
        cache: &cache,
        env,
    };
    let started = std::time::Instant::now();
    let o = r4.py(probe);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("ImportError "));
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn minio_sixteen_supervisors_one_download() {
    let (_m, bucket) = minio_bucket();
    let env = _m.aws_env();
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "shared_pkg", 4 << 20);
    publish(&bucket, &env, &[&pkg]);
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "crowd",
        bucket: &bucket,
        cache: &cache,
        env,
    };
    let code =
        "import shared_pkg, os; print(os.path.getsize(shared_pkg.__path__[0] + '/blob.bin'))";
    let total = downloads_of_crowd((0..16).map(|_| r.cmd(code)), 4 << 20);
    assert_eq!(total, 1, "exactly one download across 16 supervisors");
}

/// Start every run at once; each must print its blob's `size`. Returns their downloads.
fn downloads_of_crowd(runs: impl IntoIterator<Item = Command>, size: u64) -> u64 {
    let children: Vec<_> = runs
        .into_iter()
        .map(|mut c| {
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            show(&o);
            assert_eq!(o.status.code(), Some(0));
            assert_eq!(stdout(&o), format!("{size}\n"));
            fetched(&o)
        })
        .sum()
}

#[test]
fn realms_starting_together_download_an_archive_once() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "together", 8 << 20);
    let bucket_dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], &[&pkg]);
    let cache = tmp.path().join("cache");
    let code = "import together, os; print(os.path.getsize(together.__path__[0] + '/blob.bin'))";
    let names = ["a", "b", "c", "d"];
    let runs = names.iter().map(|name| {
        Realm {
            name,
            bucket: &bucket,
            cache: &cache,
            env: vec![],
        }
        .cmd(code)
    });
    let total = downloads_of_crowd(runs, 8 << 20);
    interp::settled(&cache);
    assert_eq!(total, 1, "one download across four realms");
    // Each realm has the package, and every copy is the one stored file.
    let inodes: std::collections::HashSet<u64> = names
        .iter()
        .map(|n| {
            let f = cache.join(format!("realms/{n}/lib/together/blob.bin"));
            std::fs::metadata(f).unwrap().ino()
        })
        .collect();
    assert_eq!(inodes.len(), 1, "the realms share the stored file");
}

/// sha256 of a file, as the target computes it (hashlib), from a bare interpreter.
fn sha256_of(path: &Path) -> String {
    let o = Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success());
    stdout(&o).trim().to_owned()
}

#[test]
fn kill_9_during_a_cold_import_never_gives_wrong_bytes_and_the_next_run_completes() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    // Large enough that the cold install takes a while: the kills below land before, during
    // and after it.
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo_k", 24 << 20);
    let want = sha256_of(&pkg.join("blob.bin"));
    let bucket_dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], &[&pkg]);
    let code = "import demo_k, hashlib\n\
                print(hashlib.sha256(open(demo_k.__path__[0] + '/blob.bin', 'rb').read()).hexdigest())";
    let mut killed_mid = 0;
    for delay_ms in [10u64, 40, 80, 120, 160, 220, 300, 450, 1500] {
        let cache = tmp.path().join(format!("cache-{delay_ms}"));
        let r = Realm {
            name: "r",
            bucket: &bucket,
            cache: &cache,
            env: vec![],
        };
        let mut child = r
            .cmd(code)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let finished = child.try_wait().unwrap().is_some();
        // The supervisor only: its target is left to run without it.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Output ends when the target ends too: a bounded wait, never a hang.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        let o = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the target hangs after its supervisor was killed")
            .unwrap();
        let out = stdout(&o);
        assert!(
            out.is_empty() || out.trim() == want,
            "wrong bytes after kill -9 at {delay_ms} ms: {out}"
        );
        eprintln!("kill -9 at {delay_ms} ms: finished before {finished}, target printed {out:?}");
        if !finished && out.is_empty() {
            killed_mid += 1;
        }
        // The next run on the same cache completes, with correct files.
        let o = r.py(code);
        assert_eq!(o.status.code(), Some(0), "after kill at {delay_ms} ms");
        assert_eq!(stdout(&o).trim(), want, "after kill at {delay_ms} ms");
        assert_eq!(sha256_of(&r.lib().join("demo_k/blob.bin")), want);
        for f in ["__init__.py", "sub/mod.py"] {
            assert_eq!(
                std::fs::read(r.lib().join("demo_k").join(f)).unwrap(),
                std::fs::read(pkg.join(f)).unwrap()
            );
        }
        interp::settled(&cache);
        assert!(
            listdir(&cache.join("realms/r/staging")).is_empty(),
            "staging left after the next run"
        );
    }
    assert!(killed_mid > 0, "no kill landed during the import");
}

/// Started by an ordinary user (nobody here): the realm is fetched, installed and served as for
/// root (the served directory's read-only view is made in a user namespace of the
/// supervisor's own); an incomplete realm's lazy backend is the realm's FUSE server (see
/// tests/fuse.rs).
#[test]
fn an_ordinary_user_gets_realm_libraries_and_its_lazy_backend_is_fuse() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: needs root to become an ordinary user (nobody) for this test");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    mode(tmp.path(), 0o755).unwrap();
    let bin = tmp.path().join("sigma-supervise");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).unwrap();
    }
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo_u", 1000);
    // Never imported: the realm stays incomplete, so the second run considers --lazy.
    let other = common::make_pkg(&tmp.path().join("src"), "demo_v", 1000);
    let dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&dir).unwrap();
    let bucket = format!("file://{}", dir.display());
    publish(&bucket, &[], &[&pkg, &other]);
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    let (cache, work) = (tmp.path().join("cache"), tmp.path().join("work"));
    for d in [&cache, &work] {
        std::fs::create_dir(d).unwrap();
        nix::unistd::chown(d, Some(65534.into()), Some(65534.into())).unwrap();
    }
    let run_as = |realm: &str, extra: &[&str], code: &str| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args([
                "--stats",
                "--no-prefetch",
                "--realm",
                realm,
                "--bucket",
                &bucket,
            ])
            .args(extra)
            .arg("--cache-dir")
            .arg(&cache)
            .args(["/usr/bin/python3", "-c", code])
            .current_dir(&work)
            .env_remove("PYTHONPATH")
            .env("HOME", interp::home_in(&work))
            .env_remove("XDG_CACHE_HOME")
            .output()
            .unwrap();
        interp::settled(&cache);
        show(&out);
        out
    };
    let run = |extra: &[&str]| {
        run_as(
            "r",
            extra,
            "import demo_u, os; print(demo_u.__file__, os.getuid())",
        )
    };
    let out = run(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!("{PREFIX}/demo_u")),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).trim_end().ends_with(" 1000"),
        "{}",
        stdout(&out)
    );
    assert_eq!(fetched(&out), 1);
    assert!(
        stderr(&out).contains("backend notification"),
        "{}",
        stderr(&out)
    );
    // Streamed into a memory tree of the user's own (its read-only view made in a user
    // namespace), emptied once persisted and the run over.
    // Memory trees are filled by fill processes: with them off (scripts/test's second pass,
    // SIGMA_SUPERVISE_FILL_PROCESS=never) the run streams into the lib dir as before.
    let fill = std::env::var("SIGMA_SUPERVISE_FILL_PROCESS").map_or(true, |v| v != "never");
    let (files, _) = served_from_memory(&out);
    if fill {
        assert!(files > 0 || on_tmpfs(&cache), "{}", stderr(&out));
    } else {
        assert_eq!(files, 0, "{}", stderr(&out));
    }
    assert_eq!(memory_left_of(&cache, "r", 65534), Vec::<String>::new());
    // The realm's cache is the user's own.
    let lib = cache.join("realms/r/lib");
    assert_eq!(std::fs::metadata(&lib).unwrap().uid(), 65534);
    // By default (`--lazy=auto`) the incomplete realm's second run is served by the realm's
    // FUSE server (an ordinary user has no fanotify), which fetches nothing the first run
    // installed.
    let _servers = FuseServers(cache.clone(), tmp.path().to_owned());
    let out = run(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("backend lazy (FUSE: the realm's server")
            && !stderr(&out).contains("serving by notification"),
        "{}",
        stderr(&out)
    );
    assert!(!cache.join("realms/r/lazy-unavailable").exists());
    assert_eq!(fetched(&out), 0, "installed by the first run");
    // `--lazy` asks for it outright: the same server answers.
    let out = run(&["--lazy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already serving")
            && !stderr(&out).contains("serving by notification"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fetched(&out), 0, "installed by the first run");

    // Every package fetched once: a new realm of this user is shown from the store's shared
    // trees, in the user's own namespaces.
    let out = run_as("r", &[], "import demo_v");
    assert!(out.status.success(), "{}", stderr(&out));
    // Fetched by the realm's FUSE server (its counters, since it started: one GET).
    assert!(
        stderr(&out).contains("backend lazy (FUSE") && stderr(&out).contains(", 1 GETs"),
        "{}",
        stderr(&out)
    );
    // The server installs what it fetched, and the store builds its tree, after the read is
    // answered: the next realm is shown from trees once both are there.
    let trees = || {
        listdir(&cache.join("trees"))
            .iter()
            .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while trees() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(trees(), 2, "{:?}", listdir(&cache.join("trees")));
    let out = run_as(
        "r2",
        &[],
        "import demo_u, demo_v, os; print(demo_v.NAME, os.getuid())",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "demo_v 1000\n");
    assert!(
        stderr(&out).contains("shared package trees mounted read-only"),
        "{}",
        stderr(&out)
    );
    assert_eq!(listdir(&cache.join("realms/r2/lib")), Vec::<String>::new());
}

/// Stops the realm FUSE servers of a cache root (they outlive runs) when a test ends.
struct FuseServers(PathBuf, PathBuf);

impl Drop for FuseServers {
    fn drop(&mut self) {
        interp::stop_fuse_servers(&self.0, &self.1);
    }
}

/// A `file://` bucket whose `demo_s` archive is a FIFO: the test decides when its bytes
/// arrive. Returns (bucket URL, the archive's path, its bytes).
fn stalled_bucket(tmp: &Path) -> (String, PathBuf, Vec<u8>) {
    // 4 MB that do not compress: the archive is mostly the blob, whose entry comes after the
    // imported files (published with the import trace).
    let pkg = common::make_pkg(&tmp.join("src"), "demo_s", 4 << 20);
    let bucket_dir = tmp.join("bucket");
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let bucket = format!("file://{}", bucket_dir.display());
    publish(&bucket, &[], &[&pkg]);
    let archive = std::fs::read_dir(bucket_dir.join("sigma-lib/pkgs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("demo"))
        .expect("published archive");
    let data = std::fs::read(&archive).unwrap();
    std::fs::remove_file(&archive).unwrap();
    nix::unistd::mkfifo(&archive, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    (bucket, archive, data)
}

/// Start a cold run of `code` in realm `r` against the stalled bucket, stdin and stdout piped;
/// `fill` is its `--fill-process`.
fn spawn_stalled(bucket: &str, cache: &Path, code: &str, fill: &str) -> std::process::Child {
    sup()
        .args([
            "--stats",
            "--no-prefetch",
            "--fill-process",
            fill,
            "--fetch-timeout",
            "60",
            "--realm",
            "r",
        ])
        .args(["--bucket", bucket])
        .arg("--cache-dir")
        .arg(cache)
        .args(["python3", "-c", code])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sigma-supervise")
}

/// The next line of a child's stdout, or `None` after 30 s or at its end.
fn line_within(rx: &std::sync::mpsc::Receiver<String>) -> Option<String> {
    rx.recv_timeout(Duration::from_secs(30)).ok()
}

fn lines_of(out: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// A cold run of [`READ_BLOB`] against a stalled bucket that has sent half its archive: the
/// imported files (first in it) are whole, the blob is not.
/// The rest of a half-delivered archive: the blob's reader is let go, the second half
/// written, and the run must end well with the blob's verified bytes. The run's output and
/// the blob.
fn rest_delivered(
    mut child: std::process::Child,
    lines: &std::sync::mpsc::Receiver<String>,
    mut fifo: std::fs::File,
    data: &[u8],
    dir: &Path,
) -> (Output, Vec<u8>) {
    use std::io::Write as _;
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    fifo.write_all(&data[data.len() / 2..]).unwrap();
    drop(fifo);
    let blob = line_within(lines).unwrap_or_default();
    let out = child.wait_with_output().unwrap();
    show(&out);
    assert!(out.status.success());
    let want = std::fs::read(dir.join("src/demo_s/blob.bin")).unwrap();
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(&want));
    assert_eq!(blob, format!("blob {} {sha}", want.len()));
    (out, want)
}

struct HalfDelivered {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    fifo: std::fs::File,
    bucket: String,
    archive: PathBuf,
    data: Vec<u8>,
}

fn half_delivered(tmp: &Path, cache: &Path, fill: &str) -> HalfDelivered {
    half_delivered_to(tmp, cache, READ_BLOB, fill)
}

/// [`half_delivered`], with the proc running `code`.
fn half_delivered_to(tmp: &Path, cache: &Path, code: &str, fill: &str) -> HalfDelivered {
    use std::io::Write as _;
    let (bucket, archive, data) = stalled_bucket(tmp);
    let mut child = spawn_stalled(&bucket, cache, code, fill);
    let lines = lines_of(child.stdout.take().unwrap());
    let mut fifo = std::fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .unwrap();
    fifo.write_all(&data[..data.len() / 2]).unwrap();
    fifo.flush().unwrap();
    HalfDelivered {
        child,
        lines,
        fifo,
        bucket,
        archive,
        data,
    }
}

const READ_BLOB: &str = r#"
import hashlib, sys
import demo_s
print("imported", demo_s.NAME, flush=True)
sys.stdin.readline()
try:
    with open("/sigma/lib/demo_s/blob.bin", "rb") as f:
        data = f.read()
    print("blob", len(data), hashlib.sha256(data).hexdigest(), flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"#;

#[test]
fn a_cold_import_runs_while_the_rest_of_its_package_is_still_arriving() {
    // Downloaded by a fill process, and by the supervisor itself.
    for fill in ["always", "never"] {
        import_while_arriving(fill);
    }
}

fn import_while_arriving(fill: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let half = half_delivered(tmp.path(), &cache, fill);
    let (child, lines, fifo, data) = (half.child, half.lines, half.fifo, half.data);
    let first = line_within(&lines);
    let marker = cache.join("realms/r/state/demo-s.installed");
    assert_eq!(first.as_deref(), Some("imported demo_s"));
    assert!(!marker.exists(), "imported before the package was complete");
    // The blob's reader waits for the rest, then gets its verified bytes.
    let (out, _) = rest_delivered(child, &lines, fifo, &data, tmp.path());
    // The install's fill process writes the marker, then lets the run's waiters go.
    interp::settled(&cache);
    assert!(marker.exists(), "installed once its fill process ended");
    let err = stderr(&out);
    let served_early = err
        .split("files, ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(served_early.is_some_and(|n| n > 0), "{err}");
}

/// A cold run's package is streamed into a memory tree and served from there: its directory,
/// opened while the package's big file is still to come, is a dirfd whose relative opens are
/// answered through the resolver (the verified file, never a placeholder), and the package is
/// persisted complete for the next run, which the kernel serves; the memory tree is emptied.
#[test]
fn a_cold_run_is_served_from_memory_and_persisted_behind_it() {
    // On a disk: a cache root on a tmpfs is served from its lib dir.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    if on_tmpfs(tmp.path()) {
        eprintln!("SKIP: {} is a tmpfs", tmp.path().display());
        return;
    }
    let cache = tmp.path().join("cache");
    let half = half_delivered_to(tmp.path(), &cache, READ_BLOB_AT, "always");
    let (child, lines, fifo, data) = (half.child, half.lines, half.fifo, half.data);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    // Nothing in the store's lib dir while the run is served: the skeleton is in memory.
    assert!(listdir(&cache.join("realms/r/lib")).is_empty());
    let left = memory_left(&cache, "r");
    assert!(
        left.iter().any(|e| e.ends_with("/demo_s")),
        "streamed into a memory tree: {left:?}"
    );
    let (out, want) = rest_delivered(child, &lines, fifo, &data, tmp.path());
    let (files, calls) = served_from_memory(&out);
    assert!(files > 0 && calls > 0, "{}", stderr(&out));
    // Persisted behind the run, complete; the memory tree emptied once the run had ended.
    interp::settled(&cache);
    let state = cache.join("realms/r/state");
    assert!(state.join("demo-s.installed").exists());
    assert!(!state.join("demo-s.pending").exists());
    assert_eq!(
        std::fs::read(cache.join("realms/r/lib/demo_s/blob.bin")).unwrap(),
        want
    );
    assert!(listdir(&cache.join("realms/r/staging")).is_empty());
    assert_eq!(memory_left(&cache, "r"), Vec::<String>::new());
    let out = next_run_completes(
        tmp.path(),
        &cache,
        &half.bucket,
        &half.archive,
        &data,
        "always",
    );
    assert!(stderr(&out).contains("backend kernel"), "{}", stderr(&out));
}

/// [`READ_BLOB`], the blob read relative to its directory's fd, opened before the blob is in.
const READ_BLOB_AT: &str = r#"
import hashlib, os, sys
import demo_s
d = os.open("/sigma/lib/demo_s", os.O_RDONLY | os.O_DIRECTORY)
print("imported", demo_s.NAME, flush=True)
sys.stdin.readline()
try:
    with open("blob.bin", "rb", opener=lambda p, f: os.open(p, f, dir_fd=d)) as f:
        data = f.read()
    print("blob", len(data), hashlib.sha256(data).hexdigest(), flush=True)
except OSError as e:
    print("error", e.errno, flush=True)
"#;

/// The scheduling policy of every thread of process `pid` (field 41 of its `stat`; 5 is
/// `SCHED_IDLE`, 0 `SCHED_OTHER`), or `None` if it is gone.
fn policies(pid: i32) -> Option<Vec<String>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let p: Option<Vec<String>> = tasks
        .flatten()
        .map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let rest = stat.rsplit_once(')')?.1;
            rest.split_whitespace().nth(38).map(str::to_owned)
        })
        .collect();
    p.filter(|v| !v.is_empty())
}

/// Wait (at most 10 s) until every thread of `pid` has scheduling policy `policy`.
fn wait_for_policy(pid: i32, policy: &str, what: &str) {
    let start = Instant::now();
    loop {
        let now = policies(pid);
        if now.as_ref().is_some_and(|v| v.iter().all(|p| p == policy)) {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: {now:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_run_that_needed_its_package_s_first_files_ends_before_the_rest_arrives() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let code =
        "import sys, demo_s\nprint('imported', demo_s.NAME, flush=True)\nsys.stdin.readline()";
    let half = half_delivered_to(tmp.path(), &cache, code, "auto");
    let (mut child, lines, mut fifo) = (half.child, half.lines, half.fifo);
    let (bucket, archive, data) = (half.bucket, half.archive, half.data);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    let fills = interp::fills_of(&cache);
    assert_eq!(fills.len(), 1, "one fill process: {fills:?}");
    // What it unpacks comes from the bucket: it runs confined (no new privileges, a seccomp
    // filter; Landlock's rules are not shown in /proc).
    let status = std::fs::read_to_string(format!("/proc/{}/status", fills[0])).unwrap();
    assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");
    assert!(status.contains("\nSeccomp:\t2\n"), "{status}");
    // Past the import trace (the imported files), while the run lasts, the rest is written
    // with idle CPU only.
    wait_for_policy(fills[0], "5", "the fill process is not in SCHED_IDLE");
    // The run ends while the rest of the archive has not been sent: its fill process has it.
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().unwrap();
    show(&out);
    assert!(
        status.is_some_and(|s| s.success()),
        "the run waited for the rest of its package (or failed)"
    );
    // The realm line says what was decoded while the run lasted (the imported files) and
    // what was left to be decoded only to be persisted (the blob, still to arrive).
    let err = stderr(&out);
    let bytes_after = |what: &str| -> u64 {
        err.split(what)
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {what:?} in:\n{err}"))
    };
    let (during, after) = (
        bytes_after("decoded during the run "),
        bytes_after("(persisted only) "),
    );
    assert!(
        during > 0 && after > during,
        "{during} then {after}:\n{err}"
    );
    let marker = cache.join("realms/r/state/demo-s.installed");
    assert!(!marker.exists());
    assert_eq!(
        interp::fills_of(&cache),
        fills,
        "the fill process ended with the run"
    );
    // The run is over: a root fill process goes back to normal scheduling for the rest.
    if nix::unistd::geteuid().is_root() {
        wait_for_policy(fills[0], "0", "still in SCHED_IDLE after the run");
    }
    fifo.write_all(&data[data.len() / 2..]).unwrap();
    drop(fifo);
    interp::settled(&cache);
    assert!(marker.exists(), "installed once its fill process ended");
    // Complete and verified: the next run fetches nothing and reads the blob.
    let out = next_run_completes(tmp.path(), &cache, &bucket, &archive, &data, "auto");
    assert!(
        stderr(&out).contains("all 1 packages installed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_fill_process_builds_the_shared_tree_once_its_run_has_ended() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (bucket, archive, data) = stalled_bucket(tmp.path());
    // The proc reads the whole package, then stays until told to go.
    let code = format!("{READ_BLOB}\nsys.stdin.readline()\n");
    let mut child = spawn_stalled(&bucket, &cache, &code, "always");
    let lines = lines_of(child.stdout.take().unwrap());
    let mut fifo = std::fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .unwrap();
    fifo.write_all(&data).unwrap();
    drop(fifo);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let blob = line_within(&lines).unwrap_or_default();
    assert!(blob.starts_with("blob "), "{blob}");
    let marker = cache.join("realms/r/state/demo-s.installed");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "never installed");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Installed, and the run goes on: its fill process waits with the package's shared tree
    // (a link per file, for other realms) until the run is over.
    assert_eq!(interp::fills_of(&cache).len(), 1);
    assert_eq!(listdir(&cache.join("trees")), Vec::<String>::new());
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let out = child.wait_with_output().unwrap();
    show(&out);
    assert!(out.status.success());
    interp::settled(&cache);
    let trees = listdir(&cache.join("trees"));
    assert_eq!(trees.len(), 1, "{trees:?}");
    assert!(cache
        .join("trees")
        .join(&trees[0])
        .join("demo_s/blob.bin")
        .exists());
}

/// A run that outlasts its fill process's wait for it (`TREE_AFTER`, shortened here) keeps a
/// directory it opened in the memory tree: listing it and opening relative to it still give
/// the package's files once the package is persisted, and the tree is emptied when the run
/// ends.
#[test]
fn a_run_longer_than_its_fill_process_keeps_its_memory_tree() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = tmp.path().join("src");
    let pkg = common::make_pkg(&src, "demo_l", 200_000);
    let bucket = bucket_with(tmp.path(), &[&pkg]);
    let cache = tmp.path().join("cache");
    let r = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env: vec![("SIGMA_SUPERVISE_TEST_TREE_AFTER_MS", "100".into())],
    };
    // Persisted at most 500 ms after its last file is verified (PERSIST_AFTER), then 100 ms.
    let o = r.py("import demo_l, os, time\n\
         d = os.open(os.path.dirname(demo_l.__file__), os.O_RDONLY | os.O_DIRECTORY)\n\
         time.sleep(2.5)\n\
         names = sorted(os.listdir(d))\n\
         with open('__init__.py', opener=lambda p, f: os.open(p, f, dir_fd=d)) as f:\n\
         \x20   init = f.read().strip()\n\
         print(names, init)");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "['__init__.py', '__pycache__', 'blob.bin', 'sub'] NAME = \"demo_l\"\n"
    );
    assert!(cache.join("realms/r/state/demo-l.installed").exists());
    assert_eq!(memory_left(&cache, "r"), Vec::<String>::new());
}

#[test]
fn kill_9_of_the_supervisor_mid_install_gives_errors_never_zeros_and_the_install_completes() {
    use std::io::Write as _;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let half = half_delivered(tmp.path(), &cache, "always");
    let (mut child, lines, mut fifo) = (half.child, half.lines, half.fifo);
    let (bucket, archive, data) = (half.bucket, half.archive, half.data);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    // The download runs in a fill process of its own.
    let fills = interp::fills_of(&cache);
    assert_eq!(fills.len(), 1, "one fill process: {fills:?}");
    // The blob's reader is blocked on the supervisor when it is killed.
    let pid = child.id() as i32;
    kill_while_the_blob_waits(&mut child, pid);
    let _ = child.wait();
    // Whatever the proc printed after the kill, never bytes that are not the blob's (its last
    // line may end short of the errno as the jail ends: with PYTHONUNBUFFERED in the
    // environment, `print` writes the word and the errno apart).
    let after: Vec<String> = std::iter::from_fn(|| line_within(&lines)).collect();
    assert!(
        after
            .iter()
            .all(|l| l == "error" || l.starts_with("error ")),
        "a blocked reader gets an error or nothing: {after:?}"
    );
    // The install outlives the supervisor: the rest of the archive still lands, verified.
    let state = cache.join("realms/r/state");
    assert!(!state.join("demo-s.installed").exists());
    assert_eq!(
        interp::fills_of(&cache),
        fills,
        "the fill process died with its supervisor"
    );
    fifo.write_all(&data[data.len() / 2..]).unwrap();
    drop(fifo);
    interp::settled(&cache);
    assert!(state.join("demo-s.installed").exists());
    assert!(!state.join("demo-s.pending").exists());
    let want = std::fs::read(tmp.path().join("src/demo_s/blob.bin")).unwrap();
    assert_eq!(
        std::fs::read(cache.join("realms/r/lib/demo_s/blob.bin")).unwrap(),
        want
    );
    // Its memory tree emptied by the fill process (no run serves from it any more); the
    // empty directory is the next start's to sweep, this realm's or any other's of this user
    // (tests run side by side: another's may have swept it already).
    assert_eq!(memory_left(&cache, "r"), Vec::<String>::new());
    let trees = || memory_trees(&cache, "r", nix::unistd::geteuid().as_raw()).1;
    let killed = format!(".demo-s.{pid}.");
    if !trees().iter().any(|t| t.contains(&killed)) {
        eprintln!("the killed supervisor's empty memory tree was swept by another test's start");
    }

    // The next run downloads nothing: the realm is complete and mounted.
    let out = next_run_completes(tmp.path(), &cache, &bucket, &archive, &data, "always");
    assert!(
        stderr(&out).contains("all 1 packages installed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(listdir(&cache.join("realms/r/lib")), ["demo_s"]);
    // The realm's next start sweeps the dead supervisor's memory tree.
    let o = Realm {
        name: "r",
        bucket: &bucket,
        cache: &cache,
        env: vec![],
    }
    .py("import demo_s");
    assert!(o.status.success());
    let _ = o;
    assert!(
        !trees().iter().any(|t| t.contains(&killed)),
        "{:?}",
        trees()
    );
}

#[test]
fn kill_9_of_the_fill_process_mid_install_gives_errors_never_zeros_and_the_next_run_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let half = half_delivered(tmp.path(), &cache, "always");
    let (mut child, lines, fifo) = (half.child, half.lines, half.fifo);
    let (bucket, archive, data) = (half.bucket, half.archive, half.data);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    let fills = interp::fills_of(&cache);
    assert_eq!(fills.len(), 1, "one fill process: {fills:?}");
    // The blob's reader is blocked on the install when its process is killed.
    let pid = fills[0];
    kill_while_the_blob_waits(&mut child, pid);
    drop(fifo);
    // The reader gets EIO, the proc goes on and its run ends normally.
    assert_eq!(line_within(&lines).as_deref(), Some("error 5"));
    let out = child.wait_with_output().unwrap();
    show(&out);
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("the install of demo-s ended"),
        "the failure is said: {}",
        stderr(&out)
    );
    // What the killed install placed is gone again (removed under the package's lock).
    let state = cache.join("realms/r/state");
    assert!(!state.join("demo-s.pending").exists());
    assert!(!state.join("demo-s.installed").exists());
    assert!(listdir(&cache.join("realms/r/lib")).is_empty());
    // Its memory tree went with it (removed by the supervisor once the process was gone).
    assert_eq!(
        memory_trees(&cache, "r", nix::unistd::geteuid().as_raw()).1,
        Vec::<String>::new()
    );

    // The next run (a regular archive again) installs and serves the package.
    next_run_completes(tmp.path(), &cache, &bucket, &archive, &data, "always");
}

#[test]
fn kill_9_of_a_supervisor_downloading_itself_gives_errors_never_zeros_and_the_next_run_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let half = half_delivered(tmp.path(), &cache, "never");
    let (mut child, lines, fifo) = (half.child, half.lines, half.fifo);
    let (bucket, archive, data) = (half.bucket, half.archive, half.data);
    assert_eq!(line_within(&lines).as_deref(), Some("imported demo_s"));
    // The blob's reader is blocked on the supervisor when it is killed.
    let pid = child.id() as i32;
    kill_while_the_blob_waits(&mut child, pid);
    let _ = child.wait();
    drop(fifo);
    // Whatever the proc printed after the kill, never bytes that are not the blob's (its last
    // line may end short of the errno as the jail ends: with PYTHONUNBUFFERED in the
    // environment, `print` writes the word and the errno apart).
    let after: Vec<String> = std::iter::from_fn(|| line_within(&lines)).collect();
    assert!(
        after
            .iter()
            .all(|l| l == "error" || l.starts_with("error ")),
        "a blocked reader gets an error or nothing: {after:?}"
    );
    // Left behind: a placed skeleton and its journal, no marker (no fill process ran).
    assert!(interp::fills_of(&cache).is_empty());
    let state = cache.join("realms/r/state");
    assert!(state.join("demo-s.pending").exists());
    assert!(!state.join("demo-s.installed").exists());

    // The next run (a regular archive again) recovers and completes the package.
    next_run_completes(tmp.path(), &cache, &bucket, &archive, &data, "never");
    assert_eq!(
        listdir(&cache.join("realms/r/lib")),
        ["demo_s"],
        "nothing of the killed install is left beside it"
    );
}

/// After a killed install: the next run, with a regular archive again, reads the whole blob,
/// and the package is installed with no journal left. Returns that run's output.
fn next_run_completes(
    tmp: &Path,
    cache: &Path,
    bucket: &str,
    archive: &Path,
    data: &[u8],
    fill: &str,
) -> Output {
    use std::io::Write as _;
    std::fs::remove_file(archive).unwrap();
    std::fs::write(archive, data).unwrap();
    let mut next = spawn_stalled(bucket, cache, READ_BLOB, fill);
    next.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let out = next.wait_with_output().unwrap();
    show(&out);
    assert!(out.status.success());
    let want = std::fs::read(tmp.join("src/demo_s/blob.bin")).unwrap();
    use sha2::Digest as _;
    let sha = hex::encode(sha2::Sha256::digest(&want));
    assert_eq!(
        stdout(&out),
        format!("imported demo_s\nblob {} {sha}\n", want.len())
    );
    interp::settled(cache);
    let state = cache.join("realms/r/state");
    assert!(state.join("demo-s.installed").exists());
    assert!(!state.join("demo-s.pending").exists());
    out
}

/// Let the proc of [`READ_BLOB`] ask for the blob, and kill -9 `pid` while that read waits.
fn kill_while_the_blob_waits(child: &mut std::process::Child, pid: i32) {
    use std::io::Write as _;
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}
