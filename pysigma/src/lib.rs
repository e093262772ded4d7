//! `pysigma._pysigma`: the σOS API for Python, spoken over the spproxy protocol.
//!
//! Every call that talks to the server releases the GIL for the whole round trip. The protocol
//! itself lives in the pyo3-free `spproxy` crate; this module only converts types and errors.
#![forbid(unsafe_code)]

mod errors;
mod types;

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PySlice, PyString};

use errors::call;
use types::{Qid, Stat};

/// `put_file`'s default mode: replace the whole contents, like `Path.write_bytes`.
const PUT_FILE_MODE: u32 = spproxy::consts::OWRITE | spproxy::consts::OTRUNC;

/// Size of one read request when reading a whole file (`read()` / `read(-1)`).
const READ_ALL_CHUNK: u64 = 1 << 20;

/// A connection to spproxyd. Thread-safe: calls from several threads are pipelined on one socket.
#[pyclass(frozen, module = "pysigma._pysigma")]
struct Client {
    inner: Arc<spproxy::Client>,
}

/// Bytes to send: borrowed from an immutable `bytes`, or copied out of another buffer.
enum Data<'py> {
    Bytes(Bound<'py, PyBytes>),
    Owned(Vec<u8>),
}

impl Data<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Data::Bytes(b) => b.as_bytes(),
            Data::Owned(v) => v,
        }
    }
}

impl<'py> FromPyObject<'_, 'py> for Data<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Data::Bytes(b.to_owned()));
        }
        if let Ok(b) = obj.cast::<PyByteArray>() {
            return Ok(Data::Owned(b.to_vec()));
        }
        if obj.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "expected a bytes-like object, not 'str' (encode it first)",
            ));
        }
        match PyMemoryView::from(&obj) {
            Ok(mv) => {
                let b = mv.call_method0(intern!(obj.py(), "tobytes"))?;
                let b = b.cast_into::<PyBytes>()?;
                Ok(Data::Bytes(b))
            }
            Err(_) => Err(PyTypeError::new_err(format!(
                "expected a bytes-like object, not '{}'",
                obj.get_type().name()?
            ))),
        }
    }
}

