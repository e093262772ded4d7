//! Reading and writing the target's memory, re-checking the notification id.
//!
//! Reads use `process_vm_readv`, falling back to `/proc/<pid>/mem` when the kernel lacks it
//! (ENOSYS). The notification id is re-checked with `NOTIF_ID_VALID` after every read: if the
//! target died (and its pid was perhaps reused) what we read may belong to someone else, so the
//! result is discarded and ENOENT returned. The one exception,
//! [`TargetMem::read_path_for_answer`], is for a path whose only use is the answer to the
//! notification itself, which the kernel refuses once it is gone. Writes re-check the id
//! before writing.
#![forbid(unsafe_code)]

use crate::listener::{Listener, Notification};
use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;
use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Longest path the kernel accepts, including its NUL.
pub const PATH_MAX: usize = libc::PATH_MAX as usize;
/// Reads never cross a multiple of this (4096 divides every x86_64 page size), so a string
/// that ends right before an unmapped page is read without touching that page.
const PAGE: u64 = 4096;
/// First chunk of a path read: most paths are short, no need to copy a whole page.
const FIRST_CHUNK: usize = 256;

/// Set once process_vm_readv/writev turn out to be missing (ENOSYS).
static USE_PROC_MEM: AtomicBool = AtomicBool::new(false);

/// Make every later access use `/proc/<pid>/mem` instead of process_vm_readv/writev, as on a
/// kernel without them (process-wide, irreversible). For tests of the fallback path.
#[doc(hidden)]
pub fn force_proc_mem_fallback() {
    USE_PROC_MEM.store(true, Ordering::Relaxed);
}

/// Access to one notifying target's memory, valid while its notification is.
pub struct TargetMem<'a> {
    pub listener: &'a Listener,
    pub notif: &'a Notification,
}

fn map_err(e: Errno) -> Errno {
    match e {
        // The target is gone: its notification is too.
        Errno::ESRCH => Errno::ENOENT,
        // /proc/<pid>/mem reports unmapped addresses as EIO.
        Errno::EIO => Errno::EFAULT,
        e => e,
    }
}

