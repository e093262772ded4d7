//! The serve functions of calls the supervisor does not perform for the target.
#![forbid(unsafe_code)]

use super::spec::ServeCall;
use super::stat;
use crate::reply::Reply;
use nix::errno::Errno;

/// Calls that would modify a served (read-only) tree: EROFS, or EEXIST when the call would
/// create an entry that already exists (what `os.makedirs(exist_ok=True)` and friends look for).
pub fn refuse_write(call: &ServeCall<'_>) -> Result<Reply, Errno> {
    if !call.must_exist && stat::open_path(call).is_ok() {
        return Err(Errno::EEXIST);
    }
    Err(Errno::EROFS)
}

/// Calls the supervisor cannot perform for the target (e.g. chdir into a served directory: the
/// target's cwd would have to be a directory it cannot see).
pub fn refuse_unsupported(_call: &ServeCall<'_>) -> Result<Reply, Errno> {
    Err(Errno::EACCES)
}
