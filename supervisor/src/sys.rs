//! The few kernel calls the supervisor makes that need `unsafe`: fork/execve, pidfd, prctl,
//! statx, and viewing kernel-filled structs as bytes. Everything else uses `nix`'s safe wrappers.
#![allow(unsafe_code)]

use nix::errno::Errno;
use std::ffi::{c_char, CStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// fork(2). Returns 0 in the child, the child's pid in the parent.
///
/// Only called while the process has a single thread (before the notification thread starts),
/// so the child may use any call, though it sticks to pre-built data.
pub fn fork() -> Result<i32, Errno> {
    // SAFETY: the supervisor is single-threaded when it forks (spawn runs before any thread is
    // started), so no lock (malloc, stdio) can be held by a thread that does not exist in the child.
    let pid = unsafe { libc::fork() };
    Errno::result(pid)
}

/// execve(2) with NULL-terminated pointer arrays built before fork. Returns only on failure.
pub fn execve(path: &CStr, argv: &[*const c_char], envp: &[*const c_char]) -> Errno {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    // SAFETY: `path` is NUL-terminated; `argv` and `envp` are NULL-terminated arrays whose
    // entries point into CStrings owned by the caller's `Prepared`, alive until execve returns.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// _exit(2): the process ends now, without atexit handlers (a forked child's would be the
/// parent's) or stdio flushing.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it does not return.
    unsafe { libc::_exit(code) }
}

/// End this process by signal `sig`, without a core dump: its default action restored and the
/// signal unblocked in this thread, then raised. A signal whose default is not to end the
/// process ends it with 128+`sig`, the status a shell would show for it.
pub fn die_of(sig: i32) -> ! {
    use nix::sys::signal::{self, Signal};
    if let Ok(s) = Signal::try_from(sig) {
        jail::death::take_default(s);
        let _ = signal::raise(s);
    }
    exit_now(128i32.saturating_add(sig) & 0xff)
}

pub use notify::{pidfd_getfd, pidfd_open, PIDFD_THREAD};
// Shared with the realm filesystems, which need them below the supervisor.
pub use realmfs::sys::{received_fd, statx_fd};

/// prctl(PR_SET_CHILD_SUBREAPER, 1): orphaned descendants are re-parented to us.
pub fn set_child_subreaper() -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(drop)
}

/// prctl(PR_SET_PDEATHSIG, SIGKILL): the child dies with its supervisor.
pub fn set_parent_death_kill() -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments only.
    Errno::result(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

/// The CPU this thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Structs the kernel fills completely (padding included), safe to view as bytes.
pub trait KernelStruct: Copy {}
impl KernelStruct for libc::stat {}
impl KernelStruct for libc::statx {}
impl KernelStruct for libc::open_how {}

/// The bytes of a kernel struct, to copy into the target's memory.
pub fn struct_bytes<T: KernelStruct>(v: &T) -> &[u8] {
    // SAFETY: `T` is a plain-old-data kernel struct whose every byte (padding included) was
    // written by the kernel or zero-initialised; the slice borrows `v` for its lifetime.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A kernel struct from bytes read out of the target (short input is zero-extended).
pub fn struct_from_bytes<T: KernelStruct>(bytes: &[u8]) -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    let n = bytes.len().min(std::mem::size_of::<T>());
    // SAFETY: `v` is a zeroed T-sized buffer; we copy at most size_of::<T>() bytes into it; any
    // bit pattern is a valid value for these integer-only kernel structs.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), n);
        v.assume_init()
    }
}

/// Restore a signal's default action. The Rust runtime ignores SIGPIPE, and an ignored
/// disposition survives execve (the target must see what a shell would give it); a SIGCHLD
/// inherited as ignored would make the kernel reap children before we can wait for them.
pub fn default_disposition(sig: nix::sys::signal::Signal) {
    // SAFETY: installing SIG_DFL runs no handler code, so no handler can observe any state.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
}

/// Whether this process runs under a real-time policy (SCHED_FIFO / SCHED_RR).
pub fn is_realtime() -> bool {
    // The system call, not the libc function (musl's does not ask the kernel: ENOSYS).
    // SAFETY: sched_getscheduler(0) queries this process; no pointers.
    let policy = unsafe { libc::syscall(libc::SYS_sched_getscheduler, 0) };
    policy == libc::c_long::from(libc::SCHED_FIFO) || policy == libc::c_long::from(libc::SCHED_RR)
}

