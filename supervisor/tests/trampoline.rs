//! Trampoline mode end to end, without σOS: the real binary, installed as `uproc-trampoline`
//! beside its `trampoline.toml`, run with procd's argv and environment; a directory stands in
//! for binfs, and spproxyd's sockets are served by the test (the dialproxy handshake checked
//! byte for byte, the σOS API by spproxy's own server). Needs root (the jail) and python3.
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixListener;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

#[allow(dead_code)]
mod interp;
use interp::{run, stderr, stdout};

const CONFIG: &str = r#"{"pidStr":"p-1","program":"x","realmStr":"rootrealm"}"#;
const PRINCIPAL: &str = r#"{"ID":"p-1","RealmStr":"rootrealm"}"#;

/// An installed trampoline: `bin/uproc-trampoline` (a hard link to the built binary: its
/// `/proc/self/exe` is this directory) with `bin/trampoline.toml`, a stand-in for binfs, and
/// spproxyd's directory.
struct Tramp {
    dir: tempfile::TempDir,
}

impl Tramp {
    fn new(config: &str) -> Tramp {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        for d in ["bin", "binfs", "spp"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let exe = dir.path().join("bin/uproc-trampoline");
        let built = env!("CARGO_BIN_EXE_sigma-supervise");
        if std::fs::hard_link(built, &exe).is_err() {
            std::fs::copy(built, &exe).unwrap();
        }
        let t = Tramp { dir };
        let spp = t.path("spp");
        std::fs::write(
            t.path("bin/trampoline.toml"),
            format!("spproxyd_dir = {:?}\n{config}", spp.display().to_string()),
        )
        .unwrap();
        t
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// Puts a program into binfs as `NAME-v1.0`.
    fn publish(&self, name: &str, content: &[u8]) -> PathBuf {
        let p = self.path(&format!("binfs/{name}-v1.0"));
        std::fs::write(&p, content).unwrap();
        p
    }

    /// procd's exec: `uproc-trampoline PID PROG true|false ARGS…` with σOS's environment only.
    fn cmd(&self, prog: &Path, dialproxy: bool, args: &[&str]) -> Command {
        let mut c = Command::new(self.path("bin/uproc-trampoline"));
        let py = interp::python().parent().unwrap().display().to_string();
        c.env_clear()
            .env("PATH", format!("{py}:/usr/local/bin:/usr/bin:/bin"))
            .env("SIGMACONFIG", CONFIG)
            .env("SIGMAPRINCIPAL", PRINCIPAL)
            .env("SIGMADEBUGPID", "p-1")
            .env("SIGMADEBUG", "")
            .env("SIGMAPERF", "")
            .env("SIGMA_SPAWN_TIME", "1700000000000000")
            .env("SIGMA_EXEC_TIME", "1700000000000000")
            .arg("p-1")
            .arg(prog)
            .arg(if dialproxy { "true" } else { "false" })
            .args(args)
            .current_dir("/");
        c
    }

    /// spproxy's own server on `spp/spproxyd.sock`, one connection at a time.
    fn spproxyd(&self) -> spproxy::server::Server {
        let store = Arc::new(spproxy::server::LocalDirStore::new(self.path("spp")));
        let cfg = spproxy::server::ServerConfig::new("rootrealm", self.path("spp/ux"), store);
        let srv = spproxy::server::Server::new(cfg).unwrap();
        let l = UnixListener::bind(self.path("spp/spproxyd.sock")).unwrap();
        let s = srv.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                drop(s.serve_stream(c));
            }
        });
        srv
    }
}

