//! The lazy realm backend end to end (`--lazy`): the real binary, real CPython, a real ext4
//! image on a loop device and real fanotify pre-content events. Needs root (mount, fanotify in
//! the initial namespace) and a kernel with pre-content events (6.14+): without them the
//! supervisor falls back to notifications and these tests fail, loudly, on the backend line.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

extern crate fetcher as sigma_fetcher;
#[path = "../../fetcher/tests/common/mod.rs"]
mod common;

mod interp;
use interp::{stderr, stdout};

/// A published package in a `file://` bucket and a cache root; unmounts the realm images the
/// tests created when dropped (images stay mounted for reuse otherwise).
struct Setup {
    tmp: tempfile::TempDir,
    pkg: PathBuf,
    bucket: String,
}

impl Drop for Setup {
    fn drop(&mut self) {
        // Where no image could be made, the realm's FUSE server served it (it outlives runs).
        interp::stop_fuse_servers(&self.cache(), self.tmp.path());
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.tmp.path().to_string_lossy().into_owned();
        for mnt in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mnt.starts_with(&root) {
                let _ = Command::new("umount").arg(mnt).status();
            }
        }
    }
}

fn setup(big: usize) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = common::make_pkg(&tmp.path().join("src"), "demo_z", big);
    // Never touched: the realm stays incomplete, so every run here takes the lazy backend
    // (a complete realm is bind-mounted from its lib dir instead).
    let other = common::make_pkg(&tmp.path().join("src"), "demo_y", 1000);
    let dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&dir).unwrap();
    let bucket = format!("file://{}", dir.display());
    let out = interp::supervisor()
        .args(["publish", "--bucket", &bucket])
        .arg(&pkg)
        .arg(&other)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    Setup { tmp, pkg, bucket }
}

impl Setup {
    fn cache(&self) -> PathBuf {
        self.tmp.path().join("cache")
    }

    /// `sigma-supervise --stats [--lazy] --realm r … python3 -c CODE` (without `--lazy`: the
    /// default, `auto`).
    fn cmd(&self, lazy: bool, code: &str) -> Command {
        let mut c = interp::supervisor();
        c.env_remove("PYTHONPATH")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            // Fetches happen only where a test makes them (no prefetch, no completion of the
            // realm in the background: it must stay incomplete to be served lazily).
            .args(["--stats", "--no-prefetch"]);
        if lazy {
            c.arg("--lazy");
        }
        c.args(["--realm", "r", "--bucket", &self.bucket])
            .arg("--cache-dir")
            .arg(self.cache())
            .args(["python3", "-c", code]);
        c
    }

    /// Run `code`; then wait for the run's fill processes, so the next step finds what this
    /// run installed (a run ends without waiting for them).
    fn run(&self, lazy: bool, code: &str) -> Output {
        let o = self.cmd(lazy, code).output().unwrap();
        eprintln!("--- stdout\n{}--- stderr\n{}", stdout(&o), stderr(&o));
        interp::settled(&self.cache());
        o
    }

    /// A first run that only lists the prefix: the realm's index snapshot, nothing installed.
    fn snapshot(&self) {
        let o = self.run(false, "import os; print(sorted(os.listdir('/sigma/lib')))");
        assert_eq!(stdout(&o), "['demo_y', 'demo_z']\n");
    }

    /// A default run that finds the realm's image missing: served by the realm's FUSE server
    /// meanwhile, it starts making the image in a process of its own; waited for, so the next
    /// run shows it.
    fn image_made(&self) {
        let o = self.run(false, "pass");
        assert!(
            realm_line(&o).contains("backend lazy (FUSE; its image is being made for the next run"),
            "{}",
            stderr(&o)
        );
    }

