use super::*;
use notify::{Action, CmpOp};
use std::path::{Path, PathBuf};

/// Table 3.1 of the σPy thesis ("Allowed System Calls in proc Execution Environment"), in the
/// table's order.
const TABLE_3_1: [&str; 73] = [
    "readlink",
    "readv",
    "getcwd",
    "uname",
    "gettid",
    "stat", //
    "tgkill",
    "write",
    "writev", //
    "sync",
    "timer_create",
    "timer_delete",
    "timer_settime", //
    "setsockopt",
    "set_robust_list",
    "set_tid_address",
    "sigaltstack", //
    "sched_yield",
    "sendto",
    "sendmsg",
    "setitimer", //
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sched_getaffinity", //
    "readlinkat",
    "recvfrom",
    "recvmsg",
    "restart_syscall", //
    "pipe2",
    "pread64",
    "prlimit64",
    "read", //
    "nanosleep",
    "newfstatat",
    "openat",
    "open", //
    "mmap",
    "mremap",
    "mprotect",
    "munmap", //
    "getsockopt",
    "lseek",
    "madvise",
    "mkdirat", //
    "getpid",
    "getrandom",
    "getrlimit",
    "getsockname", //
    "fsync",
    "futex",
    "getdents64",
    "getpeername", //
    "exit",
    "exit_group",
    "fcntl",
    "fstat", //
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "execve", //
    "brk",
    "close",
    "epoll_create1",
    "epoll_ctl", //
    "membarrier",
    "accept4",
    "access",
    "arch_prctl", //
    "ioctl",
    "poll",
    "lstat",
    "clock_gettime", //
];

const PATH_CALLS: [&str; 37] = [
    "open",
    "openat",
    "stat",
    "lstat",
    "newfstatat",
    "access",
    "readlink",
    "readlinkat",
    "execve",
    "mkdirat",
    "statx",
    "faccessat2",
    "openat2",
    "execveat",
    "mkdir",
    "rmdir",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "renameat2",
    "chmod",
    "chdir",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "utimensat",
    "truncate",
    "statfs",
    "mknodat",
    "mknod",
    "fchmodat",
    "chown",
    "lchown",
    "fchownat",
    "creat",
];

/// Local socket calls `sigmaos` decides by the socket's path (not notified under permissive,
/// which lets every socket through).
const SOCKET_PATH_CALLS: [&str; 2] = ["bind", "connect"];

/// Path calls that also have a conditional allow for AT_EMPTY_PATH (fstat of a held fd), with the
/// index of their flags argument.
const EMPTY_PATH_ALLOWED: [(&str, u32); 2] = [("newfstatat", 3), ("statx", 2)];

/// Calls glibc (and CPython on top of it) treats as infallible, or whose refusal reads as a
/// value rather than an error: no profile may refuse them.
const INFALLIBLE: &[&str] = &[
    "getpid",
    "getppid",
    "gettid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getpgrp",
    "getpgid",
    "getsid",
    "getgroups",
    "getrusage",
    "getitimer",
    "getpriority",
    "getrlimit",
    "getcwd",
    "umask",
    "times",
    "alarm",
    "pause",
    "sysinfo",
    "sched_yield",
    "uname",
];

/// Additions of `sigmaos` beyond Table 3.1 for everyday programs, allowed unconditionally.
const EVERYDAY_ALLOWED: &[&str] = &[
    "pwrite64",
    "pwritev",
    "preadv",
    "pwritev2",
    "preadv2",
    "splice",
    "pidfd_open",
    "fchmod",
    "fchown",
    "fdatasync",
    "msync",
    "flock",
    "fallocate",
    "copy_file_range",
    "fstatfs",
    "eventfd2",
    "memfd_create",
    "pselect6",
    "select",
    "ppoll",
    "alarm",
    "getitimer",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigsuspend",
    "pause",
    "kill",
    "tkill",
    "pidfd_send_signal",
    "setsid",
    "setpgid",
    "umask",
    "times",
    "getrusage",
    "getpgid",
    "getsid",
    "getgroups",
    "getresuid",
    "getresgid",
    "getpriority",
];

const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;

fn at_empty_path(arg: u32, set: bool) -> notify::ArgCmp {
    let bit = libc::AT_EMPTY_PATH as u64;
    notify::ArgCmp {
        arg,
        op: CmpOp::MaskedEq(bit),
        value: if set { bit } else { 0 },
    }
}

fn sigmaos() -> Profile {
    load("sigmaos").unwrap_or_else(|e| panic!("{e}"))
}

fn entry<'a>(p: &'a Profile, name: &str) -> &'a SyscallEntry {
    p.syscalls()
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no entry for {name}"))
}

fn holds(c: &notify::ArgCmp, args: &[u64; 6]) -> bool {
    let a = args[c.arg as usize];
    match c.op {
        CmpOp::Eq => a == c.value,
        CmpOp::Ne => a != c.value,
        CmpOp::MaskedEq(m) => a & m == c.value,
    }
}

/// What a compiled spec does with one call, evaluated the way the kernel filter does: the
/// matching rule's action (rules for one syscall are disjoint or the same action), else the
/// default. Panics if two matching rules disagree.
fn kernel_action(spec: &notify::FilterSpec, name: &str, args: [u64; 6]) -> Action {
    let mut hit: Option<Action> = None;
    for r in spec.rules.iter().filter(|r| r.name == name) {
        if r.when.iter().all(|c| holds(c, &args)) {
            if let Some(h) = hit {
                assert_eq!(h, r.action, "{name} {args:?}: overlapping rules disagree");
            }
            hit = Some(r.action);
        }
    }
    hit.unwrap_or(spec.default)
}

