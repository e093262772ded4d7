//! Per-call latency of the Table 4.1 σOS calls from the native Rust client, made the same way
//! `pysigma/bench/calls.py` makes them from Python, so the two can be compared against one
//! server in one run.
//!
//! ```text
//! cargo run --release -p sigma-spproxy --example calls -- \
//!     --socket PATH [--root name/ux/~local] [-n 2000] [--warmup 200] [--dir rust]
//! ```
//!
//! The call sequence mirrors `bench_suite` in calls.py call for call: the payload
//! `"Hello World!"`, the same untimed setup and teardown around each call, and one clock reading
//! on each side of the single call being measured. Files go in `ROOT/DIR` (made if missing).
//! After a warm-up pass of `--warmup` calls each, it prints one JSON object to stdout,
//! `{"wall": {"Started": [ns, ...], ...}, "cpu": {...}}`: the `-n` wall-clock samples of every
//! call in the order they ran, and the calling thread's CPU time around each call (read outside
//! the wall-clock interval, as calls.py does with `time.thread_time_ns`).
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use spproxy::consts::{DMDIR, ECODE_NOTFOUND, NO_LEASE_ID, OREAD, OWRITE, STATUS_OK};
use spproxy::Client;

/// σPy's benchmark payload (12 bytes), as in calls.py.
const DATA: &str = "Hello World!";

const USAGE: &str =
    "usage: calls --socket PATH [--root name/ux/~local] [-n N] [--warmup W] [--dir rust]";

struct Args {
    socket: String,
    root: String,
    n: usize,
    warmup: usize,
    dir: String,
}

