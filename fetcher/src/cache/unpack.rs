//! The streaming install pipeline: an archive's bytes, as they arrive, decoded (in parallel by
//! frames where cores are spare: [`crate::frames`]), each entry checked against the index,
//! each file hashed, written and announced by a few workers, and the verified package linked
//! into the CAS.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use sha2::{Digest, Sha256};

use super::files::{for_each_in_parallel, install_threads};
use super::locks::lock;
use super::placement::FileHook;
use crate::error::{FetchError, IoContext, Result};
use crate::index::{Encoding, Package};

/// A `Read` that fails once more than `left` bytes have been read: the decompressed stream of
/// an archive is bounded by what its index entry allows (a hostile archive cannot make the
/// unpacker buffer or write without end).
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.left = self.left.checked_sub(k as u64).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "archive unpacks to more than its index lists",
            )
        })?;
        Ok(k)
    }
}

/// File data read out of an archive and not yet written, at most: the parser waits for the
/// workers beyond it, so memory stays bounded whatever sizes the index and the archive name.
const IN_FLIGHT: u64 = 64 << 20;

/// A file larger than this goes to its worker in pieces as it is decoded ([`Body::Pieces`]):
/// the worker hashes and writes one piece while the parser decodes the next, so a large
/// file is ready about when its last piece is decoded, not a whole decode and a whole write
/// later, and no file-sized buffer is allocated.
const PIECE_ABOVE: u64 = 1 << 20;
/// Bytes of one piece, and how many pieces wait for their worker at most.
const PIECE: usize = 256 << 10;
const PIECES_QUEUED: usize = 8;

/// Unpack an archive straight into the staged tree: every entry must be a regular file the
/// index lists, with the listed sha256 and size, and every listed file must be present. Each
/// verified file is linked into the CAS (a file the CAS already holds is replaced by a link to
/// the stored copy, so identical files share an inode). No file is created twice, none is
/// deleted on the first install of its content, nothing is flushed (see the module docs).
/// Bytes that do not decode are an integrity failure. Runs in a blocking thread.
///
/// A pipeline, so a cold install uses every core: this thread decodes the stream and checks
/// each entry against the index ([`parse_entries`]); a few workers hash, write and announce
/// the files ([`write_job`]). The first error stops both sides and is the one returned; the
/// CAS sees nothing until every worker is done and every listed file was verified.
pub(super) fn unpack_tree(
    pkg: &Package,
    archive: impl Read + Send,
    root: &Path,
    tree: &Path,
    on_verified: Option<&FileHook>,
) -> Result<()> {
    std::fs::create_dir(tree).ctx("create dir", tree)?;
    let hooks = Hooks {
        on_verified,
        past_trace: None,
    };
    unpack_files(pkg, archive, tree, false, hooks)?;
    link_into_cas(pkg, root, tree, false)
}

/// What an install tells as it goes: each verified file, and that the files of the import
/// trace are all verified (see [`Placement::past_trace`](crate::Placement::past_trace)).
#[derive(Clone, Copy)]
pub(super) struct Hooks<'h> {
    pub(super) on_verified: Option<&'h FileHook>,
    pub(super) past_trace: Option<&'h (dyn Fn() + Sync)>,
}

