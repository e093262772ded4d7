//! What every backend implements and every caller calls: the [`Store`] trait, a GET's answer,
//! the key rule, whole-object and chunk reads with a silence bound, and the options of opening
//! a bucket URL. Imports no backend.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::config::FetchConfig;
use crate::error::{FetchError, Result};

/// A body being downloaded, chunk by chunk.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;

/// The answer to a GET: the size if the store knows it, and the body.
pub struct GetObject {
    pub size: Option<u64>,
    pub body: ByteStream,
}

impl Debug for GetObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetObject")
            .field("size", &self.size)
            .finish()
    }
}

/// An object store holding the library bucket. Keys are `/`-separated relative paths.
#[async_trait]
pub trait Store: Send + Sync + Debug {
    /// The bucket as a URL (`s3://b/prefix`, `file:///dir`, `mem://name`), used in errors.
    fn name(&self) -> &str;

    /// Start downloading `key`. Errors before the first byte are retried per the config.
    async fn get(&self, key: &str) -> Result<GetObject>;

    /// Store `data` at `key`, replacing it atomically (a reader never sees half an object).
    async fn put(&self, key: &str, data: Bytes) -> Result<()>;

    /// The size of `key`, or `None` if it does not exist.
    async fn head(&self, key: &str) -> Result<Option<u64>>;

    /// Remove `key` (absent is not an error).
    async fn delete(&self, key: &str) -> Result<()>;

    /// Every key that starts with `prefix`, sorted.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
}

/// Download a whole object into memory, bounding the silence between chunks by `read_timeout`.
pub async fn get_bytes(store: &dyn Store, key: &str, cfg: &FetchConfig) -> Result<Bytes> {
    let obj = store.get(key).await?;
    let mut buf = BytesMut::with_capacity(obj.size.unwrap_or(0).min(1 << 30) as usize);
    let mut body = obj.body;
    while let Some(chunk) = next_chunk(store.name(), &mut body, cfg.read_timeout).await? {
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The next chunk of a body, failing with `Unavailable` after `read_timeout` of silence.
pub async fn next_chunk(
    bucket: &str,
    body: &mut ByteStream,
    read_timeout: Duration,
) -> Result<Option<Bytes>> {
    match tokio::time::timeout(read_timeout, body.next()).await {
        Ok(Some(Ok(b))) => Ok(Some(b)),
        Ok(Some(Err(e))) => Err(e),
        Ok(None) => Ok(None),
        Err(_) => Err(FetchError::Unavailable {
            bucket: bucket.to_owned(),
            cause: format!("no data for {read_timeout:?} while downloading"),
        }),
    }
}

/// Reject keys that could escape a local root or confuse S3: empty, absolute, `.`/`..` parts.
pub(super) fn check_key(bucket: &str, key: &str) -> Result<()> {
    let bad = key.is_empty()
        || key.starts_with('/')
        || key.contains('\0')
        || key.contains('\\')
        || key
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(FetchError::invalid(
            format!("{bucket}: key {key:?}"),
            "keys are relative /-separated paths without empty, '.' or '..' parts",
        ));
    }
    Ok(())
}

/// Options for opening a bucket URL (S3 only; ignored by the other backends).
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Endpoint URL; `None` uses `AWS_ENDPOINT_URL` / the profile / AWS itself.
    pub endpoint_url: Option<String>,
    /// Region; `None` uses `AWS_REGION` / the profile, else `us-east-1`.
    pub region: Option<String>,
    /// Static credentials (access key, secret key); `None` uses the standard provider chain.
    pub credentials: Option<(String, String)>,
    /// Path-style addressing (`http://host/bucket/key`). Forced on whenever an endpoint URL is
    /// configured (MinIO and most S3-compatible servers need it).
    pub force_path_style: bool,
}