fn parse_args() -> Result<Args> {
    let mut socket = None;
    let mut root = "name/ux/~local".to_owned();
    let mut n = 2000usize;
    let mut warmup = 200usize;
    let mut dir = "rust".to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value; {USAGE}"))
        };
        match a.as_str() {
            "--socket" => socket = Some(value("--socket")?),
            "--root" => root = value("--root")?,
            "--dir" => dir = value("--dir")?,
            "-n" => {
                let v = value("-n")?;
                n = v
                    .parse()
                    .with_context(|| format!("-n {v:?} is not a count"))?
            }
            "--warmup" => {
                let v = value("--warmup")?;
                warmup = v
                    .parse()
                    .with_context(|| format!("--warmup {v:?} is not a count"))?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    let Some(socket) = socket else {
        bail!("--socket is required; {USAGE}")
    };
    if n == 0 {
        bail!("-n must be at least 1");
    }
    Ok(Args {
        socket,
        root,
        n,
        warmup,
        dir,
    })
}

/// The calling thread's CPU clock (what Python's `time.thread_time_ns` reads).
#[allow(unsafe_code)]
mod thread_cpu {
    /// CPU time this thread has used, in ns.
    pub fn now_ns() -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a live, writable timespec on this stack frame for the whole call, and
        // clock_gettime writes nothing else; CLOCK_THREAD_CPUTIME_ID exists on every Linux.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// Wall-clock and thread-CPU ns of each call of one kind.
struct Samples {
    wall: Vec<u64>,
    cpu: Vec<u64>,
}

/// Runs `setup(i)` untimed, `call(state)` timed, `teardown(result)` untimed, `n` times (calls.py's
/// `timed`); the CPU clock is read just outside the wall-clock interval.
fn timed<S, R>(
    n: usize,
    mut setup: impl FnMut(usize) -> Result<S>,
    mut call: impl FnMut(S) -> Result<R>,
    mut teardown: impl FnMut(R) -> Result<()>,
) -> Result<Samples> {
    let mut out = Samples {
        wall: Vec::with_capacity(n),
        cpu: Vec::with_capacity(n),
    };
    for i in 0..n {
        let state = setup(i)?;
        let c0 = thread_cpu::now_ns();
        let t0 = Instant::now();
        let r = call(state);
        let t1 = Instant::now();
        let c1 = thread_cpu::now_ns();
        out.wall
            .push(u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX));
        out.cpu.push(c1.saturating_sub(c0));
        teardown(r?)?;
    }
    Ok(out)
}

fn none(_: usize) -> Result<()> {
    Ok(())
}

fn keep<R>(_: R) -> Result<()> {
    Ok(())
}

/// `Read(fd, buf)` as splib does it: read as much as `buf` holds, copy it in, return the count.
fn read_into(c: &Client, fd: u32, buf: &mut [u8]) -> Result<usize> {
    let data = c.read(fd, buf.len() as u64)?;
    let n = data.len().min(buf.len());
    buf[..n].copy_from_slice(&data[..n]);
    Ok(n)
}

/// calls.py's `bench_suite` with the native client: the same calls, in the same order.
fn bench_suite(c: &Client, d: &str, n: usize) -> Result<BTreeMap<&'static str, Samples>> {
    let f12 = format!("{d}/file12");
    let data = DATA.as_bytes();
    c.put_file(&f12, 0o777, OWRITE, data, 0, NO_LEASE_ID)
        .with_context(|| format!("PutFile {f12}"))?;
    let mut buf = [0u8; 12];
    let mut res = BTreeMap::new();
    let close = |fd: u32| -> Result<()> { Ok(c.close_fd(fd)?) };

    res.insert("ClntID", timed(n, none, |_| Ok(c.clnt_id()?), keep)?);
    res.insert("Started", timed(n, none, |_| Ok(c.started()?), keep)?);
    res.insert(
        "Exited",
        timed(
            n,
            none,
            |_| Ok(c.exited(STATUS_OK, "Exited normally!")?),
            keep,
        )?,
    );
    res.insert(
        "Create",
        timed(
            n,
            |i| Ok(format!("{d}/c{i}")),
            |p| Ok(c.create(&p, 0o777, OWRITE)?),
            close,
        )?,
    );
    res.insert(
        "Open",
        timed(n, none, |_| Ok(c.open(&f12, OREAD, false)?), close)?,
    );
    let wfd = c.create(&format!("{d}/w"), 0o777, OWRITE)?;
    res.insert("Write", timed(n, none, |_| Ok(c.write(wfd, data)?), keep)?);
    c.close_fd(wfd)?;
    let rfd = c.open(&f12, OREAD, false)?;
    res.insert(
        "Read",
        timed(
            n,
            |_| Ok(c.seek(rfd, 0)?),
            |_| read_into(c, rfd, &mut buf),
            keep,
        )?,
    );
    if buf != data {
        bail!("Read returned {buf:?}, not {DATA:?}");
    }
    res.insert("Seek", timed(n, none, |_| Ok(c.seek(rfd, 0)?), keep)?);
    c.close_fd(rfd)?;
    res.insert(
        "CloseFD",
        timed(
            n,
            |_| Ok(c.open(&f12, OREAD, false)?),
            |fd| Ok(c.close_fd(fd)?),
            keep,
        )?,
    );
    let p = format!("{d}/p");
    res.insert(
        "PutFile",
        timed(
            n,
            none,
            |_| Ok(c.put_file(&p, 0o777, OWRITE, data, 0, NO_LEASE_ID)?),
            keep,
        )?,
    );
    res.insert("GetFile", timed(n, none, |_| Ok(c.get_file(&f12)?), keep)?);
    res.insert("Stat", timed(n, none, |_| Ok(c.stat(&f12)?), keep)?);
    res.insert(
        "Remove",
        timed(n, |i| Ok(format!("{d}/c{i}")), |p| Ok(c.remove(&p)?), keep)?,
    );
    // The calls σPy's table lacks: a directory of 10 entries listed whole, and a watch read
    // with one creation waiting (the creation is untimed setup).
    let gd = format!("{d}/dir");
    ensure_dir(c, &gd)?;
    for i in 0..10 {
        c.put_file(&format!("{gd}/e{i}"), 0o777, OWRITE, data, 0, NO_LEASE_ID)?;
    }
    res.insert("GetDir", timed(n, none, |_| Ok(c.get_dir(&gd)?), keep)?);
    let dfd = c.open(&gd, OREAD, false)?;
    c.read_dir(dfd)?;
    let wfd = c.dir_watch(dfd)?;
    c.close_fd(dfd)?;
    res.insert(
        "WatchRead",
        timed(
            n,
            |i| Ok(c.put_file(&format!("{gd}/n{i}"), 0o777, OWRITE, data, 0, NO_LEASE_ID)?),
            |_| Ok(c.read_watch(wfd)?),
            keep,
        )?,
    );
    c.close_fd(wfd)?;
    for name in c.get_dir(&gd)? {
        c.remove(&format!("{gd}/{}", name.name))?;
    }
    c.remove(&gd)?;
    for p in [format!("{d}/w"), p, f12] {
        c.remove(&p).with_context(|| format!("Remove {p}"))?;
    }
    Ok(res)
}

/// Makes the directory `d` unless it exists (calls.py does the same before its suites).
fn ensure_dir(c: &Client, d: &str) -> Result<()> {
    match c.stat(d) {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(ECODE_NOTFOUND) => {
            let fd = c
                .create(d, DMDIR | 0o777, OREAD)
                .with_context(|| format!("creating {d}"))?;
            Ok(c.close_fd(fd)?)
        }
        Err(e) => Err(e).with_context(|| format!("Stat {d}")),
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let c = Client::connect(&args.socket, None)?;
    let d = format!("{}/{}", args.root, args.dir);
    ensure_dir(&c, &d)?;
    if args.warmup > 0 {
        bench_suite(&c, &d, args.warmup).context("warm-up pass")?;
    }
    let res = bench_suite(&c, &d, args.n)?;
    let (mut wall, mut cpu) = (BTreeMap::new(), BTreeMap::new());
    for (name, s) in res {
        wall.insert(name, s.wall);
        cpu.insert(name, s.cpu);
    }
    let out = serde_json::json!({ "wall": wall, "cpu": cpu });
    println!("{out}");
    Ok(())
}
