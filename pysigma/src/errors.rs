//! σOS errors as Python exceptions that subclass the matching built-ins.
//!
//! `SigmaError(OSError)` is the base and carries `.code` (the serr number), `.name` (its σOS
//! name), `.obj` and `.msg`. Subclasses also derive from the built-in a Python program already
//! catches: `SigmaNotFoundError(SigmaError, FileNotFoundError)` and so on. Transport failures are
//! plain `ConnectionError`s (the socket's own errno when there is one).

use std::io;

use pyo3::exceptions::{
    PyConnectionError, PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError,
    PyNotADirectoryError, PyOSError, PyPermissionError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Runs `f` with the GIL released and turns a σOS error into the matching exception.
pub(crate) fn call<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, spproxy::Error> + Send,
{
    py.detach(f).map_err(|e| to_pyerr(py, e))
}

/// One exception class made at import: its name, σOS codes, bases after SigmaError, and errno.
struct Kind {
    class: &'static str,
    codes: &'static [u32],
    builtin: fn(Python<'_>) -> Bound<'_, PyType>,
    errno: i32,
    doc: &'static str,
}

use spproxy::consts as c;

const KINDS: &[Kind] = &[
    Kind {
        class: "SigmaNotFoundError",
        codes: &[c::ECODE_NOTFOUND],
        builtin: |py| py.get_type::<PyFileNotFoundError>(),
        errno: libc::ENOENT,
        doc: "σOS Notfound: no object at that path.",
    },
    Kind {
        class: "SigmaPermissionError",
        codes: &[c::ECODE_PERM],
        builtin: |py| py.get_type::<PyPermissionError>(),
        errno: libc::EACCES,
        doc: "σOS Perm: the principal may not do that.",
    },
    Kind {
        class: "SigmaExistsError",
        codes: &[c::ECODE_EXISTS],
        builtin: |py| py.get_type::<PyFileExistsError>(),
        errno: libc::EEXIST,
        doc: "σOS Exists: the path is already taken.",
    },
    Kind {
        class: "SigmaIsADirectoryError",
        codes: &[c::ECODE_ISDIR],
        builtin: |py| py.get_type::<PyIsADirectoryError>(),
        errno: libc::EISDIR,
        doc: "σOS Isdir: the object is a directory.",
    },
    Kind {
        class: "SigmaNotADirectoryError",
        codes: &[c::ECODE_NOTDIR, c::ECODE_WALKNODIR],
        builtin: |py| py.get_type::<PyNotADirectoryError>(),
        errno: libc::ENOTDIR,
        doc: "σOS NotDir / Walknodir: a path element is not a directory.",
    },
    Kind {
        class: "SigmaUnreachableError",
        codes: &[c::ECODE_UNREACHABLE, c::ECODE_IO],
        builtin: |py| py.get_type::<PyConnectionError>(),
        errno: libc::EHOSTUNREACH,
        doc: "σOS Unreachable / IO: the server holding the object could not be reached.",
    },
];

static BASE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
/// Per class: the σOS codes it stands for, the errno it carries, the class.
type ClassTable = Vec<(&'static [u32], i32, Py<PyType>)>;

static CLASSES: PyOnceLock<ClassTable> = PyOnceLock::new();

fn new_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: Bound<'py, PyTuple>,
    doc: &str,
) -> PyResult<Bound<'py, PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "pysigma")?;
    ns.set_item("__doc__", doc)?;
    let cls = py.get_type::<PyType>().call1((name, bases, ns))?;
    Ok(cls.cast_into::<PyType>()?)
}

/// Makes the exception classes and adds them to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = BASE.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let bases = PyTuple::new(py, [py.get_type::<PyOSError>()])?;
        Ok(new_class(
            py,
            "SigmaError",
            bases,
            "An error reported by σOS. `.code` is the serr number, `.name` its σOS name, \
             `.obj` the object it concerns and `.msg` the server's message.",
        )?
        .unbind())
    })?;
    m.add("SigmaError", base.bind(py))?;
    let classes = CLASSES.get_or_try_init(py, || -> PyResult<_> {
        let mut v = Vec::new();
        for k in KINDS {
            let bases = PyTuple::new(py, [base.bind(py).clone(), (k.builtin)(py)])?;
            let cls = new_class(py, k.class, bases, k.doc)?;
            v.push((k.codes, k.errno, cls.unbind()));
        }
        Ok(v)
    })?;
    for (k, (_, _, cls)) in KINDS.iter().zip(classes) {
        m.add(k.class, cls.bind(py))?;
    }
    Ok(())
}

