//! execve, execveat. Executing a served file is refused with EACCES: the kernel execs from the
//! target's mount namespace, where the served directory is hidden, and the supervisor cannot exec
//! on the target's behalf (injecting an fd and then letting the kernel continue would re-read
//! target memory the target may have changed after the decision). Programs in a served tree are
//! run through an interpreter that opens them (`python3 /prefix/script.py`), which is served.
#![forbid(unsafe_code)]

use super::refuse::refuse_unsupported;
use super::spec::{Follow, PathArg, Spec};
use crate::calls::Writes;

pub const EXECVE: Spec = Spec {
    name: "execve",
    paths: &[PathArg::cwd(0, Follow::Yes)],
    serve: refuse_unsupported,
    check: None,
    writes: Writes::No,
};
pub const EXECVEAT: Spec = Spec {
    name: "execveat",
    paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(4)).empty_ok(4)],
    serve: refuse_unsupported,
    check: None,
    writes: Writes::No,
};
