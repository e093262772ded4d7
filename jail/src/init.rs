//! pid 1 of the proc's pid namespace: reaps every process re-parented to it, forwards the
//! signals the supervisor passes on to the program, and ends the proc when the program ends —
//! what is left gets SIGTERM, and when init exits after the grace period the kernel kills the
//! rest. It exits with the status a shell would report for the program (128+N for signal N).
//!
//! When the proc ends (no process of it left, or the grace period over), init also writes how
//! the program ended ([`Ended::to_wire`], two bytes) to the fd it was given before it exits:
//! its own exit then tears down the proc's namespaces (the mount namespace's unmounts wait for
//! an RCU grace period, ~0.3 ms), and the supervisor, which has its answer, need not wait for
//! that. The report tells a program killed by signal N from one that exited with 128+N, which
//! init's own exit status cannot (pid 1 of a namespace cannot die of a signal it sends itself).
use crate::sys;
use nix::errno::Errno;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// How the program ended: with an exit status, or killed by a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(u8),
    /// The signal's number.
    Killed(u8),
}

impl Ended {
    /// From a `waitpid` status (`None` for a stop or continue).
    pub fn of(status: WaitStatus) -> Option<Ended> {
        match status {
            WaitStatus::Exited(_, c) => Some(Ended::Exited(c as u8)),
            WaitStatus::Signaled(_, s, _) => Some(Ended::Killed(s as i32 as u8)),
            _ => None,
        }
    }

    /// The status a shell reports for it: the exit status, or 128+N for signal N.
    pub fn code(self) -> u8 {
        match self {
            Ended::Exited(c) => c,
            Ended::Killed(s) => 128u8.wrapping_add(s),
        }
    }

    /// init's report: the status, then the signal (0 for an exit). Two bytes: a pipe write
    /// of them is whole or not at all.
    pub fn to_wire(self) -> [u8; 2] {
        match self {
            Ended::Exited(c) => [c, 0],
            Ended::Killed(s) => [self.code(), s],
        }
    }

    /// The report read back; `None` for anything but two bytes that agree.
    pub fn from_wire(b: &[u8]) -> Option<Ended> {
        match *b {
            [c, 0] => Some(Ended::Exited(c)),
            [c, s] if Ended::Killed(s).code() == c => Some(Ended::Killed(s)),
            _ => None,
        }
    }
}

/// Run init's loop for `target` (its child). `signals` is the blocked set it waits on (it must
/// contain SIGCHLD). `report` gets how the program ended once the proc is over. Never returns.
pub fn run(target: i32, signals: &SigSet, grace: Duration, report: Option<OwnedFd>) -> ! {
    let _ = sys::prctl(libc::PR_SET_DUMPABLE, 0, 0);
    let target = Pid::from_raw(target);
    let mut ended: Option<Ended> = None;
    let mut deadline: Option<Instant> = None;
    let own_session = !crate::world::stdio_is_a_terminal();
    loop {
        let mut none_left = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(st) => {
                    if st.pid() == Some(target) {
                        if let Some(e) = Ended::of(st) {
                            ended = Some(e);
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
        if let Some(e) = ended {
            if none_left {
                finish(e, report.as_ref())
            }
            if deadline.is_none() {
                // The program ended: its leftovers are asked to go, then killed with us.
                let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                deadline = Some(Instant::now() + grace);
            }
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The grace period is over (only once the program has ended): the kernel kills what is
        // left as init exits.
        let over =
            |e: Option<Ended>| -> ! { finish(e.unwrap_or(Ended::Exited(1)), report.as_ref()) };
        if timeout == Some(Duration::ZERO) {
            over(ended)
        }
        match sys::sigtimedwait(signals, timeout) {
            Ok(None) => over(ended),
            Ok(Some((libc::SIGCHLD, _))) | Err(_) => {}
            // A terminal's signal reached the whole foreground group (SI_KERNEL): the program
            // has it already, unless it leads a session of its own (no terminal on stdio).
            Ok(Some((_, libc::SI_KERNEL))) if !own_session => {}
            Ok(Some((sig, _))) => {
                if ended.is_none() {
                    if let Ok(s) = Signal::try_from(sig) {
                        let _ = kill(target, s);
                    }
                }
            }
        }
    }
}

/// Report how the program ended and exit with its shell status.
fn finish(e: Ended, report: Option<&OwnedFd>) -> ! {
    if let Some(fd) = report {
        let _ = nix::unistd::write(fd.as_fd(), &e.to_wire());
    }
    crate::mark("init-exit");
    sys::exit_now(i32::from(e.code()))
}

#[cfg(test)]
mod tests {
    use super::Ended;

    #[test]
    fn a_report_tells_a_signal_from_an_exit_status_of_128_plus_n() {
        for e in [
            Ended::Exited(0),
            Ended::Exited(130),
            Ended::Killed(2),
            Ended::Killed(9),
        ] {
            assert_eq!(Ended::from_wire(&e.to_wire()), Some(e));
        }
        assert_eq!(Ended::Exited(130).code(), Ended::Killed(2).code());
        assert_ne!(Ended::Exited(130).to_wire(), Ended::Killed(2).to_wire());
        // Short, long or inconsistent bytes are not a report.
        for bad in [&[][..], &[130], &[130, 2, 0], &[129, 2], &[255, 200]] {
            assert_eq!(Ended::from_wire(bad), None, "{bad:?}");
        }
    }
}
