//! The interpreter the end-to-end tests run under the supervisor, and the supervisor command.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The real interpreter behind `python3`. On pyenv machines `python3` is a bash shim; the tests
/// measure and trace the interpreter itself, so they put its directory first on PATH.
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 must be installed for the end-to-end tests");
        assert!(out.status.success(), "python3 does not run");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `sigma-supervise` with the real interpreter's directory first on PATH, so `python3` resolves
/// through the supervisor's own PATH lookup; no RUST_LOG from the caller.
pub fn supervisor() -> Command {
    let dir = python().parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_sigma-supervise"));
    c.env("PATH", path).env_remove("RUST_LOG");
    c
}