    /// The entry of the realm's lazy dir that `pick` chooses (one image per realm here).
    fn lazy_entry(&self, what: &str, pick: impl Fn(&Path) -> bool) -> PathBuf {
        std::fs::read_dir(self.cache().join("realms/r/lazy"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| pick(p))
            .unwrap_or_else(|| panic!("no {what} in the realm's lazy dir"))
    }

    fn sha256_of(&self, path: &Path) -> String {
        let o = Command::new("python3")
            .args([
                "-c",
                "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
            ])
            .arg(path)
            .output()
            .unwrap();
        stdout(&o).trim().to_owned()
    }
}

fn realm_line(o: &Output) -> String {
    stderr(o)
        .lines()
        .find(|l| l.starts_with("sigma-supervise realm "))
        .unwrap_or_else(|| panic!("no realm line:\n{}", stderr(o)))
        .to_owned()
}

/// The run was served by the lazy backend (not a fallback).
fn assert_lazy(o: &Output) {
    let line = realm_line(o);
    assert!(line.contains("backend lazy (ext4 image"), "{line}");
}

fn counter(line: &str, after: &str) -> u64 {
    line.split(after)
        .nth(1)
        .and_then(|s| s.split([' ', ';', ',']).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no {after:?} in {line:?}"))
}

#[test]
fn placeholders_are_visible_before_any_fetch_and_every_read_gets_real_bytes() {
    let s = setup(3_000_000);
    s.snapshot();
    // Listing and stat: sizes right, nothing fetched.
    let o = s.run(
        true,
        "import os; d='/sigma/lib/demo_z'; print(sorted(os.listdir(d)), os.stat(d+'/blob.bin').st_size)",
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "['__init__.py', '__pycache__', 'blob.bin', 'sub'] 3000000\n",
        "the tree and sizes before any fetch"
    );
    let line = realm_line(&o);
    assert!(line.contains("backend lazy (ext4 image"), "{line}");
    assert_eq!(counter(&line, "fetched "), 0, "{line}");
    assert_eq!(counter(&line, "filled "), 0, "{line}");

    // `cp` in the proc: real bytes (cp's SEEK_DATA probing of a sparse file raises no event of
    // its own; the open does).
    let o = s.run(
        true,
        "import subprocess, sys; subprocess.run(['cp', '/sigma/lib/demo_z/sub/mod.py', '/tmp/c'], check=True); sys.stdout.write(open('/tmp/c').read())",
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        std::fs::read_to_string(s.pkg.join("sub/mod.py")).unwrap()
    );
    assert_lazy(&o);
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    // Import, mmap of a file never read before, shutil.copy of another: real bytes everywhere, no
    // notification for any read (--stats keeps only the proc's own writes into /tmp notified,
    // for its read-only hint).
    let code = r#"
import hashlib, mmap, shutil, os
import demo_z
from demo_z.sub.mod import f
print(demo_z.NAME, f())
with open('/sigma/lib/demo_z/blob.bin', 'rb') as fh:
    m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    print(hashlib.sha256(m[:]).hexdigest())
dst = '/tmp/sigma-lazy-copy-%d' % os.getpid()
# Two destinations: copies keep the source's read-only mode, and the proc is no root.
shutil.copy('/sigma/lib/demo_z/sub/__init__.py', dst + '-init')
shutil.copy('/sigma/lib/demo_z/sub/mod.py', dst)
print(open(dst).read().strip())
os.unlink(dst)
"#;
    let o = s.run(true, code);
    assert_eq!(o.status.code(), Some(0));
    let src_mod = std::fs::read_to_string(s.pkg.join("sub/mod.py")).unwrap();
    assert_eq!(
        stdout(&o),
        format!("demo_z 42\n{want}\n{}\n", src_mod.trim())
    );
    let line = realm_line(&o);
    assert!(line.contains("backend lazy (ext4 image"), "{line}");
    assert_eq!(
        counter(&line, "fetched "),
        0,
        "in the cache since the cp: {line}"
    );
    let err = stderr(&o);
    let rows: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("sigma-supervise stats: "))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(
        err.contains("sigma-supervise stats: 5 notifications")
            && rows
                == [
                    "  chmod continue 2",
                    "  openat continue 2",
                    "  unlink continue 1"
                ],
        "only the two copies (open, chmod) and the unlink are notified: {err}"
    );
    // The next run: files completed in this boot raise no event at all (ignore marks from the
    // image's log), so nothing is filled or even checked.
    let o = s.run(true, code);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("demo_z 42\n"));
    let line = realm_line(&o);
    assert_eq!(
        (
            counter(&line, "filled "),
            counter(&line, "already present ")
        ),
        (0, 0),
        "{line}"
    );
}

