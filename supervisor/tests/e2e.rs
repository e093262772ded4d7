//! End to end: the real `sigma-supervise` binary running real CPython (and the hostile/TOCTOU
//! helper binaries) under the real seccomp filter. Needs root (mount namespace) and python3.
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HOSTILE: &str = env!("CARGO_BIN_EXE_sigma-hostile-probe");
const TOCTOU: &str = env!("CARGO_BIN_EXE_sigma-toctou-probe");

mod interp;
use interp::{run, stderr, stdout};

fn sup() -> Command {
    interp::supervisor()
}

fn py(code: &str) -> Output {
    run(sup().args(["python3", "-c", code]))
}

#[test]
fn hello() {
    let o = py("print('hello')");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "hello\n");
}

#[test]
fn the_curated_etc_shows_small_files_as_copies_and_directories_as_binds() {
    // Its small files are copied into the jail's read-only root (no mount each), with the
    // host's bytes; its directories are bound.
    let o = py(r#"
import os
root = os.stat("/").st_dev
print(open("/etc/hosts", "rb").read().hex())
print(os.stat("/etc/hosts").st_dev == root, os.stat("/etc/ssl/certs").st_dev == root)
try:
    open("/etc/hosts", "a").write("x")
    print("written")
except OSError as e:
    print("refused", e.errno)
"#);
    assert!(o.status.success(), "{}", stderr(&o));
    let host = std::fs::read("/etc/hosts").unwrap();
    let hex: String = host.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        stdout(&o),
        format!("{hex}\nTrue False\nrefused {}\n", libc::EROFS)
    );
    assert_eq!(std::fs::read("/etc/hosts").unwrap(), host);
}

#[test]
fn stdlib_imports() {
    let o = py(r#"
import json, decimal, sqlite3, asyncio, collections, re, pathlib, hashlib, datetime, email, http.client
db = sqlite3.connect(":memory:")
db.execute("create table t(x)"); db.execute("insert into t values (41)")
async def f(): return db.execute("select x + 1 from t").fetchone()[0]
q = asyncio.get_event_loop_policy() and db.execute("select x + 1 from t").fetchone()[0]
print(json.dumps({"d": str(decimal.Decimal("1.10") * 2), "q": q, "h": hashlib.sha256(b"").hexdigest()[:8]}))
"#);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "{\"d\": \"2.20\", \"q\": 42, \"h\": \"e3b0c442\"}\n"
    );
    // An asyncio event loop needs socketpair(2) (its self-pipe), outside σOS's allow-list: the
    // loop itself runs under the permissive profile (still supervised, still notified).
    let o = run(sup().args([
        "--profile",
        "permissive",
        "python3",
        "-c",
        "import asyncio\nasync def f(): await asyncio.sleep(0); return 42\nprint(asyncio.run(f()))",
    ]));
    assert_eq!(stdout(&o), "42\n");
}

#[test]
fn script_imports_module_from_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("helper.py"), "VALUE = 'from helper'\n").unwrap();
    std::fs::write(
        dir.path().join("script.py"),
        "import helper\nprint(helper.VALUE)\n",
    )
    .unwrap();
    let o = run(sup()
        .arg("python3")
        .arg(dir.path().join("script.py"))
        .current_dir("/"));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "from helper\n");
    // Relative to the cwd, as a user would type it.
    let o = run(sup().args(["python3", "script.py"]).current_dir(dir.path()));
    assert_eq!(stdout(&o), "from helper\n");
}

/// A root supervisor runs the proc as an unprivileged host id, and its working directory is
/// an idmapped bind (made by the supervisor while init clones the other sources): root's files
/// there show as the proc's own, and the proc's new files are root's on disk.
#[test]
fn a_root_supervisors_working_directory_shows_roots_files_as_the_procs_own() {
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: idmapped binds are made by a root supervisor only");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rootfile"), "root's\n").unwrap();
    let o = run(sup()
        .args([
            "sh",
            "-c",
            "stat -c '%u %g' rootfile; id -u; id -g; echo new > made; cat rootfile",
        ])
        .current_dir(dir.path()));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[0], format!("{} {}", lines[1], lines[2]));
    assert_ne!(lines[1], "0", "the proc runs as an unprivileged id");
    assert_eq!(lines[3], "root's");
    let made = std::fs::metadata(dir.path().join("made")).unwrap();
    assert_eq!((made.uid(), made.gid()), (0, 0));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("made")).unwrap(),
        "new\n"
    );
}

