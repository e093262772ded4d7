//! Fill processes: a realm package's download, run in a process of its own so that it outlives
//! the run that asked for it.
//!
//! A cold import needs a package's first files (its import trace, first in the archive); the
//! rest may arrive after the target has exited. When the install runs in the supervisor, the
//! supervisor must wait for it at exit (or cut it, and the next run downloads it again). Here
//! the supervisor takes the package's lock as before, then starts this binary again under the
//! name [`FILL_ARG0`] with the lock file as its stdin (one open file: the lock holds until both
//! have closed it). The fill process installs the package exactly as the supervisor would
//! ([`fetcher::RealmCache::fill`]: skeleton placed under the journal, each file filled,
//! verified and made read-only, then the marker) and says what it did on its stdout, a pipe the
//! supervisor reads:
//!
//! ```text
//! placed           the skeleton is in the lib dir
//! file <i>         the package's i-th file (index order) is verified
//! ok <bytes>       the package is installed (marker written)
//! err <kind> <msg> the install failed (kind: notfound or other); nothing placed is left
//! ```
//!
//! Once the files of the package's import trace are verified, the fill process runs on in
//! `SCHED_IDLE` until the run has ended: the rest is written with CPU the import does not
//! want. Then it returns to normal scheduling where it may (root).
//!
//! Given a memory tree ([`crate::memory`]: a directory on a tmpfs the supervisor made and
//! serves from), it places the skeleton and fills the files there instead, and persists the
//! package into the store only once every file is verified and the run has ended (at most
//! [`PERSIST_AFTER`]; [`RealmCache::fill_in_memory`]);
//! `placed` and `file` then speak of the memory tree, `ok` of the package in lib/.
//!
//! After `ok` it lets go of the lock, waits for the run to end (its report pipe closes; at
//! most [`TREE_AFTER`]), builds the package's shared tree, and empties its memory tree once
//! the run has ended (however long it runs: a directory it holds there keeps resolving), then
//! exits. If the
//! supervisor has exited meanwhile, its lines go nowhere and the install goes on. If the fill
//! process dies, its pipe ends without `ok`: every reader waiting on the package gets EIO
//! (never a placeholder's zeros), what was placed is removed under the lock, and the next
//! install starts over from the journal.
//!
//! Only jailed runs delegate: the jailed supervisor waits for the jail's init alone, so a fill
//! process is never mistaken for a leftover of the target (signalled, or waited for).
#![forbid(unsafe_code)]

use crate::memory::MemoryRoot;
use crate::serve::Served;
use fetcher::index::Package;
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchConfig, FetchError, FileHook, Placement, RealmCache};
use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `argv[0]` of a fill process ([`main`]).
pub const FILL_ARG0: &str = "sigma-supervise-fill";

/// This binary again under `arg0`, for work that outlives the run (a fill process, the maker
/// of a lazy image): started in `/`, not in the run's process group (a ^C to the run does not
/// cut work other runs share), its stderr the run's only for the timeline marks
/// (`SIGMA_SUPERVISE_TIMELINE`).
pub fn helper_process(arg0: &str) -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut c = std::process::Command::new("/proc/self/exe");
    c.arg0(arg0)
        .current_dir("/")
        .stderr(if jail::marking() {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .process_group(0);
    c
}

/// Longest line a fill process may write (the longest is an `err` line, cut to fit).
const MAX_LINE: usize = 4096;

/// Starts fill processes for one realm ([`fetcher::Delegate`]).
pub struct FillProcs {
    pub root: PathBuf,
    pub realm: String,
    pub bucket: String,
    pub timeout: Duration,
    pub lib: PathBuf,
    /// Where packages are streamed in memory (`None`: into the lib dir), and the prefix their
    /// memory trees are served at.
    pub memory: Option<MemoryRoot>,
    pub prefix: PathBuf,
    /// Told when a fill process of a package has started, with the memory tree it fills.
    pub started: StartedFn,
}

/// Told that a package's fill process started, with the memory tree it fills, if any.
pub type StartedFn = Box<dyn Fn(&Package, Option<Arc<Served>>) + Send + Sync>;

impl fetcher::Delegate for FillProcs {
    fn install(
        &self,
        pkg: &Package,
        lock: &std::fs::File,
        placement: &Arc<dyn Placement>,
        hook: Option<&Arc<FileHook>>,
    ) -> Option<Result<u64, FetchError>> {
        let memory = self
            .memory
            .as_ref()
            .and_then(|m| m.tree_for(pkg, &self.prefix));
        let mem_dir = memory.as_ref().map(|m| m.dir.clone());
        jail::mark("fill:spawn");
        let forget = || {
            if let Some(dir) = &mem_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
        };
        let mut child = match self.spawn(pkg, lock, mem_dir.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                forget();
                tracing::debug!(error = %e, package = %pkg.name, "no fill process; installing here");
                return None;
            }
        };
        let Some(out) = child.stdout.take() else {
            // Never without its report pipe: the caller installs here once it is gone.
            let _ = child.kill();
            let _ = child.wait();
            forget();
            return None;
        };
        (self.started)(pkg, memory.map(|m| m.served));
        let mut out = out;
        let result = self.follow(pkg, &mut out, placement, hook);
        if result.is_ok() {
            // It goes on to build the shared tree once this run is over: it waits for its
            // report pipe to close, which this end does when this process exits (see
            // `TREE_AFTER`). Reaped whenever it is done.
            let _ = std::thread::Builder::new()
                .name("sigma-fill-reap".into())
                .spawn(move || {
                    let _ = child.wait();
                    drop(out);
                });
        } else {
            let _ = child.kill();
            let _ = child.wait();
            // Its readers were answered EIO; nothing reads from it any more.
            forget();
        }
        Some(result)
    }
}

