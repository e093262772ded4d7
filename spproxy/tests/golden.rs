//! Golden vectors produced by σOS's own Go code: our encoder must reproduce every request
//! byte for byte, and our decoder must read every reply.

use std::path::PathBuf;

use prost::Message;
use spproxy::consts::*;
use spproxy::proto::*;
use spproxy::{api, frame, procenv, rpc, Error};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/sigmaos-wire/vectors")
}

fn read(name: &str) -> Vec<u8> {
    let p = vectors().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading golden vector {}: {e}", p.display()))
}

fn manifest() -> serde_json::Value {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json parses")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn example_procenv() -> ProcEnvProto {
    let json = String::from_utf8(read("sigmaconfig_example.json")).unwrap();
    procenv::from_json(&json).expect("SIGMACONFIG example parses")
}

/// The request each `*_req.bin` holds, built from hand-written values through the same
/// builders the client uses. Returns (seqno, bytes).
fn build_request(file: &str) -> Vec<u8> {
    let hello = b"Hello World!";
    let f = "name/ux/~local/f";
    macro_rules! enc {
        ($seq:expr, $call:expr) => {{
            let (m, r) = $call;
            rpc::encode_request($seq, m, r)
        }};
    }
    match file {
        "01_init_req.bin" => enc!(1, api::init(example_procenv())),
        "02_started_req.bin" => enc!(2, api::started()),
        "03_clntid_req.bin" => enc!(3, api::clnt_id()),
        "04_stat_req.bin" => enc!(4, api::stat(f)),
        "05_create_req.bin" => enc!(5, api::create(f, 0o777, OWRITE)),
        "06_write_req.bin" => enc!(6, api::write(3, hello)),
        "07_closefd_req.bin" => enc!(7, api::close_fd(3)),
        "08_open_req.bin" => enc!(8, api::open(f, OREAD, O_NOW)),
        "09_read_req.bin" => enc!(9, api::read(4, 64)),
        "10_seek_req.bin" => enc!(10, api::seek(4, 6)),
        "11_pread_req.bin" => enc!(11, api::pread(4, 64, 6)),
        "12_closefd2_req.bin" => enc!(12, api::close_fd(4)),
        "13_getfile_req.bin" => enc!(13, api::get_file(f)),
        "14_putfile_req.bin" => enc!(
            14,
            api::put_file("name/ux/~local/g", 0o777, OWRITE, hello, 0, NO_LEASE_ID)
        ),
        "15_rename_req.bin" => enc!(15, api::rename("name/ux/~local/g", "name/ux/~local/h")),
        "16_remove_req.bin" => enc!(16, api::remove("name/ux/~local/h")),
        "17_open_notfound_req.bin" => enc!(17, api::open("name/ux/~local/missing", OREAD, O_NOW)),
        "18_dirwatch_req.bin" => enc!(18, api::dir_watch(7)),
        "19_exited_req.bin" => enc!(19, api::exited(STATUS_OK, "bye")),
        "90_init_fail_req.bin" => enc!(1, api::init(example_procenv())),
        "91_unknown_method_req.bin" => {
            rpc::encode_request(2, "SPProxySrvAPI.NoSuchMethod", SigmaNullReq {})
        }
        other => panic!("no hand-written request for golden vector {other}"),
    }
}

fn all_files(suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vectors())
        .expect("vectors dir")
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

