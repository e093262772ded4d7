//! The crate-boundary error type.
//!
//! Every variant names the bucket (or file) and the cause on one line. Callers act on
//! [`FetchError::NotFound`], [`FetchError::IntegrityMismatch`], [`FetchError::Unavailable`] and
//! [`FetchError::PermissionDenied`]; the rest are configuration or local I/O problems.

use std::path::PathBuf;
use std::sync::Arc;

/// Errors of the storage backends, the publisher and the realm cache.
///
/// `Clone` so that one failed download can be reported to every caller that waited for it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    /// The object does not exist in the bucket (or the index names no package for an import).
    #[error("{bucket}: object {key} not found")]
    NotFound { bucket: String, key: String },

    /// The bucket itself does not exist.
    #[error("{bucket}: no such bucket")]
    BucketNotFound { bucket: String },

    /// No package in the bucket's index provides this top-level name.
    #[error("{bucket}: no package provides {name:?}")]
    NoSuchPackage { bucket: String, name: String },

    /// Downloaded (or published) bytes do not match the recorded sha256/size: nothing installed.
    #[error(
        "integrity mismatch for {file}: expected {expected}, got {got}; nothing was installed"
    )]
    IntegrityMismatch {
        file: String,
        expected: String,
        got: String,
    },

    /// The store cannot be reached or did not answer within the configured bound.
    #[error("{bucket} unavailable: {cause}")]
    Unavailable { bucket: String, cause: String },

    /// The credentials were refused (or none were found).
    #[error("{bucket}: permission denied: {cause} (check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile)")]
    PermissionDenied { bucket: String, cause: String },

    /// A bucket URL, index or package that cannot be used as given.
    #[error("{what}: {cause}")]
    Invalid { what: String, cause: String },

    /// Two distributions claim the same top-level name.
    #[error("{bucket}: top-level name {name:?} is provided by both {existing} and {new}")]
    Conflict {
        bucket: String,
        name: String,
        existing: String,
        new: String,
    },

    /// Local file-system error, with the path it concerns.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },

    /// An external command (pip) failed.
    #[error("{command} failed: {cause}")]
    Command { command: String, cause: String },

    /// An install run by another process ([`crate::Delegate`]) failed: its message, and
    /// whether it was "not there".
    #[error("{message}")]
    Delegated { message: String, not_found: bool },
}

impl FetchError {
    /// Wrap an I/O error with the operation and path it concerns.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FetchError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    /// True for errors that a retry may cure (the store was unavailable).
    pub fn is_transient(&self) -> bool {
        matches!(self, FetchError::Unavailable { .. })
    }

    /// True for "the thing is not there" (object, bucket or package).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            FetchError::NotFound { .. }
                | FetchError::BucketNotFound { .. }
                | FetchError::NoSuchPackage { .. }
                | FetchError::Delegated {
                    not_found: true,
                    ..
                }
        )
    }

    pub(crate) fn invalid(what: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        FetchError::Invalid {
            what: what.into(),
            cause: cause.to_string(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = FetchError> = std::result::Result<T, E>;

/// Attach a path and operation to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|e| FetchError::io(op, path, e))
    }
}
