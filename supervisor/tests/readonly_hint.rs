//! The read-only hint: with `--stats` (or `--trace`), a write the σcontainer refuses because it
//! shows the directory read-only fails exactly as on a read-only mount outside it, and stderr
//! names the directory and the flag that makes it writable; a workload that only reads gets no
//! hint and not one notified open. As root and as an unprivileged user (nobody, via setpriv).
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod interp;

const NOBODY: &str = "65534";
const WRITE_X: &str = "open('x', 'w')";
const EROFS: &str = "OSError: [Errno 30] Read-only file system: 'x'";

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Who starts the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Root,
    Nobody,
}

fn users() -> Vec<Who> {
    assert!(
        is_root(),
        "these tests run as root (and drop to nobody with setpriv for the unprivileged half)"
    );
    assert!(
        Path::new("/usr/bin/setpriv").exists(),
        "setpriv (util-linux) is needed to run as an unprivileged user"
    );
    vec![Who::Root, Who::Nobody]
}

/// A working directory anybody may enter (a temp dir is 0700) and, for nobody, its own.
fn workdir(who: Who) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if who == Who::Nobody {
        nix::unistd::chown(
            d.path(),
            Some(nix::unistd::Uid::from_raw(65534)),
            Some(nix::unistd::Gid::from_raw(65534)),
        )
        .unwrap();
    }
    d
}

/// `sigma-supervise ARGS python3 -c CODE` in `cwd`, started by `who`. Root runs the project's
/// interpreter (found on PATH); nobody runs Debian's, which it can reach.
fn supervised(who: Who, cwd: &Path, args: &[&str], code: &str) -> Output {
    let mut c = match who {
        Who::Root => interp::supervisor(),
        Who::Nobody => {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args([
                format!("--reuid={NOBODY}"),
                format!("--regid={NOBODY}"),
                "--clear-groups".to_owned(),
            ])
            .arg(env!("CARGO_BIN_EXE_sigma-supervise"))
            .env_remove("RUST_LOG");
            c
        }
    };
    c.args(args);
    match who {
        Who::Root => c.arg("python3"),
        Who::Nobody => c.arg("/usr/bin/python3"),
    };
    let o = c
        .args(["-c", code])
        .current_dir(cwd)
        .env("HOME", interp::home_in(cwd))
        .env_remove("PYTHONPATH")
        .stdin(Stdio::null())
        .output()
        .expect("run sigma-supervise");
    eprintln!(
        "[{who:?}] {args:?} {code:?}: {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `--stats` rows (`syscall decision count`, the indented lines after the header) and the
/// notification total.
fn stats(err: &str) -> (u64, Vec<(String, String, u64)>) {
    let mut lines = err.lines().skip_while(|l| {
        !(l.starts_with("sigma-supervise stats: ") && l.contains(" notifications"))
    });
    let header = lines
        .next()
        .unwrap_or_else(|| panic!("no stats header in {err}"));
    let total = header.split_whitespace().nth(2).unwrap().parse().unwrap();
    let rows = lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "{l}");
            (f[0].to_owned(), f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect();
    (total, rows)
}

/// The same write, bare, in a read-only bind mount of `dir` (a private mount namespace): what
/// Python says when a directory is read-only outside any jail.
fn bare_in_read_only_mount(dir: &Path) -> String {
    let script = "mount --bind -o ro \"$0\" \"$0\" && cd \"$0\" && exec \"$1\" -c \"$2\"";
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(dir)
        .arg(interp::python())
        .arg(WRITE_X)
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux) runs the bare comparison");
    assert_eq!(o.status.code(), Some(1), "bare: {}", stderr(&o));
    stderr(&o)
}

#[test]
fn a_write_into_a_read_only_working_directory_fails_as_bare_and_names_the_flag() {
    let dir = workdir(Who::Root);
    let bare = bare_in_read_only_mount(dir.path());
    assert!(bare.trim_end().ends_with(EROFS), "bare: {bare}");
    assert!(!dir.path().join("x").exists());
    for who in users() {
        let dir = workdir(who);
        let d = dir.path().display().to_string();
        let o = supervised(who, dir.path(), &["--stats", "--cwd", "ro"], WRITE_X);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "[{who:?}] {err}");
        // The proc sees what it would see bare: the same exception, last line of its traceback.
        let last_python_line = err
            .lines()
            .rfind(|l| !l.starts_with("sigma-supervise") && !l.starts_with("  "))
            .unwrap_or_default();
        assert_eq!(last_python_line, EROFS, "[{who:?}] {err}");
        assert!(!dir.path().join("x").exists(), "[{who:?}] x was created");
        let hint =
            format!("sigma-supervise: {d} is read-only in the jail: --cwd rw makes it writable");
        assert_eq!(
            err.lines().filter(|l| *l == hint).count(),
            1,
            "[{who:?}] one hint naming the directory and --cwd rw: {err}"
        );
        // --stats counts the call as refused read-only and lists the hint once more.
        let (_, rows) = stats(&err);
        assert!(
            rows.contains(&("openat".into(), "read-only".into(), 1)),
            "[{who:?}] {rows:?}"
        );
        let listed = hint.replace("sigma-supervise: ", "sigma-supervise stats: hint: ");
        assert!(err.lines().any(|l| l == listed), "[{who:?}] {err}");
        // Following the hint: the write lands.
        let o = supervised(who, dir.path(), &["--stats", "--cwd", "rw"], WRITE_X);
        assert_eq!(o.status.code(), Some(0), "[{who:?}] {}", stderr(&o));
        assert!(dir.path().join("x").exists(), "[{who:?}] x not written");
        assert!(
            !stderr(&o).contains("read-only in the jail"),
            "[{who:?}] {}",
            stderr(&o)
        );
    }
}