/// A user whose cache root cannot be made (no writable home: `nobody`'s is /nonexistent)
/// still runs programs: only the σOS scratch calls would fail.
#[test]
fn a_cache_root_that_cannot_be_made_does_not_keep_a_program_from_running() {
    let o = run(sup()
        .env("HOME", "/dev/null")
        .env_remove("XDG_CACHE_HOME")
        .args(["python3", "-c", "print('ran')"]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "ran\n");
    assert!(!std::path::Path::new("/dev/null/.cache").exists());
}

#[test]
fn threads() {
    let o = py(r#"
import threading, json
out = []
def work(i):
    import decimal  # imports from threads are notified too
    out.append(i * i)
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sorted(out))
"#);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "[0, 1, 4, 9, 16, 25, 36, 49]\n");
}

#[test]
fn subprocess_of_another_python_and_its_exit_code() {
    let o = py(r#"
import subprocess, sys
p = subprocess.run([sys.executable, "-c", "import json; print(json.dumps([1, 2])); raise SystemExit(7)"],
                   capture_output=True, text=True)
print(p.returncode, p.stdout.strip())
sys.exit(p.returncode)
"#);
    assert_eq!(stdout(&o), "7 [1, 2]\n");
    assert_eq!(o.status.code(), Some(7));
}

#[test]
fn exit_status_passes_through() {
    let o = py("raise SystemExit(3)");
    assert_eq!(o.status.code(), Some(3));
}

#[test]
fn a_program_killed_by_a_signal_takes_the_supervisor_with_it_by_that_signal() {
    // As bare: the shell that waits for the run sees the signal, not an exit status of 128+N
    // (bash ends a loop on a ^C only when its command died of SIGINT).
    let killed = |o: &Output, sig: i32, what: &str| {
        assert_eq!(
            o.status.signal(),
            Some(sig),
            "{what}: {:?} {}",
            o.status,
            stderr(o)
        );
        assert!(
            !o.status.core_dumped(),
            "{what}: the supervisor dumped core"
        );
    };
    // os.kill needs kill(2), outside σOS's allow-list: run it under the permissive profile.
    let o = run(sup().args([
        "--profile",
        "permissive",
        "python3",
        "-c",
        "import os; os.kill(os.getpid(), 9)",
    ]));
    killed(&o, 9, "permissive");
    // Under sigmaos, raise(3) uses tgkill and os.kill kill(2): both reach the proc itself.
    let o = py("import signal; signal.raise_signal(signal.SIGKILL)");
    killed(&o, 9, "raise_signal");
    let o = py("import os; os.kill(os.getpid(), 9)");
    killed(&o, 9, "os.kill");
    // An uncaught KeyboardInterrupt: CPython ends itself by SIGINT.
    let o = py("raise KeyboardInterrupt");
    killed(&o, libc::SIGINT, "KeyboardInterrupt");
    // A signal that would dump the program's core ends the supervisor without a core of its own.
    let o = py("import os, resource\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\nos.abort()");
    killed(&o, libc::SIGABRT, "abort");
    let o = run(sup().args([
        "--no-jail",
        "python3",
        "-c",
        "import os; os.kill(os.getpid(), 15)",
    ]));
    killed(&o, libc::SIGTERM, "--no-jail");
    // An exit status of 128+N stays an exit status.
    let o = py("import sys; sys.exit(130)");
    assert_eq!((o.status.code(), o.status.signal()), (Some(130), None));
    // A process outside the proc's tree (the supervisor itself) is out of reach.
    let o =
        py("import os\ntry:\n os.kill(os.getppid(), 9)\nexcept PermissionError: print('EPERM')");
    assert_eq!(stdout(&o), "EPERM\n");
    assert_eq!(o.status.code(), Some(0), "the supervisor survived");
}

#[test]
fn hostile_syscalls_fail_with_eperm() {
    // Outside the supervisor (we are root) some of these succeed: the probe must tell.
    let bare = Command::new(HOSTILE).output().unwrap();
    assert_ne!(
        bare.status.code(),
        Some(0),
        "the probe detects unconfined runs"
    );
    // Refused in the kernel: nothing is notified, nothing logged.
    let o = run(sup().arg(HOSTILE));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(!stderr(&o).contains("denied"), "{}", stderr(&o));
    // --audit: the same refusals, notified and logged once per name.
    let o = run(sup().args(["--audit", HOSTILE]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for name in [
        "socket",
        "ptrace",
        "mount",
        "unshare",
        "io_uring_setup",
        "bpf",
        "kexec_load",
    ] {
        assert!(out.contains(&format!("{name} EPERM\n")), "{name}: {out}");
        let logged = format!("denied {name} (pid ");
        // The jail's guard refuses io_uring itself, ahead of the profile's notification.
        let times = if name == "io_uring_setup" { 0 } else { 1 };
        assert_eq!(stderr(&o).matches(&logged).count(), times, "{name} logged");
    }
}

#[test]
fn denied_syscall_logged_once_per_name() {
    let o = run(sup().args([
        "--audit",
        "python3",
        "-c",
        "import socket\nfor _ in range(5):\n try: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n except OSError: pass\nprint('ok')",
    ]));
    assert_eq!(stdout(&o), "ok\n");
    assert_eq!(stderr(&o).matches("denied socket (pid ").count(), 1);
}

#[test]
fn serve_prefix_is_importable_and_host_dir_hidden() {
    let lib = tempfile::tempdir().unwrap();
    let pkg = lib.path().join("servedpkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::write(pkg.join("__init__.py"), "from .inner import VALUE\n").unwrap();
    std::fs::write(pkg.join("inner.py"), "VALUE = 'served ok'\n").unwrap();
    std::fs::write(pkg.join("tool.sh"), "#!/bin/sh\necho no\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("outside.txt"), "OUTSIDE").unwrap();
    std::os::unix::fs::symlink(outside.path().join("outside.txt"), pkg.join("abs_escape")).unwrap();
    let rel = pathdiff(&outside.path().join("outside.txt"), &pkg);
    std::os::unix::fs::symlink(&rel, pkg.join("rel_escape")).unwrap();
    std::os::unix::fs::symlink("inner.py", pkg.join("alias.py")).unwrap();
    let host = lib.path().display().to_string();
    let code = format!(
        r#"
import os, sys, errno, subprocess
sys.path.insert(0, "/sigma/lib")
import servedpkg
print("import", servedpkg.VALUE, servedpkg.__file__)
print("listdir", sorted(os.listdir("/sigma/lib/servedpkg")))
print("readlink", os.readlink("/sigma/lib/servedpkg/alias.py"))
print("alias", open("/sigma/lib/servedpkg/alias.py").read().strip())
print("access", os.access("/sigma/lib/servedpkg/inner.py", os.R_OK), os.access("/sigma/lib/servedpkg/inner.py", os.W_OK))
print("size", os.stat("/sigma/lib/servedpkg/inner.py").st_size, os.lstat("/sigma/lib/servedpkg/alias.py").st_size)
def err(f):
    try:
        f(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("host", err(lambda: open("{host}/servedpkg/inner.py")), err(lambda: os.listdir("{host}")))
print("write", err(lambda: open("/sigma/lib/servedpkg/new.py", "w")))
d = os.open("/sigma/lib/servedpkg", os.O_RDONLY | os.O_DIRECTORY)
print("mkdir", err(lambda: os.mkdir("/sigma/lib/servedpkg/d", dir_fd=d)), err(lambda: os.mkdir("servedpkg", dir_fd=os.open("/sigma/lib", os.O_RDONLY))))
print("via fd", err(lambda: os.open("x.py", os.O_WRONLY | os.O_CREAT, dir_fd=d)), err(lambda: os.open("inner.py", os.O_WRONLY, dir_fd=d)), os.read(os.open("inner.py", os.O_RDONLY, dir_fd=d), 5))
print("escape", err(lambda: open("/sigma/lib/servedpkg/abs_escape").read()), err(lambda: open("/sigma/lib/servedpkg/rel_escape").read()))
print("exec", err(lambda: subprocess.run(["/sigma/lib/servedpkg/tool.sh"])))
"#
    );
    let serve = format!("/sigma/lib={host}");
    let o = run(sup().args(["--serve", &serve, "python3", "-c", &code]));
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "import served ok /sigma/lib/servedpkg/__init__.py",
            "listdir ['__init__.py', 'abs_escape', 'alias.py', 'inner.py', 'rel_escape', 'tool.sh']",
            "readlink inner.py",
            "alias VALUE = 'served ok'",
            "access True False",
            &format!("size {} {}", "VALUE = 'served ok'\n".len(), "inner.py".len()),
            "host ENOENT ENOENT",
            "write EROFS",
            "mkdir EROFS EEXIST",
            "via fd EROFS EROFS b'VALUE'",
            "escape ENOENT ENOENT",
            "exec EACCES",
        ]
    );
}

#[test]
fn paths_relative_to_the_cwd_follow_every_change_of_cwd() {
    // The supervisor resolves paths relative to the start cwd without /proc until some target
    // changes a cwd (chdir, fchdir, in any process): each step below would be decided on the
    // wrong path if it kept doing so.
    // Under /var/tmp the jail shows the cwd (a bind) on its read-only root; the second run
    // below starts under /tmp, the jail's own tmpfs (a mount on the root): both names are
    // fixed, so the start cwd is resolved without /proc in both.
    let s = shadowed();
    std::fs::write(s.work.path().join("inner.py"), "LOCAL\n").unwrap();
    let trace = &s.trace;
    let w = s.work.path().display().to_string();
    let code = format!(
        r#"
import os, subprocess
{PY_RD}print("start", rd("inner.py"), rd("sigma/lib/servedpkg/inner.py"))
subprocess.run(["python3", "-c", "import os; os.chdir('/'); print('child', open('sigma/lib/servedpkg/inner.py').read().strip())"], check=True)
print("parent", rd("inner.py"))
os.chdir("/")
print("root", rd("sigma/lib/servedpkg/inner.py"))
os.chdir("{w}")
print("back", rd("inner.py"))
os.fchdir(os.open("/sigma/lib/servedpkg", os.O_RDONLY | os.O_DIRECTORY))
print("fchdir", rd("inner.py"))
"#
    );
    let o = s.run(&code);
    assert_eq!(
        stdout(&o),
        "start LOCAL SHADOW\nchild SERVED\nparent LOCAL\nroot SERVED\nback LOCAL\nfchdir SERVED\n"
    );
    // And each was decided on the path the kernel would open.
    let opens = traced_opens(trace, |p| p.ends_with("/inner.py"));
    let local = format!("{w}/inner.py");
    let served = "/sigma/lib/servedpkg/inner.py".to_owned();
    let want = [
        (local.clone(), "continue"),
        (format!("{w}/sigma/lib/servedpkg/inner.py"), "continue"),
        (served.clone(), "serve"),
        (local.clone(), "continue"),
        (served, "serve"),
        (local, "continue"),
    ];
    assert_eq!(opens.len(), want.len() + 1, "{opens:?}");
    for (got, (path, d)) in opens.iter().zip(&want) {
        assert_eq!(
            (got.0.as_str(), got.1.as_str()),
            (path.as_str(), *d),
            "{opens:?}"
        );
    }
    // Relative to the served directory it changed into (its path is the served clone's).
    assert_eq!(opens[want.len()].1, "serve", "{opens:?}");

    // fchdir as the first change of cwd.
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("inner.py"), "LOCAL\n").unwrap();
    let code = "import os; print(open('inner.py').read().strip()); \
                os.fchdir(os.open('/sigma/lib/servedpkg', os.O_RDONLY | os.O_DIRECTORY)); \
                print(open('inner.py').read().strip())";
    let serve = format!("/sigma/lib={}", s.lib.path().display());
    let o = run(sup()
        .current_dir(work.path())
        .arg(format!("--trace={}", trace.display()))
        .args(["--serve", &serve, "python3", "-c", code]));
    assert_eq!(stdout(&o), "LOCAL\nSERVED\n", "{}", stderr(&o));
    assert_eq!(s.decisions(), ["continue", "serve"]);
}

/// A served dir (`servedpkg/inner.py`: SERVED) and a work dir on the jail's read-only root
/// whose `sigma/lib/servedpkg/inner.py` (SHADOW) is the same relative path from it as the
/// served file is from `/`: a path relative to a cwd or dirfd decided on the wrong directory
/// reads the other one.
struct Shadowed {
    lib: tempfile::TempDir,
    work: tempfile::TempDir,
    trace: PathBuf,
}

fn shadowed() -> Shadowed {
    let lib = tempfile::tempdir().unwrap();
    let pkg = lib.path().join("servedpkg");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::write(pkg.join("inner.py"), "SERVED\n").unwrap();
    let work = tempfile::tempdir_in("/var/tmp").unwrap();
    let shadow = work.path().join("sigma/lib/servedpkg");
    std::fs::create_dir_all(&shadow).unwrap();
    std::fs::write(shadow.join("inner.py"), "SHADOW\n").unwrap();
    let trace = lib.path().join("trace.txt");
    Shadowed { lib, work, trace }
}

impl Shadowed {
    /// `python3 -c code` from the work dir, traced, with the served dir at /sigma/lib.
    fn run(&self, code: &str) -> Output {
        let serve = format!("/sigma/lib={}", self.lib.path().display());
        let o = run(sup()
            .current_dir(self.work.path())
            .arg(format!("--trace={}", self.trace.display()))
            .args(["--serve", &serve, "python3", "-c", code]));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        o
    }

    /// The decisions on every open of an `inner.py`, in order.
    fn decisions(&self) -> Vec<String> {
        traced_opens(&self.trace, |p| p.ends_with("/inner.py"))
            .into_iter()
            .map(|(_, d)| d)
            .collect()
    }
}

/// A Python helper for the programs below: `rd(path)` is the file's stripped text, or the
/// name of the error opening it raised.
const PY_RD: &str = "def rd(p):\n    try:\n        return open(p).read().strip()\n    except OSError as e:\n        return type(e).__name__\n";

/// `rounds` pairs, `even`'s in even rounds and `odd`'s in odd ones.
fn alternating<'a>(rounds: usize, even: &'a str, odd: &'a str) -> Vec<&'a str> {
    (0..rounds)
        .flat_map(|i| [if i % 2 == 0 { even } else { odd }; 2])
        .collect()
}

#[test]
fn a_cwd_remembered_after_a_change_follows_every_thread_that_shares_it() {
    // Once every change of cwd has taken effect, a cwd whose name cannot change (here `/` and
    // a bind on the read-only root) is resolved without /proc until the next change. One
    // thread changes the cwd back and forth; the other, sharing it, opens the same relative
    // path after each change, twice: every open must be decided on the cwd the kernel uses,
    // whether or not the changing thread has made a call since (which is when its change is
    // known to have taken effect).
    let s = shadowed();
    let code = format!(
        r#"
import os, threading
{PY_RD}out = []
go, done = threading.Event(), threading.Event()
def other():
    for i in range(8):
        go.wait(); go.clear()
        out.append(rd("sigma/lib/servedpkg/inner.py"))
        out.append(rd("sigma/lib/servedpkg/inner.py"))
        done.set()
t = threading.Thread(target=other)
t.start()
for i in range(8):
    os.chdir("/" if i % 2 == 0 else "{}")
    if i % 4 >= 2:
        os.stat("/")
    go.set(); done.wait(); done.clear()
t.join()
print(" ".join(out))
print(rd("sigma/lib/servedpkg/inner.py"))
"#,
        s.work.path().display()
    );
    let o = s.run(&code);
    let want = alternating(8, "SERVED", "SHADOW").join(" ");
    assert_eq!(stdout(&o), format!("{want}\nSHADOW\n"));
    let mut want = alternating(8, "serve", "continue");
    want.push("continue");
    assert_eq!(s.decisions(), want);
}

#[test]
fn a_dirfd_number_reused_for_another_directory_is_named_again() {
    // A directory passed as a dirfd is named once (by its mount and inode) when its name
    // cannot change; its fd number can be closed and reused for another directory without a
    // notification, and every path relative to it must be decided on the directory it names
    // at that call.
    let s = shadowed();
    let code = format!(
        r#"
import os
N = 100
out = []
for i in range(6):
    d = os.open("/" if i % 2 == 0 else "{}", os.O_RDONLY | os.O_DIRECTORY)
    os.dup2(d, N)
    os.close(d)
    for _ in range(2):
        fd = os.open("sigma/lib/servedpkg/inner.py", os.O_RDONLY, dir_fd=N)
        out.append(os.read(fd, 100).decode().strip())
        os.close(fd)
    os.close(N)
print(" ".join(out))
"#,
        s.work.path().display()
    );
    let o = s.run(&code);
    let want = alternating(6, "SERVED", "SHADOW").join(" ");
    assert_eq!(stdout(&o), format!("{want}\n"));
    assert_eq!(s.decisions(), alternating(6, "serve", "continue"));
}

/// The same start-cwd resolution for a supervisor started by an unprivileged user (nobody):
/// relative paths are decided on the start cwd, then on the served directory after fchdir.
#[test]
fn paths_relative_to_the_start_cwd_as_an_unprivileged_user() {
    use std::os::unix::fs::PermissionsExt as _;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to start the supervisor as nobody");
        return;
    }
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    let nogroup = Some(nix::unistd::Gid::from_raw(65534));
    // Everything nobody needs, in directories it can reach: the binary, a served dir, a cwd.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = shared.path().join("sigma-supervise");
    std::fs::copy(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).unwrap();
    let pkg = shared.path().join("lib/servedpkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::set_permissions(
        pkg.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(pkg.join("inner.py"), "SERVED\n").unwrap();
    let work = shared.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("inner.py"), "LOCAL\n").unwrap();
    for p in [&work, &work.join("inner.py")] {
        nix::unistd::chown(p.as_path(), nobody, nogroup).unwrap();
    }
    let trace = work.join("trace.txt");
    let code = "import os; print(open('inner.py').read().strip()); \
                os.fchdir(os.open('/sigma/lib/servedpkg', os.O_RDONLY | os.O_DIRECTORY)); \
                print(open('inner.py').read().strip())";
    let o = run(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ])
        .arg(&bin)
        .current_dir(&work)
        .env("HOME", interp::home_in(&work))
        .env_remove("XDG_CACHE_HOME")
        .env_remove("RUST_LOG")
        .arg(format!("--trace={}", trace.display()))
        .args([
            "--serve",
            &format!("/sigma/lib={}", pkg.parent().unwrap().display()),
        ])
        .args(["/usr/bin/python3", "-I", "-c", code]));
    assert_eq!(stdout(&o), "LOCAL\nSERVED\n", "{}", stderr(&o));
    let opens = traced_opens(&trace, |p| p.ends_with("/inner.py"));
    let local = format!("{}/inner.py", work.display());
    assert_eq!(opens.len(), 2, "{opens:?}");
    assert_eq!(opens[0], (local, "continue".to_owned()), "{opens:?}");
    assert_eq!(opens[1].1, "serve", "{opens:?}");
}

#[test]
fn a_cwd_whose_name_can_change_is_read_from_proc() {
    // The cwd (a bind, a mount root) lies in a directory of the jail's writable /tmp: the proc
    // renames that directory, and the cwd's name changes with no change of cwd. Paths relative
    // to it must be decided on the new name.
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("a/b");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("x"), "X\n").unwrap();
    let served = tempfile::tempdir().unwrap();
    let trace = served.path().join("trace.txt");
    let t = tmp.path().display().to_string();
    let code = format!(
        "import os; print(open('x').read().strip()); os.rename('{t}/a', '{t}/c'); \
         print(os.getcwd(), open('x').read().strip())"
    );
    let o = run(sup()
        .current_dir(&cwd)
        .arg(format!("--trace={}", trace.display()))
        .args([
            "--serve",
            &format!("/sigma/lib={}", served.path().display()),
        ])
        .args(["python3", "-c", &code]));
    assert_eq!(stdout(&o), format!("X\n{t}/c/b X\n"), "{}", stderr(&o));
    let opens: Vec<String> = traced_opens(&trace, |p| p.starts_with(&t))
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        opens,
        [format!("{t}/a/b/x"), format!("{t}/c/b/x")],
        "{opens:?}"
    );
}

