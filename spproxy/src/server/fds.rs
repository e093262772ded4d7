//! A connection's fd table and the calls on an fd: Read, Write, Seek. Every offset and
//! length from the wire goes through checked arithmetic; file writes count against the
//! realm's quota and leave holes as holes; object buffers count against the connection's
//! memory budget.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::consts::*;
use crate::proto::Rerror;

use super::quota::Quota;
use super::reply::{bad_offset, io_rerr, no_space, rerr, unknown_fd};
use crate::dirent;

/// Where a directory's entries come from.
#[derive(Clone, Debug)]
pub enum DirSource {
    /// Relative to the scratch root.
    Ux(String),
    /// A bucket and a key prefix ("" or ending in `/`).
    S3 { bucket: String, prefix: String },
}

pub enum Handle {
    File {
        file: File,
        off: u64,
        mode: u32,
    },
    Dir {
        src: DirSource,
        /// The encoded entries, taken at the first read.
        listing: Option<Vec<u8>>,
        off: u64,
    },
    ObjRead {
        data: Vec<u8>,
        off: u64,
    },
    ObjWrite {
        bucket: String,
        key: String,
        buf: Vec<u8>,
        off: u64,
    },
    /// A DirWatch fd: the names last reported and encoded events not yet read.
    Watch {
        src: DirSource,
        known: BTreeSet<String>,
        pending: Vec<u8>,
    },
}

impl Handle {
    /// Bytes of memory this handle holds for the connection.
    fn held(&self) -> u64 {
        let n = match self {
            Handle::File { .. } => 0,
            Handle::Dir { listing, .. } => listing.as_ref().map_or(0, Vec::len),
            Handle::ObjRead { data, .. } => data.len(),
            Handle::ObjWrite { buf, .. } => buf.len(),
            Handle::Watch { known, pending, .. } => {
                pending.len() + known.iter().map(|k| k.len() + 32).sum::<usize>()
            }
        };
        n as u64
    }
}

pub struct FdTable {
    next: u32,
    map: HashMap<u32, Handle>,
    /// Bytes all handles hold.
    held: u64,
    max_fds: usize,
    max_held: u64,
}

impl FdTable {
    pub fn new(max_fds: usize, max_held: u64) -> FdTable {
        FdTable {
            next: 3,
            map: HashMap::new(),
            held: 0,
            max_fds,
            max_held,
        }
    }

    /// Whether `more` bytes fit in the connection's budget.
    pub fn check_budget(&self, more: u64, obj: &str) -> Result<(), Rerror> {
        match self.held.checked_add(more) {
            Some(n) if n <= self.max_held => Ok(()),
            _ => Err(rerr(
                ECODE_NOMEM,
                obj,
                "connection memory budget exhausted: close fds holding object data",
            )),
        }
    }

    pub fn insert(&mut self, h: Handle) -> Result<u32, Rerror> {
        if self.map.len() >= self.max_fds {
            return Err(rerr(
                ECODE_NOMEM,
                "",
                "too many open fds on this connection",
            ));
        }
        let held = h.held();
        self.check_budget(held, "")?;
        // Skip numbers still in use after wrapping around.
        let mut fd = self.next;
        while self.map.contains_key(&fd) || fd == NO_FD || fd < 3 {
            fd = fd.wrapping_add(1);
        }
        self.next = fd.wrapping_add(1);
        self.held += held;
        self.map.insert(fd, h);
        Ok(fd)
    }

    pub fn remove(&mut self, fd: u32) -> Result<Handle, Rerror> {
        let h = self.map.remove(&fd).ok_or_else(|| unknown_fd(fd))?;
        self.held = self.held.saturating_sub(h.held());
        Ok(h)
    }

    /// Runs `f` on the handle, with the bytes left in the budget, and re-counts what the
    /// handle holds afterwards.
    pub fn with<T>(
        &mut self,
        fd: u32,
        f: impl FnOnce(&mut Handle, u64) -> Result<T, Rerror>,
    ) -> Result<T, Rerror> {
        let room = self.max_held.saturating_sub(self.held);
        let h = self.map.get_mut(&fd).ok_or_else(|| unknown_fd(fd))?;
        let before = h.held();
        let r = f(h, room);
        let after = h.held();
        self.held = self.held.saturating_sub(before).saturating_add(after);
        r
    }

    pub fn get(&self, fd: u32) -> Result<&Handle, Rerror> {
        self.map.get(&fd).ok_or_else(|| unknown_fd(fd))
    }
}

/// Reads up to `size` bytes at `off` (`NO_OFFSET`: the fd's offset, which then advances).
/// `max_io` caps one reply.
pub fn read_file(
    file: &File,
    cur: &mut u64,
    size: u64,
    off: u64,
    max_io: u64,
    obj: &str,
) -> Result<Vec<u8>, Rerror> {
    let at = if off == NO_OFFSET { *cur } else { off };
    let len = file.metadata().map_err(|e| io_rerr(&e, obj))?.len();
    let want = size.min(max_io).min(len.saturating_sub(at));
    let want = usize::try_from(want).map_err(|_| bad_offset(obj))?;
    let mut buf = vec![0u8; want];
    let mut got = 0usize;
    while got < want {
        let pos = at.checked_add(got as u64).ok_or_else(|| bad_offset(obj))?;
        match file.read_at(&mut buf[got..], pos) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_rerr(&e, obj)),
        }
    }
    buf.truncate(got);
    if off == NO_OFFSET {
        *cur = at.checked_add(got as u64).ok_or_else(|| bad_offset(obj))?;
    }
    Ok(buf)
}