/// [`unpack_tree`] into an existing `tree`, without the CAS step ([`link_into_cas`], which
/// the caller takes once it may); `in_place`: the tree is a placed skeleton
/// (`place_skeleton`) whose empty files are filled (and made read-only) instead of created.
pub(super) fn unpack_files(
    pkg: &Package,
    archive: impl Read + Send,
    tree: &Path,
    in_place: bool,
    hooks: Hooks<'_>,
) -> Result<()> {
    // Tar framing: a header and up to one block of padding per file, pax records, two end
    // blocks; generous, and still a bound.
    let framing = (pkg.files.len() as u64).saturating_mul(4096) + (1 << 20);
    // With cores to spare, frames are decoded by a few threads and read in order (see
    // `crate::frames`); else one decoder reads the frames as one stream.
    let decoders = decode_threads();
    let (decoded, split): (Box<dyn Read>, _) = match pkg.archive.encoding {
        Encoding::TarZstd if decoders > 0 => {
            let (frames, splitter, pool) = crate::frames::frames(archive);
            (Box::new(frames), Some((splitter, pool)))
        }
        Encoding::TarZstd => (
            Box::new(zstd::Decoder::new(archive).map_err(undecodable(pkg))?),
            None,
        ),
        Encoding::Tar | Encoding::Frames => (Box::new(archive), None),
    };
    let framed = pkg.archive.encoding == Encoding::Frames;
    let reader = Bounded {
        inner: decoded,
        // A frame per file is read raw; its frames are decoded by the workers.
        left: match framed {
            true => pkg.archive.size,
            false => pkg.unpacked_size().saturating_add(framing),
        },
    };
    let workers = install_threads();
    let queue = Queue::new(workers * 4, IN_FLIGHT);
    // The archive's first `traced` files: once all are verified, the install is past the trace.
    let traced = pkg
        .traced
        .map_or(0, |n| n.min(pkg.files.len() as u64) as usize);
    let trace_left = AtomicUsize::new(traced);
    let parsed = std::thread::scope(|s| {
        if let Some((splitter, pool)) = split {
            s.spawn(move || splitter.run());
            let pool = Arc::new(pool);
            for _ in 0..decoders {
                let pool = pool.clone();
                s.spawn(move || pool.work());
            }
        }
        for _ in 0..workers {
            s.spawn(|| {
                let _stop = StopOnPanic(&queue);
                while let Some(job) = queue.pop() {
                    let result = write_job(pkg, &job, in_place, hooks.on_verified);
                    if result.is_ok()
                        && job.traced
                        && trace_left.fetch_sub(1, Ordering::AcqRel) == 1
                    {
                        if let Some(past_trace) = hooks.past_trace {
                            past_trace();
                        }
                    }
                    queue.done(job.reserved, result);
                }
            });
        }
        let _stop = StopOnPanic(&queue);
        let parsed = match framed {
            true => parse_framed(pkg, reader, tree, (in_place, traced), &queue),
            false => parse_entries(pkg, reader, tree, (in_place, traced), &queue),
        };
        if let Err(e) = &parsed {
            queue.fail(e.clone());
        }
        queue.close();
        parsed
    });
    // The first error of either side (the parser's own is among them).
    queue.into_result()?;
    let seen = parsed?;
    if let Some(f) = pkg.files.iter().find(|f| !seen.contains(f.path.as_str())) {
        return Err(bad(
            pkg,
            &f.path,
            "present in archive".into(),
            "missing".into(),
        ));
    }
    Ok(())
}

/// Link every file of `tree`, complete and verified ([`unpack_files`]), into the CAS under
/// `root`: only a complete, verified package reaches it. `in_place`: the tree's files may be
/// served already (a placed skeleton), so one stored before is swapped in by rename.
pub(super) fn link_into_cas(pkg: &Package, root: &Path, tree: &Path, in_place: bool) -> Result<()> {
    let cas = root.join("cas");
    for_each_in_parallel(&pkg.files, |f| {
        let (dst, stored) = (tree.join(&f.path), cas.join(&f.sha256));
        match std::fs::hard_link(&dst, &stored) {
            Ok(()) => Ok(()),
            // Stored before (by another package, or a copy in this one, maybe on another
            // thread just now): share that inode.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && in_place => {
                // The file may be served already: replace it in one step, never remove it.
                let tmp = dst.with_file_name(format!(
                    ".{}.cas",
                    dst.file_name()
                        .map_or_else(Default::default, |n| n.to_string_lossy())
                ));
                let _ = std::fs::remove_file(&tmp);
                std::fs::hard_link(&stored, &tmp).ctx("link from cas", &stored)?;
                std::fs::rename(&tmp, &dst).ctx("rename into", &dst)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&dst).ctx("remove", &dst)?;
                std::fs::hard_link(&stored, &dst).ctx("link from cas", &stored)
            }
            Err(e) => Err(FetchError::io("link into", stored, e)),
        }
    })
}

/// The bytes of `file` in `pkg`'s archive are not what the index says.
fn bad(pkg: &Package, file: &str, expected: String, got: String) -> FetchError {
    FetchError::IntegrityMismatch {
        file: format!("{} ({})", file, pkg.archive.key),
        expected,
        got,
    }
}

/// An archive stream that does not decode (zstd or tar framing) is an integrity failure.
fn undecodable(pkg: &Package) -> impl Fn(std::io::Error) -> FetchError + '_ {
    move |e| {
        bad(
            pkg,
            "archive",
            format!("{:?} data", pkg.archive.encoding),
            e.to_string(),
        )
    }
}

/// The file at `path` hashed to `got` over `n` bytes: fine only if the index says so.
fn check_file(
    pkg: &Package,
    path: &str,
    (sha, size): (&str, u64),
    got: &str,
    n: u64,
) -> Result<()> {
    if got != sha || n != size {
        return Err(bad(
            pkg,
            path,
            format!("sha256 {sha} size {size}"),
            format!("sha256 {got} size {n}"),
        ));
    }
    Ok(())
}

