//! Idmapped binds for a root supervisor. Its proc runs as an unprivileged host id, so the
//! invoking user's (root's) own files — the working directory, the script — would show as
//! someone else's. A bind marked `idmap` is cloned by the supervisor (root in the initial user
//! namespace, which idmapping requires) with an id mapping that shows files owned by host uid 0
//! as the proc's own and writes the proc's new files as uid 0 on disk; files of other owners
//! stay foreign. The supervisor makes these trees while init clones the other sources, and
//! sends them over; init then only attaches them.
#![allow(unsafe_code)]

use crate::plan::Plan;
use crate::sys;
use nix::errno::Errno;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Whether `dir` can be idmapped as a run's binds are (doctor's probe): the same namespace and
/// calls, the tree dropped unattached.
pub(crate) fn probe(dir: &std::path::Path) -> Result<(), String> {
    let c =
        std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let userns = mapping_userns(0x7000_0000, 0x7000_0000)?;
    let tree = sys::clone_tree(&c).map_err(|e| format!("open_tree: {}", e.desc()))?;
    sys::idmap_tree(tree.as_fd(), userns.as_fd())
        .map_err(|e| format!("mount_setattr: {}", e.desc()))
}

/// A user namespace mapping inside 0 to the proc's host ids, as an fd (a short-lived helper
/// process makes it).
pub(crate) fn mapping_userns(host_uid: u32, host_gid: u32) -> Result<OwnedFd, String> {
    let (r, w) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let pid = sys::clone_waiter(libc::CLONE_NEWUSER, r.as_fd(), w.as_fd())
        .map_err(|e| format!("creating the id-mapping user namespace: {}", e.desc()))?;
    drop(r);
    let res = (|| {
        let base = format!("/proc/{pid}");
        std::fs::write(format!("{base}/uid_map"), format!("0 {host_uid} 1\n"))?;
        std::fs::write(format!("{base}/setgroups"), "deny")?;
        std::fs::write(format!("{base}/gid_map"), format!("0 {host_gid} 1\n"))?;
        std::fs::File::open(format!("{base}/ns/user")).map(OwnedFd::from)
    })()
    .map_err(|e| format!("mapping ids for idmapped binds: {e}"));
    drop(w);
    // The namespace lives on through our fd; the helper has served its purpose (no waiting
    // for it to notice the pipe's end, nor for it to die: the supervisor reaps every child it
    // has when the run ends).
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    res
}

/// The most idmapped binds a run may have: one message carries their trees to init.
pub const MAX_IDMAPPED: usize = 64;
const _: () = assert!(MAX_IDMAPPED <= sys::MAX_PASSED_FDS);

impl Plan {
    /// The idmapped binds' trees, by source index (a root supervisor only,
    /// [`Plan::idmapped_later`]; none otherwise). The supervisor makes them once init exists,
    /// while init clones the other sources, then sends them ([`crate::send_idmapped`]). A
    /// source on a filesystem without idmapping support has none: init clones it as it is.
    pub fn prepare_idmapped(&self) -> Result<Vec<(usize, OwnedFd)>, String> {
        let mut trees = Vec::new();
        if !self.idmapped_later {
            return Ok(trees);
        }
        let want: Vec<usize> = (0..self.sources.len())
            .filter(|i| self.idmap.get(*i).copied().unwrap_or(false))
            .collect();
        if want.len() > MAX_IDMAPPED {
            return Err(format!(
                "{} binds want an idmapped mount; at most {MAX_IDMAPPED} can",
                want.len()
            ));
        }
        let userns = mapping_userns(self.spec.host_uid, self.spec.host_gid)?;
        for i in want {
            let (src, rw) = &self.sources[i];
            let tree = sys::clone_tree(src)
                .map_err(|e| format!("bind {}: open_tree: {}", src.to_string_lossy(), e.desc()))?;
            let mut attrs = sys::MOUNT_ATTR_NOSUID;
            if !rw {
                attrs |= sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV;
            }
            let r: Result<(), Errno> = sys::idmap_tree(tree.as_fd(), userns.as_fd())
                .and_then(|()| sys::set_tree_attrs(tree.as_fd(), attrs));
            match r {
                Ok(()) => trees.push((i, tree)),
                // A filesystem without idmapping support: shown as it is (init clones it).
                Err(Errno::EINVAL) | Err(Errno::EOPNOTSUPP) => {
                    tracing::debug!("{}: no idmapped mount here", src.to_string_lossy())
                }
                Err(e) => {
                    return Err(format!(
                        "bind {}: idmapping: {}",
                        src.to_string_lossy(),
                        e.desc()
                    ))
                }
            }
        }
        Ok(trees)
    }
}

/// Send the trees [`Plan::prepare_idmapped`] made to init over `sock` (a `SOCK_SEQPACKET`
/// socket): one message, the source index of each tree as data, the trees as SCM_RIGHTS.
/// Sent even when empty: init waits for it whenever [`Plan::idmapped_later`].
pub fn send_idmapped(trees: &[(usize, OwnedFd)], sock: BorrowedFd<'_>) -> Result<(), String> {
    // A count first, so the message is never empty.
    let mut data = Vec::with_capacity(4 * (trees.len() + 1));
    data.extend_from_slice(&(trees.len() as u32).to_ne_bytes());
    for (i, _) in trees {
        data.extend_from_slice(&(*i as u32).to_ne_bytes());
    }
    let fds: Vec<_> = trees.iter().map(|(_, t)| t.as_raw_fd()).collect();
    match sys::send_with_fds(sock, &data, &fds) {
        Ok(n) if n == data.len() => Ok(()),
        Ok(_) => Err("sending the idmapped trees: short send".into()),
        Err(e) => Err(format!("sending the idmapped trees: {}", e.desc())),
    }
}

/// In init: the trees [`send_idmapped`] sent, by source index. `None` on EOF (the
/// supervisor gave up) or a malformed message.
pub(crate) fn receive(sock: BorrowedFd<'_>, sources: usize) -> Option<Vec<(usize, OwnedFd)>> {
    let mut buf = [0u8; 4 * MAX_IDMAPPED + 4];
    let (n, fds) = sys::recv_with_fds(sock, &mut buf).ok()?;
    let word = |i: usize| -> Option<usize> {
        let b: [u8; 4] = buf.get(i * 4..i * 4 + 4)?.try_into().ok()?;
        usize::try_from(u32::from_ne_bytes(b)).ok()
    };
    let count = word(0)?;
    if n != 4 * (count + 1) || fds.len() != count {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    for (k, fd) in fds.into_iter().enumerate() {
        let i = word(k + 1).filter(|&i| i < sources)?;
        out.push((i, fd));
    }
    Some(out)
}