impl<'a> TargetMem<'a> {
    pub fn new(listener: &'a Listener, notif: &'a Notification) -> Self {
        TargetMem { listener, notif }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.notif.pid as i32)
    }

    fn check_id(&self) -> Result<(), Errno> {
        if self.listener.id_valid(self.notif.id) {
            Ok(())
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// Read exactly `buf.len()` bytes at `addr`, without the id check. A short read is EFAULT.
    fn read_raw(&self, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        if buf.is_empty() {
            return Ok(());
        }
        addr.checked_add(buf.len() as u64).ok_or(Errno::EFAULT)?;
        if !USE_PROC_MEM.load(Ordering::Relaxed) {
            let mut done = 0usize;
            while done < buf.len() {
                let remote = [RemoteIoVec {
                    base: (addr + done as u64) as usize,
                    len: buf.len() - done,
                }];
                let mut local = [IoSliceMut::new(&mut buf[done..])];
                match process_vm_readv(self.pid(), &mut local, &remote) {
                    Ok(0) => return Err(Errno::EFAULT),
                    Ok(n) => done += n,
                    Err(Errno::EINTR) => continue,
                    Err(Errno::ENOSYS) => {
                        USE_PROC_MEM.store(true, Ordering::Relaxed);
                        return self.read_proc_mem(addr, buf);
                    }
                    Err(e) => return Err(map_err(e)),
                }
            }
            return Ok(());
        }
        self.read_proc_mem(addr, buf)
    }

    fn proc_mem(&self, write: bool) -> Result<std::fs::File, Errno> {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .open(format!("/proc/{}/mem", self.notif.pid))
            .map_err(|e| map_err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))
    }

    fn read_proc_mem(&self, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let f = self.proc_mem(false)?;
        f.read_exact_at(buf, addr)
            .map_err(|e| match e.raw_os_error() {
                Some(n) => map_err(Errno::from_raw(n)),
                None => Errno::EFAULT, // UnexpectedEof
            })
    }

    fn write_raw(&self, addr: u64, data: &[u8]) -> Result<(), Errno> {
        if data.is_empty() {
            return Ok(());
        }
        addr.checked_add(data.len() as u64).ok_or(Errno::EFAULT)?;
        if !USE_PROC_MEM.load(Ordering::Relaxed) {
            let mut done = 0usize;
            while done < data.len() {
                let remote = [RemoteIoVec {
                    base: (addr + done as u64) as usize,
                    len: data.len() - done,
                }];
                let local = [IoSlice::new(&data[done..])];
                match process_vm_writev(self.pid(), &local, &remote) {
                    Ok(0) => return Err(Errno::EFAULT),
                    Ok(n) => done += n,
                    Err(Errno::EINTR) => continue,
                    Err(Errno::ENOSYS) => {
                        USE_PROC_MEM.store(true, Ordering::Relaxed);
                        return self.write_proc_mem(addr + done as u64, &data[done..]);
                    }
                    Err(e) => return Err(map_err(e)),
                }
            }
            return Ok(());
        }
        self.write_proc_mem(addr, data)
    }

    fn write_proc_mem(&self, addr: u64, data: &[u8]) -> Result<(), Errno> {
        let f = self.proc_mem(true)?;
        f.write_all_at(data, addr)
            .map_err(|e| match e.raw_os_error() {
                Some(n) => map_err(Errno::from_raw(n)),
                None => Errno::EFAULT, // WriteZero
            })
    }

    /// Read a NUL-terminated path (≤ PATH_MAX) page by page. Errors are errnos for the target:
    /// EFAULT for a bad pointer, ENAMETOOLONG, ENOENT if the notification went away.
    ///
    /// Each read stops at the end of a page, so a string that ends just before an unmapped page
    /// is read correctly. The id is re-checked after every read. An empty string is returned
    /// as is (the caller decides between ENOENT and AT_EMPTY_PATH).
    pub fn read_path(&self, addr: u64) -> Result<CString, Errno> {
        let mut out = Vec::new();
        self.read_path_into(addr, &mut out)?;
        // No interior NUL: the read stopped at the first one.
        CString::new(out).map_err(|_| Errno::EFAULT)
    }

    /// [`TargetMem::read_path`] into `out` (replacing its contents, without the NUL). `out`
    /// keeps its capacity, so a caller that reuses it reads paths without allocating.
    pub fn read_path_into(&self, addr: u64, out: &mut Vec<u8>) -> Result<(), Errno> {
        self.read_path_checked(addr, out, true)
    }

    /// [`TargetMem::read_path_into`] without the id check after each read, for a caller whose
    /// only use of the path is its answer to this notification (which the kernel refuses once
    /// the notification is gone: a path read from a process that took over the target's pid
    /// never decides anything) and which checks the id itself before anything else it does
    /// on the path's account (opening it, fetching, recording it).
    pub fn read_path_for_answer(&self, addr: u64, out: &mut Vec<u8>) -> Result<(), Errno> {
        self.read_path_checked(addr, out, false)
    }

    fn read_path_checked(&self, addr: u64, out: &mut Vec<u8>, check: bool) -> Result<(), Errno> {
        out.clear();
        out.reserve(FIRST_CHUNK);
        let mut cur = addr;
        let mut chunk_limit = FIRST_CHUNK;
        loop {
            let len = out.len();
            let room = PATH_MAX - len;
            if room == 0 {
                if check {
                    self.check_id()?;
                }
                return Err(Errno::ENAMETOOLONG);
            }
            let to_page_end = (PAGE - cur % PAGE) as usize;
            let n = to_page_end.min(room).min(chunk_limit);
            chunk_limit = PAGE as usize;
            out.resize(len + n, 0);
            let res = self.read_raw(cur, &mut out[len..]);
            // Whatever we got, it only means something if the target is still the one that
            // made this call.
            if check {
                self.check_id()?;
            }
            res?;
            if let Some(pos) = out[len..].iter().position(|&b| b == 0) {
                out.truncate(len + pos);
                return Ok(());
            }
            cur = cur.checked_add(n as u64).ok_or(Errno::EFAULT)?;
        }
    }

    /// Read exactly `buf.len()` bytes at `addr` (EFAULT if any of it is unmapped), then
    /// re-check the id (ENOENT if the notification went away).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let res = self.read_raw(addr, buf);
        self.check_id()?;
        res
    }

    /// Write `data` at `addr` after checking that the notification is still valid (ENOENT if
    /// not). EFAULT if the range is unmapped or not writable (process_vm_writev honours page
    /// protections; the `/proc/<pid>/mem` fallback does not).
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), Errno> {
        self.check_id()?;
        self.write_raw(addr, data)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_max_is_the_kernels() {
        assert_eq!(super::PATH_MAX, 4096);
    }
}
