//! One conformance suite, run against every backend: in-memory, local directory, and S3 on a
//! real MinIO started by the harness. Plus the S3 failure modes callers act on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sigma_fetcher::store::local::LocalStore;
use sigma_fetcher::store::memory::MemoryStore;
use sigma_fetcher::store::s3::S3Store;
use sigma_fetcher::store::{get_bytes, open_store, Store, StoreOptions};
use sigma_fetcher::{FetchConfig, FetchError};

async fn conformance(store: &dyn Store) {
    let cfg = FetchConfig::default();
    let name = store.name().to_owned();

    match get_bytes(store, "sigma-lib/missing", &cfg).await {
        Err(FetchError::NotFound { bucket, key }) => {
            assert_eq!(bucket, name);
            assert_eq!(key, "sigma-lib/missing");
        }
        other => panic!("{name}: expected NotFound, got {other:?}"),
    }
    assert_eq!(store.head("sigma-lib/missing").await.unwrap(), None);

    let big: Bytes = (0..3_000_000u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let cases: [(&str, Bytes); 4] = [
        ("empty", Bytes::new()),
        ("a/small.txt", Bytes::from_static(b"hello")),
        ("a/b/c/deep.bin", Bytes::from_static(&[0, 1, 2, 255])),
        ("big/blob", big.clone()),
    ];
    for (k, v) in &cases {
        store.put(k, v.clone()).await.unwrap();
    }
    for (k, v) in &cases {
        let obj = store.get(k).await.unwrap();
        assert_eq!(obj.size, Some(v.len() as u64), "{name}: size of {k}");
        drop(obj);
        assert_eq!(
            &get_bytes(store, k, &cfg).await.unwrap(),
            v,
            "{name}: body of {k}"
        );
        assert_eq!(
            store.head(k).await.unwrap(),
            Some(v.len() as u64),
            "{name}: head {k}"
        );
    }
    // Multi-chunk streaming really streams: more than one chunk for 3 MB.
    let mut chunks = 0;
    let mut body = store.get("big/blob").await.unwrap().body;
    while let Some(c) = futures::StreamExt::next(&mut body).await {
        c.unwrap();
        chunks += 1;
    }
    assert!(chunks > 1, "{name}: 3 MB arrived in {chunks} chunk(s)");

    store
        .put("a/small.txt", Bytes::from_static(b"replaced"))
        .await
        .unwrap();
    assert_eq!(
        &get_bytes(store, "a/small.txt", &cfg).await.unwrap()[..],
        b"replaced"
    );

    assert_eq!(
        store.list("a/").await.unwrap(),
        vec!["a/b/c/deep.bin".to_owned(), "a/small.txt".to_owned()]
    );
    assert_eq!(
        store.list("").await.unwrap(),
        vec!["a/b/c/deep.bin", "a/small.txt", "big/blob", "empty"]
    );
    assert!(store.list("zzz").await.unwrap().is_empty());

    store.delete("a/small.txt").await.unwrap();
    store.delete("a/small.txt").await.unwrap();
    assert!(matches!(
        store.get("a/small.txt").await,
        Err(FetchError::NotFound { .. })
    ));

    for bad in ["../escape", "/abs", "a//b", "a/./b", ""] {
        assert!(
            matches!(
                store.put(bad, Bytes::new()).await,
                Err(FetchError::Invalid { .. })
            ),
            "{name}: key {bad:?} accepted"
        );
    }

    // Concurrent writers of distinct keys.
    let puts = (0..8).map(|i| {
        store.put(
            Box::leak(format!("par/{i}").into_boxed_str()),
            Bytes::from(vec![i as u8; 1000]),
        )
    });
    for r in futures::future::join_all(puts).await {
        r.unwrap();
    }
    assert_eq!(store.list("par/").await.unwrap().len(), 8);
}

#[tokio::test]
async fn memory_backend_conforms() {
    conformance(&MemoryStore::new("conf")).await;
}

#[tokio::test]
async fn local_backend_conforms() {
    let tmp = tempfile::tempdir().unwrap();
    let store = LocalStore::create(tmp.path().join("bucket")).unwrap();
    conformance(&store).await;
    // No temp files left behind by atomic writes.
    assert!(common::tree(store.root())
        .iter()
        .all(|p| !p.contains(".tmp-")));
    // open_store parses file:// URLs to the same backend.
    let url = format!("file://{}", store.root().display());
    let s = open_store(&url, &StoreOptions::default(), &FetchConfig::default())
        .await
        .unwrap();
    assert_eq!(s.head("empty").await.unwrap(), Some(0));
}

#[tokio::test]
async fn local_missing_bucket_is_bucket_not_found() {
    let store = LocalStore::new("/nonexistent/sigma-bucket");
    let e = store.get("sigma-lib/index-v1.json").await.unwrap_err();
    assert!(matches!(e, FetchError::BucketNotFound { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/sigma-bucket"), "{e}");
}

#[tokio::test]
async fn s3_backend_conforms_on_minio() {
    let minio = common::Minio::start();
    let store = minio.bucket("conformance", &FetchConfig::default()).await;
    conformance(store.as_ref()).await;
    // A key prefix inside the bucket behaves as its own namespace.
    let prefixed = S3Store::connect(
        "conformance",
        "nested/prefix",
        &minio.opts(),
        &FetchConfig::default(),
    )
    .await
    .unwrap();
    prefixed.put("k", Bytes::from_static(b"v")).await.unwrap();
    assert_eq!(prefixed.list("").await.unwrap(), vec!["k"]);
    assert_eq!(store.head("nested/prefix/k").await.unwrap(), Some(1));
}

#[tokio::test]
async fn s3_unknown_bucket_is_bucket_not_found() {
    let minio = common::Minio::start();
    let store = S3Store::connect("no-such-bucket", "", &minio.opts(), &FetchConfig::default())
        .await
        .unwrap();
    let e = store.get("sigma-lib/index-v1.json").await.unwrap_err();
    assert!(matches!(e, FetchError::BucketNotFound { .. }), "{e}");
    assert!(e.to_string().contains("s3://no-such-bucket"), "{e}");
    assert!(e.is_not_found());
}

#[tokio::test]
async fn s3_wrong_credentials_is_permission_denied() {
    let minio = common::Minio::start();
    minio.bucket("locked", &FetchConfig::default()).await;
    let mut opts = minio.opts();
    opts.credentials = Some((common::USER.into(), "wrong-secret".into()));
    let store = S3Store::connect("locked", "", &opts, &FetchConfig::default())
        .await
        .unwrap();
    let e = store.get("x").await.unwrap_err();
    assert!(matches!(e, FetchError::PermissionDenied { .. }), "{e}");
    let line = e.to_string();
    assert!(
        line.contains("s3://locked") && !line.contains('\n'),
        "{line}"
    );
    opts.credentials = Some(("nobody".into(), "wrong-secret".into()));
    let store = S3Store::connect("locked", "", &opts, &FetchConfig::default())
        .await
        .unwrap();
    assert!(matches!(
        store.put("x", Bytes::new()).await,
        Err(FetchError::PermissionDenied { .. })
    ));
}

async fn assert_unavailable_within(endpoint: String, bound: Duration) {
    let cfg = FetchConfig::default();
    let opts = StoreOptions {
        endpoint_url: Some(endpoint),
        region: Some("us-east-1".into()),
        credentials: Some(("a".into(), "b".into())),
        force_path_style: true,
    };
    let store = S3Store::connect("b", "", &opts, &cfg).await.unwrap();
    let t = Instant::now();
    let e = store.get("sigma-lib/index-v1.json").await.unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, FetchError::Unavailable { .. }), "{e}");
    assert!(took <= bound, "took {took:?}, bound {bound:?}: {e}");
    assert!(
        e.to_string().contains("s3://b") && !e.to_string().contains('\n'),
        "{e}"
    );
}

#[tokio::test]
async fn s3_server_down_is_unavailable_within_bound() {
    // Nothing listens on this port: connection refused, retried with backoff, then given up.
    let port = common::free_port();
    assert_unavailable_within(
        format!("http://127.0.0.1:{port}"),
        Duration::from_millis(2500),
    )
    .await;
}

#[tokio::test]
async fn s3_silent_server_is_unavailable_within_bound() {
    // Accepts connections and never answers: only the overall bound can end this.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            h.lock().unwrap().push(s);
        }
    });
    assert_unavailable_within(
        format!("http://127.0.0.1:{port}"),
        Duration::from_millis(2500),
    )
    .await;
}

