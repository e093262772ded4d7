//! A pid namespace's own `/proc`, for a process started in new mount and pid namespaces whose
//! creator left the old `/proc` mounted (σOS's procd does, for its trampoline): its `/proc/N`
//! are the parent namespace's pids, so the jail's id maps, written to `/proc/CHILD/…` by the
//! child's pid in this namespace, would name no process (or another one). [`ensure_own`](crate::procfs::ensure_own)
//! mounts a procfs of this pid namespace on `/proc`, in a mount namespace of this process's
//! own (a new one, `/` a slave), so nothing propagates back to the creator's.
#![forbid(unsafe_code)]

use crate::JailError;
use nix::mount::{mount, MsFlags};

fn io(what: &str) -> impl FnOnce(nix::errno::Errno) -> JailError + '_ {
    move |e| JailError::Io {
        what: what.to_owned(),
        source: e.into(),
    }
}

/// Whether `/proc` shows another pid namespace than this process's: `/proc/self` then names
/// a pid this process does not have here.
pub fn foreign() -> bool {
    let me = std::process::id().to_string();
    std::fs::read_link("/proc/self").is_ok_and(|p| p.as_os_str() != me.as_str())
}

/// Mount this pid namespace's procfs on `/proc` when the one there is another namespace's,
/// in a mount namespace of this process's own (made here: the creator's is not assumed), `/` a
/// slave of the one it came from. Before anything forks.
pub fn ensure_own() -> Result<(), JailError> {
    if !foreign() {
        return Ok(());
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(io("a mount namespace for this pid namespace's /proc"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(io("making / a slave mount"))?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(io("mounting this pid namespace's /proc"))?;
    Ok(())
}
