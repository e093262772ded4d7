//! The embedded realm server, started in-process for tests and benchmarks.

use std::path::Path;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use spproxy::server::{Listener, LocalDirStore, Server, ServerConfig, ServerError};

/// A running embedded realm server (`_serve_local`). It serves on background threads until
/// `shutdown()` or the end of the process.
#[pyclass(frozen, module = "pysigma._pysigma", name = "_LocalServer")]
pub(crate) struct LocalServer {
    server: Server,
    listener: Mutex<Option<Listener>>,
    socket: String,
}

impl LocalServer {
    /// Serves a realm on `socket`: `name/ux/~local/` is `scratch`, `name/s3/~local/` is `s3`.
    /// Returns once the socket accepts connections.
    pub(crate) fn start(socket: &str, scratch: &str, s3: &str) -> Result<Self, ServerError> {
        let store = std::sync::Arc::new(LocalDirStore::new(s3));
        let server = Server::new(ServerConfig::new("pysigma-local", scratch, store))?;
        // A scratch directory given explicitly must be usable from the start.
        if let Some(e) = server.scratch_error() {
            return Err(e);
        }
        let listener = server.bind(Path::new(socket))?;
        Ok(LocalServer {
            server,
            listener: Mutex::new(Some(listener)),
            socket: socket.to_owned(),
        })
    }
}

#[pymethods]
impl LocalServer {
    #[getter]
    fn socket(&self) -> &str {
        &self.socket
    }

    /// What the most recent proc (the last connection that called Init) reported, with the
    /// calls served on all connections: `{"started": bool, "exited": (status, msg) | None,
    /// "pid": str | None, "calls": int}`.
    fn proc_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let calls = self.server.proc_state().calls;
        let mut st = self.server.proc_states().pop().unwrap_or_default();
        st.calls = calls;
        let d = PyDict::new(py);
        d.set_item("started", st.started)?;
        d.set_item("exited", st.exited)?;
        d.set_item("pid", st.pid)?;
        d.set_item("calls", st.calls)?;
        Ok(d)
    }

    /// Evicts the realm's procs: every `wait_evict()` returns. Returns whether one was waiting.
    fn evict(&self) -> bool {
        self.server.evict()
    }

    /// Stops accepting connections and removes the socket; open connections keep running.
    fn shutdown(&self, py: Python<'_>) {
        let l = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(l) = l {
            py.detach(|| l.shutdown());
        }
    }
}
