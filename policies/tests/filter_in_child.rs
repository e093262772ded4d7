//! The compiled builtin profiles installed for real: in a forked child (raw syscalls, errno
//! checked) and under real CPython with a small in-test supervisor answering notifications.
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use notify::{CompiledFilter, Listener, Response};
use sigma_policies as policies;
use sigma_policies::{NotificationKind, Profile};
use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Checks run in the child after installing the filter; the index of the first failing check
/// is the exit code (0 = all passed). Only raw syscalls: no allocation after fork.
const CHECKS: &[&str] = &[
    "ok",
    "install failed",
    "getpid (allowed) failed",
    "socket(AF_INET) did not fail with EPERM",
    "clone(CLONE_NEWUSER) did not fail with EPERM",
    "clone(CLONE_NEWNET) did not fail with EPERM",
    "clone3 did not fail with ENOSYS",
    "rseq did not fail with ENOSYS",
    "clone(SIGCHLD) (fork without namespace flags) failed",
    "wait4 on the forked grandchild failed or wrong status",
    "unshare(CLONE_NEWNS) did not fail with EPERM",
    "getuid (addition) failed",
];

fn raw(r: libc::c_long) -> Result<libc::c_long, i32> {
    if r == -1 {
        Err(Errno::last_raw())
    } else {
        Ok(r)
    }
}

fn child_checks(filter: &CompiledFilter) -> i32 {
    if filter.install().is_err() {
        return 1;
    }
    // SAFETY: getpid takes no arguments.
    if raw(unsafe { libc::syscall(libc::SYS_getpid) }).is_err() {
        return 2;
    }
    // SAFETY: socket takes three integers; a returned fd would just leak until _exit.
    let r = raw(unsafe { libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_STREAM, 0) });
    if r != Err(libc::EPERM) {
        return 3;
    }
    for (flag, code) in [(libc::CLONE_NEWUSER, 4), (libc::CLONE_NEWNET, 5)] {
        // SAFETY: clone with a null stack behaves like fork; should it wrongly succeed, the new
        // process (r == 0) exits at once without touching anything.
        let r = raw(unsafe { libc::syscall(libc::SYS_clone, flag | libc::SIGCHLD, 0, 0, 0, 0) });
        if r == Ok(0) {
            // SAFETY: _exit ends this (unexpected) process immediately.
            unsafe { libc::_exit(99) };
        }
        if r != Err(libc::EPERM) {
            return code;
        }
    }
    // SAFETY: clone3 with a null args pointer: the kernel would fail it with EFAULT if it ran.
    let r = raw(unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) });
    if r != Err(libc::ENOSYS) {
        return 6;
    }
    // SAFETY: rseq with a null area and zero length: the kernel would fail it with EINVAL.
    let r = raw(unsafe { libc::syscall(libc::SYS_rseq, 0usize, 0u32, 0, 0u32) });
    if r != Err(libc::ENOSYS) {
        return 7;
    }
    // SAFETY: clone(SIGCHLD) with a null stack is fork; the new process only calls _exit.
    let pid = match raw(unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) }) {
        Ok(0) => {
            // SAFETY: _exit ends the grandchild immediately.
            unsafe { libc::_exit(7) }
        }
        Ok(pid) => pid,
        Err(_) => return 8,
    };
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a live c_int on our stack; rusage pointer is null.
    let r = raw(unsafe {
        libc::syscall(
            libc::SYS_wait4,
            pid,
            &mut status as *mut libc::c_int,
            0,
            0usize,
        )
    });
    if r != Ok(pid) || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 7 {
        return 9;
    }
    // SAFETY: unshare takes one integer.
    if raw(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS) }) != Err(libc::EPERM) {
        return 10;
    }
    // SAFETY: getuid takes no arguments.
    if raw(unsafe { libc::syscall(libc::SYS_getuid) }).is_err() {
        return 11;
    }
    0
}

#[test]
fn sigmaos_filter_in_forked_child() {
    let mut profile = policies::load("sigmaos").unwrap();
    // Nobody answers notifications here: deny unlisted calls in the kernel (no logging). The
    // allow-list and conditional rules are identical to the logging profile's.
    profile.set_logs_denied(false);
    let compiled = profile.filter_spec().compile().unwrap();
    // SAFETY: the child only runs `child_checks` (no allocation: install and raw syscalls) and
    // then _exit, so forking from the multi-threaded test harness is sound.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = child_checks(&compiled);
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
            WaitStatus::Exited(_, 0) => {}
            WaitStatus::Exited(_, code) => panic!(
                "check {code} failed in the filtered child: {}",
                CHECKS.get(code as usize).unwrap_or(&"unknown")
            ),
            other => panic!("filtered child ended with {other:?}"),
        },
    }
}

