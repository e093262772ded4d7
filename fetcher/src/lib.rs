//! sigma-fetcher: lazy, verified, once-only library fetch from an object store into a
//! per-realm cache.
//!
//! * [`store`] — the async [`Store`] trait with S3, local-directory and in-memory backends.
//! * [`index`] — the bucket index: top-level names → packages, sha256/size of every file.
//! * [`frame_index`] — the `zstd-frames` layout: a frame per file behind an index of offsets.
//! * [`mod@publish`] — build package archives from wheels or directories and upload them, index last.
//! * [`cache`] — [`RealmCache`]: per-realm lib dirs over a shared content-addressed store.
//! * `objects` (feature `spproxy`) — spproxy's object store over the [`Store`] backends, for an
//!   embedded realm server's `name/s3/~local`.
//!
//! See `fetcher/README.md` for the bucket layout and the reasoning behind it.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod config;
pub mod error;
pub mod frame_index;
pub mod frames;
pub mod index;
#[cfg(feature = "spproxy")]
pub mod objects;
pub mod programs;
mod progress;
pub mod publish;
mod retry;
pub mod store;
mod wheel;

pub use cache::{
    default_cache_root, default_cache_root_if_home, installed_packages, realm_complete,
    realm_trees, realm_trees_of, CacheStats, Delegate, EnsureOutcome, FileHook, InstalledPackage,
    Placement, RealmCache, TreeEntry, TreeView,
};
pub use config::FetchConfig;
pub use error::{FetchError, Result};
pub use index::Index;
pub use publish::{
    publish, publish_with, PublishOptions, PublishReport, PublishSource, TraceRunner,
};
pub use store::{open_store, Store, StoreOptions};
