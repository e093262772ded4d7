//! A streaming install run in another process ([`Delegate`]), so that it outlives the one
//! that asked for it.

use std::sync::Arc;

use super::placement::{FileHook, Placement};
use crate::error::Result;
use crate::index::Package;

/// Runs a package's streaming download in another process ([`RealmCache::set_delegate`](super::RealmCache::set_delegate)),
/// so that it outlives the process that asked for it: a supervisor whose target needed only a
/// package's first files exits when the target does, and the rest arrives all the same.
pub trait Delegate: Send + Sync {
    /// Blocking. Start a process that installs `pkg` (its archive is not in the store) into
    /// this realm's lib dir exactly as [`RealmCache::fill`](super::RealmCache::fill) does, handing it `lock`: the
    /// package's lock file, locked by the caller. The lock is one open file shared by both,
    /// so it holds until both have closed it, and the caller keeps it until this returns.
    /// Report what the process says as it goes: the skeleton placed to `placement`
    /// ([`Placement::placed`], never `ended`) and each verified file to `hook`, with its
    /// lib-dir path.
    ///
    /// `Some(Ok(bytes))` once the package is installed (marker written; the process may go on
    /// to build the package's shared tree); `Some(Err(..))` when the install failed or the
    /// process ended without saying (it is gone then); `None` when no process could be
    /// started (the caller installs itself).
    fn install(
        &self,
        pkg: &Package,
        lock: &std::fs::File,
        placement: &Arc<dyn Placement>,
        hook: Option<&Arc<FileHook>>,
    ) -> Option<Result<u64>>;
}