/// Create a file of the staged tree: read-only, and never over an existing one. `in_place`:
/// open the placed placeholder instead (never a new name, never through a link).
fn create_staged(dst: &Path, in_place: bool) -> Result<std::fs::File> {
    if in_place {
        return std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(dst)
            .ctx("open", dst);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(dst)
        .ctx("create", dst)
}

/// A filled placeholder becomes read-only like every stored file (a staged file is created so).
fn seal(out: &std::fs::File, dst: &Path, in_place: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if in_place {
        out.set_permissions(std::fs::Permissions::from_mode(0o444))
            .ctx("chmod", dst)?;
    }
    Ok(())
}

/// Read the archive's entries in order and check each against the index (listed, a regular
/// file, seen once, no longer than listed) before its bytes go to a worker. Returns the index
/// paths seen; whether each file's content matches is the workers' concern.
fn parse_entries<'a>(
    pkg: &'a Package,
    reader: impl Read,
    tree: &Path,
    (in_place, traced): (bool, usize),
    queue: &Queue<'a>,
) -> Result<HashSet<&'a str>> {
    let expected: HashMap<&str, (&str, u64)> = pkg
        .files
        .iter()
        .map(|f| (f.path.as_str(), (f.sha256.as_str(), f.size)))
        .collect();
    let undecodable = undecodable(pkg);
    let mut tar = tar::Archive::new(reader);
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    let mut seen = HashSet::new();
    for entry in tar.entries().map_err(&undecodable)? {
        let mut entry = entry.map_err(&undecodable)?;
        let path = entry
            .path()
            .map_err(&undecodable)?
            .to_string_lossy()
            .into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        // Index paths are checked relative paths (no `..`, no absolute): safe to join.
        let Some((&key, &(sha, size))) = expected.get_key_value(path.as_str()) else {
            return Err(bad(
                pkg,
                &path,
                "no such file in the index".into(),
                "present in archive".into(),
            ));
        };
        if !kind.is_file() {
            return Err(bad(pkg, &path, "regular file".into(), format!("{kind:?}")));
        }
        if !seen.insert(key) {
            return Err(bad(pkg, &path, "one copy".into(), "duplicate entry".into()));
        }
        let dst = tree.join(key);
        if let Some(dir) = dst.parent() {
            if !in_place && !dirs.contains(dir) {
                std::fs::create_dir_all(dir).ctx("create dir", dir)?;
                dirs.insert(dir.to_owned());
            }
        }
        let too_long = || {
            bad(
                pkg,
                key,
                format!("size {size}"),
                format!("more than {size} bytes"),
            )
        };
        if size > PIECE_ABOVE {
            let budget = (PIECE * PIECES_QUEUED) as u64;
            queue.reserve(budget)?;
            let (tx, rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED);
            let (spare_tx, spare_rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED + 1);
            queue.push(Job {
                path: key,
                sha,
                size,
                dst,
                traced: seen.len() <= traced,
                reserved: budget,
                body: Body::Pieces {
                    rx,
                    spare: spare_tx,
                },
            })?;
            let sent = send_pieces(pkg, &mut entry, size, &tx, &spare_rx, queue, too_long);
            if let Err(e) = sent {
                // Recorded before the worker sees its file cut short, so this is the error
                // the install reports.
                queue.fail(e.clone());
                return Err(e);
            }
            continue;
        }
        queue.reserve(size)?;
        // `size` comes from the index, not the archive: at most PIECE_ABOVE, and reserved. The
        // decoder writes straight into the buffer.
        let mut data = vec![0u8; size as usize];
        let n = read_full(&mut entry, &mut data).map_err(&undecodable)?;
        data.truncate(n);
        if entry.read(&mut [0u8]).map_err(&undecodable)? > 0 {
            return Err(too_long());
        }
        queue.push(Job {
            path: key,
            sha,
            size,
            dst,
            traced: seen.len() <= traced,
            reserved: size,
            body: Body::Whole(data),
        })?;
    }
    Ok(seen)
}