/// The `openat` lines of a `--trace` file whose path `pick` chooses: (path, decision), in order.
fn traced_opens(trace: &Path, pick: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    std::fs::read_to_string(trace)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|f| f[1] == "openat" && pick(f[2]))
        .map(|f| (f[2].to_owned(), f[3].to_owned()))
        .collect()
}

/// `to` relative to directory `from` (both absolute), for a symlink climbing out with `..`.
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let depth = from.components().count() - 1;
    let mut p = PathBuf::new();
    for _ in 0..depth {
        p.push("..");
    }
    p.join(to.strip_prefix("/").unwrap())
}

/// The sigmaos builtin plus one deny rule, as a user-written profile file.
fn deny_profile(dir: &Path, denied: &Path) -> PathBuf {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/profiles/sigmaos.toml"
    ))
    .unwrap();
    let text = format!(
        "{base}\n[[path]]\nprefix = \"{}\"\naction = \"deny\"\nerrno = \"EACCES\"\nreason = \"test: a secret\"\n",
        denied.display()
    );
    let p = dir.join("deny.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn deny_rule_refuses_with_its_errno() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "SECRET").unwrap();
    let profile = deny_profile(dir.path(), &secret);
    let code = format!(
        "import os\ntry: open('{0}').read(); print('read')\nexcept PermissionError: print('EACCES')\nprint(os.path.exists('{0}'))",
        secret.display()
    );
    let o = run(sup()
        .arg("--profile")
        .arg(&profile)
        .args(["python3", "-c", &code]));
    assert_eq!(stdout(&o), "EACCES\nFalse\n");
}

