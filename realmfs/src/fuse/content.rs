//! A file's bytes: from the realm cache's verified content, fetched off the request loop on a
//! first read.
#![forbid(unsafe_code)]

use super::tree::{Kind, Tree};
use crate::snapshot::lock;
use fetcher::RealmCache;
use fuser::ReplyData;
use std::collections::HashMap;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A read waiting for its file's content.
pub(super) struct Pending {
    pub(super) offset: u64,
    pub(super) size: u32,
    pub(super) reply: ReplyData,
}

/// What the request loop and the fill workers share.
pub(super) struct Content {
    pub(super) tree: Tree,
    pub(super) cache: Arc<RealmCache>,
    pub(super) rt: tokio::runtime::Runtime,
    /// Inode → its verified content, open.
    pub(super) open: Mutex<HashMap<u64, Arc<std::fs::File>>>,
    /// Inode being filled → the reads waiting for it.
    pub(super) waiting: Mutex<HashMap<u64, Vec<Pending>>>,
    /// sha256 → the inodes with that content.
    pub(super) by_sha: HashMap<String, Vec<u64>>,
    /// Top-level entries whose package a worker has been asked to install.
    pub(super) installing: Mutex<std::collections::HashSet<String>>,
    /// Top-level entry → the workers installing its package now: a reader answered as soon as
    /// its file was verified may see its run end before the install does, and the counters
    /// then say so (`installing`) rather than show no fetch.
    pub(super) in_flight: Mutex<HashMap<String, usize>>,
    /// sha256 → where the fetcher verified that content during an install still under way
    /// ([`verified`](Self::verified)); a path gone since (the install moved it) is looked up in
    /// the store instead.
    pub(super) staged: Mutex<HashMap<String, PathBuf>>,
    pub(super) born: Instant,
    /// Milliseconds after `born` of the last request.
    pub(super) last: AtomicU64,
    /// Read requests (the kernel asks only for pages it does not have), files opened in the
    /// store (`waited`: of them, after a fetch), reads answered EIO.
    pub(super) reads: AtomicU64,
    /// Other requests: lookups (`missed`: of names the snapshot lacks), getattrs, readdirs.
    pub(super) lookups: AtomicU64,
    pub(super) missed: AtomicU64,
    pub(super) getattrs: AtomicU64,
    pub(super) readdirs: AtomicU64,
    pub(super) opened: AtomicU64,
    pub(super) waited: AtomicU64,
    pub(super) denied: AtomicU64,
    /// Where the counters are kept for the runs' `--stats` ([`record`](Self::record)).
    pub(super) stats: Option<std::fs::File>,
}