fn builtins() -> Vec<Profile> {
    builtin_names()
        .map(|n| load(n).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

#[test]
fn builtins_load_and_compile() {
    let names: Vec<_> = builtin_names().collect();
    assert_eq!(
        names,
        [
            "sigmaos",
            "sigmaos-nodialproxy",
            "sigmaos-strict",
            "permissive"
        ]
    );
    for mut p in builtins() {
        for audit in [false, true] {
            p.set_logs_denied(audit);
            let spec = p.filter_spec();
            let compiled = spec
                .compile()
                .unwrap_or_else(|e| panic!("{} does not compile: {e}", p.name()));
            assert!(!compiled.instructions().is_empty());
        }
    }
    assert_eq!(DEFAULT_PROFILE, "sigmaos");
}

#[test]
fn table_3_1_profiles_contain_all_of_it_and_nothing_else_claims_it() {
    let mut unique = TABLE_3_1.to_vec();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 73, "the paper's table has 73 distinct names");

    for p in [sigmaos(), load("sigmaos-strict").unwrap()] {
        for name in TABLE_3_1 {
            let e = entry(&p, name);
            assert_eq!(e.origin, Some(Origin::Table31), "{name}");
            assert!(
                matches!(e.action, SyscallAction::Allow | SyscallAction::Notify),
                "{name} from Table 3.1 is {:?}",
                e.action
            );
            assert!(e.when.is_empty(), "{name} is conditional");
        }
        let marked: Vec<_> = p
            .syscalls()
            .iter()
            .filter(|e| e.origin == Some(Origin::Table31))
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(marked.len(), 73);
        for name in marked {
            assert!(TABLE_3_1.contains(&name), "{name} marked table-3.1");
        }
        // Every entry says where it comes from.
        assert!(p.syscalls().iter().all(|e| e.origin.is_some()));
    }
}

#[test]
fn strict_is_table_3_1_plus_cpython_start_and_infallible_calls() {
    let strict = load("sigmaos-strict").unwrap();
    let start = [
        "clone",
        "clone3",
        "vfork",
        "wait4",
        "rseq",
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "sysinfo",
        "close_range",
    ];
    for e in strict.syscalls() {
        let n = e.name.as_str();
        let ok = TABLE_3_1.contains(&n)
            || start.contains(&n)
            || INFALLIBLE.contains(&n)
            // ioctl's TIOCSTI/TIOCLINUX refusals and fstat(fd) decided in the kernel.
            || (n == "ioctl" && e.action == SyscallAction::Errno(libc::EPERM))
            || (n == "newfstatat" && e.when == [at_empty_path(3, true)]);
        assert!(ok, "sigmaos-strict has {n} ({:?})", e.action);
    }
    // What sigmaos adds for everyday programs is refused here, in the kernel.
    let spec = strict.filter_spec();
    assert_eq!(spec.default, Action::Errno(libc::EPERM));
    for name in ["pwrite64", "flock", "kill", "link", "utimensat", "socket"] {
        assert_eq!(
            kernel_action(&spec, name, [0; 6]),
            Action::Errno(libc::EPERM),
            "{name}"
        );
    }
}

#[test]
fn infallible_glibc_calls_are_never_refused() {
    for mut p in builtins() {
        for audit in [false, true] {
            p.set_logs_denied(audit);
            let spec = p.filter_spec();
            for name in INFALLIBLE {
                // Whatever the arguments (these take none that matter to a filter).
                for args in [[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]] {
                    assert_eq!(
                        kernel_action(&spec, name, args),
                        Action::Allow,
                        "{} (audit {audit}) refuses or notifies {name}",
                        p.name()
                    );
                }
            }
        }
    }
}

#[test]
fn every_profile_refuses_tiocsti_and_tioclinux_by_argument() {
    for mut p in builtins() {
        for audit in [false, true] {
            p.set_logs_denied(audit);
            let spec = p.filter_spec();
            let ioctl = |req: u64| kernel_action(&spec, "ioctl", [0, req, 0, 0, 0, 0]);
            let name = p.name().to_owned();
            for req in [TIOCSTI, TIOCLINUX] {
                assert_eq!(ioctl(req), Action::Errno(libc::EPERM), "{name} {req:#x}");
                // The kernel reads the request as 32 bits: garbage above does not help.
                assert_eq!(
                    ioctl(req | 0xdead_0000_0000_0000),
                    Action::Errno(libc::EPERM),
                    "{name} {req:#x} with upper bits"
                );
            }
            // Everything else is allowed: terminal queries, FIONREAD, a sign-extended request,
            // neighbours of the refused values.
            for req in [
                libc::TCGETS,
                libc::TIOCGWINSZ,
                libc::FIONREAD,
                libc::FIOCLEX,
                0xffff_ffff_802c_542a,
                TIOCSTI - 1,
                TIOCSTI + 1,
                TIOCLINUX ^ 0x8000_0000,
                0,
            ] {
                assert_eq!(ioctl(req), Action::Allow, "{name} {req:#x}");
            }
        }
    }
}

#[test]
fn complement_of_a_value_set_matches_exactly_the_other_values() {
    use crate::profile::complement_all;
    let c = |value| notify::ArgCmp {
        arg: 1,
        op: CmpOp::MaskedEq(0xFFFF_FFFF),
        value,
    };
    let pats = complement_all(&[c(TIOCSTI), c(TIOCLINUX)]).unwrap();
    assert!(pats.len() <= 64, "{}", pats.len());
    let matches = |x: u64| {
        pats.iter()
            .filter(|p| holds(p, &[0, x, 0, 0, 0, 0]))
            .count()
    };
    for x in (0..0x1_0000u64).chain([0xffff_ffff, 0x1_0000_5412, 0x8000_5412, u64::MAX]) {
        let excluded = [TIOCSTI, TIOCLINUX].contains(&(x & 0xFFFF_FFFF));
        assert_eq!(matches(x), usize::from(!excluded), "{x:#x}");
    }
    // A single-bit mask keeps its one-comparison complement.
    let bit = at_empty_path(3, true);
    assert_eq!(complement_all(&[bit]).unwrap(), [at_empty_path(3, false)]);
    // Different masks or ops: no complement.
    let other = notify::ArgCmp {
        arg: 1,
        op: CmpOp::MaskedEq(0xFF),
        value: 1,
    };
    assert_eq!(complement_all(&[c(TIOCSTI), other]), None);
    let eq = notify::ArgCmp {
        arg: 1,
        op: CmpOp::Eq,
        value: 1,
    };
    assert_eq!(complement_all(&[eq, eq]), None);
}

#[test]
fn sigmaos_refuses_in_the_kernel_and_audit_brings_the_log_back() {
    let mut p = sigmaos();
    assert_eq!(p.denied_errno(), Some(libc::EPERM));
    assert!(!p.logs_denied(), "refusals cost nothing by default");
    let spec = p.filter_spec();
    assert_eq!(spec.default, Action::Errno(libc::EPERM));
    assert_eq!(
        kernel_action(&spec, "socket", [2, 1, 0, 0, 0, 0]),
        Action::Errno(libc::EPERM)
    );
    p.set_logs_denied(true);
    assert!(p.logs_denied());
    assert_eq!(p.filter_spec().default, Action::Notify);
}

#[test]
fn sigmaos_filter_spec_allows_or_notifies_table_3_1() {
    let mut p = sigmaos();
    // fchdir has no path: notified so path resolution knows a cwd changed.
    let mut want: Vec<String> = PATH_CALLS
        .iter()
        .chain(&SOCKET_PATH_CALLS)
        .chain(&["fchdir"])
        .map(|s| s.to_string())
        .collect();
    want.sort();
    let mut n = p.notified_syscalls();
    n.sort();
    n.dedup();
    assert_eq!(n, want);
    for audit in [false, true] {
        p.set_logs_denied(audit);
        let spec = p.filter_spec();
        for name in TABLE_3_1 {
            let want = if PATH_CALLS.contains(&name) {
                Action::Notify
            } else {
                Action::Allow
            };
            // A path (a pointer, not the empty-path flag) and ordinary arguments.
            assert_eq!(
                kernel_action(&spec, name, [3, 0x7fff_0000, 0, 0, 0, 0]),
                want,
                "{name} (audit {audit})"
            );
        }
        for name in PATH_CALLS {
            assert_eq!(
                kernel_action(&spec, name, [3, 0x7fff_0000, 0x41, 0, 0, 0]),
                Action::Notify,
                "{name} (audit {audit})"
            );
        }
        if !audit {
            // Explicit notify rules, unconditional where nothing else applies to the call.
            for name in PATH_CALLS {
                let r = spec
                    .rules
                    .iter()
                    .find(|r| r.name == name && r.action == Action::Notify)
                    .unwrap_or_else(|| panic!("no notify rule for {name}"));
                match EMPTY_PATH_ALLOWED.iter().find(|(n, _)| *n == name) {
                    Some((_, arg)) => assert_eq!(r.when, [at_empty_path(*arg, false)], "{name}"),
                    None if name == "utimensat" => assert_eq!(r.when[0].op, CmpOp::Ne),
                    None => assert!(r.when.is_empty(), "{name}"),
                }
            }
        }
        spec.compile().unwrap();
    }
}

#[test]
fn sigmaos_allows_fstat_by_empty_path_in_the_kernel() {
    let p = sigmaos();
    let nr = |n: &str| i32::from(libseccomp::ScmpSyscall::from_name(n).unwrap());
    for (name, arg) in EMPTY_PATH_ALLOWED {
        let entries: Vec<_> = p.syscalls().iter().filter(|e| e.name == name).collect();
        assert_eq!(entries.len(), 2, "{name}");
        assert!(entries[0].when.is_empty());
        assert_eq!(entries[0].action, SyscallAction::Notify, "{name}");
        assert_eq!(entries[1].action, SyscallAction::Allow, "{name}");
        assert_eq!(entries[1].when, [at_empty_path(arg, true)], "{name}");
        assert_eq!(entries[1].origin, Some(Origin::Addition), "{name}");
        // Still a path call for the supervisor when it is notified.
        assert_eq!(p.notification_kind(nr(name)), Some(NotificationKind::Path));
        let mut args = [3, 0x7fff_0000, 0, 0, 0, 0];
        args[arg as usize] = libc::AT_EMPTY_PATH as u64;
        for audit in [false, true] {
            let mut q = p.clone();
            q.set_logs_denied(audit);
            let spec = q.filter_spec();
            assert_eq!(kernel_action(&spec, name, args), Action::Allow, "{name}");
        }
        // Logging: the kernel default is Notify, so the notify entry is the default and only
        // the conditional allow is emitted.
        let mut q = p.clone();
        q.set_logs_denied(true);
        let spec = q.filter_spec();
        let rules: Vec<_> = spec.rules.iter().filter(|r| r.name == name).collect();
        assert_eq!(rules.len(), 1, "{name}: {rules:?}");
        assert_eq!(rules[0].action, Action::Allow);
        assert_eq!(rules[0].when, [at_empty_path(arg, true)]);
    }
    // futimens(fd) is utimensat(fd, NULL, ...): allowed in the kernel.
    let spec = p.filter_spec();
    assert_eq!(
        kernel_action(&spec, "utimensat", [3, 0, 0, 0, 0, 0]),
        Action::Allow
    );
    // notified_syscalls lists each name once.
    let n = p.notified_syscalls();
    assert_eq!(n.iter().filter(|s| *s == "newfstatat").count(), 1);
}

#[test]
fn sigmaos_additions_for_glibc_cpython() {
    let p = sigmaos();
    let clone = entry(&p, "clone");
    assert_eq!(clone.action, SyscallAction::Allow);
    assert_eq!(clone.origin, Some(Origin::Addition));
    let ns = libc::CLONE_NEWNS
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWCGROUP;
    assert_eq!(
        clone.when,
        [notify::ArgCmp {
            arg: 0,
            op: CmpOp::MaskedEq(ns as u64),
            value: 0
        }]
    );
    assert_eq!(
        entry(&p, "clone3").action,
        SyscallAction::Errno(libc::ENOSYS)
    );
    assert_eq!(entry(&p, "rseq").action, SyscallAction::Errno(libc::ENOSYS));
    for name in [
        "vfork",
        "wait4",
        "dup",
        "dup2",
        "dup3",
        "close_range",
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "sysinfo",
    ] {
        let e = entry(&p, name);
        assert_eq!(e.action, SyscallAction::Allow, "{name}");
        assert_eq!(e.origin, Some(Origin::Addition), "{name}");
        assert!(!TABLE_3_1.contains(&name));
    }
    assert_eq!(entry(&p, "execveat").action, SyscallAction::Notify);
}

#[test]
fn sigmaos_additions_for_ordinary_programs() {
    let p = sigmaos();
    let spec = p.filter_spec();
    for name in [
        "ftruncate",
        "sendfile",
        "clock_nanosleep",
        "epoll_wait",
        "getppid",
        "getpgrp",
    ]
    .iter()
    .chain(EVERYDAY_ALLOWED)
    {
        let e = entry(&p, name);
        assert_eq!(e.action, SyscallAction::Allow, "{name}");
        assert!(e.when.is_empty(), "{name}");
        assert_eq!(e.origin, Some(Origin::Addition), "{name}");
        assert!(!TABLE_3_1.contains(name));
        assert!(e.reason.len() > 20, "{name} says why");
        assert_eq!(kernel_action(&spec, name, [0; 6]), Action::Allow, "{name}");
    }
    for name in PATH_CALLS.iter().filter(|n| !TABLE_3_1.contains(n)) {
        let e = entry(&p, name);
        assert_eq!(e.action, SyscallAction::Notify, "{name}");
        assert_eq!(e.origin, Some(Origin::Addition), "{name}");
    }
    // Changes the cwd by fd: notified (always continued) so path resolution knows.
    let e = entry(&p, "fchdir");
    assert_eq!(e.action, SyscallAction::Notify);
    assert_eq!(e.origin, Some(Origin::Addition));
    // Extended attributes: "not supported", in the kernel (shutil tolerates it).
    for name in [
        "getxattr",
        "lgetxattr",
        "fgetxattr",
        "listxattr",
        "llistxattr",
        "flistxattr",
        "setxattr",
        "lsetxattr",
        "fsetxattr",
        "removexattr",
        "lremovexattr",
        "fremovexattr",
    ] {
        assert_eq!(
            kernel_action(&spec, name, [0; 6]),
            Action::Errno(libc::ENOTSUP),
            "{name}"
        );
    }
    // setreuid/setregid: only the no-op (-1, -1), as 32-bit ids.
    for name in ["setreuid", "setregid"] {
        let m1 = 0xFFFF_FFFF;
        assert_eq!(
            kernel_action(&spec, name, [m1, m1, 0, 0, 0, 0]),
            Action::Allow
        );
        assert_eq!(
            kernel_action(&spec, name, [u64::MAX, u64::MAX, 0, 0, 0, 0]),
            Action::Allow
        );
        for args in [
            [0, m1, 0, 0, 0, 0],
            [m1, 0, 0, 0, 0, 0],
            [1000, 1000, 0, 0, 0, 0],
        ] {
            assert_eq!(
                kernel_action(&spec, name, args),
                Action::Errno(libc::EPERM),
                "{name} {args:?}"
            );
        }
    }
    // setpriority: the caller itself, nicer only.
    let prio = |which: u64, who: u64, nice: i64| {
        kernel_action(&spec, "setpriority", [which, who, nice as u64, 0, 0, 0])
    };
    assert_eq!(prio(0, 0, 10), Action::Allow);
    assert_eq!(prio(0, 0, 0), Action::Allow);
    assert_eq!(prio(0, 0, -5), Action::Errno(libc::EPERM));
    assert_eq!(prio(0, 1234, 10), Action::Errno(libc::EPERM));
    assert_eq!(prio(1, 0, 10), Action::Errno(libc::EPERM));
    // socketpair only for AF_UNIX; any other family reaches the default.
    let sp = entry(&p, "socketpair");
    assert_eq!(sp.action, SyscallAction::Allow);
    assert_eq!(
        sp.when,
        [notify::ArgCmp {
            arg: 0,
            op: CmpOp::Eq,
            value: libc::AF_UNIX as u64
        }]
    );
    // Deliberately left to the default: tracing, mounts, identity changes.
    for name in ["ptrace", "mount", "setuid", "chroot"] {
        assert!(p.syscalls().iter().all(|e| e.name != name), "{name}");
        assert_eq!(
            kernel_action(&spec, name, [1, 1, 0, 0, 0, 0]),
            Action::Errno(libc::EPERM),
            "{name}"
        );
    }
    // Sockets: local stream/seqpacket only (with SOCK_CLOEXEC/NONBLOCK), bind/connect decided.
    let sock = |family: i32, ty: i32| {
        kernel_action(&spec, "socket", [family as u64, ty as u64, 0, 0, 0, 0])
    };
    let (cloexec, nonblock) = (libc::SOCK_CLOEXEC, libc::SOCK_NONBLOCK);
    assert_eq!(sock(libc::AF_UNIX, libc::SOCK_STREAM), Action::Allow);
    assert_eq!(
        sock(libc::AF_UNIX, libc::SOCK_STREAM | cloexec),
        Action::Allow
    );
    assert_eq!(
        sock(libc::AF_UNIX, libc::SOCK_SEQPACKET | nonblock),
        Action::Allow
    );
    for (family, ty) in [
        (libc::AF_UNIX, libc::SOCK_DGRAM),
        (libc::AF_INET, libc::SOCK_STREAM),
        (libc::AF_INET6, libc::SOCK_STREAM),
        (libc::AF_NETLINK, libc::SOCK_RAW),
        (libc::AF_PACKET, libc::SOCK_RAW),
    ] {
        assert_eq!(
            sock(family, ty),
            Action::Errno(libc::EPERM),
            "{family} {ty}"
        );
    }
    for name in SOCKET_PATH_CALLS {
        assert_eq!(entry(&p, name).action, SyscallAction::Notify, "{name}");
    }
}

#[test]
fn permissive_allows_by_default_and_notifies_path_calls() {
    let p = load("permissive").unwrap();
    let spec = p.filter_spec();
    assert_eq!(spec.default, Action::Allow);
    assert_eq!(p.denied_errno(), None);
    assert!(!p.logs_denied());
    let mut n: Vec<_> = spec
        .rules
        .iter()
        .filter(|r| r.action == Action::Notify)
        .map(|r| r.name.as_str())
        .collect();
    n.sort_unstable();
    let mut want = PATH_CALLS.to_vec();
    want.sort_unstable();
    assert_eq!(n, want);
    // Besides the notify rules only the TIOCSTI/TIOCLINUX refusals.
    for r in spec.rules.iter().filter(|r| r.action != Action::Notify) {
        assert_eq!(r.name, "ioctl");
        assert_eq!(r.action, Action::Errno(libc::EPERM));
    }
    // The AT_EMPTY_PATH allow equals the default: what remains is a notify rule where the flag
    // is clear.
    for (name, arg) in EMPTY_PATH_ALLOWED {
        let r = spec.rules.iter().find(|r| r.name == name).unwrap();
        assert_eq!(r.when, [at_empty_path(arg, false)], "{name}");
    }
    let mut notified = p.notified_syscalls();
    notified.sort();
    notified.dedup();
    assert_eq!(notified, want);
}

#[test]
fn notification_kind_separates_path_calls_from_denied() {
    let mut p = sigmaos();
    let nr = |n: &str| i32::from(libseccomp::ScmpSyscall::from_name(n).unwrap());
    assert_eq!(
        p.notification_kind(nr("openat")),
        Some(NotificationKind::Path)
    );
    assert_eq!(
        p.notification_kind(nr("execveat")),
        Some(NotificationKind::Path)
    );
    // Refused in the kernel: never notified.
    assert_eq!(p.notification_kind(nr("socket")), None);
    p.set_logs_denied(true);
    assert_eq!(
        p.notification_kind(nr("socket")),
        Some(NotificationKind::Denied { errno: libc::EPERM })
    );
    // clone with namespace flags fails its condition and reaches the default.
    assert_eq!(
        p.notification_kind(nr("clone")),
        Some(NotificationKind::Denied { errno: libc::EPERM })
    );
    assert!(p.notified_syscall_nrs().contains(&nr("newfstatat")));
    let permissive = load("permissive").unwrap();
    assert_eq!(permissive.notification_kind(nr("socket")), None);
}

// ------------------------------------------------------------------------------------------------
// Rejections: each names the file and the line.
// ------------------------------------------------------------------------------------------------

const HEAD: &str = "name = \"t\"\n\
[default]\n\
action = \"errno\"\n\
errno = \"EPERM\"\n\
log = true\n\
reason = \"deny the rest\"\n\
\n\
[[syscall]]\n\
name = \"getpid\"\n\
action = \"allow\"\n\
reason = \"own pid\"\n";

/// Parse `src`; expect an error on the line containing `marker` (1-based), mentioning `what`.
fn rejects(src: &str, marker: &str, what: &str) {
    let line = 1 + src
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("marker {marker:?} not in source"));
    let err = Profile::parse(src, "dir/t.toml").expect_err(&format!("accepted:\n{src}"));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!("dir/t.toml:{line}: ")),
        "wanted line {line}, got: {msg}"
    );
    assert!(msg.contains(what), "wanted {what:?} in: {msg}");
    assert!(!msg.contains('\n'), "not one line: {msg}");
}