#[test]
fn toctou_path_flip_never_reads_denied_file() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    let public = dir.path().join("public.txt");
    std::fs::write(&secret, "SECRET-CONTENT").unwrap();
    std::fs::write(&public, "public").unwrap();
    let profile = deny_profile(dir.path(), &secret);
    let o = run(sup()
        .arg("--profile")
        .arg(&profile)
        .arg(TOCTOU)
        .arg(&public)
        .arg(&secret)
        .arg("SECRET")
        .arg("10000"));
    let out = stdout(&o);
    let field = |k: &str| -> u64 {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {out:?}"))
    };
    assert_eq!(field("leaked"), 0, "denied content obtained: {out}");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(field("opens") + field("denied"), 10000);
    assert!(
        field("opens") > 0 && field("denied") > 0,
        "the race ran both ways: {out}"
    );
}

#[test]
fn unknown_program_is_127_with_one_line() {
    let o = run(sup().arg("no-such-program-xyz"));
    assert_eq!(o.status.code(), Some(127));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no-such-program-xyz"), "{err}");
    // `--trace FILE` makes FILE the program: the one line says how to name the file.
    let o = run(sup().args(["--trace", "/no/such/trace.tsv", "true"]));
    assert_eq!(o.status.code(), Some(127));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--trace=FILE"), "{err}");
}

