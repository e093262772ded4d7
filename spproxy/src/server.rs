//! An embedded realm server speaking the spproxy protocol, for running procs with no σOS.
//!
//! `name/ux/~local/...` maps to a per-realm scratch directory, resolved with
//! `openat2(RESOLVE_BENEATH)` so `..` and symlinks cannot leave it; `name/s3/~local/B/K`
//! maps to an [`ObjectStore`]. One thread per connection; requests on a connection run in
//! order, except `Open` with wait, which waits on its own thread.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use crate::api;
use crate::consts::*;
use crate::frame::{self, FrameError, Limits};
use crate::proto::*;
use crate::rpc::{self, Request, RpcMessage};
pub use crate::store::{LocalDirStore, ObjectMeta, ObjectStore, StoreError};

/// Largest read the server answers in one reply.
const MAX_IO: u64 = 1 << 30;
/// How often an `Open` with wait looks for its file.
const WAIT_POLL: Duration = Duration::from_millis(5);

#[derive(thiserror::Error, Debug)]
pub enum ServerError {
    #[error("realm {realm}: scratch directory {path}: {source}")]
    ScratchDir {
        realm: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding spproxy socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spproxy connection dropped after a malformed message: {0}")]
    Malformed(#[source] FrameError),
    #[error("spproxy connection: {0}")]
    Io(#[from] io::Error),
}

/// What the server needs to know about its realm.
#[derive(Clone)]
pub struct ServerConfig {
    /// Realm name (reported in logs and errors).
    pub realm: String,
    /// Root of `name/ux/~local/`; created if missing.
    pub scratch_dir: PathBuf,
    /// Backend of `name/s3/~local/BUCKET/KEY`.
    pub store: Arc<dyn ObjectStore>,
}

impl ServerConfig {
    pub fn new(
        realm: impl Into<String>,
        scratch_dir: impl Into<PathBuf>,
        store: Arc<dyn ObjectStore>,
    ) -> ServerConfig {
        ServerConfig {
            realm: realm.into(),
            scratch_dir: scratch_dir.into(),
            store,
        }
    }
}

/// What the proc reported: Started, Exited(status, msg), and the pid it gave at Init.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcState {
    pub started: bool,
    pub exited: Option<(u32, String)>,
    /// `pidStr` of the most recent successful Init.
    pub pid: Option<String>,
    /// Requests served (all connections).
    pub calls: u64,
}

struct Inner {
    cfg: ServerConfig,
    root: OwnedFd,
    state: Mutex<ProcState>,
    clnt_ids: RandomState,
    next_clnt: AtomicU64,
}

/// The embedded server. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Server {
    /// Opens (creating if needed) the scratch directory.
    pub fn new(cfg: ServerConfig) -> Result<Server, ServerError> {
        let err = |source| ServerError::ScratchDir {
            realm: cfg.realm.clone(),
            path: cfg.scratch_dir.clone(),
            source,
        };
        std::fs::create_dir_all(&cfg.scratch_dir).map_err(err)?;
        let root = nix::fcntl::open(
            &cfg.scratch_dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        Ok(Server {
            inner: Arc::new(Inner {
                cfg,
                root,
                state: Mutex::new(ProcState::default()),
                clnt_ids: RandomState::new(),
                next_clnt: AtomicU64::new(1),
            }),
        })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.cfg
    }

    /// A snapshot of what the proc reported so far.
    pub fn proc_state(&self) -> ProcState {
        lock(&self.inner.state).clone()
    }

    /// Serves one already-connected stream on a new thread.
    pub fn serve_stream(&self, s: UnixStream) -> JoinHandle<Result<(), ServerError>> {
        let srv = self.clone();
        std::thread::Builder::new()
            .name("spproxy-conn".into())
            .spawn(move || srv.serve_connection(s))
            .expect("spawning a connection thread")
    }

    /// Serves one connection on the calling thread until the peer closes it (`Ok`) or
    /// sends a malformed message (`Err`, connection closed).
    pub fn serve_connection(&self, s: UnixStream) -> Result<(), ServerError> {
        let conn = Arc::new(Conn {
            writer: Mutex::new(s.try_clone()?),
            fds: Mutex::new(FdTable {
                next: 3,
                map: HashMap::new(),
            }),
            init: Mutex::new(None),
            closed: AtomicBool::new(false),
        });
        let mut reader = BufReader::with_capacity(64 * 1024, s);
        let limits = Limits::default();
        let res = loop {
            match frame::read_message(&mut reader, &limits) {
                Ok(Some(m)) => {
                    if let Err(e) = self.handle(&conn, m) {
                        break Err(ServerError::Io(e));
                    }
                }
                Ok(None) => break Ok(()),
                Err(FrameError::Io(e)) => break Err(ServerError::Io(e)),
                Err(e) => break Err(ServerError::Malformed(e)),
            }
        };
        conn.closed.store(true, Ordering::SeqCst);
        let _ = lock(&conn.writer).shutdown(std::net::Shutdown::Both);
        res
    }

    /// Listens on a Unix socket at `path` (replacing a stale socket file) and serves every
    /// connection on its own thread until the returned [`Listener`] is shut down or dropped.
    pub fn bind(&self, path: &Path) -> Result<Listener, ServerError> {
        let berr = |source| ServerError::Bind {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(berr)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(md) if std::os::unix::fs::FileTypeExt::is_socket(&md.file_type()) => {
                std::fs::remove_file(path).map_err(berr)?
            }
            _ => {}
        }
        let l = UnixListener::bind(path).map_err(berr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let srv = self.clone();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("spproxy-accept".into())
            .spawn(move || {
                for s in l.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(s) = s {
                        srv.serve_stream(s);
                    }
                }
            })
            .map_err(berr)?;
        Ok(Listener {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }

    fn handle(&self, conn: &Arc<Conn>, m: frame::Message) -> io::Result<()> {
        lock(&self.inner.state).calls += 1;
        let seqno = m.seqno;
        let mut req = match Request::from_message(m) {
            Ok(r) => r,
            Err(e) => return conn.send(seqno, rpc_err(ECODE_ERROR, "", &e.to_string())),
        };
        let frames = self.dispatch(conn, &mut req);
        match frames {
            Some(f) => conn.send(seqno, f),
            None => Ok(()), // answered from another thread (Open with wait)
        }
    }

    fn dispatch(&self, conn: &Arc<Conn>, req: &mut Request) -> Option<Vec<Vec<u8>>> {
        let method = req.method.clone();
        if !KNOWN.contains(&method.as_str()) {
            return Some(rpc_err(ECODE_NOTFOUND, &method, ""));
        }
        macro_rules! decode {
            ($t:ty) => {
                match req.decode::<$t>() {
                    Ok(v) => v,
                    Err(e) => {
                        return Some(rpc_err(
                            ECODE_ERROR,
                            "",
                            &format!("{method}: unmarshal {}: {e}", stringify!($t)),
                        ))
                    }
                }
            };
        }
        if method == api::INIT {
            let r = decode!(SigmaInitReq);
            let mut init = lock(&conn.init);
            if init.is_some() {
                return Some(rpc_err(
                    ECODE_ERROR,
                    "",
                    "Error init SPProxySrvAPI: already initialized",
                ));
            }
            let pe = r.proc_env_proto.unwrap_or_default();
            let uid = pe
                .principal
                .as_ref()
                .map(|p| p.i_d_str.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| pe.pid_str.clone());
            let mut h = self.inner.clnt_ids.build_hasher();
            h.write_u64(self.inner.next_clnt.fetch_add(1, Ordering::Relaxed));
            *init = Some(InitInfo {
                uid,
                clnt_id: h.finish() & (u64::MAX >> 1),
            });
            lock(&self.inner.state).pid = Some(pe.pid_str);
            return Some(ok(SigmaErrRep {
                err: Some(Rerror::default()),
            }));
        }
        let Some(info) = lock(&conn.init).clone() else {
            return Some(rpc_err(
                ECODE_ERROR,
                "",
                &format!("{method}: Init has not been called on this connection"),
            ));
        };
        let inner = &self.inner;
        Some(match method.as_str() {
            api::STARTED => {
                decode!(SigmaNullReq);
                lock(&inner.state).started = true;
                ok(SigmaErrRep {
                    err: Some(Rerror::default()),
                })
            }
            api::EXITED => {
                let r = decode!(SigmaExitedReq);
                lock(&inner.state).exited = Some((r.status, r.msg));
                // σOS's handler never sets err: the reply message is empty.
                ok(SigmaErrRep { err: None })
            }
            api::CLOSE => {
                decode!(SigmaNullReq);
                ok(SigmaErrRep {
                    err: Some(Rerror::default()),
                })
            }
            api::CLNT_ID => {
                decode!(SigmaNullReq);
                ok(SigmaClntIdRep {
                    clnt_id: info.clnt_id,
                    err: Some(Rerror::default()),
                })
            }
            api::STAT => {
                let r = decode!(SigmaPathReq);
                match self.stat(&r.path, &info) {
                    Ok(st) => ok(SigmaStatRep {
                        stat: Some(st),
                        err: Some(Rerror::default()),
                    }),
                    Err(e) => ok(SigmaStatRep {
                        stat: None,
                        err: Some(e),
                    }),
                }
            }
            api::CREATE => {
                let r = decode!(SigmaCreateReq);
                fd_rep(self.create(conn, &r.path, r.perm, r.mode))
            }
            api::OPEN => {
                let r = decode!(SigmaCreateReq);
                let first = self.open(conn, &r.path, r.mode);
                let not_found = matches!(&first, Err(e) if e.err_code == ECODE_NOTFOUND);
                if r.wait && not_found {
                    self.spawn_wait_open(conn, req.seqno, r.path, r.mode);
                    return None;
                }
                fd_rep(first)
            }
            api::READ => {
                let r = decode!(SigmaReadReq);
                data_rep(conn.read(r.fd, r.size, r.off))
            }
            api::WRITE => {
                let r = decode!(SigmaWriteReq);
                let data = r.blob.map(|b| b.iov).unwrap_or_default();
                size_rep(conn.write(r.fd, &data))
            }
            api::SEEK => {
                let r = decode!(SigmaSeekReq);
                err_rep(conn.seek(r.fd, r.offset))
            }
            api::CLOSE_FD => {
                let r = decode!(SigmaCloseReq);
                err_rep(self.close_fd(conn, r.fd))
            }
            api::GET_FILE => {
                let r = decode!(SigmaPathReq);
                data_rep(self.get_file(&r.path))
            }
            api::PUT_FILE => {
                let r = decode!(SigmaPutFileReq);
                let data = r.blob.map(|b| b.iov).unwrap_or_default();
                size_rep(self.put_file(&r.path, r.perm, r.mode, &data, r.offset))
            }
            api::REMOVE => {
                let r = decode!(SigmaPathReq);
                err_rep(self.remove(&r.path))
            }
            api::RENAME => {
                let r = decode!(SigmaRenameReq);
                err_rep(self.rename(&r.src, &r.dst))
            }
            api::DIR_WATCH => {
                decode!(SigmaReadReq);
                fd_rep(Err(rerr(
                    ECODE_NOTSUPPORTED,
                    "",
                    "DirWatch is not supported by the embedded realm server",
                )))
            }
            _ => rpc_err(ECODE_NOTFOUND, &method, ""),
        })
    }

    // ---- path resolution ----

    fn parse<'a>(&self, path: &'a str) -> Result<Target<'a>, Rerror> {
        let notfound = || rerr(ECODE_NOTFOUND, path, "no such server in the embedded realm");
        let rest = path.trim_start_matches('/');
        let rest = rest.strip_prefix("name/").ok_or_else(notfound)?;
        let (srv, rest) = rest.split_once('/').unwrap_or((rest, ""));
        let (loc, rest) = rest.split_once('/').unwrap_or((rest, ""));
        if loc != "~local" && loc != "~any" {
            return Err(notfound());
        }
        let rest = rest.trim_matches('/');
        match srv {
            "ux" => {
                // Lexical escapes are refused whether or not the path exists; symlinks
                // are left to openat2(RESOLVE_BENEATH).
                let mut depth: i64 = 0;
                for c in rest.split('/') {
                    match c {
                        "" | "." => {}
                        ".." => depth -= 1,
                        _ => depth += 1,
                    }
                    if depth < 0 {
                        return Err(rerr(ECODE_PERM, path, "path leaves the realm"));
                    }
                }
                Ok(Target::Ux(if rest.is_empty() { "." } else { rest }))
            }
            "s3" => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if bucket.is_empty() {
                    return Err(rerr(ECODE_NOTSUPPORTED, path, "listing buckets"));
                }
                Ok(Target::S3 { bucket, key })
            }
            _ => Err(notfound()),
        }
    }

    fn open_beneath(&self, rel: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
        openat2(
            &self.inner.root,
            rel,
            OpenHow::new()
                .flags(flags | OFlag::O_CLOEXEC)
                .mode(mode)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS),
        )
    }

