//! The kernel calls the jail needs that `nix` does not wrap: clone with namespace flags, the new
//! mount API (open_tree, mount_setattr, move_mount), pivot_root, capset, securebits, and the
//! loopback interface's flags. Every function here is a thin wrapper; the callers decide.
#![allow(unsafe_code)]

use nix::errno::Errno;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// clone(2) without a new stack, as fork(2) does, with namespace `flags`. Returns 0 in the child.
///
/// # Safety
/// The caller must be single-threaded (no lock held by another thread can be inherited), and the
/// child must only make system calls on data prepared before the call, then `_exit` or `execve`.
pub unsafe fn clone_fork(flags: libc::c_int) -> Result<i32, Errno> {
    // SAFETY: with a NULL stack clone(2) continues the child on a copy of our stack, like fork;
    // the caller guarantees the single-threaded precondition stated above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    Errno::result(r).map(|p| p as i32)
}

/// Start a child that shares our memory (clone with `CLONE_VM` and `flags`, on a stack of its
/// own) and does nothing but wait: it closes its copy of `end` and reads `wait` until EOF (our
/// `end` closed, or we are gone) or until it is killed. Unlike [`clone_fork`], no page table is
/// copied, nor torn down when it exits. Returns its pid.
pub fn clone_waiter(
    flags: libc::c_int,
    wait: BorrowedFd<'_>,
    end: BorrowedFd<'_>,
) -> Result<i32, Errno> {
    extern "C" fn waiter(arg: *mut libc::c_void) -> libc::c_int {
        let fds = arg.cast::<[libc::c_int; 2]>();
        let mut b = 0u8;
        // SAFETY: `arg` points at the two descriptor numbers, leaked for us; the reads and the
        // close touch our own descriptor table (a copy: no CLONE_FILES) and a byte of our stack.
        // Neither can fail in a way that matters: a pipe, no signal handler.
        unsafe {
            libc::close((*fds)[1]);
            libc::read((*fds)[0], std::ptr::addr_of_mut!(b).cast(), 1);
            libc::_exit(0)
        }
    }
    const STACK: usize = 16 * 1024;
    // Leaked, both: the child may still run on them after we return (it is killed, not waited
    // for). 16 KiB once per run.
    let stack: &'static mut [u8] = Box::leak(vec![0u8; STACK].into_boxed_slice());
    let fds: &'static mut [libc::c_int; 2] =
        Box::leak(Box::new([wait.as_raw_fd(), end.as_raw_fd()]));
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    // SAFETY: the child runs only `waiter`, on its own 16-byte aligned stack, reading nothing
    // of ours but `fds`; without CLONE_THREAD it is a process of its own (its _exit ends only
    // it), and it takes no lock a thread of ours could hold.
    let pid = unsafe {
        libc::clone(
            waiter,
            top as *mut libc::c_void,
            libc::CLONE_VM | flags | libc::SIGCHLD,
            (fds as *mut [libc::c_int; 2]).cast(),
        )
    };
    Errno::result(pid)
}

/// struct mount_attr (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
pub const OPEN_TREE_CLONE: u32 = 1;
pub const AT_RECURSIVE: u32 = 0x8000;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

/// open_tree(OPEN_TREE_CLONE | AT_RECURSIVE): a detached copy of the mount tree at `path`.
pub fn clone_tree(path: &CStr) -> Result<OwnedFd, Errno> {
    // SAFETY: `path` is NUL-terminated and outlives the call; the other arguments are integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | AT_RECURSIVE,
        )
    };
    let fd = Errno::result(fd)? as RawFd;
    // SAFETY: on success open_tree returns a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// mount_setattr(AT_RECURSIVE) on a mount fd with `attr`.
fn mount_setattr(tree: BorrowedFd<'_>, attr: &MountAttr) -> Result<(), Errno> {
    // SAFETY: `attr` is a live, correctly sized mount_attr; the path is a static empty string
    // used with AT_EMPTY_PATH, so only the borrowed fd (and a userns fd named in `attr`, which
    // the caller borrows for the call) is used.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(rc).map(drop)
}

/// mount_setattr(AT_RECURSIVE) on a mount fd: set `set` on the whole tree.
pub fn set_tree_attrs(tree: BorrowedFd<'_>, set: u64) -> Result<(), Errno> {
    mount_setattr(
        tree,
        &MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        },
    )
}

/// move_mount(2): attach the detached tree `tree` at `dst`.
pub fn attach_tree(tree: BorrowedFd<'_>, dst: &CStr) -> Result<(), Errno> {
    // SAFETY: `dst` is NUL-terminated and outlives the call; the source path is a static empty
    // string used with MOVE_MOUNT_F_EMPTY_PATH, so only the borrowed fd is used.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(rc).map(drop)
}

/// pivot_root(2).
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> Result<(), Errno> {
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    Errno::result(rc).map(drop)
}

/// capget/capset's version-3 header and its two-element data array (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_VERSION_3: u32 = 0x2008_0522;

fn capset(data: &[CapData; 2]) -> Result<(), Errno> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: `hdr` and `data` are live and laid out as the kernel's v3 header and two-element
    // data array; capset only reads `data`.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    Errno::result(rc).map(drop)
}

/// Clear the permitted, effective and inheritable capability sets (capset(2), version 3).
pub fn clear_capabilities() -> Result<(), Errno> {
    capset(&[CapData::default(); 2])
}

