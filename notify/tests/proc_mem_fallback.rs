//! The /proc/<pid>/mem fallback (for kernels without process_vm_readv), in its own test
//! binary because switching to it is process-wide.
mod common;

use common::{errno, map_path_at_page_end, spawn, ChildIo, PG};
use nix::errno::Errno;
use sigma_notify::{Action, FilterSpec, Response, SyscallRule, TargetMem};

fn child(_io: &ChildIo) -> i32 {
    let s = b"/via/proc/mem\0";
    let Some(base) = map_path_at_page_end(2, s) else {
        return 2;
    };
    // SAFETY: unmaps page 1 of our own mapping.
    if unsafe { libc::munmap(base.add(PG).cast(), PG) } != 0 {
        return 3;
    }
    // SAFETY: openat only passes the pointer on; the supervisor reads it.
    let r = unsafe { libc::openat(libc::AT_FDCWD, base.add(PG - s.len()).cast(), 0) };
    if r != -1 || errno() != libc::ENOENT {
        return 4;
    }
    // SAFETY: as above, pointing into the unmapped page.
    let r = unsafe { libc::openat(libc::AT_FDCWD, base.add(PG).cast(), 0) };
    if r != -1 || errno() != libc::EFAULT {
        return 5;
    }
    // SAFETY: getcwd into page 0; the supervisor writes 4 bytes there.
    let r = unsafe { libc::syscall(libc::SYS_getcwd, base, 16) };
    // SAFETY: reading 4 bytes of our mapping.
    if r != 4 || unsafe { std::slice::from_raw_parts(base, 4) } != b"/pm\0" {
        return 6;
    }
    0
}

#[test]
fn proc_mem_fallback_reads_and_writes() {
    sigma_notify::mem::force_proc_mem_fallback();
    let rule = |name: &str| SyscallRule {
        name: name.into(),
        action: Action::Notify,
        when: vec![],
    };
    let filter = FilterSpec {
        default: Action::Allow,
        rules: vec![rule("openat"), rule("getcwd")],
    }
    .compile()
    .unwrap();
    let mut c = spawn(&filter, child);
    let l = &c.listener;
    let n = l.recv().unwrap();
    let m = TargetMem::new(l, &n);
    assert_eq!(m.read_path(n.args[1]).unwrap().as_bytes(), b"/via/proc/mem");
    l.respond(n.id, Response::Errno(libc::ENOENT)).unwrap();
    let n = l.recv().unwrap();
    assert_eq!(
        TargetMem::new(l, &n).read_path(n.args[1]),
        Err(Errno::EFAULT)
    );
    l.respond(n.id, Response::Errno(libc::EFAULT)).unwrap();
    let n = l.recv().unwrap();
    TargetMem::new(l, &n).write(n.args[0], b"/pm\0").unwrap();
    l.respond(n.id, Response::Value(4)).unwrap();
    c.assert_success();
}
