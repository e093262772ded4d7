//! Method name → handler. Every call gets the reply shape σOS's Go client expects: its own
//! reply message with `err` set (empty on success); a σOS call the embedded realm cannot
//! honour gets that shape with NotSupported; only a method σOS does not have, a bad
//! envelope or a call before Init gets the one-frame RPC error.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use crate::api;
use crate::consts::*;
use crate::frame::Message;
use crate::proto::*;
use crate::rpc::Request;

use super::fds::{self, DirSource, Handle};
use super::paths::{self, Target};
use super::procstate::Identity;
use super::reply::*;
use super::session::Session;
use super::state::Inner;
use super::sync::lock;
use super::waiters::{Retry, Wait, Waiters};
use crate::dirent;

/// Bytes a reply adds around its data frame.
const REPLY_OVERHEAD: u64 = 256;

fn max_io(inner: &Inner) -> u64 {
    u64::from(inner.cfg.limits.max_frame).saturating_sub(REPLY_OVERHEAD)
}

/// What one request comes to.
pub enum Outcome {
    /// The reply, to send now.
    Reply(Frames),
    /// A call that blocks: the connection parks it on the waiter thread, which replies.
    Park(Wait),
}

/// Handles one request of the connection whose state is `sess`.
pub fn handle(inner: &Inner, sess: &Session, m: Message) -> Outcome {
    inner.procs.count_call();
    let mut req = match Request::from_message(m) {
        Ok(r) => r,
        Err(e) => return Outcome::Reply(rpc_err(ECODE_ERROR, "", &e.to_string())),
    };
    dispatch(inner, sess, &mut req)
}

/// σOS calls the embedded realm does not serve: (method, field number of `err` in the
/// call's reply message).
const UNSERVED: &[(&str, u32)] = &[
    (api::FENCE_DIR, 1),
    (api::MOUNT_TREE, 1),
    (api::NEW_ROOT_MOUNT, 1),
    (api::DETACH, 1),
    (api::DISCONNECT, 1),
    (api::REGISTER_EP, 1),
    (api::IS_LOCAL_MOUNT, 3),
    (api::PATH_LAST_MOUNT, 3),
    (api::GET_NAMED_ENDPOINT, 3),
    (api::INVALIDATE_NAMED_ENDPOINT, 3),
    (api::MOUNTS, 2),
    (api::GET_DELEGATED_RPC_REPLY, 2),
    (api::GET_MULTI_DELEGATED_RPC_REPLIES, 3),
];