/// Where `readinto` puts the data: a `bytearray` directly (its length is the size; no memoryview
/// is made), or any other writable buffer through a byte-format memoryview over it.
enum Sink<'py> {
    ByteArray(Bound<'py, PyByteArray>),
    View(Bound<'py, PyAny>),
}

impl<'py> Sink<'py> {
    /// Checks `buf` before anything is read: it must be a writable, C-contiguous buffer.
    fn new(buf: &Bound<'py, PyAny>) -> PyResult<Self> {
        // Exactly bytearray: a subclass may override __setitem__, so it goes through its buffer.
        if let Ok(ba) = buf.cast_exact::<PyByteArray>() {
            return Ok(Sink::ByteArray(ba.clone()));
        }
        let py = buf.py();
        let mv = PyMemoryView::from(buf).map_err(|_| {
            PyTypeError::new_err(format!(
                "expected a writable bytes-like object, not '{}'",
                buf.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        if mv.getattr(intern!(py, "readonly"))?.is_truthy()? {
            return Err(PyTypeError::new_err("readinto() needs a writable buffer"));
        }
        let flat = mv.call_method1(intern!(py, "cast"), (intern!(py, "B"),))?;
        Ok(Sink::View(flat))
    }

    /// The buffer's size in bytes.
    fn len(&self) -> PyResult<usize> {
        match self {
            Sink::ByteArray(ba) => Ok(ba.len()),
            Sink::View(mv) => mv.len(),
        }
    }

    /// Copies `data` into the start of the buffer; returns how many bytes it copied.
    fn fill(&self, data: &[u8]) -> PyResult<usize> {
        // The length is read again: another thread may have resized a bytearray meanwhile.
        let n = data.len().min(self.len()?);
        if n == 0 {
            return Ok(0);
        }
        let target = match self {
            Sink::ByteArray(ba) => ba.as_any(),
            Sink::View(mv) => mv,
        };
        let py = target.py();
        // Slice assignment of an equal-length bytes object is one memcpy into the buffer.
        let slice = PySlice::new(py, 0, n as isize, 1);
        target.set_item(slice, PyBytes::new(py, &data[..n]))?;
        Ok(n)
    }
}

impl Client {
    fn wrap(inner: spproxy::Client) -> Self {
        Client {
            inner: Arc::new(inner),
        }
    }

    fn read_all(&self, py: Python<'_>, fd: u32) -> PyResult<Vec<u8>> {
        let c = &self.inner;
        call(py, || {
            let mut out = Vec::new();
            loop {
                let chunk = c.read(fd, READ_ALL_CHUNK)?;
                if chunk.is_empty() {
                    return Ok(out);
                }
                out.extend_from_slice(&chunk);
            }
        })
    }

    fn read_n(&self, py: Python<'_>, fd: u32, n: i64) -> PyResult<Vec<u8>> {
        if n < 0 {
            return self.read_all(py, fd);
        }
        let c = &self.inner;
        call(py, || c.read(fd, n as u64))
    }
}

#[pymethods]
impl Client {
    /// Connects the way a proc does: the fd in SIGMA_SPPROXY_FD, else the socket in
    /// SIGMA_SPPROXY_SOCKET or /tmp/spproxyd/spproxyd.sock; sends Init with SIGMACONFIG's ProcEnv.
    #[staticmethod]
    fn connect_env(py: Python<'_>) -> PyResult<Self> {
        Ok(Client::wrap(call(py, spproxy::Client::connect_env)?))
    }

    /// Connects to the spproxy socket at `path` and sends Init with a minimal ProcEnv.
    #[staticmethod]
    fn connect_socket(py: Python<'_>, path: String) -> PyResult<Self> {
        let c = call(py, || {
            let stream = UnixStream::connect(&path).map_err(|e| {
                spproxy::Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("connecting to spproxyd at {path}: {e}"),
                ))
            })?;
            spproxy::Client::from_stream(stream, None)
        })?;
        Ok(Client::wrap(c))
    }

    /// Marks this proc as started.
    fn started(&self, py: Python<'_>) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.started())
    }

    /// Marks this proc as exited with `status` (1 = OK, 2 = evicted, 3 = error, 4 = fatal).
    #[pyo3(signature = (status = spproxy::consts::STATUS_OK, msg = String::new()), text_signature = "($self, status=1, msg='')")]
    fn exited(&self, py: Python<'_>, status: u32, msg: String) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.exited(status, &msg))
    }

    /// The server-side id of this client.
    fn clnt_id(&self, py: Python<'_>) -> PyResult<u64> {
        let c = &self.inner;
        call(py, || c.clnt_id())
    }

    /// Information about the object at `path`.
    fn stat(&self, py: Python<'_>, path: String) -> PyResult<Stat> {
        let c = &self.inner;
        let st = call(py, || c.stat(&path))?;
        Ok(Stat::from(st))
    }

    /// Blocks until the realm evicts this proc (σOS's WaitEvict); the proc should then
    /// call `exited(STATUS_EVICTED)`.
    fn wait_evict(&self, py: Python<'_>) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.wait_evict())
    }

    /// The entries of directory `path` (σOS's GetDir), as `Stat`s.
    fn get_dir(&self, py: Python<'_>, path: String) -> PyResult<Vec<Stat>> {
        let c = &self.inner;
        let ents = call(py, || c.get_dir(&path))?;
        Ok(ents.into_iter().map(Stat::from).collect())
    }

    /// The entries of the directory open at `fd`, read from its offset to the end.
    fn read_dir_fd(&self, py: Python<'_>, fd: u32) -> PyResult<Vec<Stat>> {
        let c = &self.inner;
        let ents = call(py, || c.read_dir(fd))?;
        Ok(ents.into_iter().map(Stat::from).collect())
    }

    /// σOS's DirWatch on the directory open at `fd`: returns a watch fd for `read_watch_fd`.
    fn dir_watch_fd(&self, py: Python<'_>, fd: u32) -> PyResult<u32> {
        let c = &self.inner;
        call(py, || c.dir_watch(fd))
    }

    /// Blocks until the watched directory changes; returns `(name, created)` pairs
    /// (`created` False: removed).
    fn read_watch_fd(&self, py: Python<'_>, fd: u32) -> PyResult<Vec<(String, bool)>> {
        let c = &self.inner;
        let ev = call(py, || c.read_watch(fd))?;
        Ok(ev.into_iter().map(|e| (e.name, e.created)).collect())
    }

    /// Reads directory `path` and watches it from that listing on (σOS's
    /// `NewDirWatcherWithRead`): returns the names and the watch fd.
    fn dir_watch(&self, py: Python<'_>, path: String) -> PyResult<(Vec<String>, u32)> {
        let c = &self.inner;
        call(py, || {
            let fd = c.open(&path, spproxy::consts::OREAD, false)?;
            let r = c.read_dir(fd).and_then(|ents| {
                let w = c.dir_watch(fd)?;
                Ok((ents.into_iter().map(|s| s.name).collect(), w))
            });
            let closed = c.close_fd(fd);
            let out = r?;
            closed?;
            Ok(out)
        })
    }

    /// Creates `path` and opens it with `mode`; returns the open file.
    #[pyo3(signature = (path, perm = 0o777, mode = spproxy::consts::OWRITE), text_signature = "($self, path, perm=0o777, mode=1)")]
    fn create(slf: &Bound<'_, Self>, path: String, perm: u32, mode: u32) -> PyResult<File> {
        let me = slf.get();
        let fd = call(slf.py(), || me.inner.create(&path, perm, mode))?;
        Ok(File::new(slf.clone().unbind(), fd, path, mode))
    }

    /// Opens `path` with `mode`; with `wait`, waits for it to be created.
    #[pyo3(signature = (path, mode = spproxy::consts::OREAD, wait = false), text_signature = "($self, path, mode=0, wait=False)")]
    fn open(slf: &Bound<'_, Self>, path: String, mode: u32, wait: bool) -> PyResult<File> {
        let me = slf.get();
        let fd = call(slf.py(), || me.inner.open(&path, mode, wait))?;
        Ok(File::new(slf.clone().unbind(), fd, path, mode))
    }

    /// The whole contents of `path`.
    fn get_file<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyBytes>> {
        let c = &self.inner;
        let data = call(py, || c.get_file(&path))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes `data` to `path` (created if need be); returns the number of bytes written. The
    /// default mode `OWRITE | OTRUNC` replaces the contents; pass `mode=OWRITE` with an `offset`
    /// to overwrite a range.
    #[pyo3(
        signature = (path, data, perm = 0o777, mode = PUT_FILE_MODE, offset = 0, lease_id = spproxy::consts::NO_LEASE_ID),
        text_signature = "($self, path, data, perm=0o777, mode=17, offset=0, lease_id=18446744073709551615)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn put_file(
        &self,
        py: Python<'_>,
        path: String,
        data: Data<'_>,
        perm: u32,
        mode: u32,
        offset: u64,
        lease_id: u64,
    ) -> PyResult<u64> {
        let c = &self.inner;
        let bytes = data.as_slice();
        call(py, || {
            c.put_file(&path, perm, mode, bytes, offset, lease_id)
        })
    }

    /// Removes `path`.
    fn remove(&self, py: Python<'_>, path: String) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.remove(&path))
    }

    /// Renames `src` to `dst`.
    fn rename(&self, py: Python<'_>, src: String, dst: String) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.rename(&src, &dst))
    }

    // Raw fd calls, for callers that keep integer fds (splib).

    /// Like `create`, but returns the bare fd number.
    #[pyo3(signature = (path, perm = 0o777, mode = spproxy::consts::OWRITE), text_signature = "($self, path, perm=0o777, mode=1)")]
    fn create_fd(&self, py: Python<'_>, path: String, perm: u32, mode: u32) -> PyResult<u32> {
        let c = &self.inner;
        call(py, || c.create(&path, perm, mode))
    }

    /// Like `open`, but returns the bare fd number.
    #[pyo3(signature = (path, mode = spproxy::consts::OREAD, wait = false), text_signature = "($self, path, mode=0, wait=False)")]
    fn open_fd(&self, py: Python<'_>, path: String, mode: u32, wait: bool) -> PyResult<u32> {
        let c = &self.inner;
        call(py, || c.open(&path, mode, wait))
    }

    /// Reads up to `size` bytes at the fd's offset.
    fn read_fd<'py>(&self, py: Python<'py>, fd: u32, size: u64) -> PyResult<Bound<'py, PyBytes>> {
        let c = &self.inner;
        let data = call(py, || c.read(fd, size))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Reads up to `size` bytes at offset `off` without moving the fd's offset.
    fn pread_fd<'py>(
        &self,
        py: Python<'py>,
        fd: u32,
        size: u64,
        off: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let c = &self.inner;
        let data = call(py, || c.pread(fd, size, off))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Reads into the writable buffer `buf` at the fd's offset (or at `off`); returns the count.
    #[pyo3(signature = (fd, buf, off = None))]
    fn readinto_fd(&self, fd: u32, buf: &Bound<'_, PyAny>, off: Option<u64>) -> PyResult<usize> {
        let sink = Sink::new(buf)?;
        let size = sink.len()? as u64;
        let c = &self.inner;
        let data = call(buf.py(), || match off {
            None => c.read(fd, size),
            Some(off) => c.pread(fd, size, off),
        })?;
        sink.fill(&data)
    }

    /// Writes `data` at the fd's offset; returns the number of bytes written.
    fn write_fd(&self, py: Python<'_>, fd: u32, data: Data<'_>) -> PyResult<u64> {
        let c = &self.inner;
        let bytes = data.as_slice();
        call(py, || c.write(fd, bytes))
    }

    /// Sets the fd's offset.
    fn seek_fd(&self, py: Python<'_>, fd: u32, off: u64) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.seek(fd, off))
    }

    /// Closes the fd.
    fn close_fd(&self, py: Python<'_>, fd: u32) -> PyResult<()> {
        let c = &self.inner;
        call(py, || c.close_fd(fd))
    }

    fn __repr__(&self) -> String {
        "<pysigma.Client>".to_string()
    }
}

/// An open σOS file. Closes itself when used as a context manager or garbage-collected.
#[pyclass(frozen, module = "pysigma._pysigma")]
struct File {
    client: Py<Client>,
    fd: u32,
    path: String,
    mode: u32,
    closed: AtomicBool,
}

impl File {
    fn new(client: Py<Client>, fd: u32, path: String, mode: u32) -> Self {
        File {
            client,
            fd,
            path,
            mode,
            closed: AtomicBool::new(false),
        }
    }

    fn check_open(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PyValueError::new_err("I/O operation on closed σOS file"));
        }
        Ok(())
    }
}