/// Writes `data` at the fd's offset. The end offset must not overflow and the file's
/// growth must fit in the quota; a hole before `off` stays a hole (pwrite).
pub fn write_file(
    file: &File,
    off: &mut u64,
    mode: u32,
    data: &[Vec<u8>],
    quota: &Quota,
    obj: &str,
) -> Result<u64, Rerror> {
    let total = data
        .iter()
        .try_fold(0u64, |a, d| a.checked_add(d.len() as u64))
        .ok_or_else(|| bad_offset(obj))?;
    let len = file.metadata().map_err(|e| io_rerr(&e, obj))?.len();
    let start = if mode & OAPPEND != 0 { len } else { *off };
    let end = start.checked_add(total).ok_or_else(|| bad_offset(obj))?;
    let grow = end.saturating_sub(len);
    if !quota.reserve(grow) {
        return Err(no_space(obj));
    }
    let mut at = start;
    for d in data {
        if let Err(e) = file.write_all_at(d, at) {
            // Give back what was reserved but not written.
            quota.release(end.saturating_sub(at.max(len)));
            return Err(io_rerr(&e, obj));
        }
        at += d.len() as u64;
    }
    *off = end;
    Ok(total)
}

/// Writes into an object's write buffer (whole-object store: materialised at close), within
/// the room left in the connection's budget and the realm's object size limit.
pub fn write_buf(
    buf: &mut Vec<u8>,
    off: &mut u64,
    data: &[Vec<u8>],
    room: u64,
    max_object: u64,
    obj: &str,
) -> Result<u64, Rerror> {
    let total = data
        .iter()
        .try_fold(0u64, |a, d| a.checked_add(d.len() as u64))
        .ok_or_else(|| bad_offset(obj))?;
    let end = off.checked_add(total).ok_or_else(|| bad_offset(obj))?;
    if end > max_object {
        return Err(no_space(obj));
    }
    let grow = end.saturating_sub(buf.len() as u64);
    if grow > room {
        return Err(rerr(
            ECODE_NOMEM,
            obj,
            "connection memory budget exhausted: close fds holding object data",
        ));
    }
    let end = usize::try_from(end).map_err(|_| bad_offset(obj))?;
    if buf.len() < end {
        buf.resize(end, 0);
    }
    let mut at = usize::try_from(*off).map_err(|_| bad_offset(obj))?;
    for d in data {
        buf[at..at + d.len()].copy_from_slice(d);
        at += d.len();
    }
    *off = end as u64;
    Ok(total)
}

/// Reads from an in-memory object at `off` (`NO_OFFSET`: the fd's offset).
pub fn read_buf(data: &[u8], cur: &mut u64, size: u64, off: u64, max_io: u64) -> Vec<u8> {
    let at = if off == NO_OFFSET { *cur } else { off };
    let s = usize::try_from(at).unwrap_or(usize::MAX).min(data.len());
    let n = usize::try_from(size.min(max_io))
        .unwrap_or(usize::MAX)
        .min(data.len() - s);
    if off == NO_OFFSET {
        *cur = (s + n) as u64;
    }
    data[s..s + n].to_vec()
}

/// A read of a directory fd: whole entries from the fd's offset (or `off`).
pub fn read_dir(listing: &[u8], cur: &mut u64, size: u64, off: u64) -> Vec<u8> {
    let at = if off == NO_OFFSET { *cur } else { off };
    let out = dirent::dir_slice(listing, at, size).to_vec();
    if off == NO_OFFSET {
        *cur = at.saturating_add(out.len() as u64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_buffer_writes_are_checked() {
        let mut buf = Vec::new();
        let mut off = u64::MAX;
        let e = write_buf(&mut buf, &mut off, &[b"x".to_vec()], 1 << 20, 1 << 20, "o");
        assert_eq!(e.unwrap_err().err_code, ECODE_BADOFFSET);
        let mut off = 1 << 40;
        let e = write_buf(&mut buf, &mut off, &[b"x".to_vec()], 1 << 20, 1 << 20, "o");
        assert_eq!(e.unwrap_err().err_code, ECODE_ERROR);
        assert!(buf.is_empty());
        let mut off = 4;
        write_buf(&mut buf, &mut off, &[b"ab".to_vec()], 1 << 20, 1 << 20, "o").unwrap();
        assert_eq!(buf, b"\0\0\0\0ab");
        let mut cur = u64::MAX - 1;
        assert!(read_buf(&buf, &mut cur, u64::MAX, NO_OFFSET, 1 << 20).is_empty());
    }

    #[test]
    fn file_writes_respect_the_quota_and_overflow() {
        let d = tempfile::tempdir().unwrap();
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(d.path().join("f"))
            .unwrap();
        let q = Quota::new(100, 0);
        let mut off = 1u64 << 40;
        let e = write_file(&f, &mut off, ORDWR, &[b"x".to_vec()], &q, "f");
        assert_eq!(e.unwrap_err().err_code, ECODE_ERROR);
        assert_eq!(f.metadata().unwrap().len(), 0);
        let mut off = u64::MAX;
        let e = write_file(&f, &mut off, ORDWR, &[b"x".to_vec()], &q, "f");
        assert_eq!(e.unwrap_err().err_code, ECODE_BADOFFSET);
        let mut off = 90;
        write_file(&f, &mut off, ORDWR, &[vec![1; 10]], &q, "f").unwrap();
        assert_eq!(q.used(), 100);
        let mut cur = 0;
        assert_eq!(
            read_file(&f, &mut cur, 1000, NO_OFFSET, 1 << 20, "f")
                .unwrap()
                .len(),
            100
        );
        let mut cur = 0;
        assert!(read_file(&f, &mut cur, 10, u64::MAX - 1, 1 << 20, "f")
            .unwrap()
            .is_empty());
    }
}
