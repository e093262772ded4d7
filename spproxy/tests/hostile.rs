//! The realm server under hostile clients: every case asserts the attack's effect did not
//! happen (no allocation, nothing written outside, no thread per call) and that the server
//! still answers other clients.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spproxy::consts::*;
use spproxy::proto::*;
use spproxy::server::{LocalDirStore, Server, ServerConfig, ServerError, ServerLimits};
use spproxy::{api, rpc, Client, Error};

struct Realm {
    dir: tempfile::TempDir,
    scratch: std::path::PathBuf,
    objects: std::path::PathBuf,
    server: Server,
}

fn realm_with(limits: ServerLimits) -> Realm {
    realm_in(tempfile::tempdir().unwrap(), limits)
}

/// A realm whose scratch is `dir`/scratch (which may hold files already).
fn realm_in(dir: tempfile::TempDir, limits: ServerLimits) -> Realm {
    let scratch = dir.path().join("scratch");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("bkt")).unwrap();
    let store = Arc::new(LocalDirStore::new(&objects));
    let cfg = ServerConfig::new("hostile", &scratch, store).with_limits(limits);
    let server = Server::new(cfg).unwrap();
    Realm {
        dir,
        scratch,
        objects,
        server,
    }
}

fn realm() -> Realm {
    realm_with(ServerLimits {
        scratch_quota: 64 << 20,
        ..ServerLimits::default()
    })
}