    /// The parent directory (opened beneath the root) and final name of `rel`.
    fn parent<'a>(&self, path: &str, rel: &'a str) -> Result<(OwnedFd, &'a str), Rerror> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        if name == ".." {
            return Err(rerr(ECODE_PERM, path, "path leaves the realm"));
        }
        if name == "." || name.is_empty() {
            return Err(rerr(ECODE_INVAL, path, "path names no file"));
        }
        let fd = self
            .open_beneath(
                if dir.is_empty() { "." } else { dir },
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .map_err(|e| errno_rerr(e, path))?;
        Ok((fd, name))
    }

    fn stat(&self, path: &str, info: &InitInfo) -> Result<TstatProto, Rerror> {
        let name = last(path).to_owned();
        let mk = |len: u64, dir: bool, perm: u32, ino: u64, atime: u32, mtime: u32| {
            let mode = perm | if dir { DMDIR } else { 0 };
            TstatProto {
                r#type: 0,
                dev: 0,
                qid: Some(TqidProto {
                    r#type: mode >> 24,
                    version: 0,
                    path: ino,
                }),
                mode,
                atime,
                mtime,
                length: len,
                name: name.clone(),
                uid: info.uid.clone(),
                gid: info.uid.clone(),
                muid: info.uid.clone(),
            }
        };
        match self.parse(path)? {
            Target::Ux(rel) => {
                let fd = self
                    .open_beneath(rel, OFlag::O_PATH, Mode::empty())
                    .map_err(|e| errno_rerr(e, path))?;
                let md = File::from(fd).metadata().map_err(|e| io_rerr(&e, path))?;
                Ok(mk(
                    md.len(),
                    md.is_dir(),
                    md.mode() & 0o777,
                    md.ino(),
                    secs32(md.atime()),
                    secs32(md.mtime()),
                ))
            }
            Target::S3 { bucket, key } => {
                let store = &self.inner.cfg.store;
                if key.is_empty() {
                    return match store.has_bucket(bucket) {
                        Ok(true) => Ok(mk(0, true, 0o777, 0, 0, 0)),
                        Ok(false) => Err(rerr(ECODE_NOTFOUND, bucket, "")),
                        Err(e) => Err(store_rerr(e, path)),
                    };
                }
                match store.stat(bucket, key) {
                    Ok(m) => {
                        let t = m
                            .mtime
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0);
                        let t = u32::try_from(t).unwrap_or(u32::MAX);
                        Ok(mk(m.len, false, 0o777, 0, t, t))
                    }
                    Err(StoreError::NotFound { .. }) => {
                        let prefix = format!("{key}/");
                        match store.list(bucket, &prefix) {
                            Ok(keys) if !keys.is_empty() => Ok(mk(0, true, 0o777, 0, 0, 0)),
                            _ => Err(rerr(ECODE_NOTFOUND, last(path), "")),
                        }
                    }
                    Err(e) => Err(store_rerr(e, path)),
                }
            }
        }
    }

    fn open_flags(mode: u32) -> OFlag {
        let mut f = match mode & 3 {
            OWRITE => OFlag::O_WRONLY,
            ORDWR => OFlag::O_RDWR,
            _ => OFlag::O_RDONLY,
        };
        if mode & OTRUNC != 0 {
            f |= OFlag::O_TRUNC;
        }
        if mode & OAPPEND != 0 {
            f |= OFlag::O_APPEND;
        }
        f
    }

    fn create(&self, conn: &Conn, path: &str, perm: u32, mode: u32) -> Result<u32, Rerror> {
        match self.parse(path)? {
            Target::Ux(rel) => {
                let bits = Mode::from_bits_truncate((perm & 0o777) | 0o600);
                let h = if perm & DMDIR != 0 {
                    let (dir, name) = self.parent(path, rel)?;
                    nix::sys::stat::mkdirat(&dir, name, bits | Mode::S_IXUSR)
                        .map_err(|e| errno_rerr(e, path))?;
                    let fd = self
                        .open_beneath(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
                        .map_err(|e| errno_rerr(e, path))?;
                    Handle::Dir {
                        _file: File::from(fd),
                    }
                } else {
                    let (_dir, _name) = self.parent(path, rel)?;
                    let fd = self
                        .open_beneath(
                            rel,
                            Self::open_flags(mode) | OFlag::O_CREAT | OFlag::O_EXCL,
                            bits,
                        )
                        .map_err(|e| errno_rerr(e, path))?;
                    Handle::File {
                        file: File::from(fd),
                        off: 0,
                        mode,
                    }
                };
                Ok(conn.insert(h))
            }
            Target::S3 { bucket, key } => {
                if key.is_empty() || perm & DMDIR != 0 {
                    return Err(rerr(
                        ECODE_NOTSUPPORTED,
                        path,
                        "directories in the object store",
                    ));
                }
                let store = &self.inner.cfg.store;
                match store.stat(bucket, key) {
                    Ok(_) => return Err(rerr(ECODE_EXISTS, last(path), "")),
                    Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(store_rerr(e, path)),
                }
                if !store.has_bucket(bucket).map_err(|e| store_rerr(e, path))? {
                    return Err(rerr(ECODE_NOTFOUND, bucket, ""));
                }
                Ok(conn.insert(Handle::ObjWrite {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                    buf: Vec::new(),
                    off: 0,
                }))
            }
        }
    }

    fn open(&self, conn: &Conn, path: &str, mode: u32) -> Result<u32, Rerror> {
        match self.parse(path)? {
            Target::Ux(rel) => {
                let fd = self
                    .open_beneath(rel, Self::open_flags(mode), Mode::empty())
                    .map_err(|e| errno_rerr(e, path))?;
                let file = File::from(fd);
                let is_dir = file.metadata().map(|m| m.is_dir()).unwrap_or(false);
                let h = if is_dir {
                    Handle::Dir { _file: file }
                } else {
                    Handle::File { file, off: 0, mode }
                };
                Ok(conn.insert(h))
            }
            Target::S3 { bucket, key } => {
                let store = &self.inner.cfg.store;
                if mode & 3 == OREAD || mode & 3 == OEXEC {
                    let data = store.get(bucket, key).map_err(|e| store_rerr(e, path))?;
                    Ok(conn.insert(Handle::ObjRead { data, off: 0 }))
                } else {
                    let buf = if mode & OTRUNC != 0 {
                        Vec::new()
                    } else {
                        match store.get(bucket, key) {
                            Ok(d) => d,
                            Err(e) => return Err(store_rerr(e, path)),
                        }
                    };
                    Ok(conn.insert(Handle::ObjWrite {
                        bucket: bucket.to_owned(),
                        key: key.to_owned(),
                        buf,
                        off: 0,
                    }))
                }
            }
        }
    }

    fn spawn_wait_open(&self, conn: &Arc<Conn>, seqno: u64, path: String, mode: u32) {
        let srv = self.clone();
        let conn = conn.clone();
        std::thread::spawn(move || loop {
            if conn.closed.load(Ordering::SeqCst) {
                return;
            }
            match srv.open(&conn, &path, mode) {
                Err(e) if e.err_code == ECODE_NOTFOUND => std::thread::sleep(WAIT_POLL),
                res => {
                    let _ = conn.send(seqno, fd_rep(res));
                    return;
                }
            }
        });
    }

    fn close_fd(&self, conn: &Conn, fd: u32) -> Result<(), Rerror> {
        let h = lock(&conn.fds)
            .map
            .remove(&fd)
            .ok_or_else(|| unknown_fd(fd))?;
        if let Handle::ObjWrite {
            bucket, key, buf, ..
        } = h
        {
            self.inner
                .cfg
                .store
                .put(&bucket, &key, &buf)
                .map_err(|e| store_rerr(e, &key))?;
        }
        Ok(())
    }

    fn get_file(&self, path: &str) -> Result<Vec<u8>, Rerror> {
        match self.parse(path)? {
            Target::Ux(rel) => {
                let fd = self
                    .open_beneath(rel, OFlag::O_RDONLY, Mode::empty())
                    .map_err(|e| errno_rerr(e, path))?;
                let mut f = File::from(fd);
                let md = f.metadata().map_err(|e| io_rerr(&e, path))?;
                if md.is_dir() {
                    return Err(rerr(ECODE_ISDIR, last(path), ""));
                }
                if md.len() > MAX_IO {
                    return Err(rerr(
                        ECODE_BADCOUNT,
                        last(path),
                        "file too large for one reply",
                    ));
                }
                let mut buf = Vec::with_capacity(md.len() as usize);
                io::Read::read_to_end(&mut f, &mut buf).map_err(|e| io_rerr(&e, path))?;
                Ok(buf)
            }
            Target::S3 { bucket, key } => self
                .inner
                .cfg
                .store
                .get(bucket, key)
                .map_err(|e| store_rerr(e, path)),
        }
    }

    /// Creates the file if missing (fails with Exists if it is there and `mode` has OEXCL),
    /// truncates it with OTRUNC, and writes `data` at `offset` (appends with OAPPEND).
    fn put_file(
        &self,
        path: &str,
        perm: u32,
        mode: u32,
        data: &[Vec<u8>],
        offset: u64,
    ) -> Result<u64, Rerror> {
        let total: u64 = data.iter().map(|d| d.len() as u64).sum();
        let offset = if offset == NO_OFFSET { 0 } else { offset };
        match self.parse(path)? {
            Target::Ux(rel) => {
                self.parent(path, rel)?;
                let mut flags = OFlag::O_CREAT | OFlag::O_WRONLY;
                if mode & OEXCL != 0 {
                    flags |= OFlag::O_EXCL;
                }
                if mode & OTRUNC != 0 {
                    flags |= OFlag::O_TRUNC;
                }
                if mode & OAPPEND != 0 {
                    flags |= OFlag::O_APPEND;
                }
                let bits = Mode::from_bits_truncate((perm & 0o777) | 0o600);
                let fd = self
                    .open_beneath(rel, flags, bits)
                    .map_err(|e| errno_rerr(e, path))?;
                let f = File::from(fd);
                let mut off = offset;
                for d in data {
                    f.write_all_at(d, off).map_err(|e| io_rerr(&e, path))?;
                    off += d.len() as u64;
                }
                Ok(total)
            }
            Target::S3 { bucket, key } => {
                if offset != 0 || mode & OAPPEND != 0 {
                    return Err(rerr(
                        ECODE_NOTSUPPORTED,
                        path,
                        "object store writes are whole objects",
                    ));
                }
                let store = &self.inner.cfg.store;
                if mode & OEXCL != 0 && store.stat(bucket, key).is_ok() {
                    return Err(rerr(ECODE_EXISTS, last(path), ""));
                }
                store
                    .put(bucket, key, &data.concat())
                    .map_err(|e| store_rerr(e, path))?;
                Ok(total)
            }
        }
    }

    fn remove(&self, path: &str) -> Result<(), Rerror> {
        match self.parse(path)? {
            Target::Ux(rel) => {
                let (dir, name) = self.parent(path, rel)?;
                match nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir) {
                    Err(Errno::EISDIR) => {
                        nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir)
                    }
                    r => r,
                }
                .map_err(|e| errno_rerr(e, path))
            }
            Target::S3 { bucket, key } => self
                .inner
                .cfg
                .store
                .remove(bucket, key)
                .map_err(|e| store_rerr(e, path)),
        }
    }

    fn rename(&self, src: &str, dst: &str) -> Result<(), Rerror> {
        match (self.parse(src)?, self.parse(dst)?) {
            (Target::Ux(a), Target::Ux(b)) => {
                let (da, na) = self.parent(src, a)?;
                let (db, nb) = self.parent(dst, b)?;
                nix::fcntl::renameat(&da, na, &db, nb).map_err(|e| errno_rerr(e, src))
            }
            (
                Target::S3 {
                    bucket: ba,
                    key: ka,
                },
                Target::S3 {
                    bucket: bb,
                    key: kb,
                },
            ) if ba == bb => self
                .inner
                .cfg
                .store
                .rename(ba, ka, kb)
                .map_err(|e| store_rerr(e, src)),
            _ => Err(rerr(
                ECODE_NOTSUPPORTED,
                src,
                "rename across servers or buckets",
            )),
        }
    }
}

