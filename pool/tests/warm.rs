//! Warm procs from a real pool: real CPython zygotes, a real seccomp filter installed in each
//! proc (it refuses `unshare` with EPERM), the pool's own client API. The test binary runs
//! itself again in a role (`SIGMA_POOL_TEST_ROLE`): `pool` is `sigma-supervise pool ARGS`,
//! `client` asks that pool for `python3 ARGS` as the supervisor does, lets it go, forwards the
//! signals it gets to the proc and exits as the proc ended. Each test has a pool of its own
//! (`SIGMA_POOL_DIR`). No harness: the tests run in order, each named on its line.
use sigma_pool as pool;
use std::ffi::OsString;
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "SIGMA_POOL_TEST_ROLE";

fn main() -> ExitCode {
    match std::env::var(ROLE).as_deref() {
        Ok("pool") => return pool_role(),
        Ok("client") => return client_role(),
        _ => {}
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: &[(&str, fn())] = &[
        (
            "a_zygote_is_recycled_ahead_of_the_request",
            a_zygote_is_recycled_ahead_of_the_request,
        ),
        (
            "warm_procs_take_the_clients_limits_signals_and_argv",
            warm_procs_take_the_clients_limits_signals_and_argv,
        ),
        (
            "ctrl_c_through_a_pseudo_terminal_ends_a_warm_proc_as_a_cold_one",
            ctrl_c_through_a_pseudo_terminal_ends_a_warm_proc_as_a_cold_one,
        ),
        (
            "learning_takes_no_clients_word_for_what_a_run_imported",
            learning_takes_no_clients_word_for_what_a_run_imported,
        ),
        (
            "the_least_recently_used_learned_zygote_makes_way",
            the_least_recently_used_learned_zygote_makes_way,
        ),
        (
            "what_a_hostile_proc_reports_is_bounded_and_checked",
            what_a_hostile_proc_reports_is_bounded_and_checked,
        ),
    ];
    let mut ran = 0;
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        eprintln!("test {name} ...");
        test();
        eprintln!("test {name} ... ok");
        ran += 1;
    }
    eprintln!("test result: ok. {ran} passed");
    ExitCode::SUCCESS
}

/// `sigma-supervise pool` with the arguments after ours.
fn pool_role() -> ExitCode {
    let args = std::iter::once(OsString::from("pool")).chain(std::env::args_os().skip(1));
    let args = <pool::cli::PoolArgs as clap::Parser>::parse_from(args);
    ExitCode::from(pool::cli::main(&args))
}

/// A seccomp filter as the supervisor hands one over (native `struct sock_filter` array): every
/// call allowed but `unshare`, refused with EPERM.
fn filter() -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    let (arch, unshare) = (0xc000_003e_u32, 272_u32);
    #[cfg(target_arch = "aarch64")]
    let (arch, unshare) = (0xc000_00b7_u32, 97_u32);
    let allow = 0x7fff_0000;
    let prog: [(u16, u8, u8, u32); 7] = [
        (0x20, 0, 0, 4),                                // A = seccomp_data.arch
        (0x15, 1, 0, arch),                             // the native arch? skip the next
        (0x06, 0, 0, allow),                            // (another arch: allowed)
        (0x20, 0, 0, 0),                                // A = seccomp_data.nr
        (0x15, 0, 1, unshare),                          // unshare?
        (0x06, 0, 0, 0x0005_0000 | libc::EPERM as u32), // SECCOMP_RET_ERRNO | EPERM
        (0x06, 0, 0, allow),
    ];
    let mut bytes = Vec::new();
    for (code, jt, jf, k) in prog {
        bytes.extend(code.to_ne_bytes());
        bytes.extend([jt, jf]);
        bytes.extend(k.to_ne_bytes());
    }
    bytes
}

