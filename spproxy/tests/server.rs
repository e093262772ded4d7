//! Client ↔ embedded server over real Unix sockets: every call, its errors, escapes,
//! the object store, RPC-level errors, malformed frames and pipelining.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::thread;

use spproxy::consts::*;
use spproxy::proto::*;
use spproxy::server::{LocalDirStore, ObjectStore, Server, ServerConfig, ServerError};
use spproxy::{api, Client, Error};

struct Realm {
    _dir: tempfile::TempDir,
    scratch: std::path::PathBuf,
    store: Arc<LocalDirStore>,
    server: Server,
}

fn realm() -> Realm {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("bkt")).unwrap();
    let store = Arc::new(LocalDirStore::new(&objects));
    let server = Server::new(ServerConfig::new("test-realm", &scratch, store.clone())).unwrap();
    Realm {
        _dir: dir,
        scratch,
        store,
        server,
    }
}

fn connect(r: &Realm) -> Client {
    let (c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    Client::from_stream(c, None).unwrap()
}

fn code(e: Error) -> u32 {
    e.code()
        .unwrap_or_else(|| panic!("expected a σOS error, got {e}"))
}

const F: &str = "name/ux/~local/f";

#[test]
fn every_call_round_trips() {
    let r = realm();
    let cl = connect(&r);
    assert!(!r.server.proc_state().started);
    cl.started().unwrap();
    assert!(r.server.proc_state().started);
    let id = cl.clnt_id().unwrap();
    assert_eq!(cl.clnt_id().unwrap(), id);

    let fd = cl.create(F, 0o644, OWRITE).unwrap();
    assert_eq!(cl.write(fd, b"Hello World!").unwrap(), 12);
    cl.close_fd(fd).unwrap();
    assert_eq!(std::fs::read(r.scratch.join("f")).unwrap(), b"Hello World!");

    let st = cl.stat(F).unwrap();
    assert_eq!((st.length, st.name.as_str(), st.is_dir()), (12, "f", false));
    assert_eq!(st.mode & 0o777, 0o644);
    assert!(st.qid.path != 0);
    assert!(!st.uid.is_empty());

    let fd = cl.open(F, OREAD, O_NOW).unwrap();
    assert_eq!(cl.read(fd, 5).unwrap(), b"Hello");
    assert_eq!(cl.read(fd, 64).unwrap(), b" World!");
    assert_eq!(cl.read(fd, 64).unwrap(), b"");
    cl.seek(fd, 6).unwrap();
    assert_eq!(cl.read(fd, 3).unwrap(), b"Wor");
    assert_eq!(cl.pread(fd, 64, 0).unwrap(), b"Hello World!");
    assert_eq!(
        cl.read(fd, 64).unwrap(),
        b"ld!",
        "pread leaves the offset alone"
    );
    assert_eq!(code(cl.write(fd, b"x").unwrap_err()), ECODE_PERM);
    cl.close_fd(fd).unwrap();
    assert_eq!(code(cl.close_fd(fd).unwrap_err()), ECODE_UNKNOWNFID);
    assert_eq!(code(cl.read(fd, 1).unwrap_err()), ECODE_UNKNOWNFID);

    assert_eq!(cl.get_file(F).unwrap(), b"Hello World!");
    let g = "name/ux/~local/d/g";
    assert_eq!(
        code(
            cl.put_file(g, 0o777, OWRITE, b"x", 0, NO_LEASE_ID)
                .unwrap_err()
        ),
        ECODE_NOTFOUND
    );
    let dfd = cl.create("name/ux/~local/d", DMDIR | 0o755, OREAD).unwrap();
    cl.close_fd(dfd).unwrap();
    assert!(cl.stat("name/ux/~local/d").unwrap().is_dir());
    assert_eq!(
        cl.put_file(g, 0o777, OWRITE, b"payload", 0, NO_LEASE_ID)
            .unwrap(),
        7
    );
    assert_eq!(
        cl.put_file(g, 0o777, OWRITE | OTRUNC, b"new", 0, NO_LEASE_ID)
            .unwrap(),
        3
    );
    assert_eq!(cl.get_file(g).unwrap(), b"new");
    assert_eq!(
        code(
            cl.put_file(g, 0o777, OWRITE | OEXCL, b"x", 0, NO_LEASE_ID)
                .unwrap_err()
        ),
        ECODE_EXISTS
    );
    cl.rename(g, "name/ux/~local/h").unwrap();
    assert_eq!(code(cl.stat(g).unwrap_err()), ECODE_NOTFOUND);
    assert_eq!(cl.get_file("name/ux/~local/h").unwrap(), b"new");
    cl.remove("name/ux/~local/h").unwrap();
    assert_eq!(
        code(cl.remove("name/ux/~local/h").unwrap_err()),
        ECODE_NOTFOUND
    );

    // Errors carry σOS codes and names.
    match cl.open("name/ux/~local/missing", OREAD, O_NOW).unwrap_err() {
        Error::Sigma {
            code, name, obj, ..
        } => {
            assert_eq!(
                (code, name, obj.as_str()),
                (ECODE_NOTFOUND, "Notfound", "missing")
            )
        }
        e => panic!("{e}"),
    }
    assert_eq!(code(cl.create(F, 0o644, OWRITE).unwrap_err()), ECODE_EXISTS);
    assert_eq!(
        code(cl.get_file("name/ux/~local/d").unwrap_err()),
        ECODE_ISDIR
    );
    cl.put_file("name/ux/~local/d/x", 0o644, OWRITE, b"", 0, NO_LEASE_ID)
        .unwrap();
    assert_eq!(
        code(cl.remove("name/ux/~local/d").unwrap_err()),
        ECODE_NOTEMPTY
    );
    cl.remove("name/ux/~local/d/x").unwrap();
    cl.remove("name/ux/~local/d").unwrap();
    assert_eq!(
        code(cl.stat("name/nosuch/~local/x").unwrap_err()),
        ECODE_NOTFOUND
    );

    cl.exited(STATUS_OK, "bye").unwrap();
    let ps = r.server.proc_state();
    assert_eq!(ps.exited, Some((STATUS_OK, "bye".to_owned())));
    assert!(ps.pid.is_some());
}

#[test]
fn escapes_from_the_realm_are_refused_with_perm() {
    let r = realm();
    let outside = r.scratch.parent().unwrap().join("secret");
    std::fs::write(&outside, b"top secret").unwrap();
    std::os::unix::fs::symlink(&outside, r.scratch.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../secret", r.scratch.join("rel-link")).unwrap();
    std::os::unix::fs::symlink(r.scratch.parent().unwrap(), r.scratch.join("dir-link")).unwrap();
    let cl = connect(&r);
    for p in [
        "name/ux/~local/../secret",
        "name/ux/~local/a/../../secret",
        "name/ux/~local/abs-link",
        "name/ux/~local/rel-link",
        "name/ux/~local/dir-link/secret",
    ] {
        assert_eq!(
            code(cl.get_file(p).unwrap_err()),
            ECODE_PERM,
            "get_file {p}"
        );
        assert_eq!(code(cl.stat(p).unwrap_err()), ECODE_PERM, "stat {p}");
        assert_eq!(
            code(cl.open(p, OREAD, O_NOW).unwrap_err()),
            ECODE_PERM,
            "open {p}"
        );
    }
    let out2 = "name/ux/~local/../planted";
    assert_eq!(
        code(
            cl.put_file(out2, 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
                .unwrap_err()
        ),
        ECODE_PERM
    );
    assert_eq!(
        code(cl.create(out2, 0o644, OWRITE).unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(
        code(
            cl.create("name/ux/~local/dir-link/planted", 0o644, OWRITE)
                .unwrap_err()
        ),
        ECODE_PERM
    );
    assert!(!r.scratch.parent().unwrap().join("planted").exists());
    assert_eq!(
        code(cl.remove("name/ux/~local/..").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(
        code(cl.remove("name/ux/~local/../secret").unwrap_err()),
        ECODE_PERM
    );
    cl.put_file(F, 0o644, OWRITE, b"x", 0, NO_LEASE_ID).unwrap();
    assert_eq!(
        code(cl.rename(F, "name/ux/~local/../stolen").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(
        code(cl.get_file("name/s3/~local/bkt/../../secret").unwrap_err()),
        ECODE_PERM
    );
    assert_eq!(std::fs::read(&outside).unwrap(), b"top secret");
    // Removing the symlink itself stays inside and is allowed.
    cl.remove("name/ux/~local/abs-link").unwrap();
    assert!(outside.exists());
}

#[test]
fn object_store_paths() {
    let r = realm();
    let cl = connect(&r);
    let k = "name/s3/~local/bkt/dir/obj";
    assert_eq!(
        cl.put_file(k, 0o777, OWRITE, b"object!", 0, NO_LEASE_ID)
            .unwrap(),
        7
    );
    assert_eq!(r.store.get("bkt", "dir/obj").unwrap(), b"object!");
    assert_eq!(cl.get_file(k).unwrap(), b"object!");
    assert_eq!(cl.stat(k).unwrap().length, 7);
    assert!(cl.stat("name/s3/~local/bkt/dir").unwrap().is_dir());
    assert!(cl.stat("name/s3/~local/bkt").unwrap().is_dir());
    let fd = cl.open(k, OREAD, O_NOW).unwrap();
    assert_eq!(cl.pread(fd, 3, 3).unwrap(), b"ect");
    assert_eq!(cl.read(fd, 100).unwrap(), b"object!");
    cl.close_fd(fd).unwrap();
    // Create + Write buffer the object; CloseFd uploads it.
    let fd = cl.create("name/s3/~local/bkt/new", 0o777, OWRITE).unwrap();
    cl.write(fd, b"part1 ").unwrap();
    cl.write(fd, b"part2").unwrap();
    assert_eq!(
        code(cl.stat("name/s3/~local/bkt/new").unwrap_err()),
        ECODE_NOTFOUND
    );
    cl.close_fd(fd).unwrap();
    assert_eq!(r.store.get("bkt", "new").unwrap(), b"part1 part2");
    assert_eq!(code(cl.create(k, 0o777, OWRITE).unwrap_err()), ECODE_EXISTS);
    cl.rename(k, "name/s3/~local/bkt/moved").unwrap();
    assert_eq!(code(cl.get_file(k).unwrap_err()), ECODE_NOTFOUND);
    cl.remove("name/s3/~local/bkt/moved").unwrap();
    assert_eq!(
        code(cl.remove("name/s3/~local/bkt/moved").unwrap_err()),
        ECODE_NOTFOUND
    );
    assert_eq!(
        code(cl.get_file("name/s3/~local/nobucket/x").unwrap_err()),
        ECODE_NOTFOUND
    );
    assert_eq!(
        code(
            cl.rename("name/s3/~local/bkt/new", "name/ux/~local/new")
                .unwrap_err()
        ),
        ECODE_NOTSUPPORTED
    );
}

#[test]
fn rpc_level_errors_unknown_method_and_init_rules() {
    let r = realm();
    let cl = connect(&r);
    match cl
        .call::<_, SigmaErrRep>("SPProxySrvAPI.NoSuchMethod", SigmaNullReq {})
        .unwrap_err()
    {
        Error::Sigma { code, obj, .. } => {
            assert_eq!(
                (code, obj.as_str()),
                (ECODE_NOTFOUND, "SPProxySrvAPI.NoSuchMethod")
            )
        }
        e => panic!("{e}"),
    }
    // A second Init fails at the RPC level; the connection still works afterwards.
    let (m, q) = api::init(spproxy::procenv::minimal("p", "prog", "rootrealm"));
    assert_eq!(
        code(cl.call::<_, SigmaErrRep>(m, q).unwrap_err()),
        ECODE_ERROR
    );
    cl.started().unwrap();

    // Before Init every call is an RPC-level error.
    let (c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    let raw = Client::new_uninit(c).unwrap();
    let e = raw.stat(F).unwrap_err();
    assert_eq!(code(e), ECODE_ERROR);
    // A garbled request message is an RPC-level error too, not a dropped connection.
    let e = raw.call::<_, SigmaErrRep>(
        api::INIT,
        SigmaPathReq {
            path: "\u{1}".repeat(3),
        },
    );
    assert!(matches!(e, Err(Error::Sigma { .. })), "{e:?}");
}

#[test]
fn malformed_frame_closes_only_that_connection() {
    let r = realm();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("spproxyd.sock");
    let listener = r.server.bind(&sock).unwrap();
    let good = Client::from_stream(UnixStream::connect(&sock).unwrap(), None).unwrap();
    good.put_file(F, 0o644, OWRITE, b"still here", 0, NO_LEASE_ID)
        .unwrap();

    let (c, s) = UnixStream::pair().unwrap();
    let h = r.server.serve_stream(s);
    let mut bad = c;
    let mut msg = 1u64.to_le_bytes().to_vec();
    msg.extend_from_slice(&1u32.to_le_bytes());
    msg.extend_from_slice(&3u32.to_le_bytes()); // frame length < 4
    bad.write_all(&msg).unwrap();
    match h.join().unwrap() {
        Err(ServerError::Malformed(_)) => {}
        other => panic!("expected the connection to end as malformed, got {other:?}"),
    }
    let mut buf = [0u8; 1];
    assert_eq!(
        std::io::Read::read(&mut bad, &mut buf).unwrap(),
        0,
        "closed"
    );

    // A header announcing 4 GiB frames: rejected without allocating, connection closed.
    let (c, s) = UnixStream::pair().unwrap();
    let h = r.server.serve_stream(s);
    let mut bad = c;
    let mut msg = 1u64.to_le_bytes().to_vec();
    msg.extend_from_slice(&u32::MAX.to_le_bytes());
    bad.write_all(&msg).unwrap();
    assert!(matches!(h.join().unwrap(), Err(ServerError::Malformed(_))));

    // Other connections carry on, and new ones are accepted.
    assert_eq!(good.get_file(F).unwrap(), b"still here");
    let again = Client::from_stream(UnixStream::connect(&sock).unwrap(), None).unwrap();
    assert_eq!(again.get_file(F).unwrap(), b"still here");
    listener.shutdown();
    assert!(!Path::new(&sock).exists());
}

#[test]
fn pipelined_threads_share_one_connection() {
    let r = realm();
    let cl = Arc::new(connect(&r));
    let hs: Vec<_> = (0..8)
        .map(|t| {
            let cl = cl.clone();
            thread::spawn(move || {
                for i in 0..50 {
                    let p = format!("name/ux/~local/t{t}-{i}");
                    let data = format!("thread {t} item {i}").into_bytes();
                    cl.put_file(&p, 0o644, OWRITE, &data, 0, NO_LEASE_ID)
                        .unwrap();
                    assert_eq!(cl.get_file(&p).unwrap(), data);
                    let fd = cl.open(&p, OREAD, O_NOW).unwrap();
                    assert_eq!(cl.read(fd, 1000).unwrap(), data);
                    cl.close_fd(fd).unwrap();
                    cl.remove(&p).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(r.server.proc_state().calls >= 8 * 50 * 6);
}

#[test]
fn open_with_wait_returns_when_the_file_appears() {
    let r = realm();
    let cl = Arc::new(connect(&r));
    let waiter = {
        let cl = cl.clone();
        thread::spawn(move || cl.open("name/ux/~local/later", OREAD, O_WAIT))
    };
    // The same connection keeps serving while the Open waits.
    for _ in 0..20 {
        cl.stat("name/ux/~local").unwrap();
    }
    let other = connect(&r);
    other
        .put_file(
            "name/ux/~local/later",
            0o644,
            OWRITE,
            b"here",
            0,
            NO_LEASE_ID,
        )
        .unwrap();
    let fd = waiter.join().unwrap().unwrap();
    assert_eq!(cl.read(fd, 10).unwrap(), b"here");
}

/// Server gone in the middle of a waiting call: the client gets an Io error.
#[test]
fn connection_closed_mid_call_is_an_io_error() {
    let r = realm();
    let (c, s) = UnixStream::pair().unwrap();
    let s2 = s.try_clone().unwrap();
    r.server.serve_stream(s);
    let cl = Arc::new(Client::from_stream(c, None).unwrap());
    let waiter = {
        let cl = cl.clone();
        thread::spawn(move || cl.open("name/ux/~local/never", OREAD, O_WAIT))
    };
    thread::sleep(std::time::Duration::from_millis(50));
    s2.shutdown(std::net::Shutdown::Both).unwrap();
    let e = waiter.join().unwrap().unwrap_err();
    assert!(matches!(e, Error::Io(_)), "{e}");
}
