//! An embedded realm server speaking the spproxy protocol, for running procs with no σOS.
//!
//! One call's path, by module:
//! - [`conn`]: a connection's reader (framing, bounded by [`ServerLimits::max_frame`]) and
//!   writer, with a bounded outbox;
//! - [`dispatch`]: method name → handler, σOS's reply shape for every call;
//! - [`procstate`]: Init/Started/Exited/ClntId, one state per connection;
//! - [`paths`]: realm paths checked lexically (`..`, absolute, NUL refused);
//! - [`ux`] (scratch directory, openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`) and [`objects`]
//!   (`name/s3/~local/B/K` over an [`ObjectStore`]): the stores;
//! - [`fds`]: the fd table, reads and writes with checked offsets and the quota;
//! - [`waiters`]: the calls that block (Open with wait, a DirWatch read, WaitEvict), all
//!   parked on one waiter thread, however many there are.

mod conn;
mod dispatch;
mod fds;
mod objects;
pub mod paths;
mod procstate;
mod reply;
mod ux;
mod waiters;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::frame::FrameError;
pub use crate::store::{LocalDirStore, ObjectMeta, ObjectStore, StoreError};
pub use procstate::ProcState;
pub use reply::errno_code;

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

/// Bounds on what clients can make the server hold.
#[derive(Clone, Debug)]
pub struct ServerLimits {
    /// Largest frame payload a request may carry, and so the largest read or file one
    /// reply returns. σOS's own bound is the wire's u32 length; its FsLib moves at most
    /// `MAXGETSET` (1 MiB) per GetFile/PutFile and pages larger files.
    pub max_frame: u32,
    /// Bytes the scratch directory may grow to (counted from its size at start, through
    /// this server), and the largest object a write may build. Beyond it a write gets
    /// σOS's error for a full device.
    pub scratch_quota: u64,
    /// Bytes one connection's fds may hold in memory (object buffers, listings) and queue
    /// as unsent replies.
    pub conn_memory: u64,
    /// Open fds per connection.
    pub max_fds: usize,
    /// Parked blocking calls per connection (each holds its path, at most 4 KiB: the
    /// default bounds a connection's parked calls to 64 MiB).
    pub max_waiters: usize,
    /// Connections a bound [`Listener`] serves at once; more are closed at accept.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_frame: 64 << 20,
            scratch_quota: 1 << 30,
            conn_memory: 256 << 20,
            max_fds: 4096,
            max_waiters: 16384,
            max_connections: 256,
        }
    }
}

/// What the server needs to know about its realm.
#[derive(Clone)]
pub struct ServerConfig {
    /// Realm name (reported in logs and errors).
    pub realm: String,
    /// Root of `name/ux/~local/`; created if missing.
    pub scratch_dir: PathBuf,
    /// Why `scratch_dir` must not be made (its calls fail with this), when its caller knows.
    pub scratch_refused: Option<nix::errno::Errno>,
    /// Backend of `name/s3/~local/BUCKET/KEY`.
    pub store: Arc<dyn ObjectStore>,
    pub limits: ServerLimits,
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
            scratch_refused: None,
            store,
            limits: ServerLimits::default(),
        }
    }

    /// The scratch directory is not to be made or opened: its calls fail with `why`.
    pub fn without_scratch(mut self, why: nix::errno::Errno) -> ServerConfig {
        self.scratch_refused = Some(why);
        self
    }

    pub fn with_limits(mut self, limits: ServerLimits) -> ServerConfig {
        self.limits = limits;
        self
    }
}

/// The realm's byte budget for the scratch directory.
pub struct Quota {
    limit: u64,
    /// Bytes held: counted by walking the directory (as long as the directory is large) when a
    /// request first needs the count, not at every start of a server.
    used: OnceLock<AtomicU64>,
    /// The directory to count (`None`: the count was given).
    dir: Option<PathBuf>,
}

impl Quota {
    /// A quota of which `used` bytes are taken.
    pub fn new(limit: u64, used: u64) -> Quota {
        Quota {
            limit,
            used: OnceLock::from(AtomicU64::new(used)),
            dir: None,
        }
    }

    /// A quota over what `dir` holds, counted when first needed.
    pub fn of_dir(limit: u64, dir: PathBuf) -> Quota {
        Quota {
            limit,
            used: OnceLock::new(),
            dir: Some(dir),
        }
    }

    fn counter(&self) -> &AtomicU64 {
        self.used
            .get_or_init(|| AtomicU64::new(self.dir.as_deref().map_or(0, ux::usage)))
    }

