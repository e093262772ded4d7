//! σOS's own Go client, built from σOS's source, against the embedded realm server: a Go proc
//! (tests/sigmaos/spproxyclnt) that calls `sigmaclnt.NewSigmaClnt(proc.GetProcEnv())` with
//! `UseSPProxy`, so σOS's `proxy/sigmap/clnt` dials `/tmp/spproxyd/spproxyd.sock` in the jail
//! itself, runs under the default `sigmaos` profile and uses files in `name/ux/~local`, a
//! directory read and a watch, objects in `name/s3/~local/BUCKET`, WaitEvict (answered when the
//! supervisor gets SIGTERM) and Exited(OK).
//!
//! The program is built inside σOS's source tree (module `sigmaos`, which the Go module proxy
//! does not serve), unpacked from the pinned snapshot by `scripts/sigmaos-e2e --src-only` into
//! `$SIGMA_CACHE/sigmaos/<commit>/src` (cached, shared with the end-to-end script). Without
//! the snapshot, or without `go`, the test fails and says why.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const CONFIG: &str = r#"{"pidStr":"spproxyclnt-1","program":"spproxyclnt","realmStr":"rootrealm","principal":{"iDStr":"spproxyclnt-1","realmStr":"rootrealm"},"kernelID":"sigma-supervise","useSPProxy":true}"#;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// σOS's patched source tree (unpacked once by scripts/sigmaos-e2e) with our proc built in it.
fn build_proc(out: &Path) {
    let src = Command::new(repo().join("scripts/sigmaos-e2e"))
        .arg("--src-only")
        .output()
        .expect("running scripts/sigmaos-e2e --src-only");
    assert!(
        src.status.success(),
        "σOS's source is needed for this test (the pinned snapshot sigmaos-f2183c6.tar.zst \
         beside the repository, or SIGMAOS_SRC / SIGMAOS_TARBALL): {}{}",
        String::from_utf8_lossy(&src.stdout),
        String::from_utf8_lossy(&src.stderr)
    );
    let tree = PathBuf::from(String::from_utf8(src.stdout).unwrap().trim());
    let pkg = tree.join("sigmasupervise_spproxyclnt");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::copy(
        repo().join("tests/sigmaos/spproxyclnt/main.go"),
        pkg.join("main.go"),
    )
    .unwrap();
    let b = Command::new("go")
        .args(["build", "-o"])
        .arg(out)
        .arg("./sigmasupervise_spproxyclnt")
        .current_dir(&tree)
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .output()
        .expect("running go (the Go toolchain is needed for this test)");
    assert!(
        b.status.success(),
        "go build of tests/sigmaos/spproxyclnt in {}: {}",
        tree.display(),
        String::from_utf8_lossy(&b.stderr)
    );
}

#[test]
fn sigmaos_go_client_uses_the_embedded_server() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("spproxyclnt");
    build_proc(&bin);
    let buckets = tmp.path().join("buckets");
    std::fs::create_dir_all(buckets.join("b1")).unwrap();
    // The supervisor's private socket directory is made here: it must be gone after the run.
    let tmpdir = tmp.path().join("tmpdir");
    std::fs::create_dir(&tmpdir).unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_sigma-supervise"))
        .args(["--sigma", "embedded", "--s3"])
        .arg(format!("file://{}", buckets.display()))
        .arg("--scratch-dir")
        .arg(tmp.path().join("ux"))
        .arg("--")
        .arg(&bin)
        .arg("b1")
        .current_dir(&work)
        .env("SIGMACONFIG", CONFIG)
        .env("TMPDIR", &tmpdir)
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // A hung run fails instead of hanging the suite.
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    });
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
            // The proc dialled the socket and is served through it, but the host's path to it
            // went once the jail was built: a supervisor killed now would leave nothing.
            let left: Vec<_> = std::fs::read_dir(&tmpdir).unwrap().collect();
            assert!(left.is_empty(), "in TMPDIR while the proc runs: {left:?}");
            // Let WaitEvict reach the server, then evict the proc as σOS would.
            std::thread::sleep(Duration::from_millis(300));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    drop(watchdog);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = lines.join("\n");
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{all}\nstderr:\n{stderr}",
        out.status
    );
    let failures: Vec<&String> = lines.iter().filter(|l| !l.starts_with("ok ")).collect();
    assert_eq!(
        failures,
        ["waiting for eviction"],
        "stdout:\n{all}\nstderr:\n{stderr}"
    );
    for case in [
        "ProcEnv UseSPProxy",
        "NewSigmaClnt",
        "Started",
        "PutFile",
        "GetFile",
        "Stat",
        "GetFile 4 MiB",
        "a missing file is Notfound",
        "GetDir",
        "DirWatch event",
        "a parked watch read ends with no bytes when closed",
        "Remove the directory",
        "S3 PutFile",
        "S3 GetFile",
        "S3 Stat",
        "S3 GetDir",
        "S3 Remove",
        "WaitEvict",
        "Exited",
        "Close",
    ] {
        assert!(
            lines.iter().any(|l| l == &format!("ok {case}")),
            "no `ok {case}` in:\n{all}"
        );
    }
    assert!(
        stderr.contains("proc exited: status 1 (OK) \"all cases passed\""),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmpdir).unwrap().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
