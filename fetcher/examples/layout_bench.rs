//! Which bucket layout? Compares, on a real S3 server, fetching one wheel's files as
//! (a) one tar+zstd archive, (b) one plain tar, (c) one object per file (sequential and 32-way
//! concurrent), each including verification of every file's sha256; and a cold `ensure`.
//!
//! ```text
//! scripts/minio.sh start /tmp/bench-minio 19600
//! AWS_ENDPOINT_URL=http://127.0.0.1:19600 AWS_ACCESS_KEY_ID=minioadmin \
//!   AWS_SECRET_ACCESS_KEY=minioadmin AWS_REGION=us-east-1 \
//!   cargo run --release -p sigma-fetcher --example layout_bench -- WHEEL...
//! ```

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};
use sigma_fetcher::index::Encoding;
use sigma_fetcher::publish::{archive_wheel, publish, PublishSource};
use sigma_fetcher::store::s3::S3Store;
use sigma_fetcher::store::{get_bytes, Store, StoreOptions};
use sigma_fetcher::{FetchConfig, RealmCache};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn verify_tar(data: &[u8], n: usize) {
    let mut ar = tar::Archive::new(data);
    let mut count = 0;
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let mut buf = Vec::new();
        e.read_to_end(&mut buf).unwrap();
        std::hint::black_box(Sha256::digest(&buf));
        count += 1;
    }
    assert_eq!(count, n);
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = FetchConfig::default();
    let s3 = S3Store::connect("layout-bench", "", &StoreOptions::default(), &cfg).await?;
    s3.create_bucket().await?;
    let store: Arc<dyn Store> = Arc::new(s3);
    const RUNS: usize = 5;
    for wheel in std::env::args().skip(1) {
        let wheel = std::path::PathBuf::from(wheel);
        let (pz, bz) = archive_wheel(&wheel, Encoding::TarZstd)?;
        let (pt, bt) = archive_wheel(&wheel, Encoding::Tar)?;
        store.put("bench/a.tar.zst", bz.clone()).await?;
        store.put("bench/a.tar", bt.clone()).await?;
        let mut ar = tar::Archive::new(&bt[..]);
        for e in ar.entries()? {
            let mut e = e?;
            let mut buf = Vec::new();
            e.read_to_end(&mut buf)?;
            store
                .put(
                    &format!("bench/files/{}", hex::encode(Sha256::digest(&buf))),
                    buf.into(),
                )
                .await?;
        }
        let n = pt.files.len();
        let unpacked = pt.unpacked_size();

        let mut zst = Vec::new();
        let mut tar_t = Vec::new();
        let mut seq = Vec::new();
        let mut par = Vec::new();
        let mut cold = Vec::new();
        for _ in 0..RUNS {
            let t = Instant::now();
            let d = get_bytes(store.as_ref(), "bench/a.tar.zst", &cfg).await?;
            let raw = zstd::decode_all(&d[..])?;
            verify_tar(&raw, n);
            zst.push(t.elapsed());

            let t = Instant::now();
            let d = get_bytes(store.as_ref(), "bench/a.tar", &cfg).await?;
            verify_tar(&d, n);
            tar_t.push(t.elapsed());

            let t = Instant::now();
            for f in &pt.files {
                let d =
                    get_bytes(store.as_ref(), &format!("bench/files/{}", f.sha256), &cfg).await?;
                std::hint::black_box(Sha256::digest(&d));
            }
            seq.push(t.elapsed());

            let t = Instant::now();
            let keys: Vec<String> = pt
                .files
                .iter()
                .map(|f| format!("bench/files/{}", f.sha256))
                .collect();
            let results: Vec<_> = futures::stream::iter(keys)
                .map(|k| {
                    let store = store.clone();
                    let cfg = cfg.clone();
                    async move {
                        get_bytes(store.as_ref(), &k, &cfg)
                            .await
                            .map(|d| Sha256::digest(&d))
                    }
                })
                .buffer_unordered(32)
                .collect()
                .await;
            assert!(results.iter().all(|r| r.is_ok()));
            par.push(t.elapsed());
        }
        publish(store.as_ref(), &PublishSource::Wheels(wheel.clone()), &cfg).await?;
        let name = pz.name.clone();
        for _ in 0..RUNS {
            let root = tempfile::tempdir()?;
            let cache = RealmCache::open(root.path(), "bench", store.clone(), cfg.clone())?;
            cache.index().await?;
            let t = Instant::now();
            assert!(cache.ensure(&pz.top_level[0]).await?.fetched);
            cold.push(t.elapsed());
        }
        println!(
            "{name} {}: {n} files, {unpacked} B unpacked; tar {} B, tar+zstd {} B\n  \
             one GET tar+zstd: {:?}\n  one GET tar: {:?}\n  per-file GETs sequential: {:?}\n  \
             per-file GETs 32 concurrent: {:?}\n  cold ensure (tar+zstd, verify, fsync, link): {:?}",
            pz.version,
            bt.len(),
            bz.len(),
            median(zst),
            median(tar_t),
            median(seq),
            median(par),
            median(cold),
        );
    }
    Ok(())
}