impl FillProcs {
    fn spawn(
        &self,
        pkg: &Package,
        lock: &std::fs::File,
        memory: Option<&std::path::Path>,
    ) -> std::io::Result<std::process::Child> {
        helper_process(FILL_ARG0)
            .arg(&self.root)
            .arg(&self.realm)
            .arg(&self.bucket)
            .arg(format!("{}", self.timeout.as_secs_f64()))
            .arg(&pkg.name)
            .arg(&pkg.archive.sha256)
            .args(memory)
            .stdin(lock.try_clone()?)
            .stdout(std::process::Stdio::piped())
            .spawn()
    }

    /// Read the fill process's lines until `ok` or `err` (or its end).
    fn follow(
        &self,
        pkg: &Package,
        out: impl std::io::Read,
        placement: &Arc<dyn Placement>,
        hook: Option<&Arc<FileHook>>,
    ) -> Result<u64, FetchError> {
        let died = |why: &str| FetchError::Delegated {
            message: format!("the install of {} ended: {why}", pkg.name),
            not_found: false,
        };
        let mut out = std::io::BufReader::new(out);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = std::io::Read::take(&mut out, MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| died(&format!("reading its report: {e}")))?;
            if n == 0 {
                return Err(died("its process exited without finishing"));
            }
            if line.pop() != Some(b'\n') {
                return Err(died("a report line too long"));
            }
            let text = String::from_utf8_lossy(&line);
            let (word, rest) = text.split_once(' ').unwrap_or((&text, ""));
            match word {
                "placed" => placement.placed(pkg),
                "file" => {
                    let f = rest
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| pkg.files.get(i))
                        .ok_or_else(|| died("a report naming no file of the package"))?;
                    if let Some(hook) = hook {
                        hook(&f.sha256, &self.lib.join(&f.path));
                    }
                }
                "ok" => {
                    return rest
                        .parse::<u64>()
                        .map_err(|_| died("a report without its size"));
                }
                "err" => {
                    let (kind, message) = rest.split_once(' ').unwrap_or((rest, ""));
                    return Err(FetchError::Delegated {
                        message: message.to_owned(),
                        not_found: kind == "notfound",
                    });
                }
                _ => return Err(died("a report it cannot have made")),
            }
        }
    }
}

/// What a fill process writes: whole lines, gathered for [`GATHER`] so that a burst of
/// verified files is one write and one wakeup of the supervisor's reader, not one per file;
/// nothing more once its reader has gone.
struct Report {
    pending: Mutex<Vec<u8>>,
    said: std::sync::Condvar,
    out: Mutex<Option<std::io::Stdout>>,
}

/// How long a line may wait for others to go with it.
const GATHER: Duration = Duration::from_micros(300);

impl Report {
    fn new() -> Arc<Report> {
        let r = Arc::new(Report {
            pending: Mutex::new(Vec::new()),
            said: std::sync::Condvar::new(),
            out: Mutex::new(Some(std::io::stdout())),
        });
        let weak = Arc::downgrade(&r);
        let _ = std::thread::Builder::new()
            .name("sigma-fill-report".into())
            .spawn(move || loop {
                let Some(r) = weak.upgrade() else { return };
                let pending = r.pending.lock().unwrap_or_else(|p| p.into_inner());
                let pending = r
                    .said
                    .wait_while(pending, |p| p.is_empty())
                    .unwrap_or_else(|p| p.into_inner());
                drop(pending);
                std::thread::sleep(GATHER);
                r.flush();
            });
        r
    }