#[test]
fn head_alone_is_valid() {
    let p = Profile::parse(HEAD, "t.toml").unwrap();
    assert_eq!(p.syscalls().len(), 1);
    assert_eq!(p.syscalls()[0].line, 9);
    assert_eq!(p.source(), "t.toml");
}

#[test]
fn rejects_unknown_syscall_name() {
    let src =
        format!("{HEAD}\n[[syscall]]\nname = \"getpidd\"\naction = \"allow\"\nreason = \"x\"\n");
    rejects(&src, "getpidd", "unknown syscall `getpidd`");
}

#[test]
fn rejects_syscall_of_another_architecture() {
    // socketcall exists on i386 but not on x86_64.
    let src =
        format!("{HEAD}\n[[syscall]]\nname = \"socketcall\"\naction = \"allow\"\nreason = \"x\"\n");
    rejects(&src, "socketcall", "not a syscall on this architecture");
}

#[test]
fn rejects_unknown_keys_everywhere() {
    let s = format!("{HEAD}\n[[syscall]]\nname = \"brk\"\naction = \"allow\"\nreason = \"x\"\nreasn = \"typo\"\n");
    rejects(&s, "reasn", "unknown field `reasn`");
    let s = HEAD.replace("log = true", "log = true\nlogg = true");
    rejects(&s, "logg", "unknown field `logg`");
    let s = format!("colour = \"red\"\n{HEAD}");
    rejects(&s, "colour", "unknown field `colour`");
    let s = format!(
        "{HEAD}\n[[path]]\nprefix = \"/x\"\naction = \"continue\"\nreason = \"x\"\ndri = \"/y\"\n"
    );
    rejects(&s, "dri", "unknown field `dri`");
    let s = format!(
        "{HEAD}\n[[syscall]]\nname = \"brk\"\naction = \"allow\"\nreason = \"x\"\n\
         when = [{{ arg = 0, op = \"eq\", value = 1, msak = 2 }}]\n"
    );
    rejects(&s, "msak", "unknown field `msak`");
}

