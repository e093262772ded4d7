//! The embedded realm server's throughput under many connections: N clients, each on its own
//! connection and thread, call GetFile of a 12-byte file (or Stat, or ClntID) as fast as they
//! can for S seconds against one in-process server on a real Unix socket.
//!
//! ```text
//! cargo run --release -p sigma-spproxy --example throughput -- [-c 64] [-s 3] [--call getfile]
//! ```
//!
//! Prints one JSON line: connections, call, calls completed, seconds, calls/s, and the
//! process's thread count while the clients ran (server threads: 2 per connection, plus one
//! accept thread; no thread per call).
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use spproxy::consts::{NO_LEASE_ID, OWRITE};
use spproxy::server::{LocalDirStore, Server, ServerConfig, ServerLimits};
use spproxy::Client;

const USAGE: &str =
    "usage: throughput [-c CONNECTIONS] [-s SECONDS] [--call getfile|stat|clntid] [--tmp DIR]";

fn main() -> Result<()> {
    let mut conns = 64usize;
    let mut secs = 3u64;
    let mut call = "getfile".to_owned();
    let mut tmp = std::env::temp_dir();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || {
            it.next()
                .with_context(|| format!("{a} needs a value; {USAGE}"))
        };
        match a.as_str() {
            "-c" => conns = v()?.parse().context("-c")?,
            "-s" => secs = v()?.parse().context("-s")?,
            "--call" => call = v()?,
            "--tmp" => tmp = v()?.into(),
            _ => bail!("unknown argument {a:?}; {USAGE}"),
        }
    }
    if !matches!(call.as_str(), "getfile" | "stat" | "clntid") || conns == 0 {
        bail!("{USAGE}");
    }
    let dir = tempfile::Builder::new()
        .prefix("spproxy-throughput")
        .tempdir_in(&tmp)?;
    let store = Arc::new(LocalDirStore::new(dir.path().join("s3")));
    let limits = ServerLimits {
        max_connections: conns + 8,
        ..ServerLimits::default()
    };
    let server = Server::new(
        ServerConfig::new("throughput", dir.path().join("ux"), store).with_limits(limits),
    )?;
    let sock = dir.path().join("spproxyd.sock");
    let _listener = server.bind(&sock)?;
    let path = "name/ux/~local/file12";
    Client::connect(&sock, None)?.put_file(path, 0o644, OWRITE, b"Hello World!", 0, NO_LEASE_ID)?;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(conns + 1));
    let mut hs = Vec::new();
    for _ in 0..conns {
        let c = Client::connect(&sock, None)?;
        let (stop, done, ready, call) = (stop.clone(), done.clone(), ready.clone(), call.clone());
        hs.push(std::thread::spawn(move || -> Result<()> {
            ready.wait();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match call.as_str() {
                    "getfile" => {
                        c.get_file(path)?;
                    }
                    "stat" => {
                        c.stat(path)?;
                    }
                    _ => {
                        c.clnt_id()?;
                    }
                }
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok(())
        }));
    }
    ready.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs) / 2);
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    std::thread::sleep(Duration::from_secs(secs) - Duration::from_secs(secs) / 2);
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().expect("client thread")?;
    }
    let el = t0.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    println!(
        "{{\"connections\": {conns}, \"call\": \"{call}\", \"calls\": {n}, \"seconds\": {el:.3}, \"calls_per_s\": {:.0}, \"threads\": {threads}}}",
        n as f64 / el
    );
    Ok(())
}
