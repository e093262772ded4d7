//! The lazy backend: a realm's libraries as a filesystem the kernel serves from the first touch.
//!
//! The realm's index snapshot is materialised as placeholders on a dedicated ext4 image
//! (`<realm>/lazy/<key>.img`, loop-mounted at `<realm>/lazy/<key>/`): every directory, every
//! file with its size and no data (sparse). Listing, `stat` and `importlib.metadata`'s directory
//! scans never leave the kernel and fetch nothing. The proc's own mount of the image (its
//! read-only bind at the prefix) carries a fanotify mount mark of its supervisor's pre-content
//! group (`FAN_OPEN_PERM` and `FAN_PRE_ACCESS`: open, read, mmap, execve, and
//! `lseek(SEEK_DATA)` after an open all wait): a first touch blocks the reader in the kernel
//! while [`FillServer`] makes sure the file's package is in the realm cache (the fetcher's single
//! flight and per-file sha256), copies the verified bytes into the placeholder (through the
//! image's root, in the kernel), allows the access and adds an ignore mark, after which that file
//! is ordinary page cache. Packages the realm has installed from the image's archives are shown
//! from its lib dir over their placeholders (a bind per top-level entry,
//! [`entries_from_lib`](crate::snapshot::entries_from_lib)): nothing installed is copied into the image. A realm once
//! complete is mounted from its lib dir and its images are detached and removed ([`retire`]).
//! A default run that finds no image made has it made by a process of its own, off its path,
//! for the next run ([`prepare_in_background`]), and is served meanwhile by the realm's FUSE
//! server (`fuse/`; by notification where none can be had).
//! A fill that fails (store down, integrity) answers `FAN_DENY_ERRNO(EIO)`: an error, never
//! zeros. Files are identified by inode (the map is written when the image is materialised),
//! never by path.
//!
//! Exactly one process answers a reader's events: its own supervisor, whose mark is on that
//! proc's mount alone ([`LazyImage::watch`]); a reader is never unwatched while its supervisor
//! lives, and its jail dies with that supervisor. Supervisors of a realm that fill the same
//! file take turns (a lock on the placeholder), and the second finds it complete. Fills write
//! through the host mount, which no group watches. The end of a group (its marks destroyed: an
//! SRCU grace period, 5-15 ms) is left to a holder process that exits after the run, so no run
//! waits for it ([`hold()`]).
//! Needs `CAP_SYS_ADMIN` in the initial namespace (mount, fanotify); without it the
//! notification path serves the realm.
#![forbid(unsafe_code)]

mod hold;
mod image;
mod prepare;
mod server;

pub use hold::{hold, HOLDER_ARG0};
pub use image::{image_ready, retire, LazyImage};
pub use prepare::{prepare_in_background, prepare_main, remember_unavailable, PREP_ARG0};
pub use server::{FillServer, FillStats};

/// Whether pre-content events can be had on `dir`'s mount: the image's own probe ([`image`]'s
/// `mark`), for doctor.
pub(crate) fn pre_content(dir: &std::path::Path) -> Result<(), crate::snapshot::LazyError> {
    image::mark(dir).map(|_| ())
}