#[test]
fn a_corrupt_object_gives_eio_and_nothing_is_filled() {
    let s = setup(200_000);
    s.snapshot();
    let pkgs = s.tmp.path().join("bucket/sigma-lib/pkgs");
    let archive = std::fs::read_dir(&pkgs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("demo-z-"))
        .unwrap();
    let mut data = std::fs::read(&archive).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&archive, data).unwrap();
    let code = r#"
try:
    open('/sigma/lib/demo_z/blob.bin', 'rb').read(10)
    print('read')
except OSError as e:
    print('errno', e.errno)
"#;
    let o = s.run(true, code);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "errno 5\n", "EIO, never zeros");
    let line = realm_line(&o);
    assert!(
        line.contains("backend lazy (ext4 image") && counter(&line, "denied ") >= 1,
        "{line}"
    );
    assert!(stderr(&o).contains("integrity mismatch"), "{}", stderr(&o));
    // Nothing wrong was written: the placeholder still has no data block, the CAS is empty.
    let img = std::fs::read_dir(s.cache().join("realms/r/lazy"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .unwrap();
    assert_eq!(
        std::fs::metadata(img.join("demo_z/blob.bin"))
            .unwrap()
            .blocks(),
        0
    );
    assert_eq!(std::fs::read_dir(s.cache().join("cas")).unwrap().count(), 0);
}

#[test]
fn a_store_that_is_down_fails_the_read_within_the_fetch_bound() {
    let s = setup(100_000);
    s.snapshot();
    // Same realm (its snapshot), a bucket on a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let o = interp::supervisor()
        .env_remove("PYTHONPATH")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ACCESS_KEY_ID", "x")
        .env("AWS_SECRET_ACCESS_KEY", "y")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .args(["--stats", "--lazy", "--realm", "r", "--bucket", "s3://gone"])
        .arg("--cache-dir")
        .arg(s.cache())
        .args([
            "python3",
            "-c",
            "import time\nt=time.monotonic()\ntry:\n import demo_z\n print('imported')\nexcept (ImportError, OSError) as e:\n print(type(e).__name__, round(time.monotonic()-t, 1))",
        ])
        .output()
        .unwrap();
    eprintln!("{}", stderr(&o));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let secs: f64 = out.trim().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(!out.starts_with("imported"), "{out}");
    assert!(
        secs < 2.5,
        "{out}: the read waited past the 2 s fetch bound"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
    assert!(realm_line(&o).contains("backend lazy (ext4 image"));
}

#[test]
fn sixteen_concurrent_procs_make_one_download() {
    let s = setup(2_000_000);
    s.snapshot();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let code = "import hashlib, demo_z; print(hashlib.sha256(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()).hexdigest())";
    let children: Vec<_> = (0..16)
        .map(|_| {
            s.cmd(true, code)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut downloads, mut filled, mut touched) = (0, 0, Vec::new());
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(stdout(&o).trim(), want);
        let line = realm_line(&o);
        assert!(line.contains("backend lazy (ext4 image"), "{line}");
        downloads += counter(&line, "fetched ");
        filled += counter(&line, "filled ");
        // The first touches a run answered (a run that starts after a file was completed
        // has no event for it: an ignore mark from the image's log).
        touched.push(counter(&line, "filled ") + counter(&line, "already present "));
    }
    assert_eq!(downloads, 1, "one download across 16 supervisors");
    // The first run to start saw every file the import reads still a placeholder.
    let files = touched.iter().copied().max().unwrap_or(0);
    assert!(files > 0, "{touched:?}");
    assert_eq!(
        filled, files,
        "each file copied into the image once across 16 supervisors: {touched:?}"
    );
}

#[test]
fn a_supervisor_answers_only_its_own_procs_first_touches() {
    let s = setup(500_000);
    s.snapshot();
    // A keeps its proc (and its group) alive, touching nothing, while B's proc reads.
    let mut a = s
        .cmd(
            true,
            "import sys; print('up', flush=True); sys.stdin.read()",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = String::new();
    use std::io::BufRead as _;
    std::io::BufReader::new(a.stdout.as_mut().unwrap())
        .read_line(&mut up)
        .unwrap();
    assert_eq!(up, "up\n");
    let b = s.run(
        true,
        "import demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))",
    );
    assert_eq!(stdout(&b).trim(), "500000");
    let line_b = realm_line(&b);
    assert!(line_b.contains("backend lazy (ext4 image"), "{line_b}");
    assert!(counter(&line_b, "filled ") >= 2, "{line_b}");
    drop(a.stdin.take());
    let a = a.wait_with_output().unwrap();
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let line_a = realm_line(&a);
    assert!(line_a.contains("backend lazy (ext4 image"), "{line_a}");
    // B's proc's reads went to B's group alone: A saw no event of them.
    assert_eq!(
        (
            counter(&line_a, "filled "),
            counter(&line_a, "already present "),
            counter(&line_a, "denied ")
        ),
        (0, 0, 0),
        "{line_a}"
    );
}

/// The pids of processes whose fanotify group marks the filesystem with (kernel) device `dev`.
fn groups_marking(dev: u64) -> Vec<i32> {
    let want = format!("sdev:{dev:x} ");
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_fan = std::fs::read_link(fd.path())
                .map(|l| l.to_string_lossy().contains("fanotify"))
                .unwrap_or(false);
            let info = e.path().join("fdinfo").join(fd.file_name());
            if is_fan && std::fs::read_to_string(info).is_ok_and(|t| t.contains(&want)) {
                pids.push(pid);
            }
        }
    }
    pids
}

#[test]
fn the_group_of_a_finished_run_is_let_go_by_no_process_left_behind() {
    let s = setup(100_000);
    s.snapshot();
    let o = s.run(
        true,
        "import demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))",
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o).trim(), "100000");
    assert_lazy(&o);
    let mnt = s.lazy_entry("image mount point", |p| p.is_dir());
    let st_dev = std::fs::metadata(&mnt).unwrap().dev();
    let dev = (u64::from(libc::major(st_dev)) << 20) | u64::from(libc::minor(st_dev));
    // The run's group may outlive it for the kernel's teardown of its marks, in a holder that
    // lets go once the supervisor has exited: never for long, and never for good.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = groups_marking(dev);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "processes {left:?} still hold the finished run's fanotify group"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_corrupt_image_map_fails_first_touches_with_eio_and_the_next_run_rebuilds_it() {
    let s = setup(200_000);
    s.snapshot();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    // The image is made, nothing is filled.
    let o = s.run(
        true,
        "import os; print(os.stat('/sigma/lib/demo_z/blob.bin').st_size)",
    );
    assert_eq!(stdout(&o).trim(), "200000");
    assert_lazy(&o);
    let map = s.lazy_entry("image map", |p| {
        p.to_string_lossy().ends_with(".inodes.json")
    });
    std::fs::write(&map, "not a map\n").unwrap();
    let code = "import hashlib, demo_z; print(hashlib.sha256(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()).hexdigest())";
    let o = s.run(true, code);
    assert_ne!(
        o.status.code(),
        Some(0),
        "a placeholder was read without its server"
    );
    assert!(!stdout(&o).contains(&want));
    assert!(
        stderr(&o).contains("Input/output error") || stderr(&o).contains("Errno 5"),
        "{}",
        stderr(&o)
    );
    // The corrupt map is gone: the next run makes the image again and reads real bytes.
    let o = s.run(true, code);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), want);
    assert_lazy(&o);
}

