//! Filter and listener tests against the real kernel, each in a forked child.
mod common;

use common::{describe, errno, map_path_at_page_end, spawn, ChildIo, PG};
use nix::errno::Errno;
use sigma_notify::{
    Action, ArgCmp, CmpOp, FilterSpec, NotifyError, Response, SyscallRule, TargetMem,
};
use std::os::fd::AsFd;
use std::path::Path;

fn rule(name: &str, action: Action) -> SyscallRule {
    SyscallRule {
        name: name.into(),
        action,
        when: vec![],
    }
}

/// Allow everything; notify getppid, openat and getcwd; EPERM getpgid(4242).
fn test_filter() -> sigma_notify::CompiledFilter {
    FilterSpec {
        default: Action::Allow,
        rules: vec![
            rule("getppid", Action::Notify),
            rule("openat", Action::Notify),
            rule("getcwd", Action::Notify),
            SyscallRule {
                name: "getsid".into(),
                action: Action::Errno(libc::EPERM),
                when: vec![ArgCmp {
                    arg: 0,
                    op: CmpOp::MaskedEq(0xff00),
                    value: 0x4200,
                }],
            },
            SyscallRule {
                name: "getpriority".into(),
                action: Action::Errno(libc::EACCES),
                when: vec![ArgCmp {
                    arg: 0,
                    op: CmpOp::Ne,
                    value: libc::PRIO_PROCESS as u64,
                }],
            },
            SyscallRule {
                name: "getpgid".into(),
                action: Action::Errno(libc::EPERM),
                when: vec![ArgCmp {
                    arg: 0,
                    op: CmpOp::Eq,
                    value: 4242,
                }],
            },
        ],
    }
    .compile()
    .expect("compile test filter")
}

fn getppid_raw() -> (i64, i32) {
    // SAFETY: getppid takes no arguments.
    let r = unsafe { libc::syscall(libc::SYS_getppid) };
    (r, if r < 0 { errno() } else { 0 })
}

#[test]
fn unknown_syscall_name_is_an_error() {
    for name in ["no_such_call", "socketcall", ""] {
        let err = FilterSpec {
            default: Action::Allow,
            rules: vec![rule(name, Action::Notify)],
        }
        .compile()
        .unwrap_err();
        assert!(
            matches!(&err, NotifyError::UnknownSyscall { name: n } if n == name),
            "{name}: {err}"
        );
    }
}

#[test]
fn rule_with_the_default_action_is_accepted() {
    let f = FilterSpec {
        default: Action::Errno(libc::EPERM),
        rules: vec![
            rule("read", Action::Allow),
            rule("getppid", Action::Errno(libc::EPERM)),
        ],
    }
    .compile()
    .expect("compile");
    assert!(f.instructions().len() > 4);
    assert_eq!(f.to_bytes().len(), f.instructions().len() * 8);
}

fn continue_errno_value_child(io: &ChildIo) -> i32 {
    // Continued: the kernel runs the real getppid; the parent checks the value.
    let (r, _) = getppid_raw();
    if !io.send_u64(r as u64) {
        return 1;
    }
    let (r, _) = getppid_raw();
    if r != 4242 {
        return 2;
    }
    let (r, e) = getppid_raw();
    if r != -1 || e != libc::EACCES {
        return 3;
    }
    // SAFETY: getpgid with an integer argument; the filter answers EPERM for 4242.
    let r = unsafe { libc::getpgid(4242) };
    if r != -1 || errno() != libc::EPERM {
        return 4;
    }
    // SAFETY: getpgid(0) is our own group; allowed by the filter. Group and session may be 0
    // (a process started by the kernel without setsid), so the parent compares the values.
    if !io.send_u64(unsafe { libc::getpgid(0) } as u64) {
        return 5;
    }
    // SAFETY: getsid with integer arguments: 0x4242 & 0xff00 == 0x4200 → EPERM; 0x7f00_1142 (above pid_max) and 0
    // do not match the masked comparison and run (ESRCH / our session).
    unsafe {
        if libc::getsid(0x4242) != -1 || errno() != libc::EPERM {
            return 6;
        }
        if libc::getsid(0x7f00_1142) != -1 || errno() != libc::ESRCH {
            return 7;
        }
        if !io.send_u64(libc::getsid(0) as u64) {
            return 8;
        }
    }
    // SAFETY: getpriority with integer arguments: `which` != PRIO_PROCESS → EACCES.
    unsafe {
        if libc::getpriority(libc::PRIO_PGRP, 0) != -1 || errno() != libc::EACCES {
            return 9;
        }
        *libc::__errno_location() = 0;
        let r = libc::getpriority(libc::PRIO_PROCESS, 0);
        if r == -1 && errno() != 0 {
            return 10;
        }
    }
    0
}

