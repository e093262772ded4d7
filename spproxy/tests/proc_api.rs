//! The rest of σOS's proc API on the embedded server: WaitEvict, DirWatch, directory reads
//! (scratch and object prefixes), proc state per connection, and reply shapes σOS's Go
//! client accepts (Exited's err, NotSupported for calls the realm cannot honour).

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use prost::Message;
use spproxy::consts::*;
use spproxy::proto::*;
use spproxy::server::{LocalDirStore, Server, ServerConfig};
use spproxy::{api, frame, procenv, rpc, Client, Error, WatchEvent};

struct Realm {
    _dir: tempfile::TempDir,
    scratch: std::path::PathBuf,
    objects: std::path::PathBuf,
    server: Server,
}

fn realm() -> Realm {
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    let objects = dir.path().join("objects");
    std::fs::create_dir_all(objects.join("bkt")).unwrap();
    let store = Arc::new(LocalDirStore::new(&objects));
    let server = Server::new(ServerConfig::new("api", &scratch, store)).unwrap();
    Realm {
        _dir: dir,
        scratch,
        objects,
        server,
    }
}

fn connect_as(r: &Realm, pid: &str) -> Client {
    let (c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    Client::from_stream(c, Some(procenv::minimal(pid, "prog", "rootrealm"))).unwrap()
}

fn code(e: Error) -> u32 {
    e.code()
        .unwrap_or_else(|| panic!("expected a σOS error, got {e}"))
}

/// One raw call: the reply's frames as sent.
fn raw_call<M: rpc::RpcMessage>(r: &Realm, method: &str, msg: M) -> Vec<Vec<u8>> {
    let (mut c, s) = UnixStream::pair().unwrap();
    r.server.serve_stream(s);
    let lim = frame::Limits::default();
    let (m, q) = api::init(procenv::minimal("raw", "raw", "rootrealm"));
    frame::write_message(&mut c, 1, &rpc::request_frames(m, q)).unwrap();
    frame::read_message(&mut c, &lim).unwrap().unwrap();
    frame::write_message(&mut c, 2, &rpc::request_frames(method, msg)).unwrap();
    let rep = frame::read_message(&mut c, &lim).unwrap().unwrap();
    assert_eq!(rep.seqno, 2);
    rep.frames
}

#[test]
fn wait_evict_returns_when_the_realm_is_evicted() {
    let r = realm();
    let cl = Arc::new(connect_as(&r, "p1"));
    let w = {
        let cl = cl.clone();
        thread::spawn(move || cl.wait_evict())
    };
    // The connection keeps serving while WaitEvict is parked.
    for _ in 0..10 {
        cl.stat("name/ux/~local").unwrap();
    }
    thread::sleep(Duration::from_millis(50));
    assert!(!w.is_finished());
    assert_eq!(r.server.waiting(), 1);
    assert!(r.server.evict(), "a proc was waiting for eviction");
    w.join().unwrap().unwrap();
    // Once evicted, WaitEvict returns at once.
    cl.wait_evict().unwrap();
    cl.exited(STATUS_EVICTED, "evicted").unwrap();
    assert_eq!(
        r.server.proc_state().exited,
        Some((STATUS_EVICTED, "evicted".into()))
    );
}

#[test]
fn get_dir_lists_scratch_and_object_prefixes_in_sigmas_encoding() {
    let r = realm();
    let cl = connect_as(&r, "p");
    cl.create("name/ux/~local/d", 0o755 | DMDIR, OREAD).unwrap();
    cl.put_file(
        "name/ux/~local/d/a",
        0o644,
        OWRITE,
        b"12345",
        0,
        NO_LEASE_ID,
    )
    .unwrap();
    cl.create("name/ux/~local/d/sub", 0o755 | DMDIR, OREAD)
        .unwrap();
    let ents = cl.get_dir("name/ux/~local/d").unwrap();
    let got: Vec<(String, bool, u64)> = ents
        .iter()
        .map(|s| (s.name.clone(), s.is_dir(), s.length))
        .collect();
    assert_eq!(
        got,
        [("a".into(), false, 5), ("sub".into(), true, got[1].2)]
    );
    assert!(cl.get_dir("name/ux/~local/d/sub").unwrap().is_empty());

    // Small reads return whole entries only, and page through the directory.
    let fd = cl.open("name/ux/~local/d", OREAD, O_NOW).unwrap();
    let first = cl.read(fd, 60).unwrap();
    let one = spproxy::dirent::decode_dir(&first).unwrap();
    assert_eq!(one.len(), 1, "{} bytes", first.len());
    assert_eq!(one[0].name, "a");
    let rest = cl.read_dir(fd).unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].name, "sub");
    cl.close_fd(fd).unwrap();

    // Object prefixes read as directories.
    std::fs::create_dir_all(r.objects.join("bkt/x/y")).unwrap();
    std::fs::write(r.objects.join("bkt/x/k1"), b"1").unwrap();
    std::fs::write(r.objects.join("bkt/x/y/k2"), b"22").unwrap();
    std::fs::write(r.objects.join("bkt/top"), b"333").unwrap();
    let names = |p: &str| -> Vec<(String, bool)> {
        cl.get_dir(p)
            .unwrap()
            .into_iter()
            .map(|s| (s.name.clone(), s.is_dir()))
            .collect()
    };
    assert_eq!(
        names("name/s3/~local/bkt"),
        [("top".to_string(), false), ("x".to_string(), true)]
    );
    assert_eq!(
        names("name/s3/~local/bkt/x"),
        [("k1".to_string(), false), ("y".to_string(), true)]
    );
    assert_eq!(
        code(cl.get_dir("name/ux/~local/nope").unwrap_err()),
        ECODE_NOTFOUND
    );
}