/// Checks of the additions and of the kernel-side AT_EMPTY_PATH allow, run in a child whose
/// listener fd is closed: a notified call then fails with ENOSYS, so "not notified" is visible
/// as success. `denied` is what an unlisted call fails with (EPERM, or ENOSYS when the kernel
/// default is Notify).
const ADDITION_CHECKS: &[&str] = &[
    "ok",
    "install failed",
    "pipe2 failed",
    "newfstatat(fd, \"\", AT_EMPTY_PATH) was notified or failed",
    "newfstatat(AT_FDCWD, \"/\", 0) was not notified (ENOSYS)",
    "newfstatat(AT_FDCWD, \"/\", AT_EMPTY_PATH) was notified or failed",
    "statx(fd, \"\", AT_EMPTY_PATH) was notified or failed",
    "statx(AT_FDCWD, \"/\", 0) was not notified (ENOSYS)",
    "socketpair(AF_UNIX) failed",
    "socketpair(AF_INET) was not denied",
    "clock_nanosleep failed",
    "getppid or getpgrp failed",
    "kill(self, 0) failed (allowed in the kernel: the jail confines it)",
    "mkdir was not notified (ENOSYS)",
    "chdir was not notified (ENOSYS)",
    "setuid (outside the list) was not denied",
];

fn addition_checks(filter: &CompiledFilter, denied: i32) -> i32 {
    // The listener fd is dropped at once: notified calls fail with ENOSYS.
    if filter.install().is_err() {
        return 1;
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a live array of two c_ints on our stack.
    if raw(unsafe { libc::syscall(libc::SYS_pipe2, fds.as_mut_ptr(), libc::O_CLOEXEC) }).is_err() {
        return 2;
    }
    // SAFETY: an all-zero `stat`/`statx` is a valid value of these plain C structs.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let st_p = &mut st as *mut libc::stat;
    let stx_p = &mut stx as *mut libc::statx;
    let (empty, root) = (c"".as_ptr(), c"/".as_ptr());
    let fstatat = |dirfd: libc::c_int, path: *const libc::c_char, flags: libc::c_int| {
        // SAFETY: `path` points to a NUL-terminated literal, `st_p` to a live stat buffer.
        raw(unsafe { libc::syscall(libc::SYS_newfstatat, dirfd, path, st_p, flags) })
    };
    let statx = |dirfd: libc::c_int, path: *const libc::c_char, flags: libc::c_int| {
        // SAFETY: `path` points to a NUL-terminated literal, `stx_p` to a live statx buffer.
        raw(unsafe {
            libc::syscall(
                libc::SYS_statx,
                dirfd,
                path,
                flags,
                libc::STATX_BASIC_STATS,
                stx_p,
            )
        })
    };
    if fstatat(fds[0], empty, libc::AT_EMPTY_PATH) != Ok(0) {
        return 3;
    }
    if fstatat(libc::AT_FDCWD, root, 0) != Err(libc::ENOSYS) {
        return 4;
    }
    if fstatat(libc::AT_FDCWD, root, libc::AT_EMPTY_PATH) != Ok(0) {
        return 5;
    }
    if statx(fds[0], empty, libc::AT_EMPTY_PATH) != Ok(0) {
        return 6;
    }
    if statx(libc::AT_FDCWD, root, 0) != Err(libc::ENOSYS) {
        return 7;
    }
    let mut sv = [0 as libc::c_int; 2];
    let sv_p = sv.as_mut_ptr();
    let pair = |family: libc::c_int| {
        // SAFETY: `sv_p` points to a live array of two c_ints; fds leak until _exit.
        raw(unsafe { libc::syscall(libc::SYS_socketpair, family, libc::SOCK_STREAM, 0, sv_p) })
    };
    if pair(libc::AF_UNIX) != Ok(0) {
        return 8;
    }
    if pair(libc::AF_INET) != Err(denied) {
        return 9;
    }
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1000,
    };
    // SAFETY: `ts` is a live timespec; the remaining-time pointer is null.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clock_nanosleep,
            libc::CLOCK_MONOTONIC,
            0,
            &ts,
            0usize,
        )
    };
    if r != 0 {
        return 10;
    }
    // SAFETY: getppid takes no arguments.
    let ppid = raw(unsafe { libc::syscall(libc::SYS_getppid) });
    // SAFETY: getpgrp takes no arguments.
    let pgrp = raw(unsafe { libc::syscall(libc::SYS_getpgrp) });
    if ppid.is_err() || pgrp.is_err() {
        return 11;
    }
    // SAFETY: signal 0 to our own pid only checks existence.
    if raw(unsafe { libc::syscall(libc::SYS_kill, libc::getpid(), 0) }) != Ok(0) {
        return 12;
    }
    // SAFETY: literal path; the call would fail with ENOENT if it ran.
    if raw(unsafe { libc::syscall(libc::SYS_mkdir, c"/nonexistent/sigma".as_ptr(), 0o700) })
        != Err(libc::ENOSYS)
    {
        return 13;
    }
    // SAFETY: literal path.
    if raw(unsafe { libc::syscall(libc::SYS_chdir, root) }) != Err(libc::ENOSYS) {
        return 14;
    }
    // SAFETY: setuid to our own uid: a no-op had it run.
    if raw(unsafe { libc::syscall(libc::SYS_setuid, libc::getuid()) }) != Err(denied) {
        return 15;
    }
    0
}

