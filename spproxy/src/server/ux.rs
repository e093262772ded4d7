//! The scratch store behind `name/ux/~local/`: every path is resolved beneath the realm's
//! root by openat2 with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so neither `..` nor a
//! symbolic link planted in the scratch (by the proc or anyone) leads out of it.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::UnlinkatFlags;

use crate::consts::*;
use crate::proto::{Rerror, TqidProto, TstatProto};

use super::fds::{self, DirSource, Handle};
use super::reply::{errno_rerr, io_rerr, last, no_space, rerr};
use super::state::Inner;

/// Entries one directory listing may hold.
pub const MAX_DIR_ENTRIES: usize = 100_000;

/// A σOS stat of one entry.
#[allow(clippy::too_many_arguments)]
pub fn mk_stat(
    name: &str,
    len: u64,
    dir: bool,
    perm: u32,
    ino: u64,
    atime: u32,
    mtime: u32,
    uid: &str,
) -> TstatProto {
    let mode = perm | if dir { DMDIR } else { 0 };
    TstatProto {
        r#type: 0,
        dev: 0,
        qid: Some(TqidProto {
            r#type: mode >> 24,
            version: 0,
            path: ino,
        }),
        mode,
        atime,
        mtime,
        length: len,
        name: name.to_owned(),
        uid: uid.to_owned(),
        gid: uid.to_owned(),
        muid: uid.to_owned(),
    }
}

fn secs32(t: i64) -> u32 {
    u32::try_from(t.max(0)).unwrap_or(u32::MAX)
}

pub fn open_flags(mode: u32) -> OFlag {
    let mut f = match mode & 3 {
        OWRITE => OFlag::O_WRONLY,
        ORDWR => OFlag::O_RDWR,
        _ => OFlag::O_RDONLY,
    };
    if mode & OTRUNC != 0 {
        f |= OFlag::O_TRUNC;
    }
    if mode & OAPPEND != 0 {
        f |= OFlag::O_APPEND;
    }
    f
}

/// Refuses open modes σOS does not define.
pub fn check_mode(mode: u32, path: &str) -> Result<(), Rerror> {
    let known = 3 | OEXCL | OTRUNC | OCEXEC | ORCLOSE | OAPPEND;
    if mode & !known != 0 {
        return Err(rerr(ECODE_INVAL, path, "unknown open mode bits"));
    }
    Ok(())
}

impl Inner {
    pub fn open_beneath(&self, rel: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
        let root = self.root.as_ref().map_err(|e| *e)?;
        crate::store::open_beneath(root, rel, flags, mode)
    }

