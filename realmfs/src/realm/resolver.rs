//! The notification path: [`RealmResolver`] answers calls under the prefix on the receive loop,
//! or hands a miss to a worker that waits for its file.
#![forbid(unsafe_code)]

use super::fetching::{errno_for, lock, report_once, FAIL_TTL, FINISH_BOUND};
use super::streams::Streams;
use crate::serve::{Lookup, Resolver, Served};
use fetcher::{FetchError, RealmCache};
use nix::errno::Errno;
use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Serves the realm's lib prefix; every other served directory is plain local.
pub struct RealmResolver {
    pub(super) prefix: PathBuf,
    /// Top-level entry → owning package (from the realm's index).
    pub(super) owners: HashMap<String, String>,
    pub(super) superlib: Arc<Served>,
    pub(super) cache: Arc<RealmCache>,
    pub(super) rt: Detached,
    /// Packages being downloaded into the lib dir by this run.
    pub(super) streams: Arc<Streams>,
    pub(super) sh: Arc<Outcomes>,
    pub(super) inline_hits: AtomicU64,
    /// Calls answered inline from a package still being downloaded.
    pub(super) streamed_hits: AtomicU64,
    /// Of those, the calls answered from a memory tree.
    pub(super) memory_hits: AtomicU64,
    /// Why the lazy backend does not serve this run.
    pub(super) lazy_note: Option<String>,
}

/// The fetch runtime of a run served by notification. Dropped, it does not wait for its
/// blocking tasks: a fill process's install goes on without the run (the task reading its
/// report would otherwise hold the run's exit until the whole package is in), and the installs
/// the run made itself were waited for by [`Resolver::finish`], or are cut for a proc the user
/// stopped, as by a kill: the next run recovers them.
pub(super) struct Detached {
    pub(super) handle: tokio::runtime::Handle,
    pub(super) rt: Option<tokio::runtime::Runtime>,
}

