//! The object store behind `name/s3/~local/BUCKET/KEY` in the embedded server.
//!
//! A small synchronous trait; [`LocalDirStore`] keeps each bucket as a directory. Another
//! backend (e.g. the fetcher's S3 client) can implement the same trait.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, Mode};
use nix::unistd::UnlinkatFlags;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

#[derive(thiserror::Error, Debug)]
pub enum StoreError {
    #[error("object {bucket}/{key} not found")]
    NotFound { bucket: String, key: String },
    #[error("permission denied for {bucket}/{key}")]
    PermissionDenied { bucket: String, key: String },
    #[error("invalid object name {bucket:?}/{key:?}: {why}")]
    InvalidKey {
        bucket: String,
        key: String,
        why: &'static str,
    },
    #[error("object store unavailable for {bucket}/{key}: {source}")]
    Unavailable {
        bucket: String,
        key: String,
        #[source]
        source: io::Error,
    },
}

/// Metadata of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub len: u64,
    pub mtime: SystemTime,
}

/// A synchronous object store: whole-object get/put, stat, remove, rename, list.
pub trait ObjectStore: Send + Sync {
    fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Stores `data` as the whole object; readers see the old or the new object, never half.
    fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), StoreError>;
    fn stat(&self, bucket: &str, key: &str) -> Result<ObjectMeta, StoreError>;
    fn remove(&self, bucket: &str, key: &str) -> Result<(), StoreError>;
    /// Keys in `bucket` starting with `prefix`, sorted.
    fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// Whether `bucket` exists.
    fn has_bucket(&self, bucket: &str) -> Result<bool, StoreError>;
    /// Renames by copy then delete, as S3 does.
    fn rename(&self, bucket: &str, from: &str, to: &str) -> Result<(), StoreError> {
        let data = self.get(bucket, from)?;
        self.put(bucket, to, &data)?;
        self.remove(bucket, from)
    }
}

/// Buckets as directories under one root; keys as relative paths. Every path is resolved
/// beneath the root with openat2 `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: a symbolic link
/// placed in a bucket (or a bucket that is one) is refused, never followed out of the root.
#[derive(Debug)]
pub struct LocalDirStore {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Open `rel` beneath `dir` and nowhere else: no `..` out, no symlinks, no magic links.
pub(crate) fn open_beneath(
    dir: &OwnedFd,
    rel: &str,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    openat2(
        dir,
        rel,
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .mode(mode)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            ),
    )
}

impl LocalDirStore {
    pub fn new(root: impl Into<PathBuf>) -> LocalDirStore {
        LocalDirStore { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn check_name(bucket: &str, key: &str, allow_empty_key: bool) -> Result<(), StoreError> {
        let inval = |why| StoreError::InvalidKey {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            why,
        };
        if bucket.is_empty() || bucket.contains(['/', '\0']) || bucket == "." || bucket == ".." {
            return Err(inval("bad bucket name"));
        }
        if key.is_empty() {
            return if allow_empty_key {
                Ok(())
            } else {
                Err(inval("empty key"))
            };
        }
        if key.contains('\0') {
            return Err(inval("key contains a NUL byte"));
        }
        for c in key.split('/') {
            if c.is_empty() || c == "." || c == ".." {
                return Err(inval("key has an empty, '.' or '..' component"));
            }
        }
        Ok(())
    }

    fn root_fd(&self, bucket: &str, key: &str) -> Result<OwnedFd, StoreError> {
        nix::fcntl::open(
            &self.root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Self::map(bucket, key, e.into()))
    }

    /// The bucket's directory, opened beneath the root.
    fn bucket_fd(&self, bucket: &str, key: &str) -> Result<OwnedFd, StoreError> {
        let root = self.root_fd(bucket, key)?;
        open_beneath(
            &root,
            bucket,
            OFlag::O_PATH | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ENOENT | Errno::ENOTDIR => StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: String::new(),
            },
            e => Self::map(bucket, key, e.into()),
        })
    }

