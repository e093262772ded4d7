//! Idmapped binds for a root supervisor. Its proc runs as an unprivileged host id, so the
//! invoking user's (root's) own files — the working directory, the script — would show as
//! someone else's. A bind marked `idmap` is cloned by the supervisor (root in the initial user
//! namespace, which idmapping requires) with an id mapping that shows files owned by host uid 0
//! as the proc's own and writes the proc's new files as uid 0 on disk; files of other owners
//! stay foreign. The init of the jail then only attaches the prepared tree.
#![allow(unsafe_code)]

use crate::plan::Plan;
use crate::sys;
use nix::errno::Errno;
use std::os::fd::{AsFd, OwnedFd};

/// A user namespace mapping inside 0 to the proc's host ids, as an fd (a short-lived helper
/// process makes it).
fn mapping_userns(host_uid: u32, host_gid: u32) -> Result<OwnedFd, String> {
    let (r, w) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the supervisor is single-threaded here (before the jail is cloned); the child only
    // blocks on a pipe read and exits.
    let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER) }
        .map_err(|e| format!("creating the id-mapping user namespace: {}", e.desc()))?;
    if pid == 0 {
        drop(w);
        let mut b = [0u8; 1];
        let _ = nix::unistd::read(&r, &mut b);
        sys::exit_now(0)
    }
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

impl Plan {
    /// Prepare the idmapped binds (a root supervisor only; nothing to do otherwise). Call
    /// before [`crate::clone_into_namespaces`].
    pub fn prepare_idmapped(&mut self) -> Result<(), String> {
        let want: Vec<usize> = (0..self.sources.len())
            .filter(|i| self.idmap.get(*i).copied().unwrap_or(false))
            .collect();
        if want.is_empty() || !nix::unistd::geteuid().is_root() || self.spec.host_uid == 0 {
            return Ok(());
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
                Ok(()) => self.premade[i] = Some(tree),
                // A filesystem without idmapping support: shown as it is.
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
        Ok(())
    }
}
