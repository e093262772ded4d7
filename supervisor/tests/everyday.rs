//! Everyday Python runs unchanged under the default profile: every program of the corpus
//! (`tests/everyday/*.py`) is run bare and under `sigma-supervise`, and must print the same
//! stdout and end with the same exit status — as root, and as an unprivileged user (as root,
//! tarfile and sqlite call chown/fchown, which would hide refusals an ordinary user meets).
//! Each run is bounded: a hang is a failure, never a stuck test.
//!
//! The corpus and its harness are in `corpus/mod.rs` (pool.rs runs it against warm procs).
//!
//! Also here: what the additions must not grant — signals outside the proc's tree, device nodes.
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod corpus;
mod interp;

use corpus::{corpus, differences, outcome, As, Outcome, HANG};

fn assert_same(user: As, sup_args: &[&str]) {
    let diffs = differences(&user, sup_args);
    assert!(
        diffs.is_empty(),
        "{} of {} programs differ under sigma-supervise {sup_args:?} (as {}):\n{}",
        diffs.len(),
        corpus().len(),
        if user.nobody { "nobody" } else { "root" },
        diffs.join("\n")
    );
}

#[test]
fn corpus_as_root_matches_bare() {
    assert_same(As::root(), &[]);
}

#[test]
fn corpus_as_root_matches_bare_with_every_path_call_decided() {
    // Without a path rule the path calls run in the kernel; --always-notify sends each one
    // through the handlers (link, symlink, utimensat, mknodat, truncate, statfs, ...).
    assert_same(As::root(), &["--always-notify"]);
}

#[test]
fn corpus_unprivileged_matches_bare() {
    assert_same(As::nobody(), &[]);
}

#[test]
fn corpus_unprivileged_matches_bare_with_every_path_call_decided() {
    assert_same(As::nobody(), &["--always-notify"]);
}

#[test]
fn corpus_matches_bare_with_read_only_writes_explained() {
    // --stats keeps the calls that write notified for the read-only hint, --trace every path
    // call: the hint only explains, it changes no outcome.
    assert_same(As::root(), &["--stats"]);
    assert_same(As::nobody(), &["--trace=/dev/null"]);
}

#[test]
fn the_strict_profile_is_what_the_corpus_needed_additions_for() {
    // Under σOS's list to the letter most everyday programs break; this is what the
    // additions of the default profile are for. (It also shows the corpus can tell.)
    let diffs = differences(&As::root(), &["--profile", "sigmaos-strict"]);
    assert!(
        diffs.len() * 2 > corpus().len(),
        "only {} programs differ under sigmaos-strict",
        diffs.len()
    );
}

// ------------------------------------------------------------------------------------------------
// What the additions must not grant.
// ------------------------------------------------------------------------------------------------

