//! `sigma-supervise doctor` against what runs do on this machine: the real binary, as root and
//! as nobody (setpriv), real CPython and a published `file://` bucket. Doctor's realm backend
//! line names the backend a realm's `--lazy` run reports on its `--stats` line, its user
//! namespace line whether a run is jailed, its cgroups line whether `--memory` can be had; the
//! test hooks (`SIGMA_SUPERVISE_TEST_NO_USERNS`, `SIGMA_SUPERVISE_TEST_NO_LANDLOCK`) take a
//! feature away from both alike.
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

extern crate fetcher as sigma_fetcher;
#[path = "../../fetcher/tests/common/mod.rs"]
mod common;

mod interp;
use interp::{stderr, stdout};

/// Two published packages (the realm stays incomplete: its runs take the lazy backend), the
/// binary where nobody can run it, a cache root and a work dir per user. Stops the realms'
/// servers and unmounts their images when dropped.
struct Setup {
    tmp: tempfile::TempDir,
    bin: PathBuf,
    bucket: String,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for who in ["root", "nobody"] {
            interp::stop_fuse_servers(&self.tmp.path().join(who).join("cache"), self.tmp.path());
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.tmp.path().to_string_lossy().into_owned();
        for mnt in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if mnt.starts_with(&root) {
                let _ = Command::new("umount").arg(mnt).status();
            }
        }
    }
}

fn setup() -> Setup {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start the supervisor as root and as nobody: run them as root"
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tmp.path().join("sigma-supervise");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_sigma-supervise"), &bin).unwrap();
    }
    let a = common::make_pkg(&tmp.path().join("src"), "demo_z", 100_000);
    let b = common::make_pkg(&tmp.path().join("src"), "demo_y", 1000);
    let dir = tmp.path().join("bucket");
    std::fs::create_dir_all(&dir).unwrap();
    let bucket = format!("file://{}", dir.display());
    let out = interp::supervisor()
        .args(["publish", "--bucket", &bucket])
        .args([&a, &b])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let ok = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&dir)
        .status();
    assert!(ok.unwrap().success());
    for (who, id) in [("root", 0), ("nobody", 65534)] {
        for d in ["cache", "work"] {
            let d = tmp.path().join(who).join(d);
            std::fs::create_dir_all(&d).unwrap();
            nix::unistd::chown(&d, Some(id.into()), Some(id.into())).unwrap();
        }
    }
    Setup { tmp, bin, bucket }
}

impl Setup {
    /// The binary as `who` (root or nobody) in its work dir, `args` first, then its cache root.
    fn cmd(&self, who: &str, args: &[&str]) -> Command {
        let base = self.tmp.path().join(who);
        let mut c = Command::new("setpriv");
        if who == "nobody" {
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        }
        c.arg("--")
            .arg(&self.bin)
            .args(args)
            .arg("--cache-dir")
            .arg(base.join("cache"))
            .current_dir(base.join("work"))
            .env("HOME", interp::home_in(&base.join("work")))
            .env(
                "PATH",
                format!(
                    "{}:/usr/sbin:/usr/bin:/sbin:/bin",
                    interp::python().parent().unwrap().display()
                ),
            )
            .env_remove("RUST_LOG")
            .env_remove("XDG_CACHE_HOME")
            .env_remove("SIGMA_LIB_BUCKET");
        c
    }

    fn doctor(&self, who: &str, env: &[(&str, &str)]) -> Output {
        let o = self
            .cmd(who, &["doctor", "--bucket", &self.bucket])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        eprintln!("--- doctor as {who} {env:?}\n{}{}", stdout(&o), stderr(&o));
        o
    }

    /// A realm run with `--stats` and `extra`, importing demo_z.
    fn run(&self, who: &str, extra: &[&str]) -> Output {
        let mut args = vec![
            "--stats",
            "--no-prefetch",
            "--realm",
            "r",
            "--bucket",
            &self.bucket,
        ];
        args.extend(extra);
        let mut c = self.cmd(who, &args);
        c.args(["python3", "-c", "import demo_z; print('ran')"]);
        let o = c.output().unwrap();
        eprintln!("--- run as {who} {extra:?}\n{}{}", stdout(&o), stderr(&o));
        interp::settled(&self.tmp.path().join(who).join("cache"));
        o
    }
}

/// Doctor's line about `feature` (`ok  FEATURE: ...` or `note FEATURE: ...`).
fn line(o: &Output, feature: &str) -> String {
    let out = stdout(o);
    out.lines()
        .find(|l| l[4..].starts_with(&format!(" {feature}: ")))
        .unwrap_or_else(|| panic!("no `{feature}` line:\n{out}"))
        .to_owned()
}

/// The backend named by a doctor line or a `--stats` realm line: `backend lazy (ext4 image`,
/// `backend lazy (FUSE` or `backend notification`.
fn backend(text: &str) -> &'static str {
    [
        "backend lazy (ext4 image",
        "backend lazy (FUSE",
        "backend notification",
    ]
    .into_iter()
    .find(|b| text.contains(b))
    .unwrap_or_else(|| panic!("no backend in: {text}"))
}