/// [`parse_entries`] for an archive of a frame per file ([`Encoding::Frames`]): its frame
/// index is read and checked whole, each entry against the bucket index's sha256 and size,
/// before a byte of content; then each frame is read in archive order (the import trace's
/// files first) and handed to a worker, which decodes it (so frames are decoded in parallel,
/// by as many threads as write) or, for a large file, decoded here in pieces.
fn parse_framed<'a>(
    pkg: &'a Package,
    mut reader: impl Read,
    tree: &Path,
    (in_place, traced): (bool, usize),
    queue: &Queue<'a>,
) -> Result<HashSet<&'a str>> {
    use crate::frame_index as fi;
    let refused = |e: fi::Refused| bad(pkg, "frame index", "a valid frame index".into(), e.0);
    let undecodable = undecodable(pkg);
    let mut prefix = [0u8; fi::PREFIX];
    reader.read_exact(&mut prefix).map_err(&undecodable)?;
    let max = fi::max_payload(pkg.files.len()).min(pkg.archive.size);
    let n = fi::payload_len(&prefix, max).map_err(refused)?;
    // At most `max`: bounded by the package's file count and the archive's size.
    let mut payload = vec![0u8; n];
    reader.read_exact(&mut payload).map_err(&undecodable)?;
    let data_len = pkg.archive.size.saturating_sub((fi::PREFIX + n) as u64);
    let entries = fi::decode(&payload, pkg.files.len(), data_len).map_err(refused)?;
    drop(payload);
    let expected: HashMap<&str, (&str, u64)> = pkg
        .files
        .iter()
        .map(|f| (f.path.as_str(), (f.sha256.as_str(), f.size)))
        .collect();
    // Every entry is a listed file with the listed hash and size (and, as many as the
    // package's and each once, all of them) before anything is written.
    let mut listed = Vec::with_capacity(entries.len());
    for e in &entries {
        let Some((&key, &(sha, size))) = expected.get_key_value(e.path.as_str()) else {
            return Err(bad(
                pkg,
                &e.path,
                "no such file in the index".into(),
                "present in archive".into(),
            ));
        };
        let got = fi::hex(&e.sha256);
        if got != sha || e.size != size {
            return Err(bad(
                pkg,
                key,
                format!("sha256 {sha} size {size}"),
                format!("frame index sha256 {got} size {}", e.size),
            ));
        }
        listed.push((key, sha, size, e.compressed));
    }
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    let mut seen = HashSet::new();
    for (key, sha, size, compressed) in listed {
        seen.insert(key);
        let dst = tree.join(key);
        if let Some(dir) = dst.parent() {
            if !in_place && !dirs.contains(dir) {
                std::fs::create_dir_all(dir).ctx("create dir", dir)?;
                dirs.insert(dir.to_owned());
            }
        }
        // At most zstd's bound for a size the index lists: checked by `decode`.
        let read_frame = |reader: &mut dyn Read| -> Result<Vec<u8>> {
            let mut frame = vec![0u8; compressed as usize];
            reader.read_exact(&mut frame).map_err(&undecodable)?;
            Ok(frame)
        };
        let traced = seen.len() <= traced;
        if size > PIECE_ABOVE {
            let budget = (PIECE * PIECES_QUEUED) as u64 + compressed;
            queue.reserve(budget)?;
            let frame = read_frame(&mut reader)?;
            fi::check_frame(&frame, size).map_err(|e| bad(pkg, key, "its frame".into(), e.0))?;
            let (tx, rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED);
            let (spare_tx, spare_rx) = std::sync::mpsc::sync_channel(PIECES_QUEUED + 1);
            queue.push(Job {
                path: key,
                sha,
                size,
                dst,
                traced,
                reserved: budget,
                body: Body::Pieces {
                    rx,
                    spare: spare_tx,
                },
            })?;
            let too_long = || {
                bad(
                    pkg,
                    key,
                    format!("size {size}"),
                    format!("more than {size} bytes"),
                )
            };
            let mut decoder = zstd::stream::read::Decoder::with_buffer(&frame[..])
                .map_err(&undecodable)?
                .single_frame();
            let sent = send_pieces(pkg, &mut decoder, size, &tx, &spare_rx, queue, too_long);
            if let Err(e) = sent {
                queue.fail(e.clone());
                return Err(e);
            }
            continue;
        }
        queue.reserve(size + compressed)?;
        let frame = read_frame(&mut reader)?;
        queue.push(Job {
            path: key,
            sha,
            size,
            dst,
            traced,
            reserved: size + compressed,
            body: Body::Frame(frame),
        })?;
    }
    if reader.read(&mut [0u8]).map_err(&undecodable)? > 0 {
        return Err(bad(
            pkg,
            "archive",
            format!("{} bytes", pkg.archive.size),
            "more".into(),
        ));
    }
    Ok(seen)
}

/// Read into all of `buf` unless the input ends first; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Decode a large file's bytes into pieces for the worker that took its job (see
/// [`PIECE_ABOVE`]), reusing the buffers it hands back. The file ends when its sender is
/// dropped: after its last piece if it was complete, else early, and the worker then writes
/// nothing more of it and announces nothing.
fn send_pieces(
    pkg: &Package,
    entry: &mut impl Read,
    size: u64,
    tx: &std::sync::mpsc::SyncSender<(Vec<u8>, usize)>,
    spare: &std::sync::mpsc::Receiver<Vec<u8>>,
    queue: &Queue<'_>,
    too_long: impl Fn() -> FetchError,
) -> Result<()> {
    let mut total = 0u64;
    loop {
        let mut buf = spare.try_recv().unwrap_or_else(|_| vec![0u8; PIECE]);
        let n = read_full(entry, &mut buf).map_err(undecodable(pkg))?;
        total += n as u64;
        if total > size {
            return Err(too_long());
        }
        if n > 0 && tx.send((buf, n)).is_err() {
            // The worker stopped: its error is the queue's.
            return Err(queue
                .failure()
                .unwrap_or_else(|| FetchError::invalid("unpack", "a file's worker stopped")));
        }
        if n < PIECE {
            return Ok(());
        }
    }
}

