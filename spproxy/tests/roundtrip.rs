//! Property tests: every encoding round-trips, and the decoders and the realm path resolver
//! never panic on arbitrary input.

use proptest::prelude::*;
use spproxy::frame::{self, Limits};
use spproxy::proto::*;
use spproxy::rpc::{self, Request};
use spproxy::server::paths::{self, Target};
use spproxy::{api, dirent};

proptest! {
    #[test]
    fn frames_round_trip(seqno: u64, frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let buf = frame::encode(seqno, &frames);
        prop_assert_eq!(buf.len(), frame::encoded_len(&frames));
        let m = frame::read_message(&mut buf.as_slice(), &Limits::default()).unwrap().unwrap();
        prop_assert_eq!(m.seqno, seqno);
        prop_assert_eq!(m.frames, frames);
    }

    #[test]
    fn frame_reader_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let lim = Limits { max_frames: 16, max_frame_len: 1 << 16, max_message_len: 1 << 17 };
        let mut r = bytes.as_slice();
        while let Ok(Some(_)) = frame::read_message(&mut r, &lim) {}
    }

    #[test]
    fn write_request_round_trips(seqno: u64, fd: u32, data in prop::collection::vec(any::<u8>(), 0..512)) {
        let (m, q) = api::write(fd, &data);
        let bytes = rpc::encode_request(seqno, m, q);
        let msg = frame::read_message(&mut bytes.as_slice(), &Limits::default()).unwrap().unwrap();
        let mut req = Request::from_message(msg).unwrap();
        prop_assert_eq!(req.seqno, seqno);
        prop_assert_eq!(req.method.as_str(), api::WRITE);
        let back: SigmaWriteReq = req.decode().unwrap();
        prop_assert_eq!(back.fd, fd);
        prop_assert_eq!(back.blob.unwrap().iov, vec![data]);
    }

    #[test]
    fn put_file_request_round_trips(path in "[a-z/~.]{0,40}", perm: u32, mode: u32, offset: u64, data in prop::collection::vec(any::<u8>(), 0..256)) {
        let (m, q) = api::put_file(&path, perm, mode, &data, offset, u64::MAX);
        let msg = frame::Message { seqno: 1, frames: rpc::request_frames(m, q) };
        let mut req = Request::from_message(msg).unwrap();
        let back: SigmaPutFileReq = req.decode().unwrap();
        prop_assert_eq!((back.path, back.perm, back.mode, back.offset), (path, perm, mode, offset));
        prop_assert_eq!(back.blob.unwrap().iov, vec![data]);
    }

    #[test]
    fn data_reply_round_trips(data in prop::collection::vec(any::<u8>(), 0..512), code in 0u32..36) {
        let rep = SigmaDataRep {
            blob: Some(Blob { iov: vec![data.clone()], split_iov: vec![] }),
            err: Some(Rerror { err_code: code, obj: "o".into(), err: String::new() }),
        };
        let back: SigmaDataRep = rpc::decode_reply(rpc::reply_frames(rep)).unwrap();
        prop_assert_eq!(back.blob.unwrap().iov, vec![data]);
        prop_assert_eq!(back.err.unwrap().err_code, code);
    }

    #[test]
    fn dir_entries_round_trip(names in prop::collection::vec("[a-zA-Z0-9._-]{1,20}", 0..20), len: u64) {
        let ents: Vec<TstatProto> = names.iter().map(|n| TstatProto { name: n.clone(), length: len, ..Default::default() }).collect();
        let enc = dirent::encode_dir(&ents);
        prop_assert_eq!(dirent::decode_dir(&enc).unwrap(), ents);
        // Paging returns whole entries that concatenate back to the listing.
        let mut off = 0u64;
        let mut all = Vec::new();
        loop {
            let part = dirent::dir_slice(&enc, off, 64);
            if part.is_empty() { break; }
            all.extend_from_slice(part);
            off += part.len() as u64;
        }
        // (Each entry here is shorter than a page.)
        prop_assert_eq!(all, enc);
    }

    #[test]
    fn decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = dirent::decode_dir(&bytes);
        let _ = dirent::decode_watch(&bytes);
        let _ = rpc::decode_reply::<SigmaStatRep>(vec![bytes.clone(), bytes.clone()]);
        let msg = frame::Message { seqno: 1, frames: vec![bytes.clone(), bytes] };
        if let Ok(mut req) = Request::from_message(msg) {
            let _ = req.decode::<SigmaCreateReq>();
            let _ = req.decode::<SigmaInitReq>();
        }
    }

    #[test]
    fn realm_paths_stay_in_the_realm(path in "(name/(ux|s3)/~local/)?[a-z./\u{0}]{0,30}") {
        match paths::parse(&path) {
            Ok(Target::Ux(rel)) => {
                prop_assert!(!rel.starts_with('/'));
                prop_assert!(!rel.split('/').any(|c| c == ".."));
                prop_assert!(!rel.contains('\0'));
            }
            Ok(Target::S3 { bucket, key }) => {
                prop_assert!(!bucket.is_empty() && !bucket.contains('/'));
                prop_assert!(!key.split('/').any(|c| c == ".."));
                prop_assert!(!key.contains('\0'));
            }
            Err(_) => {}
        }
    }
}
