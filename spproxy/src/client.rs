//! A blocking, thread-safe, pipelined spproxy client.
//!
//! Any number of threads may call at once. Each call writes its whole request under a
//! writer mutex, then waits for the reply with its seqno. Whichever waiting caller finds
//! nobody reading becomes the reader: it reads replies, hands other callers theirs, and
//! gives up the role as soon as its own arrives. A lone caller therefore reads its own
//! reply with no thread hand-off. If the connection fails or closes, every waiter gets
//! an `Error::Io` at once.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::api;
use crate::consts::{NO_OFFSET, OREAD};
use crate::error::Error;
use crate::frame::{self, Limits};
use crate::procenv;
use crate::proto::*;
use crate::rpc::{self, RpcMessage};

/// Environment variable naming an inherited, already-connected spproxy socket fd.
pub const ENV_SPPROXY_FD: &str = "SIGMA_SPPROXY_FD";
/// Environment variable naming the spproxy socket path.
pub const ENV_SPPROXY_SOCKET: &str = "SIGMA_SPPROXY_SOCKET";
/// σOS's fixed spproxyd socket path.
pub const DEFAULT_SOCKET: &str = "/tmp/spproxyd/spproxyd.sock";

/// A file's σOS qid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qid {
    pub type_: u32,
    pub version: u32,
    pub path: u64,
}

/// A file's σOS stat (TstatProto).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub type_: u32,
    pub dev: u32,
    pub qid: Qid,
    pub mode: u32,
    pub atime: u32,
    pub mtime: u32,
    pub length: u64,
    pub name: String,
    pub uid: String,
    pub gid: String,
    pub muid: String,
}

impl From<TstatProto> for Stat {
    fn from(s: TstatProto) -> Stat {
        let q = s.qid.unwrap_or_default();
        Stat {
            type_: s.r#type,
            dev: s.dev,
            qid: Qid {
                type_: q.r#type,
                version: q.version,
                path: q.path,
            },
            mode: s.mode,
            atime: s.atime,
            mtime: s.mtime,
            length: s.length,
            name: s.name,
            uid: s.uid,
            gid: s.gid,
            muid: s.muid,
        }
    }
}

impl Stat {
    /// True if the stat's mode has DMDIR.
    pub fn is_dir(&self) -> bool {
        self.mode & crate::consts::DMDIR != 0
    }
}

#[derive(Clone, Debug)]
enum Dead {
    Io(io::ErrorKind, String),
    Protocol(String),
}

impl Dead {
    fn error(&self) -> Error {
        match self {
            Dead::Io(k, m) => Error::Io(io::Error::new(*k, m.clone())),
            Dead::Protocol(m) => Error::Protocol(m.clone()),
        }
    }
}

#[derive(Default)]
struct State {
    /// Replies read by another caller, waiting for their owner.
    replies: HashMap<u64, Vec<Vec<u8>>>,
    /// Seqnos sent and not yet answered.
    waiting: HashSet<u64>,
    /// Some caller is currently reading from the socket.
    reading: bool,
    /// Why the connection is unusable, once it is.
    dead: Option<Dead>,
}