    /// The parent directory (opened beneath the root) and final name of `rel`.
    pub fn parent<'a>(&self, path: &str, rel: &'a str) -> Result<(OwnedFd, &'a str), Rerror> {
        let (dir, name) = rel.rsplit_once('/').unwrap_or((".", rel));
        if name == "." || name.is_empty() {
            return Err(rerr(ECODE_INVAL, path, "path names no file"));
        }
        let fd = self
            .open_beneath(
                if dir.is_empty() { "." } else { dir },
                OFlag::O_PATH | OFlag::O_DIRECTORY,
                Mode::empty(),
            )
            .map_err(|e| errno_rerr(e, path))?;
        Ok((fd, name))
    }

    pub fn ux_stat(&self, path: &str, rel: &str, uid: &str) -> Result<TstatProto, Rerror> {
        let fd = self
            .open_beneath(rel, OFlag::O_PATH, Mode::empty())
            .map_err(|e| errno_rerr(e, path))?;
        let md = File::from(fd).metadata().map_err(|e| io_rerr(&e, path))?;
        Ok(mk_stat(
            last(path),
            md.len(),
            md.is_dir(),
            md.mode() & 0o777,
            md.ino(),
            secs32(md.atime()),
            secs32(md.mtime()),
            uid,
        ))
    }

    pub fn ux_create(&self, path: &str, rel: &str, perm: u32, mode: u32) -> Result<Handle, Rerror> {
        check_mode(mode, path)?;
        let bits = Mode::from_bits_truncate((perm & 0o777) | 0o600);
        if perm & DMDIR != 0 {
            let (dir, name) = self.parent(path, rel)?;
            nix::sys::stat::mkdirat(&dir, name, bits | Mode::S_IXUSR)
                .map_err(|e| errno_rerr(e, path))?;
            return Ok(Handle::Dir {
                src: DirSource::Ux(rel.to_owned()),
                listing: None,
                off: 0,
            });
        }
        self.parent(path, rel)?;
        let fd = self
            .open_beneath(rel, open_flags(mode) | OFlag::O_CREAT | OFlag::O_EXCL, bits)
            .map_err(|e| errno_rerr(e, path))?;
        Ok(Handle::File {
            file: File::from(fd),
            off: 0,
            mode,
        })
    }

    pub fn ux_open(&self, path: &str, rel: &str, mode: u32) -> Result<Handle, Rerror> {
        check_mode(mode, path)?;
        // Truncation is accounted for: look at the size first, without truncating.
        let flags = open_flags(mode);
        let fd = self
            .open_beneath(rel, flags & !OFlag::O_TRUNC, Mode::empty())
            .or_else(|e| match e {
                // A directory opened for writing: σOS opens directories for reading only.
                Errno::EISDIR => self.open_beneath(rel, OFlag::O_RDONLY, Mode::empty()),
                e => Err(e),
            })
            .map_err(|e| errno_rerr(e, path))?;
        let file = File::from(fd);
        let md = file.metadata().map_err(|e| io_rerr(&e, path))?;
        if md.is_dir() {
            if mode & 3 != OREAD && mode & 3 != OEXEC {
                return Err(rerr(ECODE_ISDIR, last(path), ""));
            }
            return Ok(Handle::Dir {
                src: DirSource::Ux(rel.to_owned()),
                listing: None,
                off: 0,
            });
        }
        if flags.contains(OFlag::O_TRUNC) && md.len() > 0 {
            file.set_len(0).map_err(|e| io_rerr(&e, path))?;
            self.quota.release(md.len());
        }
        Ok(Handle::File { file, off: 0, mode })
    }

    pub fn ux_get_file(&self, path: &str, rel: &str, max: u64) -> Result<Vec<u8>, Rerror> {
        let fd = self
            .open_beneath(rel, OFlag::O_RDONLY, Mode::empty())
            .map_err(|e| errno_rerr(e, path))?;
        let f = File::from(fd);
        let md = f.metadata().map_err(|e| io_rerr(&e, path))?;
        if md.is_dir() {
            return Err(rerr(ECODE_ISDIR, last(path), ""));
        }
        if md.len() > max {
            return Err(rerr(
                ECODE_BADCOUNT,
                last(path),
                "file too large for one reply: open and read it in parts",
            ));
        }
        let mut cur = 0;
        fds::read_file(&f, &mut cur, md.len(), NO_OFFSET, max, path)
    }

    /// Creates the file if missing (Exists if it is there and `mode` has OEXCL), truncates
    /// it with OTRUNC, and writes `data` at `offset` (appends with OAPPEND).
    pub fn ux_put_file(
        &self,
        path: &str,
        rel: &str,
        perm: u32,
        mode: u32,
        data: &[Vec<u8>],
        offset: u64,
    ) -> Result<u64, Rerror> {
        check_mode(mode, path)?;
        self.parent(path, rel)?;
        let mut flags = OFlag::O_CREAT | OFlag::O_WRONLY;
        if mode & OEXCL != 0 {
            flags |= OFlag::O_EXCL;
        }
        let bits = Mode::from_bits_truncate((perm & 0o777) | 0o600);
        let fd = self
            .open_beneath(rel, flags, bits)
            .map_err(|e| errno_rerr(e, path))?;
        let f = File::from(fd);
        if mode & OTRUNC != 0 {
            let len = f.metadata().map_err(|e| io_rerr(&e, path))?.len();
            f.set_len(0).map_err(|e| io_rerr(&e, path))?;
            self.quota.release(len);
        }
        let mut off = offset;
        fds::write_file(&f, &mut off, mode, data, &self.quota, path)
    }

    pub fn ux_remove(&self, path: &str, rel: &str) -> Result<(), Rerror> {
        let (dir, name) = self.parent(path, rel)?;
        let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_rerr(e, path))?;
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let flag = if is_dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        nix::unistd::unlinkat(&dir, name, flag).map_err(|e| errno_rerr(e, path))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink <= 1 {
            self.quota.release(u64::try_from(st.st_size).unwrap_or(0));
        }
        Ok(())
    }

    pub fn ux_rename(&self, src: &str, a: &str, dst: &str, b: &str) -> Result<(), Rerror> {
        let (da, na) = self.parent(src, a)?;
        let (db, nb) = self.parent(dst, b)?;
        nix::fcntl::renameat(&da, na, &db, nb).map_err(|e| errno_rerr(e, src))
    }

    /// The entries of a scratch directory, with their stats.
    pub fn ux_list(&self, rel: &str, uid: &str) -> Result<Vec<TstatProto>, Rerror> {
        let fd = self
            .open_beneath(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| errno_rerr(e, rel))?;
        let mut d = nix::dir::Dir::from_fd(fd).map_err(|e| errno_rerr(e, rel))?;
        let dirfd = d
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| io_rerr(&e, rel))?;
        let mut out = Vec::new();
        for ent in d.iter() {
            let ent = ent.map_err(|e| errno_rerr(e, rel))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= MAX_DIR_ENTRIES {
                return Err(rerr(ECODE_NOMEM, rel, "directory too large to list"));
            }
            let Ok(st) = fstatat(dirfd.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue; // removed meanwhile
            };
            out.push(mk_stat(
                &name,
                u64::try_from(st.st_size).unwrap_or(0),
                st.st_mode & libc::S_IFMT == libc::S_IFDIR,
                st.st_mode & 0o777,
                st.st_ino,
                secs32(st.st_atime),
                secs32(st.st_mtime),
                uid,
            ));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Quota check for a write that is about to grow a file: used by the S3 side too.
    pub fn max_object(&self) -> u64 {
        self.quota.limit()
    }

    pub fn no_space(&self, path: &str) -> Rerror {
        no_space(last(path))
    }
}