#[test]
fn a_run_without_a_jail_ends_when_its_program_does() {
    let s = setup(100_000);
    s.snapshot();
    // A long grace period: a run that waited for a process of its own other than the
    // program's (the group's holder) would only end after it.
    let grace = Duration::from_secs(30);
    let started = Instant::now();
    let o = interp::supervisor()
        .env_remove("PYTHONPATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .args([
            "--no-jail",
            "--stats",
            "--no-prefetch",
            "--lazy",
            "--grace",
            "30",
        ])
        .args(["--realm", "r", "--bucket", &s.bucket])
        .arg("--cache-dir")
        .arg(s.cache())
        .args([
            "python3",
            "-c",
            "import demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))",
        ])
        .output()
        .unwrap();
    let took = started.elapsed();
    eprintln!("--- stderr\n{}", stderr(&o));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o).trim(), "100000");
    assert_lazy(&o);
    assert!(
        took < grace,
        "the run outlived its program by the grace period ({took:?})"
    );
}

#[test]
fn the_holder_of_a_running_group_holds_only_the_group_its_pipe_and_the_jails_init() {
    let s = setup(100_000);
    s.snapshot();
    let o = s.run(
        true,
        "import os; print(os.path.getsize('/sigma/lib/demo_z/blob.bin'))",
    );
    assert_eq!(stdout(&o).trim(), "100000");
    // A descriptor the supervisor inherits from its parent (not close-on-exec), as a build
    // tool's pipe would be: the holder must not keep it open.
    let (_keep_r, inherited) = nix::unistd::pipe().unwrap();
    let child = s
        .cmd(true, "import time; time.sleep(3)")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(inherited);
    let mut child = scopeguard(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    let holder = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let arg0 = cmdline.split(|&b| b == 0).next()?;
            let ppid = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // Ours: a child of the supervisor this test started.
            let ppid: u32 = ppid
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (arg0 == b"sigma-supervise-hold" && ppid == child.0.id()).then(|| e.path())
        });
        if let Some(p) = found {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no holder started by the lazy run"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Once it has closed what it inherited (its first step after exec).
    let fds = || {
        let mut fds: Vec<String> = std::fs::read_dir(holder.join("fd"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        fds.sort();
        fds
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds() != ["0", "1", "2"] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        fds(),
        ["0", "1", "2"],
        "the holder keeps only its pipe, the group and the jail's init"
    );
    let group = std::fs::read_link(holder.join("fd/1")).unwrap();
    assert!(group.to_string_lossy().contains("fanotify"), "{group:?}");
    let init = std::fs::read_link(holder.join("fd/2")).unwrap();
    assert!(init.to_string_lossy().contains("pidfd"), "{init:?}");
    assert!(child.0.wait().unwrap().success());
}

/// Kills the child if the test fails before waiting for it.
struct Guard(std::process::Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
fn scopeguard(c: std::process::Child) -> Guard {
    Guard(c)
}

#[test]
fn a_lazy_run_completes_a_realm_that_lacks_little_and_the_next_start_is_a_mount() {
    let s = setup(100_000);
    s.snapshot();
    // Without --no-prefetch: the run installs what the realm lacks (demo_y, never imported)
    // while the program runs (it sleeps long enough for two small packages).
    let o = interp::supervisor()
        .env_remove("PYTHONPATH")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .args(["--stats", "--lazy", "--realm", "r", "--bucket", &s.bucket])
        .arg("--cache-dir")
        .arg(s.cache())
        .args([
            "python3",
            "-c",
            "import time, demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read())); time.sleep(2)",
        ])
        .output()
        .unwrap();
    eprintln!("--- stderr\n{}", stderr(&o));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o).trim(), "100000");
    assert_lazy(&o);
    // Complete now: mounted, whatever the flag says, with the same bytes.
    let o = s.run(
        true,
        "import demo_y, demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "100000");
    let line = realm_line(&o);
    assert!(line.contains("backend kernel"), "{line}");
    // The image is no longer needed: detached and removed.
    assert!(!s.cache().join("realms/r/lazy").exists());
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = s.tmp.path().to_string_lossy().into_owned();
    assert!(
        !info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| m.starts_with(&root)),
        "a mount left under {root}:\n{info}"
    );
}

/// Without `--lazy` (`auto`): a root supervisor serves an incomplete realm lazily from its
/// second run on (the first takes the snapshot, by notification); `--lazy=never` keeps the
/// notification path.
#[test]
fn by_default_an_incomplete_realm_is_served_lazily_once_its_image_is_made() {
    let s = setup(1000);
    let code = "import demo_z; print(demo_z.NAME)";
    let o = s.run(false, code);
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(
        line.contains(
            "backend notification (lazy backend: its image is made by the realm's second run)"
        ),
        "{line}"
    );
    // The second run does not wait for the image: served by the realm's FUSE server (which
    // needs nothing made), it has the image made in a process of its own (waited for here, as
    // for fill processes).
    let o = s.run(false, code);
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(
        line.contains("backend lazy (FUSE; its image is being made for the next run"),
        "{line}"
    );
    assert!(
        s.cache()
            .join("realms/r/lazy")
            .read_dir()
            .is_ok_and(|mut d| d
                .any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "img")))),
        "no image made"
    );
    let o = s.run(false, code);
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    assert_lazy(&o);
    assert!(
        stderr(&o).contains("stats: 0 notifications"),
        "{}",
        stderr(&o)
    );
    let o = s
        .cmd(false, code)
        .env("SIGMA_SUPERVISE_LAZY", "never")
        .output()
        .unwrap();
    interp::settled(&s.cache());
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    assert!(realm_line(&o).contains("backend notification (lazy backend: off (--lazy=never))"));
}