    /// The directory holding `key` (created with `create`) and the key's last component.
    fn key_dir<'k>(
        &self,
        bucket: &str,
        key: &'k str,
        create: bool,
    ) -> Result<(OwnedFd, &'k str), StoreError> {
        let mut dir = self.bucket_fd(bucket, key)?;
        let (parents, name) = key.rsplit_once('/').unwrap_or(("", key));
        for c in parents.split('/').filter(|c| !c.is_empty()) {
            if create {
                match nix::sys::stat::mkdirat(&dir, c, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(Self::map(bucket, key, e.into())),
                }
            }
            dir = open_beneath(&dir, c, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
                .map_err(|e| Self::map(bucket, key, e.into()))?;
        }
        Ok((dir, name))
    }

    fn open_key(&self, bucket: &str, key: &str, flags: OFlag) -> Result<fs::File, StoreError> {
        Self::check_name(bucket, key, false)?;
        let (dir, name) = self.key_dir(bucket, key, false)?;
        let fd = open_beneath(&dir, name, flags, Mode::empty())
            .map_err(|e| Self::map(bucket, key, e.into()))?;
        let f = fs::File::from(fd);
        let md = f.metadata().map_err(|e| Self::map(bucket, key, e))?;
        if !md.is_file() {
            return Err(Self::map(bucket, key, io::ErrorKind::NotFound.into()));
        }
        Ok(f)
    }

    fn map(bucket: &str, key: &str, e: io::Error) -> StoreError {
        let (b, k) = (bucket.to_owned(), key.to_owned());
        match e.raw_os_error().map(Errno::from_raw) {
            Some(Errno::ENOENT | Errno::ENOTDIR | Errno::EISDIR) => {
                return StoreError::NotFound { bucket: b, key: k }
            }
            Some(Errno::EACCES | Errno::EPERM | Errno::ELOOP | Errno::EXDEV) => {
                return StoreError::PermissionDenied { bucket: b, key: k }
            }
            _ => {}
        }
        match e.kind() {
            io::ErrorKind::NotFound => StoreError::NotFound { bucket: b, key: k },
            io::ErrorKind::PermissionDenied => StoreError::PermissionDenied { bucket: b, key: k },
            _ => StoreError::Unavailable {
                bucket: b,
                key: k,
                source: e,
            },
        }
    }
}