    /// Takes `n` bytes; `false` (nothing taken) if they do not fit.
    pub fn reserve(&self, n: u64) -> bool {
        n == 0
            || self
                .counter()
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    u.checked_add(n).filter(|&t| t <= self.limit)
                })
                .is_ok()
    }

    pub fn release(&self, n: u64) {
        let _ = self
            .counter()
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                Some(u.saturating_sub(n))
            });
    }

    pub fn used(&self) -> u64 {
        self.counter().load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

struct Inner {
    cfg: ServerConfig,
    /// The scratch directory, or why it could not be made or opened: then the calls on
    /// `name/ux` fail with that error, and a proc that never makes one runs as any other.
    root: Result<OwnedFd, nix::errno::Errno>,
    quota: Quota,
    procs: procstate::Registry,
    waiters: waiters::Waiters,
    evicted: AtomicBool,
    /// WaitEvict calls parked now.
    evict_waiting: AtomicUsize,
    connections: AtomicUsize,
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
    /// Opens (creating if needed) the scratch directory; what it holds is counted when a
    /// request first needs it. A scratch directory that cannot be made or opened is not an
    /// error here: [`Server::scratch_error`] says why, and the calls that need it fail.
    pub fn new(cfg: ServerConfig) -> Result<Server, ServerError> {
        let root = cfg
            .scratch_refused
            .map_or(Ok(()), Err)
            .and_then(|()| {
                std::fs::create_dir_all(&cfg.scratch_dir)
                    .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
            })
            .and_then(|()| {
                nix::fcntl::open(
                    &cfg.scratch_dir,
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
            });
        let quota = Quota::of_dir(cfg.limits.scratch_quota, cfg.scratch_dir.clone());
        Ok(Server {
            inner: Arc::new(Inner {
                cfg,
                root,
                quota,
                procs: procstate::Registry::default(),
                waiters: waiters::Waiters::default(),
                evicted: AtomicBool::new(false),
                evict_waiting: AtomicUsize::new(0),
                connections: AtomicUsize::new(0),
            }),
        })
    }

    /// Why the scratch directory is unavailable (its calls fail with this), if it is.
    pub fn scratch_error(&self) -> Option<ServerError> {
        let e = *self.inner.root.as_ref().err()?;
        Some(ServerError::ScratchDir {
            realm: self.inner.cfg.realm.clone(),
            path: self.inner.cfg.scratch_dir.clone(),
            source: io::Error::from_raw_os_error(e as i32),
        })
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.cfg
    }

    /// What the realm's first proc (the first connection that called Init) reported, with
    /// the requests served on all connections.
    pub fn proc_state(&self) -> ProcState {
        self.inner.procs.primary()
    }

    /// Every proc that called Init, in order.
    pub fn proc_states(&self) -> Vec<ProcState> {
        self.inner.procs.all()
    }

    /// Bytes the scratch directory holds by this server's count, and its quota.
    pub fn scratch_usage(&self) -> (u64, u64) {
        (self.inner.quota.used(), self.inner.quota.limit())
    }

    /// Blocking calls parked now (all connections).
    pub fn waiting(&self) -> usize {
        self.inner.waiters.len()
    }

    /// Evicts the realm's procs: every `WaitEvict`, parked or later, returns. Returns
    /// whether some proc was waiting for eviction (and so will exit by itself).
    pub fn evict(&self) -> bool {
        // Counted before the flag is set: the waiter thread may answer them at once after.
        let waiting = self.inner.evict_waiting.load(Ordering::SeqCst) > 0;
        self.inner.evicted.store(true, Ordering::SeqCst);
        self.inner.waiters.wake();
        waiting
    }

    pub fn is_evicted(&self) -> bool {
        self.inner.evicted.load(Ordering::SeqCst)
    }

    /// Serves one already-connected stream on a new thread.
    pub fn serve_stream(&self, s: UnixStream) -> JoinHandle<Result<(), ServerError>> {
        let srv = self.clone();
        std::thread::Builder::new()
            .name("spproxy-conn".into())
            .spawn(move || srv.serve_connection(s))
            .expect("spawning a connection thread")
    }

    /// Serves one connection on the calling thread (plus one writer thread) until the peer
    /// closes it (`Ok`) or sends a malformed message (`Err`, connection closed). Everything
    /// the connection held (fds, parked calls) is released when it ends.
    pub fn serve_connection(&self, s: UnixStream) -> Result<(), ServerError> {
        conn::serve(&self.inner, s)
    }

    /// Listens on a Unix socket at `path` (replacing a stale socket file) and serves up to
    /// `max_connections` connections at once, each on its own thread, until the returned
    /// [`Listener`] is shut down or dropped.
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
                    let Ok(s) = s else { continue };
                    let n = srv.inner.connections.load(Ordering::SeqCst);
                    if n >= srv.inner.cfg.limits.max_connections {
                        log_refusal(&format!(
                            "spproxy: refusing a connection: {n} already served"
                        ));
                        drop(s);
                        continue;
                    }
                    srv.serve_stream(s);
                }
            })
            .map_err(berr)?;
        Ok(Listener {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }
}

/// The crate has no logging dependency: refusals are rare and go to stderr.
fn log_refusal(msg: &str) {
    eprintln!("{msg}");
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