#[test]
fn rejects_missing_or_empty_reason() {
    let s = format!("{HEAD}\n[[syscall]] # here\nname = \"brk\"\naction = \"allow\"\n");
    rejects(&s, "# here", "missing `reason`");
    let s = format!("{HEAD}\n[[syscall]]\nname = \"brk\"\naction = \"allow\"\nreason = \"  \"\n");
    rejects(&s, "reason = \"  \"", "`reason` is empty");
    let s = format!("{HEAD}\n[[path]] # here\nprefix = \"/x\"\naction = \"continue\"\n");
    rejects(&s, "# here", "missing `reason`");
    let s = HEAD.replace("reason = \"deny the rest\"\n", "");
    rejects(&s, "[default]", "missing `reason`");
}

#[test]
fn rejects_duplicate_syscall() {
    let s = format!("{HEAD}\n[[syscall]]\nname = \"getpid\" # again\naction = \"errno\"\nerrno = \"EPERM\"\nreason = \"x\"\n");
    rejects(
        &s,
        "# again",
        "duplicate entry for syscall `getpid` (first at line 9)",
    );
}

#[test]
fn several_entries_per_syscall() {
    // A conditional allow next to an unconditional notify, and conditional entries alone.
    let ok = format!(
        "{HEAD}\n[[syscall]]\nname = \"newfstatat\"\naction = \"notify\"\nreason = \"x\"\n\
         \n[[syscall]]\nname = \"newfstatat\"\naction = \"allow\"\nreason = \"x\"\n\
         when = [{{ arg = 3, op = \"masked_eq\", mask = 0x1000, value = 0x1000 }}]\n\
         \n[[syscall]]\nname = \"socketpair\"\naction = \"allow\"\nreason = \"x\"\n\
         when = [{{ arg = 0, op = \"eq\", value = 1 }}]\n\
         \n[[syscall]]\nname = \"socketpair\"\naction = \"errno\"\nerrno = \"EACCES\"\n\
         reason = \"x\"\nwhen = [{{ arg = 0, op = \"eq\", value = 2 }}]\n"
    );
    let mut p = Profile::parse(&ok, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.notified_syscalls(), ["newfstatat"]);
    p.filter_spec().compile().unwrap();
    p.set_logs_denied(false);
    let spec = p.filter_spec();
    let rules: Vec<_> = spec
        .rules
        .iter()
        .filter(|r| r.name == "newfstatat")
        .collect();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].action, Action::Notify);
    assert_eq!(rules[0].when, [at_empty_path(3, false)]);
    assert_eq!(rules[1].action, Action::Allow);
    assert_eq!(
        spec.rules.iter().filter(|r| r.name == "socketpair").count(),
        2
    );
    spec.compile().unwrap();
}

