//! The escape suite: a hostile proc (tests/escape/attacks.py) tries each class of escape from
//! inside the σcontainer, under both builtin profiles, started by root and by an unprivileged
//! user; every test judges from outside that the attack's effect did not happen — the file is
//! unchanged, the decoy process alive and unstopped, the secret never printed.
//!
//! With `SIGMA_ESCAPE_WARM=1` every attack runs as a warm proc instead (`--warm`): forked by
//! a jailed zygote of a pool of the starter's own (root's, nobody's), completing its own
//! σcontainer, without `-I` (an interpreter option keeps a run cold).
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const PROFILES: [&str; 2] = ["sigmaos", "permissive"];
/// The unprivileged user the suite runs as (nobody).
const NOBODY: u32 = 65534;

/// Files the unprivileged runs use, reachable by nobody: the binary (hard-linked, else copied)
/// and the attack script, in a 0755 directory.
fn shared() -> &'static (PathBuf, PathBuf) {
    static S: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    S.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("sigma-escape.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("sigma-supervise");
        let src = env!("CARGO_BIN_EXE_sigma-supervise");
        let _ = std::fs::remove_file(&bin);
        if std::fs::hard_link(src, &bin).is_err() {
            std::fs::copy(src, &bin).unwrap();
        }
        let script = dir.join("attacks.py");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/escape/attacks.py"),
            &script,
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        (bin, script)
    })
}

/// Whether the attacks run as warm procs (`SIGMA_ESCAPE_WARM=1`).
fn warm() -> bool {
    std::env::var_os("SIGMA_ESCAPE_WARM").is_some_and(|v| v == "1")
}