#[test]
fn continue_errno_and_value_reach_the_child() {
    let filter = test_filter();
    let mut child = spawn(&filter, continue_errno_value_child);
    let l = &child.listener;
    l.set_sync_wakeup()
        .expect("SET_FLAGS(SYNC_WAKE_UP) works on this kernel");

    let n = l.recv().unwrap();
    assert_eq!(n.pid, child.pid as u32);
    assert_eq!(n.syscall_name().as_deref(), Some("getppid"));
    assert_eq!(n.arch, 0xc000_003e, "AUDIT_ARCH_X86_64");
    assert!(l.id_valid(n.id));
    l.respond(n.id, Response::continue_unchecked()).unwrap();
    assert!(!l.id_valid(n.id), "answered ids are no longer valid");
    assert_eq!(
        child.recv_u64(),
        Some(std::process::id() as u64),
        "continued getppid ran"
    );
    let l = &child.listener;

    let n = l.recv().unwrap();
    l.respond(n.id, Response::Value(4242)).unwrap();
    let n = l.recv().unwrap();
    l.respond(n.id, Response::Errno(libc::EACCES)).unwrap();
    // The child inherits our group and session; allowed calls return them unchanged.
    let ours = |v: i32| Some(v as i64 as u64);
    assert_eq!(
        child.recv_u64(),
        ours(nix::unistd::getpgid(None).unwrap().as_raw()),
        "getpgid(0)"
    );
    assert_eq!(
        child.recv_u64(),
        ours(nix::unistd::getsid(None).unwrap().as_raw()),
        "getsid(0)"
    );
    child.assert_success();
}

fn addfd_child(io: &ChildIo) -> i32 {
    // SAFETY: openat with a static NUL-terminated path; the supervisor answers with an fd.
    let fd = unsafe { libc::openat(libc::AT_FDCWD, c"/sigma/addfd".as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return 2;
    }
    let mut buf = [0u8; 5];
    // SAFETY: reading into a 5-byte stack buffer from the injected fd.
    if unsafe { libc::read(fd, buf.as_mut_ptr().cast(), 5) } != 5 || &buf != b"hello" {
        return 3;
    }
    // SAFETY: F_GETFD on an fd we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags & libc::FD_CLOEXEC == 0 {
        return 4;
    }
    if !io.send_u64(fd as u64) {
        return 5;
    }
    0
}

#[test]
fn addfd_send_injects_a_readable_fd() {
    let filter = test_filter();
    let mut child = spawn(&filter, addfd_child);
    let (r, w) = nix::unistd::pipe().unwrap();
    nix::unistd::write(&w, b"hello").unwrap();
    let n = child.listener.recv().unwrap();
    assert_eq!(n.syscall_name().as_deref(), Some("openat"));
    let mem = TargetMem::new(&child.listener, &n);
    assert_eq!(
        mem.read_path(n.args[1]).unwrap().as_bytes(),
        b"/sigma/addfd"
    );
    let newfd = child.listener.addfd_send(n.id, r.as_fd(), true).unwrap();
    assert!(newfd >= 0);
    assert_eq!(
        child.recv_u64(),
        Some(newfd as u64),
        "child saw the same fd number"
    );
    child.assert_success();
}

fn blocked_child(_io: &ChildIo) -> i32 {
    let _ = getppid_raw();
    0
}

