//! readlink, readlinkat: a served symlink's target is read on the host and written into the
//! target's buffer (truncated to its size, no NUL, as the kernel does).
#![forbid(unsafe_code)]

use super::spec::{Follow, PathArg, ServeCall, Spec};
use super::stat::open_path;
use crate::calls::Writes;
use crate::reply::Reply;
use nix::errno::Errno;
use nix::sys::stat::SFlag;
use notify::Response;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

pub const READLINK: Spec = Spec {
    name: "readlink",
    paths: &[PathArg::cwd(0, Follow::No)],
    serve: serve_readlink,
    check: None,
    writes: Writes::No,
};
pub const READLINKAT: Spec = Spec {
    name: "readlinkat",
    paths: &[PathArg::at(0, 1, Follow::No)],
    serve: serve_readlinkat,
    check: None,
    writes: Writes::No,
};

fn read_into(call: &ServeCall<'_>, buf_arg: usize, size_arg: usize) -> Result<Reply, Errno> {
    let size = call.arg(size_arg) as i64;
    if size <= 0 {
        return Err(Errno::EINVAL);
    }
    let fd = open_path(call)?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFLNK {
        return Err(Errno::EINVAL);
    }
    let target = nix::fcntl::readlinkat(fd.as_fd(), "")?;
    let bytes = target.as_bytes();
    let n = bytes.len().min(size as usize);
    call.mem().write(call.arg(buf_arg), &bytes[..n])?;
    Ok(Reply::Respond(Response::Value(n as i64)))
}

fn serve_readlink(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    read_into(call, 1, 2)
}

fn serve_readlinkat(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    read_into(call, 2, 3)
}
