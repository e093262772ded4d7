//! pid 1 of the proc's pid namespace: reaps every process re-parented to it, forwards the
//! signals the supervisor passes on to the program, and ends the proc when the program ends —
//! what is left gets SIGTERM, and when init exits after the grace period the kernel kills the
//! rest. It exits with the status a shell would report for the program (128+N for signal N).
//!
//! When no process of the proc is left, init also writes that status (one byte) to the fd it
//! was given before it exits: its own exit then tears down the proc's namespaces (the mount
//! namespace's unmounts wait for an RCU grace period, ~0.3 ms), and the supervisor, which
//! has its answer, need not wait for that.
use crate::sys;
use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

fn code_of(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, c) => Some(c & 0xff),
        WaitStatus::Signaled(_, s, _) => Some(128 + s as i32),
        _ => None,
    }
}

/// Run init's loop for `target` (its child). `signals` is the blocked set it waits on (it must
/// contain SIGCHLD). `ended` gets the status once nothing of the proc is left. Never returns.
pub fn run(target: i32, signals: &SigSet, grace: Duration, ended: Option<OwnedFd>) -> ! {
    let _ = sys::prctl(libc::PR_SET_DUMPABLE, 0, 0);
    let target = Pid::from_raw(target);
    let mut code: Option<i32> = None;
    let mut deadline: Option<Instant> = None;
    loop {
        let mut none_left = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(st) => {
                    if st.pid() == Some(target) {
                        if let Some(c) = code_of(st) {
                            code = Some(c);
                        }
                    }
                }
                Err(Errno::EINTR) => {}
                Err(_) => {
                    none_left = true;
                    break;
                }
            }
        }
        if let Some(c) = code {
            if none_left {
                if let Some(fd) = &ended {
                    // One byte: a pipe write of it is whole or not at all.
                    let _ = nix::unistd::write(fd.as_fd(), &[c as u8]);
                }
                crate::mark("init-exit");
                sys::exit_now(c)
            }
            if deadline.is_none() {
                // The program ended: its leftovers are asked to go, then killed with us.
                let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                deadline = Some(Instant::now() + grace);
            }
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if timeout == Some(Duration::ZERO) {
            sys::exit_now(code.unwrap_or(1))
        }
        match sys::sigtimedwait(signals, timeout) {
            Ok(None) => sys::exit_now(code.unwrap_or(1)),
            Ok(Some((libc::SIGCHLD, _))) | Err(_) => {}
            // A terminal's signal reached the whole foreground group (SI_KERNEL): the program
            // has it already.
            Ok(Some((_, libc::SI_KERNEL))) => {}
            Ok(Some((sig, _))) => {
                if code.is_none() {
                    if let Ok(s) = Signal::try_from(sig) {
                        let _ = kill(target, s);
                    }
                }
            }
        }
    }
}
