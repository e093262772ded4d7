//! The object side, `name/s3/~local/BUCKET/KEY`, over an [`ObjectStore`](crate::store::ObjectStore): whole-object
//! reads and writes (a write fd buffers until CloseFd), directories as key prefixes.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use crate::consts::*;
use crate::proto::{Rerror, TstatProto};
use crate::store::StoreError;

use super::fds::{DirSource, FdTable, Handle};
use super::reply::{last, rerr, store_rerr};
use super::state::Inner;
use super::ux::{mk_stat, MAX_DIR_ENTRIES};

fn prefix_of(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{}/", key.trim_end_matches('/'))
    }
}

impl Inner {
    fn obj_is_dir(&self, bucket: &str, key: &str) -> Result<bool, StoreError> {
        if key.is_empty() {
            return self.cfg.store.has_bucket(bucket);
        }
        Ok(!self.cfg.store.list(bucket, &prefix_of(key))?.is_empty())
    }

    pub fn s3_stat(
        &self,
        path: &str,
        bucket: &str,
        key: &str,
        uid: &str,
    ) -> Result<TstatProto, Rerror> {
        let store = &self.cfg.store;
        let name = last(path);
        if key.is_empty() {
            return match store.has_bucket(bucket) {
                Ok(true) => Ok(mk_stat(name, 0, true, 0o777, 0, 0, 0, uid)),
                Ok(false) => Err(rerr(ECODE_NOTFOUND, bucket, "")),
                Err(e) => Err(store_rerr(e, path)),
            };
        }
        match store.stat(bucket, key) {
            Ok(m) => {
                let t = m
                    .mtime
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let t = u32::try_from(t).unwrap_or(u32::MAX);
                Ok(mk_stat(name, m.len, false, 0o777, 0, t, t, uid))
            }
            Err(StoreError::NotFound { .. }) => match self.obj_is_dir(bucket, key) {
                Ok(true) => Ok(mk_stat(name, 0, true, 0o777, 0, 0, 0, uid)),
                _ => Err(rerr(ECODE_NOTFOUND, name, "")),
            },
            Err(e) => Err(store_rerr(e, path)),
        }
    }

    pub fn s3_create(
        &self,
        path: &str,
        bucket: &str,
        key: &str,
        perm: u32,
    ) -> Result<Handle, Rerror> {
        if key.is_empty() || perm & DMDIR != 0 {
            return Err(rerr(
                ECODE_NOTSUPPORTED,
                path,
                "directories in the object store",
            ));
        }
        let store = &self.cfg.store;
        match store.stat(bucket, key) {
            Ok(_) => return Err(rerr(ECODE_EXISTS, last(path), "")),
            Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(store_rerr(e, path)),
        }
        if !store.has_bucket(bucket).map_err(|e| store_rerr(e, path))? {
            return Err(rerr(ECODE_NOTFOUND, bucket, ""));
        }
        Ok(Handle::ObjWrite {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            buf: Vec::new(),
            off: 0,
        })
    }

    /// Opens an object (read: fetched whole, within the connection's budget; write: its
    /// current data unless OTRUNC) or a prefix as a directory.
    pub fn s3_open(
        &self,
        fds: &FdTable,
        path: &str,
        bucket: &str,
        key: &str,
        mode: u32,
    ) -> Result<Handle, Rerror> {
        let store = &self.cfg.store;
        let reading = mode & 3 == OREAD || mode & 3 == OEXEC;
        let meta = if key.is_empty() {
            Err(StoreError::NotFound {
                bucket: bucket.to_owned(),
                key: String::new(),
            })
        } else {
            store.stat(bucket, key)
        };
        match meta {
            Ok(m) => {
                if mode & OTRUNC != 0 && !reading {
                    return Ok(Handle::ObjWrite {
                        bucket: bucket.to_owned(),
                        key: key.to_owned(),
                        buf: Vec::new(),
                        off: 0,
                    });
                }
                fds.check_budget(m.len, last(path))?;
                let data = store.get(bucket, key).map_err(|e| store_rerr(e, path))?;
                fds.check_budget(data.len() as u64, last(path))?;
                Ok(if reading {
                    Handle::ObjRead { data, off: 0 }
                } else {
                    Handle::ObjWrite {
                        bucket: bucket.to_owned(),
                        key: key.to_owned(),
                        buf: data,
                        off: 0,
                    }
                })
            }
            Err(StoreError::NotFound { .. }) => {
                if reading && self.obj_is_dir(bucket, key).unwrap_or(false) {
                    return Ok(Handle::Dir {
                        src: DirSource::S3 {
                            bucket: bucket.to_owned(),
                            prefix: prefix_of(key),
                        },
                        listing: None,
                        off: 0,
                    });
                }
                Err(rerr(ECODE_NOTFOUND, last(path), ""))
            }
            Err(e) => Err(store_rerr(e, path)),
        }
    }

    pub fn s3_get_file(
        &self,
        path: &str,
        bucket: &str,
        key: &str,
        max: u64,
    ) -> Result<Vec<u8>, Rerror> {
        let store = &self.cfg.store;
        match store.stat(bucket, key) {
            Ok(m) if m.len > max => {
                return Err(rerr(
                    ECODE_BADCOUNT,
                    last(path),
                    "object too large for one reply: open and read it in parts",
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(store_rerr(e, path)),
        }
        store.get(bucket, key).map_err(|e| store_rerr(e, path))
    }

    pub fn s3_put_file(
        &self,
        path: &str,
        bucket: &str,
        key: &str,
        mode: u32,
        data: &[Vec<u8>],
        offset: u64,
    ) -> Result<u64, Rerror> {
        if offset != 0 || mode & OAPPEND != 0 {
            return Err(rerr(
                ECODE_NOTSUPPORTED,
                path,
                "object store writes are whole objects",
            ));
        }
        let total = data.iter().map(|d| d.len() as u64).sum::<u64>();
        if total > self.max_object() {
            return Err(self.no_space(path));
        }
        let store = &self.cfg.store;
        if mode & OEXCL != 0 && store.stat(bucket, key).is_ok() {
            return Err(rerr(ECODE_EXISTS, last(path), ""));
        }
        store
            .put(bucket, key, &data.concat())
            .map_err(|e| store_rerr(e, path))?;
        Ok(total)
    }

    /// The immediate children of a prefix: objects as files, deeper keys as directories.
    pub fn s3_list(
        &self,
        bucket: &str,
        prefix: &str,
        uid: &str,
    ) -> Result<Vec<TstatProto>, Rerror> {
        let keys = self
            .cfg
            .store
            .list(bucket, prefix)
            .map_err(|e| store_rerr(e, bucket))?;
        let mut ents: BTreeMap<String, bool> = BTreeMap::new();
        for k in &keys {
            let Some(rest) = k.strip_prefix(prefix) else {
                continue;
            };
            let (name, deeper) = match rest.split_once('/') {
                Some((n, _)) => (n, true),
                None => (rest, false),
            };
            if name.is_empty() {
                continue;
            }
            if ents.len() >= MAX_DIR_ENTRIES {
                return Err(rerr(ECODE_NOMEM, bucket, "directory too large to list"));
            }
            *ents.entry(name.to_owned()).or_default() |= deeper;
        }
        Ok(ents
            .into_iter()
            .map(|(name, dir)| {
                let len = if dir {
                    0
                } else {
                    let key = format!("{prefix}{name}");
                    self.cfg.store.stat(bucket, &key).map_or(0, |m| m.len)
                };
                mk_stat(&name, len, dir, 0o777, 0, 0, 0, uid)
            })
            .collect())
    }
}
