//! procd starts the trampoline in new mount and pid namespaces but leaves the old `/proc`
//! mounted: its `/proc/N` are the parent namespace's pids, so the jail's id maps, written to
//! `/proc/CHILD/…` by the child's pid in this namespace, would name no process (or another
//! one). The trampoline mounts a procfs of its own pid namespace on `/proc`, in its own mount
//! namespace only (a new one, `/` a slave), so nothing propagates back to procd's.
#![forbid(unsafe_code)]

use anyhow::anyhow;
use nix::mount::{mount, MsFlags};

/// Whether `/proc` shows another pid namespace than this process's: `/proc/self` then names
/// a pid this process does not have here.
pub fn foreign() -> bool {
    let me = std::process::id().to_string();
    std::fs::read_link("/proc/self").is_ok_and(|p| p.as_os_str() != me.as_str())
}

/// Mount this pid namespace's procfs on `/proc` when the one there is another namespace's,
/// in a mount namespace of the trampoline's own (made here: procd's per-proc one is not
/// assumed), `/` a slave of the one it came from.
pub fn ensure_own() -> anyhow::Result<()> {
    if !foreign() {
        return Ok(());
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| anyhow!("a mount namespace for this pid namespace's /proc: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| anyhow!("making / a slave mount: {e}"))?;
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| anyhow!("mounting this pid namespace's /proc: {e}"))?;
    Ok(())
}