#[test]
fn dir_watch_reports_creations_and_removals() {
    let r = realm();
    let cl = Arc::new(connect_as(&r, "watcher"));
    let other = connect_as(&r, "writer");
    cl.create("name/ux/~local/w", 0o755 | DMDIR, OREAD).unwrap();
    other
        .put_file("name/ux/~local/w/old", 0o644, OWRITE, b"", 0, NO_LEASE_ID)
        .unwrap();
    let fd = cl.open("name/ux/~local/w", OREAD, O_NOW).unwrap();
    assert_eq!(cl.read_dir(fd).unwrap().len(), 1);
    let wfd = cl.dir_watch(fd).unwrap();
    let reader = {
        let cl = cl.clone();
        thread::spawn(move || cl.read_watch(wfd))
    };
    thread::sleep(Duration::from_millis(50));
    assert!(!reader.is_finished(), "a watch read waits for a change");
    other
        .put_file("name/ux/~local/w/new", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap();
    assert_eq!(
        reader.join().unwrap().unwrap(),
        [WatchEvent {
            name: "new".into(),
            created: true
        }]
    );
    // A change made outside the server is seen too (by the waiter's poll).
    let reader = {
        let cl = cl.clone();
        thread::spawn(move || cl.read_watch(wfd))
    };
    std::fs::remove_file(r.scratch.join("w/old")).unwrap();
    assert_eq!(
        reader.join().unwrap().unwrap(),
        [WatchEvent {
            name: "old".into(),
            created: false
        }]
    );
    // Closing the watch fd ends a parked read at once, with no bytes and no error, as σOS's
    // watch does (an error reply would crash σOS's Go client); the client reads that as Closed.
    let raw = {
        let cl = cl.clone();
        thread::spawn(move || cl.read(wfd, 4096))
    };
    thread::sleep(Duration::from_millis(50));
    assert!(!raw.is_finished(), "a watch read waits for a change");
    cl.close_fd(wfd).unwrap();
    assert_eq!(raw.join().unwrap().unwrap(), Vec::<u8>::new());
    let wfd = cl
        .dir_watch(cl.open("name/ux/~local/w", OREAD, O_NOW).unwrap())
        .unwrap();
    let reader = {
        let cl = cl.clone();
        thread::spawn(move || cl.read_watch(wfd))
    };
    thread::sleep(Duration::from_millis(50));
    cl.close_fd(wfd).unwrap();
    assert_eq!(code(reader.join().unwrap().unwrap_err()), ECODE_CLOSED);
    // A read of a watch fd already closed is an error (an unknown fd).
    assert_eq!(code(cl.read(wfd, 4096).unwrap_err()), ECODE_UNKNOWNFID);
    // DirWatch on a file is NotDir.
    let f = cl.open("name/ux/~local/w/new", OREAD, O_NOW).unwrap();
    assert_eq!(code(cl.dir_watch(f).unwrap_err()), ECODE_NOTDIR);
}

#[test]
fn proc_state_is_per_connection() {
    let r = realm();
    let a = connect_as(&r, "proc-a");
    let b = connect_as(&r, "proc-b");
    assert_ne!(a.clnt_id().unwrap(), b.clnt_id().unwrap());
    b.started().unwrap();
    b.exited(STATUS_ERR, "b failed").unwrap();
    a.started().unwrap();
    let all = r.server.proc_states();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].pid.as_deref(), Some("proc-a"));
    assert!(all[0].started && all[0].exited.is_none());
    assert_eq!(all[1].pid.as_deref(), Some("proc-b"));
    assert_eq!(all[1].exited, Some((STATUS_ERR, "b failed".into())));
    assert_eq!(all[0].clnt_id, Some(a.clnt_id().unwrap()));
    // The primary proc is the first one that called Init.
    assert_eq!(r.server.proc_state().pid.as_deref(), Some("proc-a"));
    assert!(r.server.proc_state().exited.is_none());
}