#[test]
fn complement_is_exact_or_absent() {
    use crate::profile::complement;
    let c = |op, value| notify::ArgCmp { arg: 1, op, value };
    assert_eq!(complement(&c(CmpOp::Eq, 5)), Some(c(CmpOp::Ne, 5)));
    assert_eq!(complement(&c(CmpOp::Ne, 5)), Some(c(CmpOp::Eq, 5)));
    let m = CmpOp::MaskedEq(0x1000);
    assert_eq!(complement(&c(m, 0x1000)), Some(c(m, 0)));
    assert_eq!(complement(&c(m, 0)), Some(c(m, 0x1000)));
    // Several bits: "not (x & 3 == 1)" is not one masked comparison.
    assert_eq!(complement(&c(CmpOp::MaskedEq(3), 1)), None);
    assert_eq!(complement(&c(CmpOp::MaskedEq(3), 0)), None);
}

#[test]
fn rejects_bad_mixed_entries() {
    let base = format!(
        "{HEAD}\n[[syscall]]\nname = \"newfstatat\"\naction = \"notify\"\nreason = \"x\"\n"
    );
    let cond = |action: &str, when: &str, mark: &str| {
        format!(
            "\n[[syscall]]\nname = \"newfstatat\" {mark}\naction = \"{action}\"\nreason = \"x\"\nwhen = [{when}]\n"
        )
    };
    let bit = "{ arg = 3, op = \"masked_eq\", mask = 0x1000, value = 0x1000 }";
    // The same condition twice.
    let s = format!(
        "{base}{}{}",
        cond("allow", bit, ""),
        cond("allow", bit, "# again")
    );
    rejects(
        &s,
        "# again",
        "duplicate entry for syscall `newfstatat` with the same `when` (first at line 19)",
    );
    // Two conditional entries next to an unconditional one whose set has no complement.
    let other = "{ arg = 0, op = \"eq\", value = 3 }";
    let s = format!(
        "{base}{}{}",
        cond("allow", bit, ""),
        cond("allow", other, "# second")
    );
    rejects(&s, "value = 3", "exact complement");
    // Conditional entries with different actions next to an unconditional one.
    let s = format!(
        "{base}{}{}",
        cond("allow", bit, ""),
        cond("errno\"\nerrno = \"EACCES", other, "# second")
    );
    rejects(&s, "# second", "must share one action (first at line 19)");
    // A condition without a complement one comparison set can write: two masks.
    let s = format!(
        "{base}{}{}",
        cond(
            "allow",
            "{ arg = 3, op = \"masked_eq\", mask = 0x1100, value = 0x1000 }",
            ""
        ),
        cond(
            "allow",
            "{ arg = 3, op = \"masked_eq\", mask = 0x1, value = 0x1 }",
            ""
        )
    );
    rejects(&s, "mask = 0x1,", "exact complement");
    let s = format!("{base}{}", cond("allow", &format!("{bit}, {other}"), ""));
    rejects(&s, "mask = 0x1000", "exactly one condition");
    // Same action as the unconditional entry: redundant (and a conditional notify is refused).
    let s = format!("{base}{}", cond("errno\"\nerrno = \"EPERM", bit, "# same"));
    let s = s.replace(
        "action = \"notify\"",
        "action = \"errno\"\nerrno = \"EPERM\"",
    );
    rejects(
        &s,
        "# same",
        "same action as the unconditional entry at line 14",
    );
    let s = format!("{base}{}", cond("notify", bit, ""));
    rejects(&s, "when = [", "cannot have `when`");
    // Still: two unconditional entries.
    let s = format!(
        "{base}\n[[syscall]]\nname = \"newfstatat\" # dup\naction = \"allow\"\nreason = \"x\"\n"
    );
    rejects(
        &s,
        "# dup",
        "duplicate entry for syscall `newfstatat` (first at line 14)",
    );
}

