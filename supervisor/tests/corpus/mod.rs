//! The everyday corpus (`tests/everyday/*.py`) and its harness: each program run bare and under
//! `sigma-supervise`, as root or as nobody, bounded; the differences described. Shared by
//! everyday.rs (the supervisor's configurations) and pool.rs (warm procs).
#![allow(dead_code)] // each test crate uses a part

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::interp;

/// Longest any corpus program may take (they take ~2.5 s at most): past it, the run hung.
pub const HANG: Duration = Duration::from_secs(120);
/// The unprivileged identity (nobody/nogroup).
pub const NOBODY: &str = "65534";

pub fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/everyday");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .collect();
    v.sort();
    assert!(v.len() >= 12, "the corpus is in {}", dir.display());
    v
}

#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub code: Option<i32>,
}

/// Run `cmd` to the end (or kill it after [`HANG`]); stderr is kept for the failure message.
pub fn outcome(mut cmd: Command) -> (Outcome, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap()).into_owned();
    let Some(status) = status else {
        return (
            Outcome {
                stdout,
                code: Some(-1),
            },
            format!("HUNG (killed after {HANG:?})\n{stderr}"),
        );
    };
    (
        Outcome {
            stdout,
            code: status.code(),
        },
        stderr,
    )
}

/// A user the corpus runs as: root with the project's interpreter, or nobody.
pub struct As {
    pub python: PathBuf,
    pub nobody: bool,
    /// HOME and working directory (nobody's own when unprivileged).
    pub home: tempfile::TempDir,
}

impl As {
    pub fn root() -> As {
        As {
            python: interp::python().to_owned(),
            nobody: false,
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// nobody, with an interpreter nobody can reach (the project's pyenv interpreter may live
    /// under root's home).
    pub fn nobody() -> As {
        let setpriv = Path::new("/usr/bin/setpriv");
        assert!(
            setpriv.exists(),
            "setpriv (util-linux) is needed to run the corpus as an unprivileged user"
        );
        let python = [interp::python(), Path::new("/usr/bin/python3")]
            .into_iter()
            .find(|p| {
                Command::new(setpriv)
                    .args(nobody_args())
                    .arg(p)
                    // Its own executable and stdlib must be reachable (subprocess runs it).
                    .args([
                        "-c",
                        "import os, sys, json; assert os.access(sys.executable, os.X_OK)",
                    ])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .expect("no python3 that nobody (uid 65534) can run: install Debian's python3")
            .to_owned();
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        nix::unistd::chown(
            home.path(),
            Some(nix::unistd::Uid::from_raw(65534)),
            Some(nix::unistd::Gid::from_raw(65534)),
        )
        .unwrap();
        As {
            python,
            nobody: true,
            home,
        }
    }

    /// `program args...` as this user, from its home.
    pub fn command(&self, program: &Path, args: &[&std::ffi::OsStr]) -> Command {
        let mut c = if self.nobody {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(nobody_args()).arg(program);
            c
        } else {
            Command::new(program)
        };
        c.args(args)
            .current_dir(self.home.path())
            .env("HOME", interp::home_in(self.home.path()))
            .env_remove("RUST_LOG")
            .env_remove("PYTHONPATH");
        // Bare and supervised alike lead a session of their own, as a program started with its
        // output captured and no terminal does.
        own_session(&mut c);
        c
    }
}

/// `c` starts as the leader of a session of its own: otherwise what it sees of its session
/// depends on where the test runs (a session led from outside the test's pid namespace reads
/// as 0).
pub fn own_session(c: &mut Command) {
    // SAFETY: between fork and exec the hook makes one system call and allocates nothing, as
    // pre_exec requires.
    unsafe {
        c.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
}

pub fn nobody_args() -> [String; 3] {
    [
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".to_owned(),
    ]
}

/// Every corpus program bare and supervised (with `sup_args`): the differences, described.
pub fn differences(user: &As, sup_args: &[&str]) -> Vec<String> {
    differences_with(user, sup_args, &[])
}

/// As [`differences`], the supervised runs with `env` besides.
pub fn differences_with(
    user: &As,
    sup_args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Vec<String> {
    let sup = PathBuf::from(env!("CARGO_BIN_EXE_sigma-supervise"));
    let mut diffs = Vec::new();
    for prog in corpus() {
        let name = prog.file_name().unwrap().to_string_lossy().into_owned();
        let py = user.python.as_os_str();
        let (bare, bare_err) = outcome(user.command(&user.python, &[prog.as_os_str()]));
        let mut args: Vec<&std::ffi::OsStr> = sup_args.iter().map(|a| a.as_ref()).collect();
        args.extend([py, prog.as_os_str()]);
        let mut cmd = user.command(&sup, &args);
        cmd.envs(env.iter().copied());
        let (supervised, sup_err) = outcome(cmd);
        assert!(
            bare.code.is_some_and(|c| c >= 0) && !bare.stdout.is_empty(),
            "{name} does not run bare: {bare:?}\n{bare_err}"
        );
        if bare != supervised {
            diffs.push(format!(
                "{name}: bare {bare:?}\n  supervised {supervised:?}\n  stderr: {sup_err}"
            ));
        }
    }
    diffs
}