/// Where no image can be made (here: no `mkfs.ext4` on PATH), the default serves by
/// notification without a warning (`--stats` says why), remembers why in the realm's `lazy-unavailable` and does not
/// try again for a day; `--lazy` tries at once (and says why when it fails).
#[test]
fn where_no_image_can_be_made_the_default_falls_back_quietly_and_remembers_it() {
    let s = setup(1000);
    s.snapshot();
    let code = "import demo_z; print(demo_z.NAME)";
    // PATH with the interpreter's directory alone.
    let bin = interp::python().parent().unwrap();
    assert!(!bin.join("mkfs.ext4").exists());
    // The process that makes the image (off the run's path) has the run's PATH.
    let o = s.cmd(false, code).env("PATH", bin).output().unwrap();
    interp::settled(&s.cache());
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(
        line.contains("its image is being made for the next run"),
        "{line}"
    );
    assert!(
        !stderr(&o).contains("sigma-supervise: realm r:"),
        "{}",
        stderr(&o)
    );
    let marker = s.cache().join("realms/r/lazy-unavailable");
    let why = std::fs::read_to_string(&marker).unwrap();
    assert!(why.contains("mkfs.ext4"), "{why}");
    // Remembered: mkfs.ext4 is back on PATH, and still no attempt; the realm's FUSE server
    // serves it lazily instead (as on a kernel without pre-content events), and `--stats` says
    // why there is no image.
    let o = s.run(false, code);
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    let line = realm_line(&o);
    assert!(
        line.contains("backend lazy (FUSE; no image: unavailable (")
            && line.contains("mkfs.ext4")
            && line.contains("tried again after a day, or with --lazy"),
        "{line}"
    );
    assert_eq!(interp::fuse_servers_of(&s.cache()).len(), 1);
    assert!(!s.cache().join("realms/r/lazy").read_dir().is_ok_and(
        |mut d| d.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "img")))
    ));
    // `--lazy` tries again, says why where it fails, and clears the memory when it works.
    let o = s.cmd(true, code).env("PATH", bin).output().unwrap();
    interp::settled(&s.cache());
    assert!(
        stderr(&o).contains("lazy backend unavailable") && stderr(&o).contains("mkfs.ext4"),
        "{}",
        stderr(&o)
    );
    let o = s.run(true, code);
    assert_lazy(&o);
    assert!(!marker.exists());
    let o = s.run(false, code);
    assert_lazy(&o);
}