impl ObjectStore for LocalDirStore {
    fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
        let mut f = self.open_key(bucket, key, OFlag::O_RDONLY)?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)
            .map_err(|e| Self::map(bucket, key, e))?;
        Ok(buf)
    }

    fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), StoreError> {
        Self::check_name(bucket, key, false)?;
        let (dir, name) = self.key_dir(bucket, key, true)?;
        let m = |e: io::Error| Self::map(bucket, key, e);
        let tmp = format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let staged = (|| -> io::Result<()> {
            let fd = open_beneath(
                &dir,
                &tmp,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o644),
            )?;
            let mut f = fs::File::from(fd);
            f.write_all(data)?;
            f.sync_all()?;
            nix::fcntl::renameat(&dir, tmp.as_str(), &dir, name)?;
            let d = open_beneath(
                &dir,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            )?;
            fs::File::from(d).sync_all()
        })();
        if staged.is_err() {
            let _ = nix::unistd::unlinkat(&dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        }
        staged.map_err(m)
    }

    fn stat(&self, bucket: &str, key: &str) -> Result<ObjectMeta, StoreError> {
        let f = self.open_key(bucket, key, OFlag::O_PATH)?;
        let md = f.metadata().map_err(|e| Self::map(bucket, key, e))?;
        Ok(ObjectMeta {
            len: md.len(),
            mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }

    fn remove(&self, bucket: &str, key: &str) -> Result<(), StoreError> {
        Self::check_name(bucket, key, false)?;
        let (dir, name) = self.key_dir(bucket, key, false)?;
        let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| Self::map(bucket, key, e.into()))?;
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(Self::map(bucket, key, io::ErrorKind::NotFound.into()));
        }
        nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| Self::map(bucket, key, e.into()))
    }

    fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        Self::check_name(bucket, "", true)?;
        let base = self.bucket_fd(bucket, prefix)?;
        let mut out = Vec::new();
        let mut stack = vec![String::new()];
        while let Some(rel) = stack.pop() {
            let at = if rel.is_empty() { "." } else { rel.as_str() };
            let fd = match open_beneath(
                &base,
                at,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(e) if rel.is_empty() => return Err(Self::map(bucket, prefix, e.into())),
                Err(_) => continue,
            };
            let mut d =
                nix::dir::Dir::from_fd(fd).map_err(|e| Self::map(bucket, prefix, e.into()))?;
            for ent in d.iter() {
                let ent = ent.map_err(|e| Self::map(bucket, prefix, e.into()))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if name == "." || name == ".." || (name.starts_with('.') && name.contains(".tmp-"))
                {
                    continue;
                }
                let k = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                match ent.file_type() {
                    Some(nix::dir::Type::Directory) => {
                        // Only descend where keys under the prefix can be.
                        let kd = format!("{k}/");
                        if kd.starts_with(prefix) || prefix.starts_with(&kd) {
                            stack.push(k);
                        }
                    }
                    Some(nix::dir::Type::File) if k.starts_with(prefix) => out.push(k),
                    _ => {} // symbolic links and the rest are not objects
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn has_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        Self::check_name(bucket, "", true)?;
        match self.bucket_fd(bucket, "") {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn rename(&self, bucket: &str, from: &str, to: &str) -> Result<(), StoreError> {
        Self::check_name(bucket, from, false)?;
        Self::check_name(bucket, to, false)?;
        self.open_key(bucket, from, OFlag::O_PATH)?;
        let (da, na) = self.key_dir(bucket, from, false)?;
        let (db, nb) = self.key_dir(bucket, to, true)?;
        nix::fcntl::renameat(&da, na, &db, nb).map_err(|e| Self::map(bucket, from, e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_store_roundtrip_and_errors() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("b")).unwrap();
        let s = LocalDirStore::new(d.path());
        assert!(s.has_bucket("b").unwrap());
        assert!(!s.has_bucket("nob").unwrap());
        s.put("b", "dir/k", b"v1").unwrap();
        s.put("b", "dir/k", b"value2").unwrap();
        assert_eq!(s.get("b", "dir/k").unwrap(), b"value2");
        assert_eq!(s.stat("b", "dir/k").unwrap().len, 6);
        assert_eq!(s.list("b", "").unwrap(), vec!["dir/k".to_owned()]);
        assert_eq!(s.list("b", "dir/").unwrap(), vec!["dir/k".to_owned()]);
        assert!(s.list("b", "x").unwrap().is_empty());
        s.rename("b", "dir/k", "k2").unwrap();
        assert!(matches!(
            s.get("b", "dir/k"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.stat("b", "dir"),
            Err(StoreError::NotFound { .. })
        ));
        s.remove("b", "k2").unwrap();
        assert!(matches!(
            s.remove("b", "k2"),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            s.get("b", "../../etc/passwd"),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(matches!(
            s.put("nob", "k", b"x"),
            Err(StoreError::NotFound { .. })
        ));
    }

    /// The default copy+delete rename, through a store that does not override it.
    #[test]
    fn default_rename_copies_then_deletes() {
        struct Plain(LocalDirStore);
        impl ObjectStore for Plain {
            fn get(&self, b: &str, k: &str) -> Result<Vec<u8>, StoreError> {
                self.0.get(b, k)
            }
            fn put(&self, b: &str, k: &str, d: &[u8]) -> Result<(), StoreError> {
                self.0.put(b, k, d)
            }
            fn stat(&self, b: &str, k: &str) -> Result<ObjectMeta, StoreError> {
                self.0.stat(b, k)
            }
            fn remove(&self, b: &str, k: &str) -> Result<(), StoreError> {
                self.0.remove(b, k)
            }
            fn list(&self, b: &str, p: &str) -> Result<Vec<String>, StoreError> {
                self.0.list(b, p)
            }
            fn has_bucket(&self, b: &str) -> Result<bool, StoreError> {
                self.0.has_bucket(b)
            }
        }
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("b")).unwrap();
        let s = Plain(LocalDirStore::new(d.path()));
        s.put("b", "a", b"x").unwrap();
        s.rename("b", "a", "c/d").unwrap();
        assert_eq!(s.get("b", "c/d").unwrap(), b"x");
        assert!(matches!(s.get("b", "a"), Err(StoreError::NotFound { .. })));
    }
}