/// One file read out of the archive, for a worker to verify and write.
struct Job<'a> {
    /// As the index lists it.
    path: &'a str,
    sha: &'a str,
    size: u64,
    dst: PathBuf,
    /// One of the archive's first [`Package::traced`] files.
    traced: bool,
    /// Bytes of the queue's budget this job holds until it is done.
    reserved: u64,
    body: Body,
}

/// A job's bytes: all of them, the zstd frame that holds all of them, or pieces arriving
/// from the parser.
enum Body {
    Whole(Vec<u8>),
    Frame(Vec<u8>),
    Pieces {
        /// A piece and how many of its bytes are the file's; ends when the parser drops it.
        rx: std::sync::mpsc::Receiver<(Vec<u8>, usize)>,
        /// Written pieces go back to the parser for the next ones.
        spare: std::sync::mpsc::SyncSender<Vec<u8>>,
    },
}

/// Write a file's bytes into the staged tree, hashing them on the way, check them against the
/// index and hand the file to the hook. In pieces: each is hashed and copied while it is in
/// this core's cache (one whole-file `write` reads the buffer from memory twice).
fn write_job(
    pkg: &Package,
    job: &Job,
    in_place: bool,
    on_verified: Option<&FileHook>,
) -> Result<()> {
    let mut out = create_staged(&job.dst, in_place)?;
    let mut hasher = Sha256::new();
    let mut write = |data: &[u8]| -> Result<()> {
        for piece in data.chunks(64 << 10) {
            hasher.update(piece);
            out.write_all(piece).ctx("write", &job.dst)?;
        }
        Ok(())
    };
    let n = match &job.body {
        Body::Whole(data) => {
            write(data)?;
            data.len() as u64
        }
        Body::Frame(frame) => {
            // Refused before a byte is written if it is not one frame of the listed size.
            let data = crate::frame_index::decode_frame(frame, job.size)
                .map_err(|e| bad(pkg, job.path, "its frame".into(), e.0))?;
            write(&data)?;
            data.len() as u64
        }
        Body::Pieces { rx, spare } => {
            let mut n = 0u64;
            for (buf, len) in rx {
                write(&buf[..len])?;
                n += len as u64;
                let _ = spare.try_send(buf);
            }
            n
        }
    };
    let got = hex::encode(hasher.finalize());
    // A file cut short (the parser stopped) fails here and is never announced.
    check_file(pkg, job.path, (job.sha, job.size), &got, n)?;
    seal(&out, &job.dst, in_place)?;
    drop(out);
    if let Some(hook) = on_verified {
        hook(job.sha, &job.dst);
    }
    Ok(())
}

/// The hand-off from the parser to the workers: at most `max_jobs` files waiting and
/// `max_bytes` of file data reserved by the parser and not yet written by a worker. The
/// first error recorded wins and stops both sides; every change wakes everyone (a handful of
/// threads, a few thousand files).
struct Queue<'a> {
    state: Mutex<QueueState<'a>>,
    changed: Condvar,
    max_jobs: usize,
    max_bytes: u64,
}

struct QueueState<'a> {
    jobs: VecDeque<Job<'a>>,
    bytes: u64,
    /// The parser is done: the workers stop once the queue is empty.
    closed: bool,
    failed: Option<FetchError>,
}

impl<'a> Queue<'a> {
    fn new(max_jobs: usize, max_bytes: u64) -> Self {
        Queue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                bytes: 0,
                closed: false,
                failed: None,
            }),
            changed: Condvar::new(),
            max_jobs,
            max_bytes,
        }
    }

    /// Wait until a job slot and `n` bytes are free (any `n` once nothing is in flight), and
    /// take them. Fails with the recorded error once the pipeline has failed.
    fn reserve(&self, n: u64) -> Result<()> {
        let state = lock(&self.state);
        let mut state = self
            .changed
            .wait_while(state, |s| {
                s.failed.is_none()
                    && (s.jobs.len() >= self.max_jobs
                        || (s.bytes > 0 && s.bytes.saturating_add(n) > self.max_bytes))
            })
            .unwrap_or_else(|e| e.into_inner());
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        state.bytes += n;
        Ok(())
    }

    /// Queue a job whose bytes were reserved (only the parser adds: the slot is still free).
    fn push(&self, job: Job<'a>) -> Result<()> {
        let mut state = lock(&self.state);
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        state.jobs.push_back(job);
        self.changed.notify_all();
        Ok(())
    }

    /// The next job, or `None` once the queue is closed and empty or the pipeline failed.
    fn pop(&self) -> Option<Job<'a>> {
        let state = lock(&self.state);
        let mut state = self
            .changed
            .wait_while(state, |s| {
                s.failed.is_none() && s.jobs.is_empty() && !s.closed
            })
            .unwrap_or_else(|e| e.into_inner());
        if state.failed.is_some() {
            return None;
        }
        let job = state.jobs.pop_front();
        self.changed.notify_all();
        job
    }

    /// A worker finished a job of `n` reserved bytes.
    fn done(&self, n: u64, result: Result<()>) {
        let mut state = lock(&self.state);
        state.bytes = state.bytes.saturating_sub(n);
        if let Err(e) = result {
            state.failed.get_or_insert(e);
        }
        self.changed.notify_all();
    }

    /// The error that stopped the pipeline, if one did.
    fn failure(&self) -> Option<FetchError> {
        lock(&self.state).failed.clone()
    }

    /// Record `e` unless an earlier error was, and stop everyone.
    fn fail(&self, e: FetchError) {
        lock(&self.state).failed.get_or_insert(e);
        self.changed.notify_all();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_all();
    }

    fn into_result(self) -> Result<()> {
        let state = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        state.failed.map_or(Ok(()), Err)
    }
}

