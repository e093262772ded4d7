//! The client against a scripted peer on a real socketpair: it must send exactly σOS's
//! request bytes, accept σOS's reply bytes, match out-of-order replies by seqno, and fail
//! every waiter (not hang) when the peer goes away.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use spproxy::consts::*;
use spproxy::frame::{self, Limits};
use spproxy::proto::*;
use spproxy::{api, procenv, rpc, Client, Error};

fn vec_file(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/sigmaos-wire/vectors")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn client_speaks_exactly_the_golden_conversation() {
    let names = [
        "01_init",
        "02_started",
        "03_clntid",
        "04_stat",
        "05_create",
        "06_write",
        "07_closefd",
        "08_open",
        "09_read",
        "10_seek",
        "11_pread",
        "12_closefd2",
        "13_getfile",
        "14_putfile",
        "15_rename",
        "16_remove",
        "17_open_notfound",
        "18_dirwatch",
        "19_exited",
    ];
    let (c, mut s) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        for n in names {
            let m = frame::read_message(&mut s, &Limits::default())
                .unwrap()
                .unwrap();
            let got = frame::encode(m.seqno, &m.frames);
            assert_eq!(got, vec_file(&format!("{n}_req.bin")), "request {n}");
            s.write_all(&vec_file(&format!("{n}_rep.bin"))).unwrap();
        }
    });
    let pe =
        procenv::from_json(std::str::from_utf8(&vec_file("sigmaconfig_example.json")).unwrap())
            .unwrap();
    let cl = Client::from_stream(c, Some(pe)).unwrap();
    let f = "name/ux/~local/f";
    cl.started().unwrap();
    assert_eq!(cl.clnt_id().unwrap(), 32_075_810_494_824);
    let st = cl.stat(f).unwrap();
    assert_eq!(
        (st.length, st.name.as_str(), st.qid.path, st.mode),
        (12, "f", 42, 0o777)
    );
    assert_eq!(cl.create(f, 0o777, OWRITE).unwrap(), 3);
    assert_eq!(cl.write(3, b"Hello World!").unwrap(), 12);
    cl.close_fd(3).unwrap();
    assert_eq!(cl.open(f, OREAD, O_NOW).unwrap(), 4);
    assert_eq!(cl.read(4, 64).unwrap(), b"Hello World!");
    cl.seek(4, 6).unwrap();
    assert_eq!(cl.pread(4, 64, 6).unwrap(), b"World!");
    cl.close_fd(4).unwrap();
    assert_eq!(cl.get_file(f).unwrap(), b"Hello World!");
    assert_eq!(
        cl.put_file(
            "name/ux/~local/g",
            0o777,
            OWRITE,
            b"Hello World!",
            0,
            NO_LEASE_ID
        )
        .unwrap(),
        12
    );
    cl.rename("name/ux/~local/g", "name/ux/~local/h").unwrap();
    cl.remove("name/ux/~local/h").unwrap();
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
    let (m, q) = api::dir_watch(7);
    let r: SigmaFdRep = cl.call(m, q).unwrap();
    assert_eq!(r.fd, 5);
    cl.exited(STATUS_OK, "bye").unwrap();
    peer.join().unwrap();
}

#[test]
fn init_failure_is_a_sigma_error() {
    let (c, mut s) = UnixStream::pair().unwrap();
    let peer = thread::spawn(move || {
        let m = frame::read_message(&mut s, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            frame::encode(m.seqno, &m.frames),
            vec_file("90_init_fail_req.bin")
        );
        s.write_all(&vec_file("90_init_fail_rep.bin")).unwrap();
    });
    let pe =
        procenv::from_json(std::str::from_utf8(&vec_file("sigmaconfig_example.json")).unwrap())
            .unwrap();
    let err = Client::from_stream(c, Some(pe))
        .err()
        .expect("Init must fail");
    assert_eq!(err.code(), Some(ECODE_ERROR));
    assert!(err.to_string().contains("named unreachable"), "{err}");
    peer.join().unwrap();
}

/// Eight threads call at once; the peer collects all eight requests and answers them in
/// reverse order. Every thread must get the reply carrying its own path.
#[test]
fn pipelined_calls_from_threads_are_matched_by_seqno() {
    let (c, mut s) = UnixStream::pair().unwrap();
    let cl = Arc::new(Client::new_uninit(c).unwrap());
    const N: usize = 8;
    let peer = thread::spawn(move || {
        let mut reqs = Vec::new();
        for _ in 0..N {
            let m = frame::read_message(&mut s, &Limits::default())
                .unwrap()
                .unwrap();
            let mut req = rpc::Request::from_message(m.clone()).unwrap();
            assert_eq!(req.method, api::GET_FILE);
            let p: SigmaPathReq = req.decode().unwrap();
            reqs.push((m.seqno, p.path));
        }
        let mut seqnos: Vec<u64> = reqs.iter().map(|r| r.0).collect();
        seqnos.sort();
        assert_eq!(seqnos, (1..=N as u64).collect::<Vec<_>>());
        for (seqno, path) in reqs.into_iter().rev() {
            let rep = SigmaDataRep {
                blob: Some(Blob {
                    iov: vec![path.into_bytes()],
                    split_iov: vec![],
                }),
                err: Some(Rerror::default()),
            };
            frame::write_message(&mut s, seqno, &rpc::reply_frames(rep)).unwrap();
        }
    });
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let cl = cl.clone();
            thread::spawn(move || {
                let p = format!("name/ux/~local/file-{i}");
                assert_eq!(cl.get_file(&p).unwrap(), p.as_bytes());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    peer.join().unwrap();
}

/// The peer reads the requests and closes: every waiting thread gets an Io error promptly,
/// and later calls fail at once.
#[test]
fn peer_closing_mid_call_fails_every_waiter() {
    let (c, mut s) = UnixStream::pair().unwrap();
    let cl = Arc::new(Client::new_uninit(c).unwrap());
    let peer = thread::spawn(move || {
        for _ in 0..4 {
            frame::read_message(&mut s, &Limits::default())
                .unwrap()
                .unwrap();
        }
        drop(s);
    });
    let t0 = Instant::now();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let cl = cl.clone();
            thread::spawn(move || cl.stat("name/ux/~local/x").unwrap_err())
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap();
        assert!(matches!(e, Error::Io(_)), "{e}");
    }
    assert!(t0.elapsed() < Duration::from_secs(30));
    peer.join().unwrap();
    assert!(matches!(cl.started().unwrap_err(), Error::Io(_)));
}

/// A peer sending a malformed frame (length < 4) is a protocol error, not a panic.
#[test]
fn malformed_reply_is_a_protocol_error() {
    let (c, mut s) = UnixStream::pair().unwrap();
    let cl = Client::new_uninit(c).unwrap();
    let peer = thread::spawn(move || {
        let m = frame::read_message(&mut s, &Limits::default())
            .unwrap()
            .unwrap();
        let mut bad = m.seqno.to_le_bytes().to_vec();
        bad.extend_from_slice(&1u32.to_le_bytes());
        bad.extend_from_slice(&2u32.to_le_bytes());
        s.write_all(&bad).unwrap();
        s
    });
    let e = cl.started().unwrap_err();
    assert!(matches!(e, Error::Protocol(_)), "{e}");
    drop(peer.join().unwrap());
}
