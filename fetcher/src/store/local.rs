//! A directory used as a bucket (`file:///dir`).
//!
//! Writes go to a temporary name in the target directory, are fsynced, renamed into place and the
//! directory fsynced: a reader never sees half an object, and a crash leaves at most a
//! `.tmp-*` file that listings ignore.

use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;

use super::api::{check_key, GetObject, Store};
use crate::error::{FetchError, IoContext, Result};

const CHUNK: usize = 256 * 1024;
const TMP_PREFIX: &str = ".tmp-";

/// A bucket stored as files under a root directory.
#[derive(Debug)]
pub struct LocalStore {
    name: String,
    root: PathBuf,
}

impl LocalStore {
    /// The bucket rooted at `root` (it must exist when used; it is not created implicitly).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        LocalStore {
            name: format!("file://{}", root.display()),
            root,
        }
    }

    /// Create the root directory (the "create bucket" of this backend).
    pub fn create(root: impl Into<PathBuf>) -> Result<Self> {
        let store = LocalStore::new(root);
        std::fs::create_dir_all(&store.root).ctx("create bucket dir", &store.root)?;
        Ok(store)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        check_key(&self.name, key)?;
        if key.split('/').any(|c| c.starts_with(TMP_PREFIX)) {
            return Err(FetchError::invalid(
                format!("{}: key {key:?}", self.name),
                "names starting with .tmp- are reserved",
            ));
        }
        Ok(self.root.join(key))
    }

    fn check_bucket(&self) -> Result<()> {
        if self.root.is_dir() {
            Ok(())
        } else {
            Err(FetchError::BucketNotFound {
                bucket: self.name.clone(),
            })
        }
    }
}

#[async_trait]
impl Store for LocalStore {
    fn name(&self) -> &str {
        &self.name
    }

    async fn get(&self, key: &str) -> Result<GetObject> {
        let path = self.path(key)?;
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.check_bucket()?;
                return Err(FetchError::NotFound {
                    bucket: self.name.clone(),
                    key: key.to_owned(),
                });
            }
            Err(e) => return Err(FetchError::io("open", path, e)),
        };
        // Only a regular file knows its size (a FIFO streams what its writer sends); the
        // reader checks the bytes it got against the index either way.
        let meta = file.metadata().await.ctx("stat", &path)?;
        let size = meta.is_file().then_some(meta.len());
        let body = futures::stream::unfold(Some((file, path)), |state| async move {
            let (mut file, path) = state?;
            let mut buf = BytesMut::zeroed(CHUNK);
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(buf.freeze()), Some((file, path))))
                }
                Err(e) => Some((Err(FetchError::io("read", path, e)), None)),
            }
        });
        let body = Box::pin(body);
        Ok(GetObject { size, body })
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        let path = self.path(key)?;
        self.check_bucket()?;
        tokio::task::spawn_blocking(move || write_atomic(&path, &data))
            .await
            .map_err(|e| FetchError::invalid("local put", e))?
    }

    async fn head(&self, key: &str) -> Result<Option<u64>> {
        let path = self.path(key)?;
        match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.check_bucket()?;
                Ok(None)
            }
            Err(e) => Err(FetchError::io("stat", path, e)),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(FetchError::io("remove", path, e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.check_bucket()?;
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            walk(&root, "", &mut out)?;
            out.retain(|k| k.starts_with(&prefix));
            out.sort();
            Ok(out)
        })
        .await
        .map_err(|e| FetchError::invalid("local list", e))?
    }
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).ctx("list", dir)? {
        let entry = entry.ctx("list", dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(TMP_PREFIX) {
            continue;
        }
        let key = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let ft = entry.file_type().ctx("stat", entry.path())?;
        if ft.is_dir() {
            walk(&entry.path(), &key, out)?;
        } else if ft.is_file() {
            out.push(key);
        }
    }
    Ok(())
}

/// Write `data` to `path` atomically: temp file in the same dir, fsync, rename, fsync the dir.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).ctx("create dir", dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(dir)
        .ctx("create temp file in", dir)?;
    tmp.write_all(data).ctx("write", tmp.path())?;
    tmp.as_file().sync_all().ctx("fsync", tmp.path())?;
    tmp.persist(path)
        .map_err(|e| FetchError::io("rename into", path, e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync dir", dir)?;
    Ok(())
}