fn dispatch(inner: &Inner, sess: &Session, req: &mut Request) -> Outcome {
    let method = std::mem::take(&mut req.method);
    macro_rules! decode {
        ($t:ty) => {
            match req.decode::<$t>() {
                Ok(v) => v,
                Err(e) => {
                    return Outcome::Reply(rpc_err(
                        ECODE_ERROR,
                        "",
                        &format!("{method}: unmarshal {}: {e}", stringify!($t)),
                    ))
                }
            }
        };
    }
    if method == api::INIT {
        let r = decode!(SigmaInitReq);
        let mut ident = lock(&sess.ident);
        if ident.is_some() {
            return Outcome::Reply(rpc_err(
                ECODE_ERROR,
                "",
                "Error init SPProxySrvAPI: already initialized",
            ));
        }
        *ident = Some(inner.procs.init(&r.proc_env_proto.unwrap_or_default()));
        return Outcome::Reply(err_rep(Ok(())));
    }
    if let Some(&(_, field)) = UNSERVED.iter().find(|(m, _)| *m == method) {
        return Outcome::Reply(not_supported(&method, field, 0));
    }
    let known = [
        api::STARTED,
        api::EXITED,
        api::WAIT_EVICT,
        api::CLOSE,
        api::CLNT_ID,
        api::STAT,
        api::CREATE,
        api::CREATE_LEASED,
        api::OPEN,
        api::READ,
        api::WRITE,
        api::WRITE_FENCE,
        api::WRITE_READ,
        api::SEEK,
        api::CLOSE_FD,
        api::GET_FILE,
        api::PUT_FILE,
        api::REMOVE,
        api::RENAME,
        api::DIR_WATCH,
    ];
    if !known.contains(&method.as_str()) {
        return Outcome::Reply(rpc_err(ECODE_NOTFOUND, &method, ""));
    }
    let Some(id) = lock(&sess.ident).clone() else {
        return Outcome::Reply(rpc_err(
            ECODE_ERROR,
            "",
            &format!("{method}: Init has not been called on this connection"),
        ));
    };
    lock(&id.state).calls += 1;
    Outcome::Reply(match method.as_str() {
        api::STARTED => {
            decode!(SigmaNullReq);
            lock(&id.state).started = true;
            err_rep(Ok(()))
        }
        api::EXITED => {
            let r = decode!(SigmaExitedReq);
            lock(&id.state).exited = Some((r.status, r.msg));
            // σOS leaves err unset here, and its own Go stub then dereferences nil: an
            // empty err is what every client accepts.
            err_rep(Ok(()))
        }
        api::WAIT_EVICT => {
            decode!(SigmaNullReq);
            if inner.evicted.load(Ordering::SeqCst) {
                err_rep(Ok(()))
            } else {
                return park(inner, sess, Wait::Evict);
            }
        }
        api::CLOSE => {
            decode!(SigmaNullReq);
            err_rep(Ok(()))
        }
        api::CLNT_ID => {
            decode!(SigmaNullReq);
            ok(SigmaClntIdRep {
                clnt_id: id.clnt_id,
                err: Some(Rerror::default()),
            })
        }
        api::STAT => {
            let r = decode!(SigmaPathReq);
            match stat(inner, &r.path, &id) {
                Ok(st) => ok(SigmaStatRep {
                    stat: Some(st),
                    err: Some(Rerror::default()),
                }),
                Err(e) => ok(SigmaStatRep {
                    stat: None,
                    err: Some(e),
                }),
            }
        }
        api::CREATE | api::CREATE_LEASED => {
            let r = decode!(SigmaCreateReq);
            let res = create(inner, sess, &r.path, r.perm, r.mode);
            if res.is_ok() {
                inner.waiters.wake();
            }
            fd_rep(res)
        }
        api::OPEN => {
            let r = decode!(SigmaCreateReq);
            let first = open(inner, sess, &r.path, r.mode);
            let not_found = matches!(&first, Err(e) if e.err_code == ECODE_NOTFOUND);
            if r.wait && not_found {
                let wait = Wait::Open {
                    path: r.path,
                    mode: r.mode,
                };
                return park(inner, sess, wait);
            }
            fd_rep(first)
        }
        api::READ => {
            let r = decode!(SigmaReadReq);
            if is_watch(sess, r.fd) {
                return match watch_read(inner, sess, r.fd, r.size) {
                    Some(res) => Outcome::Reply(data_rep(res)),
                    None => {
                        let wait = Wait::WatchRead {
                            fd: r.fd,
                            size: r.size,
                        };
                        park(inner, sess, wait)
                    }
                };
            }
            data_rep(read(inner, sess, &id, r.fd, r.size, r.off))
        }
        api::WRITE | api::WRITE_FENCE => {
            let r = decode!(SigmaWriteReq);
            let data = r.blob.map(|b| b.iov).unwrap_or_default();
            size_rep(write(inner, sess, r.fd, &data))
        }
        api::WRITE_READ => {
            let r = decode!(SigmaWriteReq);
            let n = usize::try_from(r.n_out_vec).unwrap_or(usize::MAX);
            if n > 4096 {
                return Outcome::Reply(rpc_err(ECODE_INVAL, &method, "nOutVec out of range"));
            }
            not_supported(&method, 2, n)
        }
        api::SEEK => {
            let r = decode!(SigmaSeekReq);
            err_rep(seek(sess, r.fd, r.offset))
        }
        api::CLOSE_FD => {
            let r = decode!(SigmaCloseReq);
            err_rep(close_fd(inner, sess, r.fd))
        }
        api::GET_FILE => {
            let r = decode!(SigmaPathReq);
            data_rep(get_file(inner, &r.path))
        }
        api::PUT_FILE => {
            let r = decode!(SigmaPutFileReq);
            let data = r.blob.map(|b| b.iov).unwrap_or_default();
            let res = put_file(inner, &r.path, r.perm, r.mode, &data, r.offset);
            if res.is_ok() {
                inner.waiters.wake();
            }
            size_rep(res)
        }
        api::REMOVE => {
            let r = decode!(SigmaPathReq);
            let res = match paths::parse(&r.path) {
                Ok(Target::Ux(rel)) => inner.ux_remove(&r.path, rel),
                Ok(Target::S3 { bucket, key }) => inner
                    .cfg
                    .store
                    .remove(bucket, key)
                    .map_err(|e| store_rerr(e, &r.path)),
                Err(e) => Err(e),
            };
            if res.is_ok() {
                inner.waiters.wake();
            }
            err_rep(res)
        }
        api::RENAME => {
            let r = decode!(SigmaRenameReq);
            let res = rename(inner, &r.src, &r.dst);
            if res.is_ok() {
                inner.waiters.wake();
            }
            err_rep(res)
        }
        api::DIR_WATCH => {
            let r = decode!(SigmaReadReq);
            fd_rep(dir_watch(inner, sess, r.fd))
        }
        _ => rpc_err(ECODE_NOTFOUND, &method, ""),
    })
}

