//! What a run ends with when it fails: an error for the user and the exit status it maps to.
//! A leaf every step of a run may return.
#![forbid(unsafe_code)]

/// An error for the user plus the exit status it maps to (127 not found, 126 not executable,
/// 125 the supervisor itself failed — the conventions of env(1) and shells).
pub struct Failure {
    pub error: anyhow::Error,
    pub code: u8,
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure { error, code: 125 }
    }
}