/// Ask the pool for `python3 ARGS` as the supervisor does, and supervise it: "go", the signals
/// we get forwarded to it by pidfd, our exit status the proc's. 90: it would have started cold.
fn client_role() -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let env: Vec<Vec<u8>> = std::env::vars_os()
        .filter(|(k, _)| k != ROLE)
        .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
        .collect();
    let env: Vec<&[u8]> = env.iter().map(Vec::as_slice).collect();
    let mut forwarded = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        forwarded.add(s);
    }
    let python = pool::server::which(Path::new(&args[0])).expect("python3");
    let req = pool::client::WarmRequest {
        python: &python,
        argv: &argv,
        env: &env,
        // A client may claim what it likes (the learning test's fake client does).
        imports: match std::env::var("SIGMA_POOL_TEST_IMPORTS") {
            Ok(v) => v.split(',').map(str::to_owned).collect(),
            Err(_) => pool::choose::imports_of(&args),
        },
        startup: pool::choose::startup_env_of(&pool::client::env_pairs(&env)),
        filter: filter(),
        fds: Vec::new(),
        jail: None,
        profile: "sigmaos",
        stats: false,
    };
    let s = match pool::client::start(&req) {
        Ok(pool::client::Outcome::Warm(s)) => s,
        Ok(pool::client::Outcome::Cold(why)) => {
            eprintln!("cold start: {why}");
            return ExitCode::from(90);
        }
        Err(e) => {
            eprintln!("cold start: {e}");
            return ExitCode::from(90);
        }
    };
    eprintln!("warm start (zygote {})", s.zygote);
    // As the supervisor: the signals it handles wait for a thread of ours, which passes them on.
    forwarded.thread_block().unwrap();
    let pidfd = s.pidfd.try_clone().unwrap();
    std::thread::spawn(move || loop {
        if let Ok(sig) = forwarded.wait() {
            let _ = pool::client::forward_signal(pidfd.as_fd(), sig as i32);
        }
    });
    nix::unistd::write(&s.go, b"g").unwrap();
    let mut report = [0u8; 2];
    let n = nix::unistd::read(&s.ended, &mut report).unwrap();
    assert_eq!(n, 2, "the zygote's report");
    // Killed by a signal: so are we, as a shell would see the proc end.
    if let Ok(sig) = Signal::try_from(i32::from(report[1])) {
        // SAFETY: SIG_DFL installs no handler; nothing of ours runs on the signal.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
        let mut only = SigSet::empty();
        only.add(sig);
        let _ = only.thread_unblock();
        let _ = nix::sys::signal::raise(sig);
    }
    ExitCode::from(report[0])
}

struct Pool {
    dir: tempfile::TempDir,
    child: Child,
}