/// Send `data` as one message on descriptor `n`, which our caller passed to us for that
/// (a pool's zygote says its view on it: `--zygote-ctl`).
pub fn say_on_passed(n: u32, data: &[u8]) -> Result<(), Errno> {
    // SAFETY: `n` is a descriptor our caller passed and told us of; it is borrowed for the
    // call only, and `data` outlives it.
    let fd = unsafe { BorrowedFd::borrow_raw(n as i32) };
    loop {
        match nix::unistd::write(fd, data) {
            Err(Errno::EINTR) => continue,
            Ok(w) if w == data.len() => return Ok(()),
            Ok(_) => return Err(Errno::EMSGSIZE),
            Err(e) => return Err(e),
        }
    }
}

/// pidfd_send_signal(2) without a siginfo: the process (or thread) behind `pidfd` gets `sig`
/// as if from kill(2); ESRCH if it has exited, whatever process now has its pid.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: i32, flags: u32) -> Result<(), Errno> {
    // SAFETY: the pidfd is borrowed for the call; the siginfo pointer is null.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    };
    Errno::result(rc).map(drop)
}

/// What ended a wait in [`wait_signal_or_fds`].
pub enum Woke {
    /// A signal of the set: its number and `si_code`. SI_KERNEL marks signals a terminal sent
    /// to the whole foreground group (the child already got them).
    Signal(i32, i32),
    /// The report fd gave init's report of how the program ended, or `None` at its end (or
    /// for a report that is not one).
    Report(Option<jail::init::Ended>),
    /// The watched fd of this index became readable (or its peer hung up); it was not read.
    Ready(usize),
    /// The timeout passed.
    Timeout,
}

/// Read init's report of how the program ended from its pipe (`None` at its end, or for a
/// report that is not one). Once init has exited, this never blocks.
pub fn read_report(fd: BorrowedFd<'_>) -> Result<Option<jail::init::Ended>, Errno> {
    let mut b = [0u8; 2];
    let n = nix::unistd::read(fd, &mut b)?;
    Ok(jail::init::Ended::from_wire(&b[..n]))
}

/// Wait for a signal of the set `signals` reads (blocked in every thread), for a byte on
/// `byte` (read), or for one of `watch` to become readable (not read), at most `timeout`
/// (`None`: no limit). Readiness comes before a byte (what a watched fd has to say is heard
/// before the end), a byte before a signal.
pub fn wait_signal_or_fds(
    signals: &nix::sys::signalfd::SignalFd,
    byte: Option<BorrowedFd<'_>>,
    watch: &[BorrowedFd<'_>],
    timeout: Option<std::time::Duration>,
) -> Result<Woke, Errno> {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let timeout = match timeout {
        None => PollTimeout::NONE,
        // Rounded up: a wait never ends early and spins.
        Some(t) => PollTimeout::try_from(t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX),
    };
    // signals, then `watch`, then `byte`.
    let mut fds = Vec::with_capacity(watch.len() + 2);
    fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
    fds.extend(watch.iter().map(|fd| PollFd::new(*fd, PollFlags::POLLIN)));
    if let Some(fd) = byte {
        fds.push(PollFd::new(fd, PollFlags::POLLIN));
    }
    if nix::poll::poll(&mut fds, timeout)? == 0 {
        return Ok(Woke::Timeout);
    }
    let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    if let Some(i) = fds[1..1 + watch.len()].iter().position(ready) {
        return Ok(Woke::Ready(i));
    }
    if let Some(fd) = byte.filter(|_| fds.last().is_some_and(ready)) {
        return match read_report(fd) {
            Ok(r) => Ok(Woke::Report(r)),
            Err(Errno::EAGAIN) | Err(Errno::EINTR) => Err(Errno::EINTR),
            Err(e) => Err(e),
        };
    }
    match signals.read_signal()? {
        Some(info) => Ok(Woke::Signal(info.ssi_signo as i32, info.ssi_code)),
        // Not there after all (or taken meanwhile): wait again.
        None => Err(Errno::EINTR),
    }
}