#[pymethods]
impl File {
    /// The σOS fd number (valid on this file's client only).
    #[getter]
    fn fd(&self) -> u32 {
        self.fd
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn mode(&self) -> u32 {
        self.mode
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Reads up to `n` bytes at the file's offset; `n < 0` reads to the end.
    #[pyo3(signature = (n = -1), text_signature = "($self, n=-1)")]
    fn read<'py>(&self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        self.check_open()?;
        let data = self.client.get().read_n(py, self.fd, n)?;
        Ok(PyBytes::new(py, &data))
    }

    /// Reads into the writable buffer `buf`; returns the number of bytes read.
    fn readinto(&self, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.check_open()?;
        self.client.get().readinto_fd(self.fd, buf, None)
    }

    /// Reads up to `n` bytes at offset `off` without moving the file's offset.
    fn pread<'py>(&self, py: Python<'py>, n: u64, off: u64) -> PyResult<Bound<'py, PyBytes>> {
        self.check_open()?;
        self.client.get().pread_fd(py, self.fd, n, off)
    }

    /// Writes `data`; returns the number of bytes written.
    fn write(&self, py: Python<'_>, data: Data<'_>) -> PyResult<u64> {
        self.check_open()?;
        self.client.get().write_fd(py, self.fd, data)
    }

    /// Sets the file's offset.
    fn seek(&self, py: Python<'_>, off: u64) -> PyResult<()> {
        self.check_open()?;
        self.client.get().seek_fd(py, self.fd, off)
    }

    /// Closes the file; closing twice is a no-op.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.client.get().close_fd(py, self.fd)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "<pysigma.File path={:?} fd={} mode={:#x}{}>",
            self.path,
            self.fd,
            self.mode,
            if self.closed() { " closed" } else { "" }
        )
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Best effort, like a Python file's finalizer: the fd lives on the server, so leaking it
        // would keep the object open there until the connection ends.
        // Runs under the GIL (from the object's deallocation); the call is one short round trip.
        let _ = self.client.get().inner.close_fd(self.fd);
    }
}

