//! A store opened on first use: a warm realm whose files are all local never builds an S3
//! client (loading the AWS configuration and credential chain costs milliseconds on every
//! supervisor start otherwise).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::api::{GetObject, Store, StoreOptions};
use super::open_store;
use crate::config::FetchConfig;
use crate::error::{FetchError, Result};

/// Opens the bucket URL's real store the first time a method needs it (once; a failed open is
/// retried by the next call).
#[derive(Debug)]
pub struct LazyStore {
    url: String,
    name: String,
    opts: StoreOptions,
    cfg: FetchConfig,
    inner: tokio::sync::OnceCell<Arc<dyn Store>>,
}

impl LazyStore {
    /// Check the URL's form now (a bad URL is an error at once); connect later.
    pub fn new(url: &str, opts: &StoreOptions, cfg: &FetchConfig) -> Result<LazyStore> {
        let name = if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() {
                format!("s3://{bucket}")
            } else {
                format!("s3://{bucket}/{prefix}")
            }
        } else if url.starts_with("file:///") || url.starts_with("mem://") {
            url.to_owned()
        } else {
            return Err(FetchError::invalid(
                format!("bucket {url}"),
                "expected s3://BUCKET[/PREFIX], file:///DIR or mem://NAME",
            ));
        };
        Ok(LazyStore {
            url: url.to_owned(),
            name,
            opts: opts.clone(),
            cfg: cfg.clone(),
            inner: tokio::sync::OnceCell::new(),
        })
    }

    async fn store(&self) -> Result<&Arc<dyn Store>> {
        self.inner
            .get_or_try_init(|| open_store(&self.url, &self.opts, &self.cfg))
            .await
    }
}

#[async_trait]
impl Store for LazyStore {
    fn name(&self) -> &str {
        &self.name
    }
    async fn get(&self, key: &str) -> Result<GetObject> {
        self.store().await?.get(key).await
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        self.store().await?.put(key, data).await
    }
    async fn head(&self, key: &str) -> Result<Option<u64>> {
        self.store().await?.head(key).await
    }
    async fn delete(&self, key: &str) -> Result<()> {
        self.store().await?.delete(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.store().await?.list(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opens_on_first_use_and_names_the_bucket_like_the_real_store() {
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("file://{}", tmp.path().display());
        let cfg = FetchConfig::default();
        let lazy = LazyStore::new(&url, &StoreOptions::default(), &cfg).unwrap();
        assert!(lazy.inner.get().is_none(), "nothing opened yet");
        lazy.put("a/b", Bytes::from_static(b"x")).await.unwrap();
        assert_eq!(lazy.head("a/b").await.unwrap(), Some(1));
        let real = open_store(&url, &StoreOptions::default(), &cfg)
            .await
            .unwrap();
        assert_eq!(lazy.name(), real.name());
        assert_eq!(
            LazyStore::new("s3://b/p/", &StoreOptions::default(), &cfg)
                .unwrap()
                .name(),
            "s3://b/p"
        );
        assert!(LazyStore::new("ftp://x", &StoreOptions::default(), &cfg).is_err());
    }
}
