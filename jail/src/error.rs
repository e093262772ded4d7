//! The jail's error, a leaf every step may use and that imports none of them (lib.rs
//! re-exports it as `sigma_jail::JailError`).
#![forbid(unsafe_code)]

/// Errors building the plan (before fork). Each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("jail path `{path}` contains a NUL byte")]
    Nul { path: String },
    #[error("jail path `{path}` must be absolute")]
    Relative { path: String },
    #[error("jail path `{path}` contains `..`")]
    DotDot { path: String },
    #[error("bind source {path}: {source}")]
    Source {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "user namespaces are not available here ({why}); run with --no-jail to go without (unsafe)"
    )]
    NoUserns { why: String },
}
