//! A proc's death by a signal, passed on by a process that is the init of its pid namespace
//! (σOS's trampoline is procd's): the kernel ignores a signal an init sends itself (or any
//! signal without a handler, but SIGKILL and SIGSTOP from an ancestor namespace), so raising
//! the proc's signal would end the run with 128+N, recorded by the parent as an exit status.
//! A signal the kernel forces for a fault does end an init, so the faults among the signals
//! (SIGSEGV, SIGILL, SIGTRAP, SIGFPE) are reproduced here by the fault itself; the others stay
//! 128+N.
#![allow(unsafe_code)]

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};

/// Ends this process by the fault of signal `sig` if it is the init of its pid namespace and
/// `sig` is a fault's; returns otherwise (the caller ends the run its usual way).
pub fn as_init_by_fault(sig: u8) {
    if std::process::id() != 1 {
        return;
    }
    let Ok(s) = Signal::try_from(i32::from(sig)) else {
        return;
    };
    if !matches!(
        s,
        Signal::SIGSEGV | Signal::SIGILL | Signal::SIGTRAP | Signal::SIGFPE
    ) {
        return;
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    take_default(s);
    fault(s);
}

/// Makes signal `s` end this process as its default action would, without a core (the
/// program's fault or ^\ is the program's, not ours): the default action restored and the
/// signal unblocked in this thread. For a process that passes on a proc's death by `s`.
pub fn take_default(s: Signal) {
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default action installs no handler; SIGKILL's is refused with
    // EINVAL, and it needs none.
    let _ = unsafe { signal::sigaction(s, &dfl) };
    let mut set = SigSet::empty();
    set.add(s);
    let _ = signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
}

#[cfg(target_arch = "x86_64")]
fn fault(s: Signal) {
    // SAFETY: each instruction traps before it changes any state this process relies on: a
    // load from address 0 (page 0 is never mapped: vm.mmap_min_addr), ud2, int3, a division by
    // zero. The kernel then delivers the signal with its default action, which ends the process.
    unsafe {
        match s {
            Signal::SIGSEGV => std::arch::asm!("mov {t}, qword ptr [0]", t = out(reg) _),
            Signal::SIGILL => std::arch::asm!("ud2"),
            Signal::SIGTRAP => std::arch::asm!("int3"),
            Signal::SIGFPE => std::arch::asm!(
                "xor ecx, ecx",
                "div ecx",
                out("eax") _, out("ecx") _, out("edx") _,
            ),
            _ => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fault(_: Signal) {}
