//! The crate's one error type, a leaf every module may use.

/// Errors at the crate boundary. Each displays as one line.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The profile text is wrong: `<file>:<line>: <what is wrong>`.
    #[error("{file}:{line}: {message}")]
    Invalid {
        file: String,
        line: usize,
        message: String,
    },
    /// Neither a builtin name nor an existing file.
    #[error("profile `{name}` is neither a builtin ({builtins}) nor an existing file")]
    UnknownProfile { name: String, builtins: String },
    #[error("{file}: cannot read profile")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// A `--serve PREFIX=DIR` argument is wrong.
    #[error("--serve {arg}: {message}")]
    Serve { arg: String, message: String },
}
