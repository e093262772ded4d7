//! spproxy's synchronous object store over the fetcher's async [`Store`] backends: what serves
//! `name/s3/~local/BUCKET/KEY` in an embedded realm server ([`FetcherObjects`]), and where its
//! buckets live ([`S3Backend`]). Built with the `spproxy` feature.

use crate::store::{get_bytes, open_store, Store, StoreOptions};
use crate::{FetchConfig, FetchError};
use spproxy::server::{ObjectMeta, ObjectStore, StoreError};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// Backend of `name/s3/~local/BUCKET` (`--s3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3Backend {
    /// S3 configured the standard AWS way (environment, profile, `AWS_ENDPOINT_URL`).
    Aws,
    /// Bucket B is the directory `DIR/B` (`file:///DIR`).
    Dir(PathBuf),
}

impl S3Backend {
    /// `s3` (or `s3://`) or `file:///DIR`.
    pub fn parse(s: &str) -> Result<S3Backend, String> {
        if s == "s3" || s == "s3://" {
            return Ok(S3Backend::Aws);
        }
        match s.strip_prefix("file://") {
            Some(p) if p.starts_with('/') => Ok(S3Backend::Dir(PathBuf::from(p))),
            _ => Err("expected s3 (standard AWS configuration) or file:///DIR".into()),
        }
    }
}

/// spproxy's synchronous [`ObjectStore`] over the fetcher's async [`Store`] backends: bucket
/// BUCKET of `name/s3/~local/BUCKET/KEY` is opened as `s3://BUCKET` or `file:///DIR/BUCKET`.
/// Calls run on the server's connection thread, blocking on a small runtime started on first
/// use (a run that never touches s3 starts none).
pub struct FetcherObjects {
    backend: S3Backend,
    opts: StoreOptions,
    cfg: FetchConfig,
    rt: OnceLock<Result<tokio::runtime::Runtime, String>>,
    stores: Mutex<HashMap<String, Arc<dyn Store>>>,
}

impl FetcherObjects {
    pub fn new(backend: S3Backend) -> FetcherObjects {
        FetcherObjects {
            backend,
            opts: StoreOptions::default(),
            cfg: FetchConfig {
                progress: false,
                ..FetchConfig::default()
            },
            rt: OnceLock::new(),
            stores: Mutex::new(HashMap::new()),
        }
    }

    fn unavailable(bucket: &str, key: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Unavailable {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            source: std::io::Error::other(e.to_string()),
        }
    }

    fn block_on<T>(
        &self,
        bucket: &str,
        key: &str,
        f: impl std::future::Future<Output = Result<T, FetchError>>,
    ) -> Result<T, StoreError> {
        let rt = self.rt.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("sigma-s3")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        });
        let rt = rt
            .as_ref()
            .map_err(|e| Self::unavailable(bucket, key, format!("starting the S3 runtime: {e}")))?;
        rt.block_on(f).map_err(|e| map_err(bucket, key, e))
    }

    fn check_bucket(bucket: &str) -> Result<(), StoreError> {
        if bucket.is_empty() || bucket == "." || bucket == ".." || bucket.contains(['/', '\0']) {
            return Err(StoreError::InvalidKey {
                bucket: bucket.to_owned(),
                key: String::new(),
                why: "bad bucket name",
            });
        }
        Ok(())
    }

    fn store(&self, bucket: &str, key: &str) -> Result<Arc<dyn Store>, StoreError> {
        Self::check_bucket(bucket)?;
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = stores.get(bucket) {
            return Ok(Arc::clone(s));
        }
        let url = match &self.backend {
            S3Backend::Aws => format!("s3://{bucket}"),
            S3Backend::Dir(root) => format!("file://{}", root.join(bucket).display()),
        };
        let s = self.block_on(bucket, key, open_store(&url, &self.opts, &self.cfg))?;
        stores.insert(bucket.to_owned(), Arc::clone(&s));
        Ok(s)
    }
}