/// A connection to spproxyd (or the embedded server). `Send + Sync`: share it by reference
/// or in an `Arc` across threads.
pub struct Client {
    /// A handle used only to shut the socket down, so that never waits for the writer.
    ctl: UnixStream,
    writer: Mutex<UnixStream>,
    reader: Mutex<BufReader<UnixStream>>,
    state: Mutex<State>,
    cond: Condvar,
    next_seqno: AtomicU64,
    limits: Limits,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn io_context(e: io::Error, what: &str) -> Error {
    Error::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

impl Client {
    /// Connects as a σOS proc does: the inherited fd in `SIGMA_SPPROXY_FD` if set, else the
    /// socket at `SIGMA_SPPROXY_SOCKET` or `/tmp/spproxyd/spproxyd.sock`; then Init with the
    /// ProcEnv from `SIGMACONFIG` (forwarded unchanged) or a minimal one.
    pub fn connect_env() -> Result<Client, Error> {
        let pe = match std::env::var(procenv::SIGMACONFIG) {
            Ok(s) if !s.trim().is_empty() => {
                Some(procenv::from_json(&s).map_err(|e| Error::Protocol(e.to_string()))?)
            }
            _ => None,
        };
        let stream = match std::env::var(ENV_SPPROXY_FD) {
            Ok(v) if !v.is_empty() => crate::fdenv::adopt(&v)?,
            _ => {
                let path = std::env::var(ENV_SPPROXY_SOCKET)
                    .ok()
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| DEFAULT_SOCKET.to_owned());
                return Client::connect(path, pe);
            }
        };
        Client::from_stream(stream, pe)
    }

    /// Connects to the spproxy socket at `path` and sends Init (see [`Client::from_stream`]).
    pub fn connect(
        path: impl AsRef<std::path::Path>,
        procenv: Option<ProcEnvProto>,
    ) -> Result<Client, Error> {
        let path = path.as_ref();
        let s = UnixStream::connect(path)
            .map_err(|e| io_context(e, &format!("connecting to spproxyd at {}", path.display())))?;
        Client::from_stream(s, procenv)
    }

    /// Takes a connected stream and sends Init with `procenv`, or a minimal ProcEnv
    /// (pid `<program>-<os pid>`, realm `rootrealm`) when `None`.
    pub fn from_stream(s: UnixStream, procenv: Option<ProcEnvProto>) -> Result<Client, Error> {
        let client = Client::new_uninit(s)?;
        let pe = procenv.unwrap_or_else(default_procenv);
        let rep: SigmaErrRep = client.call_api(api::init(pe))?;
        Error::check(rep.err)?;
        Ok(client)
    }

    /// Wraps a connected stream without sending Init (for talking to a server directly,
    /// e.g. to test what it does before Init).
    pub fn new_uninit(s: UnixStream) -> Result<Client, Error> {
        let r = s
            .try_clone()
            .map_err(|e| io_context(e, "duplicating the spproxy socket"))?;
        let ctl = s
            .try_clone()
            .map_err(|e| io_context(e, "duplicating the spproxy socket"))?;
        Ok(Client {
            ctl,
            writer: Mutex::new(s),
            reader: Mutex::new(BufReader::with_capacity(64 * 1024, r)),
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            next_seqno: AtomicU64::new(1),
            limits: Limits::default(),
        })
    }

    /// Sends any request and decodes the reply as `P` (RPC-level errors become
    /// `Error::Sigma`; the reply's own `err` field is left for the caller to check).
    pub fn call<Q: RpcMessage, P: RpcMessage>(&self, method: &str, req: Q) -> Result<P, Error> {
        self.call_encoded(method, |seqno| rpc::encode_request(seqno, method, req))
    }

    /// Sends `msg` (holding an empty Blob) with `data` as its one blob frame.
    fn call_with_blob<Q: RpcMessage, P: RpcMessage>(
        &self,
        method: &str,
        msg: Q,
        data: &[u8],
    ) -> Result<P, Error> {
        self.call_encoded(method, |seqno| {
            rpc::encode_request_with_blob(seqno, method, &msg, &[data])
        })
    }

    fn call_encoded<P: RpcMessage>(
        &self,
        method: &str,
        encode: impl FnOnce(u64) -> Vec<u8>,
    ) -> Result<P, Error> {
        let seqno = self.next_seqno.fetch_add(1, Ordering::Relaxed);
        let buf = encode(seqno);
        {
            let mut st = lock(&self.state);
            if let Some(d) = &st.dead {
                return Err(d.error());
            }
            st.waiting.insert(seqno);
        }
        let written = lock(&self.writer).write_all(&buf);
        if let Err(e) = written {
            let err = Dead::Io(e.kind(), format!("sending {method} to spproxyd: {e}"));
            let mut st = lock(&self.state);
            st.waiting.remove(&seqno);
            self.kill(&mut st, err.clone());
            return Err(err.error());
        }
        let frames = self.wait_for(seqno)?;
        rpc::decode_reply(frames)
    }

    fn call_api<Q: RpcMessage, P: RpcMessage>(&self, (m, q): (&str, Q)) -> Result<P, Error> {
        self.call(m, q)
    }

    fn kill(&self, st: &mut State, why: Dead) {
        if st.dead.is_none() {
            st.dead = Some(why);
            st.replies.clear();
            st.waiting.clear();
            let _ = self.ctl.shutdown(std::net::Shutdown::Both);
        }
        self.cond.notify_all();
    }

    fn wait_for(&self, seqno: u64) -> Result<Vec<Vec<u8>>, Error> {
        let mut st = lock(&self.state);
        loop {
            if let Some(frames) = st.replies.remove(&seqno) {
                return Ok(frames);
            }
            if let Some(d) = &st.dead {
                return Err(d.error());
            }
            if st.reading {
                st = self.cond.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            st.reading = true;
            drop(st);
            let res = frame::read_message(&mut *lock(&self.reader), &self.limits);
            st = lock(&self.state);
            st.reading = false;
            match res {
                Ok(Some(m)) if m.seqno == seqno => {
                    st.waiting.remove(&seqno);
                    // Let another waiter take over reading.
                    self.cond.notify_all();
                    return Ok(m.frames);
                }
                Ok(Some(m)) => {
                    if st.waiting.remove(&m.seqno) {
                        st.replies.insert(m.seqno, m.frames);
                        self.cond.notify_all();
                    } else {
                        let why = Dead::Protocol(format!(
                            "spproxyd replied with seqno {} that no call is waiting for",
                            m.seqno
                        ));
                        self.kill(&mut st, why);
                    }
                }
                Ok(None) => self.kill(
                    &mut st,
                    Dead::Io(
                        io::ErrorKind::ConnectionAborted,
                        "spproxyd closed the connection".into(),
                    ),
                ),
                Err(e) => {
                    let why = match Error::from(e) {
                        Error::Io(e) => Dead::Io(e.kind(), format!("reading from spproxyd: {e}")),
                        other => Dead::Protocol(other.to_string()),
                    };
                    self.kill(&mut st, why);
                }
            }
        }
    }

    /// Tells the realm the proc has started.
    pub fn started(&self) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::started())?;
        Error::check(r.err)
    }