#[test]
fn doctor_names_the_backend_and_the_jail_a_run_takes_as_root_and_as_nobody() {
    let s = setup();
    for who in ["root", "nobody"] {
        let d = s.doctor(who, &[]);
        let jailed = line(&d, "user namespaces").starts_with("ok ");
        assert_eq!(d.status.success(), jailed, "exit status follows the jail");
        let bucket = line(&d, "bucket");
        assert!(
            bucket.contains("reachable") && bucket.contains("(2 packages)"),
            "{bucket}"
        );
        // --memory needs the cgroup hierarchy doctor names (else the run fails, saying so).
        let cg = line(&d, "cgroups").starts_with("ok ");
        let o = s
            .cmd(who, &["--memory", "256M", "/bin/true"])
            .output()
            .unwrap();
        assert_eq!(o.status.success(), cg && jailed, "{}", stderr(&o));
        let said = backend(&line(&d, "realm backend"));
        // The realm's first run takes its index snapshot (served by notification); the second,
        // with --lazy, gets the backend the host allows at once.
        let first = s.run(who, &[]);
        assert_eq!(first.status.success(), jailed, "{}", stderr(&first));
        let second = s.run(who, &["--lazy"]);
        assert_eq!(stdout(&second), if jailed { "ran\n" } else { "" });
        let realm = stderr(&second)
            .lines()
            .find(|l| l.starts_with("sigma-supervise realm "))
            .map(str::to_owned);
        if jailed {
            let realm = realm.expect("a realm line");
            assert_eq!(
                backend(&realm),
                said,
                "doctor as {who}: {said}; the run: {realm}"
            );
        }
    }
}

#[test]
fn without_landlock_doctor_says_so_and_the_run_goes_without_its_second_layer() {
    let s = setup();
    let hook = [("SIGMA_SUPERVISE_TEST_NO_LANDLOCK", "1")];
    let d = s.doctor("root", &hook);
    assert!(
        d.status.success(),
        "Landlock is a second layer: the proc is still jailed"
    );
    let l = line(&d, "Landlock");
    assert!(
        l.starts_with("note") && l.contains("without its second layer"),
        "{l}"
    );
    assert!(
        l.contains("to change: a kernel with CONFIG_SECURITY_LANDLOCK"),
        "{l}"
    );
    let o = s
        .cmd("root", &[])
        .args(["python3", "-c", "print('ran')"])
        .envs(hook)
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "ran\n", "{}", stderr(&o));
    assert!(
        stderr(&o).contains("Landlock is not available on this kernel"),
        "{}",
        stderr(&o)
    );
    // Without the hook both have it (this machine's kernel has Landlock).
    assert!(line(&s.doctor("root", &[]), "Landlock").starts_with("ok "));
}

#[test]
fn without_user_namespaces_doctor_fails_and_names_no_jail_as_runs_fail() {
    let s = setup();
    let hook = [("SIGMA_SUPERVISE_TEST_NO_USERNS", "1")];
    for who in ["root", "nobody"] {
        let d = s.doctor(who, &hook);
        assert_eq!(d.status.code(), Some(1), "no jail: doctor fails");
        let l = line(&d, "user namespaces");
        assert!(
            l.starts_with("note") && l.contains("a proc cannot be jailed"),
            "{l}"
        );
        assert!(l.contains("--no-jail"), "{l}");
        let run = |extra: &[&str]| {
            let mut c = s.cmd(who, extra);
            c.args(["python3", "-c", "print('ran')"])
                .envs(hook)
                .output()
                .unwrap()
        };
        let o = run(&[]);
        assert!(!o.status.success(), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("user namespaces are not available"),
            "{}",
            stderr(&o)
        );
        // The fallback doctor names runs.
        let o = run(&["--no-jail"]);
        assert_eq!(stdout(&o), "ran\n", "{}", stderr(&o));
    }
    // Without the hook, this machine jails both.
    assert!(s.doctor("nobody", &[]).status.success());
}

#[test]
fn an_unreachable_bucket_is_named_and_does_not_fail_doctor() {
    let s = setup();
    let o = s
        .cmd(
            "root",
            &["doctor", "--bucket", "file:///nonexistent/bucket"],
        )
        .output()
        .unwrap();
    let l = line(&o, "bucket");
    assert!(
        l.starts_with("note") && l.contains("/nonexistent/bucket"),
        "{l}"
    );
    // A directory's fix is the directory's, not a cloud account's.
    assert!(
        l.contains("the directory must exist") && !l.contains("AWS"),
        "{l}"
    );
    assert!(
        o.status.success(),
        "a bucket's reach is not the jail's: {}",
        stdout(&o)
    );
    assert!(!Path::new("/nonexistent/bucket").exists());
}

/// Where the sysctls allow user namespaces but something around the process refuses them (an
/// LSM such as AppArmor's userns restriction; here the real seccomp filter of a `--no-jail`
/// run), doctor's probe makes the call a run makes and reports the refusal, failing as the
/// run would, rather than reading the sysctls and saying ok.
#[test]
fn user_namespaces_refused_despite_the_sysctls_are_found_by_a_real_probe() {
    let s = setup();
    let bin = s.bin.to_str().unwrap().to_owned();
    for who in ["root", "nobody"] {
        let o = s
            .cmd(who, &["--no-jail", "--", &bin, "doctor"])
            .output()
            .unwrap();
        eprintln!(
            "--- doctor under a filter as {who}\n{}{}",
            stdout(&o),
            stderr(&o)
        );
        let l = line(&o, "user namespaces");
        assert!(
            l.starts_with("note") && l.contains("refused") && l.contains("EPERM"),
            "{l}"
        );
        assert!(l.contains("apparmor_restrict_unprivileged_userns"), "{l}");
        // The filter refuses Landlock's call too: named as a refusal, not as a kernel without it.
        let l = line(&o, "Landlock");
        assert!(
            l.contains("refused here") && !l.contains("not available"),
            "{l}"
        );
        let l = line(&o, "seccomp user-notify");
        assert!(l.contains("already runs under a seccomp filter"), "{l}");
        assert_eq!(o.status.code(), Some(1), "no jail: doctor fails");
    }
    // The same probe outside the filter finds them usable.
    let d = s.doctor("nobody", &[]);
    assert!(line(&d, "user namespaces").starts_with("ok "));
}
