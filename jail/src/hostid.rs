//! The host identity of a proc. An ordinary user can map only its own ids, so its procs run as
//! the user. A root supervisor gives each proc an id of its own on the host, from a range no
//! account uses ([`FIRST`], [`SLOTS`] of them), held by a lock file in [`LOCK_DIR`] for as long
//! as the supervisor runs: no two procs share a host uid, none shares one with a host daemon
//! (as `nobody` would), and `RLIMIT_NPROC` counts one proc's processes only. Where no lock can
//! be taken (no writable `/run`), the proc runs as `nobody` (65534), still never root.
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::sync::Arc;

/// The first host uid/gid handed to procs (0x70000000: above the ranges distributions and
/// systemd give to accounts and containers).
pub const FIRST: u32 = 0x7000_0000;
/// How many procs can hold an id at once.
pub const SLOTS: u32 = 65536;
/// Where the ids in use are locked (root only).
pub const LOCK_DIR: &str = "/run/sigma-supervise/ids";

/// A host identity; the lock (a root supervisor's) keeps it this proc's alone while it is held.
#[derive(Debug, Clone)]
pub struct HostId {
    pub uid: u32,
    pub gid: u32,
    pub lock: Option<Arc<Lock>>,
}

/// A held id's lock.
pub type Lock = nix::fcntl::Flock<std::fs::File>;

/// The host identity for a new proc of this supervisor.
pub fn allocate() -> HostId {
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if uid != 0 {
        return HostId {
            uid,
            gid,
            lock: None,
        };
    }
    match allocate_in(std::path::Path::new(LOCK_DIR)) {
        Some(id) => id,
        None => {
            tracing::debug!("no per-proc host id ({LOCK_DIR} unusable): the proc runs as nobody");
            HostId {
                uid: 65534,
                gid: 65534,
                lock: None,
            }
        }
    }
}

/// The first free slot, starting from one derived from our pid (so concurrent supervisors
/// rarely try the same ones).
pub fn allocate_in(dir: &std::path::Path) -> Option<HostId> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .ok()?;
    let start = std::process::id().wrapping_mul(2_654_435_761) % SLOTS;
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(dir.join(slot.to_string()))
            .ok()?;
        if let Ok(lock) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            let id = FIRST + slot;
            return Some(HostId {
                uid: id,
                gid: id,
                lock: Some(Arc::new(lock)),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_while_held_and_free_again_after() {
        let dir = tempfile::tempdir().unwrap();
        let a = allocate_in(dir.path()).unwrap();
        let b = allocate_in(dir.path()).unwrap();
        assert_ne!(a.uid, b.uid);
        assert!((FIRST..FIRST + SLOTS).contains(&a.uid) && a.gid == a.uid);
        let taken = a.uid;
        drop(a);
        // Released: the same pid starts at the same slot, so it gets it back.
        let c = allocate_in(dir.path()).unwrap();
        assert_eq!(c.uid, taken);
        drop((b, c));
    }
}
