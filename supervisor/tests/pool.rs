//! Warm procs against cold ones: a real pool (`sigma-supervise pool`) with real CPython
//! zygotes, the real filter and its listener in the client. Each test has a pool of its own
//! (SIGMA_POOL_DIR); the cold runs name a directory where no pool listens.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sigma-supervise");

mod corpus;
#[allow(dead_code)] // the interpreter, not the supervisor command
mod interp;

struct Pool {
    dir: tempfile::TempDir,
    child: Child,
}

impl Pool {
    /// A pool for `--no-jail` runs (as [`run`] makes them).
    fn start(preloads: &[&str]) -> Pool {
        let mut args = vec!["--no-jail"];
        for p in preloads {
            args.extend(["--preload", p]);
        }
        Pool::start_with(&args, |_| {})
    }

    /// `sigma-supervise pool ARGS`, its command adjusted by `adjust`.
    fn start_with(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Pool {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("pool").args(args).env("SIGMA_POOL_DIR", dir.path());
        adjust(&mut cmd);
        let child = cmd.stderr(Stdio::null()).spawn().unwrap();
        let sock = dir.path().join("pool.sock");
        let until = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            assert!(Instant::now() < until, "the pool did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Pool { dir, child }
    }

    fn zygote_pids(&self) -> Vec<(i32, String)> {
        let out = Command::new(BIN)
            .args(["pool", "--status"])
            .env("SIGMA_POOL_DIR", self.dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("zygote pid "))
            .map(|l| {
                let (pid, rest) = l.split_once(' ').unwrap();
                (pid.parse().unwrap(), rest.to_owned())
            })
            .collect()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run of `python3 ARGS` under the supervisor (--no-jail, --stats), in `cwd`, with `pool_dir`.
fn run(pool_dir: &Path, cwd: &Path, args: &[&str], stdin: &[u8], extra: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["--no-jail", "--stats"])
        .args(extra)
        .arg("python3")
        .args(args)
        .env("GREETING", "héllo wörld");
    interp_run(cmd, cwd, pool_dir, stdin)
}

/// `cmd` (the supervisor with its arguments) in `cwd` with `pool_dir`, `stdin` written.
fn interp_run(mut cmd: Command, cwd: &Path, pool_dir: &Path, stdin: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = cmd
        .current_dir(cwd)
        .env("SIGMA_POOL_DIR", pool_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// The program's own stderr: without the supervisor's lines (its stats come last).
fn program_stderr(o: &Output) -> String {
    let all = String::from_utf8_lossy(&o.stderr);
    let program = all.split("sigma-supervise stats:").next().unwrap_or("");
    program
        .lines()
        .filter(|l| !l.starts_with("sigma-supervise"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn start_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .find(|l| {
            l.starts_with("sigma-supervise: warm start")
                || l.starts_with("sigma-supervise: cold start")
        })
        .unwrap_or("no start line")
        .to_owned()
}

fn scripts(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let all = [
        ("exit3.py", "import sys\nprint('out'); print('err', file=sys.stderr)\nsys.exit(3)\n"),
        ("exitmsg.py", "import sys\nsys.exit('a message')\n"),
        (
            "raises.py",
            "def f():\n    raise ValueError('boom')\nprint('before', end='')\nf()\n",
        ),
        (
            "identity.py",
            "import os, sys\nprint(sys.argv, os.getcwd(), sys.path[0] == os.path.dirname(__file__))\n\
             print(__name__, __file__, os.environ['GREETING'], oct(os.umask(0)))\n\
             print(sorted(m for m in ('socket', 'ctypes', 'json', 'fcntl') if m in sys.modules))\n",
        ),
        ("stdin.py", "import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')\n"),
        (
            "atexit_.py",
            "import atexit, sys\natexit.register(lambda: print('at exit'))\nsys.stdout.write('no newline')\n",
        ),
        ("refused.py", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n\
            r = libc.unshare(0x20000)\nprint(r, os.strerror(ctypes.get_errno()))\n"),
    ];
    all.iter()
        .map(|(name, text)| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            (*name, p)
        })
        .collect()
}

/// A jailed run is warm from a pool of jailed zygotes (the default), and says why it starts
/// cold otherwise: no pool, or one whose zygotes are `--no-jail`.
#[test]
fn a_jailed_run_is_warm_from_a_jailed_pool_and_says_why_not_otherwise() {
    let work = tempfile::tempdir().unwrap();
    let nowhere = tempfile::tempdir().unwrap();
    let jailed = |pool_dir: &Path| {
        Command::new(BIN)
            .args(["--stats", "python3", "-c", "print('ran')"])
            .env("SIGMA_POOL_DIR", pool_dir)
            .current_dir(work.path())
            .output()
            .unwrap()
    };
    let o = jailed(nowhere.path());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ran\n",
        "{}",
        start_of(&o)
    );
    assert_eq!(
        start_of(&o),
        "sigma-supervise: cold start: no pool is running"
    );
    let pool = Pool::start(&[]);
    let o = jailed(pool.dir.path());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ran\n",
        "{}",
        start_of(&o)
    );
    assert!(
        start_of(&o).contains("cold start: the pool's zygotes are --no-jail"),
        "{}",
        start_of(&o)
    );
    drop(pool);
    let pool = Pool::start_with(&[], |_| {});
    let o = jailed(pool.dir.path());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ran\n",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(start_of(&o).contains("warm start"), "{}", start_of(&o));
    // --stats: the memory of its own, as it ended.
    assert!(
        start_of(&o).contains("its own memory at its end"),
        "{}",
        start_of(&o)
    );
}

/// A proc forked ahead builds its root before it knows its working directory. One that the
/// zygote's view lacks (a new directory in the home, which the view shows only in part) has
/// its top-level directory made anew, entry by entry, on the request; one the view has (under
/// /usr, /etc, the project's tree) is attached over it. What the proc sees there, and writes,
/// is a cold run's.
#[test]
fn a_jailed_warm_run_sees_its_directory_as_a_cold_one_under_any_top_level_directory() {
    let pool = Pool::start_with(&[], |_| {});
    let nowhere = tempfile::tempdir().unwrap();
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    let project = tempfile::tempdir_in(&home).unwrap();
    std::fs::write(project.path().join("data.txt"), "project data\n").unwrap();
    let tree = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let show = "import os\n\
        up = os.path.dirname(os.getcwd())\n\
        print(sorted(os.listdir('/')))\n\
        print(up, sorted(os.listdir(up)))\n\
        print(os.getcwd(), sorted(os.listdir('.'))[:20])\n\
        for d in ('null', 'zero', 'full'):\n\
        \x20   try:\n\
        \x20       print(d, open('/dev/' + d, 'wb', 0).write(b'x'))\n\
        \x20   except OSError as e:\n\
        \x20       print(d, e.errno)\n\
        if os.path.exists('data.txt'):\n\
        \x20   print(open('data.txt').read().strip())\n\
        \x20   open('written.txt', 'w').write('w')\n";
    for dir in [
        Path::new("/usr/share"),
        Path::new("/etc"),
        tree.path(),
        project.path(),
    ] {
        let at = |pool_dir: &Path| {
            let _ = std::fs::remove_file(project.path().join("written.txt"));
            let o = Command::new(BIN)
                .args(["--stats", "python3", "-c", show])
                .env("SIGMA_POOL_DIR", pool_dir)
                .current_dir(dir)
                .output()
                .unwrap();
            let wrote = std::fs::read_to_string(project.path().join("written.txt")).ok();
            (o, wrote)
        };
        let (warm, warm_wrote) = at(pool.dir.path());
        let (cold, cold_wrote) = at(nowhere.path());
        assert!(
            start_of(&warm).contains("warm start"),
            "{}",
            start_of(&warm)
        );
        assert!(
            start_of(&cold).contains("cold start"),
            "{}",
            start_of(&cold)
        );
        assert!(
            warm.status.success(),
            "{}",
            String::from_utf8_lossy(&warm.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&warm.stdout),
            String::from_utf8_lossy(&cold.stdout),
            "in {}",
            dir.display()
        );
        assert_eq!(warm_wrote, cold_wrote, "in {}", dir.display());
    }
    assert!(
        std::fs::read_to_string(project.path().join("written.txt")).is_ok_and(|w| w == "w"),
        "the proc's write in its project directory landed"
    );
}

/// A client that asks for a proc and then says nothing holds up no other run: the zygote hands
/// each connection to its ready proc at once (which gives a silent client up after two
/// seconds), so a second client's warm run ends while the first is still waiting.
#[test]
fn a_client_that_stalls_holds_up_no_other_run() {
    let pool = Pool::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let python = pool::server::which(Path::new("python3")).unwrap();
    // Asks as a client does, then waits on its connection: "closed" once it is given up.
    let stall = "import json, os, socket, sys\n\
        env = os.environ\n\
        startup = sorted('%s=%s' % (k, v) for k, v in env.items()\n\
        \x20                if k == 'LANG' or k.startswith(('LC_', 'PYTHON')))\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
        s.connect(sys.argv[1])\n\
        s.send(json.dumps({'op': 'run', 'python': sys.argv[2], 'imports': [],\n\
        \x20                  'startup': startup}).encode())\n\
        print(list(json.loads(s.recv(65536))), flush=True)\n\
        s.recv(1)\n\
        print('closed', flush=True)\n";
    let mut staller = Command::new("python3")
        .args(["-c", stall])
        .arg(pool.dir.path().join("pool.sock"))
        .arg(&python)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Each line the staller says, with when it was read.
    let out = staller.stdout.take().unwrap();
    let (tx, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let _ = tx.send((line.unwrap_or_default(), Instant::now()));
        }
    });
    let (answer, _) = said.recv().unwrap();
    assert_eq!(answer, "['warm']", "the staller's answer");
    let o = run(
        pool.dir.path(),
        work.path(),
        &["-c", "print('on')"],
        b"",
        &["--warm"],
    );
    let ran = Instant::now();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "on\n",
        "{}",
        start_of(&o)
    );
    assert!(start_of(&o).contains("warm start"), "{}", start_of(&o));
    // The staller's connection was given up only after the run had ended, not to let it run.
    let (closed, at) = said.recv().unwrap();
    assert_eq!(
        closed, "closed",
        "the staller's connection is given up in the end"
    );
    assert!(at > ran, "the run waited for the staller to be given up");
    let _ = staller.wait();
}

/// Socket activation: started by systemd on the socket it listens on (here a stand-in that
/// listens and execs the pool as systemd would: the socket as descriptor 3, `LISTEN_PID` and
/// `LISTEN_FDS`), the pool serves on it, passes the activation's variables to no zygote, and
/// leaves the socket in place when it stops.
#[test]
fn a_socket_activated_pool_serves_on_the_socket_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("pool.sock");
    let systemd = "import os, socket, sys\n\
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
        s.bind(sys.argv[1])\n\
        s.listen(16)\n\
        os.dup2(s.fileno(), 3)\n\
        os.set_inheritable(3, True)\n\
        env = dict(os.environ, LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', PATH=sys.argv[3])\n\
        os.execve(sys.argv[2], [sys.argv[2], 'pool', '--no-jail'], env)\n";
    let mut pool = Command::new("python3")
        .args(["-c", systemd])
        .arg(&sock)
        .arg(BIN)
        // The test's own PATH (an interpreter's wrapper may change it), so that the pool's
        // python3 is its clients'.
        .arg(std::env::var_os("PATH").unwrap_or_default())
        .env("SIGMA_POOL_DIR", dir.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        assert!(Instant::now() < until, "the stand-in did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its first client waits in the socket's backlog while the pool starts.
    let work = tempfile::tempdir().unwrap();
    let o = run(
        dir.path(),
        work.path(),
        &["-c", "print('activated')"],
        b"",
        &["--warm"],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "activated\n",
        "{}",
        start_of(&o)
    );
    assert!(start_of(&o).contains("warm start"), "{}", start_of(&o));
    let status = status_of(dir.path());
    let zygote = status
        .lines()
        .find_map(|l| l.strip_prefix("zygote pid "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("no zygote in {status}"));
    let environ = std::fs::read(format!("/proc/{zygote}/environ")).unwrap();
    for var in ["LISTEN_PID=", "LISTEN_FDS="] {
        assert!(
            !environ
                .split(|&b| b == 0)
                .any(|e| e.starts_with(var.as_bytes())),
            "the zygote got {var}"
        );
    }
    let stop = Command::new(BIN)
        .args(["pool", "--stop"])
        .env("SIGMA_POOL_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    assert!(pool.wait().unwrap().success());
    assert!(
        sock.exists(),
        "the socket systemd listens on is left in place"
    );
}

/// A bind under /dev has /dev made anew on the request: each proc still has /dev/shm and
/// /dev/pts of its own, never its zygote's, so a sibling's shared-memory file is not seen.
#[test]
fn a_bind_under_dev_leaves_each_warm_proc_its_own_shm() {
    let pool = Pool::start_with(&[], |_| {});
    let work = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), "shown\n").unwrap();
    let bind = format!("{}:/dev/extra", src.path().display());
    let warm = |code: &str| {
        Command::new(BIN)
            .args(["--stats", "--warm", "--bind", &bind, "python3", "-c", code])
            .env("SIGMA_POOL_DIR", pool.dir.path())
            .current_dir(work.path())
            .output()
            .unwrap()
    };
    let first = warm(
        "import os\n\
         open('/dev/shm/left-by-first', 'w').write('x')\n\
         print(open('/dev/extra/f').read().strip(), sorted(os.listdir('/dev/shm')))",
    );
    assert!(
        start_of(&first).contains("warm start"),
        "{}",
        start_of(&first)
    );
    assert_eq!(
        String::from_utf8_lossy(&first.stdout),
        "shown ['left-by-first']\n",
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = warm("import os; print(os.listdir('/dev/shm'), os.listdir('/dev/pts'))");
    assert!(
        start_of(&second).contains("warm start"),
        "{}",
        start_of(&second)
    );
    assert_eq!(
        String::from_utf8_lossy(&second.stdout),
        "[] ['ptmx']\n",
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
}

#[test]
fn warm_and_cold_runs_agree() {
    let pool = Pool::start(&["json"]);
    let work = tempfile::tempdir().unwrap();
    let nowhere = tempfile::tempdir().unwrap();
    for (name, path) in scripts(work.path()) {
        let args = [path.to_str().unwrap(), "one", "two words"];
        let warm = run(
            pool.dir.path(),
            work.path(),
            &args,
            b"some input\n",
            &["--warm"],
        );
        let cold = run(nowhere.path(), work.path(), &args, b"some input\n", &[]);
        assert!(
            start_of(&warm).contains("warm start"),
            "{name}: {}",
            start_of(&warm)
        );
        assert!(
            start_of(&cold).contains("cold start: no pool"),
            "{name}: {}",
            start_of(&cold)
        );
        assert_eq!(
            String::from_utf8_lossy(&warm.stdout),
            String::from_utf8_lossy(&cold.stdout),
            "{name}"
        );
        assert_eq!(program_stderr(&warm), program_stderr(&cold), "{name}");
        assert_eq!(warm.status.code(), cold.status.code(), "{name}");
    }
    // -c CODE, and the zygote with preloads chosen only for a program that imports them.
    for code in ["import json; print(json.dumps([1]))", "print('plain')"] {
        let warm = run(
            pool.dir.path(),
            work.path(),
            &["-c", code],
            b"",
            &["--warm"],
        );
        let cold = run(nowhere.path(), work.path(), &["-c", code], b"", &[]);
        assert_eq!(warm.stdout, cold.stdout, "{code}");
        assert_eq!(warm.status.code(), cold.status.code());
        let with_json = start_of(&warm).contains("[json]");
        assert_eq!(with_json, code.contains("json"), "{}", start_of(&warm));
    }
    // -m MODULE: a module of the working directory's (argv, sys.path[0], __main__, __file__,
    // __spec__), its exception, a missing one, a package's tool with stdin; jailed and not.
    std::fs::write(
        work.path().join("shown.py"),
        "import sys\nprint(sys.argv, sys.path[0], __name__, __file__, __spec__.name)\n\
         print(sorted(m for m in sys.modules if m in ('runpy', 'json', 'pkgutil')))\n",
    )
    .unwrap();
    std::fs::write(
        work.path().join("failing.py"),
        "raise ValueError('from -m')\n",
    )
    .unwrap();
    let jailed_pool = Pool::start_with(&[], |_| {});
    for (args, stdin) in [
        (&["-m", "shown", "one", "two words"][..], &b""[..]),
        (&["-m", "failing"][..], b""),
        (&["-m", "no_such_module_here"][..], b""),
        (
            &["-m", "json.tool", "--sort-keys"][..],
            b"{\"b\": 1, \"a\": [2]}",
        ),
    ] {
        for (pool_dir, jailed) in [(pool.dir.path(), false), (jailed_pool.dir.path(), true)] {
            let warm = if jailed {
                let mut c = Command::new(BIN);
                c.args(["--stats", "--warm", "python3"]).args(args);
                interp_run(c, work.path(), pool_dir, stdin)
            } else {
                run(pool_dir, work.path(), args, stdin, &["--warm"])
            };
            let cold = if jailed {
                let mut c = Command::new(BIN);
                c.args(["--stats", "python3"]).args(args);
                interp_run(c, work.path(), nowhere.path(), stdin)
            } else {
                run(nowhere.path(), work.path(), args, stdin, &[])
            };
            assert!(
                start_of(&warm).contains("warm start"),
                "{args:?}: {}",
                start_of(&warm)
            );
            assert_eq!(
                String::from_utf8_lossy(&warm.stdout),
                String::from_utf8_lossy(&cold.stdout),
                "{args:?} (jailed: {jailed})"
            );
            assert_eq!(program_stderr(&warm), program_stderr(&cold), "{args:?}");
            assert_eq!(warm.status.code(), cold.status.code(), "{args:?}");
        }
    }
    // What a zygote cannot reproduce goes cold, and says why.
    let o = run(
        pool.dir.path(),
        work.path(),
        &["-I", "-c", "pass"],
        b"",
        &[],
    );
    assert!(
        start_of(&o).contains("cold start: the interpreter option -I"),
        "{}",
        start_of(&o)
    );
}

#[test]
fn siblings_reseed_their_random_state() {
    // Each value a cold start draws at import or per call: the zygote's modules reseeded
    // (random, multiprocessing's authentication key) or drawing their own (os.urandom, uuid4,
    // tempfile's names after a fork).
    let pool = Pool::start(&["multiprocessing,random,tempfile,uuid"]);
    let work = tempfile::tempdir().unwrap();
    let code = "import random, uuid, os, multiprocessing, tempfile\n\
                print(random.random(), os.urandom(8).hex(), uuid.uuid4(), \
                multiprocessing.current_process().authkey.hex(), \
                os.path.basename(tempfile.mktemp()))";
    let outs: Vec<Output> = (0..3)
        .map(|_| {
            run(
                pool.dir.path(),
                work.path(),
                &["-c", code],
                b"",
                &["--warm"],
            )
        })
        .collect();
    for o in &outs {
        assert!(
            start_of(o).contains("[multiprocessing,random,tempfile,uuid]"),
            "{}",
            start_of(o)
        );
    }
    let lines: Vec<Vec<String>> = outs
        .iter()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .collect();
    for i in 0..5 {
        assert_eq!(lines[0].len(), 5, "{:?}", lines[0]);
        for a in 0..3 {
            for b in a + 1..3 {
                assert_ne!(lines[a][i], lines[b][i], "siblings share value {i}");
            }
        }
    }
}

#[test]
fn each_warm_proc_is_heard_by_its_own_client() {
    let pool = Pool::start(&[]);
    let work = tempfile::tempdir().unwrap();
    for name in ["first", "second"] {
        let trace = work.path().join(format!("{name}.trace"));
        let marker = work.path().join(format!("{name}.marker"));
        std::fs::write(&marker, "x").unwrap();
        let code = format!("open({:?}).read()", marker.to_str().unwrap());
        let flag = format!("--trace={}", trace.display());
        let o = run(
            pool.dir.path(),
            work.path(),
            &["-c", &code],
            b"",
            &["--warm", &flag],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let t = std::fs::read_to_string(&trace).unwrap();
        assert!(
            t.contains(&format!("{name}.marker")),
            "{name}'s trace misses its open: {t}"
        );
        let other = if name == "first" { "second" } else { "first" };
        assert!(!t.contains(&format!("{other}.marker")));
    }
}

#[test]
fn a_killed_zygote_means_a_cold_run_then_a_new_zygote() {
    let pool = Pool::start(&[]);
    let work = tempfile::tempdir().unwrap();
    let (pid, _) = pool.zygote_pids()[0].clone();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let o = run(
        pool.dir.path(),
        work.path(),
        &["-c", "print(6 * 7)"],
        b"",
        &[],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n");
    assert!(o.status.success());
    assert!(start_of(&o).contains("cold start"), "{}", start_of(&o));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains("is gone") && said.contains("starting cold"),
        "{said}"
    );
    let o = run(
        pool.dir.path(),
        work.path(),
        &["-c", "print(6 * 7)"],
        b"",
        &["--warm"],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n");
    assert_ne!(pool.zygote_pids()[0].0, pid);
}

#[test]
fn the_pool_refuses_another_uid() {
    if !nix::unistd::getuid().is_root() {
        eprintln!("skipped: needs root to run a client as nobody");
        return;
    }
    let pool = Pool::start(&[]);
    // The directory is 0700: nobody cannot even reach the socket; let it, to meet SO_PEERCRED.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(pool.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        pool.dir.path().join("pool.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["--no-jail", "--warm", "python3", "-c", "print('ran')"])
        .env("SIGMA_POOL_DIR", pool.dir.path())
        .current_dir("/")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("serves uid 0 only"), "{err}");
    assert!(out.stdout.is_empty());
}

/// `pool --status`, all of it.
fn status_of(dir: &Path) -> String {
    let out = Command::new(BIN)
        .args(["pool", "--status"])
        .env("SIGMA_POOL_DIR", dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `pool --status` once a zygote's line has `want` and is ready (learned zygotes start
/// between requests).
fn status_once(dir: &Path, want: &str) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status_of(dir);
        if s.lines().any(|l| l.contains(want) && l.ends_with(" ready")) {
            return s;
        }
        assert!(Instant::now() < until, "no {want:?} in:\n{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn preloads_learned_from_runs_serve_later_runs() {
    // A module the pool's interpreter finds on its own path (PYTHONPATH, the same for the
    // pool and its runs) that imports in a run but fails in a zygote (the pool's environment
    // says so): it is dropped from learning with one line, and the rest is learned.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("flaky.py"),
        "import os\nif os.environ.get('FLAKY_FAILS'):\n    raise ImportError('flaky fails here')\n",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("pool.log");
    let child = Command::new(BIN)
        .args(["pool", "--no-jail"])
        .env("SIGMA_POOL_DIR", dir.path())
        .env("PYTHONPATH", site.path())
        .env("FLAKY_FAILS", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pool = Pool { dir, child };
    let until = Instant::now() + Duration::from_secs(30);
    while !pool.dir.path().join("pool.sock").exists() {
        assert!(Instant::now() < until, "the pool did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let work = tempfile::tempdir().unwrap();
    // A module beside the script: user code, never preloaded.
    std::fs::write(work.path().join("helper.py"), "X = 'helper'\n").unwrap();
    let script = work.path().join("s.py");
    std::fs::write(
        &script,
        "import json, decimal, helper, flaky\n\
         print(json.dumps([str(decimal.Decimal(1) / 8)]), helper.X)\n",
    )
    .unwrap();
    let nowhere = tempfile::tempdir().unwrap();
    let run_in = |pool_dir: &Path, extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["--no-jail", "--stats"])
            .args(extra)
            .args(["python3", script.to_str().unwrap()])
            .current_dir(work.path())
            .env("SIGMA_POOL_DIR", pool_dir)
            .env("PYTHONPATH", site.path())
            .stdin(Stdio::null());
        c.output().unwrap()
    };
    let cold = run_in(nowhere.path(), &[]);
    assert_eq!(
        String::from_utf8_lossy(&cold.stdout),
        "[\"0.125\"] helper\n",
        "{}",
        String::from_utf8_lossy(&cold.stderr)
    );
    for _ in 0..3 {
        let o = run_in(pool.dir.path(), &["--warm"]);
        assert!(start_of(&o).contains(" [] pid "), "{}", start_of(&o));
        assert_eq!(o.stdout, cold.stdout);
    }
    // Three of the last twenty runs imported json, decimal and flaky from the interpreter's
    // own path (helper from the script's directory): the zygote for all three fails on
    // flaky, which is learned no more; then decimal and json get one.
    let status = status_once(pool.dir.path(), "[decimal,json] learned forks 0 ");
    assert!(!status.contains("helper"), "{status}");
    assert!(
        status.contains("learning refused (failed to import): flaky"),
        "{status}"
    );
    assert!(
        status.contains("learning on: a set imported by 3 of the last 20 runs"),
        "{status}"
    );
    let said = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("cannot preload"))
        .collect();
    assert_eq!(lines.len(), 1, "{said}");
    assert!(
        lines[0].contains("cannot preload flaky: flaky fails here: not learned again"),
        "{said}"
    );
    assert!(
        said.contains("learned preloads [decimal,flaky,json]"),
        "{said}"
    );
    let o = run_in(pool.dir.path(), &["--warm"]);
    assert!(start_of(&o).contains("[decimal,json]"), "{}", start_of(&o));
    assert_eq!(o.stdout, cold.stdout);
    assert_eq!(o.status.code(), cold.status.code());
    // SOCK's rule still holds: a run that does not import both is not served by it.
    let o = run(
        pool.dir.path(),
        work.path(),
        &["-c", "import json; print(json.dumps(1))"],
        b"",
        &["--warm"],
    );
    assert!(!start_of(&o).contains("decimal"), "{}", start_of(&o));
}

/// Corpus programs that differ from bare under `--no-jail` itself, cold as warm, and why.
const NO_JAIL_DIFFERS: [(&str, &str); 2] = [
    (
        "inet_sockets.py",
        "without a σcontainer the proc has no network of its own: inet sockets are refused",
    ),
    (
        "renice_xattr.py",
        "without a pid namespace setpriority is allowed on the caller itself only",
    ),
];

#[test]
fn the_everyday_corpus_runs_warm_as_bare() {
    // Every corpus program bare and as a warm proc (`--no-jail --warm`: a run that could not
    // be warm fails with one line, and differs), as root, with the pool's interpreter; the
    // pool has the runs' environment (no PYTHONPATH, no RUST_LOG). Nobody's runs would need
    // a pool of nobody's (a pool serves its own uid only).
    let user = corpus::As::root();
    let python = interp::python();
    // A warm proc is in the pool's session: the pool leads one of its own, as the corpus's
    // bare and cold runs do (see `corpus::As::command`), so getsid/getpgrp read alike wherever
    // the test runs (a session led from outside the test's pid namespace reads as 0).
    let pool = Pool::start_with(&["--no-jail", "--python", python.to_str().unwrap()], |c| {
        c.env_remove("PYTHONPATH").env_remove("RUST_LOG");
        corpus::own_session(c);
    });
    let dir = pool.dir.path().as_os_str();
    let env = [("SIGMA_POOL_DIR", dir)];
    let diffs = corpus::differences_with(&user, &["--no-jail", "--warm"], &env);
    let (known, unknown): (Vec<String>, Vec<String>) = diffs.into_iter().partition(|d| {
        NO_JAIL_DIFFERS
            .iter()
            .any(|(p, _)| d.starts_with(&format!("{p}:")))
    });
    assert!(
        unknown.is_empty(),
        "{} of {} programs differ warm:\n{}",
        unknown.len(),
        corpus::corpus().len(),
        unknown.join("\n")
    );
    // The known ones differ from bare, and warm exactly as cold --no-jail does.
    assert_eq!(known.len(), NO_JAIL_DIFFERS.len(), "{known:?}");
    let nowhere = tempfile::tempdir().unwrap();
    for (prog, why) in NO_JAIL_DIFFERS {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/everyday")
            .join(prog);
        let args = [python.as_os_str(), path.as_os_str()];
        let run = |flags: &[&str], pool_dir: &std::ffi::OsStr| {
            let mut a: Vec<&std::ffi::OsStr> = flags.iter().map(|f| f.as_ref()).collect();
            a.extend(args);
            let mut c = user.command(Path::new(BIN), &a);
            c.env("SIGMA_POOL_DIR", pool_dir);
            corpus::outcome(c)
        };
        let (cold, cold_err) = run(&["--no-jail"], nowhere.path().as_os_str());
        let (warm, warm_err) = run(&["--no-jail", "--warm"], dir);
        assert_eq!(warm, cold, "{prog} ({why}): {warm_err}\ncold: {cold_err}");
    }
}

#[test]
fn the_everyday_corpus_runs_warm_and_jailed_as_bare() {
    // Every corpus program bare and as a jailed warm proc (`--warm`: a run that could not be
    // warm fails with one line, and differs): each forked by a zygote in its own σcontainer,
    // completing its own (pid, network and mount namespaces, root, Landlock) as root.
    let user = corpus::As::root();
    let python = interp::python();
    let pool = Pool::start_with(&["--python", python.to_str().unwrap()], |c| {
        c.env_remove("PYTHONPATH").env_remove("RUST_LOG");
        corpus::own_session(c);
    });
    let env = [("SIGMA_POOL_DIR", pool.dir.path().as_os_str())];
    let diffs = corpus::differences_with(&user, &["--warm"], &env);
    assert!(
        diffs.is_empty(),
        "{} of {} programs differ warm and jailed:\n{}",
        diffs.len(),
        corpus::corpus().len(),
        diffs.join("\n")
    );
}

#[test]
fn jailed_warm_siblings_see_and_reach_nothing_of_each_other() {
    // Two warm procs of one jailed zygote at once: A beats a heartbeat into its working
    // directory; B, in another, looks for A and its zygote and tries what the zygote itself
    // may do. B sees only its own pid namespace, has no capability and is refused the
    // zygote's calls; A beats on, undisturbed, and ends as it would.
    let pool = Pool::start_with(&[], |_| {});
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let warm = |dir: &Path, code: &str| {
        Command::new(BIN)
            .args(["--warm", "--stats", "python3", "-c", code])
            .env("SIGMA_POOL_DIR", pool.dir.path())
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = warm(
        a_dir.path(),
        "import os, time\nfor i in range(60):\n    open('beat', 'w').write(str(i))\n    time.sleep(0.05)\nprint('a done', os.getpid())",
    );
    let until = Instant::now() + Duration::from_secs(20);
    while !a_dir.path().join("beat").exists() {
        assert!(Instant::now() < until, "A never beat");
        std::thread::sleep(Duration::from_millis(20));
    }
    let b = warm(
        b_dir.path(),
        "import ctypes, os, signal\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         print('pids', sorted(p for p in os.listdir('/proc') if p.isdigit()))\n\
         for pid in range(1, 4096):\n    try:\n        os.kill(pid, signal.SIGKILL if pid > 2 else 0)\n        if pid > 2: print('killed', pid)\n    except OSError:\n        pass\n\
         status = open('/proc/self/status').read()\n\
         print([l.split()[1] for l in status.splitlines() if l.startswith(('CapEff', 'CapBnd', 'CapPrm'))])\n\
         print('unshare', libc.unshare(0x10000000), 'mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n\
         print('pivot', libc.syscall(155, b'/', b'/'), 'setns', libc.setns(0, 0))\n\
         print('beside', os.listdir('..'))",
    );
    let b = b.wait_with_output().unwrap();
    let b_out = String::from_utf8_lossy(&b.stdout);
    let b_err = String::from_utf8_lossy(&b.stderr);
    assert!(start_of(&b).contains("warm start"), "{b_err}");
    assert!(b_out.contains("pids ['1', '2']"), "{b_out}\n{b_err}");
    assert!(!b_out.contains("killed"), "{b_out}");
    assert!(
        b_out.contains("['0000000000000000', '0000000000000000', '0000000000000000']"),
        "{b_out}"
    );
    assert!(
        b_out.contains("unshare -1 mount -1") && b_out.contains("pivot -1 setns -1"),
        "{b_out}"
    );
    // A's directory is beside B's on the host, not in B's view.
    let (a_name, b_name) = (a_dir.path().file_name(), b_dir.path().file_name());
    let beside = b_out
        .lines()
        .find(|l| l.starts_with("beside"))
        .unwrap_or("");
    assert!(
        beside.contains(&*b_name.unwrap().to_string_lossy()),
        "{b_out}"
    );
    assert!(
        !beside.contains(&*a_name.unwrap().to_string_lossy()),
        "{b_out}"
    );
    let beat = || std::fs::read_to_string(a_dir.path().join("beat")).unwrap_or_default();
    let before = beat();
    std::thread::sleep(Duration::from_millis(300));
    let a = a.wait_with_output().unwrap();
    assert!(
        start_of(&a).contains("warm start"),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(a.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&a.stdout), "a done 2\n");
    assert_ne!(beat(), before, "A stopped beating");
    assert_eq!(beat(), "59");
}

#[test]
fn a_killed_jailed_zygote_takes_its_running_proc_and_the_next_run_is_right() {
    // kill -9 of a jailed zygote while its proc runs: the proc ends with it (its pid namespace
    // is inside the zygote's) and its client says so in one line; the next run is cold with
    // its line, the one after warm from a new zygote.
    let pool = Pool::start_with(&[], |_| {});
    let work = tempfile::tempdir().unwrap();
    let warm = |extra: &[&str], code: &str| {
        Command::new(BIN)
            .args(extra)
            .args(["--stats", "python3", "-c", code])
            .env("SIGMA_POOL_DIR", pool.dir.path())
            .current_dir(work.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut running = warm(
        &["--warm"],
        "import time\nprint('up', flush=True)\ntime.sleep(30)\nprint('never')",
    );
    let mut up = [0u8; 3];
    std::io::Read::read_exact(running.stdout.as_mut().unwrap(), &mut up).unwrap();
    assert_eq!(&up, b"up\n");
    let (pid, _) = pool.zygote_pids()[0].clone();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
    let o = running.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("never"));
    assert!(!o.status.success(), "{said}");
    assert!(said.contains("the proc's zygote was killed"), "{said}");
    let o = warm(&[], "print(6 * 7)").wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n");
    assert!(start_of(&o).contains("cold start"), "{}", start_of(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("starting cold"));
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let o = warm(&[], "print(6 * 7)").wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n");
        if start_of(&o).contains("warm start") {
            break;
        }
        assert!(Instant::now() < until, "no new zygote: {}", start_of(&o));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(pool.zygote_pids()[0].0, pid);
}