/// The module's default client, made on first use from the proc's environment.
static DEFAULT: Mutex<Option<Py<Client>>> = Mutex::new(None);

fn default_client(py: Python<'_>) -> PyResult<Py<Client>> {
    if let Some(c) = DEFAULT.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(c.clone_ref(py));
    }
    // Connect without holding the lock or the GIL; if two threads race, the first one stored wins.
    let fresh = Py::new(py, Client::connect_env(py)?)?;
    let mut slot = DEFAULT.lock().unwrap_or_else(|p| p.into_inner());
    Ok(slot.get_or_insert(fresh).clone_ref(py))
}

/// Connects (to `socket`, else as the proc's environment says) and makes it the default client.
#[pyfunction]
#[pyo3(signature = (socket = None))]
fn connect(py: Python<'_>, socket: Option<String>) -> PyResult<Py<Client>> {
    let c = match socket {
        Some(path) => Client::connect_socket(py, path)?,
        None => Client::connect_env(py)?,
    };
    let c = Py::new(py, c)?;
    *DEFAULT.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone_ref(py));
    Ok(c)
}

/// Forgets the default client (the next call connects again). Open files keep their own client.
#[pyfunction]
fn disconnect() {
    DEFAULT.lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// The default client, connecting on first use.
#[pyfunction]
fn client(py: Python<'_>) -> PyResult<Py<Client>> {
    default_client(py)
}

macro_rules! with_default {
    ($py:ident, |$c:ident| $body:expr) => {{
        let client = default_client($py)?;
        let $c = client.get();
        $body
    }};
}

#[pyfunction]
fn started(py: Python<'_>) -> PyResult<()> {
    with_default!(py, |c| c.started(py))
}

#[pyfunction]
#[pyo3(signature = (status = spproxy::consts::STATUS_OK, msg = String::new()), text_signature = "(status=1, msg='')")]
fn exited(py: Python<'_>, status: u32, msg: String) -> PyResult<()> {
    with_default!(py, |c| c.exited(py, status, msg))
}

#[pyfunction]
fn clnt_id(py: Python<'_>) -> PyResult<u64> {
    with_default!(py, |c| c.clnt_id(py))
}

#[pyfunction]
fn stat(py: Python<'_>, path: String) -> PyResult<Stat> {
    with_default!(py, |c| c.stat(py, path))
}

#[pyfunction]
fn wait_evict(py: Python<'_>) -> PyResult<()> {
    with_default!(py, |c| c.wait_evict(py))
}

#[pyfunction]
fn get_dir(py: Python<'_>, path: String) -> PyResult<Vec<Stat>> {
    with_default!(py, |c| c.get_dir(py, path))
}

#[pyfunction]
fn read_dir_fd(py: Python<'_>, fd: u32) -> PyResult<Vec<Stat>> {
    with_default!(py, |c| c.read_dir_fd(py, fd))
}

#[pyfunction]
fn dir_watch_fd(py: Python<'_>, fd: u32) -> PyResult<u32> {
    with_default!(py, |c| c.dir_watch_fd(py, fd))
}

#[pyfunction]
fn read_watch_fd(py: Python<'_>, fd: u32) -> PyResult<Vec<(String, bool)>> {
    with_default!(py, |c| c.read_watch_fd(py, fd))
}

#[pyfunction]
fn dir_watch(py: Python<'_>, path: String) -> PyResult<(Vec<String>, u32)> {
    with_default!(py, |c| c.dir_watch(py, path))
}

#[pyfunction]
#[pyo3(signature = (path, perm = 0o777, mode = spproxy::consts::OWRITE), text_signature = "(path, perm=0o777, mode=1)")]
fn create(py: Python<'_>, path: String, perm: u32, mode: u32) -> PyResult<File> {
    let client = default_client(py)?;
    Client::create(client.bind(py), path, perm, mode)
}

#[pyfunction]
#[pyo3(signature = (path, mode = spproxy::consts::OREAD, wait = false), text_signature = "(path, mode=0, wait=False)")]
fn open(py: Python<'_>, path: String, mode: u32, wait: bool) -> PyResult<File> {
    let client = default_client(py)?;
    Client::open(client.bind(py), path, mode, wait)
}

#[pyfunction]
fn get_file(py: Python<'_>, path: String) -> PyResult<Bound<'_, PyBytes>> {
    with_default!(py, |c| c.get_file(py, path))
}

#[pyfunction]
#[pyo3(
    signature = (path, data, perm = 0o777, mode = PUT_FILE_MODE, offset = 0, lease_id = spproxy::consts::NO_LEASE_ID),
    text_signature = "(path, data, perm=0o777, mode=17, offset=0, lease_id=18446744073709551615)"
)]
fn put_file(
    py: Python<'_>,
    path: String,
    data: Data<'_>,
    perm: u32,
    mode: u32,
    offset: u64,
    lease_id: u64,
) -> PyResult<u64> {
    with_default!(py, |c| c
        .put_file(py, path, data, perm, mode, offset, lease_id))
}