#[test]
fn id_invalid_after_kill_then_listener_hangs_up() {
    let filter = test_filter();
    let mut child = spawn(&filter, blocked_child);
    let l = &child.listener;
    let n = l.recv().unwrap();
    assert!(l.id_valid(n.id));
    assert!(!l.poll_hup().unwrap());
    child.kill();
    let st = child.wait();
    assert!(libc::WIFSIGNALED(st), "{}", describe(st));
    let l = &child.listener;
    assert!(!l.id_valid(n.id));
    let err = l.respond(n.id, Response::Errno(libc::EPERM)).unwrap_err();
    assert!(
        matches!(err, NotifyError::Gone { id } if id == n.id),
        "{err}"
    );
    assert!(err.is_gone());
    let mem = TargetMem::new(l, &n);
    let mut b = [0u8; 1];
    assert_eq!(mem.read(n.ip, &mut b), Err(Errno::ENOENT));
    // The only target is gone and reaped: the listener hangs up.
    assert!(l.poll_hup().unwrap());
    assert!(l.recv_or_hup().unwrap().is_none());
    assert!(matches!(l.recv(), Err(NotifyError::NoTargets)));
}

/// mmap(3 pages): page 0 holds a path ending at its very last byte, page 1 is PROT_NONE,
/// page 2 is read-only. Sends the base address, then makes the openat calls listed in
/// `read_path_edges_and_errors`.
fn read_path_child(io: &ChildIo) -> i32 {
    let s = b"/edge/of/page\0";
    let Some(base) = map_path_at_page_end(3, s) else {
        return 2;
    };
    // SAFETY: page 0 is mapped read-write; this fills it up to the path (offsets < PG).
    unsafe { std::ptr::write_bytes(base, b'a', PG - s.len()) };
    // SAFETY: changing protection of pages 1 and 2 of our own mapping.
    unsafe {
        if libc::mprotect(base.add(PG).cast(), PG, libc::PROT_NONE) != 0
            || libc::mprotect(base.add(2 * PG).cast(), PG, libc::PROT_READ) != 0
        {
            return 3;
        }
    }
    if !io.send_u64(base as u64) {
        return 4;
    }
    let open = |p: *const u8| {
        // SAFETY: openat only passes the pointer on; the supervisor reads it.
        unsafe { libc::openat(libc::AT_FDCWD, p.cast(), libc::O_RDONLY) }
    };
    // 1. string ending exactly before the PROT_NONE page.
    // SAFETY: pointer arithmetic inside our mapping.
    if open(unsafe { base.add(PG - s.len()) }) != -1 || errno() != libc::ENOENT {
        return 5;
    }
    // 2. no NUL before the PROT_NONE page → EFAULT.
    // SAFETY: the last byte of page 0 is ours to overwrite.
    unsafe { *base.add(PG - 1) = b'x' };
    // SAFETY: pointer arithmetic inside our mapping.
    if open(unsafe { base.add(PG - 3) }) != -1 || errno() != libc::EFAULT {
        return 6;
    }
    // 3. pointer into the PROT_NONE page, 4. a wild pointer.
    // SAFETY: pointer arithmetic inside our mapping.
    if open(unsafe { base.add(PG) }) != -1 || errno() != libc::EFAULT {
        return 7;
    }
    if open(8 as *const u8) != -1 || errno() != libc::EFAULT {
        return 8;
    }
    // 5. 4096 bytes with no NUL → ENAMETOOLONG. Page 0 is all 'a' up to the path; put a NUL
    // after 4200 'a's: make page 1 readable again for that.
    // SAFETY: our own mapping; then writes within pages 0..2.
    unsafe {
        if libc::mprotect(base.add(PG).cast(), PG, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            return 9;
        }
        std::ptr::write_bytes(base, b'a', 2 * PG);
        *base.add(4200) = 0;
    }
    if open(base) != -1 || errno() != libc::ENAMETOOLONG {
        return 10;
    }
    // 6. exactly PATH_MAX-1 characters + NUL is fine.
    // SAFETY: within page 0..1 of our mapping.
    unsafe { *base.add(4095) = 0 };
    if open(base) != -1 || errno() != libc::ENOENT {
        return 11;
    }
    // 7. getcwd(buf, 64) into page 0: the supervisor writes "/sigma/cwd\0" and returns 11.
    // SAFETY: getcwd gets a writable 64-byte region of our mapping; the supervisor fills it.
    let r = unsafe { libc::syscall(libc::SYS_getcwd, base, 64) };
    // SAFETY: reading bytes of our mapping.
    let got = unsafe { std::slice::from_raw_parts(base, 11) };
    if r != 11 || got != b"/sigma/cwd\0" {
        return 12;
    }
    // 8. getcwd into the read-only page: the write fails, the supervisor answers EFAULT.
    // SAFETY: as above; page 2 is read-only so the supervisor's write must fail.
    let r = unsafe { libc::syscall(libc::SYS_getcwd, base.add(2 * PG), 64) };
    if r != -1 || errno() != libc::EFAULT {
        return 13;
    }
    0
}

