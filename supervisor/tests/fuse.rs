//! The rootless lazy backend end to end: the real binary started by an ordinary user (nobody,
//! through setpriv), real CPython in its jail, the realm's FUSE server mounted through the
//! real setuid fusermount3 (fuse3; `scripts/bootstrap` installs it and gives `/dev/fuse` the
//! mode udev gives it). Needs root to become nobody.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

extern crate fetcher as sigma_fetcher;
#[path = "../../fetcher/tests/common/mod.rs"]
mod common;

mod interp;
use interp::{stderr, stdout};

const NOBODY: u32 = 65534;

/// Two published packages (demo_z with a 3 MB blob, demo_y never touched: the realm stays
/// incomplete), a cache root and a work dir of nobody's, and the binary where nobody can run
/// it. Stops the realm's servers and detaches their mounts when dropped.
struct Setup {
    tmp: tempfile::TempDir,
    bin: PathBuf,
    pkg: PathBuf,
    bucket: String,
    /// The standard AWS variables of an `s3://` bucket's server (MinIO), for every run.
    env: Vec<(&'static str, String)>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        interp::stop_fuse_servers(&self.cache(), self.tmp.path());
    }
}

/// `None` (and a loud SKIP) where this process cannot become nobody.
fn setup(big: usize) -> Option<Setup> {
    setup_in(big, None)
}

/// [`setup`] with the packages published to `s3` (bucket `libs`, made here) instead of a
/// `file://` bucket.
fn setup_in(big: usize, s3: Option<&common::Minio>) -> Option<Setup> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to start the supervisor as nobody");
        return None;
    }
    assert!(
        Path::new("/usr/bin/fusermount3").exists() || Path::new("/bin/fusermount3").exists(),
        "fusermount3 (fuse3) is needed: scripts/bootstrap installs it"
    );
    let mode = std::fs::metadata("/dev/fuse")
        .expect("/dev/fuse")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o666,
        0o666,
        "/dev/fuse must be 0666 (udev's mode) for an ordinary user's fusermount3: scripts/bootstrap sets it"
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tmp.path().join("sigma-supervise");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).unwrap();
    }
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo_z", big);
    let other = common::make_pkg(&tmp.path().join("src"), "demo_y", 1000);
    let dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&dir).unwrap();
    let (bucket, env) = match s3 {
        Some(m) => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(m.bucket("libs", &sigma_fetcher::FetchConfig::default()));
            ("s3://libs".to_owned(), m.aws_env())
        }
        None => (format!("file://{}", dir.display()), Vec::new()),
    };
    let out = interp::supervisor()
        .args(["publish", "--bucket", &bucket])
        .arg(&pkg)
        .arg(&other)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    for d in ["cache", "work"] {
        let d = tmp.path().join(d);
        std::fs::create_dir(&d).unwrap();
        nix::unistd::chown(&d, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    }
    Some(Setup {
        tmp,
        bin,
        pkg,
        bucket,
        env,
    })
}

impl Setup {
    fn cache(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }

    /// `sigma-supervise --stats --no-prefetch --realm r … python3 -c CODE` as nobody.
    fn cmd(&self, extra: &[&str], code: &str) -> Command {
        let work = self.tmp.path().join("work");
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&self.bin)
            .args([
                "--stats",
                "--no-prefetch",
                "--realm",
                "r",
                "--bucket",
                &self.bucket,
            ])
            .args(extra)
            .arg("--cache-dir")
            .arg(self.cache())
            .args(["/usr/bin/python3", "-c", code])
            .current_dir(&work)
            .env_remove("PYTHONPATH")
            .env_remove("RUST_LOG")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("HOME", interp::home_in(&work))
            .env_remove("XDG_CACHE_HOME")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    fn run(&self, code: &str) -> Output {
        self.run_with(&[], code)
    }