/// A malformed input: exit status 125 and exactly one line on stderr containing `want`.
fn one_line_error(o: &Output, want: &str) {
    assert_eq!(o.status.code(), Some(125), "{o:?}");
    let e = stderr(o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains(want), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

/// A shell from binfs runs from its memfd copy (so Landlock lets the jail exec a memfd), as
/// the pid procd started would, with σOS's environment, PROG as argv[0], and no binfs in view.
#[test]
fn a_binary_runs_from_a_sealed_copy_and_binfs_is_not_shown() {
    let t = Tramp::new("");
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let other = t.publish("other", b"secret");
    let script = format!(
        r#"tr '\0' ' ' < /proc/$$/cmdline | cut -d' ' -f1; echo
readlink /proc/$$/exe
echo "config=$SIGMACONFIG"
test -e {binfs} && echo binfs-shown
test -e "$1" && echo other-shown
test -e /mnt/binfs && echo mnt-binfs-shown
grep '^CapEff' /proc/self/status
pwd
exit 7"#,
        binfs = t.path("binfs").display(),
    );
    // An argument naming a binfs file (the view would show a named file's directory).
    let o = run(&mut t.cmd(
        &sh,
        false,
        &["-c", &script, "zero", other.to_str().unwrap()],
    ));
    assert_eq!(o.status.code(), Some(7), "the program's exit status");
    let out = stdout(&o);
    assert!(
        out.starts_with(&format!("{}\n", sh.display())),
        "argv[0] is PROG: {out}"
    );
    assert!(out.contains("/memfd:sigma-proc:sh (deleted)"), "{out}");
    assert!(out.contains(&format!("config={CONFIG}")), "{out}");
    assert!(!out.contains("shown"), "binfs reached the jail: {out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.ends_with("/\n"), "starts at /: {out}");
}

/// With `cache_dir`, a binary is copied out of binfs once and every later proc of it execs
/// the cached file by descriptor (Landlock allows that file alone); the cache itself is never
/// shown, and a proc cannot change its cached binary.
#[test]
fn a_cached_binary_is_copied_once_and_run_by_descriptor() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cache = d.path().join("cache");
    let t = Tramp::new(&format!("cache_dir = {:?}\n", cache.display().to_string()));
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let script = format!(
        r#"readlink /proc/$$/exe
test -e {cache} && echo cache-shown
ls {cache}/programs 2>/dev/null && echo cache-listed
echo x 2>/dev/null >> /proc/$$/exe && echo exe-written
exit 3"#,
        cache = cache.display(),
    );
    let entries = || -> Vec<PathBuf> {
        std::fs::read_dir(cache.join("programs"))
            .map(|r| r.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut exes = Vec::new();
    for round in 0..2 {
        let o = run(&mut t.cmd(&sh, false, &["-c", &script]));
        assert_eq!(o.status.code(), Some(3), "round {round}");
        let out = stdout(&o);
        assert!(!out.contains("shown") && !out.contains("listed"), "{out}");
        assert!(!out.contains("exe-written"), "{out}");
        exes.push(out.lines().next().unwrap_or_default().to_owned());
        let e = entries();
        assert_eq!(e.len(), 1, "one entry, made by the first proc: {e:?}");
        assert_eq!(
            std::fs::read(&e[0]).unwrap(),
            std::fs::read("/bin/sh").unwrap(),
            "the cached copy is the program, unchanged"
        );
        assert_eq!(
            exes[round],
            e[0].display().to_string(),
            "run from the cache"
        );
    }
    // A program changed in binfs (σOS never does this to a version; a test may) is copied anew.
    std::fs::write(&sh, std::fs::read("/bin/dash").unwrap()).unwrap();
    let o = run(&mut t.cmd(&sh, false, &["-c", "exit 4"]));
    assert_eq!(o.status.code(), Some(4));
    assert_eq!(entries().len(), 2);
}

#[test]
fn death_by_a_signal_propagates() {
    let t = Tramp::new("");
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let o = run(&mut t.cmd(&sh, false, &["-c", "kill -TERM $$; sleep 5"]));
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{o:?}");
}

/// A `#!` script that is not Python runs under the interpreter its line names, from
/// /sigma/bin/NAME, read-only.
#[test]
fn a_shell_script_runs_under_its_interpreter() {
    let t = Tramp::new("");
    let s = t.publish(
        "greet",
        b"#!/bin/sh -e\necho \"hi from $0 $*\"\necho x >> $0 || echo read-only\n",
    );
    let o = run(&mut t.cmd(&s, false, &["a b", "c"]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "hi from /sigma/bin/greet a b c\nread-only\n");
}

/// Python client code speaking spproxy's wire protocol over SIGMA_SPPROXY_FD, as pysigma
/// does, without needing pysigma installed.
const PY_SPPROXY: &str = r#"
import os, struct, sys
fd = int(os.environ["SIGMA_SPPROXY_FD"])
seq = 0
def readn(k):
    b = b""
    while len(b) < k:
        c = os.read(fd, k - len(b))
        if not c:
            raise EOFError
        b += c
    return b
def call(method, body=b""):
    global seq
    seq += 1
    m = method.encode()
    frames = [b"\x0a" + bytes([len(m)]) + m, body]
    os.write(fd, struct.pack("<QI", seq, len(frames)) + b"".join(struct.pack("<I", len(f) + 4) + f for f in frames))
    s, n = struct.unpack("<QI", readn(12))
    return [readn(struct.unpack("<I", readn(4))[0] - 4) for _ in range(n)]
def init(): call("SPProxySrvAPI.Init")
def started(): call("SPProxySrvAPI.Started")
def exited(msg): call("SPProxySrvAPI.Exited", b"\x08\x01\x12" + bytes([len(msg)]) + msg.encode())
"#;

fn py_proc(t: &Tramp, name: &str, body: &str) -> PathBuf {
    t.publish(name, format!("{PY_SPPROXY}\n{body}\n").as_bytes())
}

/// A Python proc: the script is the binfs program, shown read-only at /sigma/bin/NAME and run
/// by the configured interpreter; its σOS calls go through the relay to spproxyd.
#[test]
fn a_python_proc_reaches_spproxyd_through_the_relay() {
    let t = Tramp::new("");
    let srv = t.spproxyd();
    let p = py_proc(
        &t,
        "hello.py",
        r#"
init(); started()
print(sys.argv, open(__file__).read().startswith("\nimport os"))
try:
    open(__file__, "a")
except OSError as e:
    print("read-only", e.errno)
exited("done")
"#,
    );
    let o = run(&mut t.cmd(&p, false, &["x", "-y"]));
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(
        stdout(&o),
        "['/sigma/bin/hello.py', 'x', '-y'] True\nread-only 30\n"
    );
    let st = srv.proc_state();
    assert!(st.started);
    assert_eq!(st.exited, Some((1, "done".to_owned())));
}

/// Status 0 without an Exited σOS accepted is an error procd records, not a hang.
#[test]
fn status_0_without_exited_is_an_error() {
    let t = Tramp::new("");
    let srv = t.spproxyd();
    let p = py_proc(&t, "quiet.py", "init(); started()");
    let o = run(&mut t.cmd(&p, false, &[]));
    one_line_error(&o, "without calling Exited");
    assert!(srv.proc_state().started);
    // Never a word to σOS: the same.
    let p = py_proc(&t, "mute.py", "pass");
    one_line_error(&run(&mut t.cmd(&p, false, &[])), "without calling Exited");
    // An Exited that spproxyd refused (no Init on the connection) does not count.
    let p = py_proc(&t, "noinit.py", "exited('x')");
    one_line_error(&run(&mut t.cmd(&p, false, &[])), "without calling Exited");
    // A non-zero status is left to procd as it is.
    let p = py_proc(&t, "fails.py", "init(); started(); sys.exit(3)");
    assert_eq!(run(&mut t.cmd(&p, false, &[])).status.code(), Some(3));
}

/// `python3-v…` is the configured interpreter itself, run with the proc's arguments.
#[test]
fn python_by_name_is_the_configured_interpreter() {
    let t = Tramp::new(&format!(
        "interpreter = {:?}",
        interp::python().display().to_string()
    ));
    t.spproxyd();
    let prog = t.path("binfs/python3-v3.11");
    let code = format!("{PY_SPPROXY}\ninit(); print(sys.version_info[0]); exited('ok')");
    let o = run(&mut t.cmd(&prog, false, &["-c", &code]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "3\n");
    assert!(!prog.exists(), "binfs is not read for the interpreter");
}

/// `true`: the handshake frame reaches dialproxy before the proc starts, and the proc holds
/// the connection as SIGMA_DIALPROXY_FD.
#[test]
fn the_dialproxy_handshake_and_connection() {
    let t = Tramp::new("");
    t.spproxyd();
    let l = UnixListener::bind(t.path("spp/spproxyd-dialproxy.sock")).unwrap();
    let server = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut len = [0u8; 4];
        c.read_exact(&mut len).unwrap();
        let len = i32::from_le_bytes(len);
        let mut principal = vec![0u8; usize::try_from(len - 4).unwrap()];
        c.read_exact(&mut principal).unwrap();
        let mut ping = [0u8; 4];
        c.read_exact(&mut ping).unwrap();
        c.write_all(b"pong").unwrap();
        (len, String::from_utf8(principal).unwrap(), ping)
    });
    let p = py_proc(
        &t,
        "dial.py",
        r#"
dp = int(os.environ["SIGMA_DIALPROXY_FD"])
os.write(dp, b"ping"); print(os.read(dp, 4).decode())
init(); exited("ok")
"#,
    );
    let o = run(&mut t.cmd(&p, true, &[]));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(stdout(&o), "pong\n");
    let (len, principal, ping) = server.join().unwrap();
    assert_eq!(principal, PRINCIPAL);
    assert_eq!(len as usize, PRINCIPAL.len() + 4);
    assert_eq!(&ping, b"ping");
}

#[test]
fn no_dialproxy_socket_is_one_line() {
    let t = Tramp::new("");
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let o = run(&mut t.cmd(&sh, true, &["-c", "echo ran"]));
    one_line_error(&o, "dialproxy: cannot connect to");
    assert_eq!(stdout(&o), "");
}

#[test]
fn malformed_contracts_and_configs_are_one_line() {
    let t = Tramp::new("");
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let run1 = |c: &mut Command| run(c);
    // Too few arguments.
    let o = run1(&mut t.cmd(&sh, false, &["-c", "exit 0"]));
    assert_eq!(o.status.code(), Some(0), "a valid run first: {o:?}");
    let mut c = Command::new(t.path("bin/uproc-trampoline"));
    c.env_clear().env("SIGMACONFIG", CONFIG).arg("p-1");
    one_line_error(&run1(&mut c), "at least 3 arguments");
    // No SIGMACONFIG, or not JSON.
    one_line_error(
        &run1(t.cmd(&sh, false, &[]).env_remove("SIGMACONFIG")),
        "SIGMACONFIG",
    );
    one_line_error(
        &run1(t.cmd(&sh, false, &[]).env("SIGMACONFIG", "{")),
        "SIGMACONFIG",
    );
    // Not true/false; a relative or missing PROG.
    let c = t.cmd(&sh, false, &[]);
    let mut args: Vec<std::ffi::OsString> = c.get_args().map(Into::into).collect();
    args[2] = "maybe".into();
    let mut c2 = Command::new(c.get_program());
    c2.env_clear().env("SIGMACONFIG", CONFIG).args(&args);
    one_line_error(&run1(&mut c2), "neither true nor false");
    one_line_error(
        &run1(&mut t.cmd(Path::new("sh-v1.0"), false, &[])),
        "absolute",
    );
    one_line_error(
        &run1(&mut t.cmd(&t.path("binfs/none-v1.0"), false, &[])),
        "opening",
    );
    // A Python proc without spproxyd.
    let p = py_proc(&t, "lonely.py", "pass");
    one_line_error(&run1(&mut t.cmd(&p, false, &[])), "no spproxyd socket");
    // A malformed configuration: named, with its line.
    std::fs::write(
        t.path("bin/trampoline.toml"),
        "interpreter = \"python3\"\nrelay = \"yes\"\n",
    )
    .unwrap();
    let o = run1(&mut t.cmd(&sh, false, &["-c", "echo ran"]));
    one_line_error(&o, "trampoline.toml: invalid type");
    assert!(stderr(&o).contains("line 2"), "{}", stderr(&o));
    std::fs::write(
        t.path("bin/trampoline.toml"),
        "interpreter = \"python3\"\nbinfs = \"/x\"\n",
    )
    .unwrap();
    one_line_error(
        &run1(&mut t.cmd(&sh, false, &["-c", "echo ran"])),
        "unknown field",
    );
}

/// `sigma-supervise trampoline …` is the same mode.
#[test]
fn the_subcommand_is_the_same_mode() {
    let t = Tramp::new("");
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let tramp = t.cmd(&sh, false, &["-c", "echo $0; exit 4"]);
    let mut c = Command::new(t.path("bin/uproc-trampoline"));
    // argv[0] is not uproc-trampoline: the subcommand decides.
    c.arg0("sigma-supervise").arg("trampoline");
    c.env_clear();
    for (k, v) in tramp.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c.args(tramp.get_args());
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(4));
    assert_eq!(stdout(&o), format!("{}\n", sh.display()));
}

/// `sigmaos-nodialproxy` is `sigmaos` entry for entry but for the sockets σOS's own trampoline
/// gives a proc without dialproxy: socket of any family but AF_VSOCK, bind, listen, connect.
#[test]
fn the_nodialproxy_profile_is_sigmaos_plus_sigmaos_own_sockets() {
    use policies::SyscallAction;
    let base = policies::load("sigmaos").unwrap();
    let net = policies::load("sigmaos-nodialproxy").unwrap();
    let sockets = ["socket", "bind", "listen", "connect"];
    let rest = |p: &policies::Profile| {
        p.syscalls()
            .iter()
            .filter(|e| !sockets.contains(&e.name.as_str()))
            .map(|e| (e.name.clone(), e.action, e.when.clone(), e.origin))
            .collect::<Vec<_>>()
    };
    assert_eq!(rest(&base), rest(&net));
    assert_eq!(base.default_action(), net.default_action());
    assert_eq!(base.path_rules(), net.path_rules());
    let of = |name: &str| {
        net.syscalls()
            .iter()
            .filter(|e| e.name == name)
            .collect::<Vec<_>>()
    };
    let socket = of("socket");
    assert_eq!(socket.len(), 1);
    assert_eq!(socket[0].action, SyscallAction::Allow);
    assert_eq!(
        socket[0].when,
        [notify::ArgCmp {
            arg: 0,
            op: notify::CmpOp::Ne,
            value: 40
        }]
    );
    for name in ["bind", "listen", "connect"] {
        let e = of(name);
        assert_eq!(e.len(), 1, "{name}");
        assert_eq!(
            (e[0].action, e[0].when.len()),
            (SyscallAction::Allow, 0),
            "{name}"
        );
    }
}

/// procd starts the trampoline in new pid and mount namespaces with its own /proc left
/// mounted: the trampoline mounts its namespace's procfs (the jail's id maps are written there)
/// and nothing of it reaches the caller's mounts. A binary without dialproxy may make a TCP
/// socket (σOS's Go procs dial named themselves); a Python proc may not.
#[test]
fn in_procds_pid_namespace_and_sockets_by_dialproxy() {
    let t = Tramp::new("");
    let py = t.publish("tool", &std::fs::read(interp::python()).unwrap());
    let code = "import socket\ntry:\n socket.socket(socket.AF_INET).close(); print('tcp-socket')\n\
                except OSError as e:\n print('refused', e.errno)\n";
    let before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let c = t.cmd(&py, false, &["-I", "-c", code]);
    let prog = c.get_program().to_owned();
    let args: Vec<_> = c.get_args().map(|a| a.to_owned()).collect();
    let mut u = Command::new("unshare");
    u.args([
        "--pid",
        "--fork",
        "--mount",
        "--propagation",
        "unchanged",
        "--",
    ])
    .arg(prog)
    .args(args)
    .env_clear()
    .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
    .current_dir("/");
    let o = run(&mut u);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(stdout(&o), "tcp-socket\n");
    assert_eq!(
        before.lines().count(),
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .count(),
        "a mount reached the caller"
    );
    // A Python proc keeps `sigmaos` (its way to σOS is the relay; it ends without Exited).
    let _srv = t.spproxyd();
    let script = t.publish("net.py", code.as_bytes());
    let o = run(&mut t.cmd(&script, false, &[]));
    assert_eq!(stdout(&o), format!("refused {}\n", libc::EPERM), "{o:?}");
}

/// A binary whose σOS client dials spproxyd itself (SIGMACONFIG's `useSPProxy`) sees that
/// socket, alone, at its path; any other proc sees nothing of spproxyd's directory.
#[test]
fn spproxyds_socket_is_shown_only_to_a_proc_that_dials_it() {
    let t = Tramp::new("");
    let _srv = t.spproxyd();
    std::fs::write(t.path("spp/other"), b"x").unwrap();
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let spp = t.path("spp").display().to_string();
    let script = format!("test -S {spp}/spproxyd.sock && echo socket; ls -A {spp} | tr '\\n' ' '");
    let uses = r#"{"pidStr":"p-1","program":"x","realmStr":"rootrealm","useSPProxy":true}"#;
    let o = run(t.cmd(&sh, false, &["-c", &script]).env("SIGMACONFIG", uses));
    assert_eq!(stdout(&o), "socket\nspproxyd.sock ", "{o:?}");
    let o = run(&mut t.cmd(&sh, false, &["-c", &script]));
    assert!(!stdout(&o).contains("socket"), "{o:?}");
}

/// As the init of procd's pid namespace the trampoline cannot die of a signal it raises: a
/// proc's fault ends it by the same fault (procd records the signal); SIGTERM is 128+15.
#[test]
fn as_a_pid_namespace_init_a_fault_is_passed_on_as_the_signal() {
    let t = Tramp::new("");
    let py = t.publish("tool", &std::fs::read(interp::python()).unwrap());
    let sh = t.publish("sh", &std::fs::read("/bin/sh").unwrap());
    let in_pidns = |c: Command| {
        let mut u = Command::new("unshare");
        u.args(["--pid", "--fork", "--mount", "--"])
            .arg(c.get_program())
            .args(c.get_args())
            .env_clear()
            .envs(c.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
            .current_dir("/");
        run(&mut u)
    };
    let segv = "import ctypes; ctypes.string_at(0)";
    let o = in_pidns(t.cmd(&py, false, &["-I", "-c", segv]));
    assert_eq!(o.status.signal(), Some(libc::SIGSEGV), "{o:?}");
    let o = in_pidns(t.cmd(&sh, false, &["-c", "kill -TERM $$; sleep 5"]));
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{o:?}");
}
