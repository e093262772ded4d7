//! File primitives of the cache: write through a rename (no flush; see the module docs of
//! [`super`]), first writer wins, remove whatever is there, flush a directory or a filesystem,
//! a file's identity, a process's liveness, and links made on every core.

use std::io::Write;
use std::path::Path;

use crate::error::{FetchError, IoContext, Result};
use crate::index::FileEntry;

/// A file's identity for keys of remembered answers: device, inode, size, modification and
/// change times. A file replaced or written since has another (the writers here rename).
pub fn identity(m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt as _;
    format!(
        "{}:{}:{}:{}.{}:{}.{}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// Write `data` to `path` through a temporary name and a rename, without flushing: a reader
/// never sees half a file; durability is the boot stamp's concern (see the module docs).
pub fn write_renamed(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .ctx("create temp file in", dir)?;
    tmp.write_all(data).ctx("write", tmp.path())?;
    tmp.persist(path)
        .map_err(|e| FetchError::io("rename into", path, e.error))?;
    Ok(())
}

/// Write `data` at `path` unless a file is already there; return what ends up there.
pub(super) fn persist_first(path: &Path, data: &[u8]) -> Result<Vec<u8>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .ctx("create temp file in", dir)?;
    tmp.write_all(data).ctx("write", tmp.path())?;
    match std::fs::hard_link(tmp.path(), path) {
        Ok(()) => Ok(data.to_vec()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(path).ctx("read", path)
        }
        Err(e) => Err(FetchError::io("link", path, e)),
    }
}

pub(super) fn remove_any(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).ctx("remove", path),
        Ok(_) => std::fs::remove_file(path).ctx("remove", path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FetchError::io("stat", path, e)),
    }
}

pub(super) fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync dir", dir)
}

/// Flush the whole filesystem holding `dir` (data and metadata of every file on it).
pub(super) fn sync_fs(dir: &Path) -> Result<()> {
    let d = std::fs::File::open(dir).ctx("open", dir)?;
    nix::unistd::syncfs(&d).map_err(|e| FetchError::io("syncfs", dir, e.into()))
}

pub(super) fn pid_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(_) => true,
    }
}

/// How many threads an install uses: every core, up to 4.
pub(super) fn install_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 4))
}

/// Run `f` on every file, the list split among [`install_threads`] threads: links into or
/// out of the CAS are independent once the directories exist, and a package is mostly these
/// calls (~1,500 link(2) for numpy). Each thread stops at its first error; that of the
/// earliest part is returned.
pub(super) fn for_each_in_parallel(
    files: &[FileEntry],
    f: impl Fn(&FileEntry) -> Result<()> + Sync,
) -> Result<()> {
    let chunk = files.len().div_ceil(install_threads()).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                let f = &f;
                s.spawn(move || part.iter().try_for_each(f))
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(FetchError::invalid("link", "a link thread failed")))
            })
            .collect::<Result<Vec<()>>>()
    })?;
    Ok(())
}