fn run_in_child(checks: &[&str], f: impl FnOnce() -> i32) {
    // SAFETY: the child only runs `f` (install and raw syscalls, no allocation) and then _exit,
    // so forking from the multi-threaded test harness is sound.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = f();
            // SAFETY: _exit ends the child without running the parent's atexit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
            WaitStatus::Exited(_, 0) => {}
            WaitStatus::Exited(_, code) => panic!(
                "check {code} failed in the filtered child: {}",
                checks.get(code as usize).unwrap_or(&"unknown")
            ),
            other => panic!("filtered child ended with {other:?}"),
        },
    }
}

#[test]
fn sigmaos_additions_in_forked_child() {
    // Kernel default EPERM: the notify rules for newfstatat/statx are explicit, emitted under the
    // complement of the AT_EMPTY_PATH condition next to the conditional allow.
    let mut quiet = policies::load("sigmaos").unwrap();
    quiet.set_logs_denied(false);
    let compiled = quiet.filter_spec().compile().unwrap();
    run_in_child(ADDITION_CHECKS, || addition_checks(&compiled, libc::EPERM));
    // Kernel default Notify (log = true, --audit): only the conditional allows are emitted.
    let mut logging = policies::load("sigmaos").unwrap();
    logging.set_logs_denied(true);
    let compiled = logging.filter_spec().compile().unwrap();
    run_in_child(ADDITION_CHECKS, || addition_checks(&compiled, libc::ENOSYS));
}

const INFALLIBLE_CHECKS: &[&str] = &[
    "ok",
    "install failed",
    "pipe2 failed",
    "umask refused",
    "times refused",
    "alarm refused",
    "getrusage refused",
    "getpgid/getsid/getgroups refused",
    "getppid/getpgrp/getpriority refused",
    "ioctl(TIOCSTI) was not refused with EPERM",
    "ioctl(TIOCSTI | upper bits) was not refused with EPERM",
    "ioctl(TIOCLINUX) was not refused with EPERM",
    "ioctl(TCGETS) on a pipe did not reach the kernel (ENOTTY)",
];

/// Calls glibc treats as infallible must work, and TIOCSTI/TIOCLINUX must fail, under the filter.
/// The ioctls go to a pipe: had the filter let them through, the kernel would say ENOTTY and
/// inject nothing.
fn infallible_checks(filter: &CompiledFilter) -> i32 {
    if filter.install().is_err() {
        return 1;
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a live array of two c_ints on our stack.
    if raw(unsafe { libc::syscall(libc::SYS_pipe2, fds.as_mut_ptr(), libc::O_CLOEXEC) }).is_err() {
        return 2;
    }
    // SAFETY: umask takes one integer; the old mask is restored below.
    let old = raw(unsafe { libc::syscall(libc::SYS_umask, 0o022) });
    let Ok(old) = old else { return 3 };
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_umask, old) };
    // SAFETY: an all-zero `tms`/`rusage` is a valid value of these plain C structs.
    let mut tms: libc::tms = unsafe { std::mem::zeroed() };
    // SAFETY: `tms` is a live struct on our stack.
    if raw(unsafe { libc::syscall(libc::SYS_times, &mut tms as *mut libc::tms) }).is_err() {
        return 4;
    }
    // SAFETY: alarm(0) cancels any alarm (there is none) and returns the seconds left.
    if raw(unsafe { libc::syscall(libc::SYS_alarm, 0) }) != Ok(0) {
        return 5;
    }
    // SAFETY: as for `tms`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live struct on our stack.
    if raw(unsafe { libc::syscall(libc::SYS_getrusage, libc::RUSAGE_SELF, &mut ru as *mut _) })
        .is_err()
    {
        return 6;
    }
    // SAFETY: integer arguments; getgroups(0, NULL) only counts.
    let ids = unsafe {
        [
            libc::syscall(libc::SYS_getpgid, 0),
            libc::syscall(libc::SYS_getsid, 0),
            libc::syscall(libc::SYS_getgroups, 0, 0usize),
        ]
    };
    if ids.iter().any(|&r| raw(r).is_err()) {
        return 7;
    }
    // SAFETY: integer arguments only.
    let q = unsafe {
        [
            libc::syscall(libc::SYS_getppid),
            libc::syscall(libc::SYS_getpgrp),
            libc::syscall(libc::SYS_getpriority, libc::PRIO_PROCESS, 0),
        ]
    };
    if q.iter().any(|&r| raw(r).is_err()) {
        return 8;
    }
    let c = b'x';
    let ioctl = |req: u64| {
        // SAFETY: the argument points to a live byte; the fd is our own pipe.
        raw(unsafe { libc::syscall(libc::SYS_ioctl, fds[0], req, &c as *const u8) })
    };
    if ioctl(libc::TIOCSTI) != Err(libc::EPERM) {
        return 9;
    }
    if ioctl(libc::TIOCSTI | 0xdead_0000_0000_0000) != Err(libc::EPERM) {
        return 10;
    }
    if ioctl(libc::TIOCLINUX) != Err(libc::EPERM) {
        return 11;
    }
    if ioctl(libc::TCGETS) != Err(libc::ENOTTY) {
        return 12;
    }
    0
}