    fn run_with(&self, extra: &[&str], code: &str) -> Output {
        let o = self.cmd(extra, code).output().unwrap();
        eprintln!("--- stdout\n{}--- stderr\n{}", stdout(&o), stderr(&o));
        interp::settled(&self.cache());
        o
    }

    /// A first run that only lists the prefix: the realm's index snapshot, nothing installed;
    /// served by notification (the server starts with the next run).
    fn snapshot(&self) {
        let o = self.run("import os; print(sorted(os.listdir('/sigma/lib')))");
        assert_eq!(stdout(&o), "['demo_y', 'demo_z']\n", "{}", stderr(&o));
        assert!(
            realm_line(&o).contains(
                "backend notification (lazy backend: its FUSE server is started by the realm's \
                 second run)"
            ),
            "{}",
            stderr(&o)
        );
    }

    fn sha256_of(&self, path: &Path) -> String {
        let o = Command::new("sha256sum").arg(path).output().unwrap();
        stdout(&o).split(' ').next().unwrap().to_owned()
    }

    /// The archive of `name` in the bucket.
    fn archive(&self, name: &str) -> PathBuf {
        let pkgs =
            PathBuf::from(self.bucket.strip_prefix("file://").unwrap()).join("sigma-lib/pkgs");
        std::fs::read_dir(&pkgs)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(name))
            .expect("the package's archive")
    }
}

fn realm_line(o: &Output) -> String {
    stderr(o)
        .lines()
        .find(|l| l.starts_with("sigma-supervise realm "))
        .unwrap_or_else(|| panic!("no realm line:\n{}", stderr(o)))
        .to_owned()
}

/// The run was served by the realm's FUSE server: its pid.
fn fuse_server(o: &Output) -> u32 {
    let line = realm_line(o);
    assert!(line.contains("backend lazy (FUSE"), "{line}");
    counter(&line, "pid ") as u32
}

