//! Test helper: attempts syscalls a σOS proc must not make, with raw syscall(2) so no libc
//! wrapper hides the result, and prints `<name> <ERRNO-or-ok>` per attempt. Exit status 0 only if
//! every attempt failed with EPERM. Run it under `sigma-supervise`; outside it some attempts
//! succeed or fail otherwise (we are root), which is the point of the comparison. The arguments
//! are chosen so that a bare run changes nothing on the host.
#![allow(unsafe_code)]

use std::ffi::c_long;

fn attempt(name: &str, nr: c_long, args: [usize; 6]) -> bool {
    // SAFETY: every attempt passes integer arguments or null/pointers to locals that outlive the
    // call (see the call sites); the kernel validates the rest, and under the supervisor's filter
    // none of them runs.
    let rc = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    if rc < 0 {
        let shown = format!("{:?}", nix::errno::Errno::from_raw(errno));
        println!("{name} {shown}");
        errno == libc::EPERM
    } else {
        println!("{name} ok");
        false
    }
}

fn main() {
    let mut params = [0u8; 120]; // struct io_uring_params
    let tmpfs = c"tmpfs";
    // A target that does not exist and kexec flags that are invalid: run bare (as root) the
    // probe fails harmlessly (ENOENT, EINVAL) instead of changing the host.
    let target = c"/nonexistent/sigma-hostile-probe";
    let mut all = true;
    // A packet socket: refused in every profile (TCP and UDP are a jailed proc's own network's).
    all &= attempt(
        "socket",
        libc::SYS_socket,
        [
            libc::AF_PACKET as usize,
            libc::SOCK_RAW as usize,
            0,
            0,
            0,
            0,
        ],
    );
    all &= attempt(
        "ptrace",
        libc::SYS_ptrace,
        [libc::PTRACE_TRACEME as usize, 0, 0, 0, 0, 0],
    );
    all &= attempt(
        "mount",
        libc::SYS_mount,
        [
            tmpfs.as_ptr() as usize,
            target.as_ptr() as usize,
            tmpfs.as_ptr() as usize,
            0,
            0,
            0,
        ],
    );
    all &= attempt(
        "unshare",
        libc::SYS_unshare,
        [libc::CLONE_NEWUSER as usize, 0, 0, 0, 0, 0],
    );
    all &= attempt(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        [1, params.as_mut_ptr() as usize, 0, 0, 0, 0],
    );
    // BPF_MAP_CREATE with a null attr: EFAULT if it ever reached the kernel.
    all &= attempt("bpf", libc::SYS_bpf, [0, 0, 0, 0, 0, 0]);
    all &= attempt(
        "kexec_load",
        libc::SYS_kexec_load,
        [0, 0, 0, 0xffff_0000, 0, 0],
    );
    std::process::exit(if all { 0 } else { 1 });
}