impl Pool {
    fn start(args: &[&str]) -> Pool {
        let dir = tempfile::tempdir().unwrap();
        // Zygotes without a σcontainer: this binary is not the supervisor that builds one.
        let child = Command::new(std::env::current_exe().unwrap())
            .arg("--no-jail")
            .args(args)
            .env(ROLE, "pool")
            .env("SIGMA_POOL_DIR", dir.path())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let sock = dir.path().join("pool.sock");
        let until = Instant::now() + Duration::from_secs(60);
        while !sock.exists() {
            assert!(Instant::now() < until, "the pool did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Pool { dir, child }
    }

    /// `pool --status`, all of it (it must succeed).
    fn status_text(&self) -> String {
        let out = Command::new(std::env::current_exe().unwrap())
            .arg("--status")
            .env(ROLE, "pool")
            .env("SIGMA_POOL_DIR", self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pool --status`: one line per zygote.
    fn status(&self) -> Vec<String> {
        self.status_text()
            .lines()
            .filter(|l| l.starts_with("zygote pid "))
            .map(str::to_owned)
            .collect()
    }

    /// The client role's command for `python3 ARGS` (the caller adds stdio, limits, ...).
    fn client(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.arg("python3")
            .args(args)
            .env(ROLE, "client")
            .env("SIGMA_POOL_DIR", self.dir.path())
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.client(args).output().unwrap()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The zygote pid a warm run names, and its stdout.
fn zygote_of(o: &Output) -> i32 {
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("warm start"))
        .unwrap_or_else(|| panic!("not a warm start: {err}"));
    let pid = line.rsplit("pid ").next().unwrap().trim_end_matches(')');
    pid.parse().unwrap()
}

fn pid_of_status(line: &str) -> i32 {
    line["zygote pid ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn a_zygote_is_recycled_ahead_of_the_request() {
    let pool = Pool::start(&["--recycle-after-forks", "2"]);
    let code = "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n\
                print(libc.unshare(0x20000), ctypes.get_errno() == errno.EPERM)";
    let first = pool.run(&["-c", code]);
    let second = pool.run(&["-c", code]);
    for o in [&first, &second] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // The proc's own filter refused the call.
        assert_eq!(String::from_utf8_lossy(&o.stdout), "-1 True\n");
    }
    let old = zygote_of(&first);
    assert_eq!(
        zygote_of(&second),
        old,
        "one zygote serves its first two forks"
    );
    // The replacement is started after the second fork, between requests: --status shows it
    // coming, then in place with no forks yet, while the old one is retired.
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status = pool.status();
        if status.len() == 1 && pid_of_status(&status[0]) != old {
            break status;
        }
        assert!(Instant::now() < until, "no replacement: {status:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status[0].contains(" forks 0 age "), "{status:?}");
    assert!(status[0].ends_with(" ready"), "{status:?}");
    let third = pool.run(&["-c", code]);
    assert!(
        third.status.success(),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&third.stdout), "-1 True\n");
    let new = zygote_of(&third);
    assert_ne!(new, old, "the third run came from a new zygote");
    assert_eq!(new, pid_of_status(&status[0]));
    // The retired zygote exited once its procs had ended.
    let gone = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{old}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
        if state.contains(") Z ") {
            break; // ended, not yet reaped: the pool reaps it on its next round
        }
        assert!(Instant::now() < gone, "the retired zygote {old} still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The interpreter itself (not a launcher script on PATH): cold and warm runs name the same.
fn real_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// What a proc inherits from whoever started it, as it sees it.
const INHERITED: &str = r#"
import resource, signal, sys
for n in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
    print(n, resource.getrlimit(getattr(resource, n)))
for s in sorted(signal.valid_signals()):
    try:
        h = signal.getsignal(s)
    except ValueError:
        continue
    print(s, h.name if isinstance(h, signal.Handlers) else getattr(h, "__name__", h))
print("blocked", sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
print("cmdline", open("/proc/self/cmdline", "rb").read().split(b"\0"))
print("argv", sys.argv, sys.orig_argv)
"#;

fn warm_procs_take_the_clients_limits_signals_and_argv() {
    let python = real_python();
    let pool = Pool::start(&["--python", &python]);
    // A launcher that ignores SIGHUP and SIGUSR1, blocks SIGUSR2 and lowers three limits
    // (the pool has none of these), then execs the cold proc or the warm proc's client.
    // SIGINT and SIGQUIT are set to their defaults, which a test runner started in the
    // background by a shell inherits as ignored.
    let launcher = [
        "env",
        "--default-signal=INT,QUIT",
        "--ignore-signal=HUP,USR1",
        "--block-signal=USR2",
        "prlimit",
        "--nofile=200:300",
        "--core=0:0",
        "--stack=4194304:16777216",
        "--",
    ];
    let args = [python.as_str(), "-c", INHERITED, "one", "two words"];
    let cold = Command::new(launcher[0])
        .args(&launcher[1..])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        cold.status.success(),
        "{}",
        String::from_utf8_lossy(&cold.stderr)
    );
    let client = pool.client(&args[1..]);
    let warm = Command::new(launcher[0])
        .args(&launcher[1..])
        .arg(client.get_program())
        .arg(&python)
        .args(&args[1..])
        .env(ROLE, "client")
        .env("SIGMA_POOL_DIR", pool.dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );
    zygote_of(&warm);
    let (cold, warm) = (
        String::from_utf8_lossy(&cold.stdout),
        String::from_utf8_lossy(&warm.stdout),
    );
    // The launcher's settings are there, cold and warm alike.
    for line in [
        "RLIMIT_NOFILE (200, 300)",
        "RLIMIT_CORE (0, 0)",
        "RLIMIT_STACK (4194304, 16777216)",
        &format!("{} SIG_IGN", libc::SIGHUP),
        &format!("{} SIG_IGN", libc::SIGUSR1),
        &format!("{} SIG_DFL", libc::SIGTERM),
        &format!("{} default_int_handler", libc::SIGINT),
        &format!("{} SIG_IGN", libc::SIGPIPE),
        "blocked [<Signals.SIGUSR2: 12>]",
        "cmdline [b'",
    ] {
        assert!(
            cold.lines().any(|l| l.starts_with(line)),
            "cold lacks {line}:\n{cold}"
        );
    }
    assert_eq!(warm, cold);
}

/// Runs `ARGV` on a pseudo-terminal as a terminal's job (^C's default action), prints "ready"
/// once the program said so, types ^C, and prints what the program said after and how the
/// job ended (supervisor/tests/everyday.rs's ^C test drives its runs the same way).
const PTY_DRIVER: &str = r#"
import os, pty, select, signal, sys, time
pid, fd = pty.fork()
if pid == 0:
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
read_until(b"\x00never", 30)
_, status = os.waitpid(pid, 0)
said = out.split(b"ready", 1)[-1].replace(b"\r", b"")
print("interrupted" if b"interrupted" in said else "", "KeyboardInterrupt" if b"KeyboardInterrupt" in said else "", os.waitstatus_to_exitcode(status))
"#;

fn ctrl_c_through_a_pseudo_terminal_ends_a_warm_proc_as_a_cold_one() {
    let python = real_python();
    let pool = Pool::start(&["--python", &python]);
    // Handled (its handler runs, its exit status is the program's), and not handled (the
    // interpreter's traceback, then killed by SIGINT as CPython ends on an unhandled ^C).
    let handled = "import sys, time\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n\
                   except KeyboardInterrupt:\n    print('interrupted', flush=True)\n    sys.exit(3)\n";
    let unhandled = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n";
    for (prog, want) in [
        (handled, "interrupted  3\n".to_owned()),
        (unhandled, format!(" KeyboardInterrupt -{}\n", libc::SIGINT)),
    ] {
        let drive = |argv: &[&std::ffi::OsStr]| {
            let o = Command::new(&python)
                .args(["-c", PTY_DRIVER])
                .args(argv)
                .env(ROLE, "client")
                .env("SIGMA_POOL_DIR", pool.dir.path())
                .stdin(Stdio::null())
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let args = [python.as_ref(), "-c".as_ref(), prog.as_ref()];
        let cold = drive(&args);
        assert_eq!(cold, want, "cold");
        let exe = std::env::current_exe().unwrap();
        let warm = drive(&[&[exe.as_os_str()][..], &args].concat());
        assert_eq!(warm, want, "warm");
    }
    // kill(1) of the client: the proc gets the signal and ends by it, as a cold one would.
    let mut client = pool.client(&[
        "-c",
        "import time\nprint('ready', flush=True)\ntime.sleep(60)",
    ]);
    client.env("PATH", Path::new(&python).parent().unwrap()); // python3: the pool's
    let mut child = client
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let o = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGTERM),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The pool's answer to a request a fake client makes up.
fn answer_to(pool: &Pool, request: &serde_json::Value) -> String {
    std::env::set_var("SIGMA_POOL_DIR", pool.dir.path());
    let conn = pool::client::connect().unwrap();
    pool::wire::send(conn.as_fd(), request, &[]).unwrap();
    let (answer, _) = pool::wire::recv::<serde_json::Value>(conn.as_fd())
        .unwrap()
        .expect("an answer");
    answer.to_string()
}

fn learning_takes_no_clients_word_for_what_a_run_imported() {
    let python = real_python();
    let pool = Pool::start(&["--python", &python, "--learn-threshold", "2"]);
    // Names that are no module's: the run is refused (cold, nothing handed to a zygote).
    let long = "a".repeat(65);
    let many: Vec<String> = (0..2000).map(|i| format!("m{i}")).collect();
    for imports in [
        vec!["json".to_owned(), "os;rm -rf".to_owned()],
        vec!["../../tmp/x".to_owned()],
        vec!["".to_owned()],
        vec!["2fast".to_owned()],
        vec![long],
        many,
    ] {
        let request = serde_json::json!({
            "op": "run", "python": python, "imports": imports, "startup": []
        });
        let answer = answer_to(&pool, &request);
        assert!(
            answer.contains("not plain module names"),
            "{imports:?}: {answer}"
        );
    }
    // python3 is the pool's interpreter.
    let path = format!(
        "{}:{}",
        Path::new(&python).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A client that claims its program imports decimal and json when it does not: the procs'
    // own sys.modules say otherwise, and nothing is learned, however often it claims so.
    for _ in 0..4 {
        let o = pool
            .client(&["-c", "print('plain')"])
            .env("PATH", &path)
            .env("SIGMA_POOL_TEST_IMPORTS", "decimal,json")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "plain\n");
        zygote_of(&o);
    }
    // A program that imports what it claims is counted (two of them make a zygote).
    for _ in 0..2 {
        let o = pool
            .client(&[
                "-c",
                "import decimal, json\nprint(json.dumps(str(decimal.Decimal(2))))",
            ])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "\"2\"\n");
    }
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = pool.status_text();
        if s.contains("[decimal,json] learned forks 0") {
            break s;
        }
        assert!(Instant::now() < until, "nothing learned: {s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.contains("6 runs remembered: decimal 2, json 2"),
        "{status}"
    );
}

fn the_least_recently_used_learned_zygote_makes_way() {
    let python = real_python();
    let pool = Pool::start(&[
        "--python",
        &python,
        "--learn-threshold",
        "1",
        "--learned-zygotes",
        "1",
    ]);
    let path = format!(
        "{}:{}",
        Path::new(&python).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let learned = |want: &str| {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let s = pool.status_text();
            let lines: Vec<&str> = s.lines().filter(|l| l.contains(" learned ")).collect();
            if lines.len() == 1 && lines[0].contains(want) && lines[0].ends_with(" ready") {
                return pid_of_status(lines[0]);
            }
            assert!(Instant::now() < until, "not only {want} learned: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let run = |code: &str| {
        let o = pool
            .client(&["-c", code])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        zygote_of(&o)
    };
    run("import json\nprint(json.dumps(1))");
    let first = learned("[json] learned");
    assert_eq!(run("import json\nprint(json.dumps(2))"), first);
    // Another set earns a zygote, but one learned zygote at most: it takes the place of the
    // least recently used only once more runs imported it (json's two, then decimal's
    // three), and the two do not take turns.
    for i in 0..2 {
        run(&format!("import decimal\nprint(decimal.Decimal({i}))"));
        assert_eq!(learned("[json] learned"), first);
    }
    run("import decimal\nprint(decimal.Decimal(3))");
    let second = learned("[decimal] learned");
    assert_ne!(second, first);
    assert_eq!(run("import decimal\nprint(decimal.Decimal(4))"), second);
    run("import json\nprint(json.dumps(3))");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        learned("[decimal] learned"),
        second,
        "json took decimal's place back"
    );
}

/// A program that finds the page its proc reports its imports on in its own maps, writes its
/// own report there (a length of LEN and BODY) and ends by os._exit, so the proc's own report
/// is never written over it.
const SPOIL: &str = r#"
import ctypes, os, sys
length, body = int(sys.argv[1]), sys.argv[2].encode()
for line in open("/proc/self/maps"):
    f = line.split()
    lo, hi = (int(x, 16) for x in f[0].split("-"))
    if f[1] == "rw-s" and hi - lo == 4096 and "/dev/zero" in line:
        ctypes.memmove(lo + 4, body, min(len(body), 4092))
        ctypes.memmove(lo, length.to_bytes(4, "little"), 4)
        print("spoiled", flush=True)
os._exit(0)
"#;

fn what_a_hostile_proc_reports_is_bounded_and_checked() {
    let python = real_python();
    let pool = Pool::start(&["--python", &python, "--learn-threshold", "1"]);
    let path = format!(
        "{}:{}",
        Path::new(&python).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let long = "z".repeat(65);
    let many: String = (0..100).map(|i| format!("m{i},")).collect();
    for (length, body) in [
        // A length beyond the page: nothing.
        ("4294967295".to_owned(), "json".to_owned()),
        // Names that are no module's, and one too long: dropped; no_such_module is counted.
        (
            "4092".to_owned(),
            format!("no_such_module,../x,a b,os;rm,{long},"),
        ),
        // More than 32 names: the first 32 (m0..m31).
        ("4092".to_owned(), many),
    ] {
        let o = pool
            .client(&["-c", SPOIL, &length, &body])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            "spoiled\n",
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The one plain name a single run reported earned a zygote (threshold 1), which could not
    // import it: dropped from learning. Of the many, none is in the counts beyond the 32nd.
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let s = pool.status_text();
        let refused = s.lines().find(|l| l.starts_with("learning refused"));
        if refused.is_some_and(|l| l.contains("m31") && l.contains("no_such_module")) {
            break s;
        }
        assert!(Instant::now() < until, "{s}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.contains("3 runs remembered: "), "{status}");
    // All 33 names that no finder finds were refused.
    let refused = status
        .lines()
        .find_map(|l| l.strip_prefix("learning refused (failed to import): "))
        .unwrap();
    assert_eq!(refused.split(',').count(), 33, "{status}");
    for absent in ["../x", "a b", "os;rm", "zzz", "m32", "json"] {
        let counts = status
            .lines()
            .find(|l| l.starts_with("learning on"))
            .unwrap();
        assert!(!counts.contains(absent), "{absent}: {status}");
    }
    // The pool still serves.
    let o = pool
        .client(&["-c", "print(7)"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "7\n");
}
