//! The interpreter the end-to-end tests run under the supervisor, the supervisor command, and
//! what a run printed, as text.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The real interpreter behind `python3`. On pyenv machines `python3` is a bash shim; the tests
/// measure and trace the interpreter itself, so they put its directory first on PATH.
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 must be installed for the end-to-end tests");
        assert!(out.status.success(), "python3 does not run");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `sigma-supervise` with the real interpreter's directory first on PATH, so `python3` resolves
/// through the supervisor's own PATH lookup; no RUST_LOG from the caller.
pub fn supervisor() -> Command {
    let dir = python().parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_sigma-supervise"));
    c.env("PATH", path).env_remove("RUST_LOG");
    c
}

/// Pids of the processes named one of `names` (argv[0]) whose next argument is the cache root
/// `cache`.
#[allow(dead_code)]
fn procs_of(names: &[&[u8]], cache: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0);
        if args.next().is_some_and(|a| names.contains(&a))
            && args.next() == Some(cache.as_os_str().as_encoded_bytes())
        {
            pids.push(pid);
        }
    }
    pids
}

/// Pids of the fill processes installing into the cache root `cache`, and of the processes
/// making a realm's lazy image there.
#[allow(dead_code)]
pub fn fills_of(cache: &Path) -> Vec<i32> {
    procs_of(
        &[b"sigma-supervise-fill", b"sigma-supervise-lazy-prepare"],
        cache,
    )
}

/// Wait until no fill process installs into `cache` and no lazy image is being made there (at
/// most 60 s).
#[allow(dead_code)]
pub fn settled(cache: &Path) {
    let start = Instant::now();
    while !fills_of(cache).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "a fill process still runs after 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Pids of the realms' FUSE servers of the cache root `cache`.
#[allow(dead_code)]
pub fn fuse_servers_of(cache: &Path) -> Vec<i32> {
    procs_of(&[b"sigma-supervise-fuse"], cache)
}

/// Stop the FUSE servers of `cache` (they outlive runs) and detach what they mounted under
/// `root` (a test's temporary directory): run when a test's directory goes.
#[allow(dead_code)]
pub fn stop_fuse_servers(cache: &Path, root: &Path) {
    for pid in fuse_servers_of(cache) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root = root.to_string_lossy().into_owned();
    for mnt in info.lines().filter_map(|l| l.split(' ').nth(4)) {
        if mnt.starts_with(&root) {
            let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Feed the first half of `data` into the FIFO at `fifo` once a reader opens it (the download
/// of an archive the test stalls), then hold it open without an end of file. The first
/// receiver hears when the half is written; dropping or sending on the sender lets go (at
/// most 60 s later anyway).
#[allow(dead_code)]
pub fn half_fed_fifo(
    fifo: &Path,
    data: &[u8],
) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
    let (tx, fed) = std::sync::mpsc::channel();
    let (done, done_rx) = std::sync::mpsc::channel::<()>();
    let (fifo, half) = (fifo.to_owned(), data[..data.len() / 2].to_vec());
    std::thread::spawn(move || {
        use std::io::Write as _;
        let mut fifo = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let _ = fifo.write_all(&half);
        let _ = tx.send(());
        let _ = done_rx.recv_timeout(Duration::from_secs(60));
    });
    (fed, done)
}

/// A `HOME` for a run whose working directory is `dir`: `dir/home`, made with `dir`'s owner.
/// (The working directory itself is never `HOME`: the default `--cwd auto` does not show a
/// home.)
#[allow(dead_code)]
pub fn home_in(dir: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let m = std::fs::metadata(dir).unwrap();
    std::os::unix::fs::chown(&home, Some(m.uid()), Some(m.gid())).unwrap();
    home
}

/// A run's standard output, as text.
#[allow(dead_code)]
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A run's standard error, as text.
#[allow(dead_code)]
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Print a run's status and output (the test's own output, shown when it fails).
#[allow(dead_code)]
pub fn show(out: &Output) {
    eprintln!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// Run `c` to its end, [`show`] what it did, and return that.
#[allow(dead_code)]
pub fn run(c: &mut Command) -> Output {
    let out = c.output().expect("run the command");
    show(&out);
    out
}