#[test]
fn read_path_edges_and_errors_and_writes() {
    let filter = test_filter();
    let mut child = spawn(&filter, read_path_child);
    let base = child.recv_u64().expect("child mapped its pages");
    let l = &child.listener;
    let answer = |expect: Result<&[u8], Errno>| {
        let n = l.recv().unwrap();
        assert_eq!(n.syscall_name().as_deref(), Some("openat"));
        let got = TargetMem::new(l, &n).read_path(n.args[1]);
        assert_eq!(
            got.as_ref().map(|c| c.as_bytes()),
            expect.as_ref().map(|b| *b)
        );
        let errno = match got {
            Ok(_) => libc::ENOENT,
            Err(e) => e as i32,
        };
        l.respond(n.id, Response::Errno(errno)).unwrap();
    };
    answer(Ok(b"/edge/of/page"));
    answer(Err(Errno::EFAULT));
    answer(Err(Errno::EFAULT));
    answer(Err(Errno::EFAULT));
    answer(Err(Errno::ENAMETOOLONG));
    let long = vec![b'a'; 4095];
    answer(Ok(&long));

    let n = l.recv().unwrap();
    assert_eq!(n.syscall_name().as_deref(), Some("getcwd"));
    assert_eq!(n.args[0], base);
    TargetMem::new(l, &n)
        .write(n.args[0], b"/sigma/cwd\0")
        .unwrap();
    let mut back = [0u8; 11];
    TargetMem::new(l, &n).read(n.args[0], &mut back).unwrap();
    assert_eq!(&back, b"/sigma/cwd\0");
    l.respond(n.id, Response::Value(11)).unwrap();

    let n = l.recv().unwrap();
    assert_eq!(n.args[0], base + 2 * 4096);
    let err = TargetMem::new(l, &n).write(n.args[0], b"/x\0").unwrap_err();
    assert_eq!(err, Errno::EFAULT);
    l.respond(n.id, Response::Errno(err as i32)).unwrap();
    child.assert_success();
}

fn path_child(io: &ChildIo) -> i32 {
    // The parent sends a word once it has created the directory.
    let Some(_) = io.recv_u64() else { return 2 };
    let dir = c"/tmp/sigma-notify-path/sub";
    // SAFETY: chdir with a static NUL-terminated path.
    if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
        return 3;
    }
    // dirfd on /usr (O_DIRECTORY) and a regular-file fd. open (not openat) is the raw
    // syscall `open`, which the filter allows.
    // SAFETY: open(2) with static paths.
    let usr = unsafe {
        libc::syscall(
            libc::SYS_open,
            c"/usr".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
    } as i32;
    // SAFETY: as above.
    let file =
        unsafe { libc::syscall(libc::SYS_open, c"/etc/passwd".as_ptr(), libc::O_RDONLY) } as i32;
    if usr < 0 || file < 0 {
        return 4;
    }
    let openat = |dfd: i32, p: &std::ffi::CStr| {
        // SAFETY: openat with a static NUL-terminated path; the supervisor answers.
        unsafe { libc::openat(dfd, p.as_ptr(), libc::O_RDONLY) }
    };
    openat(libc::AT_FDCWD, c"a/./b/../c");
    openat(usr, c"lib//../bin/");
    openat(usr, c"/etc/hosts");
    openat(file, c"x");
    openat(987, c"x");
    openat(libc::AT_FDCWD, c"../../../..");
    0
}