    fn say(&self, line: &str) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        // The writer waits only for an empty buffer to fill: one wake-up per burst.
        let first = p.is_empty();
        p.extend(
            line.chars()
                .take(MAX_LINE - 1)
                .collect::<String>()
                .as_bytes(),
        );
        p.push(b'\n');
        if first {
            self.said.notify_one();
        }
    }

    /// Write what was said, in order (the buffer is taken under the output's lock).
    fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let lines = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let gone = out
            .as_mut()
            .is_some_and(|o| o.write_all(&lines).and_then(|()| o.flush()).is_err());
        if gone {
            *out = None;
        }
    }

    /// Say `line` and write it now, with everything before it.
    fn say_now(&self, line: &str) {
        self.say(line);
        self.flush();
    }
}

struct Placed(Arc<Report>);

impl Placement for Placed {
    fn placed(&self, _pkg: &Package) {
        self.0.say_now("placed");
    }
    fn ended(&self, _pkg: &Package, _result: Result<(), &FetchError>) {}
    /// The files the import reads first are in: the rest of the package is written only with
    /// CPU nothing else wants, so it never slows the import it was started for (on two cores
    /// the install's tail took the CPU the import needed). A reader that waits for one of
    /// those files leaves its CPU idle, so the tail still runs then.
    ///
    /// Only while that run lasts: once it has ended, the tail goes back to normal scheduling
    /// where the process may (root), so that an idle thread holding a lock others need (the
    /// `cas/` directory's, say) is not starved by whatever keeps the CPUs busy then.
    /// Persisting a memory tree writes the whole package to the store's disk: it waits for
    /// the run to end (at most [`PERSIST_AFTER`]), which it would slow even at idle priority
    /// (a cold numpy import's tail took 200-330 ms instead of ~150 with the copy beside it).
    fn before_persist(&self, _pkg: &Package) {
        after_the_run(Some(PERSIST_AFTER));
        jail::mark("fill:persist");
    }

    fn past_trace(&self, _pkg: &Package) {
        jail::mark("fill:traced");
        if let Err(e) = crate::sys::idle_process() {
            tracing::debug!(error = %e, "the install's tail stays at its priority");
            return;
        }
        let _ = std::thread::Builder::new()
            .name("sigma-fill-wake".into())
            .spawn(|| {
                after_the_run(None);
                match crate::sys::normal_process() {
                    Ok(()) => jail::mark("fill:normal"),
                    Err(e) => tracing::debug!(error = %e, "the install's tail stays idle"),
                }
            });
    }
}

/// How long a fill process streaming into a memory tree waits, once every file is verified
/// there, for the run it serves to end before persisting the package anyway: long enough for
/// an import's tail (numpy's ends ~100 ms after its last file is verified), short because the
/// package's lock is held meanwhile (another run that wants the package waits for it) and the
/// run's own ensure ends only with the install (the completion of a realm follows it).
const PERSIST_AFTER: Duration = Duration::from_millis(500);

/// How long a fill process waits, once its package is installed, for the run that started
/// it to end before it builds the package's shared tree anyway. The tree (a link per file,
/// ~1,500 for numpy) is for later runs of other realms; built while the run imports, its
/// links took the CPU and the filesystem's locks the run's other installs needed (a cold
/// pandas run: 807 against 724 ms in the supervisor, 779 against 787 without the tree).
const TREE_AFTER: Duration = Duration::from_secs(30);

/// [`TREE_AFTER`], or `SIGMA_SUPERVISE_TEST_TREE_AFTER_MS` (tests of a run that outlasts it).
fn tree_after() -> Duration {
    std::env::var("SIGMA_SUPERVISE_TEST_TREE_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(TREE_AFTER, Duration::from_millis)
}

/// Wait until the report pipe's reader has gone (the run that started this fill process
/// ended) or `bound`, if any, has passed; true if the run has ended.
fn after_the_run(bound: Option<Duration>) -> bool {
    use std::os::fd::AsFd as _;
    let stdout = std::io::stdout();
    let timeout = match bound {
        Some(b) => nix::poll::PollTimeout::from(u16::try_from(b.as_millis()).unwrap_or(u16::MAX)),
        None => nix::poll::PollTimeout::NONE,
    };
    loop {
        let mut fds = [nix::poll::PollFd::new(
            stdout.as_fd(),
            nix::poll::PollFlags::empty(),
        )];
        match nix::poll::poll(&mut fds, timeout) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(0) => return false,
            _ => return true,
        }
    }
}