#[test]
fn reply_shapes_the_go_client_accepts() {
    let r = realm();
    // Exited: a 2-frame reply whose SigmaErrRep carries an (empty) err, `0a 00`.
    let f = raw_call(
        &r,
        api::EXITED,
        SigmaExitedReq {
            status: 1,
            msg: "bye".into(),
        },
    );
    assert_eq!(f.len(), 2);
    assert_eq!(f[1], [0x0a, 0x00]);
    // WaitEvict (once evicted): the same shape.
    assert!(!r.server.evict(), "nobody was waiting");
    let f = raw_call(&r, api::WAIT_EVICT, SigmaNullReq {});
    assert_eq!(f.len(), 2);
    assert_eq!(f[1], [0x0a, 0x00]);
    // A σOS call the realm cannot honour: its own reply type, err = NotSupported.
    let f = raw_call(&r, "SPProxySrvAPI.MountTree", SigmaNullReq {});
    assert_eq!(f.len(), 2);
    let rep = SigmaErrRep::decode(f[1].as_slice()).unwrap();
    assert_eq!(rep.err.unwrap().err_code, ECODE_NOTSUPPORTED);
    let f = raw_call(
        &r,
        api::WRITE_READ,
        SigmaWriteReq {
            fd: 3,
            n_out_vec: 2,
            ..Default::default()
        },
    );
    assert_eq!(f.len(), 4, "2 + nOutVec frames");
    let rep = SigmaDataRep::decode(f[1].as_slice()).unwrap();
    assert_eq!(rep.err.unwrap().err_code, ECODE_NOTSUPPORTED);
    // A method σOS does not have: the one-frame RPC error.
    let f = raw_call(&r, "SPProxySrvAPI.Bogus", SigmaNullReq {});
    assert_eq!(f.len(), 1);
}

#[test]
fn error_cases_match_sigmas() {
    let r = realm();
    let cl = connect_as(&r, "p");
    assert_eq!(
        code(cl.open("name/ux/~local/missing", OREAD, O_NOW).unwrap_err()),
        ECODE_NOTFOUND
    );
    assert_eq!(
        code(cl.stat("name/s3/~local/bkt/missing").unwrap_err()),
        ECODE_NOTFOUND
    );
    cl.create("name/ux/~local/full", 0o755 | DMDIR, OREAD)
        .unwrap();
    cl.put_file("name/ux/~local/full/f", 0o644, OWRITE, b"x", 0, NO_LEASE_ID)
        .unwrap();
    assert_eq!(
        code(cl.remove("name/ux/~local/full").unwrap_err()),
        ECODE_NOTEMPTY
    );
    assert_eq!(
        code(cl.open("name/ux/~local/full/f", 0x100, O_NOW).unwrap_err()),
        ECODE_INVAL
    );
    // CreateLeased is Create (leases have no meaning in a one-machine realm).
    let (m, mut q) = api::create("name/ux/~local/leased", 0o644, OWRITE);
    q.lease_id = 7;
    let rep: SigmaFdRep = cl.call(api::CREATE_LEASED, q).unwrap();
    let _ = m;
    assert_eq!(rep.err.unwrap().err_code, 0);
    assert!(r.scratch.join("leased").exists());
}