/// Parks a blocking call within the connection's bound; over it, answers NoMem now.
fn park(inner: &Inner, sess: &Session, wait: Wait) -> Outcome {
    if sess.waiting.load(Ordering::SeqCst) >= inner.cfg.limits.max_waiters {
        return Outcome::Reply(match wait {
            Wait::Open { .. } => fd_rep(Err(rerr(
                ECODE_NOMEM,
                "",
                "too many waiting calls on this connection",
            ))),
            Wait::WatchRead { .. } => data_rep(Err(rerr(
                ECODE_NOMEM,
                "",
                "too many waiting calls on this connection",
            ))),
            Wait::Evict => err_rep(Err(rerr(
                ECODE_NOMEM,
                "",
                "too many waiting calls on this connection",
            ))),
        });
    }
    Outcome::Park(wait)
}

fn stat(inner: &Inner, path: &str, id: &Identity) -> Result<TstatProto, Rerror> {
    match paths::parse(path)? {
        Target::Ux(rel) => inner.ux_stat(path, rel, &id.uid),
        Target::S3 { bucket, key } => inner.s3_stat(path, bucket, key, &id.uid),
    }
}

fn create(inner: &Inner, sess: &Session, path: &str, perm: u32, mode: u32) -> Result<u32, Rerror> {
    let h = match paths::parse(path)? {
        Target::Ux(rel) => inner.ux_create(path, rel, perm, mode)?,
        Target::S3 { bucket, key } => inner.s3_create(path, bucket, key, perm)?,
    };
    lock(&sess.fds).insert(h)
}

fn open(inner: &Inner, sess: &Session, path: &str, mode: u32) -> Result<u32, Rerror> {
    let h = match paths::parse(path)? {
        Target::Ux(rel) => inner.ux_open(path, rel, mode)?,
        Target::S3 { bucket, key } => {
            let fds = lock(&sess.fds);
            let h = inner.s3_open(&fds, path, bucket, key, mode)?;
            drop(fds);
            h
        }
    };
    lock(&sess.fds).insert(h)
}

fn list(inner: &Inner, src: &DirSource, uid: &str) -> Result<Vec<TstatProto>, Rerror> {
    match src {
        DirSource::Ux(rel) => inner.ux_list(rel, uid),
        DirSource::S3 { bucket, prefix } => inner.s3_list(bucket, prefix, uid),
    }
}

fn names(inner: &Inner, src: &DirSource) -> Result<BTreeSet<String>, Rerror> {
    Ok(list(inner, src, "")?.into_iter().map(|s| s.name).collect())
}

fn read(
    inner: &Inner,
    sess: &Session,
    id: &Identity,
    fd: u32,
    size: u64,
    off: u64,
) -> Result<Vec<u8>, Rerror> {
    let max = max_io(inner);
    let obj = fd.to_string();
    // A directory's listing is built outside the fd table's lock.
    let src = {
        let t = lock(&sess.fds);
        match t.get(fd)? {
            Handle::Dir {
                src, listing: None, ..
            } => Some(src.clone()),
            _ => None,
        }
    };
    let fresh = match src {
        Some(src) => Some(dirent::encode_dir(&list(inner, &src, &id.uid)?)),
        None => None,
    };
    lock(&sess.fds).with(fd, |h, room| match h {
        Handle::File {
            file,
            off: cur,
            mode,
        } => {
            if *mode & 3 == OWRITE {
                return Err(rerr(ECODE_PERM, &obj, "fd not open for reading"));
            }
            fds::read_file(file, cur, size, off, max, &obj)
        }
        Handle::Dir {
            listing, off: cur, ..
        } => {
            if listing.is_none() {
                let l = fresh.unwrap_or_default();
                if l.len() as u64 > room {
                    return Err(rerr(ECODE_NOMEM, &obj, "directory listing over budget"));
                }
                *listing = Some(l);
            }
            let l = listing.as_deref().unwrap_or_default();
            Ok(fds::read_dir(l, cur, size.min(max), off))
        }
        Handle::ObjRead { data, off: cur } => Ok(fds::read_buf(data, cur, size, off, max)),
        Handle::ObjWrite { .. } => Err(rerr(ECODE_PERM, &obj, "fd not open for reading")),
        Handle::Watch { .. } => Err(rerr(ECODE_INVAL, &obj, "watch fd")),
    })
}

