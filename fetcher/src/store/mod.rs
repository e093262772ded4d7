//! A small async object-store trait and its backends.
//!
//! * [`s3::S3Store`] — any S3-compatible service, configured the standard AWS way.
//! * [`local::LocalStore`] — a directory (`file:///path` buckets; the README demo uses one).
//! * [`memory::MemoryStore`] — in-memory, for unit tests.
//!
//! Backends apply the retry/backoff/timeout policy of [`crate::FetchConfig`] themselves (only S3
//! can fail transiently), so callers just call the trait.
//!
//! `api.rs` holds the trait and what goes with it (re-exported here); the backends (S3, local,
//! memory) import only that, and [`open_store`] here picks one by URL: only [`lazy`], which
//! opens a store on first use, calls back into this file.

mod api;
pub mod lazy;
pub mod local;
pub mod memory;
pub mod s3;

pub use api::{get_bytes, next_chunk, ByteStream, GetObject, Store, StoreOptions};

use std::sync::Arc;

use crate::config::FetchConfig;
use crate::error::{FetchError, Result};

/// Open a bucket by URL: `s3://bucket[/prefix]`, `file:///abs/dir`, or `mem://name` (empty).
pub async fn open_store(
    url: &str,
    opts: &StoreOptions,
    cfg: &FetchConfig,
) -> Result<Arc<dyn Store>> {
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        Ok(Arc::new(
            s3::S3Store::connect(bucket, prefix, opts, cfg).await?,
        ))
    } else if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(FetchError::invalid(
                format!("bucket {url}"),
                "file:// buckets need an absolute path (file:///dir)",
            ));
        }
        Ok(Arc::new(local::LocalStore::new(path)))
    } else if let Some(name) = url.strip_prefix("mem://") {
        Ok(Arc::new(memory::MemoryStore::new(name)))
    } else {
        Err(FetchError::invalid(
            format!("bucket {url}"),
            "expected s3://BUCKET[/PREFIX], file:///DIR or mem://NAME",
        ))
    }
}
