//! Every path-bearing syscall the supervisor knows, as [`Spec`]s.
#![forbid(unsafe_code)]

use super::refuse::{refuse_unsupported, refuse_write};
use super::spec::{Follow, PathArg, Spec};
use super::{access, exec, mkdir, open, readlink, stat};
use crate::calls::Writes;
use nix::errno::Errno;

/// mknod/mknodat create only FIFOs and regular files: a device node is refused whatever the
/// path (EPERM, what the kernel answers a caller without CAP_MKNOD). Sockets are made by bind.
fn mknod_fifo_or_file(a: &[u64; 6]) -> Result<(), Errno> {
    fifo_or_file_mode(a[1])
}

fn mknodat_fifo_or_file(a: &[u64; 6]) -> Result<(), Errno> {
    fifo_or_file_mode(a[2])
}

fn fifo_or_file_mode(mode: u64) -> Result<(), Errno> {
    let kind = mode as u32 & libc::S_IFMT;
    if kind == 0 || kind == libc::S_IFREG || kind == libc::S_IFIFO {
        Ok(())
    } else {
        Err(Errno::EPERM)
    }
}

const CWD_FOLLOW: &[PathArg] = &[PathArg::cwd(0, Follow::Yes)];
const CWD_NOFOLLOW: &[PathArg] = &[PathArg::cwd(0, Follow::No)];
const CWD_CREATE: &[PathArg] = &[PathArg::cwd(0, Follow::No).creates()];
const AT_CREATE: &[PathArg] = &[PathArg::at(0, 1, Follow::No).creates()];
const AT_NOFOLLOW: &[PathArg] = &[PathArg::at(0, 1, Follow::No)];
const TWO_CWD: &[PathArg] = &[
    PathArg::cwd(0, Follow::No),
    PathArg::cwd(1, Follow::No).creates(),
];
const TWO_AT: &[PathArg] = &[
    PathArg::at(0, 1, Follow::No),
    PathArg::at(2, 3, Follow::No).creates(),
];
const SYMLINK: &[PathArg] = &[PathArg::cwd(1, Follow::No).creates()];
const SYMLINKAT: &[PathArg] = &[PathArg::at(1, 2, Follow::No).creates()];
const AT_FLAG3: &[PathArg] = &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).empty_ok(3)];
const AT_FLAG4: &[PathArg] = &[PathArg::at(0, 1, Follow::UnlessAtFlag(4)).empty_ok(4)];

/// Every path-bearing syscall the supervisor knows. A profile that notifies a syscall not listed
/// here gets it refused (with a warning at start), never continued blindly.
pub const SPECS: &[Spec] = &[
    open::OPEN,
    open::OPENAT,
    open::OPENAT2,
    open::CREAT,
    stat::STAT,
    stat::LSTAT,
    stat::NEWFSTATAT,
    stat::STATX,
    access::ACCESS,
    access::FACCESSAT,
    access::FACCESSAT2,
    readlink::READLINK,
    readlink::READLINKAT,
    exec::EXECVE,
    exec::EXECVEAT,
    mkdir::MKDIR,
    mkdir::MKDIRAT,
    Spec {
        name: "rmdir",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "unlink",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "unlinkat",
        paths: AT_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "rename",
        paths: TWO_CWD,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "renameat",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "renameat2",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Entry,
    },
    Spec {
        name: "link",
        paths: TWO_CWD,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "linkat",
        paths: TWO_AT,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "symlink",
        paths: SYMLINK,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "symlinkat",
        paths: SYMLINKAT,
        serve: refuse_write,
        check: None,
        writes: Writes::Creates,
    },
    Spec {
        name: "mknod",
        paths: CWD_CREATE,
        serve: refuse_write,
        check: Some(mknod_fifo_or_file),
        writes: Writes::Creates,
    },
    Spec {
        name: "mknodat",
        paths: AT_CREATE,
        serve: refuse_write,
        check: Some(mknodat_fifo_or_file),
        writes: Writes::Creates,
    },
    Spec {
        name: "chmod",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "fchmodat",
        paths: AT_FLAG3,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "chown",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "lchown",
        paths: CWD_NOFOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "fchownat",
        paths: AT_FLAG4,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "truncate",
        paths: CWD_FOLLOW,
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "utimensat",
        paths: &[PathArg::at(0, 1, Follow::UnlessAtFlag(3)).null_is_fd()],
        serve: refuse_write,
        check: None,
        writes: Writes::Modifies,
    },
    Spec {
        name: "chdir",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    // No path: notified only so that path resolution knows a cwd changes (see
    // `ProcView::set_cwd_changes_seen`); the kernel checks the fd.
    Spec {
        name: "fchdir",
        paths: &[],
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "chroot",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "statfs",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "getxattr",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "lgetxattr",
        paths: CWD_NOFOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "listxattr",
        paths: CWD_FOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "llistxattr",
        paths: CWD_NOFOLLOW,
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
    Spec {
        name: "inotify_add_watch",
        paths: &[PathArg::cwd(1, Follow::Yes)],
        serve: refuse_unsupported,
        check: None,
        writes: Writes::No,
    },
];