#[test]
fn malformed_profile_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(
        &p,
        "name = \"bad\"\n[default]\nactoin = \"allow\"\nreason = \"typo\"\n",
    )
    .unwrap();
    let o = run(sup()
        .arg("--profile")
        .arg(&p)
        .args(["python3", "-c", "print(1)"]));
    assert_ne!(o.status.code(), Some(0));
    assert!(stdout(&o).is_empty(), "the program must not run");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("bad.toml:"), "{err}");
    // A profile that is neither a builtin nor a file.
    let o = run(sup().args(["--profile", "/no/such/profile.toml", "python3", "-c", "1"]));
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(stderr(&o).lines().count(), 1);
    // A --serve whose DIR does not exist.
    let o = run(sup().args(["--serve", "/x=/no/such/dir", "python3", "-c", "1"]));
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}

#[test]
fn trace_lines_have_pid_syscall_path_decision_micros() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trace.txt");
    let o = run(sup().arg(format!("--trace={}", file.display())).args([
        "--audit",
        "python3",
        "-c",
        "import json, socket\ntry: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\nexcept OSError: pass",
    ]));
    assert_eq!(o.status.code(), Some(0));
    let text = std::fs::read_to_string(&file).unwrap();
    let mut saw_json = false;
    let mut saw_refused = false;
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "{line:?}");
        f[0].parse::<u32>().expect("pid");
        f[4].parse::<u64>().expect("µs");
        if f[1] == "openat" && f[2].contains("/json/__pycache__/__init__.") {
            assert_eq!(f[3], "continue");
            saw_json = true;
        }
        if f[1] == "socket" {
            assert_eq!((f[2], f[3]), ("-", "refused(EPERM)"));
            saw_refused = true;
        }
    }
    assert!(saw_json && saw_refused, "{text}");
    // Without FILE the lines go to stderr.
    let o = run(sup().args(["--trace", "python3", "-c", "pass"]));
    assert!(stderr(&o)
        .lines()
        .any(|l| l.split('\t').nth(1) == Some("execve")));
}