fn write(inner: &Inner, sess: &Session, fd: u32, data: &[Vec<u8>]) -> Result<u64, Rerror> {
    let obj = fd.to_string();
    lock(&sess.fds).with(fd, |h, room| match h {
        Handle::File { file, off, mode } => {
            if *mode & 3 == OREAD || *mode & 3 == OEXEC {
                return Err(rerr(ECODE_PERM, &obj, "fd not open for writing"));
            }
            fds::write_file(file, off, *mode, data, &inner.quota, &obj)
        }
        Handle::ObjWrite { buf, off, .. } => {
            fds::write_buf(buf, off, data, room, inner.max_object(), &obj)
        }
        Handle::Dir { .. } | Handle::Watch { .. } => Err(rerr(ECODE_ISDIR, &obj, "")),
        Handle::ObjRead { .. } => Err(rerr(ECODE_PERM, &obj, "fd not open for writing")),
    })
}

fn seek(sess: &Session, fd: u32, to: u64) -> Result<(), Rerror> {
    lock(&sess.fds).with(fd, |h, _| match h {
        Handle::File { off, .. }
        | Handle::ObjRead { off, .. }
        | Handle::ObjWrite { off, .. }
        | Handle::Dir { off, .. } => {
            *off = to;
            Ok(())
        }
        Handle::Watch { .. } => Err(rerr(ECODE_ISDIR, &fd.to_string(), "")),
    })
}

fn close_fd(inner: &Inner, sess: &Session, fd: u32) -> Result<(), Rerror> {
    let h = lock(&sess.fds).remove(fd)?;
    if matches!(h, Handle::Watch { .. }) {
        // A read parked on it ends now (see `Retry::retry`), as σOS's watch wakes its readers
        // when the fid is closed.
        inner.waiters.wake();
    }
    if let Handle::ObjWrite {
        bucket, key, buf, ..
    } = h
    {
        inner
            .cfg
            .store
            .put(&bucket, &key, &buf)
            .map_err(|e| store_rerr(e, &key))?;
        inner.waiters.wake();
    }
    Ok(())
}

fn get_file(inner: &Inner, path: &str) -> Result<Vec<u8>, Rerror> {
    let max = max_io(inner);
    match paths::parse(path)? {
        Target::Ux(rel) => inner.ux_get_file(path, rel, max),
        Target::S3 { bucket, key } => inner.s3_get_file(path, bucket, key, max),
    }
}

fn put_file(
    inner: &Inner,
    path: &str,
    perm: u32,
    mode: u32,
    data: &[Vec<u8>],
    offset: u64,
) -> Result<u64, Rerror> {
    let offset = if offset == NO_OFFSET { 0 } else { offset };
    match paths::parse(path)? {
        Target::Ux(rel) => inner.ux_put_file(path, rel, perm, mode, data, offset),
        Target::S3 { bucket, key } => inner.s3_put_file(path, bucket, key, mode, data, offset),
    }
}

fn rename(inner: &Inner, src: &str, dst: &str) -> Result<(), Rerror> {
    match (paths::parse(src)?, paths::parse(dst)?) {
        (Target::Ux(a), Target::Ux(b)) => inner.ux_rename(src, a, dst, b),
        (
            Target::S3 {
                bucket: ba,
                key: ka,
            },
            Target::S3 {
                bucket: bb,
                key: kb,
            },
        ) if ba == bb => inner
            .cfg
            .store
            .rename(ba, ka, kb)
            .map_err(|e| store_rerr(e, src)),
        _ => Err(rerr(
            ECODE_NOTSUPPORTED,
            src,
            "rename across servers or buckets",
        )),
    }
}

