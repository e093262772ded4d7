//! What the server is told at start: its realm, its scratch directory and object store, and
//! the bounds on what clients can make it hold.

use std::path::PathBuf;
use std::sync::Arc;

use crate::store::ObjectStore;

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
