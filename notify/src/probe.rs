//! A probe target for benchmarks and tests: a forked child that installs a filter and then,
//! each time it is told a count `n`, makes `n` raw `getppid` calls (the trigger syscall, with
//! pointers to [`PROBE_PATH`] and [`PROBE_RELATIVE_PATH`] as its ignored arguments) and
//! reports back. The child's code is fixed here and async-signal-safe (raw syscalls only, no
//! allocation), which is what makes forking from a multi-threaded parent sound.
//!
//! Typical use (criterion `iter_custom`): [`ProbeChild::start`]`(n)`, answer `n` notifications
//! on [`ProbeChild::listener`], then [`ProbeChild::finish`].
use crate::error::NotifyError;
use crate::filter::CompiledFilter;
use crate::listener::Listener;
use nix::errno::Errno;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What the probe child's trigger calls carry in `args[0]`: a path of the length CPython's
/// import system probes (getppid ignores it; a benchmark reads it from the target).
pub const PROBE_PATH: &std::ffi::CStr =
    c"/usr/local/lib/python3.11/site-packages/sigma_probe/__init__.py";
/// ... and in `args[1]`, a path relative to the child's cwd.
pub const PROBE_RELATIVE_PATH: &std::ffi::CStr = c"sigma_probe/__init__.py";

/// The probe child's exit status when it could not install the filter.
pub const EXIT_INSTALL_FAILED: i32 = 90;

/// How the probe child is set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProbeOptions {
    /// Close each non-negative getppid result (answers that inject an fd).
    pub close_results: bool,
    /// Pin the child to this CPU (sched_setaffinity) before installing the filter.
    pub cpu: Option<usize>,
}

/// The forked probe child; killed and reaped on drop.
#[derive(Debug)]
pub struct ProbeChild {
    pid: i32,
    listener: Listener,
    cmd: OwnedFd,
    done: OwnedFd,
    reaped: bool,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Errno> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a writable array of two c_ints, as pipe2 expects.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Errno::last());
    }
    // SAFETY: pipe2 succeeded: both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn write_u64(fd: RawFd, v: u64) -> bool {
    let b = v.to_ne_bytes();
    loop {
        // SAFETY: `b` is 8 live bytes on the stack; `fd` is an open pipe end.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n == 8 {
            return true;
        }
        if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        return false;
    }
}

fn read_u64(fd: RawFd) -> Option<u64> {
    let mut b = [0u8; 8];
    loop {
        // SAFETY: `b` is 8 writable bytes on the stack; `fd` is an open pipe end.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) };
        if n == 8 {
            return Some(u64::from_ne_bytes(b));
        }
        if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        }
        return None;
    }
}

/// The child's whole life after fork. Raw syscalls only: no allocation, no locks.
fn child_main(filter: &CompiledFilter, opts: ProbeOptions, cmd: RawFd, done: RawFd) -> i32 {
    if let Some(cpu) = opts.cpu {
        // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: CPU_SET writes one bit inside `set` (cpu is bounds-checked by libc).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 = this thread.
        if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0
        {
            return EXIT_INSTALL_FAILED + 2;
        }
    }
    let listener = match filter.install() {
        Ok(fd) => fd,
        Err(_) => return EXIT_INSTALL_FAILED,
    };
    // Hand over the listener's number; the parent copies it with pidfd_getfd, then says go.
    if !write_u64(done, listener.as_raw_fd() as u64) || read_u64(cmd) != Some(0) {
        return EXIT_INSTALL_FAILED + 1;
    }
    drop(listener);
    while let Some(n) = read_u64(cmd) {
        let mut last: i64 = 0;
        for _ in 0..n {
            // SAFETY: getppid ignores its arguments; the two pointers (to static strings) only
            // show up in the notification, for benchmarks that read a path from the target.
            last = unsafe {
                libc::syscall(
                    libc::SYS_getppid,
                    PROBE_PATH.as_ptr(),
                    PROBE_RELATIVE_PATH.as_ptr(),
                )
            };
            if opts.close_results && last >= 0 {
                // SAFETY: the answer injected this fd into us; we own it and close it.
                unsafe { libc::close(last as RawFd) };
            }
        }
        if !write_u64(done, last as u64) {
            return 3;
        }
    }
    0
}

impl ProbeChild {
    /// Fork the probe child under `filter` (which should notify `getppid`).
    pub fn spawn(filter: &CompiledFilter, opts: ProbeOptions) -> Result<Self, NotifyError> {
        let io = |source| NotifyError::Ioctl {
            op: "pipe2/fork",
            source,
        };
        let (cmd_r, cmd_w) = pipe().map_err(io)?;
        let (done_r, done_w) = pipe().map_err(io)?;
        // SAFETY: the child runs only child_main (raw syscalls, no allocation, no locks) and
        // leaves with _exit, so forking from a multi-threaded parent is sound.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io(Errno::last()));
        }
        if pid == 0 {
            let code = child_main(filter, opts, cmd_r.as_raw_fd(), done_w.as_raw_fd());
            // SAFETY: _exit ends the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(code) };
        }
        drop(cmd_r);
        drop(done_w);
        let remote = read_u64(done_r.as_raw_fd());
        let mut child = ProbeChild {
            pid,
            // Replaced below; a pipe end stands in until the listener is taken.
            listener: Listener::from_fd(
                cmd_w
                    .try_clone()
                    .map_err(|e| io(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))?,
            ),
            cmd: cmd_w,
            done: done_r,
            reaped: false,
        };
        let Some(remote) = remote else {
            let st = child.reap();
            return Err(NotifyError::Build {
                context: format!("probe child failed to install the filter (wait status {st:#x})"),
                source: None,
            });
        };
        child.listener = Listener::take_from(pid, remote as RawFd)?;
        if !write_u64(child.cmd.as_raw_fd(), 0) {
            return Err(io(Errno::EPIPE));
        }
        Ok(child)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn listener(&self) -> &Listener {
        &self.listener
    }

    /// Tell the child to make `n` trigger calls.
    pub fn start(&self, n: u64) -> Result<(), Errno> {
        if write_u64(self.cmd.as_raw_fd(), n) {
            Ok(())
        } else {
            Err(Errno::EPIPE)
        }
    }

    /// Wait until the child reports the batch done; returns its last getppid result.
    pub fn finish(&self) -> Result<i64, Errno> {
        read_u64(self.done.as_raw_fd())
            .map(|v| v as i64)
            .ok_or(Errno::EPIPE)
    }

    fn reap(&mut self) -> i32 {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a writable c_int; pid is our own unreaped child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid || Errno::last() != Errno::EINTR {
                self.reaped = true;
                return status;
            }
        }
    }
}

impl Drop for ProbeChild {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill(2) on our own child, not yet reaped, so the pid is still ours.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            self.reap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::{Action, FilterSpec, SyscallRule};
    use crate::listener::Response;

    #[test]
    fn probe_batches_are_answered() {
        let filter = FilterSpec {
            default: Action::Allow,
            rules: vec![SyscallRule {
                name: "getppid".into(),
                action: Action::Notify,
                when: vec![],
            }],
        }
        .compile()
        .unwrap();
        let child = ProbeChild::spawn(&filter, ProbeOptions::default()).unwrap();
        for batch in [1u64, 3, 10] {
            child.start(batch).unwrap();
            for i in 0..batch {
                let n = child.listener().recv().unwrap();
                assert_eq!(n.pid, child.pid() as u32);
                child
                    .listener()
                    .respond(n.id, Response::Value(i as i64 + 7))
                    .unwrap();
            }
            assert_eq!(child.finish().unwrap(), batch as i64 + 6);
        }
    }
}
