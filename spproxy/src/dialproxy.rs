//! σOS's dialproxy handshake: connect to spproxyd's dialproxy socket, send the proc's
//! principal as one frame `[i32 LE len+4][SIGMAPRINCIPAL]`, and hand the connection to the
//! proc as `SIGMA_DIALPROXY_FD` (its close-on-exec flag cleared).
#![forbid(unsafe_code)]

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// The variable naming the proc's dialproxy connection.
pub const ENV_DIALPROXY_FD: &str = "SIGMA_DIALPROXY_FD";

/// A failed handshake, as one line.
#[derive(Debug, thiserror::Error)]
pub enum DialproxyError {
    #[error("SIGMAPRINCIPAL is too long for a dialproxy frame")]
    TooLong,
    #[error(
        "dialproxy: cannot connect to {}: {error} (is spproxyd running? `false` as the third \
         argument runs the proc without dialproxy)",
        socket.display()
    )]
    Connect {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("dialproxy: sending the principal to {}: {error}", socket.display())]
    Send {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("dialproxy: clearing close-on-exec: {0}")]
    Cloexec(nix::errno::Errno),
}

/// The frame that opens a dialproxy connection.
pub fn frame(principal: &str) -> Result<Vec<u8>, DialproxyError> {
    let len = i32::try_from(principal.len() + 4).map_err(|_| DialproxyError::TooLong)?;
    let mut f = Vec::with_capacity(principal.len() + 4);
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(principal.as_bytes());
    Ok(f)
}

/// The proc's dialproxy connection, the handshake sent.
pub fn connect(socket: &Path, principal: &str) -> Result<OwnedFd, DialproxyError> {
    let frame = frame(principal)?;
    let mut s = UnixStream::connect(socket).map_err(|error| DialproxyError::Connect {
        socket: socket.to_path_buf(),
        error,
    })?;
    s.write_all(&frame).map_err(|error| DialproxyError::Send {
        socket: socket.to_path_buf(),
        error,
    })?;
    let fd = OwnedFd::from(s);
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::empty())).map_err(DialproxyError::Cloexec)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_counts_its_own_length() {
        assert_eq!(frame("ab").unwrap(), [6, 0, 0, 0, b'a', b'b']);
    }

    #[test]
    fn an_absent_socket_is_one_line() {
        let e = connect(Path::new("/nonexistent/dp.sock"), "p")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dialproxy: cannot connect to /nonexistent/dp.sock"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}