/// A bound listening socket; stops accepting and removes the socket file when shut down
/// or dropped. Connections already accepted keep running until their peers close.
pub struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            // Wake the accept loop so it sees the flag.
            let _ = UnixStream::connect(&self.path);
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop_now();
    }
}

const KNOWN: &[&str] = &[
    api::INIT,
    api::STARTED,
    api::EXITED,
    api::CLOSE,
    api::CLNT_ID,
    api::STAT,
    api::CREATE,
    api::OPEN,
    api::READ,
    api::WRITE,
    api::SEEK,
    api::CLOSE_FD,
    api::GET_FILE,
    api::PUT_FILE,
    api::REMOVE,
    api::RENAME,
    api::DIR_WATCH,
];

enum Target<'a> {
    Ux(&'a str),
    S3 { bucket: &'a str, key: &'a str },
}

#[derive(Clone)]
struct InitInfo {
    uid: String,
    clnt_id: u64,
}

enum Handle {
    File {
        file: File,
        off: u64,
        mode: u32,
    },
    Dir {
        _file: File,
    },
    ObjRead {
        data: Vec<u8>,
        off: u64,
    },
    ObjWrite {
        bucket: String,
        key: String,
        buf: Vec<u8>,
        off: u64,
    },
}

struct FdTable {
    next: u32,
    map: HashMap<u32, Handle>,
}