#[test]
fn stats_counts_add_up() {
    let o = run(sup().args(["--stats", "--always-notify", "python3", "-c", "import json"]));
    assert_eq!(o.status.code(), Some(0));
    let err = stderr(&o);
    let header = err
        .lines()
        .find(|l| l.starts_with("sigma-supervise stats: "))
        .expect("stats header");
    let total: u64 = header.split_whitespace().nth(2).unwrap().parse().unwrap();
    let mut sum = 0;
    let mut stat_continue = 0;
    for l in err.lines().filter(|l| l.starts_with("  ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 3, "{l}");
        let n: u64 = f[2].parse().unwrap();
        sum += n;
        if f[0] == "newfstatat" && f[1] == "continue" {
            stat_continue = n;
        }
    }
    assert_eq!(sum, total);
    assert!(stat_continue > 100, "import json probes many paths: {err}");
}

#[test]
fn sigterm_is_forwarded_to_the_child() {
    let mut child = sup()
        .args([
            "python3",
            "-c",
            "import threading\nprint('ready', flush=True)\nthreading.Event().wait(30)",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // The program dies of it, and the supervisor by it in turn.
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

#[test]
fn a_home_the_jail_does_not_show_becomes_its_private_tmp() {
    // A home that does not exist (a service account's /nonexistent) is not made on the host
    // either: not by the proc, and not for the supervisor's own cache.
    let gone = PathBuf::from(format!("/nonexistent-{}", std::process::id()));
    let home = gone.join("home");
    let o = run(sup().env("HOME", &home).env_remove("XDG_CACHE_HOME").args([
        "python3",
        "-c",
        "import os, pathlib; p = pathlib.Path.home() / '.cache' / 'x'; \
         p.parent.mkdir(parents=True); p.write_text('ok'); print(os.environ['HOME'], p.read_text())",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "/tmp ok\n");
    assert!(!gone.exists(), "{} was made on the host", gone.display());
    // A realm needs a cache root: one line says how to give one, and still nothing is made.
    let o = run(sup().env("HOME", &home).env_remove("XDG_CACHE_HOME").args([
        "--realm",
        "r",
        "--bucket",
        "file:///nonexistent-bucket",
        "/bin/true",
    ]));
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--cache-dir"), "{err}");
    assert!(!gone.exists(), "{} was made on the host", gone.display());
    // A home the jail shows (here: inside the working directory) stays as it is.
    let dir = tempfile::tempdir().unwrap();
    let home = interp::home_in(dir.path());
    let o = run(sup().current_dir(dir.path()).env("HOME", &home).args([
        "python3",
        "-c",
        "import os; print(os.environ['HOME'])",
    ]));
    assert_eq!(stdout(&o).trim(), home.display().to_string());
}

#[test]
fn a_proc_ends_when_its_program_ends_leftovers_get_sigterm_then_sigkill() {
    // The program leaves two grandchildren: one that ends on SIGTERM (and says so), one that
    // ignores it. The run must end, both must be gone, the first must have seen SIGTERM.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let tag = format!("leftover-{}", std::process::id());
    let code = format!(
        r#"
import os, signal, subprocess, sys, threading
if os.fork() == 0:
    def term(*_):
        open("{0}", "w").write("sigterm")
        os._exit(0)
    signal.signal(signal.SIGTERM, term)
    open("{0}", "w").write("started")
    while True: threading.Event().wait(1)
subprocess.Popen([sys.executable, "-c", "import signal, threading; signal.signal(signal.SIGTERM, signal.SIG_IGN); threading.Event().wait()", "{1}"])
while not os.path.exists("{0}"): pass
print("program exits")
"#,
        marker.display(),
        tag
    );
    let bind = dir.path().display().to_string();
    let o = run(sup().args(["--bind-rw", &bind, "--grace", "0.5", "python3", "-c", &code]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "program exits\n");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "sigterm");
    let left = Command::new("pgrep").args(["-f", &tag]).output().unwrap();
    assert!(
        left.stdout.is_empty(),
        "leftover: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn without_a_jail_orphans_get_sigterm_when_the_program_ends() {
    // A grandchild orphaned while the program runs stays supervised (its path calls are still
    // notified); once the program ends it gets SIGTERM, and its handler still runs.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let code = format!(
        r#"
import os, signal, sys, threading
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        def term(*a):
            open("{0}", "w").write("terminated")
            os._exit(0)
        signal.signal(signal.SIGTERM, term)
        os.close(r)
        import decimal  # still notified after its parent died
        os.write(w, b"x")
        threading.Event().wait(60)
        os._exit(1)
    os._exit(0)
os.wait()
os.close(w)
os.read(r, 1)
print("parent exits")
"#,
        marker.display()
    );
    let t0 = Instant::now();
    let o = run(sup().args(["--no-jail", "--always-notify", "python3", "-c", &code]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "parent exits\n");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "terminated");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

#[test]
fn without_a_jail_an_orphan_ignoring_sigterm_is_killed_after_the_grace_period() {
    // The program leaves a `sleep 3600` behind that ignores SIGTERM, in a new session and
    // process group of its own: it still cannot hold the proc open.
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let code = format!(
        r#"
import os, signal, subprocess
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child as ignored
p = subprocess.Popen(["sleep", "3600"], start_new_session=True)
open("{0}", "w").write(str(p.pid))
print("left", flush=True)
"#,
        pidfile.display()
    );
    let t0 = Instant::now();
    let o = run(sup().args(["--no-jail", "--grace", "1", "python3", "-c", &code]));
    let took = t0.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "left\n");
    // The supervisor returned, so the orphan was reaped: it is gone.
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None);
    assert!(
        gone == Err(nix::errno::Errno::ESRCH)
            || !std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .contains("3600"),
        "sleep 3600 survived the proc"
    );
    // Grace 1 s plus start-up: far below the sleep, and the SIGKILL waited for the grace.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn script_in_a_served_dir_runs_and_imports_its_siblings() {
    let app = tempfile::tempdir().unwrap();
    std::fs::write(
        app.path().join("main.py"),
        "import sib\nprint('script', sib.V)\n",
    )
    .unwrap();
    std::fs::write(app.path().join("sib.py"), "V = 5\n").unwrap();
    let serve = format!("/app={}", app.path().display());
    let o = run(sup().args(["--serve", &serve, "python3", "/app/main.py"]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "script 5\n");
}

#[test]
fn without_path_rules_path_calls_are_not_notified_but_denials_still_are() {
    let code = "import json, socket\ntry: socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\nexcept OSError: pass";
    let o = run(sup().args(["--stats", "--audit", "python3", "-c", code]));
    assert_eq!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(
        err.contains("sigma-supervise stats: 1 notifications"),
        "{err}"
    );
    assert!(err.contains("  socket refused 1"), "{err}");
    // Without --audit the kernel refuses it: no notification at all.
    let o = run(sup().args(["--stats", "python3", "-c", code]));
    assert_eq!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(
        err.contains("sigma-supervise stats: 0 notifications"),
        "{err}"
    );
    // A serve rule brings the path calls back to the supervisor.
    let dir = tempfile::tempdir().unwrap();
    let serve = format!("/sigma/x={}", dir.path().display());
    let o = run(sup().args(["--stats", "--serve", &serve, "python3", "-c", "import json"]));
    let err = stderr(&o);
    assert!(
        err.lines().any(|l| l.starts_with("  newfstatat continue ")),
        "{err}"
    );
}

#[test]
fn target_dying_mid_notification_is_normal() {
    // Threads hammer path calls (each one a notification) while the process exits under them:
    // some notifications die with their threads. The run must end with the child's status.
    let o = run(sup().args([
        "--always-notify",
        "python3",
        "-c",
        r#"
import os, threading
def spin():
    while True:
        os.stat("/")
        os.path.exists("/nonexistent")
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
threading.Event().wait(0.3)
os._exit(5)
"#,
    ]));
    assert_eq!(o.status.code(), Some(5));
    assert!(
        !stderr(&o).contains("answering notification"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn cloud_credentials_do_not_reach_the_target() {
    let o = run(sup()
        .env("AWS_SECRET_ACCESS_KEY", "supervisor-only")
        .env("AWS_ACCESS_KEY_ID", "supervisor-only")
        .env("SIGMA_TEST_KEEP", "kept")
        .args([
            "python3",
            "-c",
            "import os; print(sorted(k for k in os.environ if k.startswith('AWS_')), os.environ.get('SIGMA_TEST_KEEP'))",
        ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "[] kept\n");
}

#[test]
fn credential_named_variables_stay_unless_passed_by_name() {
    let code = "import os; print(sorted(k for k in os.environ if k.startswith(('GH_', 'DB_', 'OPENAI_', 'SIGMA_TEST_', 'MYSQL_', 'DATABASE_'))))";
    let with = |extra: &[&str]| {
        let mut c = sup();
        c.env("GH_TOKEN", "t")
            .env("DB_PASSWORD", "p")
            .env("OPENAI_API_KEY", "k")
            .env("MYSQL_PWD", "p")
            // A password in a URL's user part, whatever the name.
            .env("DATABASE_URL", "postgres://admin:hunter2@db/app")
            .env("SIGMA_TEST_KEEP", "kept")
            .args(extra)
            .args(["python3", "-c", code]);
        run(&mut c)
    };
    let o = with(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "['SIGMA_TEST_KEEP']\n");
    let o = with(&["--pass-env", "GH_TOKEN", "--pass-env=OPENAI_API_KEY"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "['GH_TOKEN', 'OPENAI_API_KEY', 'SIGMA_TEST_KEEP']\n"
    );
}

#[test]
fn local_sockets_follow_the_path_rules() {
    let dir = tempfile::tempdir().unwrap();
    let denied = dir.path().join("private");
    std::fs::create_dir(&denied).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(denied.join("outside.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    let profile = deny_profile(dir.path(), &denied);
    let code = format!(
        r#"
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect("{0}/outside.sock")
    print("connected")
except PermissionError:
    print("connect EACCES")
t = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    t.bind("{0}/new.sock")
    print("bound")
except PermissionError:
    print("bind EACCES")
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.bind("{1}/ok.sock")
print("bind ok")
"#,
        denied.display(),
        dir.path().display()
    );
    // The directory is shown to the jailed proc read-write; its denied part stays refused.
    let o = run(sup()
        .arg("--profile")
        .arg(&profile)
        .arg("--bind-rw")
        .arg(dir.path())
        .args(["python3", "-c", &code]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "connect EACCES\nbind EACCES\nbind ok\n");
    // The attempts had no effect: nobody knocked, nothing was created in the denied directory.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    assert!(!denied.join("new.sock").exists());
    assert!(dir.path().join("ok.sock").exists());
}

#[test]
fn each_proc_of_a_root_supervisor_has_a_host_id_of_its_own() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP: needs a root supervisor (an ordinary user's procs run as that user)");
        return;
    }
    // The outside id of the proc's uid, read while a second proc is alive.
    let code = "import time; print(open('/proc/self/uid_map').read().split()[1], flush=True); time.sleep(1)";
    let spawn = || {
        sup()
            .args(["python3", "-c", code])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let id = |c: std::process::Child| {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let (ia, ib) = (id(a), id(b));
    assert_ne!(ia, ib, "two procs at once share a host uid");
    for i in [ia, ib] {
        assert!(
            (jail::hostid::FIRST..jail::hostid::FIRST + jail::hostid::SLOTS).contains(&i),
            "{i}"
        );
    }
}

#[test]
fn a_program_that_needs_no_decision_and_never_calls_the_sigma_api_starts_no_thread() {
    // The supervisor's threads, as its child sees them (without a jail, its parent is the
    // supervisor). The embedded server's end of the target's connection is watched, not
    // served: its thread starts with the first request (the pysigma and Go suites make
    // those). Without path rules nothing here is notified: the notification thread starts
    // with a first notification (below).
    let o = run(sup().arg("--no-jail").args([
        "sh",
        "-c",
        "cat /proc/$PPID/comm /proc/$PPID/task/*/comm",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let names = stdout(&o);
    assert_eq!(names.lines().count(), 2, "{names}");
    assert!(!names.contains("spproxy"), "{names}");
    assert!(!names.contains("sigma-notify"), "{names}");
    // With --audit a refused call is notified (to be logged): the thread starts and answers.
    let code = "import os, socket\n\
                try: socket.socket()\n\
                except OSError as e: print(e.errno)\n\
                d = f'/proc/{os.getppid()}/task'\n\
                print(sorted(open(f'{d}/{t}/comm').read().strip() for t in os.listdir(d)))";
    let o = run(sup().args(["--no-jail", "--audit", "python3", "-c", code]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "1\n['sigma-notify', 'sigma-supervise']\n");
    assert_eq!(stderr(&o).matches("denied socket (pid ").count(), 1);
}

/// The host pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[test]
fn memory_and_cpu_limits_hold_the_program_itself() {
    // The program (forked by the jail's init) is in the limits' cgroup, not only init.
    let mut c = sup()
        .args(["--memory", "64M", "--cpus", "0.5", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let target = loop {
        let grandchildren: Vec<u32> = children_of(c.id())
            .into_iter()
            .flat_map(children_of)
            .collect();
        if let Some(&t) = grandchildren.iter().find(|&&t| {
            std::fs::read_to_string(format!("/proc/{t}/comm")).is_ok_and(|s| s.trim() == "sleep")
        }) {
            break Some(t);
        }
        if Instant::now() > deadline || c.try_wait().unwrap().is_some() {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(target) = target else {
        let _ = c.kill();
        let o = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            err.contains("no writable cgroup hierarchy"),
            "the program never ran: {err}"
        );
        eprintln!("SKIPPED: no writable cgroup hierarchy here: {err}");
        return;
    };
    let group = format!("sigma-supervise.{}", c.id());
    let cgroups = std::fs::read_to_string(format!("/proc/{target}/cgroup")).unwrap();
    let _ = c.kill();
    let _ = c.wait();
    for ctrl in ["memory", "cpu"] {
        assert!(
            cgroups.lines().any(|l| {
                let f: Vec<&str> = l.splitn(3, ':').collect();
                f.len() == 3
                    && (f[1].is_empty() || f[1].split(',').any(|c| c == ctrl))
                    && f[2].ends_with(&group)
            }),
            "{ctrl}: the program is not in {group}:\n{cgroups}"
        );
    }
    // Its effect: past the limit the kernel kills the program, and the run says why.
    let swap = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:").map(|v| v.trim() != "0 kB"))
        .unwrap_or(false);
    if swap {
        eprintln!("SKIPPED the OOM half: this machine swaps, so a memory limit pages out instead");
        return;
    }
    let o = run(sup().args([
        "--memory",
        "64M",
        "python3",
        "-c",
        "x = bytearray(256 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('survived')",
    ]));
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{}", stderr(&o));
    assert!(!stdout(&o).contains("survived"));
    assert!(stderr(&o).contains("ran out of memory"), "{}", stderr(&o));
}

#[test]
fn a_terminal_the_proc_inherits_has_a_name_in_the_jail() {
    // script(1) runs the supervisor on a fresh pseudo-terminal: ttyname(3) in the jail finds
    // it (the jail's devpts is its own instance, so its /dev/pts/N would not).
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no script(1) here (util-linux) to make a terminal");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_sigma-supervise");
    let o = run(Command::new("script").args([
        "-qec",
        &format!("{bin} /bin/sh -c 'tty && test -t 0 && echo on-a-terminal'"),
        "/dev/null",
    ]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("/dev/console"), "{out}");
    assert!(out.contains("on-a-terminal"), "{out}");
    // Without a terminal nothing is shown there.
    let o = run(sup()
        .args(["/bin/sh", "-c", "test -e /dev/console || echo none"])
        .stdin(Stdio::null()));
    assert_eq!(stdout(&o), "none\n");
    // Nor is the terminal of the session the supervisor runs in reachable through /dev/tty
    // when none of its stdio is that terminal (the jail's /dev has no tty then): nothing the
    // proc writes there reaches it.
    let dir = tempfile::tempdir().unwrap();
    let (typescript, out) = (dir.path().join("typescript"), dir.path().join("out"));
    let code = "import os\ntry:\n fd = os.open('/dev/tty', os.O_RDWR)\n os.write(fd, b'FROM-THE' + b'-JAIL')\n print('opened')\nexcept OSError as e: print('refused', e.errno)";
    let o = run(Command::new("script")
        .arg("-qec")
        .arg(format!(
            "{bin} python3 -c \"{code}\" </dev/null >{} 2>&1",
            out.display()
        ))
        .arg(&typescript));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("refused {}\n", libc::ENOENT)
    );
    let seen = std::fs::read_to_string(&typescript).unwrap();
    assert!(!seen.contains("FROM-THE-JAIL"), "{seen}");
}

#[test]
fn descriptors_the_supervisor_inherits_reach_the_proc_only_when_passed() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "inherited-secret\n").unwrap();
    let file = std::fs::File::open(&secret).unwrap();
    let raw = file.as_raw_fd();
    let code = "import os\ntry: print(os.read(9, 100).decode().strip())\nexcept OSError as e: print('EBADF' if e.errno == 9 else e)";
    let with_fd9 = |extra: &[&str]| {
        let mut c = sup();
        c.args(extra).args(["python3", "-c", code]);
        // SAFETY: dup2 only, between fork and exec (no allocation).
        unsafe {
            c.pre_exec(move || {
                if libc::dup2(raw, 9) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        run(&mut c)
    };
    // Left open by the supervisor's caller: not the proc's.
    let o = with_fd9(&[]);
    assert_eq!(stdout(&o), "EBADF\n", "{}", stderr(&o));
    let o = with_fd9(&["--no-jail"]);
    assert_eq!(stdout(&o), "EBADF\n", "{}", stderr(&o));
    // Asked for: inherited.
    let o = with_fd9(&["--pass-fd", "9"]);
    assert_eq!(stdout(&o), "inherited-secret\n", "{}", stderr(&o));
    drop(file);
}

#[test]
fn a_terminals_ctrl_c_reaches_a_proc_whose_stdio_is_redirected() {
    // The supervisor runs in the foreground of a pseudo-terminal with its stdio redirected:
    // the proc, in the same foreground group, gets the terminal's SIGINT (the jail shows it no
    // terminal, but does not take it out of its session).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let bin = env!("CARGO_BIN_EXE_sigma-supervise");
    let driver = r#"
import os, pty, sys, time
pid, fd = pty.fork()
if pid == 0:
    # As a terminal's job: ^C's default action (a job started in the background by a
    # non-interactive shell inherits SIGINT ignored).
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
deadline = time.time() + 20
while not os.path.exists("ready") and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.2)
os.write(fd, b"\x03")
while True:
    try:
        if not os.read(fd, 1024): break
    except OSError: break
_, st = os.waitpid(pid, 0)
print("signal" if os.WIFSIGNALED(st) else "exit", os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))
"#;
    // In the working directory, which the proc is shown read-write.
    let code = "import time\nopen('ready', 'w').close()\ntime.sleep(30)\nprint('slept')";
    let inner = format!(
        "exec {bin} python3 -c \"{code}\" </dev/null >{} 2>&1",
        out.display()
    );
    let o = run(Command::new("python3")
        .current_dir(dir.path())
        .args(["-c", driver, "/bin/sh", "-c", &inner]));
    assert_eq!(
        stdout(&o).trim(),
        format!("signal {}", libc::SIGINT),
        "{}",
        stderr(&o)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("KeyboardInterrupt") && !text.contains("slept"),
        "{text}"
    );
}

#[test]
fn a_trace_file_is_never_written_through_a_symlink() {
    // A proc can leave a symlink in its working directory; a later run traced to that name,
    // by root, would overwrite what it points at.
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("trace.tsv")).unwrap();
    let o = run(sup()
        .current_dir(dir.path())
        .args(["--trace=trace.tsv", "/bin/true"]));
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("goes through a symlink"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    // A plain file is written; /dev/stderr (a symlink in /dev) still works.
    std::fs::remove_file(dir.path().join("trace.tsv")).unwrap();
    let o = run(sup()
        .current_dir(dir.path())
        .args(["--trace=trace.tsv", "/bin/true"]));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let trace = std::fs::read_to_string(dir.path().join("trace.tsv")).unwrap();
    assert!(trace.contains("\texecve\t"), "{trace}");
    let o = run(sup().args(["--trace=/dev/stderr", "/bin/true"]));
    assert!(stderr(&o).contains("\texecve\t"), "{}", stderr(&o));
}

#[test]
fn a_failed_run_names_the_paths_of_its_command_line_the_jail_does_not_show() {
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("in.csv");
    std::fs::write(&file, "a,b\n").unwrap();
    let code = "import sys; print(open(sys.argv[1]).read().strip())";
    let o = run(sup().args(["python3", "-c", code]).arg(&file));
    assert_ne!(o.status.code(), Some(0));
    let hint = format!(
        "{} is named on the command line but not shown in the jail: --bind {0}",
        file.display()
    );
    assert!(stderr(&o).contains(&hint), "{}", stderr(&o));
    // With the bind, the run reads it and says nothing of it.
    let o = run(sup()
        .arg("--bind")
        .arg(&file)
        .args(["python3", "-c", code])
        .arg(&file));
    assert_eq!(stdout(&o), "a,b\n", "{}", stderr(&o));
    assert!(!stderr(&o).contains("not shown"), "{}", stderr(&o));
}

/// A script's interpreter is what the kernel runs: shown like the program itself (a venv's
/// console script names the venv's python, a symlink to an interpreter outside the system
/// dirs), whether the `#!` line names it or `/usr/bin/env` finds it on PATH; only its prefix.
#[test]
fn a_scripts_interpreter_outside_the_system_dirs_is_shown() {
    use std::os::unix::fs::PermissionsExt as _;
    let tools = tempfile::tempdir().unwrap();
    let bin = tools.path().join("prefix/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let interp = bin.join("own-sh");
    std::fs::copy("/bin/sh", &interp).unwrap();
    let beside = tools.path().join("beside");
    std::fs::write(&beside, "host-only").unwrap();
    let project = tempfile::tempdir().unwrap();
    let body = format!(
        "echo \"$0 ran\"; test -e {} && echo beside shown || echo beside hidden",
        beside.display()
    );
    let script = |name: &str, line: String| {
        let p = project.path().join(name);
        std::fs::write(&p, format!("{line}\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script("named", format!("#!{}", interp.display()));
    let o = run(sup().current_dir(project.path()).arg("./named"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "./named ran\nbeside hidden\n");
    script("by-env", "#!/usr/bin/env -S own-sh".into());
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let o = run(sup()
        .current_dir(project.path())
        .env("PATH", &path)
        .arg("./by-env"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o), "./by-env ran\nbeside hidden\n");
}

/// A program installed in the user's `~/.local` (`pip install --user`, pipx) runs with what an
/// install put there (`bin`, `lib`), not with the rest of `~/.local` (`share`, `state`: where
/// programs keep keyrings and histories).
#[test]
fn a_program_in_the_users_local_prefix_sees_its_install_not_the_users_data() {
    use std::os::unix::fs::PermissionsExt as _;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let local = home.join(".local");
    for d in [
        "bin",
        "lib/python3/site-packages",
        "share/keyrings",
        "state",
    ] {
        std::fs::create_dir_all(local.join(d)).unwrap();
    }
    std::fs::write(local.join("lib/python3/site-packages/mod.py"), "X = 1\n").unwrap();
    std::fs::write(local.join("share/keyrings/login.keyring"), "secret").unwrap();
    std::fs::write(local.join("state/history"), "secret").unwrap();
    let tool = local.join("bin/tool");
    let probe = |p: &str| {
        let p = local.join(p);
        format!(
            "test -e {} && echo '{p} shown' || echo '{p} hidden'",
            p.display(),
            p = p.strip_prefix(&home).unwrap().display()
        )
    };
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\n{}\n{}\n{}\n",
            probe("lib/python3/site-packages/mod.py"),
            probe("share/keyrings/login.keyring"),
            probe("state/history")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let project = tempfile::tempdir().unwrap();
    let o = run(sup()
        .current_dir(project.path())
        .env("HOME", &home)
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", local.join("bin").display()),
        )
        .arg("tool"));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        ".local/lib/python3/site-packages/mod.py shown\n\
         .local/share/keyrings/login.keyring hidden\n\
         .local/state/history hidden\n"
    );
}