#[test]
fn framing_matches_manifest() {
    let m = manifest();
    let vs = m["vectors"].as_array().unwrap();
    assert_eq!(vs.len(), 42);
    for v in vs {
        let file = v["file"].as_str().unwrap();
        let bytes = read(file);
        assert_eq!(
            bytes.len() as u64,
            v["total_len"].as_u64().unwrap(),
            "{file}"
        );
        let msg = frame::read_message(&mut bytes.as_slice(), &frame::Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(msg.seqno, v["seqno"].as_u64().unwrap(), "{file}");
        let frames = v["frames"].as_array().unwrap();
        assert_eq!(msg.frames.len(), frames.len(), "{file}");
        for (got, want) in msg.frames.iter().zip(frames) {
            assert_eq!(*got, unhex(want["hex"].as_str().unwrap()), "{file}");
        }
        // And the frame encoder gives back the same bytes.
        assert_eq!(frame::encode(msg.seqno, &msg.frames), bytes, "{file}");
    }
}

#[test]
fn every_request_is_reproduced_exactly() {
    let files = all_files("_req.bin");
    assert_eq!(files.len(), 21);
    for file in files {
        let want = read(&file);
        let got = build_request(&file);
        assert_eq!(got, want, "request {file} differs from σOS's encoding");
    }
}

#[test]
fn sigmaconfig_json_gives_the_example_procenv_bytes() {
    let pe = example_procenv();
    assert_eq!(pe.pid_str, "pyproc-1");
    assert_eq!(pe.principal.as_ref().unwrap().realm_str, "rootrealm");
    assert_eq!(pe.cached_endpoints["named"].addr[0].port_int, 1111);
    assert_eq!(
        pe.spawn_time_pb,
        Some(Timestamp {
            seconds: 1_700_000_000,
            nanos: 123_000_000
        })
    );
    assert_eq!(pe.encode_to_vec(), read("procenvproto_example.pb"));
    // Decoding the .pb and re-encoding keeps every byte (all its fields are known).
    let decoded = ProcEnvProto::decode(read("procenvproto_example.pb").as_slice()).unwrap();
    assert_eq!(decoded, pe);
    assert_eq!(decoded.encode_to_vec(), read("procenvproto_example.pb"));
    // Serializing back to JSON gives Go's encoding/json text.
    let json = String::from_utf8(read("sigmaconfig_example.json")).unwrap();
    assert_eq!(procenv::to_json(&pe), json.trim_end());
}

#[test]
fn sigmaconfig_rejects_garbage_in_one_line() {
    let err = procenv::from_json("{\"pidStr\": 5}").unwrap_err();
    let line = err.to_string();
    assert!(
        line.starts_with("SIGMACONFIG is not a valid ProcEnv JSON"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}

fn frames_of(file: &str) -> Vec<Vec<u8>> {
    let bytes = read(file);
    frame::read_message(&mut bytes.as_slice(), &frame::Limits::default())
        .unwrap()
        .unwrap()
        .frames
}

fn ok_err() -> Option<Rerror> {
    Some(Rerror::default())
}

#[test]
fn every_reply_decodes() {
    let files = all_files("_rep.bin");
    assert_eq!(files.len(), 21);
    let hello = b"Hello World!".to_vec();
    for file in &files {
        let fr = frames_of(file);
        match file.as_str() {
            "01_init_rep.bin"
            | "02_started_rep.bin"
            | "07_closefd_rep.bin"
            | "10_seek_rep.bin"
            | "12_closefd2_rep.bin"
            | "15_rename_rep.bin"
            | "16_remove_rep.bin" => {
                let r: SigmaErrRep = rpc::decode_reply(fr).unwrap();
                assert_eq!(r.err, ok_err(), "{file}");
            }
            "19_exited_rep.bin" => {
                let r: SigmaErrRep = rpc::decode_reply(fr).unwrap();
                assert_eq!(r.err, None, "Exited's reply is empty");
                Error::check(r.err).unwrap();
            }
            "03_clntid_rep.bin" => {
                let r: SigmaClntIdRep = rpc::decode_reply(fr).unwrap();
                assert_eq!(r.clnt_id, 32_075_810_494_824);
            }
            "04_stat_rep.bin" => {
                let r: SigmaStatRep = rpc::decode_reply(fr).unwrap();
                let st = r.stat.unwrap();
                assert_eq!(
                    st.qid,
                    Some(TqidProto {
                        r#type: 0,
                        version: 3,
                        path: 42
                    })
                );
                assert_eq!(
                    (st.mode, st.atime, st.mtime),
                    (511, 1_700_000_001, 1_700_000_000)
                );
                assert_eq!((st.length, st.name.as_str()), (12, "f"));
                assert_eq!((st.uid.as_str(), st.gid.as_str()), ("pyproc-1", "pyproc-1"));
            }
            "05_create_rep.bin" | "08_open_rep.bin" | "18_dirwatch_rep.bin" => {
                let r: SigmaFdRep = rpc::decode_reply(fr).unwrap();
                let want = match file.as_str() {
                    "05_create_rep.bin" => 3,
                    "08_open_rep.bin" => 4,
                    _ => 5,
                };
                assert_eq!((r.fd, r.err), (want, ok_err()), "{file}");
            }
            "06_write_rep.bin" | "14_putfile_rep.bin" => {
                let r: SigmaSizeRep = rpc::decode_reply(fr).unwrap();
                assert_eq!((r.size, r.err), (12, ok_err()), "{file}");
            }
            "09_read_rep.bin" | "11_pread_rep.bin" | "13_getfile_rep.bin" => {
                let r: SigmaDataRep = rpc::decode_reply(fr).unwrap();
                let want = if file == "11_pread_rep.bin" {
                    b"World!".to_vec()
                } else {
                    hello.clone()
                };
                assert_eq!(r.blob.unwrap().iov, vec![want], "{file}");
                assert_eq!(r.err, ok_err());
            }
            "17_open_notfound_rep.bin" => {
                let r: SigmaFdRep = rpc::decode_reply(fr).unwrap();
                assert_eq!(r.fd, NO_FD);
                match Error::check(r.err).unwrap_err() {
                    Error::Sigma {
                        code,
                        name,
                        obj,
                        msg,
                    } => {
                        assert_eq!(
                            (code, name, obj.as_str(), msg.as_str()),
                            (ECODE_NOTFOUND, "Notfound", "missing", "")
                        );
                    }
                    e => panic!("{e}"),
                }
            }
            "90_init_fail_rep.bin" => {
                assert_eq!(fr.len(), 1);
                match rpc::decode_reply::<SigmaErrRep>(fr).unwrap_err() {
                    Error::Sigma {
                        code,
                        name,
                        obj,
                        msg,
                    } => {
                        assert_eq!((code, name, obj.as_str()), (ECODE_ERROR, "Error", ""));
                        assert_eq!(msg, "Error init SPProxySrvAPI: named unreachable");
                    }
                    e => panic!("{e}"),
                }
            }
            "91_unknown_method_rep.bin" => {
                assert_eq!(fr.len(), 1);
                match rpc::decode_reply::<SigmaErrRep>(fr).unwrap_err() {
                    Error::Sigma { code, obj, .. } => {
                        assert_eq!(
                            (code, obj.as_str()),
                            (ECODE_NOTFOUND, "SPProxySrvAPI.NoSuchMethod")
                        );
                    }
                    e => panic!("{e}"),
                }
            }
            other => panic!("no expectation for golden vector {other}"),
        }
    }
}

/// The server-side encoders (used by the embedded server) reproduce σOS's replies.
#[test]
fn server_reply_encoding_matches() {
    let enc = |seq: u64, frames: Vec<Vec<u8>>| frame::encode(seq, &frames);
    let hello = b"Hello World!".to_vec();
    let data = |d: Vec<u8>| SigmaDataRep {
        blob: Some(Blob {
            iov: vec![d],
            split_iov: vec![],
        }),
        err: ok_err(),
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "01_init_rep.bin",
            enc(1, rpc::reply_frames(SigmaErrRep { err: ok_err() })),
        ),
        (
            "03_clntid_rep.bin",
            enc(
                3,
                rpc::reply_frames(SigmaClntIdRep {
                    clnt_id: 32_075_810_494_824,
                    err: ok_err(),
                }),
            ),
        ),
        (
            "05_create_rep.bin",
            enc(
                5,
                rpc::reply_frames(SigmaFdRep {
                    fd: 3,
                    err: ok_err(),
                }),
            ),
        ),
        (
            "06_write_rep.bin",
            enc(
                6,
                rpc::reply_frames(SigmaSizeRep {
                    size: 12,
                    err: ok_err(),
                }),
            ),
        ),
        (
            "09_read_rep.bin",
            enc(9, rpc::reply_frames(data(hello.clone()))),
        ),
        (
            "11_pread_rep.bin",
            enc(11, rpc::reply_frames(data(b"World!".to_vec()))),
        ),
        (
            "17_open_notfound_rep.bin",
            enc(
                17,
                rpc::reply_frames(SigmaFdRep {
                    fd: NO_FD,
                    err: Some(Rerror {
                        err_code: ECODE_NOTFOUND,
                        obj: "missing".into(),
                        err: String::new(),
                    }),
                }),
            ),
        ),
        (
            "19_exited_rep.bin",
            enc(19, rpc::reply_frames(SigmaErrRep { err: None })),
        ),
        (
            "90_init_fail_rep.bin",
            enc(
                1,
                rpc::rpc_error_frames(Rerror {
                    err_code: ECODE_ERROR,
                    obj: String::new(),
                    err: "Error init SPProxySrvAPI: named unreachable".into(),
                }),
            ),
        ),
        (
            "91_unknown_method_rep.bin",
            enc(
                2,
                rpc::rpc_error_frames(Rerror {
                    err_code: ECODE_NOTFOUND,
                    obj: "SPProxySrvAPI.NoSuchMethod".into(),
                    err: String::new(),
                }),
            ),
        ),
    ];
    for (file, got) in cases {
        assert_eq!(got, read(file), "{file}");
    }
}

/// The server-side request decoder reads every request back into the values sent.
#[test]
fn server_request_decoding() {
    let bytes = read("06_write_req.bin");
    let m = frame::read_message(&mut bytes.as_slice(), &frame::Limits::default())
        .unwrap()
        .unwrap();
    let mut req = rpc::Request::from_message(m).unwrap();
    assert_eq!(req.method, "SPProxySrvAPI.Write");
    let w: SigmaWriteReq = req.decode().unwrap();
    assert_eq!(w.fd, 3);
    assert_eq!(w.blob.unwrap().iov, vec![b"Hello World!".to_vec()]);

    let bytes = read("14_putfile_req.bin");
    let m = frame::read_message(&mut bytes.as_slice(), &frame::Limits::default())
        .unwrap()
        .unwrap();
    let mut req = rpc::Request::from_message(m).unwrap();
    let p: SigmaPutFileReq = req.decode().unwrap();
    assert_eq!(
        (p.path.as_str(), p.perm, p.mode, p.offset, p.lease_id),
        ("name/ux/~local/g", 0o777, OWRITE, 0, NO_LEASE_ID)
    );
    assert_eq!(p.blob.unwrap().iov, vec![b"Hello World!".to_vec()]);

    let bytes = read("01_init_req.bin");
    let m = frame::read_message(&mut bytes.as_slice(), &frame::Limits::default())
        .unwrap()
        .unwrap();
    let mut req = rpc::Request::from_message(m).unwrap();
    let i: SigmaInitReq = req.decode().unwrap();
    assert_eq!(i.proc_env_proto.unwrap(), example_procenv());
}
