//! The RPC envelope on top of the framing (rpc/clnt/clnt.go `WrapRPCRequest`, rpc/srv/rpcsrv.go).
//!
//! Request: `[Req{method}, msg (blob iov cleared, empty Blob kept), blob iov frames...]`.
//! Reply: `[Rep{err}, msg (blob cleared), blob iov frames...]`, or one frame `[Rep{err≠0}]`
//! for an RPC-level error.

use prost::Message;

use crate::error::Error;
use crate::frame;
use crate::proto::{self, Blob, Rep, Req, Rerror};

/// A message that may travel through the envelope. Messages holding a `Blob` expose it,
/// so its iov travels as frames instead of inline.
pub trait RpcMessage: Message + Default {
    /// The message's Blob field, for messages that have one.
    fn blob_field(&mut self) -> Option<&mut Option<Blob>> {
        None
    }
}

macro_rules! no_blob {
    ($($t:ty),*) => { $(impl RpcMessage for $t {})* };
}
no_blob!(
    proto::SigmaInitReq,
    proto::SigmaNullReq,
    proto::SigmaPathReq,
    proto::SigmaCloseReq,
    proto::SigmaCreateReq,
    proto::SigmaRenameReq,
    proto::SigmaReadReq,
    proto::SigmaSeekReq,
    proto::SigmaExitedReq,
    proto::SigmaErrRep,
    proto::SigmaStatRep,
    proto::SigmaFdRep,
    proto::SigmaSizeRep,
    proto::SigmaClntIdRep
);

macro_rules! with_blob {
    ($($t:ty),*) => { $(impl RpcMessage for $t {
        fn blob_field(&mut self) -> Option<&mut Option<Blob>> { Some(&mut self.blob) }
    })* };
}
with_blob!(
    proto::SigmaWriteReq,
    proto::SigmaPutFileReq,
    proto::SigmaDataRep
);

/// Removes the blob's data from `msg`, leaving an empty Blob where one was, and returns
/// the data as frames (iov entries, then splitIov entries).
fn take_blob<M: RpcMessage>(msg: &mut M) -> Vec<Vec<u8>> {
    let Some(field) = msg.blob_field() else {
        return Vec::new();
    };
    let Some(blob) = field.as_mut() else {
        return Vec::new();
    };
    let mut frames = std::mem::take(&mut blob.iov);
    for s in std::mem::take(&mut blob.split_iov) {
        frames.extend(s.iov);
    }
    frames
}

/// The frames of a request: `Req`, the message with its blob cleared, the blob's data.
pub fn request_frames<M: RpcMessage>(method: &str, mut msg: M) -> Vec<Vec<u8>> {
    let blob = take_blob(&mut msg);
    let mut frames = Vec::with_capacity(2 + blob.len());
    frames.push(
        Req {
            method: method.to_owned(),
        }
        .encode_to_vec(),
    );
    frames.push(msg.encode_to_vec());
    frames.extend(blob);
    frames
}

/// The bytes of a request whose blob data the caller still holds: `msg` must carry an
/// empty Blob (as after clearing) and `blob` is sent as the trailing frames, uncopied
/// until the one output buffer is built.
pub fn encode_request_with_blob<M: RpcMessage>(
    seqno: u64,
    method: &str,
    msg: &M,
    blob: &[&[u8]],
) -> Vec<u8> {
    let req = Req {
        method: method.to_owned(),
    }
    .encode_to_vec();
    let body = msg.encode_to_vec();
    let mut frames: Vec<&[u8]> = Vec::with_capacity(2 + blob.len());
    frames.push(&req);
    frames.push(&body);
    frames.extend_from_slice(blob);
    frame::encode(seqno, &frames)
}

/// The bytes of a whole request message.
pub fn encode_request<M: RpcMessage>(seqno: u64, method: &str, msg: M) -> Vec<u8> {
    frame::encode(seqno, &request_frames(method, msg))
}

/// The frames of a successful reply: `Rep{err: {}}`, the message with its blob cleared,
/// the blob's data.
pub fn reply_frames<M: RpcMessage>(mut msg: M) -> Vec<Vec<u8>> {
    let blob = take_blob(&mut msg);
    let mut frames = Vec::with_capacity(2 + blob.len());
    frames.push(
        Rep {
            err: Some(Rerror::default()),
        }
        .encode_to_vec(),
    );
    frames.push(msg.encode_to_vec());
    frames.extend(blob);
    frames
}

/// The single frame of an RPC-level error reply.
pub fn rpc_error_frames(err: Rerror) -> Vec<Vec<u8>> {
    vec![Rep { err: Some(err) }.encode_to_vec()]
}

/// Decodes a reply's frames into `M`, moving trailing frames into its Blob.
/// An RPC-level error (`Rep.err.errCode != 0`) becomes `Error::Sigma`.
pub fn decode_reply<M: RpcMessage>(frames: Vec<Vec<u8>>) -> Result<M, Error> {
    let mut it = frames.into_iter();
    let rep = it
        .next()
        .ok_or_else(|| Error::Protocol("reply has no frames".into()))?;
    let rep = Rep::decode(rep.as_slice())
        .map_err(|e| Error::Protocol(format!("decoding rpc.Rep: {e}")))?;
    Error::check(rep.err)?;
    let body = it.next().ok_or_else(|| {
        Error::Protocol("reply has 1 frame but no RPC-level error in rpc.Rep".into())
    })?;
    let mut msg = M::decode(body.as_slice()).map_err(|e| {
        Error::Protocol(format!(
            "decoding {}: {e}",
            std::any::type_name::<M>()
                .rsplit("::")
                .next()
                .unwrap_or("reply")
        ))
    })?;
    let rest: Vec<Vec<u8>> = it.collect();
    if !rest.is_empty() {
        match msg.blob_field() {
            Some(field) => field.get_or_insert_with(Blob::default).iov = rest,
            None => {
                return Err(Error::Protocol(format!(
                    "reply carries {} blob frame(s) but its message has no Blob",
                    rest.len()
                )))
            }
        }
    }
    Ok(msg)
}

/// A request as a server sees it.
#[derive(Debug)]
pub struct Request {
    pub seqno: u64,
    pub method: String,
    /// The marshaled request message (frame 1); empty if the request had only one frame.
    pub body: Vec<u8>,
    /// Blob frames (frame 2 and later).
    pub blob: Vec<Vec<u8>>,
}

impl Request {
    /// Splits a framed message into method, body and blob frames.
    pub fn from_message(m: frame::Message) -> Result<Request, Error> {
        let mut it = m.frames.into_iter();
        let req = it
            .next()
            .ok_or_else(|| Error::Protocol(format!("request {} has no frames", m.seqno)))?;
        let req = Req::decode(req.as_slice())
            .map_err(|e| Error::Protocol(format!("decoding rpc.Req: {e}")))?;
        let body = it.next().unwrap_or_default();
        Ok(Request {
            seqno: m.seqno,
            method: req.method,
            body,
            blob: it.collect(),
        })
    }

    /// Decodes the body as `M`, moving the blob frames into its Blob (if it has one).
    pub fn decode<M: RpcMessage>(&mut self) -> Result<M, prost::DecodeError> {
        let mut msg = M::decode(self.body.as_slice())?;
        if !self.blob.is_empty() {
            if let Some(field) = msg.blob_field() {
                field.get_or_insert_with(Blob::default).iov = std::mem::take(&mut self.blob);
            }
        }
        Ok(msg)
    }
}
