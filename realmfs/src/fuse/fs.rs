//! The FUSE requests, answered from the tree and the content.
#![forbid(unsafe_code)]

use super::content::{open_sized, serve, Content, Pending};
use super::tree::{Kind, Tree};
use crate::snapshot::{io, lock, LazyError};
use fetcher::RealmCache;
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, Request,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Files filled at once (each waits for its package's fetch).
const FILL_THREADS: usize = 4;

/// Entries and attributes never change for one snapshot (a new one is a new mount).
pub(super) const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The filesystem the request loop calls.
pub(super) struct RealmFs {
    pub(super) content: Arc<Content>,
    pub(super) fills: std::sync::mpsc::Sender<u64>,
}

impl RealmFs {
    pub(super) fn start(
        tree: Tree,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Runtime,
        stats: PathBuf,
    ) -> Result<RealmFs, LazyError> {
        let mut by_sha: HashMap<String, Vec<u64>> = HashMap::new();
        for (i, n) in tree.nodes.iter().enumerate() {
            if let Kind::File { sha256, .. } = &n.kind {
                by_sha.entry(sha256.clone()).or_default().push(i as u64 + 1);
            }
        }
        let content = Arc::new(Content {
            tree,
            cache,
            rt,
            open: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            by_sha,
            installing: Mutex::new(std::collections::HashSet::new()),
            in_flight: Mutex::new(HashMap::new()),
            staged: Mutex::new(HashMap::new()),
            born: Instant::now(),
            last: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            getattrs: AtomicU64::new(0),
            readdirs: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            stats: std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&stats)
                .ok(),
        });
        // Stream: a read waiting for a file is answered as soon as the unpacker has verified
        // that file, not when its whole package is installed.
        let weak = Arc::downgrade(&content);
        content
            .cache
            .set_file_hook(Arc::new(move |sha: &str, path: &Path| {
                if let Some(c) = weak.upgrade() {
                    c.verified(sha, path);
                }
            }));
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..FILL_THREADS {
            let (c, rx) = (content.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("sigma-fuse-fill-{i}"))
                .spawn(move || loop {
                    let next = lock(&rx).recv();
                    match next {
                        Ok(ino) => c.fill(ino),
                        Err(_) => return,
                    }
                })
                .map_err(io("spawn", Path::new("sigma-fuse-fill")))?;
        }
        Ok(RealmFs { content, fills: tx })
    }
}

impl Filesystem for RealmFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // As much read-ahead as the kernel allows: a file is read through us once per mount.
        if let Err(max) = config.set_max_readahead(1 << 20) {
            let _ = config.set_max_readahead(max);
        }
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let c = &self.content;
        c.touch();
        c.lookups.fetch_add(1, Ordering::Relaxed);
        let found = match (c.tree.node(parent).map(|n| &n.kind), name.to_str()) {
            (Some(Kind::Dir(children)), Some(name)) => children.get(name).copied(),
            (Some(_), _) => None,
            (None, _) => return reply.error(libc::ENOENT),
        };
        match (found.and_then(|ino| c.tree.attr(ino)), c.tree.attr(1)) {
            (Some(attr), _) => reply.entry(&TTL, &attr, 0),
            // Node 0: "no such name" that the kernel keeps (a negative entry) for as long as
            // any other; an error would be asked again at every lookup.
            (None, Some(root)) => {
                c.missed.fetch_add(1, Ordering::Relaxed);
                reply.entry(&TTL, &FileAttr { ino: 0, ..root }, 0)
            }
            (None, None) => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        self.content.touch();
        self.content.getattrs.fetch_add(1, Ordering::Relaxed);
        match self.content.tree.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    /// ENOSYS: the kernel opens without asking from now on and keeps each file's pages.
    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }

    /// ENOSYS: likewise for directories, whose listings the kernel then keeps.
    fn opendir(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        reply.error(libc::ENOSYS);
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.error(libc::ENOSYS);
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let c = &self.content;
        c.touch();
        c.reads.fetch_add(1, Ordering::Relaxed);
        let Some(Kind::File {
            size: len,
            sha256,
            top,
        }) = c.tree.node(ino).map(|n| &n.kind)
        else {
            return reply.error(libc::EISDIR);
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        if *len == 0 || offset >= *len {
            return reply.data(&[]);
        }
        let known = lock(&c.open).get(&ino).cloned();
        if let Some(f) = known.or_else(|| {
            let f = c.stored(sha256, *len)?;
            if lock(&c.open).insert(ino, f.clone()).is_none() {
                c.opened.fetch_add(1, Ordering::Relaxed);
                // In the store (another realm's download) but not installed in this realm:
                // installed now, off the loop (links from the store), so that the next runs
                // show it from the lib dir and ask the server nothing.
                if lock(&c.installing).insert(top.clone()) {
                    let _ = self.fills.send(ino);
                }
            }
            Some(f)
        }) {
            // The kernel asks only for pages it lacks: a first touch, never a cached read.
            // Counted before the reader is released (see `answer`).
            c.record();
            return serve(&f, *len, offset, size, reply);
        }
        let mut waiting = lock(&c.waiting);
        // Verified already by an install still under way: read where it was verified.
        let staged = lock(&c.staged).get(sha256).cloned();
        if let Some(f) = staged.and_then(|p| open_sized(&p, *len)) {
            drop(waiting);
            if lock(&c.open).insert(ino, f.clone()).is_none() {
                c.opened.fetch_add(1, Ordering::Relaxed);
            }
            c.record();
            return serve(&f, *len, offset, size, reply);
        }
        let first = !waiting.contains_key(&ino);
        waiting.entry(ino).or_default().push(Pending {
            offset,
            size,
            reply,
        });
        drop(waiting);
        if first && self.fills.send(ino).is_err() {
            c.answer(ino, Err(()));
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let c = &self.content;
        c.touch();
        c.readdirs.fetch_add(1, Ordering::Relaxed);
        let Some(node) = c.tree.node(ino) else {
            return reply.error(libc::ENOENT);
        };
        let Kind::Dir(children) = &node.kind else {
            return reply.error(libc::ENOTDIR);
        };
        let dots = [
            (ino, FileType::Directory, "."),
            (node.parent, FileType::Directory, ".."),
        ];
        let entries = dots.into_iter().chain(children.iter().map(|(name, &i)| {
            let kind = match c.tree.node(i).map(|n| &n.kind) {
                Some(Kind::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            (i, kind, name.as_str())
        }));
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (e_ino, kind, name)) in entries.enumerate().skip(skip) {
            if reply.add(e_ino, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
