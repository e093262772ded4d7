//! The fill server: answers the pre-content events of one mounted image, filling each
//! placeholder from the realm cache on first touch.
#![forbid(unsafe_code)]

use super::hold::spawn_holder;
use super::image::{mask, parse_map, Files, LazyImage, Placeholder};
use crate::snapshot::{io, lock, LazyError};
use fetcher::RealmCache;
use nix::fcntl::Flock;
use nix::sys::fanotify::{Fanotify, FanotifyEvent, FanotifyResponse, MarkFlags, Response};
use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of one [`FillServer`].
#[derive(Debug, Default)]
pub struct FillStats {
    /// Files filled by this server.
    pub filled: AtomicU64,
    /// Bytes written into placeholders.
    pub bytes: AtomicU64,
    /// Accesses answered with an error.
    pub denied: AtomicU64,
    /// Events for files that were already complete.
    pub present: AtomicU64,
    /// Installs a fill waits for now (see `Server::fill`), and their end.
    pub(super) installing: Mutex<usize>,
    pub(super) installed: std::sync::Condvar,
}

impl FillStats {
    pub(super) fn install_begins(&self) {
        *lock(&self.installing) += 1;
    }

    pub(super) fn install_ends(&self) {
        let mut n = lock(&self.installing);
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.installed.notify_all();
        }
    }

    /// Wait until no fill waits for an install, for at most `bound`.
    pub fn wait_installs(&self, bound: std::time::Duration) {
        let n = lock(&self.installing);
        let _ = self
            .installed
            .wait_timeout_while(n, bound, |n| *n > 0)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// Answers the pre-content events of one mounted image: one thread reads events and answers
/// what needs no work; [`FILL_THREADS`] workers fill files (one fill per file, every reader of
/// that file waiting on it).
pub struct FillServer {
    pub stats: Arc<FillStats>,
}

/// Files filled at once.
pub(super) const FILL_THREADS: usize = 4;

impl FillServer {
    /// Start answering the events of the image's group. `rt` runs the fetcher.
    ///
    /// The group and its mark were made with the image, before the target exists: its first
    /// touch already waits for an answer. Everything else (the image's map, the log of
    /// completed files, the workers) is set up by the event thread while the program loads.
    ///
    /// `jail_init`: a pidfd of the jail's init: leave the group's end to a holder process
    /// (`spawn_holder`, [`hold`](super::hold::hold)) that lets go once the supervisor and that init are gone.
    /// Only for a jailed run (it waits for its init alone; without a jail the supervisor reaps
    /// every process it has, and would wait for the holder).
    pub fn start(
        image: LazyImage,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Handle,
        report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
        jail_init: Option<std::os::fd::OwnedFd>,
    ) -> Result<FillServer, LazyError> {
        let stats = Arc::new(FillStats::default());
        let counters = stats.clone();
        std::thread::Builder::new()
            .name("sigma-fanotify".into())
            .spawn(move || {
                let served = Server::new(image, cache, rt, counters, report);
                // Once the server can answer (events wait until then): the group's end (its
                // marks destroyed, an SRCU grace period, 5-15 ms) is left to a holder that
                // outlives this process, so the run's exit does not wait for it. Without one it
                // ends with the run, only later.
                if let Some(init) = jail_init {
                    let fan = match &served {
                        Ok((server, _)) => &server.fan,
                        Err((fan, _)) => fan,
                    };
                    if let Err(e) = spawn_holder(fan, init) {
                        tracing::debug!("the fanotify group ends with the run: {e}");
                    }
                }
                match served {
                    Ok((server, fills)) => server.run(fills),
                    Err((fan, e)) => {
                        // Nothing may read a placeholder's zeros: every first touch fails.
                        tracing::error!(
                            "lazy fills unavailable ({e}): reads of files not yet filled fail \
                             with EIO"
                        );
                        deny_all(&fan)
                    }
                }
            })
            .map_err(io("spawn", Path::new("sigma-fanotify")))?;
        Ok(FillServer { stats })
    }
}

/// Answer every event with EIO (the server could not be set up).
pub(super) fn deny_all(fan: &Fanotify) {
    loop {
        match fan.read_events() {
            Ok(events) => {
                for ev in events {
                    if let Some(fd) = ev.fd() {
                        let _ = fan.write_response(FanotifyResponse::new(fd, deny_eio()));
                    }
                }
            }
            Err(nix::errno::Errno::EBADF | nix::errno::Errno::EINVAL) => return,
            Err(_) => {}
        }
    }
}

impl Server {
    /// The server of `image`, with its workers started. On failure the group comes back.
    #[allow(clippy::type_complexity)]
    pub(super) fn new(
        image: LazyImage,
        cache: Arc<RealmCache>,
        rt: tokio::runtime::Handle,
        stats: Arc<FillStats>,
        report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
    ) -> Result<(Arc<Server>, std::sync::mpsc::Sender<u64>), (Fanotify, LazyError)> {
        let LazyImage {
            mnt: _,
            filled_log,
            files,
            group: (fan, root),
            users,
            ..
        } = image;
        let files = match files {
            Files::Made(files) => files,
            Files::Map(map) => {
                match std::fs::read_to_string(&map)
                    .ok()
                    .and_then(|t| parse_map(&t))
                {
                    Some(files) => files,
                    None => {
                        // The next run materialises the image again.
                        let _ = std::fs::remove_file(&map);
                        let source = std::io::ErrorKind::InvalidData.into();
                        return Err((
                            fan,
                            LazyError::Io {
                                op: "read",
                                path: map,
                                source,
                            },
                        ));
                    }
                }
            }
        };
        // Files completed earlier in this boot: answered at once from `done`, and given ignore
        // marks (by path: a lookup, not an open) before events are read. After a crash of the
        // machine the log's boot id differs, and each file is verified by its hash on its
        // first touch instead.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|b| b.trim().to_owned())
            .unwrap_or_default();
        let mut done = HashSet::new();
        let mut ignores = Vec::new();
        for line in std::fs::read_to_string(&filled_log)
            .unwrap_or_default()
            .lines()
        {
            let Some((b, ino)) = line.split_once(' ') else {
                continue;
            };
            let Some(p) = ino
                .parse()
                .ok()
                .and_then(|i: u64| files.get(&i).map(|p| (i, p)))
            else {
                continue;
            };
            if b == boot && !boot.is_empty() && done.insert(p.0) {
                ignores.push(p.1.path.clone());
            }
        }
        for path in ignores {
            let _ = fan.mark(ignore_flags(), mask(), &root, Some(Path::new(&path)));
        }
        let log = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&filled_log)
        {
            Ok(log) => log,
            Err(e) => return Err((fan, io("open", &filled_log)(e))),
        };
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let server = Arc::new(Server {
            fan,
            root,
            _users: users,
            by_sha: files.iter().fold(HashMap::new(), |mut m, (ino, p)| {
                m.entry(p.sha256.clone())
                    .or_insert_with(Vec::new)
                    .push(*ino);
                m
            }),
            files,
            cache,
            rt,
            stats,
            done: Mutex::new(done),
            log: Mutex::new(log),
            boot,
            waiting: Mutex::new(HashMap::new()),
            report,
        });
        // Stream: a reader waiting for a file is released as soon as the unpacker has verified
        // that file, not when its whole package is installed.
        let weak = Arc::downgrade(&server);
        server
            .cache
            .set_file_hook(Arc::new(move |sha: &str, staged: &Path| {
                if let Some(server) = weak.upgrade() {
                    server.verified(sha, staged);
                }
            }));
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..FILL_THREADS {
            let (server, rx) = (server.clone(), rx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("sigma-fill-{i}"))
                .spawn(move || loop {
                    let next = lock(&rx).recv();
                    match next {
                        Ok(ino) => server.fill_and_answer(ino),
                        Err(_) => return,
                    }
                });
            if let Err(e) = spawned {
                // Fewer workers fill more slowly; with none the event thread fills.
                tracing::warn!("lazy fills: worker thread {i} not started: {e}");
            }
        }
        Ok((server, tx))
    }
}