/// The socket directory of the pool for `ctx`'s runs (root's or nobody's, its profile),
/// started on first use: `sigma-supervise pool --python /usr/bin/python3 --profile P` as that
/// user, ended once this test process is gone.
fn pool_dir(ctx: Ctx) -> &'static Path {
    static POOLS: [OnceLock<PathBuf>; 4] = [const { OnceLock::new() }; 4];
    let profile = PROFILES.iter().position(|p| *p == ctx.profile).unwrap();
    let unprivileged = ctx.unprivileged;
    let i = usize::from(unprivileged) * 2 + profile;
    POOLS[i].get_or_init(|| {
        let (bin, _) = shared();
        let dir =
            std::env::temp_dir().join(format!("sigma-escape-pool.{}.{i}", std::process::id(),));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if unprivileged {
            for d in [&dir, &home] {
                nix::unistd::chown(d.as_path(), Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
            }
        }
        let watch = format!(
            "\"$0\" pool --python /usr/bin/python3 --profile {} & p=$!; \
             while [ -d /proc/{} ] && kill -0 $p 2>/dev/null; do sleep 0.5; done; kill $p; wait $p; rm -rf \"$SIGMA_POOL_DIR\"",
            ctx.profile,
            std::process::id()
        );
        let mut c = Command::new("setpriv");
        if unprivileged {
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        }
        // Not waited for: the watcher ends it once this process is gone.
        #[allow(clippy::zombie_processes)]
        c.args(["--", "sh", "-c", &watch])
            .arg(bin)
            .current_dir(&home)
            .env("HOME", &home)
            .env("SIGMA_POOL_DIR", &dir)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        while !dir.join("pool.sock").exists() {
            assert!(Instant::now() < until, "the pool did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        dir
    })
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// One way of running the supervisor: profile × (root | unprivileged).
#[derive(Clone, Copy, Debug)]
struct Ctx {
    profile: &'static str,
    unprivileged: bool,
}

fn contexts() -> Vec<Ctx> {
    let mut v = Vec::new();
    for profile in PROFILES {
        v.push(Ctx {
            profile,
            unprivileged: false,
        });
        if is_root() {
            v.push(Ctx {
                profile,
                unprivileged: true,
            });
        }
    }
    v
}

/// A working directory the proc's starter owns (the proc sees it read-write).
fn workdir(ctx: Ctx) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if ctx.unprivileged {
        nix::unistd::chown(d.path(), Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
    }
    d
}

impl Ctx {
    /// The run's `HOME`: `cwd/home`, the starter's own (a working directory that is the home
    /// is not shown; `a_working_directory_that_is_a_home_or_shared_is_not_shown` runs that
    /// case).
    fn home_in(self, cwd: &Path) -> PathBuf {
        let home = cwd.join("home");
        std::fs::create_dir_all(&home).unwrap();
        if self.unprivileged {
            nix::unistd::chown(&home, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
        }
        home
    }

    fn command(self, cwd: &Path, extra: &[&str], attack: &[&str]) -> Command {
        self.command_with_home(cwd, &self.home_in(cwd), extra, attack)
    }

    fn command_with_home(
        self,
        cwd: &Path,
        home: &Path,
        extra: &[&str],
        attack: &[&str],
    ) -> Command {
        let (bin, script) = shared();
        let mut c = if self.unprivileged {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--",
            ]);
            c.arg(bin);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_sigma-supervise"))
        };
        c.current_dir(cwd)
            .env_remove("RUST_LOG")
            // The supervisor's cache and scratch go under the working directory (and must be
            // hidden there).
            .env("HOME", home)
            .env_remove("XDG_CACHE_HOME")
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .args(["--profile", self.profile])
            .args(extra);
        // A run with a terminal on its stdio starts cold (its jail has /dev/tty; a zygote's not).
        if warm() && attack != ["tiocsti"] {
            c.env("SIGMA_POOL_DIR", pool_dir(self))
                .args(["--warm", "/usr/bin/python3"]);
        } else {
            c.args(["/usr/bin/python3", "-I"]);
        }
        c.arg(script).args(attack).stdin(Stdio::null());
        c
    }

    fn run(self, cwd: &Path, extra: &[&str], attack: &[&str]) -> Output {
        self.finish(self.command(cwd, extra, attack), attack)
    }

    fn finish(self, mut c: Command, attack: &[&str]) -> Output {
        let o = c.output().unwrap();
        eprintln!(
            "[{self:?}] {attack:?} status {:?}\n--- stdout\n{}--- stderr\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("attack done"),
            "[{self:?}] the attack did not run to its end"
        );
        o
    }
}

const SECRET: &str = "sigma-escape-secret-4f1c9a";

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A host file with a secret in it, in a directory the jail does not show, readable by nobody
/// on the host (so only the jail stands in the way).
fn secret_file() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let f = d.path().join("secret.txt");
    write_with_mode(&f, SECRET, 0o666);
    (d, f)
}

/// `contents` at `path`, with `mode` whatever the umask.
fn write_with_mode(path: &Path, contents: &str, mode: u32) {
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A long-lived decoy process outside the jail, owned by the same host user as the proc.
fn decoy(ctx: Ctx) -> Child {
    let mut c = if ctx.unprivileged {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "sleep",
            "300",
        ]);
        c
    } else {
        let mut c = Command::new("sleep");
        c.arg("300");
        c
    };
    c.env("AWS_SECRET_ACCESS_KEY", SECRET).spawn().unwrap()
}

fn proc_state(pid: u32) -> (char, String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = stat
        .rsplit(')')
        .next()
        .unwrap()
        .trim()
        .chars()
        .next()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let tracer = status
        .lines()
        .find(|l| l.starts_with("TracerPid:"))
        .unwrap()
        .to_owned();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    (state, tracer, limits)
}

fn assert_decoy_untouched(ctx: Ctx, d: &mut Child, before: &(char, String, String)) {
    assert!(
        d.try_wait().unwrap().is_none(),
        "[{ctx:?}] decoy was killed"
    );
    let now = proc_state(d.id());
    assert_eq!(
        now.0, 'S',
        "[{ctx:?}] decoy state {} (stopped or traced?)",
        now.0
    );
    assert_eq!(now.1, before.1, "[{ctx:?}] decoy got a tracer");
    assert_eq!(now.2, before.2, "[{ctx:?}] decoy's limits changed");
}

#[test]
fn host_secrets_are_not_readable() {
    let (_d, secret) = secret_file();
    let s = secret.display().to_string();
    for ctx in contexts() {
        let w = workdir(ctx);
        let o = ctx.run(
            w.path(),
            &[],
            &[
                "read_secret",
                "/etc/shadow",
                "/etc/gshadow",
                &s,
                &format!("/proc/1/root{s}"),
                "/root/.bash_history",
            ],
        );
        let text = out(&o);
        assert!(!text.contains(SECRET), "[{ctx:?}] secret leaked");
        assert!(
            !text.contains("read /etc/shadow OK"),
            "[{ctx:?}] shadow read"
        );
        if let Ok(shadow) = std::fs::read_to_string("/etc/shadow") {
            let first = shadow.lines().next().unwrap_or("root:");
            assert!(!text.contains(first), "[{ctx:?}] shadow content leaked");
        }
    }
}

