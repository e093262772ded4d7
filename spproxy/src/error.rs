//! The client-facing error type.

use crate::consts::ecode_name;
use crate::proto::Rerror;

#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A σOS error: an application error from the reply's `err` field, or an RPC-level
    /// error (1-frame reply, unknown method, failed Init).
    #[error("σOS error {name} ({code}){}{}", fmt_obj(obj), fmt_msg(msg))]
    Sigma {
        code: u32,
        name: &'static str,
        obj: String,
        msg: String,
    },
    /// The connection to spproxyd failed or closed.
    #[error("spproxy connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent something the protocol does not allow.
    #[error("spproxy protocol: {0}")]
    Protocol(String),
}

fn fmt_obj(obj: &str) -> String {
    if obj.is_empty() {
        String::new()
    } else {
        format!(" on {obj:?}")
    }
}

fn fmt_msg(msg: &str) -> String {
    if msg.is_empty() {
        String::new()
    } else {
        format!(": {msg}")
    }
}

impl Error {
    /// The error an `Rerror` with a non-zero code stands for.
    pub fn from_rerror(e: Rerror) -> Error {
        Error::Sigma {
            code: e.err_code,
            name: ecode_name(e.err_code),
            obj: e.obj,
            msg: e.err,
        }
    }

    /// `Err` if `err` is present with a non-zero code; a missing `err` is success
    /// (Exited's reply leaves it unset).
    pub fn check(err: Option<Rerror>) -> Result<(), Error> {
        match err {
            Some(e) if e.err_code != 0 => Err(Error::from_rerror(e)),
            _ => Ok(()),
        }
    }

    /// The σOS error code, if this is a σOS error.
    pub fn code(&self) -> Option<u32> {
        match self {
            Error::Sigma { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<crate::frame::FrameError> for Error {
    fn from(e: crate::frame::FrameError) -> Error {
        match e {
            crate::frame::FrameError::Io(e) => Error::Io(e),
            crate::frame::FrameError::Truncated { .. } => Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                e.to_string(),
            )),
            other => Error::Protocol(other.to_string()),
        }
    }
}
