//! access, faccessat, faccessat2: answered from the host file under a served directory.
#![forbid(unsafe_code)]

use super::spec::{Follow, PathArg, ServeCall, Spec};
use super::stat::open_path;
use crate::calls::Writes;
use crate::reply::Reply;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::unistd::AccessFlags;
use notify::Response;
use std::os::fd::AsFd;

pub const ACCESS: Spec = Spec {
    name: "access",
    paths: &[PathArg::cwd(0, Follow::Yes)],
    serve: serve_access,
    check: None,
    writes: Writes::No,
};
pub const FACCESSAT: Spec = Spec {
    name: "faccessat",
    paths: &[PathArg::at(0, 1, Follow::Yes)],
    serve: serve_faccessat,
    check: None,
    writes: Writes::No,
};
pub const FACCESSAT2: Spec = Spec {
    name: "faccessat2",
    paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).empty_ok(3)],
    serve: serve_faccessat,
    check: None,
    writes: Writes::No,
};

fn check(call: &ServeCall<'_>, mode: u64) -> Result<Reply, Errno> {
    let mode = AccessFlags::from_bits(mode as i32).ok_or(Errno::EINVAL)?;
    if mode.contains(AccessFlags::W_OK) {
        // Served trees are read-only for the target.
        open_path(call)?;
        return Err(Errno::EROFS);
    }
    let fd = open_path(call)?;
    nix::unistd::faccessat(fd.as_fd(), "", mode, AtFlags::AT_EMPTY_PATH)?;
    Ok(Reply::Respond(Response::Value(0)))
}

fn serve_access(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    check(call, call.arg(1))
}

fn serve_faccessat(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    check(call, call.arg(2))
}