#[test]
fn writes_outside_the_binds_do_not_land() {
    let (_d, decoy_file) = secret_file();
    let s = decoy_file.display().to_string();
    for ctx in contexts() {
        let w = workdir(ctx);
        let hostname = std::fs::read("/etc/hostname").unwrap_or_default();
        // A file of the curated /etc the jail shows as a copy (see jail's `Bind::copy`).
        let hosts = std::fs::read("/etc/hosts").unwrap_or_default();
        let o = ctx.run(
            w.path(),
            &[],
            &[
                "write_outside",
                &s,
                &format!("/proc/1/root{s}"),
                "/etc/hostname",
                "/etc/passwd",
                "/etc/hosts",
                "/usr/lib/os-release",
            ],
        );
        assert_eq!(
            std::fs::read_to_string(&decoy_file).unwrap(),
            SECRET,
            "[{ctx:?}] {}",
            out(&o)
        );
        assert_eq!(std::fs::read("/etc/hostname").unwrap_or_default(), hostname);
        assert_eq!(std::fs::read("/etc/hosts").unwrap_or_default(), hosts);
        assert!(Path::new("/usr/lib/os-release").exists());
    }
}

#[test]
fn a_working_directory_that_is_a_home_or_shared_is_not_shown() {
    for ctx in contexts() {
        // Started from the user's home: its dotfiles and keys stay out of reach (root's would
        // be the proc's own to rewrite through the idmapped bind a shown cwd gets).
        let w = workdir(ctx);
        let (rc, key) = (w.path().join(".bashrc"), w.path().join(".ssh/id_ed25519"));
        std::fs::write(&rc, "# the user's shell start-up\n").unwrap();
        std::fs::create_dir_all(key.parent().unwrap()).unwrap();
        write_with_mode(&key, SECRET, 0o644);
        let (rc_s, key_s) = (rc.display().to_string(), key.display().to_string());
        let c = ctx.command_with_home(
            w.path(),
            w.path(),
            &[],
            &["read_secret", &key_s, ".ssh/id_ed25519"],
        );
        let o = ctx.finish(c, &["read_secret"]);
        assert!(
            !out(&o).contains(SECRET),
            "[{ctx:?}] a key of the home leaked"
        );
        assert!(
            out(&o).contains("is a home directory"),
            "[{ctx:?}] {}",
            out(&o)
        );
        let attack = ["write_outside", &rc_s, ".bashrc", ".profile"];
        let o = ctx.finish(
            ctx.command_with_home(w.path(), w.path(), &[], &attack),
            &attack,
        );
        assert_eq!(
            std::fs::read_to_string(&rc).unwrap(),
            "# the user's shell start-up\n",
            "[{ctx:?}] {}",
            out(&o)
        );
        assert!(!w.path().join(".profile").exists(), "[{ctx:?}] {}", out(&o));

        // Started from a directory every user shares (sticky, world-writable, like /tmp): the
        // files others left there are neither readable nor rewritable.
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let (left, theirs) = (t.path().join("left.txt"), t.path().join("theirs.txt"));
        write_with_mode(&left, SECRET, 0o644);
        write_with_mode(&theirs, "theirs\n", 0o666);
        let o = ctx.run(t.path(), &[], &["read_secret", "left.txt"]);
        assert!(
            !out(&o).contains(SECRET),
            "[{ctx:?}] another user's file leaked"
        );
        let o = ctx.run(t.path(), &[], &["write_outside", "theirs.txt", "mine.txt"]);
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "theirs\n",
            "[{ctx:?}] {}",
            out(&o)
        );
        assert!(!t.path().join("mine.txt").exists(), "[{ctx:?}] {}", out(&o));
    }
}

