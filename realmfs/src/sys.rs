//! The few kernel calls of the realm filesystems that need `unsafe`: statx on an fd, a
//! descriptor received over a socket, the scheduling policy of every thread. The supervisor
//! uses the first two as well.
#![allow(unsafe_code)]

use nix::errno::Errno;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Take ownership of a descriptor that recvmsg(2) just received (SCM_RIGHTS).
pub fn received_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in our table for the message just received; nothing
    // else in this process knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// statx(2) on an fd (AT_EMPTY_PATH) with the target's sync flags and mask.
pub fn statx_fd(fd: BorrowedFd<'_>, flags: i32, mask: u32) -> Result<libc::statx, Errno> {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `buf` is a writable statx-sized buffer; the path is a static empty C string; the fd
    // is borrowed for the duration of the call.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags | libc::AT_EMPTY_PATH,
            mask,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(rc)?;
    // SAFETY: statx returned success, so the kernel filled the struct (it was zeroed before).
    Ok(unsafe { buf.assume_init() })
}

/// Move every thread of this process to `SCHED_IDLE`, so it runs only on a CPU nothing else
/// wants (a thread started later inherits its starter's policy). There is no way back without
/// `CAP_SYS_NICE`: for a process that ends when its work does. The first failure is returned;
/// a thread that exits meanwhile is skipped.
pub fn idle_process() -> Result<(), Errno> {
    every_thread(libc::SCHED_IDLE)
}

/// Move every thread of this process back to `SCHED_OTHER` (nice unchanged). Leaving
/// `SCHED_IDLE` needs `CAP_SYS_NICE` (or an RLIMIT_NICE that allows nice 0): EPERM otherwise.
pub fn normal_process() -> Result<(), Errno> {
    every_thread(libc::SCHED_OTHER)
}

fn every_thread(policy: i32) -> Result<(), Errno> {
    // SAFETY: sched_param is plain old data (one int with glibc, more fields with musl);
    // all-zero is a valid value, priority 0 as SCHED_IDLE and SCHED_OTHER require.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    let tasks = std::fs::read_dir("/proc/self/task")
        .map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw))?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // The system call, per thread (musl's function does not ask the kernel: ENOSYS).
        // SAFETY: sched_setscheduler reads `param`, a live sched_param, and changes only the
        // scheduling of `tid`, a thread of this process.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sched_setscheduler,
                tid,
                policy,
                &param as *const libc::sched_param,
            )
        };
        match Errno::result(r) {
            Ok(_) | Err(Errno::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
