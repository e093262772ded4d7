//! Every request and reply decoder on one framed message: the server's path (envelope, then
//! each request type with blob frames moved in) and the client's (each reply type).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spproxy::frame::{self, Limits};
use spproxy::proto::*;
use spproxy::rpc::{self, Request};

fn requests(m: &frame::Message) {
    let Ok(req) = Request::from_message(m.clone()) else {
        return;
    };
    macro_rules! each {
        ($($t:ty),*) => {$(
            let mut r = Request { seqno: req.seqno, method: req.method.clone(), body: req.body.clone(), blob: req.blob.clone() };
            let _ = r.decode::<$t>();
        )*};
    }
    each!(
        SigmaInitReq,
        SigmaNullReq,
        SigmaPathReq,
        SigmaCloseReq,
        SigmaCreateReq,
        SigmaRenameReq,
        SigmaReadReq,
        SigmaWriteReq,
        SigmaSeekReq,
        SigmaPutFileReq,
        SigmaExitedReq
    );
}

fn replies(m: &frame::Message) {
    macro_rules! each {
        ($($t:ty),*) => {$( let _ = rpc::decode_reply::<$t>(m.frames.clone()); )*};
    }
    each!(
        SigmaErrRep,
        SigmaStatRep,
        SigmaFdRep,
        SigmaSizeRep,
        SigmaDataRep,
        SigmaClntIdRep
    );
}

fuzz_target!(|data: &[u8]| {
    let lim = Limits {
        max_frames: 64,
        max_frame_len: 1 << 16,
        max_message_len: 1 << 18,
    };
    if let Ok(Some(m)) = frame::read_message(&mut &data[..], &lim) {
        requests(&m);
        replies(&m);
        for f in &m.frames {
            let _ = spproxy::dirent::decode_dir(f);
            let _ = spproxy::dirent::decode_watch(f);
        }
    }
});