#[test]
fn no_setuid_file_can_be_planted() {
    for ctx in contexts() {
        let w = workdir(ctx);
        let dir = w.path().display().to_string();
        let o = ctx.run(w.path(), &[], &["setuid", &dir]);
        for e in std::fs::read_dir(w.path()).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            assert_eq!(
                m.mode() & 0o6000,
                0,
                "[{ctx:?}] {} is setuid/setgid on the host (uid {}): {}",
                e.path().display(),
                m.uid(),
                out(&o)
            );
        }
    }
}

#[test]
fn a_path_named_on_the_command_line_is_not_shown_by_being_named() {
    // Whoever spawns a proc chooses its arguments: naming a host file there (directly, or
    // through a symlink an earlier proc planted in its working directory) shows nothing.
    for ctx in contexts() {
        let w = workdir(ctx);
        // Elsewhere on the host: a file the proc's user could read, were it shown.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = elsewhere.path().join("key");
        write_with_mode(&key, SECRET, 0o644);
        std::os::unix::fs::symlink(&key, w.path().join("data.csv")).unwrap();
        for named in ["data.csv".to_owned(), key.display().to_string()] {
            let o = ctx.run(w.path(), &[], &["read_secret", &named]);
            assert!(!out(&o).contains(SECRET), "[{ctx:?}] {named}: {}", out(&o));
        }
        // Shown when asked for.
        let k = key.display().to_string();
        let o = ctx.run(w.path(), &["--bind", &k], &["read_secret", &k]);
        assert!(out(&o).contains(SECRET), "[{ctx:?}] --bind: {}", out(&o));
    }
}

