//! σOS syscall profiles and path rules, kept as data files, validated on load and compiled into
//! a [`notify::FilterSpec`].
//!
//! - [`load`] picks a builtin profile by name (`sigmaos`, `sigmaos-nodialproxy`,
//!   `sigmaos-strict`, `permissive`) or reads a TOML file.
//! - [`Profile::filter_spec`] is what the supervisor compiles and installs in the child.
//! - [`Profile::notification_kind`] tells the supervisor whether a notification is a path decision
//!   ([`Profile::decide`]) or a default-denied call to answer with [`Profile::denied_errno`] and log.
//!
//! The file format is described in `policies/README.md`.
#![forbid(unsafe_code)]

/// The compiled-profile cache: an entry per profile text, program and options.
pub mod compiled;
pub mod errno;
mod error;
mod paths;
mod profile;

pub use error::PolicyError;
pub use paths::{PathAction, PathDecision, PathRule};
pub use profile::{
    parse_serve_arg, DefaultAction, Need, NotificationKind, Origin, Profile, SyscallAction,
    SyscallEntry,
};

use std::path::Path;

/// The profile used when none is given.
pub const DEFAULT_PROFILE: &str = "sigmaos";

/// Builtin profiles: (name, file name shown in errors, contents).
const BUILTINS: &[(&str, &str, &str)] = &[
    (
        "sigmaos",
        "policies/profiles/sigmaos.toml",
        include_str!("../profiles/sigmaos.toml"),
    ),
    (
        "sigmaos-nodialproxy",
        "policies/profiles/sigmaos-nodialproxy.toml",
        include_str!("../profiles/sigmaos-nodialproxy.toml"),
    ),
    (
        "sigmaos-strict",
        "policies/profiles/sigmaos-strict.toml",
        include_str!("../profiles/sigmaos-strict.toml"),
    ),
    (
        "permissive",
        "policies/profiles/permissive.toml",
        include_str!("../profiles/permissive.toml"),
    ),
];

/// Names of the builtin profiles.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|(n, _, _)| *n)
}

/// Load a profile: a builtin name wins, else `name_or_path` is read as a TOML file.
pub fn load(name_or_path: &str) -> Result<Profile, PolicyError> {
    source(name_or_path)?.parse()
}

/// A profile's text, before it is parsed: a builtin's (part of this program) or a file's.
#[derive(Debug, Clone)]
pub struct Source {
    /// The name shown in errors (`policies/profiles/NAME.toml` for a builtin, else the path).
    pub file: String,
    pub text: std::borrow::Cow<'static, str>,
    pub builtin: bool,
}

impl Source {
    pub fn parse(&self) -> Result<Profile, PolicyError> {
        Profile::parse(&self.text, &self.file)
    }
}

/// The text of profile `name_or_path`: a builtin name wins, else the file is read.
pub fn source(name_or_path: &str) -> Result<Source, PolicyError> {
    if let Some((_, file, text)) = BUILTINS.iter().find(|(n, _, _)| *n == name_or_path) {
        return Ok(Source {
            file: (*file).to_owned(),
            text: std::borrow::Cow::Borrowed(text),
            builtin: true,
        });
    }
    let path = Path::new(name_or_path);
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Source {
            file: name_or_path.to_owned(),
            text: std::borrow::Cow::Owned(text),
            builtin: false,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PolicyError::UnknownProfile {
            name: name_or_path.to_owned(),
            builtins: builtin_names().collect::<Vec<_>>().join(", "),
        }),
        Err(source) => Err(PolicyError::Read {
            file: name_or_path.to_owned(),
            source,
        }),
    }
}

/// A builtin profile by name, `None` if there is no such builtin.
pub fn builtin(name: &str) -> Option<Result<Profile, PolicyError>> {
    BUILTINS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, file, src)| Profile::parse(src, file))
}

#[cfg(test)]
mod tests;