#[test]
fn path_resolution_as_the_child_sees_it() {
    let dir = Path::new("/tmp/sigma-notify-path/sub");
    std::fs::create_dir_all(dir).unwrap();
    let filter = test_filter();
    let mut child = spawn(&filter, path_child);
    child.send_u64(1);
    let l = &child.listener;
    let resolve = || {
        let n = l.recv().unwrap();
        let p = TargetMem::new(l, &n).read_path(n.args[1]).unwrap();
        let r = sigma_notify::path::absolute(n.pid, n.args[0] as i32, &p);
        assert_eq!(
            sigma_notify::path::cwd(n.pid),
            Ok(dir.to_path_buf()),
            "the child's cwd"
        );
        // The fd helpers agree with the path helpers.
        if let Ok(fd) = sigma_notify::path::open_dirfd(n.pid, n.args[0] as i32) {
            assert!(r.is_err() || p.to_bytes().starts_with(b"/") || fd_is_dir(&fd));
        }
        l.respond(n.id, Response::Errno(libc::ENOENT)).unwrap();
        r
    };
    assert_eq!(resolve(), Ok(dir.join("a/c")));
    assert_eq!(resolve(), Ok("/usr/bin".into()));
    assert_eq!(resolve(), Ok("/etc/hosts".into()));
    assert_eq!(resolve(), Err(Errno::ENOTDIR));
    assert_eq!(resolve(), Err(Errno::EBADF));
    assert_eq!(resolve(), Ok("/".into()));
    child.assert_success();
}

fn fd_is_dir(fd: &std::os::fd::OwnedFd) -> bool {
    nix::sys::stat::fstat(fd)
        .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
        .unwrap_or(false)
}

fn x32_child(_io: &ChildIo) -> i32 {
    // x32 ABI getppid: syscall number with __X32_SYSCALL_BIT set.
    // SAFETY: a syscall with no arguments; the filter must kill us before it runs.
    unsafe { libc::syscall(0x4000_0000 + libc::SYS_getppid) };
    0
}

#[cfg(target_arch = "x86_64")]
fn i386_child(_io: &ChildIo) -> i32 {
    let ret: i64;
    // SAFETY: `int 0x80` with eax = 64 (i386 getppid) takes no memory arguments and
    // clobbers only rax (and r8-r11 on some kernels, declared).
    unsafe {
        std::arch::asm!("int 0x80", inlateout("rax") 64i64 => ret,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _);
    }
    let _ = ret;
    0
}

#[test]
fn foreign_arch_calls_kill_the_process() {
    let filter = test_filter();
    let st = spawn(&filter, x32_child).wait();
    assert!(
        libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
        "x32 call: {}",
        describe(st)
    );
    #[cfg(target_arch = "x86_64")]
    {
        let st = spawn(&filter, i386_child).wait();
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGSYS,
            "i386 call: {}",
            describe(st)
        );
    }
}

#[test]
fn listener_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<sigma_notify::Listener>();
}

#[test]
fn respond_from_other_threads_while_receiving() {
    let filter = test_filter();
    let mut child = spawn(&filter, |_io| {
        for i in 0..50 {
            if getppid_raw().0 != 1000 + i {
                return 2;
            }
        }
        0
    });
    let l = &child.listener;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            for n in rx {
                let n: sigma_notify::Notification = n;
                l.respond(n.id, Response::Value(1000 + n.args[5] as i64))
                    .unwrap();
            }
        });
        for i in 0..50u64 {
            let mut n = l.recv().unwrap();
            n.args[5] = i; // carry the sequence number to the responder
            tx.send(n).unwrap();
        }
        drop(tx);
    });
    child.assert_success();
}