    /// Tells the realm the proc exits with `status` (see `consts::STATUS_*`) and `msg`.
    pub fn exited(&self, status: u32, msg: &str) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::exited(status, msg))?;
        Error::check(r.err)
    }

    /// spproxyd's client id for this connection.
    pub fn clnt_id(&self) -> Result<u64, Error> {
        let r: SigmaClntIdRep = self.call_api(api::clnt_id())?;
        Error::check(r.err)?;
        Ok(r.clnt_id)
    }

    pub fn stat(&self, path: &str) -> Result<Stat, Error> {
        let r: SigmaStatRep = self.call_api(api::stat(path))?;
        Error::check(r.err)?;
        r.stat
            .map(Stat::from)
            .ok_or_else(|| Error::Protocol(format!("Stat of {path:?} returned no stat")))
    }

    /// Creates `path` (`perm`: `0o777`-style bits, `DMDIR` for a directory) and opens it
    /// with `mode`; returns the fd.
    pub fn create(&self, path: &str, perm: u32, mode: u32) -> Result<u32, Error> {
        let r: SigmaFdRep = self.call_api(api::create(path, perm, mode))?;
        Error::check(r.err)?;
        Ok(r.fd)
    }

    /// Opens `path` with `mode`; with `wait`, waits for it to exist.
    pub fn open(&self, path: &str, mode: u32, wait: bool) -> Result<u32, Error> {
        let r: SigmaFdRep = self.call_api(api::open(path, mode, wait))?;
        Error::check(r.err)?;
        Ok(r.fd)
    }

    /// Reads up to `size` bytes at the fd's offset, advancing it.
    pub fn read(&self, fd: u32, size: u64) -> Result<Vec<u8>, Error> {
        self.pread(fd, size, NO_OFFSET)
    }

    /// Reads up to `size` bytes at `off` (`NO_OFFSET`: at the fd's offset).
    pub fn pread(&self, fd: u32, size: u64, off: u64) -> Result<Vec<u8>, Error> {
        let r: SigmaDataRep = self.call_api(api::pread(fd, size, off))?;
        Error::check(r.err)?;
        Ok(blob_bytes(r.blob))
    }

    /// Writes `data` at the fd's offset; returns the bytes written.
    pub fn write(&self, fd: u32, data: &[u8]) -> Result<u64, Error> {
        let (m, mut q) = api::write(fd, &[]);
        q.blob = Some(Blob::default());
        let r: SigmaSizeRep = self.call_with_blob(m, q, data)?;
        Error::check(r.err)?;
        Ok(r.size)
    }

    pub fn seek(&self, fd: u32, off: u64) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::seek(fd, off))?;
        Error::check(r.err)
    }

    pub fn close_fd(&self, fd: u32) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::close_fd(fd))?;
        Error::check(r.err)
    }

    /// The whole content of `path`.
    pub fn get_file(&self, path: &str) -> Result<Vec<u8>, Error> {
        let r: SigmaDataRep = self.call_api(api::get_file(path))?;
        Error::check(r.err)?;
        Ok(blob_bytes(r.blob))
    }

    /// Creates (or opens) `path` and writes `data` at `offset`; returns the bytes written.
    /// FsLib passes `offset` 0 and `NO_LEASE_ID`.
    pub fn put_file(
        &self,
        path: &str,
        perm: u32,
        mode: u32,
        data: &[u8],
        offset: u64,
        lease_id: u64,
    ) -> Result<u64, Error> {
        let (m, mut q) = api::put_file(path, perm, mode, &[], offset, lease_id);
        q.blob = Some(Blob::default());
        let r: SigmaSizeRep = self.call_with_blob(m, q, data)?;
        Error::check(r.err)?;
        Ok(r.size)
    }

    pub fn remove(&self, path: &str) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::remove(path))?;
        Error::check(r.err)
    }

    pub fn rename(&self, src: &str, dst: &str) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::rename(src, dst))?;
        Error::check(r.err)
    }

    /// Blocks until the realm evicts this proc (σOS's `WaitEvict`).
    pub fn wait_evict(&self) -> Result<(), Error> {
        let r: SigmaErrRep = self.call_api(api::wait_evict())?;
        Error::check(r.err)
    }

    /// The entries of the directory open at `fd`, read to its end (σOS's directory
    /// encoding: one `u32 len | TstatProto` frame per entry).
    pub fn read_dir(&self, fd: u32) -> Result<Vec<Stat>, Error> {
        let mut out = Vec::new();
        loop {
            let b = self.read(fd, DIR_READ)?;
            if b.is_empty() {
                return Ok(out);
            }
            let ents = crate::dirent::decode_dir(&b)
                .map_err(|e| Error::Protocol(format!("directory entries of fd {fd}: {e}")))?;
            out.extend(ents.into_iter().map(Stat::from));
        }
    }

    /// The entries of directory `path` (FsLib's `GetDir`).
    pub fn get_dir(&self, path: &str) -> Result<Vec<Stat>, Error> {
        let fd = self.open(path, OREAD, false)?;
        let r = self.read_dir(fd);
        let c = self.close_fd(fd);
        let ents = r?;
        c?;
        Ok(ents)
    }

    /// A watch on the directory open at `fd` (σOS's `DirWatch`): returns the watch fd,
    /// from which [`Client::read_watch`] reads what changed since the directory was read.
    pub fn dir_watch(&self, fd: u32) -> Result<u32, Error> {
        let r: SigmaFdRep = self.call_api(api::dir_watch(fd))?;
        Error::check(r.err)?;
        Ok(r.fd)
    }

    /// Blocks until the watched directory changes; returns the changes (creations and
    /// removals, by name) as whole `u32 len | WatchEventList` records.
    pub fn read_watch(&self, watch_fd: u32) -> Result<Vec<WatchEvent>, Error> {
        let mut buf = Vec::new();
        loop {
            let b = self.read(watch_fd, DIR_READ)?;
            // σOS answers a read of a watch closed meanwhile with no bytes.
            if b.is_empty() {
                return Err(Error::Sigma {
                    code: crate::consts::ECODE_CLOSED,
                    name: crate::consts::ecode_name(crate::consts::ECODE_CLOSED),
                    obj: watch_fd.to_string(),
                    msg: "watch closed".into(),
                });
            }
            buf.extend_from_slice(&b);
            if let Ok(ev) = crate::dirent::decode_watch(&buf) {
                return Ok(ev
                    .into_iter()
                    .map(|e| WatchEvent {
                        created: e.r#type == crate::proto::WatchEventType::Create as i32,
                        name: e.file,
                    })
                    .collect());
            }
        }
    }
}

/// Bytes asked for per directory or watch read.
const DIR_READ: u64 = 64 * 1024;

/// One change of a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub name: String,
    /// `true`: created; `false`: removed.
    pub created: bool,
}

fn blob_bytes(blob: Option<Blob>) -> Vec<u8> {
    let Some(mut b) = blob else {
        return Vec::new();
    };
    let mut iov = std::mem::take(&mut b.iov);
    for s in b.split_iov {
        iov.extend(s.iov);
    }
    if iov.len() == 1 {
        return iov.pop().unwrap_or_default();
    }
    iov.concat()
}

fn default_procenv() -> ProcEnvProto {
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "proc".to_owned());
    let pid = format!("{program}-{}", std::process::id());
    procenv::minimal(&pid, &program, "rootrealm")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn client_is_send_and_sync() {
        assert_send_sync::<Client>();
    }
}