/// Fails the pipeline if its thread panics, so the others stop instead of waiting for it
/// (the panic itself reaches the caller when the thread scope ends).
struct StopOnPanic<'q, 'a>(&'q Queue<'a>);

impl Drop for StopOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .fail(FetchError::invalid("unpack", "a pipeline thread panicked"));
        }
    }
}

/// Threads that decode an archive's frames in parallel: none on a machine of two cores or
/// fewer, where the proc, the parser and the writers already use every core. Measured on 2
/// vCPUs (cold numpy, 9 alternating runs against MinIO): decoding in parallel cost 25 ms more
/// CPU per run (every decoded byte copied once more, fresh frame buffers) for no gain in time.
fn decode_threads() -> usize {
    let forced = FORCE_DECODERS.load(Ordering::Relaxed);
    if forced > 0 {
        return forced;
    }
    std::thread::available_parallelism().map_or(0, |n| match n.get() {
        0..=2 => 0,
        n => (n - 2).min(4),
    })
}

/// Tests: decode in parallel with this many threads whatever the machine (0: by the cores).
pub(super) static FORCE_DECODERS: AtomicUsize = AtomicUsize::new(0);

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::cache::tests::published;
    use crate::config::FetchConfig;

    #[tokio::test]
    async fn an_archive_that_unpacks_to_more_than_its_index_lists_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = published(tmp.path()).await;
        let cfg = FetchConfig::default();
        let idx = crate::publish::read_index(store.as_ref(), &cfg)
            .await
            .unwrap();
        let mut pkg = idx.package("demo").unwrap().clone();
        pkg.archive.encoding = Encoding::TarZstd;
        // 64 MiB of zeros compresses to a few KiB: a decompression bomb in one tar entry.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(
            &mut h,
            "demo/__init__.py",
            std::io::repeat(0).take(64 << 20),
        )
        .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, FetchError::IntegrityMismatch { .. }), "{err}");
        // The same bytes with a size the index allows get as far as the hash check.
        pkg.files.truncate(1);
        pkg.files[0].size = 64 << 20;
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t2"),
            None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("sha256"), "{err}");

        // A large file goes to its worker in pieces, with the same checks.
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        let big = (64 << 20) + 1;
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(big);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, "demo/__init__.py", std::io::repeat(0).take(big))
            .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let zeros = {
            let mut h = Sha256::new();
            std::io::copy(&mut std::io::repeat(0).take(big), &mut h).unwrap();
            hex::encode(h.finalize())
        };
        pkg.files[0].size = big + 1;
        pkg.files[0].sha256 = zeros.clone();
        let err = unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t3"), None).unwrap_err();
        assert!(err.to_string().contains(&format!("size {big}")), "{err}");
        // An entry longer than the index says is cut off after the pieces it may have, and
        // its worker announces nothing.
        pkg.files[0].size = 2 << 20;
        let announced = Arc::new(AtomicU64::new(0));
        let a2 = announced.clone();
        let count = move |_: &str, _: &Path| {
            a2.fetch_add(1, Ordering::Relaxed);
        };
        let err =
            unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t5"), Some(&count)).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        assert_eq!(announced.load(Ordering::Relaxed), 0);
        pkg.files[0].size = big;
        let hooked = Arc::new(AtomicU64::new(0));
        let h2 = hooked.clone();
        let hook = move |_: &str, p: &Path| {
            h2.store(std::fs::metadata(p).unwrap().len(), Ordering::Relaxed);
        };
        unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t4"), Some(&hook)).unwrap();
        assert_eq!(hooked.load(Ordering::Relaxed), big);
        assert!(root.join("cas").join(&zeros).exists());
    }

    /// A package of `n` files `demo/fNN.bin` whose archive holds other bytes for file `bad`.
    fn package_with_a_corrupt_file(n: usize, bad: usize) -> (Package, Vec<u8>) {
        let mut tar = tar::Builder::new(Vec::new());
        let mut files = Vec::new();
        for i in 0..n {
            let path = format!("demo/f{i:02}.bin");
            let data = vec![i as u8; 1000 + 37 * i];
            files.push(crate::index::FileEntry {
                path: path.clone(),
                sha256: hex::encode(Sha256::digest(&data)),
                size: data.len() as u64,
            });
            let mut stored = data;
            if i == bad {
                stored[500] ^= 1;
            }
            let mut h = tar::Header::new_ustar();
            h.set_size(stored.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            tar.append_data(&mut h, &path, &stored[..]).unwrap();
        }
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        let pkg = Package {
            name: "demo".into(),
            version: "1".into(),
            source: "test".into(),
            top_level: vec!["demo".into()],
            archive: crate::index::Archive {
                key: "pkgs/demo.tar.zst".into(),
                sha256: hex::encode(Sha256::digest(&data)),
                size: data.len() as u64,
                encoding: Encoding::TarZstd,
            },
            files,
            bytecode: None,
            traced: None,
            reads: Vec::new(),
        };
        (pkg, data)
    }

    #[test]
    fn a_corrupt_file_among_many_stops_the_pipeline_and_nothing_reaches_the_cas() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        // Many more files than workers, the bad one in the middle.
        let (pkg, data) = package_with_a_corrupt_file(40, 20);
        let hooked: Arc<Mutex<Vec<String>>> = Arc::default();
        let h2 = hooked.clone();
        let hook = move |sha: &str, _: &Path| lock(&h2).push(sha.to_owned());
        let err =
            unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t"), Some(&hook)).unwrap_err();
        match &err {
            FetchError::IntegrityMismatch { file, expected, .. } => {
                assert!(file.starts_with("demo/f20.bin "), "{err}");
                assert!(expected.contains(&pkg.files[20].sha256), "{err}");
            }
            e => panic!("{e}"),
        }
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 0);
        assert!(
            !lock(&hooked).contains(&pkg.files[20].sha256),
            "the hook never sees the corrupt file"
        );

        // The same package intact: every file verified, announced once and stored.
        let (pkg, data) = package_with_a_corrupt_file(40, usize::MAX);
        lock(&hooked).clear();
        unpack_tree(&pkg, &data[..], &root, &tmp.path().join("t2"), Some(&hook)).unwrap();
        let mut hooked = std::mem::take(&mut *lock(&hooked));
        hooked.sort();
        let mut listed: Vec<_> = pkg.files.iter().map(|f| f.sha256.clone()).collect();
        listed.sort();
        assert_eq!(hooked, listed);
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 40);
        for f in &pkg.files {
            let got = std::fs::read(tmp.path().join("t2").join(&f.path)).unwrap();
            assert_eq!(hex::encode(Sha256::digest(&got)), f.sha256);
        }
    }

    #[test]
    fn frames_decoded_in_parallel_install_the_same_and_a_corrupt_file_still_stops_all() {
        // Decoding threads whatever this machine has (others tests may take that path too:
        // both paths are correct).
        FORCE_DECODERS.store(2, Ordering::Relaxed);
        let reframed = |data: &[u8]| -> Vec<u8> {
            let raw = zstd::decode_all(data).unwrap();
            raw.chunks(8 << 10)
                .flat_map(|c| zstd::bulk::compress(c, 1).unwrap())
                .collect()
        };
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        let (pkg, data) = package_with_a_corrupt_file(40, 20);
        let err = unpack_tree(
            &pkg,
            &reframed(&data)[..],
            &root,
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&err, FetchError::IntegrityMismatch { file, .. } if file.starts_with("demo/f20.bin ")),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 0);
        let (pkg, data) = package_with_a_corrupt_file(40, usize::MAX);
        let framed = reframed(&data);
        assert!(framed.len() > data.len(), "many frames");
        unpack_tree(&pkg, &framed[..], &root, &tmp.path().join("t2"), None).unwrap();
        for f in &pkg.files {
            let got = std::fs::read(tmp.path().join("t2").join(&f.path)).unwrap();
            assert_eq!(hex::encode(Sha256::digest(&got)), f.sha256);
        }
        FORCE_DECODERS.store(0, Ordering::Relaxed);
    }

    /// [`package_with_a_corrupt_file`] in the frame-per-file layout, with the bytes of the
    /// file `bad` changed as `spoil` says (the frame index keeps the index's hash and size).
    fn framed_package(n: usize, bad: usize, spoil: fn(&mut Vec<u8>)) -> (Package, Vec<u8>) {
        let (mut pkg, _) = package_with_a_corrupt_file(n, usize::MAX);
        let contents: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 1000 + 37 * i]).collect();
        let mut entries = Vec::new();
        let mut frames = Vec::new();
        for (i, (f, c)) in pkg.files.iter().zip(&contents).enumerate() {
            let mut frame = zstd::bulk::compress(c, 3).unwrap();
            if i == bad {
                spoil(&mut frame);
            }
            entries.push(crate::frame_index::FrameEntry {
                path: f.path.clone(),
                offset: frames.len() as u64,
                compressed: frame.len() as u64,
                size: f.size,
                sha256: hex::decode(&f.sha256).unwrap().try_into().unwrap(),
            });
            frames.extend(frame);
        }
        let mut data = crate::frame_index::encode(&entries);
        data.extend(frames);
        pkg.archive.encoding = Encoding::Frames;
        pkg.archive.size = data.len() as u64;
        (pkg, data)
    }

    #[test]
    fn a_corrupt_frame_is_refused_before_it_is_announced_and_nothing_reaches_the_cas() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        type Spoil = fn(&mut Vec<u8>);
        let spoils: [(Spoil, &str); 3] = [
            // Other bytes that still decode: the hash refuses them.
            (
                |f| *f = zstd::bulk::compress(&[9u8; 1740], 3).unwrap(),
                "sha256",
            ),
            // A frame that declares more than the index lists (a bomb).
            (
                |f| *f = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap(),
                "declares",
            ),
            // A flipped byte in the frame's last block.
            (
                |f| {
                    let at = f.len() - 2;
                    f[at] ^= 0x5a
                },
                "demo/f20.bin",
            ),
        ];
        for (i, (spoil, why)) in spoils.into_iter().enumerate() {
            let (pkg, data) = framed_package(40, 20, spoil);
            let hooked: Arc<Mutex<Vec<String>>> = Arc::default();
            let h2 = hooked.clone();
            let hook = move |sha: &str, _: &Path| lock(&h2).push(sha.to_owned());
            let tree = tmp.path().join(format!("t{i}"));
            let err = unpack_tree(&pkg, &data[..], &root, &tree, Some(&hook)).unwrap_err();
            assert!(
                matches!(&err, FetchError::IntegrityMismatch { file, .. } if file.starts_with("demo/f20.bin ") || file.starts_with("frame index")),
                "{err}"
            );
            assert!(err.to_string().contains(why), "{why}: {err}");
            assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 0);
            assert!(!lock(&hooked).contains(&pkg.files[20].sha256));
        }
        // Intact: installs, every file verified and stored.
        let (pkg, data) = framed_package(40, usize::MAX, |_| ());
        unpack_tree(&pkg, &data[..], &root, &tmp.path().join("ok"), None).unwrap();
        assert_eq!(std::fs::read_dir(root.join("cas")).unwrap().count(), 40);
        for f in &pkg.files {
            let got = std::fs::read(tmp.path().join("ok").join(&f.path)).unwrap();
            assert_eq!(hex::encode(Sha256::digest(&got)), f.sha256);
        }
    }

    #[test]
    fn a_frame_index_that_disagrees_with_the_bucket_index_is_refused_before_any_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("c");
        std::fs::create_dir_all(root.join("cas")).unwrap();
        let (pkg, data) = framed_package(4, usize::MAX, |_| ());
        // The bucket index lists another hash, another size, or the archive is cut short.
        let mut other = pkg.clone();
        other.files[1].sha256 = "0".repeat(64);
        let mut larger = pkg.clone();
        larger.files[2].size += 1;
        let mut cut = pkg.clone();
        cut.archive.size -= 1;
        for (p, want) in [
            (other, "frame index sha256"),
            (larger, "frame index sha256"),
            (cut, "past the archive's end"),
        ] {
            let tree = tmp.path().join("t");
            let _ = std::fs::remove_dir_all(&tree);
            let err = unpack_tree(&p, &data[..], &root, &tree, None).unwrap_err();
            assert!(err.to_string().contains(want), "{want}: {err}");
            let written = std::fs::read_dir(&tree).unwrap().count();
            assert_eq!(written, 0, "nothing written: {err}");
        }
        // An archive body longer than the index says.
        let mut longer = data.clone();
        longer.push(0);
        let err = unpack_tree(&pkg, &longer[..], &root, &tmp.path().join("l"), None).unwrap_err();
        assert!(err.to_string().contains("more"), "{err}");
    }

    #[test]
    fn a_tar_header_larger_than_the_package_is_refused_before_it_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let (pkg, _) = package_with_a_corrupt_file(2, usize::MAX);
        // A GNU long-name record of 64 MiB: the tar reader would hold it in memory whole.
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(64 << 20);
        h.set_cksum();
        tar.append_data(
            &mut h,
            "././@LongLink",
            std::io::repeat(b'a').take(64 << 20),
        )
        .unwrap();
        let data = zstd::encode_all(&tar.into_inner().unwrap()[..], 3).unwrap();
        assert!(data.len() < 64 << 10, "a small archive");
        let err = unpack_tree(
            &pkg,
            &data[..],
            &tmp.path().join("c"),
            &tmp.path().join("t"),
            None,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("archive unpacks to more than its index lists"),
            "{err}"
        );
    }
}
