//! An embedded realm server speaking the spproxy protocol, for running procs with no σOS.
//!
//! One call's path through the files; data flows down, and no file imports one above it:
//!
//! ```text
//! Server::bind / serve_stream (this file)
//!   └─▶ conn      reads a frame ───────────────────────────────┐ owns the socket, the writer
//!         │        (bounded by ServerLimits::max_frame)         │ thread, the outbox and the
//!         ▼                                                      │ connection's Session
//!       dispatch   handle(&Inner, &Session, Message) -> Outcome  │
//!         │          method → handler; paths::parse;             │
//!         │          ux / objects (the stores) and fds           │
//!         ├─ Outcome::Reply(frames) ─────────────────────────────┴─▶ conn writes it now
//!         └─ Outcome::Park(wait) ──▶ conn: waiters::park(server, conn as Peer, seqno, wait)
//!                                          │
//!                 waiter thread: on a change, retries through the server's Retry handle
//!                 (dispatch implements it on Inner) and pushes the reply to the Peer's
//!                 outbox, which conn's writer thread sends
//! ```
//!
//! By module:
//! - [`conn`]: a connection's reader (framing, bounded by [`ServerLimits::max_frame`]) and
//!   writer, with a bounded outbox;
//! - [`dispatch`]: method name → handler, σOS's reply shape for every call;
//! - [`session`]: what a connection holds between calls (fds, identity, parked count);
//! - [`procstate`]: Init/Started/Exited/ClntId, one state per connection;
//! - [`paths`]: realm paths checked lexically (`..`, absolute, NUL refused);
//! - [`ux`] (scratch directory, openat2 `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`) and [`objects`]
//!   (`name/s3/~local/B/K` over an [`ObjectStore`]): the stores, as calls on [`state`]'s
//!   shared `Inner`;
//! - [`fds`]: the fd table, reads and writes with checked offsets and the [`quota`];
//! - [`waiters`]: the calls that block (Open with wait, a DirWatch read, WaitEvict), all
//!   parked on one waiter thread, however many there are;
//! - leaves every module may use: [`reply`] (σOS errors and reply frames), [`config`],
//!   [`error`], [`sync`].

// The map above names the private modules it draws: pages of `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

mod config;
mod conn;
mod dispatch;
mod error;
mod fds;
mod objects;
pub mod paths;
mod procstate;
mod quota;
mod reply;
mod session;
mod state;
mod sync;
mod ux;
mod waiters;

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

pub use crate::store::{LocalDirStore, ObjectMeta, ObjectStore, StoreError};
pub use config::{parse_bytes, parse_frame, ServerConfig, ServerLimits};
pub use error::ServerError;
pub use procstate::{exited_line, ProcState};
pub use quota::Quota;
pub use reply::errno_code;
use state::Inner;

/// The embedded server. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
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
        let waiting = self.inner.waiters.evict_waiting() > 0;
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

    /// Serves a connection accepted on a listening socket of the caller's, on a new thread,
    /// unless `max_connections` are already served (the stream is then closed). Returns
    /// whether it is served.
    pub fn serve_accepted(&self, s: UnixStream) -> bool {
        let n = self.inner.connections.load(Ordering::SeqCst);
        if n >= self.inner.cfg.limits.max_connections {
            log_refusal(&format!(
                "spproxy: refusing a connection: {n} already served"
            ));
            return false;
        }
        drop(self.serve_stream(s));
        true
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
                    srv.serve_accepted(s);
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