#[test]
fn the_session_keyring_it_was_started_from_is_out_of_reach() {
    use std::os::unix::process::CommandExt as _;
    for ctx in contexts() {
        let w = workdir(ctx);
        let mut c = ctx.command(w.path(), &[], &["keyring"]);
        // SAFETY: between fork and exec the hook only makes system calls (no allocation: the
        // strings are static), as pre_exec requires.
        unsafe {
            c.pre_exec(|| {
                // A session keyring of the starter's own, holding a secret any possessor may read.
                let r = libc::syscall(libc::SYS_keyctl, 1, c"sigma-escape".as_ptr());
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    c"escape-secret".as_ptr(),
                    SECRET.as_ptr(),
                    SECRET.len(),
                    -3i32, // KEY_SPEC_SESSION_KEYRING
                );
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let o = ctx.finish(c, &["keyring"]);
        let text = out(&o);
        assert!(text.contains("attack done"), "[{ctx:?}] {text}");
        assert!(!text.contains(SECRET), "[{ctx:?}] the key was read: {text}");
    }
}

#[test]
fn bucket_and_cache_are_neither_visible_nor_writable() {
    for ctx in contexts() {
        let w = workdir(ctx);
        // The supervisor's state inside the working directory: a file:// bucket and the cache.
        let bucket = w.path().join("bucket");
        let cache = w.path().join("cache");
        for d in [&bucket, &cache] {
            std::fs::create_dir_all(d.join("b")).unwrap();
            std::fs::write(d.join("b/object"), SECRET).unwrap();
            if ctx.unprivileged {
                for p in [d.clone(), d.join("b"), d.join("b/object")] {
                    nix::unistd::chown(&p, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
                }
            }
        }
        let s3 = format!("file://{}", bucket.display());
        let cache_arg = cache.display().to_string();
        let bo = bucket.join("b/object").display().to_string();
        let co = cache.join("b/object").display().to_string();
        let o = ctx.run(
            w.path(),
            &["--s3", &s3, "--cache-dir", &cache_arg],
            &["write_outside", &bo, &co],
        );
        let o2 = ctx.run(
            w.path(),
            &["--s3", &s3, "--cache-dir", &cache_arg],
            &["read_secret", &bo, &co],
        );
        assert!(
            !out(&o2).contains(SECRET),
            "[{ctx:?}] bucket or cache readable"
        );
        for f in [bucket.join("b/object"), cache.join("b/object")] {
            assert_eq!(
                std::fs::read_to_string(&f).unwrap(),
                SECRET,
                "[{ctx:?}] {} changed: {}",
                f.display(),
                out(&o)
            );
        }
    }
}

#[test]
fn proc_files_of_the_supervisor_and_others_are_out_of_reach() {
    for ctx in contexts() {
        let w = workdir(ctx);
        let mut d = decoy(ctx);
        let before = proc_state(d.id());
        let me = std::process::id().to_string();
        for pid in [d.id().to_string(), me, "1".into()] {
            let o = ctx.run(w.path(), &[], &["proc_of", &pid, "/etc/shadow"]);
            let text = out(&o);
            assert!(!text.contains(SECRET), "[{ctx:?}] environ of {pid} leaked");
            assert!(
                !text.contains("mem write OK"),
                "[{ctx:?}] wrote {pid}'s memory"
            );
        }
        assert_decoy_untouched(ctx, &mut d, &before);
        let _ = d.kill();
        let _ = d.wait();
    }
}

#[test]
fn processes_outside_cannot_be_signalled_limited_or_traced() {
    for ctx in contexts() {
        let w = workdir(ctx);
        let mut d = decoy(ctx);
        let before = proc_state(d.id());
        let pid = d.id().to_string();
        let me = std::process::id().to_string();
        ctx.run(w.path(), &[], &["signal_outside", &pid]);
        ctx.run(w.path(), &[], &["signal_outside", &me]);
        ctx.run(w.path(), &[], &["ptrace", &pid]);
        assert_decoy_untouched(ctx, &mut d, &before);
        let _ = d.kill();
        let _ = d.wait();
    }
}

#[test]
fn tiocsti_cannot_push_input_into_the_terminal() {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    for ctx in contexts() {
        let w = workdir(ctx);
        let pty = nix::pty::openpty(None, None).unwrap();
        if ctx.unprivileged {
            let _ = nix::unistd::fchown(&pty.slave, Some(NOBODY.into()), None);
        }
        let slave = std::fs::File::from(pty.slave.try_clone().unwrap());
        let mut c = ctx.command(w.path(), &[], &["tiocsti"]);
        c.stdin(slave.try_clone().unwrap());
        let o = c.output().unwrap();
        eprintln!("[{ctx:?}] {}", out(&o));
        assert!(out(&o).contains("attack done"));
        // Whatever was pushed would now be waiting as input on the terminal.
        let flags = fcntl(&slave, FcntlArg::F_GETFL).unwrap();
        fcntl(
            &slave,
            FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
        )
        .unwrap();
        let mut buf = [0u8; 64];
        let got = (&slave).read(&mut buf).unwrap_or(0);
        assert_eq!(got, 0, "[{ctx:?}] input was injected: {:?}", &buf[..got]);
    }
}

#[test]
fn a_fork_bomb_hits_the_process_cap_and_the_supervisor_stays_responsive() {
    for ctx in contexts() {
        let w = workdir(ctx);
        let o = ctx.run(
            w.path(),
            &["--pids", "64", "--grace", "0.2"],
            &["fork_bomb"],
        );
        let text = out(&o);
        let n: u32 = text
            .lines()
            .find_map(|l| l.strip_prefix("fork failed after "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("[{ctx:?}] forks never failed: {text}"));
        assert!(n < 64, "[{ctx:?}] forked {n} processes with --pids 64");
        assert_eq!(
            o.status.code(),
            Some(0),
            "[{ctx:?}] supervisor did not finish cleanly"
        );
    }
}

#[test]
fn a_flood_of_refused_calls_is_refused_in_the_kernel() {
    // syslog(2) is outside the sigmaos profile: each call is refused by the filter itself.
    let ctx = Ctx {
        profile: "sigmaos",
        unprivileged: false,
    };
    let w = workdir(ctx);
    let o = ctx.run(w.path(), &["--stats"], &["flood", "103", "20000"]);
    let text = out(&o);
    assert!(text.contains("refused 20000"), "{text}");
    let notified: u64 = text
        .lines()
        .filter(|l| l.trim_start().starts_with("syslog"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum();
    assert_eq!(notified, 0, "refusals reached the supervisor: {text}");
}

#[test]
fn unmount_unshare_and_open_by_handle_get_nothing() {
    let (_d, secret) = secret_file();
    for ctx in contexts() {
        let w = workdir(ctx);
        let cache = w.path().join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::write(cache.join("x"), SECRET).unwrap();
        if ctx.unprivileged {
            nix::unistd::chown(&cache, Some(NOBODY.into()), Some(NOBODY.into())).unwrap();
        }
        let c = cache.display().to_string();
        let o = ctx.run(
            w.path(),
            &["--cache-dir", &c],
            &["unmount", &c, "/proc", "/"],
        );
        assert!(!out(&o).contains(SECRET), "[{ctx:?}] hidden cache revealed");
        assert!(!out(&o).contains("umount / OK"), "[{ctx:?}]");
        let o = ctx.run(w.path(), &[], &["by_handle", "/etc/hostname"]);
        assert!(!out(&o).contains("open_by_handle_at OK"), "[{ctx:?}]");
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), SECRET);
    }
}

#[test]
fn the_proc_has_no_capability_and_is_not_root() {
    for ctx in contexts() {
        let w = workdir(ctx);
        let o = ctx.run(w.path(), &[], &["show", "/proc/self/status"]);
        let status = String::from_utf8_lossy(&o.stdout);
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let line = status
                .lines()
                .find(|l| l.starts_with(set))
                .unwrap_or_else(|| panic!("{status}"));
            assert!(line.ends_with("0000000000000000"), "[{ctx:?}] {line}");
        }
        assert!(status.contains("NoNewPrivs:\t1"), "[{ctx:?}]");
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid.split_whitespace().skip(1).all(|u| u == "1000"),
            "[{ctx:?}] {uid}"
        );
    }
}

#[test]
fn everyday_runs_work_for_root_and_for_an_unprivileged_user() {
    // The same programs behave the same whoever starts the supervisor.
    let code = "import json, subprocess, sys, os, tempfile\n\
                d = tempfile.mkdtemp(); open(os.path.join(d, 'f'), 'w').write('x')\n\
                r = subprocess.run([sys.executable, '-c', 'import sys; sys.exit(3)'])\n\
                open('out.txt', 'w').write('written')\n\
                print(json.dumps({'rc': r.returncode, 'uid': os.getuid(), 'pid': os.getpid()}))";
    for ctx in contexts() {
        let w = workdir(ctx);
        let mut c = if ctx.unprivileged {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(&shared().0);
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_sigma-supervise"))
        };
        let o = c
            .current_dir(w.path())
            .env("HOME", ctx.home_in(w.path()))
            .env_remove("XDG_CACHE_HOME")
            .args(["--profile", ctx.profile, "/usr/bin/python3", "-c", code])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "[{ctx:?}] {}", out(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            r#"{"rc": 3, "uid": 1000, "pid": 2}"#,
            "[{ctx:?}]"
        );
        // The working directory is the proc's: the file landed, owned by the starter.
        let f = w.path().join("out.txt");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "written");
        let uid = std::fs::metadata(&f).unwrap().uid();
        assert_eq!(uid, if ctx.unprivileged { NOBODY } else { 0 }, "[{ctx:?}]");
    }
}

/// A proc (and a child of it in a session of its own) does not outlive its supervisor: killed
/// with SIGKILL, the supervisor takes the whole jail with it (init's parent-death signal, kept
/// across its change of uid, then the pid namespace). Asserted on what the processes do: their
/// heartbeat files stop changing.
#[test]
fn a_proc_does_not_outlive_its_killed_supervisor() {
    use std::io::BufRead as _;
    for ctx in contexts() {
        let w = workdir(ctx);
        let mut child = ctx
            .command(w.path(), &[], &["outlive"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let n = lines
                .by_ref()
                .take(2)
                .filter(|l| l.as_ref().is_ok_and(|l| l.starts_with("up ")))
                .count();
            let _ = tx.send(n);
            // Drained until every holder of the pipe is gone.
            for _ in lines {}
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)).ok(),
            Some(2),
            "[{ctx:?}] the proc and its child did not start"
        );
        let beats = |d: &Path| -> Vec<(String, String)> {
            let mut v: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("heartbeat-"))
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name, std::fs::read_to_string(e.path()).unwrap_or_default())
                })
                .collect();
            v.sort();
            v
        };
        let start = Instant::now();
        while beats(w.path()).len() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "[{ctx:?}] no heartbeat"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let before = beats(w.path());
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(
            beats(w.path()),
            before,
            "[{ctx:?}] the proc still runs after its supervisor was killed"
        );
    }
}