struct Conn {
    writer: Mutex<UnixStream>,
    fds: Mutex<FdTable>,
    init: Mutex<Option<InitInfo>>,
    closed: AtomicBool,
}

impl Conn {
    fn send(&self, seqno: u64, frames: Vec<Vec<u8>>) -> io::Result<()> {
        let buf = frame::encode(seqno, &frames);
        lock(&self.writer).write_all(&buf)
    }

    fn insert(&self, h: Handle) -> u32 {
        let mut t = lock(&self.fds);
        let fd = t.next;
        t.next = t.next.wrapping_add(1).max(3);
        t.map.insert(fd, h);
        fd
    }

    fn read(&self, fd: u32, size: u64, off: u64) -> Result<Vec<u8>, Rerror> {
        let mut t = lock(&self.fds);
        let h = t.map.get_mut(&fd).ok_or_else(|| unknown_fd(fd))?;
        let size = size.min(MAX_IO);
        match h {
            Handle::File {
                file,
                off: cur,
                mode,
            } => {
                if *mode & 3 == OWRITE {
                    return Err(rerr(ECODE_PERM, &fd.to_string(), "fd not open for reading"));
                }
                let at = if off == NO_OFFSET { *cur } else { off };
                let len = file.metadata().map(|m| m.len()).unwrap_or(0);
                let want = size.min(len.saturating_sub(at)) as usize;
                let mut buf = vec![0u8; want];
                let mut got = 0;
                while got < want {
                    match file.read_at(&mut buf[got..], at + got as u64) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_rerr(&e, &fd.to_string())),
                    }
                }
                buf.truncate(got);
                if off == NO_OFFSET {
                    *cur += got as u64;
                }
                Ok(buf)
            }
            Handle::Dir { .. } => Err(rerr(
                ECODE_NOTSUPPORTED,
                &fd.to_string(),
                "reading directories is not supported by the embedded realm server",
            )),
            Handle::ObjRead { data, off: cur } => {
                let at = if off == NO_OFFSET { *cur } else { off };
                let s = (at.min(data.len() as u64)) as usize;
                let e = s + (size as usize).min(data.len() - s);
                if off == NO_OFFSET {
                    *cur = e as u64;
                }
                Ok(data[s..e].to_vec())
            }
            Handle::ObjWrite { .. } => {
                Err(rerr(ECODE_PERM, &fd.to_string(), "fd not open for reading"))
            }
        }
    }

    fn write(&self, fd: u32, data: &[Vec<u8>]) -> Result<u64, Rerror> {
        let mut t = lock(&self.fds);
        let h = t.map.get_mut(&fd).ok_or_else(|| unknown_fd(fd))?;
        let total: u64 = data.iter().map(|d| d.len() as u64).sum();
        match h {
            Handle::File { file, off, mode } => {
                if *mode & 3 == OREAD || *mode & 3 == OEXEC {
                    return Err(rerr(ECODE_PERM, &fd.to_string(), "fd not open for writing"));
                }
                for d in data {
                    file.write_all_at(d, *off)
                        .map_err(|e| io_rerr(&e, &fd.to_string()))?;
                    *off += d.len() as u64;
                }
                Ok(total)
            }
            Handle::ObjWrite { buf, off, .. } => {
                for d in data {
                    let at = *off as usize;
                    if buf.len() < at + d.len() {
                        buf.resize(at + d.len(), 0);
                    }
                    buf[at..at + d.len()].copy_from_slice(d);
                    *off += d.len() as u64;
                }
                Ok(total)
            }
            Handle::Dir { .. } => Err(rerr(ECODE_ISDIR, &fd.to_string(), "")),
            Handle::ObjRead { .. } => {
                Err(rerr(ECODE_PERM, &fd.to_string(), "fd not open for writing"))
            }
        }
    }

    fn seek(&self, fd: u32, to: u64) -> Result<(), Rerror> {
        let mut t = lock(&self.fds);
        match t.map.get_mut(&fd).ok_or_else(|| unknown_fd(fd))? {
            Handle::File { off, .. }
            | Handle::ObjRead { off, .. }
            | Handle::ObjWrite { off, .. } => {
                *off = to;
                Ok(())
            }
            Handle::Dir { .. } => Err(rerr(ECODE_ISDIR, &fd.to_string(), "")),
        }
    }
}