/// Make the effective capability set equal to the permitted one (after a uid change with
/// PR_SET_KEEPCAPS, which keeps permitted but clears effective).
pub fn restore_effective_caps() -> Result<(), Errno> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `hdr` and `data` are live and laid out as the kernel's v3 header and two-element
    // data array, which capget fills.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    Errno::result(rc)?;
    for d in &mut data {
        d.effective = d.permitted;
    }
    capset(&data)
}

/// prctl with integer arguments.
pub fn prctl(op: libc::c_int, a: libc::c_ulong, b: libc::c_ulong) -> Result<i32, Errno> {
    // SAFETY: every prctl used here (securebits, capbset, ambient, no_new_privs, dumpable,
    // pdeathsig) takes integers only and touches no memory of ours.
    Errno::result(unsafe { libc::prctl(op, a, b, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

/// Bring the loopback interface up (SIOCGIFFLAGS / SIOCSIFFLAGS on a datagram socket).
pub fn loopback_up() -> Result<(), Errno> {
    // SAFETY: socket(2) with integer arguments.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let s = Errno::result(s)?;
    // SAFETY: `s` was just returned by socket(2) and is owned by nobody else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *b as libc::c_char;
    }
    // SAFETY: `req` is a live ifreq with a NUL-terminated name; the kernel fills ifru_flags.
    Errno::result(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) })?;
    // SAFETY: SIOCGIFFLAGS succeeded, so the flags member of the union is the one set.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: as above; the kernel reads the name and flags.
    Errno::result(unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) }).map(drop)
}

/// In a probe child just cloned into new user and mount namespaces: make its mount tree
/// private, then mount a tmpfs over `/`, as init's first steps do. 0, or the first errno.
pub fn probe_mounts() -> i32 {
    // SAFETY: static NUL-terminated strings and null pointers; mount(2) only reads them.
    let private = unsafe {
        libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    let r = if private == 0 {
        // SAFETY: as above.
        unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        }
    } else {
        private
    };
    if r == 0 {
        0
    } else {
        Errno::last_raw()
    }
}

/// _exit(2).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it does not return.
    unsafe { libc::_exit(code) }
}

/// sigtimedwait(2) on `set`: Ok(None) on timeout; else (signal, si_code, si_pid).
pub fn sigtimedwait(
    set: &nix::sys::signal::SigSet,
    timeout: Option<std::time::Duration>,
) -> Result<Option<(i32, i32)>, Errno> {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    let ts = timeout.map(|t| *nix::sys::time::TimeSpec::from_duration(t).as_ref());
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `set` is a valid sigset_t, `info` a writable siginfo_t, `tsp` NULL or a live
    // timespec, all for the duration of the call.
    let rc = unsafe { libc::sigtimedwait(set.as_ref(), info.as_mut_ptr(), tsp) };
    match Errno::result(rc) {
        Ok(sig) => {
            // SAFETY: sigtimedwait succeeded, so the kernel filled `info`.
            let info = unsafe { info.assume_init() };
            Ok(Some((sig, info.si_code)))
        }
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Close every fd from `first` up (close_range(2)).
pub fn close_from(first: u32) {
    // SAFETY: close_range with integer arguments; the caller no longer uses any fd >= first.
    let _ = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
}

/// Close every fd from `first` up except `keep`.
pub fn close_from_except(first: u32, keep: u32) {
    close_range_except(first, &[keep], 0)
}

/// close_range(2) with `flags` (0: close; `CLOSE_RANGE_CLOEXEC`: mark close-on-exec) over every
/// fd from `first` up except those in `keep` (sorted). No allocation: safe between fork and exec.
pub fn close_range_except(first: u32, keep: &[u32], flags: u32) {
    let range = |lo: u32, hi: u32| {
        // SAFETY: close_range with integer arguments; the caller no longer uses any fd it
        // closes (the kept ones lie outside every range).
        let _ = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, flags) };
    };
    let mut from = first;
    for &k in keep.iter().filter(|&&k| k >= first) {
        if k > from {
            range(from, k - 1);
        }
        from = k.saturating_add(1);
    }
    range(from, u32::MAX);
}

pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// mount_setattr(AT_RECURSIVE, MOUNT_ATTR_IDMAP) with the user namespace `userns`.
pub fn idmap_tree(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> Result<(), Errno> {
    mount_setattr(
        tree,
        &MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        },
    )
}

/// The Landlock ABI version this kernel offers (0: none).
pub fn landlock_abi() -> Result<i64, nix::errno::Errno> {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(nix::errno::Errno::last())
    } else {
        Ok(r)
    }
}

/// pidfd_open(2).
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes integer arguments only.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = Errno::result(fd)?;
    // SAFETY: on success pidfd_open returns a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The most descriptors one message of [`recv_with_fds`] takes (more are closed by the kernel
/// with MSG_CTRUNC).
pub const MAX_PASSED_FDS: usize = 64;

/// sendmsg(2) of `data` with `fds` as SCM_RIGHTS (none: no control message), retried on EINTR;
/// the bytes sent.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> Result<usize, Errno> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let iov = [std::io::IoSlice::new(data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// recvmsg(2) of one message into `buf`, retried on EINTR: its length and the descriptors it
/// passed (SCM_RIGHTS, close-on-exec, owned at once).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), Errno> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_PASSED_FDS]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(m) => {
                let mut fds = Vec::new();
                for c in m.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: SCM_RIGHTS just installed these descriptors in our table and
                        // nothing else refers to them.
                        fds.extend(raw.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
                    }
                }
                return Ok((m.bytes, fds));
            }
        }
    }
}