fn connect(r: &Realm) -> Client {
    let (c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    Client::from_stream(c, None).unwrap()
}

/// A PutFile the scratch quota refuses with σOS's error for a full device.
fn put_refused(cl: &Client, path: &str, data: &[u8]) {
    let e = cl
        .put_file(path, 0o644, OWRITE, data, 0, NO_LEASE_ID)
        .unwrap_err();
    assert_eq!(code(e), ECODE_ERROR);
}

fn code(e: Error) -> u32 {
    eprintln!("σOS error: {e}");
    e.code()
        .unwrap_or_else(|| panic!("expected a σOS error, got {e}"))
}

/// Memory and thread counts are process-wide: these tests run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Another client can still do a full round trip.
fn assert_serves(r: &Realm) {
    let c = connect(r);
    c.put_file(
        "name/ux/~local/alive",
        0o644,
        OWRITE,
        b"yes",
        0,
        NO_LEASE_ID,
    )
    .unwrap();
    assert_eq!(c.get_file("name/ux/~local/alive").unwrap(), b"yes");
}

#[test]
fn huge_offsets_neither_allocate_nor_panic() {
    let _serial = serial();
    let r = realm();
    let cl = connect(&r);
    let rss0 = status_kb("VmRSS:");

    // A scratch file: seek far beyond the quota, then one byte.
    let fd = cl.create("name/ux/~local/f", 0o644, ORDWR).unwrap();
    cl.seek(fd, 1 << 40).unwrap();
    assert_eq!(code(cl.write(fd, b"x").unwrap_err()), ECODE_ERROR);
    cl.seek(fd, u64::MAX).unwrap();
    assert_eq!(code(cl.write(fd, b"x").unwrap_err()), ECODE_BADOFFSET);
    assert!(cl.pread(fd, u64::MAX, u64::MAX - 1).unwrap().is_empty());
    assert_eq!(std::fs::metadata(r.scratch.join("f")).unwrap().len(), 0);

    // An object being written: the same offsets against its in-memory buffer.
    let ofd = cl.create("name/s3/~local/bkt/obj", 0o644, OWRITE).unwrap();
    cl.seek(ofd, 1 << 40).unwrap();
    assert_eq!(code(cl.write(ofd, b"x").unwrap_err()), ECODE_ERROR);
    cl.seek(ofd, u64::MAX).unwrap();
    assert_eq!(code(cl.write(ofd, b"x").unwrap_err()), ECODE_BADOFFSET);
    cl.seek(ofd, 0).unwrap();
    cl.write(ofd, b"ok").unwrap();
    cl.close_fd(ofd).unwrap();
    assert_eq!(std::fs::read(r.objects.join("bkt/obj")).unwrap(), b"ok");

    // PutFile at a huge offset.
    assert_eq!(
        code(
            cl.put_file(
                "name/ux/~local/g",
                0o644,
                OWRITE,
                b"x",
                1 << 50,
                NO_LEASE_ID
            )
            .unwrap_err()
        ),
        ECODE_ERROR
    );
    assert_eq!(
        code(
            cl.put_file(
                "name/ux/~local/g",
                0o644,
                OWRITE,
                b"xy",
                u64::MAX - 1,
                NO_LEASE_ID
            )
            .unwrap_err()
        ),
        ECODE_BADOFFSET
    );

    let grown = status_kb("VmRSS:").saturating_sub(rss0);
    assert!(grown < 32 * 1024, "RSS grew by {grown} kB");
    assert_serves(&r);
}

#[test]
fn sparse_writes_stay_sparse_and_the_quota_is_a_full_device() {
    let _serial = serial();
    let r = realm(); // 64 MiB quota
    let cl = connect(&r);
    let rss0 = status_kb("VmRSS:");
    let fd = cl.create("name/ux/~local/sparse", 0o644, OWRITE).unwrap();
    cl.seek(fd, 60 << 20).unwrap();
    cl.write(fd, b"end").unwrap();
    let md = std::fs::metadata(r.scratch.join("sparse")).unwrap();
    assert_eq!(md.len(), (60 << 20) + 3);
    assert!(
        md.blocks() * 512 < 1 << 20,
        "hole allocated: {} blocks",
        md.blocks()
    );
    assert!(status_kb("VmRSS:").saturating_sub(rss0) < 16 * 1024);
    assert_eq!(r.server.scratch_usage(), ((60 << 20) + 3, 64 << 20));

    // Past the quota: σOS's error for a full device, nothing written.
    cl.seek(fd, 65 << 20).unwrap();
    let e = cl.write(fd, b"more").unwrap_err();
    assert!(
        matches!(&e, Error::Sigma { code: ECODE_ERROR, msg, .. } if msg.contains("no space")),
        "{e}"
    );
    assert_eq!(
        std::fs::metadata(r.scratch.join("sparse")).unwrap().len(),
        (60 << 20) + 3
    );
    let big = vec![7u8; 8 << 20];
    put_refused(&cl, "name/ux/~local/big", &big);
    // Removing the file gives its bytes back.
    cl.close_fd(fd).unwrap();
    cl.remove("name/ux/~local/sparse").unwrap();
    cl.put_file("name/ux/~local/big", 0o644, OWRITE, &big, 0, NO_LEASE_ID)
        .unwrap();
    assert_eq!(r.server.scratch_usage().0, 8 << 20);
    assert_serves(&r);
}

#[test]
fn a_frame_over_the_limit_is_refused_before_it_is_read() {
    let _serial = serial();
    let r = realm_with(ServerLimits {
        max_frame: 1 << 20,
        ..ServerLimits::default()
    });
    let rss0 = status_kb("VmRSS:");
    let (mut c, s) = UnixStream::pair().unwrap();
    let h = r.server.serve_stream(s);
    let mut msg = 1u64.to_le_bytes().to_vec();
    msg.extend_from_slice(&1u32.to_le_bytes());
    msg.extend_from_slice(&((1u32 << 30) + 4).to_le_bytes()); // announces 1 GiB
    msg.extend_from_slice(&[0u8; 4096]);
    c.write_all(&msg).unwrap();
    assert!(matches!(h.join().unwrap(), Err(ServerError::Malformed(_))));
    let mut b = [0u8; 1];
    assert_eq!(c.read(&mut b).unwrap(), 0, "connection closed");
    assert!(status_kb("VmRSS:").saturating_sub(rss0) < 16 * 1024);

    // A file read is capped to what one frame may carry; a whole GetFile over it is refused.
    let cl = connect(&r);
    let data = vec![1u8; 2 << 20];
    std::fs::write(r.scratch.join("two-mib"), &data).unwrap();
    let fd = cl.open("name/ux/~local/two-mib", OREAD, O_NOW).unwrap();
    let got = cl.read(fd, u64::MAX).unwrap();
    assert!(!got.is_empty() && got.len() < 1 << 20, "{}", got.len());
    assert_eq!(
        code(cl.get_file("name/ux/~local/two-mib").unwrap_err()),
        ECODE_BADCOUNT
    );
    assert_serves(&r);
}

#[test]
fn ten_thousand_waiting_opens_keep_the_thread_count() {
    let _serial = serial();
    let r = realm_with(ServerLimits {
        max_fds: 20_000,
        ..ServerLimits::default()
    });
    let (mut c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    let init = rpc::encode_request(
        1,
        api::INIT,
        api::init(spproxy::procenv::minimal("w", "w", "r")).1,
    );
    c.write_all(&init).unwrap();
    let mut reader = std::io::BufReader::new(c.try_clone().unwrap());
    let limits = spproxy::frame::Limits::default();
    spproxy::frame::read_message(&mut reader, &limits)
        .unwrap()
        .unwrap();
    // Settle: the waiter thread starts with the first parked call.
    let (m, q) = api::open("name/ux/~local/first", OREAD, O_WAIT);
    c.write_all(&rpc::encode_request(2, m, q)).unwrap();
    while r.server.waiting() < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let threads0 = threads();
    let rss0 = status_kb("VmRSS:");
    const N: u64 = 10_000;
    let mut batch = Vec::new();
    for i in 0..N {
        let (m, q) = api::open("name/ux/~local/gate", OREAD, O_WAIT);
        batch.extend(rpc::encode_request(3 + i, m, q));
    }
    c.write_all(&batch).unwrap();
    let t = Instant::now();
    while r.server.waiting() < N as usize + 1 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{} parked",
            r.server.waiting()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // (Threads of earlier tests' connections may still be ending: never more.)
    assert!(
        threads() <= threads0,
        "{} threads, {threads0} before",
        threads()
    );
    let grown = status_kb("VmRSS:").saturating_sub(rss0);
    assert!(grown < 64 * 1024, "RSS grew by {grown} kB for {N} waiters");
    // Other clients are served while they wait.
    assert_serves(&r);

    // The file appears: every waiter gets its own fd.
    std::fs::write(r.scratch.join("gate"), b"open").unwrap();
    let mut fds = std::collections::HashSet::new();
    for _ in 0..N {
        let m = spproxy::frame::read_message(&mut reader, &limits)
            .unwrap()
            .unwrap();
        let rep: SigmaFdRep = rpc::decode_reply(m.frames).unwrap();
        assert_eq!(rep.err.unwrap().err_code, 0);
        assert!(fds.insert(rep.fd));
    }
    // The waiter thread lowers its count once the whole batch is answered, which a fast reader
    // can beat: give it a moment.
    let t = Instant::now();
    while r.server.waiting() != 1 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(r.server.waiting(), 1);
    drop(c);
    drop(reader);
}

#[test]
fn a_disconnect_releases_its_waiting_calls_and_fds() {
    let _serial = serial();
    let r = realm();
    let (c, s) = UnixStream::pair().unwrap();
    let ours = c.try_clone().unwrap();
    r.server.serve_stream(s);
    let cl = Arc::new(Client::from_stream(c, None).unwrap());
    for i in 0..50 {
        let cl = cl.clone();
        std::thread::spawn(move || cl.open(&format!("name/ux/~local/never{i}"), OREAD, O_WAIT));
    }
    let evict = {
        let cl = cl.clone();
        std::thread::spawn(move || cl.wait_evict())
    };
    let t = Instant::now();
    while r.server.waiting() < 51 {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..100 {
        cl.put_file(
            &format!("name/ux/~local/h{i}"),
            0o644,
            OWRITE,
            b"x",
            0,
            NO_LEASE_ID,
        )
        .unwrap();
        cl.open(&format!("name/ux/~local/h{i}"), OREAD, O_NOW)
            .unwrap();
    }
    // The client goes away without closing anything.
    ours.shutdown(std::net::Shutdown::Both).unwrap();
    assert!(evict.join().unwrap().is_err());
    let t = Instant::now();
    while r.server.waiting() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} still parked",
            r.server.waiting()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_serves(&r);
}

#[test]
fn symlinks_in_the_bucket_and_the_scratch_are_not_followed() {
    let _serial = serial();
    let r = realm();
    let outside = r.dir.path().join("host-secret");
    std::fs::write(&outside, b"host").unwrap();
    let bkt = r.objects.join("bkt");
    std::os::unix::fs::symlink(&outside, bkt.join("link")).unwrap();
    std::os::unix::fs::symlink(r.dir.path(), bkt.join("dirlink")).unwrap();
    std::os::unix::fs::symlink(r.dir.path(), r.objects.join("linkbkt")).unwrap();
    std::fs::create_dir_all(&r.scratch).unwrap();
    std::os::unix::fs::symlink(r.dir.path(), r.scratch.join("up")).unwrap();
    let cl = connect(&r);
    assert_eq!(
        code(cl.get_file("name/s3/~local/bkt/link").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(
        code(cl.stat("name/s3/~local/bkt/link").unwrap_err()),
        ECODE_PERM
    );
    for p in [
        "name/s3/~local/bkt/dirlink/host-secret",
        "name/s3/~local/linkbkt/host-secret",
        "name/ux/~local/up/host-secret",
    ] {
        assert_eq!(code(cl.get_file(p).unwrap_err()), ECODE_PERM, "get {p}");
        let e = cl
            .put_file(p, 0o644, OWRITE | OTRUNC, b"pwned", 0, NO_LEASE_ID)
            .unwrap_err();
        assert!(matches!(code(e), ECODE_PERM | ECODE_NOTFOUND), "put {p}");
    }
    assert_eq!(
        code(
            cl.put_file(
                "name/s3/~local/bkt/dirlink/new",
                0o644,
                OWRITE,
                b"x",
                0,
                NO_LEASE_ID
            )
            .unwrap_err()
        ),
        ECODE_PERM
    );
    // Putting over the link replaces the link (an object put is a rename into place), and
    // never writes through it.
    cl.put_file(
        "name/s3/~local/bkt/link",
        0o644,
        OWRITE,
        b"object",
        0,
        NO_LEASE_ID,
    )
    .unwrap();
    assert!(bkt.join("link").symlink_metadata().unwrap().is_file());
    assert_eq!(std::fs::read(&outside).unwrap(), b"host");
    assert!(!r.dir.path().join("new").exists());
    // A listing does not descend through links either.
    let names: Vec<String> = cl
        .get_dir("name/s3/~local/bkt")
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["link"], "links are not listed, the put object is");
    assert_serves(&r);
}

#[test]
fn nul_absolute_and_dotdot_paths_and_bad_modes_are_refused() {
    let _serial = serial();
    let r = realm();
    let cl = connect(&r);
    assert_eq!(
        code(cl.stat("name/ux/~local/a\0b").unwrap_err()),
        ECODE_INVAL
    );
    assert_eq!(code(cl.stat("/name/ux/~local/a").unwrap_err()), ECODE_INVAL);
    assert_eq!(
        code(cl.stat("name/ux/~local/a/..").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(
        code(cl.get_file("name/s3/~local/bkt/a/../../x").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(code(cl.stat(&"a/".repeat(5000)).unwrap_err()), ECODE_INVAL);
    cl.put_file("name/ux/~local/m", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap();
    assert_eq!(
        code(cl.open("name/ux/~local/m", 0x1000, O_NOW).unwrap_err()),
        ECODE_INVAL
    );
    assert_serves(&r);
}

#[test]
fn per_connection_fd_and_memory_bounds() {
    let _serial = serial();
    let r = realm_with(ServerLimits {
        max_fds: 16,
        conn_memory: 1 << 20,
        ..ServerLimits::default()
    });
    let cl = connect(&r);
    cl.put_file("name/ux/~local/f", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap();
    let fds: Vec<u32> = (0..16)
        .map(|_| cl.open("name/ux/~local/f", OREAD, O_NOW).unwrap())
        .collect();
    assert_eq!(
        code(cl.open("name/ux/~local/f", OREAD, O_NOW).unwrap_err()),
        ECODE_NOMEM
    );
    // Another connection has its own table.
    assert_serves(&r);
    for fd in fds {
        cl.close_fd(fd).unwrap();
    }
    // Object data held by fds counts against the connection's budget.
    std::fs::write(r.objects.join("bkt/big"), vec![0u8; 2 << 20]).unwrap();
    assert_eq!(
        code(cl.open("name/s3/~local/bkt/big", OREAD, O_NOW).unwrap_err()),
        ECODE_NOMEM
    );
    let w = cl.create("name/s3/~local/bkt/grow", 0o644, OWRITE).unwrap();
    cl.write(w, &vec![1u8; 512 << 10]).unwrap();
    assert_eq!(
        code(cl.write(w, &vec![1u8; 768 << 10]).unwrap_err()),
        ECODE_NOMEM
    );
    cl.close_fd(w).unwrap();
    assert_eq!(
        std::fs::metadata(r.objects.join("bkt/grow")).unwrap().len(),
        512 << 10
    );
    assert_serves(&r);
}

#[test]
fn parked_calls_per_connection_are_bounded() {
    let _serial = serial();
    let r = realm_with(ServerLimits {
        max_waiters: 4,
        ..ServerLimits::default()
    });
    let cl = Arc::new(connect(&r));
    let hs: Vec<_> = (0..4)
        .map(|i| {
            let cl = cl.clone();
            std::thread::spawn(move || cl.open(&format!("name/ux/~local/later{i}"), OREAD, O_WAIT))
        })
        .collect();
    let t = Instant::now();
    while r.server.waiting() < 4 {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(5));
    }
    // The fifth is answered at once, not parked.
    assert_eq!(
        code(cl.open("name/ux/~local/later9", OREAD, O_WAIT).unwrap_err()),
        ECODE_NOMEM
    );
    assert_eq!(code(cl.wait_evict().unwrap_err()), ECODE_NOMEM);
    // Another connection has its own bound.
    assert_serves(&r);
    for i in 0..4 {
        std::fs::write(r.scratch.join(format!("later{i}")), b"").unwrap();
    }
    for h in hs {
        h.join().unwrap().unwrap();
    }
    // The waiter thread counts its answered calls after sending their replies.
    let t = Instant::now();
    while r.server.waiting() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} still parked",
            r.server.waiting()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_bound_socket_serves_at_most_max_connections() {
    let _serial = serial();
    let r = realm_with(ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    });
    let sock = r.dir.path().join("spproxyd.sock");
    let listener = r.server.bind(&sock).unwrap();
    let a = Client::connect(&sock, None).unwrap();
    let b = Client::connect(&sock, None).unwrap();
    a.stat("name/ux/~local").unwrap();
    b.stat("name/ux/~local").unwrap();
    // A third is closed at accept (its Init fails), the first two carry on.
    assert!(Client::connect(&sock, None).is_err());
    a.stat("name/ux/~local").unwrap();
    // Once one goes away, a new connection is served again.
    drop(b);
    let t = Instant::now();
    let c = loop {
        match Client::connect(&sock, None) {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    };
    c.stat("name/ux/~local").unwrap();
    listener.shutdown();
}

/// What the scratch directory already holds counts against the quota: counted when a request
/// first needs it (not when the server is made), including what was put there before.
#[test]
fn files_already_in_the_scratch_count_against_the_quota() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("scratch/old")).unwrap();
    std::fs::write(dir.path().join("scratch/old/a"), vec![1u8; 3 << 20]).unwrap();
    let r = realm_in(
        dir,
        ServerLimits {
            scratch_quota: 4 << 20,
            ..ServerLimits::default()
        },
    );
    // Written after the server was made, before any request: counted too.
    std::fs::write(r.scratch.join("b"), vec![2u8; 512 << 10]).unwrap();
    let cl = connect(&r);
    let half = vec![7u8; 1 << 20];
    put_refused(&cl, "name/ux/~local/c", &half);
    // Nothing of it written (the refused put leaves at most an empty file, as σOS's does).
    assert_eq!(
        std::fs::metadata(r.scratch.join("c")).map_or(0, |m| m.len()),
        0
    );
    assert_eq!(r.server.scratch_usage(), ((3 << 20) + (512 << 10), 4 << 20));
    cl.put_file(
        "name/ux/~local/c",
        0o644,
        OWRITE,
        &half[..256 << 10],
        0,
        NO_LEASE_ID,
    )
    .unwrap();
    assert_eq!(r.server.scratch_usage().0, (3 << 20) + (768 << 10));
    assert_serves(&r);
}

/// A scratch directory that cannot be made (here: below a regular file) does not keep the
/// server from starting: the calls on name/ux fail with a σOS error, the others are served.
#[test]
fn an_unusable_scratch_directory_fails_only_the_calls_that_need_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let scratch = dir.path().join("file/scratch");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("bkt")).unwrap();
    std::fs::write(objects.join("bkt/obj"), b"object").unwrap();
    let store = Arc::new(LocalDirStore::new(&objects));
    let server = Server::new(ServerConfig::new("hostile", &scratch, store)).unwrap();
    let why = server.scratch_error().expect("the scratch is unusable");
    assert!(format!("{why}").contains("file/scratch"), "{why}");
    let (c, s) = UnixStream::pair().unwrap();
    server.serve_stream(s);
    let cl = Client::from_stream(c, None).unwrap();
    cl.started().unwrap();
    assert_eq!(cl.get_file("name/s3/~local/bkt/obj").unwrap(), b"object");
    let e = cl
        .put_file("name/ux/~local/x", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap_err();
    assert!(
        e.code().is_some(),
        "a σOS error, not a dropped connection: {e}"
    );
    code(cl.get_file("name/ux/~local/x").unwrap_err());
    // Still served after the refusals.
    assert_eq!(cl.get_file("name/s3/~local/bkt/obj").unwrap(), b"object");
    assert!(!dir.path().join("file/scratch").exists());
}

/// A scratch directory its caller refuses (a home that does not exist) is never made, even
/// where it could be: its calls fail, the others are served.
#[test]
fn a_refused_scratch_directory_is_not_made() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("home/.cache/scratch");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("bkt")).unwrap();
    std::fs::write(objects.join("bkt/obj"), b"object").unwrap();
    let store = Arc::new(LocalDirStore::new(&objects));
    let cfg =
        ServerConfig::new("hostile", &scratch, store).without_scratch(nix::errno::Errno::ENOENT);
    let server = Server::new(cfg).unwrap();
    let why = server.scratch_error().expect("the scratch is refused");
    assert!(format!("{why}").contains("home/.cache/scratch"), "{why}");
    let (c, s) = UnixStream::pair().unwrap();
    server.serve_stream(s);
    let cl = Client::from_stream(c, None).unwrap();
    cl.started().unwrap();
    let e = cl
        .put_file("name/ux/~local/x", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap_err();
    assert!(e.code().is_some(), "a σOS error: {e}");
    assert_eq!(cl.get_file("name/s3/~local/bkt/obj").unwrap(), b"object");
    assert!(!dir.path().join("home").exists());
}