#[test]
fn trace_names_the_read_only_refusal_and_hints_bind_rw_for_other_directories() {
    let dir = workdir(Who::Root);
    let data = tempfile::tempdir().unwrap();
    let target = data.path().join("out.txt");
    let trace = dir.path().join("trace.txt");
    let code = format!("open({:?}, 'w')", target.display().to_string());
    let o = supervised(
        Who::Root,
        dir.path(),
        &[
            &format!("--trace={}", trace.display()),
            "--bind",
            &data.path().display().to_string(),
        ],
        &code,
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("[Errno 30] Read-only file system"), "{err}");
    let d = data.path().display();
    assert!(
        err.lines().any(|l| l
            == format!(
                "sigma-supervise: {d} is read-only in the jail: --bind-rw {d} makes it writable"
            )),
        "{err}"
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let line = text
        .lines()
        .find(|l| l.split('\t').nth(2) == Some(&*target.display().to_string()))
        .unwrap_or_else(|| panic!("no trace line for {}: {text}", target.display()));
    let f: Vec<&str> = line.split('\t').collect();
    assert_eq!((f[1], f[3]), ("openat", "continue(read-only in the jail)"));
    assert!(!target.exists());
    // A system directory is said to be part of the system view, not offered for binding.
    let o = supervised(
        Who::Root,
        dir.path(),
        &["--stats"],
        "open('/usr/sigma-x', 'w')",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).lines().any(|l| l
            == "sigma-supervise: /usr is read-only in the jail: it is part of the read-only system view"),
        "{}",
        stderr(&o)
    );
    assert!(!Path::new("/usr/sigma-x").exists());
}

#[test]
fn stats_on_a_reading_workload_hints_nothing_and_notifies_no_read() {
    for who in users() {
        let dir = workdir(who);
        let o = supervised(who, dir.path(), &["--stats"], "import json");
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "[{who:?}] {err}");
        assert!(!err.contains("read-only in the jail"), "[{who:?}] {err}");
        let (total, rows) = stats(&err);
        assert_eq!(
            (total, rows),
            (0, vec![]),
            "[{who:?}] reads were notified: {err}"
        );
        // Writes are: exactly the one open that asks to write, into the read-write cwd.
        let o = supervised(
            who,
            dir.path(),
            &["--stats"],
            "import json\nopen('y', 'w').write(json.dumps(1))\nprint(open('y').read())",
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "[{who:?}] {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n");
        assert!(!err.contains("read-only in the jail"), "[{who:?}] {err}");
        let (total, rows) = stats(&err);
        assert_eq!(
            (total, rows),
            (1, vec![("openat".into(), "continue".into(), 1)]),
            "[{who:?}] {err}"
        );
    }
}
