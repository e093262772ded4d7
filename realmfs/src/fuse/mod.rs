//! The rootless lazy backend: a realm's libraries as a FUSE filesystem, served by one process
//! per realm.
//!
//! Without `CAP_SYS_ADMIN` on the host there is no loop mount and no fanotify pre-content
//! group (`lazy/`). `/dev/fuse` is usually root's alone, but the setuid `fusermount3`
//! (fuse3) mounts a FUSE filesystem for an ordinary user on a directory of its own, and the
//! proc's jail (a user namespace of that user's) binds it read-only at the prefix. Root's realm
//! is served this way too where no image can be made (a kernel without pre-content events):
//! mounted `allow_other`, as root's procs run as ids of their own.
//!
//! The filesystem is the realm's index snapshot: every directory and every file with its size,
//! read-only, answered from memory (listing, `stat`, `importlib.metadata`'s scans fetch
//! nothing). A file's bytes come from the realm cache's store of verified content: a first read
//! of a file not there waits, off the request loop, while a worker makes sure its package is in
//! the realm cache (the fetcher's single flight and per-file sha256; released as soon as that
//! file is verified, not when the package is), then every waiting read is answered. A fetch
//! that fails answers EIO: an error, never zeros or a wrong byte.
//!
//! Packages the realm has installed from the snapshot's archives are shown from its lib dir
//! over the mount (a bind per top-level entry, as over the root's image): the server serves
//! only what is not installed yet, and a package it fetches is installed, so the runs after
//! its first touch read it from the lib dir. Through FUSE, every `ioctl` reaches the server
//! (Python's `open()` asks `isatty`, ~80 times in `import numpy`) and some mapped pages are
//! read again by each run: the lib dir is the faster path.
//!
//! The kernel keeps what it was told: entries and attributes for a year (a snapshot's names
//! and sizes never change; a new snapshot is a new mount), file pages across opens (`open` and
//! `flush` answered ENOSYS: the kernel stops asking and keeps its cache), directory listings
//! (`opendir` likewise). So a file is read through the server once per mount, and the mount
//! outlives runs: one server process per realm snapshot ([`FUSE_ARG0`], [`main`]), started by
//! the first run that needs it ([`attach()`]) and gone, its mount with it, after `server::IDLE` without
//! requests and without a run of the realm (`fuse/users`, held shared by every run that shows
//! the mount). A reader of a server that died gets ENOTCONN, never zeros; its mount is removed
//! by its unmounter ([`unmounter_main`], started beside it once it has mounted), however the
//! server ended (the next server of the snapshot removes what an unmounter killed with it
//! left). Only the server's own user reaches the mount, and a proc reaches it only through its
//! jail's read-only bind.
//!
//! Everything the server is asked comes from procs, so once it has mounted and started its
//! unmounter it confines itself before it starts a thread ([`crate::confine`]): it writes
//! only in the cache, reads only what a fetch reads, and can run nothing.
//!
//! fusermount3 opens `/dev/fuse` as the calling user: the device must be `0666`, as udev makes
//! it on a distribution's machine (a machine without udev leaves it `0600`: then the run is
//! served by notification and `--stats` says why).
#![forbid(unsafe_code)]

mod attach;
mod content;
mod fs;
mod paths;
mod server;
mod tree;

pub use attach::{attach, FuseMount};
pub use paths::{FUSE_ARG0, UNMOUNT_ARG0};
pub use server::{main, unmounter_main};

/// Why this user cannot mount a realm's FUSE server, if it cannot: no `fusermount3`, or a
/// `/dev/fuse` it may not open (fusermount3 opens it as the user). [`attach()`] asks first;
/// doctor says the same.
pub fn unavailable() -> Option<String> {
    if paths::fusermount().is_none() {
        return Some("fusermount3 is not installed (package fuse3)".into());
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => None,
        Err(e) => Some(format!(
            "/dev/fuse: {e} (it must be 0666, as udev makes it)"
        )),
    }
}