#[test]
fn rejects_notify_on_io_calls() {
    for name in ["read", "write", "readv", "writev", "pread64", "pwrite64"] {
        let s = format!(
            "{HEAD}\n[[syscall]]\nname = \"{name}\"\naction = \"notify\" # here\nreason = \"x\"\n"
        );
        rejects(&s, "# here", "must not be notified");
    }
}

#[test]
fn rejects_notify_as_default() {
    let s = HEAD.replace(
        "action = \"errno\"\nerrno = \"EPERM\"\nlog = true\n",
        "action = \"notify\"\n",
    );
    rejects(&s, "\"notify\"", "notify cannot be the default action");
    let s = HEAD.replace(
        "action = \"errno\"\nerrno = \"EPERM\"\n",
        "action = \"allow\"\n",
    );
    rejects(
        &s,
        "log = true",
        "`log = true` only applies to action = \"errno\"",
    );
}

#[test]
fn errno_names_and_numbers() {
    let s = HEAD.replace("\"EPERM\"", "\"EPREM\"");
    rejects(&s, "EPREM", "unknown errno name `EPREM`");
    let s = HEAD.replace("\"EPERM\"", "99999");
    rejects(&s, "99999", "out of range");
    let s = HEAD.replace("\"EPERM\"", "13");
    let p = Profile::parse(&s, "t.toml").unwrap();
    assert_eq!(p.denied_errno(), Some(libc::EACCES));
    let s = format!("{HEAD}\n[[syscall]]\nname = \"socket\"\naction = \"errno\"\nerrno = \"EAFNOSUPPORT\"\nreason = \"x\"\n");
    let p = Profile::parse(&s, "t.toml").unwrap();
    assert_eq!(
        entry(&p, "socket").action,
        SyscallAction::Errno(libc::EAFNOSUPPORT)
    );
    let s = format!(
        "{HEAD}\n[[syscall]]\nname = \"socket\"\naction = \"errno\" # here\nreason = \"x\"\n"
    );
    rejects(&s, "# here", "needs `errno");
}

