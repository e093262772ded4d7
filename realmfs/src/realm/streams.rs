//! Packages whose download streams into the lib dir: a file is served as soon as the unpacker
//! has verified it, while the rest of its package is still arriving.
#![forbid(unsafe_code)]

use super::fetching::{errno_for, lock, ReportFn};
use crate::serve::Served;
use fetcher::{FetchError, RealmCache};
use nix::errno::Errno;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Packages whose download streams into the lib dir (see [`fetcher::Placement`]): from
/// `placed` to the end of the install, their names are all there and a file may be served
/// once the unpacker has announced it verified.
pub(super) struct Streams {
    pub(super) lib: PathBuf,
    pub(super) by_pkg: Mutex<HashMap<String, Arc<Stream>>>,
    /// Notified (with `by_pkg`) when a placed install ends.
    pub(super) idle: Condvar,
    /// Files announced verified while their package was incomplete.
    pub(super) files: AtomicU64,
    /// Of those, the files verified in a memory tree.
    pub(super) memory_files: AtomicU64,
    /// Mount ids of the memory trees this run was served from.
    pub(super) mounts: Mutex<HashSet<u64>>,
    /// Their bytes: decoded and verified while this run lasted.
    pub(super) bytes: AtomicU64,
    /// Bytes of the packages placed while this run lasted: what is not in `bytes` was (or is
    /// being) decoded only to be persisted, after the run or beside it.
    pub(super) placed_bytes: AtomicU64,
    /// Says a failed install (once per message, as the ensure that started it does): set once
    /// the cache is open. A waiter may be answered, and the run end, before that ensure ends.
    pub(super) report: std::sync::OnceLock<ReportFn>,
}

/// One package's download, as the resolver's waiters see it.
#[derive(Default)]
pub(super) struct Stream {
    pub(super) state: Mutex<StreamState>,
    pub(super) changed: Condvar,
}

#[derive(Default)]
pub(super) struct StreamState {
    /// The package's files not verified yet (index paths, sizes); `None` until its skeleton
    /// is placed.
    pub(super) pending: Option<HashMap<String, u64>>,
    /// The wait is over: the package is installed (`Ok`) or its ensure failed.
    pub(super) done: Option<Result<(), Errno>>,
    /// An ensure of the package was started for this stream's waiters.
    pub(super) started: bool,
    /// The download runs in a fill process, which completes it whether or not this run lasts.
    pub(super) delegated: bool,
    /// The memory tree it streams into (see [`crate::memory`]): what is servable is served
    /// from there, until the package is installed.
    pub(super) memory: Option<Arc<Served>>,
}

impl StreamState {
    /// Whether `rel` (a normalised path under the prefix) can be served from the lib dir now:
    /// the skeleton is placed and `rel` is not a file still to come (a directory, a verified
    /// file, or a name the package does not have, which the kernel answers).
    pub(super) fn servable(&self, rel: &str) -> bool {
        matches!(self.done, Some(Ok(())))
            || (self.done.is_none() && self.pending.as_ref().is_some_and(|p| !p.contains_key(rel)))
    }
}

impl Stream {
    pub(super) fn finish(&self, result: Result<(), Errno>) {
        lock(&self.state).done.get_or_insert(result);
        self.changed.notify_all();
    }
}

impl Streams {
    /// Make `cache`'s downloads stream into its lib dir, each verified file announced here.
    pub(super) fn attach(self: &Arc<Self>, cache: &RealmCache) {
        cache.set_placement(self.clone());
        let weak = Arc::downgrade(self);
        cache.set_file_hook(Arc::new(move |_sha: &str, file: &Path| {
            if let Some(streams) = weak.upgrade() {
                streams.verified(file);
            }
        }));
    }

    /// Wait, at most `bound`, until no install this process placed in the lib dir is under
    /// way (a fill process's install goes on without this run).
    pub(super) fn wait_placed(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut map = lock(&self.by_pkg);
        loop {
            let busy = map.values().any(|st| {
                let s = lock(&st.state);
                s.pending.is_some() && s.done.is_none() && !s.delegated
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if !busy || left.is_zero() {
                return;
            }
            map = self
                .idle
                .wait_timeout(map, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Installs left to fill processes that have not ended yet.
    pub(super) fn arriving(&self) -> usize {
        lock(&self.by_pkg)
            .values()
            .filter(|st| {
                let s = lock(&st.state);
                s.delegated && s.done.is_none()
            })
            .count()
    }

    /// `pkg`'s download went to a fill process, streaming into `memory` if given.
    pub(super) fn delegated(&self, pkg: &fetcher::index::Package, memory: Option<Arc<Served>>) {
        if let Some(m) = &memory {
            lock(&self.mounts).insert(m.mnt_id);
        }
        let st = self.get_or_insert(&pkg.name);
        let mut s = lock(&st.state);
        s.delegated = true;
        s.memory = memory;
    }

    pub(super) fn get(&self, pkg: &str) -> Option<Arc<Stream>> {
        lock(&self.by_pkg).get(pkg).cloned()
    }

    pub(super) fn get_or_insert(&self, pkg: &str) -> Arc<Stream> {
        lock(&self.by_pkg)
            .entry(pkg.to_owned())
            .or_default()
            .clone()
    }

    /// The unpacker verified the file at `file` (a lib-dir path while a stream is placed).
    pub(super) fn verified(&self, file: &Path) {
        let Some(rel) = file.strip_prefix(&self.lib).ok().and_then(Path::to_str) else {
            return;
        };
        for st in lock(&self.by_pkg).values() {
            let mut s = lock(&st.state);
            let removed = s.pending.as_mut().and_then(|p| p.remove(rel));
            let memory = s.memory.is_some();
            drop(s);
            if let Some(size) = removed {
                self.files.fetch_add(1, Ordering::Relaxed);
                if memory {
                    self.memory_files.fetch_add(1, Ordering::Relaxed);
                }
                self.bytes.fetch_add(size, Ordering::Relaxed);
                st.changed.notify_all();
                return;
            }
        }
    }
}

impl fetcher::Placement for Streams {
    fn placed(&self, pkg: &fetcher::index::Package) {
        let st = self.get_or_insert(&pkg.name);
        lock(&st.state).pending =
            Some(pkg.files.iter().map(|f| (f.path.clone(), f.size)).collect());
        self.placed_bytes
            .fetch_add(pkg.unpacked_size(), Ordering::Relaxed);
        st.changed.notify_all();
        if jail::marking() {
            jail::mark(&format!("placed:{}", pkg.name));
        }
    }

    fn ended(&self, pkg: &fetcher::index::Package, result: Result<(), &FetchError>) {
        if jail::marking() {
            jail::mark(&format!("ended:{}", pkg.name));
        }
        if let (Err(e), Some(report)) = (result, self.report.get()) {
            report(e);
        }
        // Later lookups see the marker (or, after a failure, start over); waiters keep theirs.
        let mut map = lock(&self.by_pkg);
        if let Some(st) = map.remove(&pkg.name) {
            st.finish(result.map_err(errno_for));
        }
        drop(map);
        self.idle.notify_all();
    }
}
