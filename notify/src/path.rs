//! Resolving paths as the target sees them: dirfd via /proc/<pid>/fd/<n>, cwd via
//! /proc/<pid>/cwd, absolute paths via /proc/<pid>/root.
use std::ffi::CStr;
use std::path::PathBuf;

/// Turn (dirfd, path) of target `pid` into an absolute path in the target's view
/// (lexically normalised, no symlinks followed). AT_FDCWD = cwd.
pub fn absolute(pid: u32, dirfd: i32, path: &CStr) -> Result<PathBuf, nix::errno::Errno> {
    todo!()
}