#[pyfunction]
fn remove(py: Python<'_>, path: String) -> PyResult<()> {
    with_default!(py, |c| c.remove(py, path))
}

#[pyfunction]
fn rename(py: Python<'_>, src: String, dst: String) -> PyResult<()> {
    with_default!(py, |c| c.rename(py, src, dst))
}

// The default client's raw fd calls (splib's shapes), one native call each.

/// `Client.create_fd` on the default client.
#[pyfunction]
#[pyo3(signature = (path, perm = 0o777, mode = spproxy::consts::OWRITE), text_signature = "(path, perm=0o777, mode=1)")]
fn create_fd(py: Python<'_>, path: String, perm: u32, mode: u32) -> PyResult<u32> {
    with_default!(py, |c| c.create_fd(py, path, perm, mode))
}

/// `Client.open_fd` on the default client.
#[pyfunction]
#[pyo3(signature = (path, mode = spproxy::consts::OREAD, wait = false), text_signature = "(path, mode=0, wait=False)")]
fn open_fd(py: Python<'_>, path: String, mode: u32, wait: bool) -> PyResult<u32> {
    with_default!(py, |c| c.open_fd(py, path, mode, wait))
}

/// `Client.read_fd` on the default client.
#[pyfunction]
fn read_fd(py: Python<'_>, fd: u32, size: u64) -> PyResult<Bound<'_, PyBytes>> {
    with_default!(py, |c| c.read_fd(py, fd, size))
}

/// `Client.pread_fd` on the default client.
#[pyfunction]
fn pread_fd(py: Python<'_>, fd: u32, size: u64, off: u64) -> PyResult<Bound<'_, PyBytes>> {
    with_default!(py, |c| c.pread_fd(py, fd, size, off))
}

/// `Client.readinto_fd` on the default client.
#[pyfunction]
#[pyo3(signature = (fd, buf, off = None))]
fn readinto_fd(fd: u32, buf: &Bound<'_, PyAny>, off: Option<u64>) -> PyResult<usize> {
    let py = buf.py();
    with_default!(py, |c| c.readinto_fd(fd, buf, off))
}

/// `Client.write_fd` on the default client.
#[pyfunction]
fn write_fd(py: Python<'_>, fd: u32, data: Data<'_>) -> PyResult<u64> {
    with_default!(py, |c| c.write_fd(py, fd, data))
}

/// `Client.seek_fd` on the default client.
#[pyfunction]
fn seek_fd(py: Python<'_>, fd: u32, off: u64) -> PyResult<()> {
    with_default!(py, |c| c.seek_fd(py, fd, off))
}

/// `Client.close_fd` on the default client.
#[pyfunction]
fn close_fd(py: Python<'_>, fd: u32) -> PyResult<()> {
    with_default!(py, |c| c.close_fd(py, fd))
}

/// Starts an embedded realm server on `socket_path` in background threads (for tests and
/// benchmarks): `name/ux/~local/...` is `scratch_dir`, `name/s3/~local/BUCKET/...` is `s3_dir`.
#[pyfunction]
fn _serve_local(
    py: Python<'_>,
    socket_path: String,
    scratch_dir: String,
    s3_dir: String,
) -> PyResult<server::LocalServer> {
    py.detach(|| server::LocalServer::start(&socket_path, &scratch_dir, &s3_dir))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("embedded realm server: {e}")))
}

