//! Reading and writing the target's memory, always re-checking the notification id.
use crate::listener::{Listener, Notification};
use std::ffi::CString;

/// Access to one notifying target's memory, valid while its notification is.
pub struct TargetMem<'a> {
    pub listener: &'a Listener,
    pub notif: &'a Notification,
}

impl TargetMem<'_> {
    /// Read a NUL-terminated path (≤ PATH_MAX) page by page. Errors are errnos for the target:
    /// EFAULT for a bad pointer, ENAMETOOLONG, ENOENT if the notification went away.
    pub fn read_path(&self, addr: u64) -> Result<CString, nix::errno::Errno> {
        todo!()
    }
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), nix::errno::Errno> {
        todo!()
    }
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), nix::errno::Errno> {
        todo!()
    }
}