#[test]
fn rejects_bad_path_rules() {
    let p = |body: &str| format!("{HEAD}\n[[path]]\n{body}\nreason = \"x\"\n");
    rejects(
        &p("prefix = \"etc/passwd\"\naction = \"deny\""),
        "etc/passwd",
        "is relative",
    );
    rejects(
        &p("prefix = \"/tmp/../etc\"\naction = \"deny\""),
        "/tmp/../etc",
        "contains `.` or `..`",
    );
    rejects(
        &p("prefix = \"/lib\"\naction = \"serve\"\ndir = \"cache/lib\""),
        "cache/lib",
        "serve dir `cache/lib` is relative",
    );
    rejects(
        &p("prefix = \"/lib\"\naction = \"serve\" # here"),
        "# here",
        "needs `dir",
    );
    rejects(
        &p("prefix = \"/lib\"\naction = \"continue\"\nerrno = \"EACCES\" # here"),
        "# here",
        "`errno` only applies to action = \"deny\"",
    );
    rejects(
        &p("prefix = \"/lib\"\naction = \"allow\" # here"),
        "# here",
        "unknown action `allow`",
    );
    let dup = format!(
        "{HEAD}\n[[path]]\nprefix = \"/x\"\naction = \"continue\"\nreason = \"x\"\n\
         [[path]]\nprefix = \"/x/\" # again\naction = \"deny\"\nreason = \"x\"\n"
    );
    rejects(&dup, "# again", "duplicate path rule for `/x`");
}

#[test]
fn rejects_bad_conditions() {
    let s = |w: &str| {
        format!("{HEAD}\n[[syscall]]\nname = \"clone\"\naction = \"allow\"\nreason = \"x\"\nwhen = [{w}]\n")
    };
    rejects(
        &s("{ arg = 6, op = \"eq\", value = 0 }"),
        "arg = 6",
        "out of range",
    );
    rejects(
        &s("{ arg = 0, op = \"masked_eq\", value = 0 }"),
        "masked_eq",
        "needs `mask`",
    );
    rejects(
        &s("{ arg = 0, op = \"lt\", value = 0 }"),
        "\"lt\"",
        "unknown op",
    );
    let n = format!("{HEAD}\n[[syscall]]\nname = \"openat\"\naction = \"notify\"\nreason = \"x\"\nwhen = [{{ arg = 0, op = \"eq\", value = 0 }}]\n");
    rejects(&n, "when", "cannot have `when`");
}

#[test]
fn toml_syntax_error_names_line() {
    let s = format!("{HEAD}\n[[syscall]]\nname = \"brk\nreason = \"x\"\n");
    rejects(&s, "name = \"brk", "");
}

// ------------------------------------------------------------------------------------------------
// Path decisions.
// ------------------------------------------------------------------------------------------------

fn with_paths() -> Profile {
    let src = format!(
        "{HEAD}\n\
[[path]]\nprefix = \"/etc/pass\"\naction = \"deny\"\nreason = \"component boundary probe\"\n\
[[path]]\nprefix = \"/etc\"\naction = \"deny\"\nerrno = \"EROFS\"\nreason = \"x\"\n\
[[path]]\nprefix = \"/etc/ssl\"\naction = \"continue\"\nreason = \"x\"\n\
[[path]]\nprefix = \"/tmp/python/Lib\"\naction = \"serve\"\ndir = \"/var/cache/realm/lib\"\nreason = \"x\"\n"
    );
    Profile::parse(&src, "t.toml").unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn decide_matches_whole_components_longest_first() {
    let p = with_paths();
    let d = |s: &str| p.decide(Path::new(s));
    // /etc/pass is not a prefix of /etc/passwd: /etc applies.
    assert_eq!(d("/etc/passwd"), PathDecision::Deny(libc::EROFS));
    assert_eq!(d("/etc/pass"), PathDecision::Deny(libc::EACCES));
    assert_eq!(d("/etc/pass/x"), PathDecision::Deny(libc::EACCES));
    assert_eq!(d("/etc/ssl/certs/ca.pem"), PathDecision::Continue);
    assert_eq!(d("/etc/ssl"), PathDecision::Continue);
    assert_eq!(d("/etcetera"), PathDecision::Continue);
    assert_eq!(d("/etc"), PathDecision::Deny(libc::EROFS));
    assert_eq!(d("/etc/"), PathDecision::Deny(libc::EROFS));
    assert_eq!(d("/usr/lib"), PathDecision::Continue);
    assert_eq!(d("/"), PathDecision::Continue);
    let serve = |rest: &str| PathDecision::Serve {
        prefix: PathBuf::from("/tmp/python/Lib"),
        dir: PathBuf::from("/var/cache/realm/lib"),
        rest: PathBuf::from(rest),
    };
    assert_eq!(
        d("/tmp/python/Lib/json/__init__.py"),
        serve("json/__init__.py")
    );
    assert_eq!(d("/tmp/python/Lib"), serve(""));
    assert_eq!(d("/tmp/python//Lib/./json"), serve("json"));
    assert_eq!(d("/tmp/python/Library"), PathDecision::Continue);
    // `..` is applied before matching, so `rest` never climbs out of the served dir.
    assert_eq!(
        d("/tmp/python/Lib/../../../etc/passwd"),
        PathDecision::Deny(libc::EROFS)
    );
    assert_eq!(d("/tmp/python/Lib/a/../b"), serve("b"));
    // A relative path is a caller bug: refused, never silently continued.
    assert_eq!(d("etc/passwd"), PathDecision::Deny(libc::EACCES));
}

#[test]
fn root_prefix_matches_everything() {
    let src = format!("{HEAD}\n[[path]]\nprefix = \"/\"\naction = \"deny\"\nreason = \"x\"\n[[path]]\nprefix = \"/ok\"\naction = \"continue\"\nreason = \"x\"\n");
    let p = Profile::parse(&src, "t.toml").unwrap();
    assert_eq!(
        p.decide(Path::new("/anything")),
        PathDecision::Deny(libc::EACCES)
    );
    assert_eq!(p.decide(Path::new("/ok/x")), PathDecision::Continue);
}

#[test]
fn serve_argument_adds_or_replaces_a_rule() {
    let mut p = with_paths();
    p.add_serve("/etc/ssl=/srv/certs").unwrap();
    assert_eq!(
        p.decide(Path::new("/etc/ssl/a.pem")),
        PathDecision::Serve {
            prefix: PathBuf::from("/etc/ssl"),
            dir: PathBuf::from("/srv/certs"),
            rest: PathBuf::from("a.pem"),
        }
    );
    assert_eq!(
        p.path_rules()
            .iter()
            .filter(|r| r.prefix == Path::new("/etc/ssl"))
            .count(),
        1
    );
    let (_, dir) = parse_serve_arg("/x=rel/dir").unwrap();
    assert!(dir.is_absolute() && dir.ends_with("rel/dir"));
    for bad in ["/x", "x=/y", "/x=", "/a/../b=/y"] {
        let e = p.add_serve(bad).unwrap_err().to_string();
        assert!(e.starts_with(&format!("--serve {bad}: ")), "{e}");
    }
}

// ------------------------------------------------------------------------------------------------
// Loading.
// ------------------------------------------------------------------------------------------------

#[test]
fn load_reads_files_and_names_them_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("mine.toml");
    std::fs::write(&good, HEAD).unwrap();
    let p = load(good.to_str().unwrap()).unwrap();
    assert_eq!(p.name(), "t");
    assert_eq!(p.source(), good.to_str().unwrap());

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, HEAD.replace("getpid", "getpidd")).unwrap();
    let e = load(bad.to_str().unwrap()).unwrap_err().to_string();
    assert_eq!(e, format!("{}:9: unknown syscall `getpidd`", bad.display()));

    let e = load("no-such-profile").unwrap_err().to_string();
    assert_eq!(
        e,
        "profile `no-such-profile` is neither a builtin (sigmaos, sigmaos-nodialproxy, sigmaos-strict, permissive) nor an existing file"
    );
    let e = Profile::from_file(&dir.path().join("missing.toml")).unwrap_err();
    assert!(matches!(e, PolicyError::Read { .. }));
}