fn map_err(bucket: &str, key: &str, e: FetchError) -> StoreError {
    let (b, k) = (bucket.to_owned(), key.to_owned());
    match e {
        FetchError::NotFound { .. } => StoreError::NotFound { bucket: b, key: k },
        FetchError::BucketNotFound { .. } => StoreError::NotFound {
            bucket: b,
            key: String::new(),
        },
        FetchError::PermissionDenied { .. } => StoreError::PermissionDenied { bucket: b, key: k },
        e => FetcherObjects::unavailable(bucket, key, e),
    }
}

impl ObjectStore for FetcherObjects {
    fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
        let s = self.store(bucket, key)?;
        let bytes = self.block_on(bucket, key, get_bytes(&*s, key, &self.cfg))?;
        Ok(bytes.to_vec())
    }

    fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), StoreError> {
        // Both backends refuse a missing bucket (NotFound), as σOS does.
        let s = self.store(bucket, key)?;
        let data = bytes::Bytes::copy_from_slice(data);
        self.block_on(bucket, key, s.put(key, data))
    }

    /// The fetcher's stores report sizes only: mtime is the epoch.
    fn stat(&self, bucket: &str, key: &str) -> Result<ObjectMeta, StoreError> {
        let s = self.store(bucket, key)?;
        match self.block_on(bucket, key, s.head(key))? {
            Some(len) => Ok(ObjectMeta {
                len,
                mtime: SystemTime::UNIX_EPOCH,
            }),
            None => Err(StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            }),
        }
    }

    fn remove(&self, bucket: &str, key: &str) -> Result<(), StoreError> {
        // Deleting an absent object succeeds in S3; σOS reports it not found.
        self.stat(bucket, key)?;
        let s = self.store(bucket, key)?;
        self.block_on(bucket, key, s.delete(key))
    }

    fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        let s = self.store(bucket, prefix)?;
        self.block_on(bucket, prefix, s.list(prefix))
    }

    fn has_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        if let S3Backend::Dir(root) = &self.backend {
            Self::check_bucket(bucket)?;
            return Ok(root.join(bucket).is_dir());
        }
        // A listing under a prefix no object has: cheap, and NoSuchBucket if there is none.
        let s = self.store(bucket, "")?;
        match self.block_on(bucket, "", s.list(".sigma-bucket-probe/")) {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_backend_parses() {
        assert_eq!(S3Backend::parse("s3"), Ok(S3Backend::Aws));
        assert_eq!(
            S3Backend::parse("file:///srv/b"),
            Ok(S3Backend::Dir("/srv/b".into()))
        );
        assert!(S3Backend::parse("file://rel").is_err());
        assert!(S3Backend::parse("http://x").is_err());
    }

    /// The adapter over the fetcher's local backend: buckets are directories under the root.
    #[test]
    fn fetcher_objects_over_a_local_root() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("b")).unwrap();
        let s = FetcherObjects::new(S3Backend::Dir(d.path().to_owned()));
        assert!(s.has_bucket("b").unwrap());
        assert!(!s.has_bucket("nob").unwrap());
        s.put("b", "dir/k", b"v1").unwrap();
        s.put("b", "dir/k", b"value2").unwrap();
        assert_eq!(std::fs::read(d.path().join("b/dir/k")).unwrap(), b"value2");
        assert_eq!(s.get("b", "dir/k").unwrap(), b"value2");
        assert_eq!(s.stat("b", "dir/k").unwrap().len, 6);
        assert_eq!(s.list("b", "").unwrap(), ["dir/k"]);
        assert!(s.list("b", "x").unwrap().is_empty());
        s.rename("b", "dir/k", "k2").unwrap();
        assert!(matches!(
            s.get("b", "dir/k"),
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(s.get("b", "k2").unwrap(), b"value2");
        s.remove("b", "k2").unwrap();
        assert!(matches!(
            s.remove("b", "k2"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.put("nob", "k", b"x"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(!d.path().join("nob").exists());
        assert!(matches!(
            s.get("..", "k"),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(s.get("b", "../../etc/passwd").is_err());
    }
}
