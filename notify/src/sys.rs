//! The two /proc look-ups [`crate::path`] makes per relative path, without allocating:
//! readlinkat into a caller's buffer and statx relative to a directory fd.

use nix::errno::Errno;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Longest link target read (the kernel's PATH_MAX); a longer one is ENAMETOOLONG.
const LINK_MAX: usize = libc::PATH_MAX as usize;

/// readlinkat(2) of `name` under `dir` into `buf` (replacing its contents). `buf` keeps its
/// capacity between calls, so only its first use allocates. A target that fills the whole buffer
/// may have been cut short: ENAMETOOLONG.
pub(crate) fn readlinkat_into(
    dir: BorrowedFd<'_>,
    name: &CStr,
    buf: &mut Vec<u8>,
) -> Result<(), Errno> {
    buf.clear();
    buf.reserve(LINK_MAX);
    let cap = buf.capacity();
    // SAFETY: `name` is NUL-terminated and outlives the call; `buf` owns `cap` writable bytes
    // starting at its pointer (reserved above) and the kernel writes at most `cap` of them;
    // `dir` is a borrowed open fd, alive for the call.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast::<libc::c_char>(),
            cap,
        )
    };
    let n = usize::try_from(n).map_err(|_| Errno::last())?;
    if n >= cap {
        return Err(Errno::ENAMETOOLONG);
    }
    // SAFETY: the kernel initialised the first `n` bytes (`n < cap`, checked above).
    unsafe { buf.set_len(n) };
    Ok(())
}

/// statx(2) of `name` under `dir` (magic links such as `cwd` and `fd/3` are followed unless
/// `flags` has AT_SYMLINK_NOFOLLOW).
pub(crate) fn statx_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: i32,
    mask: u32,
) -> Result<libc::statx, Errno> {
    let mut out = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `out` is a writable statx-sized buffer on our stack; `name` is NUL-terminated
    // and outlives the call; `dir` is a borrowed open fd, alive for the call.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            mask,
            out.as_mut_ptr(),
        )
    };
    Errno::result(rc)?;
    // SAFETY: statx succeeded, so the kernel filled the struct (and it was zeroed before).
    Ok(unsafe { out.assume_init() })
}
