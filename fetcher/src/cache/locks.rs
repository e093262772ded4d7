//! Locks: the in-process maps' mutexes, and the `flock`s that make one install of a package
//! per realm and one download of an archive per machine (see "Single flight" in [`super`]).

use std::path::Path;
use std::sync::Mutex;

use crate::error::{FetchError, IoContext, Result};

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded maps are updated by single inserts; a panic cannot leave them inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Take the package's file lock (blocking in a worker thread). Released on drop.
pub(super) async fn flock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || flock_blocking(&path))
        .await
        .map_err(|e| FetchError::invalid("flock", e))?
}

/// Take the lock of an archive: at once if free, else waiting for it (in a worker thread).
/// Returns the lock and whether it had to be waited for.
pub(super) async fn flock_archive(path: &Path) -> Result<(nix::fcntl::Flock<std::fs::File>, bool)> {
    use nix::fcntl::{Flock, FlockArg};
    match Flock::lock(open_lock(path)?, FlockArg::LockExclusiveNonblock) {
        Ok(held) => Ok((held, false)),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            let path = path.to_owned();
            tokio::task::spawn_blocking(move || {
                Flock::lock(file, FlockArg::LockExclusive)
                    .map(|held| (held, true))
                    .map_err(|(_, errno)| FetchError::io("flock", &path, errno.into()))
            })
            .await
            .map_err(|e| FetchError::invalid("flock", e))?
        }
        Err((_, errno)) => Err(FetchError::io("flock", path, errno.into())),
    }
}

/// Take an exclusive lock on the file `path` (created if missing), waiting for it.
pub(super) fn flock_blocking(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    nix::fcntl::Flock::lock(open_lock(path)?, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, errno)| FetchError::io("flock", path, errno.into()))
}

/// Open (creating if missing) the lock file `path`, to flock.
pub fn open_lock(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ctx("open lock", path)
}
