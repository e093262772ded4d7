//! open, openat, openat2, creat. Served opens are performed by the supervisor beneath the served
//! directory and the fd is injected with NOTIF_ADDFD + SEND; writes into served trees are EROFS.
#![forbid(unsafe_code)]

use super::refuse::refuse_write;
use super::spec::{Follow, PathArg, ServeCall, Spec};
use crate::calls::Writes;
use crate::reply::{inject_errno, Reply};
use crate::sys;
use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use std::os::fd::AsFd;

pub const OPEN: Spec = Spec {
    name: "open",
    paths: &[PathArg::cwd(0, Follow::Yes).creates()],
    serve: serve_open,
    check: None,
    writes: Writes::Open { flags: 1 },
};
pub const OPENAT: Spec = Spec {
    name: "openat",
    paths: &[PathArg::at(0, 1, Follow::Yes).creates()],
    serve: serve_openat,
    check: None,
    writes: Writes::Open { flags: 2 },
};
pub const OPENAT2: Spec = Spec {
    name: "openat2",
    paths: &[PathArg::at(0, 1, Follow::Yes).creates()],
    serve: serve_openat2,
    check: None,
    writes: Writes::OpenHow,
};
pub const CREAT: Spec = Spec {
    name: "creat",
    paths: &[PathArg::cwd(0, Follow::Yes).creates()],
    serve: refuse_write,
    check: None,
    writes: Writes::Creat,
};

fn serve_open(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    open_served(call, call.arg(1), ResolveFlag::empty())
}

fn serve_openat(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    open_served(call, call.arg(2), ResolveFlag::empty())
}

fn serve_openat2(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    let size = usize::try_from(call.arg(3)).map_err(|_| Errno::EINVAL)?;
    if size < std::mem::size_of::<u64>() * 3 || size > 4096 {
        return Err(Errno::EINVAL);
    }
    let mut buf = [0u8; 24];
    call.mem().read(call.arg(2), &mut buf)?;
    let how: libc::open_how = sys::struct_from_bytes(&buf);
    // The target's own resolve restrictions only narrow ours; IN_ROOT conflicts with BENEATH.
    let theirs = ResolveFlag::from_bits_truncate(how.resolve) - ResolveFlag::RESOLVE_IN_ROOT;
    open_served(call, how.flags, theirs)
}

/// Flags a served open may carry through (O_CLOEXEC goes to the injected fd instead).
const PASS: libc::c_int = libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_PATH
    | libc::O_NONBLOCK
    | libc::O_NOCTTY
    | libc::O_LARGEFILE
    | libc::O_DSYNC
    | libc::O_SYNC;

fn open_served(call: &ServeCall<'_>, flags: u64, resolve: ResolveFlag) -> Result<Reply, Errno> {
    let flags = flags as libc::c_int;
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY
        || flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) != 0
        // O_TMPFILE includes O_DIRECTORY's bit: match it whole.
        || flags & libc::O_TMPFILE == libc::O_TMPFILE;
    if writes {
        return Err(Errno::EROFS);
    }
    let oflag = OFlag::from_bits_truncate(flags & PASS);
    let fd = call.served.openat(call.rest, oflag, resolve)?;
    let cloexec = flags & libc::O_CLOEXEC != 0;
    call.listener
        .addfd_send(call.notif.id, fd.as_fd(), cloexec)
        .map_err(inject_errno)?;
    Ok(Reply::Answered)
}