impl Detached {
    pub(super) fn new(rt: tokio::runtime::Runtime) -> Self {
        Detached {
            handle: rt.handle().clone(),
            rt: Some(rt),
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What the resolver remembers of finished ensures (shared with the tasks that run them).
pub(super) struct Outcomes {
    pub(super) realm: String,
    pub(super) bucket: String,
    /// Packages known complete (saves the marker stat).
    pub(super) installed: Mutex<HashSet<String>>,
    /// Package → when its fetch failed and with which errno.
    pub(super) failed: Mutex<HashMap<String, (Instant, Errno)>>,
    pub(super) reported: Arc<Mutex<HashSet<String>>>,
    pub(super) compile_with: Option<PathBuf>,
    pub(super) on_helper: fn(i32),
    /// `cpython-311` for `python3.11`, when the interpreter's file name tells.
    pub(super) cache_tag: Option<String>,
}

impl Outcomes {
    /// Record how the ensure of `pkg` ended and turn it into the target's answer.
    pub(super) fn record(
        &self,
        pkg: &str,
        result: Result<Option<fetcher::EnsureOutcome>, FetchError>,
    ) -> Result<(), Errno> {
        match result {
            Ok(Some(out)) => {
                tracing::debug!(package = %out.package, fetched = out.fetched, "ensured");
                // Published bytecode for this interpreter needs no compile.
                let shipped = out.bytecode.is_some() && out.bytecode == self.cache_tag;
                if out.installed && !shipped {
                    self.compile(&out.dir);
                }
                lock(&self.installed).insert(pkg.to_owned());
                Ok(())
            }
            Ok(None) => Err(Errno::ENOENT),
            Err(e) => {
                report_once(&self.reported, &self.realm, &self.bucket, &e);
                let errno = errno_for(&e);
                lock(&self.failed).insert(pkg.to_owned(), (Instant::now(), errno));
                Err(errno)
            }
        }
    }

    /// Byte-compile a package this run installed, as pip does at install time, so later runs
    /// import from `.pyc` (the target cannot write into the read-only prefix). In the
    /// background: the target's own import does not wait; the supervisor reaps it at exit.
    pub(super) fn compile(&self, entry: &Path) {
        let Some(py) = self.compile_with.clone() else {
            return;
        };
        let entry = entry.to_path_buf();
        let on_helper = self.on_helper;
        let _ = std::thread::Builder::new()
            .name("sigma-compile".into())
            .spawn(move || {
                let r = std::process::Command::new(&py)
                    .args(["-I", "-m", "compileall", "-q", "-j", "0"])
                    .arg(&entry)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn();
                // The supervisor's reaper may collect it first (ECHILD here): nothing to do.
                if let Ok(mut c) = r {
                    // Ours, not the proc's: the orphan rule leaves it to finish.
                    on_helper(c.id() as i32);
                    let _ = c.wait();
                }
            });
    }
}

/// `rest` as the index spells paths (`numpy/core/x.py`), if it is made of plain names only.
pub(super) fn index_path(rest: &Path) -> Option<String> {
    let mut out = String::new();
    for c in rest.components() {
        let Component::Normal(name) = c else {
            return None;
        };
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(name.to_str()?);
    }
    Some(out)
}

pub(super) fn first_component(rest: &Path) -> Option<&str> {
    match rest.components().next()? {
        Component::Normal(c) => c.to_str(),
        _ => None,
    }
}

impl RealmResolver {
    pub(super) fn owner(&self, rest: &Path) -> Option<&str> {
        self.owners.get(first_component(rest)?).map(String::as_str)
    }
}

impl Resolver for RealmResolver {
    fn lookup(&self, served: &Served, rest: &Path) -> Lookup {
        if served.prefix != self.prefix {
            return Lookup::Local;
        }
        if rest.as_os_str().is_empty() {
            return Lookup::At(self.superlib.clone());
        }
        let Some(pkg) = self.owner(rest) else {
            return Lookup::Fail(Errno::ENOENT);
        };
        if lock(&self.sh.installed).contains(pkg) {
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        // Being downloaded by this run: what is there already is served from the lib dir.
        if let Some(st) = self.streams.get(pkg) {
            let s = lock(&st.state);
            if index_path(rest).is_some_and(|rel| s.servable(&rel)) {
                self.streamed_hits.fetch_add(1, Ordering::Relaxed);
                // Streamed into memory: served from there until the package is installed
                // (its names are not in the lib dir before).
                if let (Some(mem), None) = (&s.memory, &s.done) {
                    self.memory_hits.fetch_add(1, Ordering::Relaxed);
                    return Lookup::At(mem.clone());
                }
                return Lookup::Local;
            }
        }
        // A marker stat: another process (or an earlier run) may have installed it.
        if self.cache.is_installed(pkg) {
            lock(&self.sh.installed).insert(pkg.to_owned());
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        if let Some(&(at, errno)) = lock(&self.sh.failed).get(pkg) {
            if at.elapsed() < FAIL_TTL {
                return Lookup::Fail(errno);
            }
        }
        Lookup::Fetch
    }

    /// Runs on a deferred worker: make sure an ensure of the package is under way, then wait
    /// until `rest` is servable (its file verified, or the package installed) or the ensure
    /// failed. The ensure runs as a task of its own, so it is never cut short by a waiter that
    /// got its file early.
    fn fetch(&self, served: &Served, rest: &Path) -> Result<(), Errno> {
        if served.prefix != self.prefix {
            return Ok(());
        }
        let pkg = self.owner(rest).ok_or(Errno::ENOENT)?.to_owned();
        let st = self.streams.get_or_insert(&pkg);
        let start = !std::mem::replace(&mut lock(&st.state).started, true);
        if start {
            let (cache, sh, st2, rest2) = (
                self.cache.clone(),
                self.sh.clone(),
                st.clone(),
                rest.to_path_buf(),
            );
            let streams = self.streams.clone();
            self.rt.handle.spawn(async move {
                let result = sh.record(&pkg, cache.ensure_path(&rest2).await);
                // A stream nobody placed (already installed, linked from the store, or failed
                // before a download) ends here; a placed one usually ended already.
                {
                    let mut map = lock(&streams.by_pkg);
                    if map.get(&pkg).is_some_and(|s| Arc::ptr_eq(s, &st2)) {
                        map.remove(&pkg);
                    }
                }
                st2.finish(result);
            });
        }
        let rel = index_path(rest);
        let marks = jail::marking().then(|| format!("{}", rest.display()));
        if let Some(m) = &marks {
            jail::mark(&format!("wait:{m}"));
        }
        let state = st
            .changed
            .wait_while(lock(&st.state), |s| {
                s.done.is_none() && !rel.as_deref().is_some_and(|r| s.servable(r))
            })
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = &marks {
            jail::mark(&format!("woke:{m}"));
        }
        match state.done {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// A target may exit once it has the files it needed, before the rest of a package it
    /// started has arrived: that install is finished here, so the package is complete for the
    /// next run instead of fetched again.
    fn finish(&self) {
        self.streams.wait_placed(FINISH_BOUND);
    }

    fn mount_prefix(&self, mnt_id: u64) -> Option<PathBuf> {
        lock(&self.streams.mounts)
            .contains(&mnt_id)
            .then(|| self.prefix.clone())
    }

    fn report(&self) -> Option<String> {
        let s = self.cache.stats();
        Some(format!(
            "sigma-supervise realm {} ({}): backend notification{}: fetched {} packages, {} \
             bytes, {} GETs; installed {}; cache hits {}; fetch time {:.3} ms; streamed {} \
             files, {} calls served before their package was complete; served from memory {} \
             files verified there, {} calls; {} packages still arriving (left to their fill \
             processes); decoded during the run {} bytes, after it (persisted only) {} bytes\n",
            self.sh.realm,
            self.sh.bucket,
            self.lazy_note
                .as_ref()
                .map(|n| format!(" (lazy backend: {n})"))
                .unwrap_or_default(),
            s.packages_fetched,
            s.bytes_fetched,
            s.gets,
            s.packages_installed,
            s.cache_hits + self.inline_hits.load(Ordering::Relaxed),
            s.fetch_time.as_secs_f64() * 1e3,
            self.streams.files.load(Ordering::Relaxed),
            self.streamed_hits.load(Ordering::Relaxed),
            self.streams.memory_files.load(Ordering::Relaxed),
            self.memory_hits.load(Ordering::Relaxed),
            self.streams.arriving(),
            self.streams.bytes.load(Ordering::Relaxed),
            self.streams
                .placed_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(self.streams.bytes.load(Ordering::Relaxed)),
        ))
    }
}
