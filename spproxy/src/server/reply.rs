//! σOS errors and reply frames: one place turns a result into what the Go client expects.
//! A leaf: every server module may use it, and it imports none of them.

use std::io;

use nix::errno::Errno;

use crate::consts::*;
use crate::proto::*;
use crate::rpc::{self, RpcMessage};
use crate::store::StoreError;

/// The last component of a path (σOS reports it as the error's object).
pub fn last(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

pub fn rerr(code: u32, obj: &str, msg: &str) -> Rerror {
    Rerror {
        err_code: code,
        obj: obj.to_owned(),
        err: msg.to_owned(),
    }
}

pub fn unknown_fd(fd: u32) -> Rerror {
    rerr(ECODE_UNKNOWNFID, &fd.to_string(), "")
}

/// σOS's error for a full device: its ux server wraps ENOSPC as a plain Go error (code
/// `Error`, serr.go `UxErrnoToErr`).
pub fn no_space(obj: &str) -> Rerror {
    rerr(ECODE_ERROR, obj, "no space left on device")
}

/// An offset or length whose arithmetic overflows.
pub fn bad_offset(obj: &str) -> Rerror {
    rerr(ECODE_BADOFFSET, obj, "offset out of range")
}

/// The σOS code for an errno.
pub fn errno_code(e: Errno) -> u32 {
    match e {
        Errno::ENOENT => ECODE_NOTFOUND,
        Errno::EEXIST => ECODE_EXISTS,
        Errno::EACCES | Errno::EPERM | Errno::EXDEV | Errno::EROFS | Errno::ELOOP => ECODE_PERM,
        Errno::EISDIR => ECODE_ISDIR,
        Errno::ENOTDIR => ECODE_NOTDIR,
        Errno::ENOTEMPTY => ECODE_NOTEMPTY,
        Errno::EBADF => ECODE_UNKNOWNFID,
        Errno::EINVAL | Errno::ENAMETOOLONG => ECODE_INVAL,
        Errno::ENOMEM => ECODE_NOMEM,
        Errno::EOPNOTSUPP => ECODE_NOTSUPPORTED,
        Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => ECODE_ERROR,
        _ => ECODE_IO,
    }
}

pub fn errno_rerr(e: Errno, path: &str) -> Rerror {
    let code = errno_code(e);
    let obj = if code == ECODE_PERM { path } else { last(path) };
    let msg = match e {
        Errno::EXDEV => "path leaves the realm".to_owned(),
        Errno::ELOOP => "symbolic links in the realm are not followed".to_owned(),
        Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => "no space left on device".to_owned(),
        _ => e.desc().to_owned(),
    };
    rerr(code, obj, &msg)
}

pub fn io_rerr(e: &io::Error, path: &str) -> Rerror {
    match e.raw_os_error() {
        Some(n) => errno_rerr(Errno::from_raw(n), path),
        None => rerr(ECODE_IO, last(path), &e.to_string()),
    }
}

pub fn store_rerr(e: StoreError, path: &str) -> Rerror {
    match e {
        StoreError::NotFound { .. } => rerr(ECODE_NOTFOUND, last(path), ""),
        StoreError::PermissionDenied { .. } => rerr(ECODE_PERM, path, &e.to_string()),
        StoreError::InvalidKey { .. } => rerr(ECODE_PERM, path, &e.to_string()),
        StoreError::Unavailable { .. } => rerr(ECODE_UNREACHABLE, path, &e.to_string()),
    }
}

pub type Frames = Vec<Vec<u8>>;

pub fn ok<M: RpcMessage>(m: M) -> Frames {
    rpc::reply_frames(m)
}

pub fn rpc_err(code: u32, obj: &str, msg: &str) -> Frames {
    rpc::rpc_error_frames(rerr(code, obj, msg))
}

pub fn fd_rep(r: Result<u32, Rerror>) -> Frames {
    ok(match r {
        Ok(fd) => SigmaFdRep {
            fd,
            err: Some(Rerror::default()),
        },
        Err(e) => SigmaFdRep {
            fd: NO_FD,
            err: Some(e),
        },
    })
}

pub fn size_rep(r: Result<u64, Rerror>) -> Frames {
    ok(match r {
        Ok(size) => SigmaSizeRep {
            size,
            err: Some(Rerror::default()),
        },
        Err(e) => SigmaSizeRep {
            size: 0,
            err: Some(e),
        },
    })
}

/// Every `SigmaErrRep` carries an `err`, empty on success: σOS's Go stubs dereference it.
pub fn err_rep(r: Result<(), Rerror>) -> Frames {
    ok(SigmaErrRep {
        err: Some(r.err().unwrap_or_default()),
    })
}

/// On error σOS still sends the (empty) data frame.
pub fn data_rep(r: Result<Vec<u8>, Rerror>) -> Frames {
    let (data, err) = match r {
        Ok(d) => (d, Rerror::default()),
        Err(e) => (Vec::new(), e),
    };
    ok(SigmaDataRep {
        blob: Some(Blob {
            iov: vec![data],
            split_iov: vec![],
        }),
        err: Some(err),
    })
}

/// A σOS call the embedded realm cannot honour: a well-formed reply of the call's own reply
/// type whose `err` (field `err_field`) says NotSupported, followed by `blob_frames` empty
/// frames when the caller pre-sized its reply iovec. Never the 1-frame RPC error, which
/// σOS's Go transport treats as fatal.
pub fn not_supported(method: &str, err_field: u32, blob_frames: usize) -> Frames {
    use prost::Message;
    let e = rerr(
        ECODE_NOTSUPPORTED,
        method,
        "not supported by the embedded realm server",
    );
    let mut body = Vec::new();
    prost::encoding::message::encode(err_field, &e, &mut body);
    let mut frames = vec![
        Rep {
            err: Some(Rerror::default()),
        }
        .encode_to_vec(),
        body,
    ];
    frames.extend(std::iter::repeat_n(Vec::new(), blob_frames));
    frames
}