fn supervised_python(code: &str) -> (Outcome, String) {
    let mut c = interp::supervisor();
    c.args(["python3", "-c", code]);
    outcome(c)
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z` zombie), if it exists.
fn state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

#[test]
fn signals_outside_the_proc_never_arrive() {
    // A stopped decoy outside the proc, in a process group of its own; the target tries every
    // way to signal it, its group, everything (SIGCONT: harmless to the machine if it escaped,
    // and visible on the decoy), and the supervisor.
    let mut decoy = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = decoy.id();
    let decoy_pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(decoy_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    while state(pid) != Some('T') {
        assert!(t0.elapsed() < HANG, "the decoy does not stop");
        std::thread::sleep(Duration::from_millis(10));
    }
    let code = format!(
        r#"
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print(name, "sent")
    except OSError as e:
        print(name, type(e).__name__)
def raw(nr, *args):
    if libc.syscall(nr, *args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
attempt("kill", lambda: os.kill({pid}, signal.SIGKILL))
attempt("killpg", lambda: os.killpg({pid}, signal.SIGKILL))
attempt("kill -1", lambda: os.kill(-1, signal.SIGCONT))
attempt("kill parent", lambda: os.kill(os.getppid(), signal.SIGKILL))
attempt("tgkill", lambda: raw(234, {pid}, {pid}, signal.SIGKILL))
attempt("tkill", lambda: raw(200, {pid}, signal.SIGKILL))
attempt("pidfd_send_signal", lambda: signal.pidfd_send_signal(os.pidfd_open({pid}), signal.SIGKILL))
print("target alive")
"#
    );
    // In the jail's pid namespace nothing outside exists (ESRCH); the parent is its init,
    // which takes no signal from the proc.
    let (o, err) = supervised_python(&code);
    assert_eq!(o.code, Some(0), "{o:?} {err}");
    assert_eq!(
        o.stdout,
        "kill ProcessLookupError\nkillpg ProcessLookupError\nkill -1 ProcessLookupError\n\
         kill parent PermissionError\ntgkill ProcessLookupError\ntkill ProcessLookupError\n\
         pidfd_send_signal ProcessLookupError\ntarget alive\n"
    );
    assert_eq!(state(pid), Some('T'), "the decoy was killed or continued");
    // Without a jail the supervisor confines signals to the proc's tree itself.
    let mut c = interp::supervisor();
    c.args(["--no-jail", "python3", "-c", &code]);
    let (o, err) = outcome(c);
    assert_eq!(o.code, Some(0), "{o:?} {err}");
    assert_eq!(
        o.stdout,
        "kill PermissionError\nkillpg PermissionError\nkill -1 ProcessLookupError\n\
         kill parent PermissionError\ntgkill PermissionError\ntkill PermissionError\n\
         pidfd_send_signal PermissionError\ntarget alive\n"
    );
    // The attack's effect did not happen: the decoy lives, still stopped.
    assert_eq!(state(pid), Some('T'), "the decoy was killed or continued");
    decoy.kill().unwrap();
    decoy.wait().unwrap();
}

#[test]
fn signals_within_the_proc_arrive() {
    // The target's own children, its process group, its own threads, its own pid.
    let code = r#"
import os, signal, subprocess, threading
p = subprocess.Popen(["sleep", "60"])
os.kill(p.pid, signal.SIGTERM)
print("child", p.wait(30))
p = subprocess.Popen(["sleep", "60"], process_group=0)
os.killpg(p.pid, signal.SIGKILL)
print("group", p.wait(30))
p = subprocess.Popen(["sleep", "60"])
signal.pidfd_send_signal(os.pidfd_open(p.pid), signal.SIGTERM)
print("pidfd", p.wait(30))
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(threading.get_native_id()))
ev = threading.Event()
t = threading.Thread(target=lambda: ev.wait(2))
t.start()
signal.pthread_kill(t.ident, signal.SIGUSR1)
t.join()
os.kill(os.getpid(), signal.SIGUSR1)
print("own", len(got))
"#;
    let (o, err) = supervised_python(code);
    assert_eq!(o.code, Some(0), "{o:?} {err}");
    assert_eq!(o.stdout, "child -15\ngroup -9\npidfd -15\nown 2\n");
}

#[test]
fn device_nodes_are_never_created() {
    // mknod is notified for FIFOs; a device node is refused before its path is even read,
    // though we run as root (CAP_MKNOD).
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("mem");
    let fifo = dir.path().join("fifo");
    let code = format!(
        r#"
import os, stat
try:
    os.mknod("{0}", 0o666 | stat.S_IFCHR, os.makedev(1, 1))
    print("created")
except PermissionError:
    print("refused")
os.mkfifo("{1}")
print(stat.S_ISFIFO(os.stat("{1}").st_mode))
"#,
        dev.display(),
        fifo.display()
    );
    let bind = dir.path().display().to_string();
    for extra in [&[][..], &["--always-notify"][..]] {
        let mut c = interp::supervisor();
        c.arg("--bind-rw").arg(&bind);
        c.args(extra).args(["python3", "-c", &code]);
        let (o, err) = outcome(c);
        assert_eq!(o.stdout, "refused\nTrue\n", "{extra:?} {err}");
        assert!(!dev.exists(), "a device node was created");
        std::fs::remove_file(&fifo).unwrap();
    }
}

#[test]
fn abstract_sockets_outside_the_proc_are_unreachable() {
    // A listener outside the proc on an abstract name (what host services use): without a
    // jail the target may connect only to abstract names its own processes bound.
    let name = format!("sigma-test-outside-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        r#"
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(b"\0{name}")
    print("connected")
except ConnectionRefusedError:
    print("refused")
"#
    );
    let (o, err) = supervised_python(&code);
    assert_eq!(o.stdout, "refused\n", "{err}");
    // Nobody knocked.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

// ------------------------------------------------------------------------------------------------
// What the command line names, shown as the user reaches it; the network, xattrs and the
// terminal as bare.
// ------------------------------------------------------------------------------------------------

/// A directory only `user` may enter (0700, its own, as `mktemp -d` makes), outside its working
/// directory, with a script that reads a file beside it.
fn private_dir(user: &As) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("data.txt"), "private data\n").unwrap();
    std::fs::write(
        d.path().join("h.py"),
        "import os, sys\nhere = os.path.dirname(os.path.abspath(__file__))\n\
         print(open(os.path.join(here, 'data.txt')).read().strip(), len(sys.argv))\n",
    )
    .unwrap();
    if user.nobody {
        for p in [
            d.path().to_owned(),
            d.path().join("data.txt"),
            d.path().join("h.py"),
        ] {
            let nobody = Some(nix::unistd::Uid::from_raw(65534));
            nix::unistd::chown(&p, nobody, Some(nix::unistd::Gid::from_raw(65534))).unwrap();
        }
    }
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// Bare and supervised (`sup_args` before the command) as `user`: the same stdout and status,
/// and the stdout is what `want` says.
fn same_as_bare(user: &As, sup_args: &[&std::ffi::OsStr], cmd: &[&std::ffi::OsStr], want: &str) {
    let sup = PathBuf::from(env!("CARGO_BIN_EXE_sigma-supervise"));
    let mut full: Vec<&std::ffi::OsStr> = vec![user.python.as_os_str()];
    full.extend(cmd);
    let (bare, bare_err) = outcome(user.command(&user.python, cmd));
    let mut args: Vec<&std::ffi::OsStr> = sup_args.to_vec();
    args.extend(&full);
    let (supervised, err) = outcome(user.command(&sup, &args));
    let who = if user.nobody { "nobody" } else { "root" };
    assert_eq!(bare.stdout, want, "{who} bare: {bare_err}");
    assert_eq!(supervised, bare, "{who} {args:?}: {err}");
}

fn scripts_in_private_directories_run_as_bare(user: As) {
    let d = private_dir(&user);
    let script = d.path().join("h.py");
    let want = "private data 1\n";
    // Named where it is, outside the working directory.
    same_as_bare(&user, &[], &[script.as_os_str()], want);
    // Reached through a symlinked directory.
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("link");
    std::os::unix::fs::symlink(d.path(), &link).unwrap();
    same_as_bare(&user, &[], &[link.join("h.py").as_os_str()], want);
    // Shown by --bind, read by a program that names it only inside its code.
    let code = format!(
        "print(open({:?}).read().strip())",
        d.path().join("data.txt").display()
    );
    let bind = [std::ffi::OsStr::new("--bind"), d.path().as_os_str()];
    same_as_bare(
        &user,
        &bind,
        &["-c".as_ref(), code.as_ref()],
        "private data\n",
    );
}

#[test]
fn scripts_in_private_directories_run_as_bare_as_root() {
    scripts_in_private_directories_run_as_bare(As::root());
}

#[test]
fn scripts_in_private_directories_run_as_bare_unprivileged() {
    scripts_in_private_directories_run_as_bare(As::nobody());
}

/// A TCP socket's fate: `made` (and whether it reached the host's listener), or its errno.
const TRY_TCP: &str = r#"
import socket, sys
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
except OSError as e:
    print("refused", e.errno); sys.exit()
try:
    s.settimeout(5)
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("made, reached the host")
except OSError as e:
    print("made, host unreachable", type(e).__name__)
"#;

#[test]
fn inet_sockets_stay_in_the_procs_own_network() {
    let user = As::root();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let sup = PathBuf::from(env!("CARGO_BIN_EXE_sigma-supervise"));
    let py = user.python.as_os_str();
    let run = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = extra.iter().map(|a| a.as_ref()).collect();
        args.extend([py, "-c".as_ref(), TRY_TCP.as_ref(), port.as_ref()]);
        outcome(user.command(&sup, &args))
    };
    // Its own network: the socket is made, the host's listener is not there.
    let (o, err) = run(&[]);
    assert_eq!(
        o.stdout, "made, host unreachable ConnectionRefusedError\n",
        "{err}"
    );
    // The host's network, or σOS's list to the letter: no inet socket at all.
    for extra in [&["--net", "host"][..], &["--profile", "sigmaos-strict"]] {
        let (o, err) = run(extra);
        assert_eq!(
            o.stdout,
            format!("refused {}\n", libc::EPERM),
            "{extra:?}: {err}"
        );
    }
    // Nobody knocked.
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    // Raw and packet sockets stay refused, even to a root user's proc.
    let raw = "import socket\nfor f, t, p in ((socket.AF_INET, socket.SOCK_RAW, 1), \
               (socket.AF_PACKET, socket.SOCK_DGRAM, 0)):\n    try:\n        \
               socket.socket(f, t, p); print('made')\n    except OSError as e:\n        \
               print(e.errno)\n";
    let (o, err) = supervised_python(raw);
    assert_eq!(o.stdout, format!("{0}\n{0}\n", libc::EPERM), "{err}");
}

#[test]
fn trusted_xattrs_are_refused_by_the_kernel_and_user_xattrs_land_on_the_file() {
    // As root, in a working directory of root's (idmapped): bare root could set trusted.*,
    // the proc holds no capability.
    let user = As::root();
    let file = user.home.path().join("f.txt");
    std::fs::write(&file, "x").unwrap();
    let code = "import os\nos.setxattr('f.txt', 'user.k', b'v')\ntry:\n    \
                os.setxattr('f.txt', 'trusted.k', b'v'); print('set')\nexcept OSError as e:\n    \
                print(e.errno)\n";
    let sup = PathBuf::from(env!("CARGO_BIN_EXE_sigma-supervise"));
    let args = [user.python.as_os_str(), "-c".as_ref(), code.as_ref()];
    let (o, err) = outcome(user.command(&sup, &args));
    assert_eq!(o.stdout, format!("{}\n", libc::EPERM), "{err}");
    // Seen from outside: the user attribute is there, the trusted one is not.
    let list = format!(
        "import os; print(sorted(os.listxattr({:?})))",
        file.display()
    );
    let (host, err) = outcome(user.command(&user.python, &["-c".as_ref(), list.as_ref()]));
    assert_eq!(host.stdout, "['user.k']\n", "{err}");
}

/// ^C typed at a pseudo-terminal reaches the program as it does bare: its KeyboardInterrupt
/// handler runs, and the exit status is the program's.
#[test]
fn ctrl_c_through_a_pseudo_terminal_reaches_the_program() {
    let user = As::root();
    let driver = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    # As a terminal's job: ^C's default action (a job started in the background by a
    # non-interactive shell inherits SIGINT ignored).
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
def read_until(token, limit):
    global out
    end = time.monotonic() + limit
    while token not in out and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 1024)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
read_until(b"ready", 60)
os.write(fd, b"\x03")
read_until(b"interrupted", 30)
_, status = os.waitpid(pid, 0)
print("interrupted" if b"interrupted" in out else out, os.waitstatus_to_exitcode(status))
"#;
    // "ready" inside the try: ^C may arrive as soon as it is out.
    let prog = "import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n\
                except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    sys.exit(3)\n";
    let sup = PathBuf::from(env!("CARGO_BIN_EXE_sigma-supervise"));
    let py = user.python.as_os_str();
    let bare = [py, "-c".as_ref(), prog.as_ref()];
    let (o, err) = outcome(user.command(
        &user.python,
        &[&["-c".as_ref(), driver.as_ref()][..], &bare].concat(),
    ));
    assert_eq!(o.stdout, "interrupted 3\n", "bare: {err}");
    let supervised = [sup.as_os_str(), py, "-c".as_ref(), prog.as_ref()];
    let (o, err) = outcome(user.command(
        &user.python,
        &[&["-c".as_ref(), driver.as_ref()][..], &supervised].concat(),
    ));
    assert_eq!(o.stdout, "interrupted 3\n", "supervised: {err}");
}
