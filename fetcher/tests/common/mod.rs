//! Test harness: a real MinIO on 127.0.0.1 (started here, stopped on drop), pip-downloaded
//! wheels cached outside the repository, and a small package generator.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sigma_fetcher::store::s3::S3Store;
use sigma_fetcher::store::StoreOptions;
use sigma_fetcher::FetchConfig;

pub const USER: &str = "sigmatest";
pub const PASS: &str = "sigmatest-secret";

/// `${SIGMA_CACHE:-$HOME/.cache/sigma-ci}`.
pub fn ci_cache() -> PathBuf {
    std::env::var_os("SIGMA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/sigma-ci")
        })
}

fn minio_bin() -> PathBuf {
    let bin = std::env::var_os("SIGMA_MINIO")
        .map(PathBuf::from)
        .unwrap_or_else(|| ci_cache().join("bin/minio"));
    assert!(
        bin.is_file(),
        "MinIO binary {} is missing: run `scripts/minio.sh install` (S3 tests need a real server)",
        bin.display()
    );
    bin
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A MinIO server with its own temp data dir; killed on drop.
pub struct Minio {
    pub endpoint: String,
    pub port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
}

fn http_ready(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let req = format!(
        "GET /minio/health/ready HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf).unwrap_or(0);
    buf[..n].starts_with(b"HTTP/1.1 200")
}

impl Minio {
    pub fn start() -> Minio {
        let bin = minio_bin();
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let (port, console) = (free_port(), free_port());
            let log = std::fs::File::create(dir.path().join("minio.log")).unwrap();
            let mut child = Command::new(&bin)
                .args(["server", "--quiet", "--address"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("--console-address")
                .arg(format!("127.0.0.1:{console}"))
                .arg(dir.path().join("data"))
                .env("MINIO_ROOT_USER", USER)
                .env("MINIO_ROOT_PASSWORD", PASS)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn minio");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken in between, or a real failure: retry, then report
                }
                if http_ready(port) {
                    return Minio {
                        endpoint: format!("http://127.0.0.1:{port}"),
                        port,
                        child: Some(child),
                        dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!(
            "MinIO did not become ready: {}",
            std::fs::read_to_string(dir.path().join("minio.log")).unwrap_or_default()
        );
    }

    pub fn opts(&self) -> StoreOptions {
        StoreOptions {
            endpoint_url: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            credentials: Some((USER.into(), PASS.into())),
            force_path_style: true,
        }
    }

    /// A store on a freshly created bucket.
    pub async fn bucket(&self, name: &str, cfg: &FetchConfig) -> Arc<S3Store> {
        let s = S3Store::connect(name, "", &self.opts(), cfg).await.unwrap();
        s.create_bucket().await.unwrap();
        Arc::new(s)
    }

    /// Environment for a subprocess using the standard AWS configuration.
    pub fn aws_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", USER.into()),
            ("AWS_SECRET_ACCESS_KEY", PASS.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// Kill the server (SIGKILL) and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A wheel for `spec` (e.g. `six==1.16.0`), downloaded once with pip into
/// `$SIGMA_CACHE/wheels/<spec>/` and reused by later runs.
pub fn wheel(spec: &str) -> PathBuf {
    let dir = ci_cache()
        .join("wheels")
        .join(spec.replace(['=', '<', '>'], "_"));
    let find = |dir: &Path| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
    };
    if let Some(p) = find(&dir) {
        return p;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&dir)
        .arg(spec)
        .status()
        .expect("run python3 -m pip");
    assert!(status.success(), "pip download {spec} failed");
    find(&dir).unwrap_or_else(|| panic!("pip download {spec} produced no wheel"))
}

/// A plain package dir `<root>/<name>/` with a few modules and a data file of `big` bytes
/// (pseudo-random, so it does not compress).
pub fn make_pkg(root: &Path, name: &str, big: usize) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("__init__.py"), format!("NAME = {name:?}\n")).unwrap();
    std::fs::write(d.join("sub/__init__.py"), "").unwrap();
    std::fs::write(d.join("sub/mod.py"), "def f():\n    return 42\n").unwrap();
    let mut x: u64 = 0x9e3779b97f4a7c15 ^ name.len() as u64;
    let data: Vec<u8> = (0..big)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(d.join("blob.bin"), data).unwrap();
    d
}

/// Every path under `dir`, relative, sorted (to assert "nothing visible").
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            out.push(e.path().strip_prefix(base).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(base, &e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}