/// A package installed in the realm (here by its first run, served by notification) is shown
/// from the realm's lib dir over its placeholders: the kernel serves the installed files, and
/// nothing of it is filled into the image; the packages not installed stay placeholders.
#[test]
fn installed_packages_are_shown_from_the_lib_dir_over_the_image() {
    let s = setup(200_000);
    let code = "import demo_z; print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))";
    let o = s.run(false, code);
    assert_eq!(stdout(&o).trim(), "200000", "{}", stderr(&o));
    assert!(realm_line(&o).contains("backend notification"));
    // Installed by that run; not demo_y, never touched.
    let mut state: Vec<String> = std::fs::read_dir(s.cache().join("realms/r/state"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".installed"))
        .collect();
    state.sort();
    assert_eq!(state, ["demo-z.installed"]);
    // The same bytes, from the lib dir: no fill, and the jail's mount table shows the bind.
    let code = r#"
import demo_z
print(len(open(demo_z.__path__[0] + '/blob.bin', 'rb').read()))
mounts = [l.split()[3:5] for l in open('/proc/self/mountinfo')]
print(sorted(m for r, m in mounts if m.startswith('/sigma/lib/demo_')))
"#;
    let o = s.run(true, code);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("200000"));
    let mounts = lines.next().unwrap();
    assert!(
        mounts.contains("'/sigma/lib/demo_z'") && !mounts.contains("'/sigma/lib/demo_y'"),
        "{mounts}"
    );
    let line = realm_line(&o);
    assert_lazy(&o);
    assert_eq!(counter(&line, "filled "), 0, "{line}");
    assert!(counter(&line, "events; ") >= 1, "{line}");
    // The package not installed is still a placeholder, filled on its first touch.
    let o = s.run(true, "import demo_y; print(demo_y.NAME)");
    assert_eq!(stdout(&o), "demo_y\n", "{}", stderr(&o));
    assert_eq!(counter(&realm_line(&o), "filled "), 1);
}