#[tokio::test]
async fn bad_bucket_urls_are_one_line_errors() {
    for url in ["ftp://x", "file://relative", "s3://"] {
        let e = open_store(url, &StoreOptions::default(), &FetchConfig::default())
            .await
            .unwrap_err();
        assert!(
            !e.to_string().contains('\n') && e.to_string().contains(url.trim_end_matches('/')),
            "{e}"
        );
    }
}

#[tokio::test]
async fn an_https_endpoint_is_reached_through_the_stores_own_tls_client() {
    // The SDK is built without a default HTTPS client: the store hands it one (rustls on
    // ring). A local listener that is no TLS server sees the client's TLS ClientHello (a
    // handshake record, 0x16 0x03) and closes; the fetch fails as unavailable, in one line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::thread::spawn(move || {
        use std::io::Read as _;
        // Not reached at all (no client, or a plain one): no head within 10 s.
        listener.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let mut s = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(_) if start.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => return [0u8; 2],
            }
        };
        s.set_nonblocking(false).unwrap();
        let mut head = [0u8; 2];
        s.read_exact(&mut head).unwrap();
        head
    });
    let opts = StoreOptions {
        endpoint_url: Some(format!("https://127.0.0.1:{port}")),
        region: Some("us-east-1".into()),
        credentials: Some(("a".into(), "b".into())),
        force_path_style: true,
    };
    let store = S3Store::connect("b", "", &opts, &FetchConfig::default())
        .await
        .unwrap();
    let e = store.get("sigma-lib/index-v1.json").await.unwrap_err();
    assert_eq!(seen.join().unwrap(), [0x16, 0x03], "a TLS handshake record");
    assert!(
        e.to_string().contains("s3://b") && !e.to_string().contains('\n'),
        "{e}"
    );
}
