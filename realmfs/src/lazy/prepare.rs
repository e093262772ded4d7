//! Making a realm's image off the run's path: a process of its own ([`PREP_ARG0`]) that waits
//! for the run that started it to end, then makes the image for the next run.
#![forbid(unsafe_code)]

use super::image::LazyImage;
use crate::snapshot::{lock_file, remember, snapshot_index, LazyError};
use nix::fcntl::FlockArg;
use std::path::Path;

/// `argv[0]` of the process that makes a realm's image off the run's path ([`prepare_main`],
/// started by [`prepare_in_background`]).
pub const PREP_ARG0: &str = "sigma-supervise-lazy-prepare";

/// Start making image `key` (`mkfs.ext4`, loop mount, placeholders) in a process of its own,
/// so that the run that found none is not the one that waits for it: served by the FUSE server
/// or by notification, it leaves the image to the next run. Nothing is started while another preparer holds the
/// realm's image lock (it is making one). Starts a thread (the reaper): only once the target
/// is forked.
pub fn prepare_in_background(
    cache_root: &Path,
    realm_dir: &Path,
    key: &str,
    bucket: &str,
) -> std::io::Result<()> {
    let base = realm_dir.join("lazy");
    std::fs::create_dir_all(&base)?;
    match lock_file(&base.join("lock"), FlockArg::LockExclusiveNonblock) {
        // Let go at once: the preparer takes it (a second preparer finds the image made).
        Ok(lock) => drop(lock),
        Err(_) => return Ok(()),
    }
    // Its stdin ends when this process exits: the sign that the run is over.
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let child = crate::fill::helper_process(PREP_ARG0)
        .arg(cache_root)
        .arg(realm_dir)
        .arg(key)
        .arg(bucket)
        .stdin(std::process::Stdio::from(rx))
        .stdout(std::process::Stdio::null())
        .spawn()?;
    // Closed by the kernel when this process exits.
    std::mem::forget(tx);
    // Reaped whenever it is done (or by init once this process has exited).
    std::thread::Builder::new()
        .name("sigma-lazy-prep-reap".into())
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        })?;
    Ok(())
}

/// How long the preparer waits for the run that started it to end before it starts anyway.
pub(super) const PREP_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// The preparer's whole life: wait for the run that started it to end (end of file on stdin;
/// at most [`PREP_AFTER`]), so its work (`mkfs.ext4`, the loop mount, a placeholder per file)
/// does not take a CPU from the run's program, then, in `SCHED_IDLE` where allowed, make the
/// image named on the command line (`CACHE_ROOT REALM_DIR KEY BUCKET`) from the realm's index
/// snapshot, confined once the image is mounted ([`crate::confine`]); where that fails, remember why in the realm's `lazy-unavailable` (as a run would).
/// Exit status 0 when the image is ready.
pub fn prepare_main() -> ! {
    use std::os::fd::AsFd as _;
    jail::close_fds_from(3);
    let stdin = std::io::stdin();
    let mut fds = [nix::poll::PollFd::new(
        stdin.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let timeout =
        nix::poll::PollTimeout::try_from(PREP_AFTER).unwrap_or(nix::poll::PollTimeout::MAX);
    while let Err(nix::errno::Errno::EINTR) = nix::poll::poll(&mut fds, timeout) {}
    let _ = crate::sys::idle_process();
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let [root, realm_dir, key, bucket] = args.as_slice() else {
        std::process::exit(2)
    };
    let (realm_dir, key) = (Path::new(realm_dir), key.to_string_lossy().into_owned());
    let bucket = bucket.to_string_lossy().into_owned();
    // Once the image is mounted, what is left is the index's work (a placeholder per file it
    // lists): done as a fill process unpacks, writing only under the cache root, running
    // nothing, mounting nothing.
    let confine = || {
        crate::confine::confine(&[Path::new(root)], &[])
            .map(drop)
            .map_err(|e| LazyError::Io {
                op: "confine",
                path: Path::new(root).to_owned(),
                source: std::io::Error::other(format!("{e:#}")),
            })
    };
    let index = || snapshot_index(realm_dir, &bucket);
    match LazyImage::prepare_confined(realm_dir, &key, index, confine) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            remember_unavailable(realm_dir, &e);
            std::process::exit(1)
        }
    }
}

/// Keep why no image could be made in the realm's `lazy-unavailable` (default runs do not
/// try again for a day).
pub fn remember_unavailable(realm_dir: &Path, e: &LazyError) {
    remember(&realm_dir.join("lazy-unavailable"), e);
}
