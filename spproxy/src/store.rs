//! The object store behind `name/s3/~local/BUCKET/KEY` in the embedded server.
//!
//! A small synchronous trait; [`LocalDirStore`] keeps each bucket as a directory. Another
//! backend (e.g. the fetcher's S3 client) can implement the same trait.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
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

/// Buckets as directories under one root; keys as relative paths.
#[derive(Debug)]
pub struct LocalDirStore {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

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
        if bucket.is_empty() || bucket.contains('/') || bucket == "." || bucket == ".." {
            return Err(inval("bad bucket name"));
        }
        if key.is_empty() {
            return if allow_empty_key {
                Ok(())
            } else {
                Err(inval("empty key"))
            };
        }
        for c in key.split('/') {
            if c.is_empty() || c == "." || c == ".." {
                return Err(inval("key has an empty, '.' or '..' component"));
            }
        }
        Ok(())
    }

    fn path(&self, bucket: &str, key: &str) -> Result<PathBuf, StoreError> {
        Self::check_name(bucket, key, false)?;
        Ok(self.root.join(bucket).join(key))
    }

    fn map(bucket: &str, key: &str, e: io::Error) -> StoreError {
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            },
            io::ErrorKind::IsADirectory => StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            },
            io::ErrorKind::PermissionDenied => StoreError::PermissionDenied {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
            },
            _ => StoreError::Unavailable {
                bucket: bucket.to_owned(),
                key: key.to_owned(),
                source: e,
            },
        }
    }
}

impl ObjectStore for LocalDirStore {
    fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
        let p = self.path(bucket, key)?;
        if p.is_dir() {
            return Err(Self::map(bucket, key, io::ErrorKind::IsADirectory.into()));
        }
        fs::read(&p).map_err(|e| Self::map(bucket, key, e))
    }

    fn put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let p = self.path(bucket, key)?;
        let dir = p.parent().expect("object path has a parent");
        let m = |e| Self::map(bucket, key, e);
        if !self.root.join(bucket).is_dir() {
            return Err(StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: String::new(),
            });
        }
        fs::create_dir_all(dir).map_err(m)?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}-{}",
            p.file_name().expect("key has a name").to_string_lossy(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let staged = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &p)?;
            fs::File::open(dir)?.sync_all()
        })();
        if staged.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        staged.map_err(m)
    }

    fn stat(&self, bucket: &str, key: &str) -> Result<ObjectMeta, StoreError> {
        let p = self.path(bucket, key)?;
        let md = fs::metadata(&p).map_err(|e| Self::map(bucket, key, e))?;
        if md.is_dir() {
            return Err(Self::map(bucket, key, io::ErrorKind::NotFound.into()));
        }
        Ok(ObjectMeta {
            len: md.len(),
            mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        })
    }

    fn remove(&self, bucket: &str, key: &str) -> Result<(), StoreError> {
        let p = self.path(bucket, key)?;
        fs::remove_file(&p).map_err(|e| Self::map(bucket, key, e))
    }

    fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        Self::check_name(bucket, "", true)?;
        let base = self.root.join(bucket);
        let mut out = Vec::new();
        let mut stack = vec![(base.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if rel.is_empty() => return Err(Self::map(bucket, prefix, e)),
                Err(_) => continue,
            };
            for ent in rd {
                let ent = ent.map_err(|e| Self::map(bucket, prefix, e))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') && name.contains(".tmp-") {
                    continue;
                }
                let k = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let ft = ent.file_type().map_err(|e| Self::map(bucket, prefix, e))?;
                if ft.is_dir() {
                    stack.push((ent.path(), k));
                } else if k.starts_with(prefix) {
                    out.push(k);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn has_bucket(&self, bucket: &str) -> Result<bool, StoreError> {
        Self::check_name(bucket, "", true)?;
        Ok(self.root.join(bucket).is_dir())
    }

    fn rename(&self, bucket: &str, from: &str, to: &str) -> Result<(), StoreError> {
        let a = self.path(bucket, from)?;
        let b = self.path(bucket, to)?;
        if !a.is_file() {
            return Err(Self::map(bucket, from, io::ErrorKind::NotFound.into()));
        }
        let dir = b.parent().expect("object path has a parent");
        fs::create_dir_all(dir).map_err(|e| Self::map(bucket, to, e))?;
        fs::rename(&a, &b).map_err(|e| Self::map(bucket, from, e))
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
