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
    /// Connections a bound [`Listener`](super::Listener) serves at once; more are closed at accept.
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

/// A byte count: digits with an optional K, M, G or T suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("expected a byte count like 512M, got {s:?}"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// A frame limit ([`ServerLimits::max_frame`]): a byte count from 64K to σOS's u32 frame length.
pub fn parse_frame(s: &str) -> Result<u32, String> {
    let n = parse_bytes(s)?;
    match u32::try_from(n) {
        Ok(n) if n >= 64 << 10 => Ok(n),
        _ => Err("the frame limit must be between 64K and 4G-1 (σOS's u32 frame length)".into()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("64m"), Ok(64 << 20));
        assert!(parse_bytes("1X").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert_eq!(parse_frame("64M"), Ok(64 << 20));
        assert!(parse_frame("4G").is_err());
        assert!(parse_frame("1K").is_err());
    }
}