/// A fill process's whole life (argv: root, realm, bucket, fetch timeout in seconds, package,
/// archive sha256, optionally the memory tree; stdin the package's lock file, locked; stdout
/// the report pipe).
pub fn main() -> ! {
    // Nothing else of the supervisor's (its parent's descriptors) stays open here.
    jail::close_fds_from(3);
    // Our memory holds credentials, as the supervisor's does.
    let _ = nix::sys::prctl::set_dumpable(false);
    // What it unpacks comes from the bucket: confined before its first thread (the report's).
    let confined = confine();
    let report = Report::new();
    if let Err(e) = confined {
        let msg = format!("{e:#}").replace('\n', " ");
        report.say_now(&format!("err other confining the fill process: {msg}"));
        std::process::exit(1)
    }
    let code = match fill(&report) {
        Ok(()) => 0,
        Err(e) => {
            let kind = if e.is_not_found() {
                "notfound"
            } else {
                "other"
            };
            let msg = e.to_string().replace('\n', " ");
            report.say_now(&format!("err {kind} {msg}"));
            1
        }
    };
    std::process::exit(code)
}

/// [`crate::confine::confine`]: writes only under the cache root (`argv[1]`) and its memory tree
/// (`argv[7]`, if any), reads what a fetch reads and a `file://` bucket (`argv[3]`). Bad arguments
/// are left to [`fill`] to report.
fn confine() -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (Some(root), Some(bucket)) = (args.get(1), args.get(3)) else {
        return Ok(());
    };
    let bucket_dir = bucket.to_str().and_then(crate::confine::file_url_dir);
    let mut writable = vec![std::path::Path::new(root)];
    writable.extend(args.get(7).map(std::path::Path::new));
    crate::confine::confine(&writable, bucket_dir.as_slice())?;
    Ok(())
}