impl Content {
    pub(super) fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    pub(super) fn idle_for(&self) -> Duration {
        self.born
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last.load(Ordering::Relaxed)))
    }

    /// The content of `sha` from the store, if it is there with `size` bytes (the store holds
    /// only verified bytes).
    pub(super) fn stored(&self, sha: &str, size: u64) -> Option<Arc<std::fs::File>> {
        open_sized(&self.cache.cas_path(sha), size)
    }

    /// Fill `ino`: its package into the realm cache, then its content from the store.
    pub(super) fn fill(&self, ino: u64) {
        let Some(Kind::File { size, sha256, top }) = self.tree.node(ino).map(|n| &n.kind) else {
            return;
        };
        *lock(&self.in_flight).entry(top.clone()).or_default() += 1;
        let ensured = self.rt.block_on(self.cache.ensure(top));
        {
            let mut in_flight = lock(&self.in_flight);
            if let Some(n) = in_flight.get_mut(top) {
                *n -= 1;
                if *n == 0 {
                    in_flight.remove(top);
                }
            }
        }
        let got = match ensured {
            Ok(_) => self.stored(sha256, *size).ok_or_else(
                || tracing::warn!(sha = %sha256, "verified content missing from the store"),
            ),
            Err(e) => {
                tracing::warn!(entry = %top, "fetch failed: {e}");
                Err(())
            }
        };
        self.answer(ino, got);
    }

    /// A file the fetcher just verified (it may still be installing the rest of its package).
    /// Its path is kept for the reads that come later (the store has it only once the package
    /// is installed): under the lock of the waiting reads, so that a read either finds the
    /// path or is waiting when it is kept.
    pub(super) fn verified(&self, sha: &str, path: &Path) {
        let waiting: Vec<u64> = {
            let w = lock(&self.waiting);
            lock(&self.staged).insert(sha.to_owned(), path.to_owned());
            self.by_sha
                .get(sha)
                .into_iter()
                .flatten()
                .copied()
                .filter(|ino| w.contains_key(ino))
                .collect()
        };
        for ino in waiting {
            if let Some(Kind::File { size, .. }) = self.tree.node(ino).map(|n| &n.kind) {
                if let Some(f) = open_sized(path, *size) {
                    self.answer(ino, Ok(f));
                }
            }
        }
    }

    /// Answer every read waiting for `ino` (once).
    pub(super) fn answer(&self, ino: u64, got: Result<Arc<std::fs::File>, ()>) {
        if let Ok(f) = &got {
            let mut open = lock(&self.open);
            if let std::collections::hash_map::Entry::Vacant(e) = open.entry(ino) {
                e.insert(f.clone());
                self.opened.fetch_add(1, Ordering::Relaxed);
                self.waited.fetch_add(1, Ordering::Relaxed);
            }
        }
        let waiters = lock(&self.waiting).remove(&ino).unwrap_or_default();
        if got.is_err() {
            self.denied
                .fetch_add(waiters.len() as u64, Ordering::Relaxed);
        }
        // Counted before any reader is released: a run that ends right after its read finds
        // it counted.
        self.record();
        for w in waiters {
            match &got {
                Ok(f) => serve(f, self.size_of(ino), w.offset, w.size, w.reply),
                Err(()) => w.reply.error(libc::EIO),
            }
        }
    }

    /// Keep the counters where runs read them (a first touch's cost, never a cached read's).
    pub(super) fn record(&self) {
        let c = self.cache.stats();
        let line = format!(
            "{} reads; {} lookups ({} missed), {} getattrs, {} readdirs; opened {} files ({} \
             after a fetch); denied {}; fetched {} packages ({} installing), {} bytes, {} GETs\n",
            self.reads.load(Ordering::Relaxed),
            self.lookups.load(Ordering::Relaxed),
            self.missed.load(Ordering::Relaxed),
            self.getattrs.load(Ordering::Relaxed),
            self.readdirs.load(Ordering::Relaxed),
            self.opened.load(Ordering::Relaxed),
            self.waited.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
            c.packages_fetched,
            lock(&self.in_flight).len(),
            c.bytes_fetched,
            c.gets
        );
        if let Some(f) = &self.stats {
            // One small write in place, padded over the last (no new file per first touch).
            let _ = f.write_all_at(format!("{:<256}", line.trim_end()).as_bytes(), 0);
        }
    }

    pub(super) fn size_of(&self, ino: u64) -> u64 {
        match self.tree.node(ino).map(|n| &n.kind) {
            Some(Kind::File { size, .. }) => *size,
            _ => 0,
        }
    }
}

pub(super) fn open_sized(path: &Path, size: u64) -> Option<Arc<std::fs::File>> {
    let f = std::fs::File::open(path).ok()?;
    (f.metadata().ok()?.len() == size).then(|| Arc::new(f))
}

/// Reply with up to `size` bytes of `file` (of `len` bytes) from `offset`.
pub(super) fn serve(file: &std::fs::File, len: u64, offset: u64, size: u32, reply: ReplyData) {
    let n = len.saturating_sub(offset).min(u64::from(size));
    // At most the kernel's request size (`size`, a u32 it bounds to its max read).
    let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return reply.error(libc::EIO),
        }
    }
    reply.data(&buf[..got]);
}
