//! Where a realm snapshot's FUSE server keeps its mount, counters and packages, and how it
//! is mounted (fusermount3).
#![forbid(unsafe_code)]

use crate::snapshot::lock_file;
use nix::fcntl::FlockArg;
use std::path::{Path, PathBuf};

/// `argv[0]` of a realm's FUSE server ([`main`](super::main), started by [`attach`](super::attach())).
pub const FUSE_ARG0: &str = "sigma-supervise-fuse";

/// `argv[0]` of a server's unmounter ([`unmounter_main`](super::unmounter_main)).
pub const UNMOUNT_ARG0: &str = "sigma-supervise-unmount";

/// Where fuse3's setuid helper is installed.
pub(super) const FUSERMOUNT: [&str; 3] = [
    "/usr/bin/fusermount3",
    "/bin/fusermount3",
    "/usr/local/bin/fusermount3",
];

/// Where server `pid` mounts snapshot `key`: a directory of its own, so the unmount of a
/// server that is gone (by its fusermount3, by path, whenever it gets to it) never meets the
/// mount of the next.
pub(super) fn mount_dir(base: &Path, key: &str, pid: u32) -> PathBuf {
    base.join(format!("{key}-{pid}"))
}

/// The counters of the server of snapshot `key` (`Content::record`).
pub(super) fn stats_file(base: &Path, key: &str) -> PathBuf {
    base.join(format!("{key}.stats"))
}

/// The packages of snapshot `key` ([`crate::snapshot::packages_text`], written by its server).
pub(super) fn packages_file(base: &Path, key: &str) -> PathBuf {
    base.join(format!("{key}.packages"))
}

/// The pid of the server of snapshot `key`, if one holds its lock.
pub(super) fn serving(base: &Path, key: &str) -> Option<u32> {
    match lock_file(
        &base.join(format!("{key}.lock")),
        FlockArg::LockExclusiveNonblock,
    ) {
        // Nobody holds it: no server (let go at once).
        Ok(_) => None,
        Err(_) => std::fs::read_to_string(base.join(format!("{key}.pid")))
            .ok()
            .and_then(|p| p.trim().parse().ok()),
    }
}

/// Whether `mnt` is the root of a FUSE mount.
pub(super) fn is_fuse(mnt: &Path) -> bool {
    nix::sys::statfs::statfs(mnt)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC)
}

pub(super) fn fusermount() -> Option<&'static str> {
    FUSERMOUNT.into_iter().find(|p| Path::new(p).exists())
}
