//! stat, lstat, newfstatat, statx. On a served path the supervisor stats the host file (through
//! an O_PATH fd opened beneath the served directory) and writes the struct into the target.
#![forbid(unsafe_code)]

use super::spec::{Follow, PathArg, ServeCall, Spec};
use crate::calls::Writes;
use crate::reply::Reply;
use crate::sys;
use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use notify::Response;
use std::os::fd::{AsFd, OwnedFd};

pub const STAT: Spec = Spec {
    name: "stat",
    paths: &[PathArg::cwd(0, Follow::Yes)],
    serve: serve_stat,
    check: None,
    writes: Writes::No,
};
pub const LSTAT: Spec = Spec {
    name: "lstat",
    paths: &[PathArg::cwd(0, Follow::No)],
    serve: serve_stat,
    check: None,
    writes: Writes::No,
};
pub const NEWFSTATAT: Spec = Spec {
    name: "newfstatat",
    paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).empty_ok(3)],
    serve: serve_newfstatat,
    check: None,
    writes: Writes::No,
};
pub const STATX: Spec = Spec {
    name: "statx",
    paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(2)).empty_ok(2)],
    serve: serve_statx,
    check: None,
    writes: Writes::No,
};

/// An O_PATH fd on the served file, following the last symlink or not.
pub fn open_path(call: &ServeCall<'_>) -> Result<OwnedFd, Errno> {
    let mut flags = OFlag::O_PATH;
    if !call.follow {
        flags |= OFlag::O_NOFOLLOW;
    }
    call.served.openat(call.rest, flags, ResolveFlag::empty())
}

fn write_stat(call: &ServeCall<'_>, buf_arg: usize) -> Result<Reply, Errno> {
    let fd = open_path(call)?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    call.mem()
        .write(call.arg(buf_arg), sys::struct_bytes(&st))?;
    Ok(Reply::Respond(Response::Value(0)))
}

fn serve_stat(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    write_stat(call, 1)
}

fn serve_newfstatat(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    write_stat(call, 2)
}

fn serve_statx(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    let fd = open_path(call)?;
    let sync = call.arg(2) as i32 & libc::AT_STATX_SYNC_TYPE;
    let stx = sys::statx_fd(fd.as_fd(), sync, call.arg(3) as u32)?;
    call.mem().write(call.arg(4), sys::struct_bytes(&stx))?;
    Ok(Reply::Respond(Response::Value(0)))
}
