//! A Go proc speaking σOS's spproxy protocol runs as the target and talks to the embedded realm
//! server over the inherited socket: every proc-API call, σOS's error cases, an 8 MiB round
//! trip, 8 pipelined callers, a directory read, DirWatch, and WaitEvict answered when the
//! supervisor gets SIGTERM (the proc then reports Exited(EVICTED) and exits by itself).
//!
//! The Go program (spproxy/tests/goclient) is a faithful reimplementation of σOS's Go client
//! path, not σOS's own client: github.com/mit-pdos/sigmaos cannot be had from the Go module
//! proxy. It fails on any reply the real Go stubs would not accept (e.g. a missing err).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_go_proc_uses_the_whole_proc_api() {
    if Command::new("go").arg("version").output().is_err() {
        eprintln!("SKIPPED a_go_proc_uses_the_whole_proc_api: no `go` toolchain on PATH");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("goclient");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spproxy/tests/goclient");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(&src)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_sigma-supervise"))
        // The default profile, as σOS's Go procs would run (it allows the Go runtime's eventfd2).
        .args(["--scratch-dir"])
        .arg(tmp.path().join("ux"))
        .arg("--")
        .arg(&bin)
        .env_remove("SIGMACONFIG")
        .env_remove("RUST_LOG")
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut l = String::new();
        if stdout.read_line(&mut l).unwrap() == 0 {
            break;
        }
        let l = l.trim_end().to_owned();
        let waiting = l == "waiting for eviction";
        lines.push(l);
        if waiting {
            // Let the WaitEvict call reach the server, then evict the proc as σOS would.
            std::thread::sleep(Duration::from_millis(300));
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failures: Vec<&String> = lines.iter().filter(|l| !l.starts_with("ok ")).collect();
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        lines.join("\n")
    );
    assert_eq!(
        failures,
        ["waiting for eviction"],
        "stdout:\n{}",
        lines.join("\n")
    );
    for call in [
        "Init",
        "Started",
        "ClntId",
        "PutFile 8 MiB",
        "GetFile 8 MiB",
        "Stat",
        "Write",
        "Read",
        "missing path is Notfound",
        "removing a non-empty directory is NotEmpty",
        "bad open flags are Inval",
        "an unserved σOS call is NotSupported, transport intact",
        "GetDir",
        "DirWatch event",
        "8 concurrent callers",
        "WaitEvict",
        "Exited",
    ] {
        assert!(
            lines.iter().any(|l| l == &format!("ok {call}")),
            "no `ok {call}` in:\n{}",
            lines.join("\n")
        );
    }
    assert!(
        stderr.contains("proc exited: status 2 (EVICTED) \"evicted\""),
        "{stderr}"
    );
}