fn fill(report: &Arc<Report>) -> Result<(), FetchError> {
    jail::mark("fill:main");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (root, realm, bucket, timeout, name, sha, memory) = match &args[..] {
        [r, re, b, t, n, s] => (r, re, b, t, n, s, None),
        [r, re, b, t, n, s, m] => (r, re, b, t, n, s, Some(PathBuf::from(m))),
        _ => {
            return Err(FetchError::Invalid {
                what: FILL_ARG0.into(),
                cause: "usage: ROOT REALM BUCKET TIMEOUT PACKAGE ARCHIVE-SHA256 [MEMORY-TREE]"
                    .into(),
            })
        }
    };
    let timeout = timeout
        .parse::<f64>()
        .ok()
        .filter(|t| *t > 0.0 && *t < 3600.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| FetchError::Invalid {
            what: FILL_ARG0.into(),
            cause: format!("timeout {timeout:?}"),
        })?;
    let cfg = FetchConfig {
        overall_timeout: timeout,
        ..FetchConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sigma-fill")
        .enable_all()
        .build()
        .map_err(|e| FetchError::io("start", "the fill runtime", e))?;
    let store: Arc<dyn fetcher::Store> =
        Arc::new(LazyStore::new(bucket, &StoreOptions::default(), &cfg)?);
    let cache = RealmCache::open(root, realm, store, cfg)?;
    // The snapshot the supervisor read: the same package, the same file order. Only this
    // package is parsed (a realm of many packages has a large index).
    jail::mark("fill:open");
    let pkg = cache.snapshot_package(name)?;
    jail::mark("fill:index");
    let pkg = pkg
        .filter(|p| &p.archive.sha256 == sha)
        .ok_or_else(|| FetchError::Invalid {
            what: format!("package {name}"),
            cause: "not in the realm's index snapshot with that archive".into(),
        })?;
    // Where the files are filled: the lib dir, or the memory tree.
    let tree = memory.clone().unwrap_or_else(|| cache.lib_dir());
    // The hook names a file by its path in the tree; the report by its place in the index.
    let order: HashMap<PathBuf, usize> = pkg
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| (tree.join(&f.path), i))
        .collect();
    cache.set_placement(Arc::new(Placed(report.clone())));
    let r = report.clone();
    cache.set_file_hook(Arc::new(move |_sha: &str, file: &std::path::Path| {
        if let Some(i) = order.get(file) {
            r.say(&format!("file {i}"));
        }
    }));
    let n = match &memory {
        Some(mem) => rt.block_on(cache.fill_in_memory(&pkg, mem)),
        None => rt.block_on(cache.fill(&pkg)),
    };
    let n = n.inspect_err(|_| {
        // Its readers are answered EIO by the supervisor; the tree goes with this process.
        if let Some(mem) = &memory {
            crate::memory::empty_tree(mem);
        }
    })?;
    report.say_now(&format!("ok {n}"));
    jail::mark("fill:ok");
    // Let go of the lock: the package is installed. Then its shared tree, for other realms.
    let _ = nix::unistd::dup2_stdin(
        std::fs::File::open("/dev/null").map_err(|e| FetchError::io("open", "/dev/null", e))?,
    );
    let emptied = |mem: &std::path::Path| {
        crate::memory::empty_tree(mem);
        jail::mark("fill:memory-emptied");
    };
    // A run that has ended frees its memory tree before the shared tree is built; one still
    // going may hold a directory there and open files relative to it: the tree stays until
    // the run ends (this process sleeps until then).
    let ended = after_the_run(Some(tree_after()));
    if let Some(mem) = memory.as_deref().filter(|_| ended) {
        emptied(mem);
    }
    if let Err(e) = cache.share_tree(&pkg) {
        tracing::debug!(error = %e, package = %pkg.name, "no shared tree");
    }
    jail::mark("fill:tree");
    if let Some(mem) = memory.as_deref().filter(|_| !ended) {
        after_the_run(None);
        emptied(mem);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);
    impl Placement for Count {
        fn placed(&self, _pkg: &Package) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn ended(&self, _pkg: &Package, _result: Result<(), &FetchError>) {}
    }

    fn pkg() -> Package {
        serde_json::from_value(serde_json::json!({
            "name": "p", "version": "1", "source": "p", "top_level": ["p"],
            "archive": {"key": "k", "sha256": "a".repeat(64), "size": 1, "encoding": "tar+zstd"},
            "files": [
                {"path": "p/__init__.py", "sha256": "b".repeat(64), "size": 1},
                {"path": "p/x.py", "sha256": "c".repeat(64), "size": 1}
            ]
        }))
        .unwrap()
    }

    fn procs() -> FillProcs {
        FillProcs {
            root: "/r".into(),
            realm: "r".into(),
            bucket: "file:///b".into(),
            timeout: Duration::from_secs(1),
            lib: "/lib".into(),
            memory: None,
            prefix: "/sigma/lib".into(),
            started: Box::new(|_, _| {}),
        }
    }

    /// What `follow` makes of a fill process's report: (result, placed count, files heard).
    fn follow(report: &[u8]) -> (Result<u64, FetchError>, usize, Vec<String>) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        let hook: Arc<FileHook> = Arc::new(move |sha: &str, path: &Path| {
            h.lock()
                .unwrap()
                .push(format!("{} {}", &sha[..1], path.display()));
        });
        let placement: Arc<dyn Placement> = count.clone();
        let r = procs().follow(&pkg(), report, &placement, Some(&hook));
        let files = heard.lock().unwrap().clone();
        (r, count.0.load(Ordering::Relaxed), files)
    }

    #[test]
    fn a_report_is_followed_to_its_end() {
        let (r, placed, files) = follow(b"placed\nfile 1\nfile 0\nok 1234\nignored after ok\n");
        assert_eq!(r.unwrap(), 1234);
        assert_eq!(placed, 1);
        assert_eq!(files, ["c /lib/p/x.py", "b /lib/p/__init__.py"]);
    }

    #[test]
    fn failures_keep_their_kind_and_a_cut_report_is_a_failure() {
        let (r, _, _) = follow(b"err notfound bucket b: object k not found\n");
        let e = r.unwrap_err();
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "bucket b: object k not found");
        let (r, _, _) = follow(b"err other integrity mismatch\n");
        assert!(!r.unwrap_err().is_not_found());
        for cut in [&b"placed\nfile 0\n"[..], b"", b"placed\nfile 0"] {
            let (r, _, _) = follow(cut);
            let e = r.unwrap_err();
            assert!(!e.is_not_found());
            assert!(e.to_string().starts_with("the install of p ended"), "{e}");
        }
    }

    #[test]
    fn a_report_it_cannot_have_made_is_refused() {
        let long = format!("file {}\n", "1".repeat(MAX_LINE + 10));
        for bad in [
            &b"file 2\n"[..],
            b"file -1\n",
            b"file x\n",
            b"ok\n",
            b"hello\n",
            long.as_bytes(),
        ] {
            let (r, _, files) = follow(bad);
            assert!(r.is_err(), "{:?}", String::from_utf8_lossy(bad));
            assert!(files.is_empty());
        }
    }
}
