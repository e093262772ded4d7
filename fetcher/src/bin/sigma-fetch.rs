#![forbid(unsafe_code)]
//! `sigma-fetch`: ensure one package in a realm and print the outcome as one JSON line.
//! A tool for debugging buckets and for the multi-process tests.
//!
//! ```text
//! sigma-fetch [--root DIR] --realm R --bucket URL NAME [--slow-ms N]
//! ```
//! The bucket uses the standard AWS configuration (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
//! `--slow-ms N` sleeps N ms before every body chunk (tests use it to kill a download midway).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sigma_fetcher::store::{open_store, GetObject, Store, StoreOptions};
use sigma_fetcher::{FetchConfig, RealmCache};

#[derive(Debug)]
struct Slow {
    inner: Arc<dyn Store>,
    delay: Duration,
}

#[async_trait]
impl Store for Slow {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn get(&self, key: &str) -> sigma_fetcher::Result<GetObject> {
        let obj = self.inner.get(key).await?;
        let delay = self.delay;
        let body = obj.body.then(move |c| async move {
            tokio::time::sleep(delay).await;
            c
        });
        Ok(GetObject {
            size: obj.size,
            body: Box::pin(body),
        })
    }
    async fn put(&self, key: &str, data: Bytes) -> sigma_fetcher::Result<()> {
        self.inner.put(key, data).await
    }
    async fn head(&self, key: &str) -> sigma_fetcher::Result<Option<u64>> {
        self.inner.head(key).await
    }
    async fn delete(&self, key: &str) -> sigma_fetcher::Result<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> sigma_fetcher::Result<Vec<String>> {
        self.inner.list(prefix).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut root, mut realm, mut bucket, mut name, mut slow) = (None, None, None, None, 0u64);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => root = args.next().map(PathBuf::from),
            "--realm" => realm = args.next(),
            "--bucket" => bucket = args.next(),
            "--slow-ms" => slow = args.next().ok_or("--slow-ms N")?.parse()?,
            _ if !a.starts_with("--") => name = Some(a),
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let (Some(realm), Some(bucket), Some(name)) = (realm, bucket, name) else {
        return Err(
            "usage: sigma-fetch [--root DIR] --realm R --bucket URL NAME [--slow-ms N]".into(),
        );
    };
    let root = root.unwrap_or_else(sigma_fetcher::default_cache_root);
    let cfg = FetchConfig::default();
    let mut store = open_store(&bucket, &StoreOptions::default(), &cfg).await?;
    if slow > 0 {
        store = Arc::new(Slow {
            inner: store,
            delay: Duration::from_millis(slow),
        });
    }
    let cache = RealmCache::open(&root, &realm, store, cfg)?;
    let out = match cache.ensure(&name).await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sigma-fetch: {e}");
            std::process::exit(1);
        }
    };
    let s = cache.stats();
    println!(
        "{{\"package\":{:?},\"dir\":{:?},\"fetched\":{},\"installed\":{},\"bytes\":{},\"gets\":{}}}",
        out.package,
        out.dir.display().to_string(),
        out.fetched,
        out.installed,
        out.bytes,
        s.gets
    );
    Ok(())
}