fn secs32(t: i64) -> u32 {
    u32::try_from(t.max(0)).unwrap_or(u32::MAX)
}

fn last(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

fn rerr(code: u32, obj: &str, msg: &str) -> Rerror {
    Rerror {
        err_code: code,
        obj: obj.to_owned(),
        err: msg.to_owned(),
    }
}

fn unknown_fd(fd: u32) -> Rerror {
    rerr(ECODE_UNKNOWNFID, &fd.to_string(), "")
}

/// The σOS code for an errno.
pub fn errno_code(e: Errno) -> u32 {
    match e {
        Errno::ENOENT => ECODE_NOTFOUND,
        Errno::EEXIST => ECODE_EXISTS,
        Errno::EACCES | Errno::EPERM | Errno::EXDEV | Errno::EROFS => ECODE_PERM,
        Errno::EISDIR => ECODE_ISDIR,
        Errno::ENOTDIR => ECODE_NOTDIR,
        Errno::ENOTEMPTY => ECODE_NOTEMPTY,
        Errno::EBADF => ECODE_UNKNOWNFID,
        Errno::EINVAL | Errno::ENAMETOOLONG => ECODE_INVAL,
        Errno::ENOMEM => ECODE_NOMEM,
        Errno::EOPNOTSUPP => ECODE_NOTSUPPORTED,
        _ => ECODE_IO,
    }
}

fn errno_rerr(e: Errno, path: &str) -> Rerror {
    let code = errno_code(e);
    let obj = if code == ECODE_PERM { path } else { last(path) };
    let msg = if e == Errno::EXDEV {
        "path leaves the realm".to_owned()
    } else {
        e.desc().to_owned()
    };
    rerr(code, obj, &msg)
}

fn io_rerr(e: &io::Error, path: &str) -> Rerror {
    match e.raw_os_error() {
        Some(n) => errno_rerr(Errno::from_raw(n), path),
        None => rerr(ECODE_IO, last(path), &e.to_string()),
    }
}

fn store_rerr(e: StoreError, path: &str) -> Rerror {
    match e {
        StoreError::NotFound { .. } => rerr(ECODE_NOTFOUND, last(path), ""),
        StoreError::PermissionDenied { .. } => rerr(ECODE_PERM, path, &e.to_string()),
        StoreError::InvalidKey { .. } => rerr(ECODE_PERM, path, &e.to_string()),
        StoreError::Unavailable { .. } => rerr(ECODE_UNREACHABLE, path, &e.to_string()),
    }
}

fn ok<M: RpcMessage>(m: M) -> Vec<Vec<u8>> {
    rpc::reply_frames(m)
}

fn rpc_err(code: u32, obj: &str, msg: &str) -> Vec<Vec<u8>> {
    rpc::rpc_error_frames(rerr(code, obj, msg))
}

fn fd_rep(r: Result<u32, Rerror>) -> Vec<Vec<u8>> {
    ok(match r {
        Ok(fd) => SigmaFdRep {
            fd,
            err: Some(Rerror::default()),
        },
        Err(e) => SigmaFdRep {
            fd: NO_FD,
            err: Some(e),
        },
    })
}

fn size_rep(r: Result<u64, Rerror>) -> Vec<Vec<u8>> {
    ok(match r {
        Ok(size) => SigmaSizeRep {
            size,
            err: Some(Rerror::default()),
        },
        Err(e) => SigmaSizeRep {
            size: 0,
            err: Some(e),
        },
    })
}

fn err_rep(r: Result<(), Rerror>) -> Vec<Vec<u8>> {
    ok(SigmaErrRep {
        err: Some(r.err().unwrap_or_default()),
    })
}

/// On error σOS still sends the (empty) data frame.
fn data_rep(r: Result<Vec<u8>, Rerror>) -> Vec<Vec<u8>> {
    let (data, err) = match r {
        Ok(d) => (d, Rerror::default()),
        Err(e) => (Vec::new(), e),
    };
    ok(SigmaDataRep {
        blob: Some(Blob {
            iov: vec![data],
            split_iov: vec![],
        }),
        err: Some(err),
    })
}
