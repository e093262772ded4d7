//! The server's one error type.

use std::io;
use std::path::PathBuf;

use crate::frame::FrameError;

#[derive(thiserror::Error, Debug)]
pub enum ServerError {
    #[error("realm {realm}: scratch directory {path}: {source}")]
    ScratchDir {
        realm: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("binding spproxy socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spproxy connection dropped after a malformed message: {0}")]
    Malformed(#[source] FrameError),
    #[error("spproxy connection: {0}")]
    Io(#[from] io::Error),
}
