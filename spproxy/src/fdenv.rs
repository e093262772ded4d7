//! Adopting the spproxy socket a parent handed over by number in `SIGMA_SPPROXY_FD`.
//!
//! The one place in this crate that turns a raw fd number into an owned socket.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;

/// Set once the inherited fd has been adopted: it has exactly one owner per process.
static ADOPTED: AtomicBool = AtomicBool::new(false);

fn bad(value: &str, why: impl std::fmt::Display) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("SIGMA_SPPROXY_FD={value:?}: {why}"),
    ))
}

/// Takes ownership of the Unix stream socket numbered `value` (the env var's text),
/// marking it close-on-exec so the proc's own children do not inherit it.
pub(crate) fn adopt(value: &str) -> Result<UnixStream, Error> {
    let fd: RawFd = value
        .trim()
        .parse()
        .map_err(|_| bad(value, "not a file descriptor number"))?;
    if fd < 3 {
        return Err(bad(value, "refusing to adopt a stdio descriptor"));
    }
    // SAFETY: F_GETFD only reads the descriptor flags of `fd`; it touches no memory.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(bad(value, io::Error::last_os_error()));
    }
    // SAFETY: `libc::stat` is plain old data; all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable, correctly sized stat buffer on this stack frame.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(bad(value, io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(bad(value, "not a socket"));
    }
    if ADOPTED.swap(true, Ordering::SeqCst) {
        return Err(bad(
            value,
            "already adopted by an earlier connection in this process",
        ));
    }
    // SAFETY: only F_SETFD on an fd just checked to be open; no memory is involved.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(bad(value, io::Error::last_os_error()));
    }
    // SAFETY: `fd` is open (F_GETFD succeeded) and is a socket; the parent put its number
    // in SIGMA_SPPROXY_FD to hand this process ownership of it, and ADOPTED guarantees we
    // wrap it in an owner at most once, so no other OwnedFd in this process closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(UnixStream::from(owned))
}