fn counter(line: &str, after: &str) -> u64 {
    line.split(after)
        .nth(1)
        .and_then(|s| s.split([' ', ';', ',']).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no {after:?} in {line:?}"))
}

/// `N` in the server's "fetched … packages (N installing)".
fn installing(line: &str) -> u64 {
    counter(line, "packages (")
}

/// The one package's one download, as a run's line shows it: done (`fetched 1 packages (0
/// installing)`), or under way, which a download in the server counts at its end (`fetched 0
/// (1 installing)`) and one by a fill process from its start (`fetched 1 (1 installing)`).
fn one_download_so_far(line: &str) -> bool {
    matches!(
        (counter(line, "fetched "), installing(line)),
        (1, 0) | (0, 1) | (1, 1)
    )
}

/// The server's counters once no install it started is under way. A run's own line may show
/// one still installing (its reader was answered as soon as its file was verified, and the run
/// ended before the rest of the package was in).
fn server_counters_settled(s: &Setup) -> String {
    let dir = s.cache().join("realms/r/fuse");
    let start = Instant::now();
    loop {
        let line = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".stats"))
            .and_then(|e| std::fs::read_to_string(e.path()).ok())
            .unwrap_or_default();
        if line.contains(" installing)") && installing(&line) == 0 {
            return line.trim().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "an install still under way after 30 s: {line}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `N reads` in the server's counters.
fn reads(line: &str) -> u64 {
    let tail = line
        .split("the server so far: ")
        .nth(1)
        .expect("server counters");
    tail.split(' ').next().unwrap().parse().unwrap()
}

fn notifications(o: &Output) -> u64 {
    counter(&stderr(o), "sigma-supervise stats: ")
}

#[test]
fn an_ordinary_users_incomplete_realm_is_served_by_its_fuse_server_at_kernel_speed() {
    let Some(s) = setup(3_000_000) else { return };
    s.snapshot();
    // Listing and stat from the server's memory: the tree and sizes, nothing fetched.
    let o = s.run(
        "import os; d='/sigma/lib/demo_z'; print(sorted(os.listdir(d)), os.stat(d+'/blob.bin').st_size)",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "['__init__.py', '__pycache__', 'blob.bin', 'sub'] 3000000\n"
    );
    let server = fuse_server(&o);
    // The server, which answers procs' requests, runs confined: no new privileges, a seccomp
    // filter (no exec, no ptrace, no namespaces or mounts), and its unmounter beside it.
    let status = std::fs::read_to_string(format!("/proc/{server}/status")).unwrap();
    assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");
    assert!(status.contains("\nSeccomp:\t2\n"), "{status}");
    assert_eq!(unmounters_of(server).len(), 1);
    let line = realm_line(&o);
    assert!(line.contains("started by this run"), "{line}");
    assert_eq!(counter(&line, "fetched "), 0, "{line}");
    assert_eq!(counter(&line, "opened "), 0, "{line}");
    assert_eq!(notifications(&o), 0, "nothing under the prefix is notified");
    assert!(
        !s.cache().join("realms/r/lib/demo_z").exists(),
        "nothing installed by a listing"
    );

    // Import, mmap of a file never read, hashing: real bytes; the package fetched once.
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let code = r#"
import hashlib, mmap
import demo_z
from demo_z.sub.mod import f
print(demo_z.NAME, f())
with open('/sigma/lib/demo_z/blob.bin', 'rb') as fh:
    m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    print(hashlib.sha256(m[:]).hexdigest())
"#;
    let o = s.run(code);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("demo_z 42\n{want}\n"));
    assert_eq!(fuse_server(&o), server, "one server for the realm's runs");
    let line = realm_line(&o);
    assert!(line.contains("already serving"), "{line}");
    assert!(
        one_download_so_far(&line),
        "fetched, or installing still: {line}"
    );
    assert_eq!(counter(&line, "denied "), 0, "{line}");
    let settled = server_counters_settled(&s);
    assert_eq!(counter(&settled, "fetched "), 1, "one download: {settled}");
    assert_eq!(notifications(&o), 0);
    let after_first = reads(&line);
    assert!(after_first > 0, "{line}");

    // The server installed the package: the next run shows it from the realm's lib dir over
    // the mount, and not one read reaches the server.
    let o = s.run(code);
    assert_eq!(stdout(&o), format!("demo_z 42\n{want}\n"));
    let line = realm_line(&o);
    assert_eq!(reads(&line), after_first, "{line}");
    assert!(
        line.contains("1 installed entries shown from the lib dir"),
        "{line}"
    );

    // `cp` and `shutil.copy` in the proc get real bytes.
    let o = s.run(
        "import shutil, subprocess, sys\n\
         subprocess.run(['cp', '/sigma/lib/demo_z/sub/mod.py', '/tmp/c'], check=True)\n\
         shutil.copy('/sigma/lib/demo_z/__init__.py', '/tmp/i')\n\
         sys.stdout.write(open('/tmp/c').read() + open('/tmp/i').read())",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let src = |p: &str| std::fs::read_to_string(s.pkg.join(p)).unwrap();
    assert_eq!(
        stdout(&o),
        format!("{}{}", src("sub/mod.py"), src("__init__.py"))
    );

    // The mount is read-only to the proc, and its user's alone on the host.
    let o = s.run(
        "import os\n\
         try:\n    open('/sigma/lib/demo_z/new', 'w')\nexcept OSError as e: print(e.errno)",
    );
    assert_eq!(stdout(&o), "30\n", "EROFS");
    let mnt = std::fs::read_dir(s.cache().join("realms/r/fuse"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(&format!("-{server}")))
        .expect("the server's mount point");
    let root_reads = Command::new("ls").arg(&mnt).output().unwrap();
    assert!(
        !root_reads.status.success(),
        "another user (root) must not reach the mount: {}",
        stdout(&root_reads)
    );
}

#[test]
fn kill_9_of_the_fuse_server_during_a_fetch_never_gives_zeros_and_the_next_run_reads() {
    use std::io::Read as _;
    let Some(s) = setup(4 << 20) else { return };
    s.snapshot();
    // demo_z's archive becomes a FIFO only this test writes: the server's fetch waits in it.
    let archive = s.archive("demo-z");
    let data = std::fs::read(&archive).unwrap();
    std::fs::remove_file(&archive).unwrap();
    nix::unistd::mkfifo(&archive, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    nix::unistd::chown(&archive, Some(NOBODY.into()), None).unwrap();
    let code = "try:\n    d = open('/sigma/lib/demo_z/blob.bin', 'rb').read(); print('read', len(d), d.count(0))\nexcept OSError as e:\n    print('error', e.errno)";
    let mut child = s
        .cmd(&["--fetch-timeout", "60"], code)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held open (no end of file) until the server is gone.
    let (rx, done_tx) = interp::half_fed_fifo(&archive, &data);
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the server never read the archive");
    std::thread::sleep(Duration::from_millis(300));
    let servers = interp::fuse_servers_of(&s.cache());
    assert_eq!(servers.len(), 1, "one server: {servers:?}");
    let name = fuse_mount_name(&s, servers[0]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(servers[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = done_tx.send(());
    // The reader gets an error, never the zeros of a file not yet there.
    let start = Instant::now();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(out.starts_with("error "), "the reader got {out:?}");
    assert!(status.success(), "the proc handled the error itself");
    // Its unmounter removes the dead server's mount, without waiting for a next server.
    // (A dead server's mount answers ENOTCONN to `stat`: look for its name and its mount.)
    let dead = s.cache().join(format!("realms/r/fuse/{name}"));
    let left = || {
        let listed = std::fs::read_dir(s.cache().join("realms/r/fuse"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy() == name);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        listed || mounts.contains(&*dead.to_string_lossy())
    };
    let start = Instant::now();
    while left() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!left(), "{} is left", dead.display());

    // The bytes arrive: the next run starts a server of its own and reads the real file.
    std::fs::remove_file(&archive).unwrap();
    std::fs::write(&archive, &data).unwrap();
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = s.run(
        "import hashlib; print(hashlib.sha256(open('/sigma/lib/demo_z/blob.bin','rb').read()).hexdigest())",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), s.sha256_of(&s.pkg.join("blob.bin")));
    let line = realm_line(&o);
    assert!(line.contains("started by this run"), "{line}");
    assert_ne!(fuse_server(&o) as i32, servers[0]);
    // Nothing of the dead server is left (its unmounter removed its mount and directory).
    let left: Vec<String> = std::fs::read_dir(s.cache().join("realms/r/fuse"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(&format!("-{}", servers[0])))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_s3_buckets_realm_is_served_by_its_confined_fuse_server() {
    // The server fetches over S3 (MinIO on 127.0.0.1, the standard AWS variables) once it has
    // confined itself: what a fetch reads (configuration, certificates, the network) it still
    // reaches; it writes only in the cache.
    let m = common::Minio::start();
    let Some(s) = setup_in(2_000_000, Some(&m)) else {
        return;
    };
    s.snapshot();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let o = s.run(
        "import hashlib, demo_z; print(demo_z.NAME, hashlib.sha256(open('/sigma/lib/demo_z/blob.bin','rb').read()).hexdigest())",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("demo_z {want}\n"));
    let line = realm_line(&o);
    assert!(line.contains("started by this run"), "{line}");
    assert!(line.contains("s3://libs"), "{line}");
    assert!(one_download_so_far(&line), "{line}");
    let settled = server_counters_settled(&s);
    assert_eq!(counter(&settled, "fetched "), 1, "one download: {settled}");
    let server = fuse_server(&o);
    let status = std::fs::read_to_string(format!("/proc/{server}/status")).unwrap();
    assert!(status.contains("\nSeccomp:\t2\n"), "{status}");
    // The package the server fetched was installed in the realm (its lib dir, in the cache).
    assert!(s.cache().join("realms/r/lib/demo_z/blob.bin").is_file());
}

/// The name of server `pid`'s mount directory in the realm's `fuse` dir (`<key>-<pid>`).
fn fuse_mount_name(s: &Setup, pid: i32) -> String {
    std::fs::read_dir(s.cache().join("realms/r/fuse"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(&format!("-{pid}")))
        .unwrap_or_else(|| panic!("no mount directory of server {pid}"))
}

/// The unmounters (`sigma-supervise-unmount`) whose parent is `server`.
fn unmounters_of(server: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Field 4, after the parenthesised name.
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            cmd.starts_with(b"sigma-supervise-unmount\0") && ppid == Some(server)
        })
        .collect()
}

#[test]
fn sixteen_concurrent_procs_share_one_server_and_one_download() {
    let Some(s) = setup(2_000_000) else { return };
    s.snapshot();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let code = "import hashlib, demo_z; print(hashlib.sha256(open('/sigma/lib/demo_z/blob.bin','rb').read()).hexdigest())";
    let children: Vec<_> = (0..16)
        .map(|_| {
            s.cmd(&[], code)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let mut started = 0;
    let mut pids = std::collections::HashSet::new();
    for o in &outs {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
        assert_eq!(stdout(o).trim(), want);
        pids.insert(fuse_server(o));
        started += usize::from(realm_line(o).contains("started by this run"));
    }
    assert_eq!((pids.len(), started), (1, 1), "one server, started once");
    let settled = server_counters_settled(&s);
    assert_eq!(counter(&settled, "fetched "), 1, "one download: {settled}");
}

/// A package another realm downloaded is read from the store, and installed in this realm off
/// the server's request loop: the next run shows it from the lib dir.
#[test]
fn a_package_in_the_store_is_served_then_installed_for_the_next_run() {
    let Some(s) = setup(500_000) else { return };
    // A first life of realm r downloads demo_z; the realm goes, its content stays in the store.
    let o = s.cmd(&[], "import demo_z").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    interp::settled(&s.cache());
    let lib = s.cache().join("realms/r/lib/demo_z");
    let _ = std::fs::remove_dir_all(s.cache().join("realms/r"));
    s.snapshot();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let code = "import hashlib, demo_z; print(hashlib.sha256(open('/sigma/lib/demo_z/blob.bin','rb').read()).hexdigest())";
    let o = s.run(code);
    assert_eq!(stdout(&o).trim(), want, "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(line.contains("0 installed entries"), "{line}");
    assert_eq!(counter(&line, "fetched "), 0, "read from the store: {line}");
    let start = Instant::now();
    while !lib.join("__init__.py").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "demo_z never installed in realm r"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = s.run(code);
    assert_eq!(stdout(&o).trim(), want);
    let line = realm_line(&o);
    assert!(
        line.contains("1 installed entries shown from the lib dir"),
        "{line}"
    );
}

#[test]
fn where_no_fuse_mount_can_be_made_the_run_is_served_by_notification_and_says_why() {
    let Some(s) = setup(1000) else { return };
    s.snapshot();
    // The realm's FUSE dir is a file nobody can replace: no mount point.
    std::fs::write(s.cache().join("realms/r/fuse"), "").unwrap();
    let o = s.run("import demo_z; print(demo_z.NAME)");
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(
        line.contains("backend notification (lazy backend: unavailable ("),
        "{line}"
    );
    assert!(
        std::fs::read_to_string(s.cache().join("realms/r/fuse-unavailable"))
            .unwrap()
            .contains("fuse"),
        "remembered"
    );
    // `--lazy` tries again and says so on stderr.
    let o = s.run_with(&["--lazy"], "import demo_z");
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("lazy backend unavailable (")
            && stderr(&o).contains("serving by notification"),
        "{}",
        stderr(&o)
    );
    assert!(interp::fuse_servers_of(&s.cache()).is_empty());
}
