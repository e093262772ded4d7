//! Forked-child harness for filter tests: the child installs the real filter and runs a body
//! that uses only raw libc calls (no allocation after fork), then `_exit`s with the body's
//! status, which the parent asserts.
#![allow(dead_code)]

use sigma_notify::{CompiledFilter, Listener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

/// Pipes between parent and child.
pub struct ChildIo {
    /// Child reads from here (parent writes).
    pub rd: RawFd,
    /// Child writes here (parent reads).
    pub wr: RawFd,
}

impl ChildIo {
    pub fn send_u64(&self, v: u64) -> bool {
        let b = v.to_ne_bytes();
        // SAFETY: `b` is 8 live bytes on the stack; wr is the child's open pipe end.
        unsafe { libc::write(self.wr, b.as_ptr().cast(), 8) == 8 }
    }
    pub fn recv_u64(&self) -> Option<u64> {
        let mut b = [0u8; 8];
        // SAFETY: `b` is 8 writable bytes on the stack; rd is the child's open pipe end.
        let n = unsafe { libc::read(self.rd, b.as_mut_ptr().cast(), 8) };
        (n == 8).then(|| u64::from_ne_bytes(b))
    }
}

/// Tests fork one child at a time, so no child inherits another test's pipe or listener fds.
static FORK_LOCK: Mutex<()> = Mutex::new(());

pub struct Child {
    pub pid: i32,
    pub listener: Listener,
    /// Parent → child.
    pub to_child: OwnedFd,
    /// Child → parent.
    pub from_child: OwnedFd,
    reaped: bool,
    _serial: MutexGuard<'static, ()>,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two c_ints, as pipe2 expects.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 succeeded, so both fds are fresh and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// The child's `_exit` status when the filter could not be installed.
pub const EXIT_INSTALL_FAILED: i32 = 90;
pub const EXIT_PANIC: i32 = 91;

/// Fork a child that installs `filter`, hands its listener to the parent and runs `body`.
pub fn spawn(filter: &CompiledFilter, body: fn(&ChildIo) -> i32) -> Child {
    let serial = FORK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let (p2c_r, p2c_w) = pipe();
    let (c2p_r, c2p_w) = pipe();
    // SAFETY: the child only calls async-signal-safe functions (install does no allocation;
    // bodies use raw libc calls) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let io = ChildIo {
            rd: p2c_r.as_raw_fd(),
            wr: c2p_w.as_raw_fd(),
        };
        let code = match filter.install() {
            Ok(fd) => {
                // Tell the parent the listener's number, wait until it has taken a copy.
                if io.send_u64(fd.as_raw_fd() as u64) && io.recv_u64() == Some(0) {
                    drop(fd);
                    std::panic::catch_unwind(|| body(&io)).unwrap_or(EXIT_PANIC)
                } else {
                    EXIT_INSTALL_FAILED + 1
                }
            }
            Err(_) => EXIT_INSTALL_FAILED,
        };
        // SAFETY: _exit ends the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(p2c_r);
    drop(c2p_w);
    let mut child = Child {
        pid,
        listener: Listener::from_fd(pipe().0), // placeholder, replaced below
        to_child: p2c_w,
        from_child: c2p_r,
        reaped: false,
        _serial: serial,
    };
    let remote = child
        .recv_u64()
        .unwrap_or_else(|| panic!("child exited before installing: {:?}", child.wait()));
    child.listener = Listener::take_from(pid, remote as RawFd).expect("pidfd_getfd listener");
    child.send_u64(0);
    child
}

impl Child {
    pub fn send_u64(&self, v: u64) {
        let b = v.to_ne_bytes();
        // SAFETY: `b` is 8 live bytes; to_child is our open pipe end.
        let n = unsafe { libc::write(self.to_child.as_raw_fd(), b.as_ptr().cast(), 8) };
        assert_eq!(n, 8);
    }
    pub fn recv_u64(&self) -> Option<u64> {
        let mut b = [0u8; 8];
        // SAFETY: `b` is 8 writable bytes; from_child is our open pipe end.
        let n = unsafe { libc::read(self.from_child.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        (n == 8).then(|| u64::from_ne_bytes(b))
    }
    /// Wait for the child; returns the raw wait status.
    pub fn wait(&mut self) -> i32 {
        let mut status = 0;
        loop {
            // SAFETY: `status` is a writable c_int; pid is our unreaped child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r == self.pid {
                self.reaped = true;
                return status;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EINTR), "waitpid: {e}");
        }
    }
    /// Wait and assert the child exited with status 0.
    pub fn assert_success(&mut self) {
        let st = self.wait();
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "child failed: {}",
            describe(st)
        );
    }
    pub fn kill(&self) {
        // SAFETY: kill(2) on our own unreaped child's pid.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
    }
}

pub fn describe(st: i32) -> String {
    if libc::WIFEXITED(st) {
        format!("exit status {}", libc::WEXITSTATUS(st))
    } else if libc::WIFSIGNALED(st) {
        format!("killed by signal {}", libc::WTERMSIG(st))
    } else {
        format!("wait status {st:#x}")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
            self.wait();
        }
    }
}

/// errno in the child.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Page size the path-edge children assume.
pub const PG: usize = 4096;

/// In a forked child: map `pages` anonymous read-write pages and put `path` (NUL included) so
/// that it ends at the very last byte of page 0. Returns the mapping's base, `None` if mmap
/// failed. Raw libc only (no allocation).
pub fn map_path_at_page_end(pages: usize, path: &[u8]) -> Option<*mut u8> {
    // SAFETY: anonymous private mapping of `pages` pages; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PG,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    let base = base.cast::<u8>();
    // SAFETY: page 0 is mapped read-write and path.len() <= PG: the copy stays inside it.
    unsafe { std::ptr::copy_nonoverlapping(path.as_ptr(), base.add(PG - path.len()), path.len()) };
    Some(base)
}
