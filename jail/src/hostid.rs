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
    // Root of a user namespace (a container) may not have the range mapped: then nobody, and
    // where even that is unmapped, root's own ids (an unprivileged user outside).
    let mapped = |first: u32, n: u32| ["uid_map", "gid_map"].iter().all(|m| maps(m, first, n));
    // The range is checked first: a lock is taken only for an id the namespace can map.
    if mapped(FIRST, SLOTS) {
        if let Some(id) = allocate_in(std::path::Path::new(LOCK_DIR)) {
            return id;
        }
    }
    tracing::debug!("no per-proc host id ({LOCK_DIR} unusable or the range unmapped)");
    let (uid, gid) = if mapped(65534, 1) {
        (65534, 65534)
    } else {
        tracing::warn!(
            "this user namespace maps neither a per-proc id nor nobody: the proc runs as the \
             supervisor's own ids"
        );
        (uid, gid)
    };
    HostId {
        uid,
        gid,
        lock: None,
    }
}

/// Whether `/proc/self/{map}` maps ids `first..first + n` into our user namespace.
fn maps(map: &str, first: u32, n: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/{map}")) else {
        return false;
    };
    let end = u64::from(first) + u64::from(n);
    text.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        matches!(f.as_slice(), [inside, _, count]
            if *inside <= u64::from(first) && end <= inside.saturating_add(*count))
    })
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
    fn the_range_is_mapped_here() {
        // This test runs in the initial user namespace (0 0 4294967295) or in one that maps
        // at least the range; a namespace without it falls back to nobody.
        if std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| m.trim() == "0 0 4294967295")
        {
            assert!(maps("uid_map", FIRST, SLOTS) && maps("gid_map", 65534, 1));
            assert!(!maps("uid_map", u32::MAX, 1));
        }
    }

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