mod server;

#[pymodule]
fn _pysigma(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<File>()?;
    m.add_class::<Stat>()?;
    m.add_class::<Qid>()?;
    m.add_class::<server::LocalServer>()?;
    errors::register(m)?;
    types::add_constants(m)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(disconnect, m)?)?;
    m.add_function(wrap_pyfunction!(client, m)?)?;
    m.add_function(wrap_pyfunction!(started, m)?)?;
    m.add_function(wrap_pyfunction!(exited, m)?)?;
    m.add_function(wrap_pyfunction!(clnt_id, m)?)?;
    m.add_function(wrap_pyfunction!(stat, m)?)?;
    m.add_function(wrap_pyfunction!(wait_evict, m)?)?;
    m.add_function(wrap_pyfunction!(get_dir, m)?)?;
    m.add_function(wrap_pyfunction!(read_dir_fd, m)?)?;
    m.add_function(wrap_pyfunction!(dir_watch_fd, m)?)?;
    m.add_function(wrap_pyfunction!(read_watch_fd, m)?)?;
    m.add_function(wrap_pyfunction!(dir_watch, m)?)?;
    m.add_function(wrap_pyfunction!(create, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(get_file, m)?)?;
    m.add_function(wrap_pyfunction!(put_file, m)?)?;
    m.add_function(wrap_pyfunction!(remove, m)?)?;
    m.add_function(wrap_pyfunction!(rename, m)?)?;
    m.add_function(wrap_pyfunction!(create_fd, m)?)?;
    m.add_function(wrap_pyfunction!(open_fd, m)?)?;
    m.add_function(wrap_pyfunction!(read_fd, m)?)?;
    m.add_function(wrap_pyfunction!(pread_fd, m)?)?;
    m.add_function(wrap_pyfunction!(readinto_fd, m)?)?;
    m.add_function(wrap_pyfunction!(write_fd, m)?)?;
    m.add_function(wrap_pyfunction!(seek_fd, m)?)?;
    m.add_function(wrap_pyfunction!(close_fd, m)?)?;
    m.add_function(wrap_pyfunction!(_serve_local, m)?)?;
    Ok(())
}