#[test]
fn infallible_calls_work_and_tiocsti_is_refused_in_every_profile() {
    for name in policies::builtin_names() {
        for audit in [false, true] {
            let mut p = policies::load(name).unwrap();
            p.set_logs_denied(audit);
            let compiled = p.filter_spec().compile().unwrap();
            eprintln!("{name} (audit {audit})");
            run_in_child(INFALLIBLE_CHECKS, || infallible_checks(&compiled));
        }
    }
}

/// The real interpreter behind the pyenv shim (the shim is a shell script).
fn python() -> String {
    let out = Command::new("python3.11")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3.11 is required for this test (it runs CPython under the filter)");
    assert!(out.status.success(), "python3.11 failed: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

const PROGRAM: &str = r#"
import json, socket, subprocess, sys, threading
t = threading.Thread(target=lambda: json.dumps([1])); t.start(); t.join()
r = subprocess.run([sys.executable, "-c",
    "import threading; t = threading.Thread(target=print, args=('hi',)); t.start(); t.join()"],
    capture_output=True)
assert r.returncode == 0 and r.stdout == b"hi\n", r
try:
    socket.socket()
    print("socket allowed")
except PermissionError:
    print("socket EPERM")
import asyncio, os, pathlib, shutil, tempfile, time
d = tempfile.mkdtemp()
p = pathlib.Path(d, "a.txt"); p.write_text("x")
os.mkdir(os.path.join(d, "sub"))
shutil.copy(p, os.path.join(d, "sub", "b.txt"))
os.replace(p, os.path.join(d, "c.txt"))
with open(os.path.join(d, "c.txt"), "r+") as f: f.truncate(0)
pathlib.Path(d, "c.txt").unlink()
r = subprocess.run([sys.executable, "-c", "import os; print(os.getcwd())"], cwd=d,
    capture_output=True)
assert r.returncode == 0 and r.stdout.decode().strip() == d, r
shutil.rmtree(d)
assert not os.path.exists(d)
time.sleep(0.001)
async def main(): await asyncio.sleep(0.001); return 7
assert asyncio.run(main()) == 7
print(json.dumps({"ok": True}))
"#;

const AT_EMPTY_PATH: u64 = libc::AT_EMPTY_PATH as u64;

/// Run PROGRAM under `profile`, answering notifications as the supervisor would (path calls:
/// continue — this test has no path rules to enforce; denied calls: the profile's errno, noted).
/// Returns (stdout, path-call names seen, denied names seen).
fn run_python_supervised(profile: Profile) -> (String, BTreeSet<String>, BTreeSet<String>) {
    let compiled = profile.filter_spec().compile().unwrap();
    let (fd_r, fd_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (ack_r, ack_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (fd_w_raw, ack_r_raw) = (fd_w.as_raw_fd(), ack_r.as_raw_fd());

    let paths = Arc::new(Mutex::new(BTreeSet::new()));
    let denied = Arc::new(Mutex::new(BTreeSet::new()));
    let (paths2, denied2) = (paths.clone(), denied.clone());
    let profile2 = profile.clone();
    let supervisor = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        nix::unistd::read(&fd_r, &mut buf).unwrap();
        let pid = i32::from_ne_bytes(buf[..4].try_into().unwrap());
        let remote = i32::from_ne_bytes(buf[4..].try_into().unwrap());
        let listener = Listener::take_from(pid, remote).unwrap();
        nix::unistd::write(&ack_w, b"k").unwrap();
        while let Some(n) = listener.recv_or_hup().unwrap() {
            let name = n.syscall_name().unwrap_or_else(|| n.syscall.to_string());
            let resp = match profile2.notification_kind(n.syscall) {
                Some(NotificationKind::Path) => {
                    let empty_path = (name == "newfstatat" && n.args[3] & AT_EMPTY_PATH != 0)
                        || (name == "statx" && n.args[2] & AT_EMPTY_PATH != 0);
                    if empty_path {
                        paths2
                            .lock()
                            .unwrap()
                            .insert(format!("{name}(AT_EMPTY_PATH)"));
                    }
                    paths2.lock().unwrap().insert(name);
                    Response::continue_unchecked()
                }
                Some(NotificationKind::Denied { errno }) => {
                    denied2.lock().unwrap().insert(name);
                    Response::Errno(errno)
                }
                None => panic!("notification for {name}, which the filter should not notify"),
            };
            // The target may have died meanwhile (Gone): nothing to answer then.
            let _ = listener.respond(n.id, resp);
        }
    });

    let mut cmd = Command::new(python());
    cmd.args(["-I", "-c", PROGRAM])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec; it only calls install (no
    // allocation), getpid, write and read on fds that stay open in the child.
    unsafe {
        cmd.pre_exec(move || {
            let pid = libc::getpid();
            let fd: OwnedFd = compiled.install().map_err(std::io::Error::from)?;
            let mut msg = [0u8; 8];
            msg[..4].copy_from_slice(&pid.to_ne_bytes());
            msg[4..].copy_from_slice(&fd.as_raw_fd().to_ne_bytes());
            if libc::write(fd_w_raw, msg.as_ptr().cast(), 8) != 8 {
                return Err(std::io::Error::last_os_error());
            }
            let mut ack = 0u8;
            if libc::read(ack_r_raw, (&mut ack as *mut u8).cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            // The listener fd is close-on-exec: only the supervisor's copy survives.
            std::mem::forget(fd);
            Ok(())
        });
    }
    let out = cmd.spawn().unwrap().wait_with_output().unwrap();
    drop((fd_w, ack_r));
    supervisor.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "python failed: {out:?}");
    let paths = paths.lock().unwrap().clone();
    let denied = denied.lock().unwrap().clone();
    (stdout, paths, denied)
}

#[test]
fn cpython_threads_and_subprocess_run_under_sigmaos() {
    // --audit: refusals notified so the test sees them.
    let mut profile = policies::load("sigmaos").unwrap();
    profile.set_logs_denied(true);
    let (stdout, paths, denied) = run_python_supervised(profile);
    assert_eq!(stdout, "socket EPERM\n{\"ok\": true}\n");
    eprintln!("path calls notified: {paths:?}\ndenied and logged: {denied:?}");
    // The supervisor saw the denied socket call and the interpreter's path lookups.
    assert!(denied.contains("socket"), "{denied:?}");
    for name in ["openat", "newfstatat", "execve"] {
        assert!(paths.contains(name), "{name} not notified: {paths:?}");
    }
    // The file, sleep and asyncio code of PROGRAM reaches nothing denied besides socket().
    assert_eq!(denied, BTreeSet::from(["socket".to_owned()]));
    // Its path-bearing file calls went to the supervisor.
    for name in [
        "mkdir", "rmdir", "unlink", "unlinkat", "rename", "chmod", "chdir",
    ] {
        assert!(paths.contains(name), "{name} not notified: {paths:?}");
    }
    // fstat of held fds stayed in the kernel.
    assert!(!paths.contains("newfstatat(AT_EMPTY_PATH)"), "{paths:?}");
    assert!(!paths.contains("statx(AT_EMPTY_PATH)"), "{paths:?}");
}

#[test]
fn cpython_under_permissive_denies_nothing() {
    let profile = policies::load("permissive").unwrap();
    let (stdout, paths, denied) = run_python_supervised(profile);
    assert_eq!(stdout, "socket allowed\n{\"ok\": true}\n");
    assert!(denied.is_empty(), "{denied:?}");
    assert!(paths.contains("openat"), "{paths:?}");
    assert!(paths.contains("unlinkat"), "{paths:?}");
    assert!(!paths.contains("newfstatat(AT_EMPTY_PATH)"), "{paths:?}");
}
