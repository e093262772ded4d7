//! The system calls [`crate::path`] makes per relative path, without allocating:
//! readlinkat into a caller's buffer, statx relative to a directory fd, and kcmp of a
//! target's descriptor against an open file we hold; and pidfd_open/pidfd_getfd, with which
//! it takes such a file and [`crate::listener`] takes a target's listener.

use nix::errno::Errno;
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

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

/// `PIDFD_THREAD` (Linux 6.9, = `O_EXCL`): a pidfd for one thread, not only for a
/// thread-group leader; signals sent through it reach that thread.
pub const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// pidfd_open(2) with flags (0 or [`PIDFD_THREAD`]).
pub fn pidfd_open(pid: libc::pid_t, flags: libc::c_uint) -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    let fd = Errno::result(r)? as RawFd;
    // SAFETY: on success pidfd_open returns a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// pidfd_getfd(2): our own duplicate (close-on-exec) of descriptor `fd` of the process or
/// thread behind `pidfd`. Needs ptrace-attach rights over it, as a parent has.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, fd: RawFd) -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall with integer arguments; `pidfd` is alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let got = Errno::result(r)? as RawFd;
    // SAFETY: on success pidfd_getfd returns a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(got) })
}

/// Our own duplicate of thread `tid`'s descriptor `fd`: the same open file, held for
/// [`same_file`].
pub(crate) fn take_file(tid: u32, fd: i32) -> Result<OwnedFd, Errno> {
    let tid = tid as libc::pid_t;
    // A kernel without PIDFD_THREAD refuses the flag; a leader's pidfd still works there.
    let pidfd = pidfd_open(tid, PIDFD_THREAD).or_else(|_| pidfd_open(tid, 0))?;
    pidfd_getfd(pidfd.as_fd(), fd)
}

/// Whether thread `tid`'s descriptor `fd` is the very open file `ours` is (kcmp(2),
/// KCMP_FILE, one call). While we hold `ours` its file cannot be freed and its address reused,
/// so equal means the same open file, never a later one.
pub(crate) fn same_file(tid: u32, fd: i32, me: u32, ours: BorrowedFd<'_>) -> Result<bool, Errno> {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: plain syscall with integer arguments; `ours` is alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            tid as libc::pid_t,
            me as libc::pid_t,
            KCMP_FILE,
            fd as libc::c_ulong,
            ours.as_raw_fd() as libc::c_ulong,
        )
    };
    Ok(Errno::result(r)? == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_file_matches_its_descriptor_until_the_number_is_reused() {
        let me = std::process::id();
        let mut a = OwnedFd::from(std::fs::File::open("/").unwrap());
        let n = a.as_raw_fd();
        let held = take_file(me, n).unwrap();
        assert_ne!(held.as_raw_fd(), n);
        assert_eq!(same_file(me, n, me, held.as_fd()), Ok(true));
        // Another open of the same directory is another open file.
        let again = std::fs::File::open("/").unwrap();
        assert_eq!(
            same_file(me, again.as_raw_fd(), me, held.as_fd()),
            Ok(false)
        );
        // The number now names another directory.
        let b = std::fs::File::open("/tmp").unwrap();
        nix::unistd::dup2(b.as_fd(), &mut a).unwrap();
        assert_eq!(a.as_raw_fd(), n);
        assert_eq!(same_file(me, n, me, held.as_fd()), Ok(false));
        drop(a);
        // A number no longer open is an error, not a match.
        assert!(same_file(me, n, me, held.as_fd()).is_err());
    }
}
