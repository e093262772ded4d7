//! The embedded realm server, started in-process for tests and benchmarks.

use std::path::Path;
use std::sync::{Arc, Mutex};

use spproxy::server::{Listener, LocalDirStore, Server, ServerConfig, ServerError};

/// Listeners started by `_serve_local`; they serve until the process exits.
static LISTENERS: Mutex<Vec<Listener>> = Mutex::new(Vec::new());

/// Serves a realm on `socket`: `name/ux/~local/` is `scratch`, `name/s3/~local/` is `s3`.
/// Returns once the socket accepts connections; the server runs on background threads.
pub(crate) fn serve_local(socket: &str, scratch: &str, s3: &str) -> Result<(), ServerError> {
    let store = Arc::new(LocalDirStore::new(s3));
    let srv = Server::new(ServerConfig::new("pysigma-local", scratch, store))?;
    let listener = srv.bind(Path::new(socket))?;
    LISTENERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(listener);
    Ok(())
}