/// An ignore mark for one file: no more events for it in this group.
pub(super) fn ignore_flags() -> MarkFlags {
    MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_IGNORE | MarkFlags::FAN_MARK_IGNORED_SURV_MODIFY
}

/// FAN_DENY_ERRNO(EIO): the reader sees an I/O error, never zeros.
pub(super) fn deny_eio() -> Response {
    Response::from_bits_retain(Response::FAN_DENY.bits() | ((libc::EIO as u32 & 0xff) << 24))
}

pub(super) struct Server {
    pub(super) fan: Fanotify,
    /// The image's mount, opened (fills write through it).
    pub(super) root: std::fs::File,
    /// See [`LazyImage::users`].
    pub(super) _users: Flock<std::fs::File>,
    pub(super) files: HashMap<u64, Placeholder>,
    /// sha256 → the placeholders with that content.
    pub(super) by_sha: HashMap<String, Vec<u64>>,
    pub(super) cache: Arc<RealmCache>,
    pub(super) rt: tokio::runtime::Handle,
    pub(super) stats: Arc<FillStats>,
    /// Inodes known complete by this server.
    pub(super) done: Mutex<HashSet<u64>>,
    /// Appends `BOOT_ID INODE` for every completed file.
    pub(super) log: Mutex<std::fs::File>,
    pub(super) boot: String,
    /// Inode being filled → the events (readers) waiting for it.
    pub(super) waiting: Mutex<HashMap<u64, Vec<FanotifyEvent>>>,
    pub(super) report: Arc<dyn Fn(&fetcher::FetchError) + Send + Sync>,
}

