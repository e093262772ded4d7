#![forbid(unsafe_code)]
//! `sigma-fetch`: publish to a bucket, or ensure one package in a realm and print the outcome
//! as one JSON line.
//! A tool for debugging buckets and for the multi-process tests.
//!
//! ```text
//! sigma-fetch publish --bucket URL [-r requirements.txt] [WHEELS_OR_DIRS...]
//! sigma-fetch ensure [--root DIR] --realm R --bucket URL NAME [--slow-ms N]
//! ```
//! The bucket uses the standard AWS configuration (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).
//! `--slow-ms N` sleeps N ms before every body chunk (tests use it to kill a download midway).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sigma_fetcher::cli::{run_publish, PublishArgs};
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

#[derive(Debug, clap::Parser)]
#[command(
    name = "sigma-fetch",
    about = "Publish libraries to a bucket; install one into a realm"
)]
enum Cli {
    /// Publish wheels, a requirements file or package directories (index written last).
    Publish(PublishArgs),
    /// Install the package providing NAME into a realm; print the outcome as one JSON line.
    Ensure {
        /// Cache root (default: $XDG_CACHE_HOME/sigma-supervise or ~/.cache/sigma-supervise).
        #[arg(long)]
        root: Option<PathBuf>,
        #[arg(long)]
        realm: String,
        /// Bucket URL: s3://BUCKET[/PREFIX] or file:///DIR.
        #[arg(long, env = "SIGMA_LIB_BUCKET")]
        bucket: String,
        /// Sleep this many ms before every body chunk (tests kill a download midway with it).
        #[arg(long, default_value_t = 0)]
        slow_ms: u64,
        /// Import or top-level name (numpy, numpy.core, six.py, numpy.libs).
        name: String,
    },
}

#[tokio::main]
async fn main() {
    if let Err(e) = run(clap::Parser::parse()).await {
        eprintln!("sigma-fetch: {e}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> sigma_fetcher::Result<()> {
    let cfg = FetchConfig::default();
    let (root, realm, bucket, slow, name) = match cli {
        Cli::Publish(args) => {
            for report in run_publish(&args, &cfg).await? {
                println!("{report}");
            }
            return Ok(());
        }
        Cli::Ensure {
            root,
            realm,
            bucket,
            slow_ms,
            name,
        } => (root, realm, bucket, slow_ms, name),
    };
    let root = root.unwrap_or_else(sigma_fetcher::default_cache_root);
    let mut store = open_store(&bucket, &StoreOptions::default(), &cfg).await?;
    if slow > 0 {
        store = Arc::new(Slow {
            inner: store,
            delay: Duration::from_millis(slow),
        });
    }
    let cache = RealmCache::open(&root, &realm, store, cfg)?;
    let out = cache.ensure(&name).await?;
    let s = cache.stats();
    println!(
        "{{\"package\":{:?},\"dir\":{:?},\"fetched\":{},\"installed\":{},\"bytes\":{},\"gets\":{},\"ms\":{}}}",
        out.package,
        out.dir.display().to_string(),
        out.fetched,
        out.installed,
        out.bytes,
        s.gets,
        s.fetch_time.as_millis()
    );
    Ok(())
}