/// A watch on the directory open at `fd`: the names the fd's listing showed (or the
/// current ones if it was never read) are the baseline for the events.
fn dir_watch(inner: &Inner, sess: &Session, fd: u32) -> Result<u32, Rerror> {
    let (src, listing) = {
        let t = lock(&sess.fds);
        match t.get(fd)? {
            Handle::Dir { src, listing, .. } => (src.clone(), listing.clone()),
            _ => return Err(rerr(ECODE_NOTDIR, &fd.to_string(), "")),
        }
    };
    let known = match listing {
        Some(l) => dirent::decode_dir(&l)
            .map_err(|e| rerr(ECODE_ERROR, &fd.to_string(), &e))?
            .into_iter()
            .map(|s| s.name)
            .collect(),
        None => names(inner, &src)?,
    };
    lock(&sess.fds).insert(Handle::Watch {
        src,
        known,
        pending: Vec::new(),
    })
}

fn is_watch(sess: &Session, fd: u32) -> bool {
    matches!(lock(&sess.fds).get(fd), Ok(Handle::Watch { .. }))
}

/// A read of a watch fd: pending event bytes, or new events since the last read, or
/// `None` when nothing changed (the call is parked). A closed watch fd reads as σOS's
/// Closed error, which ends a DirWatcher cleanly.
fn watch_read(
    inner: &Inner,
    sess: &Session,
    fd: u32,
    size: u64,
) -> Option<Result<Vec<u8>, Rerror>> {
    let obj = fd.to_string();
    let src = match lock(&sess.fds).get(fd) {
        Ok(Handle::Watch { src, pending, .. }) if pending.is_empty() => Some(src.clone()),
        Ok(Handle::Watch { .. }) => None,
        _ => return Some(Err(rerr(ECODE_CLOSED, &obj, "watch closed"))),
    };
    let now = match src {
        Some(src) => match names(inner, &src) {
            Ok(n) => Some(n),
            Err(e) if e.err_code == ECODE_NOTFOUND => Some(BTreeSet::new()),
            Err(e) => return Some(Err(e)),
        },
        None => None,
    };
    let r = lock(&sess.fds).with(fd, |h, room| {
        let Handle::Watch { known, pending, .. } = h else {
            return Err(rerr(ECODE_CLOSED, &obj, "watch closed"));
        };
        if let Some(now) = now {
            if pending.is_empty() {
                if let Some(ev) = dirent::diff(known, &now) {
                    let rec = dirent::encode_watch(&ev);
                    if rec.len() as u64 > room {
                        return Err(rerr(ECODE_NOMEM, &obj, "watch events over budget"));
                    }
                    *pending = rec;
                    *known = now;
                }
            }
        }
        if size == 0 {
            return Ok(Some(Vec::new()));
        }
        if pending.is_empty() {
            return Ok(None);
        }
        let n = usize::try_from(size)
            .unwrap_or(usize::MAX)
            .min(pending.len());
        Ok(Some(pending.drain(..n).collect::<Vec<u8>>()))
    });
    match r {
        Ok(Some(b)) => Some(Ok(b)),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

/// The waiter thread's retries: the same calls, on the parked call's session.
impl Retry for Inner {
    fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    fn retry(&self, sess: &Session, wait: &Wait) -> Option<Frames> {
        match wait {
            Wait::Evict => self.evicted.load(Ordering::SeqCst).then(|| err_rep(Ok(()))),
            Wait::Open { path, mode } => match open(self, sess, path, *mode) {
                Err(e) if e.err_code == ECODE_NOTFOUND => None,
                r => Some(fd_rep(r)),
            },
            // The watch fd was closed while its read was parked: σOS's watch answers such a
            // read with no bytes and no error (spproto/srv/watch: closed → nil, nil). An
            // error here would crash σOS's Go client, whose SPProxyClnt.Read dereferences
            // the missing data of any failed read.
            Wait::WatchRead { fd, size } => match watch_read(self, sess, *fd, *size) {
                Some(Err(e)) if e.err_code == ECODE_CLOSED => Some(data_rep(Ok(Vec::new()))),
                r => r.map(data_rep),
            },
        }
    }
}