/// A realm completed while a lazy run still shows its image: starts of the complete realm are
/// mounted from its lib dir but leave the image alone until that run has ended; the next start
/// after it detaches and removes it.
#[test]
fn an_image_in_use_is_retired_only_after_its_last_run() {
    let s = setup(1000);
    s.snapshot();
    let mut keeper = s
        // It touches nothing (its fill process would outlive nothing but the run).
        .cmd(
            true,
            "import os, time; time.sleep(4); print(sorted(os.listdir('/sigma/lib')))",
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lazy_dir = s.cache().join("realms/r/lazy");
    let start = Instant::now();
    while !lazy_dir.exists() {
        assert!(start.elapsed() < Duration::from_secs(3), "no image made");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Complete the realm through notifications.
    let o = s
        .cmd(false, "import demo_y, demo_z")
        .env("SIGMA_SUPERVISE_LAZY", "never")
        .output()
        .unwrap();
    interp::settled(&s.cache());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = s.run(false, "import demo_y, demo_z; print(demo_z.NAME)");
    assert_eq!(stdout(&o), "demo_z\n", "{}", stderr(&o));
    assert!(realm_line(&o).contains("backend kernel"), "{}", stderr(&o));
    if keeper.try_wait().unwrap().is_some() {
        let out = keeper.wait_with_output().unwrap();
        panic!(
            "the lazy run ended too early for this test:\n{}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    assert!(lazy_dir.exists(), "retired under a run that shows it");
    let out = keeper.wait_with_output().unwrap();
    assert_eq!(stdout(&out), "['demo_y', 'demo_z']\n", "{}", stderr(&out));
    assert_lazy(&out);
    let o = s.run(false, "import demo_z");
    assert!(realm_line(&o).contains("backend kernel"));
    assert!(!lazy_dir.exists(), "not retired after its last run");
}

/// A real wheel's metadata through placeholders: `importlib.metadata` finds the distribution
/// by listing alone and reads only its METADATA (filled on that read, with real bytes); the
/// module itself stays a placeholder until imported.
#[test]
fn importlib_metadata_reads_real_bytes_and_only_what_it_reads() {
    let s = setup(1000);
    let six = common::wheel("six==1.16.0");
    let out = interp::supervisor()
        .args(["publish", "--bucket", &s.bucket])
        .arg(&six)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let o = s.run(false, "import os; print(sorted(os.listdir('/sigma/lib')))");
    assert!(stdout(&o).contains("'six.py'"), "{}", stdout(&o));
    s.image_made();
    let code = r#"
import importlib.metadata as md, os
d = md.distribution('six')
print(d.version, md.version('six'))
print(os.stat('/sigma/lib/six.py').st_size > 0)
"#;
    let o = s.run(false, code);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "1.16.0 1.16.0\nTrue\n");
    assert_lazy(&o);
    let line = realm_line(&o);
    assert_eq!(counter(&line, "filled "), 1, "METADATA alone: {line}");
    // The package was installed for that read (by a fill process, which outlives the run):
    // shown from the lib dir now, nothing filled.
    assert!(s.cache().join("realms/r/state/six.installed").exists());
    let o = s.run(false, "import six; print(six.__version__)");
    assert_eq!(stdout(&o), "1.16.0\n", "{}", stderr(&o));
    assert_lazy(&o);
    let line = realm_line(&o);
    assert!(counter(&line, "events; ") >= 1, "{line}");
    assert_eq!(counter(&line, "filled "), 0, "{line}");
}

/// A supervisor killed (SIGKILL) while a reader waits for a fill: the reader never gets the
/// placeholder's zeros (its jail dies with the supervisor), nothing wrong is left in the image,
/// and the next run fills the file with the right bytes.
#[test]
fn kill_9_of_the_supervisor_during_a_fill_never_gives_zeros_and_the_next_run_fills() {
    use std::io::Read as _;
    let s = setup(4 << 20);
    s.snapshot();
    // demo_z's archive becomes a FIFO nobody writes: its fill waits in the download.
    let pkgs = PathBuf::from(s.bucket.strip_prefix("file://").unwrap()).join("sigma-lib/pkgs");
    let archive = std::fs::read_dir(&pkgs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("demo-z")
        })
        .expect("demo_z's archive");
    let data = std::fs::read(&archive).unwrap();
    std::fs::remove_file(&archive).unwrap();
    nix::unistd::mkfifo(&archive, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let code =
        "d = open('/sigma/lib/demo_z/blob.bin', 'rb').read(); print('read', len(d), d.count(0))";
    let mut child = interp::supervisor()
        .env_remove("PYTHONPATH")
        .args([
            "--lazy",
            "--no-prefetch",
            "--fetch-timeout",
            "60",
            "--realm",
            "r",
        ])
        .args(["--bucket", &s.bucket])
        .arg("--cache-dir")
        .arg(s.cache())
        .args(["python3", "-c", code])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The fill opens the FIFO (our open for writing returns then) and gets half the archive:
    // the blob, last in it, is still missing.
    let pid = child.id();
    // Held open (no end of file) until the supervisor is gone.
    let (rx, done_tx) = interp::half_fed_fifo(&archive, &data);
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the fill never read the archive");
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The reader's stdout ends (every holder of it, the reader first, is gone) without a byte
    // read: it got neither zeros nor anything else.
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let printed = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the reader outlived its supervisor");
    assert!(!printed.contains("read"), "the reader got bytes: {printed}");
    child.wait().unwrap();
    // The download (in a fill process, which outlives the supervisor) gets the end of a
    // truncated archive: its install fails.
    let _ = done_tx.send(());
    interp::settled(&s.cache());
    // The real archive again.
    std::fs::remove_file(&archive).unwrap();
    std::fs::write(&archive, &data).unwrap();
    let want = s.sha256_of(&s.pkg.join("blob.bin"));
    let o = s.run(
        true,
        "import hashlib; print(hashlib.sha256(open('/sigma/lib/demo_z/blob.bin','rb').read()).hexdigest())",
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), want);
    assert_lazy(&o);
}