#[test]
fn builtin_errors_name_the_repository_file() {
    assert_eq!(
        builtin("sigmaos").unwrap().unwrap().source(),
        "policies/profiles/sigmaos.toml"
    );
    assert!(builtin("nope").is_none());
}

/// `needs`: TCP/UDP sockets only with a network namespace of the proc's own; renicing another
/// process and extended attributes only in the jail; raw and packet sockets never; the parsed
/// profile (nothing resolved) is the strictest.
#[test]
fn entries_that_need_the_jail_or_its_network_apply_only_to_such_runs() {
    const INET: u64 = libc::AF_INET as u64;
    const INET6: u64 = libc::AF_INET6 as u64;
    let tcp = [
        INET,
        libc::SOCK_STREAM as u64 | libc::SOCK_CLOEXEC as u64,
        0,
        0,
        0,
        0,
    ];
    let udp6 = [
        INET6,
        libc::SOCK_DGRAM as u64,
        libc::IPPROTO_UDP as u64,
        0,
        0,
        0,
    ];
    let raw = [INET, libc::SOCK_RAW as u64, 0, 0, 0, 0];
    let packet = [libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0];
    let sctp = [INET, libc::SOCK_STREAM as u64, 132, 0, 0, 0];
    let renice = [0, 42, 5, 0, 0, 0];
    let raise = [0, 42, (-5i32) as u32 as u64, 0, 0, 0];
    let xattr = [0; 6];
    let eperm = Action::Errno(libc::EPERM);
    let enotsup = Action::Errno(libc::ENOTSUP);
    let cases = [
        (None, eperm, eperm, enotsup),
        (Some((false, false)), eperm, eperm, enotsup),
        (Some((true, false)), eperm, Action::Allow, Action::Allow),
        (
            Some((true, true)),
            Action::Allow,
            Action::Allow,
            Action::Allow,
        ),
    ];
    for (run, socket, setprio, getxattr) in cases {
        let p = match run {
            None => sigmaos(),
            Some((jailed, own_net)) => sigmaos().for_run(jailed, own_net),
        };
        let spec = p.filter_spec();
        let what = format!("{run:?}");
        assert_eq!(kernel_action(&spec, "socket", tcp), socket, "{what}");
        assert_eq!(kernel_action(&spec, "socket", udp6), socket, "{what}");
        for refused in [raw, packet, sctp] {
            assert_eq!(kernel_action(&spec, "socket", refused), eperm, "{what}");
        }
        assert_eq!(
            kernel_action(&spec, "setpriority", renice),
            setprio,
            "{what}"
        );
        assert_eq!(kernel_action(&spec, "setpriority", raise), eperm, "{what}");
        assert_eq!(kernel_action(&spec, "getxattr", xattr), getxattr, "{what}");
        assert_eq!(kernel_action(&spec, "fsetxattr", xattr), getxattr, "{what}");
        // Local sockets in every run.
        let unix = [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(
            kernel_action(&spec, "socket", unix),
            Action::Allow,
            "{what}"
        );
        spec.compile().unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // sigmaos-strict has none of them, whatever the run.
    let strict = load("sigmaos-strict").unwrap().for_run(true, true);
    let spec = strict.filter_spec();
    assert_eq!(kernel_action(&spec, "socket", tcp), eperm);
    assert_eq!(kernel_action(&spec, "setpriority", renice), eperm);
}

#[test]
fn a_need_is_jail_or_own_net_and_never_on_a_notify_entry() {
    let head = "name = \"t\"\n[default]\naction = \"errno\"\nerrno = \"EPERM\"\nreason = \"r\"\n";
    let bad = |body: &str| Profile::parse(&format!("{head}{body}"), "t.toml").unwrap_err();
    let e = bad(
        "[[syscall]]\nname = \"socket\"\naction = \"allow\"\nneeds = \"cloud\"\nreason = \"r\"\n",
    );
    assert!(e.to_string().contains("unknown need `cloud`"), "{e}");
    let e = bad(
        "[[syscall]]\nname = \"openat\"\naction = \"notify\"\nneeds = \"jail\"\nreason = \"r\"\n",
    );
    assert!(e.to_string().contains("no `needs`"), "{e}");
}