/// errno for a σOS error that has no class of its own.
fn fallback_errno(code: u32) -> i32 {
    match code {
        c::ECODE_INVAL | c::ECODE_BADOFFSET | c::ECODE_BADCOUNT => libc::EINVAL,
        c::ECODE_NOTEMPTY => libc::ENOTEMPTY,
        c::ECODE_NOTSUPPORTED => libc::EOPNOTSUPP,
        c::ECODE_NOMEM => libc::ENOMEM,
        c::ECODE_CLOSED => libc::EBADF,
        c::ECODE_UNKNOWNFID => libc::EBADF,
        c::ECODE_RETRY => libc::EAGAIN,
        c::ECODE_STALE => libc::ESTALE,
        _ => libc::EIO,
    }
}

fn sigma_exception(py: Python<'_>, code: u32, name: &str, obj: &str, msg: &str) -> PyResult<PyErr> {
    let (errno, cls) = match CLASSES
        .get(py)
        .and_then(|v| v.iter().find(|(codes, _, _)| codes.contains(&code)))
    {
        Some((_, errno, cls)) => (*errno, cls.bind(py).clone()),
        None => (
            fallback_errno(code),
            BASE.get(py)
                .map(|b| b.bind(py).clone())
                .unwrap_or_else(|| py.get_type::<PyOSError>()),
        ),
    };
    let strerror = if msg.is_empty() {
        name.to_string()
    } else {
        format!("{name}: {msg}")
    };
    let exc = if obj.is_empty() {
        cls.call1((errno, strerror))?
    } else {
        cls.call1((errno, strerror, obj))?
    };
    exc.setattr("code", code)?;
    exc.setattr("name", name)?;
    exc.setattr("obj", obj)?;
    exc.setattr("msg", msg)?;
    Ok(PyErr::from_value(exc))
}

/// errno for a transport error, so `OSError(errno, ...)` picks the usual subclass
/// (`ConnectionResetError`, `BrokenPipeError`, `FileNotFoundError` for a missing socket, ...).
fn io_errno(e: &io::Error) -> Option<i32> {
    if let Some(n) = e.raw_os_error() {
        return Some(n);
    }
    Some(match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::ConnectionRefused => libc::ECONNREFUSED,
        // The server went away in the middle of a reply: the peer reset the conversation.
        io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof => libc::ECONNRESET,
        io::ErrorKind::ConnectionAborted => libc::ECONNABORTED,
        io::ErrorKind::NotConnected => libc::ENOTCONN,
        io::ErrorKind::BrokenPipe => libc::EPIPE,
        io::ErrorKind::TimedOut => libc::ETIMEDOUT,
        _ => return None,
    })
}

fn io_exception(e: &io::Error) -> PyErr {
    let text = e.to_string();
    match io_errno(e) {
        Some(errno) => PyOSError::new_err((errno, text)),
        None => PyConnectionError::new_err(text),
    }
}

pub(crate) fn to_pyerr(py: Python<'_>, e: spproxy::Error) -> PyErr {
    match e {
        spproxy::Error::Sigma {
            code,
            name,
            obj,
            msg,
        } => sigma_exception(py, code, name, &obj, &msg).unwrap_or_else(|err| err),
        spproxy::Error::Io(e) => io_exception(&e),
        spproxy::Error::Protocol(msg) => {
            PyConnectionError::new_err(format!("spproxy protocol error: {msg}"))
        }
        #[allow(unreachable_patterns)]
        other => PyConnectionError::new_err(format!("spproxy: {other}")),
    }
}
