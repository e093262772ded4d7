//! Served directories: a virtual PREFIX in the target maps to a host DIR that the target cannot
//! see (its mount namespace hides DIR). The supervisor opens files under DIR itself with
//! openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), so neither `..` nor a symlink escapes DIR.
//!
//! Where a served file comes from is a [`Resolver`]'s business: plain local directories
//! ([`LocalDirs`]), or a realm's libraries ([`crate::realm::RealmResolver`]), which answers
//! [`Lookup::Fetch`] on a miss; the supervisor's receive loop then hands the call to a worker
//! that calls [`Resolver::fetch`] and answers the notification itself, so the loop never waits.
#![forbid(unsafe_code)]

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One served directory, opened once (O_PATH) in the supervisor's own mount namespace.
#[derive(Debug)]
pub struct Served {
    pub prefix: PathBuf,
    pub dir: PathBuf,
    pub dirfd: OwnedFd,
    /// Mount id of the read-only clone: an fd the target got from here (an injected directory,
    /// then used as a dirfd or cwd) is recognised by it.
    pub mnt_id: u64,
}

impl Served {
    /// DIR is opened as a detached read-only clone of its mount tree, so nothing the
    /// supervisor opens there (and injects into the target) can be written through, not even
    /// via a dirfd the target later uses with openat/mkdirat.
    pub fn open(prefix: PathBuf, dir: PathBuf) -> Result<Served, String> {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("served directory {} contains a NUL byte", dir.display()))?;
        let meta = std::fs::metadata(&dir)
            .map_err(|e| format!("served directory {}: {e}", dir.display()))?;
        if !meta.is_dir() {
            return Err(format!(
                "served directory {} is not a directory",
                dir.display()
            ));
        }
        let dirfd = jail::readonly_tree(&c).map_err(|e| {
            format!(
                "served directory {}: cannot make a read-only view (open_tree/mount_setattr): {}",
                dir.display(),
                e.desc()
            )
        })?;
        let mnt_id = crate::sys::statx_fd(dirfd.as_fd(), 0, STATX_MNT_ID)
            .map(|st| st.stx_mnt_id)
            .unwrap_or(0);
        Ok(Served {
            prefix,
            dir,
            dirfd,
            mnt_id,
        })
    }

    /// openat2 beneath DIR. `rest` is relative and free of `..` (the policy guarantees it);
    /// RESOLVE_BENEATH still refuses symlinks that point outside DIR.
    pub fn openat(&self, rest: &Path, flags: OFlag, extra: ResolveFlag) -> Result<OwnedFd, Errno> {
        let rel: &Path = if rest.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rest
        };
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS | extra);
        openat2(self.dirfd.as_fd(), rel, how).map_err(|e| match e {
            // Escaping DIR looks like "not there" to the target.
            Errno::EXDEV => Errno::ENOENT,
            e => e,
        })
    }
}

/// statx(2) mask bit for the mount id.
pub const STATX_MNT_ID: u32 = 0x1000;

/// Where a served path is right now.
pub enum Lookup {
    /// Under the served directory on this host: answer on the receive thread.
    Local,
    /// Answer on the receive thread from another host directory, laid out as the served one
    /// (a realm's listing of its library prefix; a package being streamed into a memory tree).
    /// Held, not borrowed: such a directory may be dropped by the resolver meanwhile.
    At(Arc<Served>),
    /// Known not to be servable (not in the realm's index, or its fetch just failed).
    Fail(Errno),
    /// Must be fetched first: hand the call to a worker. Returned by fetching resolvers
    /// (`realm::RealmResolver`); [`LocalDirs`] never does.
    Fetch,
}

/// Source of served files. `lookup` runs on the receive loop and must not block.
pub trait Resolver: Send + Sync {
    fn lookup(&self, served: &Served, rest: &Path) -> Lookup;
    /// Runs on a worker thread; may block. After Ok the served path is local.
    fn fetch(&self, _served: &Served, _rest: &Path) -> Result<(), Errno> {
        Err(Errno::ENOENT)
    }
    /// Lines for `--stats` (fetch counters), if the resolver has any.
    fn report(&self) -> Option<String> {
        None
    }
    /// Called once the target has exited normally: finish what must not be left half-done.
    fn finish(&self) {}
    /// The prefix of the served directory that mount `mnt_id` stands for, if it is one of the
    /// resolver's [`Lookup::At`] directories that may have been injected as a directory: a
    /// call relative to such an fd is then decided as one under that prefix, through the
    /// resolver (never answered by the kernel from that directory).
    fn mount_prefix(&self, _mnt_id: u64) -> Option<PathBuf> {
        None
    }
}

/// Plain host directories: everything is local.
pub struct LocalDirs;

impl Resolver for LocalDirs {
    fn lookup(&self, _served: &Served, _rest: &Path) -> Lookup {
        Lookup::Local
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_opens_stay_beneath_a_read_only_view() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("../", dir.path().join("up")).unwrap();
        let s = Served::open("/p".into(), dir.path().to_path_buf()).unwrap();
        let e = ResolveFlag::empty();
        assert!(s.openat(Path::new("f"), OFlag::O_RDONLY, e).is_ok());
        assert!(s.openat(Path::new(""), OFlag::O_DIRECTORY, e).is_ok());
        assert_eq!(
            s.openat(Path::new("abs"), OFlag::O_RDONLY, e).unwrap_err(),
            Errno::ENOENT
        );
        assert_eq!(
            s.openat(Path::new("up/x"), OFlag::O_RDONLY, e).unwrap_err(),
            Errno::ENOENT
        );
        assert_eq!(
            s.openat(Path::new("f"), OFlag::O_WRONLY, e).unwrap_err(),
            Errno::EROFS
        );
        assert!(Served::open("/p".into(), dir.path().join("f")).is_err());
    }
}