/// Why a fill failed: the reader gets EIO either way.
pub(super) enum FillError {
    Fetch(fetcher::FetchError),
    Local(std::io::Error),
}

impl Server {
    pub(super) fn respond(&self, fd: BorrowedFd<'_>, response: Response) {
        if let Err(e) = self.fan.write_response(FanotifyResponse::new(fd, response)) {
            tracing::warn!(error = %e, "fanotify response failed");
        }
    }

    pub(super) fn run(&self, fills: std::sync::mpsc::Sender<u64>) {
        let mut warned = false;
        loop {
            let events = match self.fan.read_events() {
                Ok(e) => e,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e @ (nix::errno::Errno::EBADF | nix::errno::Errno::EINVAL)) => {
                    tracing::error!(error = %e, "fanotify read failed; lazy fills stop");
                    return;
                }
                // One event whose fd could not be opened (the kernel denied it): go on.
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "fanotify event dropped");
                    }
                    continue;
                }
            };
            for ev in events {
                let Some(fd) = ev.fd() else { continue };
                let Ok(st) = nix::sys::stat::fstat(fd) else {
                    self.respond(fd, deny_eio());
                    continue;
                };
                let ino = st.st_ino;
                if !self.files.contains_key(&ino) || lock(&self.done).contains(&ino) {
                    // Not a placeholder (a directory, nothing else lives here) or complete.
                    self.respond(fd, Response::FAN_ALLOW);
                    continue;
                }
                let mut waiting = lock(&self.waiting);
                if let Some(w) = waiting.get_mut(&ino) {
                    w.push(ev);
                    continue;
                }
                waiting.insert(ino, vec![ev]);
                drop(waiting);
                if fills.send(ino).is_err() {
                    // No worker could be started: fill here, one file at a time.
                    self.fill_and_answer(ino);
                }
            }
        }
    }

    pub(super) fn fill_and_answer(&self, ino: u64) {
        let Some(p) = self.files.get(&ino) else {
            return;
        };
        let result = self.fill(p, ino);
        self.finish(ino, p, result);
    }

    /// A file the unpacker just verified: fill the placeholders readers are waiting for.
    pub(super) fn verified(&self, sha: &str, staged: &Path) {
        for &ino in self.by_sha.get(sha).into_iter().flatten() {
            if !lock(&self.waiting).contains_key(&ino) || lock(&self.done).contains(&ino) {
                continue;
            }
            let p = &self.files[&ino];
            // On failure the worker fills it from the CAS once the install ends.
            if self.fill_from(p, staged).is_ok() {
                self.finish(ino, p, Ok(()));
            }
        }
    }

    /// Record the outcome for `ino` and answer every reader waiting for it (once).
    pub(super) fn finish(&self, ino: u64, p: &Placeholder, result: Result<(), FillError>) {
        if result.is_ok() && lock(&self.done).insert(ino) {
            use std::io::Write as _;
            // One short append (atomic for O_APPEND): concurrent supervisors interleave lines.
            let _ = lock(&self.log).write_all(format!("{} {ino}\n", self.boot).as_bytes());
        }
        let events = lock(&self.waiting).remove(&ino).unwrap_or_default();
        match result {
            Ok(()) => {
                // No more events for this file: from now on it is plain page cache.
                if let Some(fd) = events.first().and_then(FanotifyEvent::fd) {
                    if let Err(e) = self.fan.mark(ignore_flags(), mask(), fd, None::<&Path>) {
                        tracing::debug!(error = %e, "ignore mark");
                    }
                }
                for ev in &events {
                    if let Some(fd) = ev.fd() {
                        self.respond(fd, Response::FAN_ALLOW);
                    }
                }
            }
            Err(e) => {
                match e {
                    FillError::Fetch(e) => (self.report)(&e),
                    FillError::Local(e) => {
                        tracing::warn!(path = %p.path, error = %e, "lazy fill failed")
                    }
                }
                for ev in &events {
                    if let Some(fd) = ev.fd() {
                        self.stats.denied.fetch_add(1, Ordering::Relaxed);
                        self.respond(fd, deny_eio());
                    }
                }
            }
        }
    }

    /// The placeholder of `p`, opened through the image's root (not its host path: a run of
    /// the realm once complete detaches the mount while this one may still fill).
    pub(super) fn open(
        &self,
        p: &Placeholder,
        flags: nix::fcntl::OFlag,
    ) -> std::io::Result<std::fs::File> {
        use nix::fcntl::OFlag;
        let fd = nix::fcntl::openat(
            &self.root,
            p.path.as_str(),
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        Ok(std::fs::File::from(fd))
    }

    pub(super) fn fill(&self, p: &Placeholder, ino: u64) -> Result<(), FillError> {
        let file = self
            .open(p, nix::fcntl::OFlag::O_RDWR)
            .map_err(FillError::Local)?;
        // Filled by an earlier server (or another supervisor of the realm): verify, not refetch.
        if p.size == 0 || content_matches(&file, p).map_err(FillError::Local)? {
            self.stats.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let first = p.path.split('/').next().unwrap_or(&p.path);
        drop(file);
        // Counted while under way: the reader may be released (streamed) before it ends.
        self.stats.install_begins();
        let ensured = self.rt.block_on(self.cache.ensure(first));
        self.stats.install_ends();
        ensured.map_err(FillError::Fetch)?;
        if lock(&self.done).contains(&ino) {
            // Filled from the unpacker while the package streamed in.
            return Ok(());
        }
        // The CAS holds verified bytes (the fetcher hashed them against the index).
        self.fill_from(p, &self.cache.cas_path(&p.sha256))
            .map_err(FillError::Local)
    }

    /// Copy verified bytes from `src` into the placeholder (through the image's root), in the
    /// kernel (`sendfile`: the image and the store are different filesystems).
    /// Another supervisor of the realm may fill the same file for its own proc at the same
    /// time: one fill of a file at a time (a lock on the placeholder), and the second finds
    /// the file complete (its hash checked) and copies nothing.
    pub(super) fn fill_from(&self, p: &Placeholder, src: &Path) -> std::io::Result<()> {
        use std::io::{Read as _, Seek as _};
        let src = std::fs::File::open(src)?;
        if src.metadata()?.len() != p.size {
            return Err(std::io::Error::other("verified file has another size"));
        }
        let mut file = self.open(p, nix::fcntl::OFlag::O_RDWR)?;
        file.lock()?;
        if content_matches(&file, p)? {
            self.stats.present.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        file.rewind()?;
        let n = std::io::copy(&mut src.take(p.size), &mut file)?;
        if n != p.size {
            return Err(std::io::Error::other(
                "verified file shrank while it was copied",
            ));
        }
        self.stats.filled.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// Whether `file` already holds the placeholder's bytes. A file without any data block is a
/// placeholder.
pub(super) fn content_matches(file: &std::fs::File, p: &Placeholder) -> std::io::Result<bool> {
    use sha2::{Digest, Sha256};
    if file.metadata()?.blocks() == 0 {
        return Ok(false);
    }
    let mut h = Sha256::new();
    let n = std::io::copy(&mut &*file, &mut h)?;
    Ok(n == p.size && hex::encode(h.finalize()) == p.sha256)
}
