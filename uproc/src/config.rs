//! `trampoline.toml`: the trampoline's settings. σOS's procd hands the trampoline an
//! environment of its own making (nothing of the host's reaches it), so everything the machine's
//! operator chooses comes from this file: beside the binary (`/proc/self/exe`'s directory, as
//! σOS installs `uproc-trampoline` in its `bin/kernel`), else
//! `/etc/sigma-supervise/trampoline.toml`, else the defaults.
#![forbid(unsafe_code)]

use anyhow::{anyhow, Context as _};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The file's name beside the binary.
pub const FILE_NAME: &str = "trampoline.toml";
/// The system-wide file, read when there is none beside the binary.
pub const SYSTEM_FILE: &str = "/etc/sigma-supervise/trampoline.toml";

/// The settings, every one optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The interpreter of Python procs: a name looked up on σOS's PATH, or an absolute path
    /// (a venv's python with pysigma installed).
    pub interpreter: String,
    /// The syscall profile a proc runs under (a builtin name or a TOML file).
    pub profile: String,
    /// The profile of a binary that procd starts without dialproxy (`false`): it dials σOS
    /// itself, over TCP, as σOS's own trampoline lets such a proc. A Python proc, whose only
    /// way to σOS is the relay, keeps `profile`.
    pub nodialproxy_profile: String,
    /// Where spproxyd listens: `spproxyd.sock` (the σOS API) and `spproxyd-dialproxy.sock`.
    pub spproxyd_dir: PathBuf,
    /// Relay the proc's σOS connection through the supervisor, which then sees Started and
    /// Exited (and fails a run that ends with status 0 but no Exited). `false` hands the proc
    /// spproxyd's socket itself.
    pub relay: bool,
    /// The trampoline's own cache (root's, mode 0700): procs' binaries, copied from binfs once
    /// per realm, name and binfs attributes and executed from there (`fetcher::programs`). None: each
    /// proc's binary is copied into memory before its jail starts.
    pub cache_dir: Option<PathBuf>,
    /// The realm's library bucket, for Python procs.
    pub realm: Option<Realm>,
}

/// A realm's libraries, fetched lazily as `--realm/--bucket/--cache-dir` do.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Realm {
    /// `file:///DIR` or `s3://BUCKET[/PREFIX]`.
    pub bucket: String,
    /// The realm cache's root (required: procd's environment has no HOME to default from).
    pub cache_dir: PathBuf,
    /// The realm's name [default: the proc's σOS realm, from SIGMACONFIG].
    pub name: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            interpreter: "python3".into(),
            profile: "sigmaos".into(),
            nodialproxy_profile: "sigmaos-nodialproxy".into(),
            spproxyd_dir: PathBuf::from("/tmp/spproxyd"),
            relay: true,
            cache_dir: None,
            realm: None,
        }
    }
}

impl Config {
    /// The configuration in effect: the first of the files that exists, else the defaults.
    /// A file that exists but cannot be read or parsed is an error (never the defaults).
    pub fn load() -> anyhow::Result<Config> {
        let beside = std::fs::read_link("/proc/self/exe")
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(FILE_NAME)));
        for path in beside
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new(SYSTEM_FILE)])
        {
            match std::fs::read_to_string(path) {
                Ok(text) => return Config::parse(&text, path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
        }
        Ok(Config::default())
    }

    /// Parses and checks the text of `path`.
    pub fn parse(text: &str, path: &Path) -> anyhow::Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| {
            // toml's message spans lines (a snippet of the file): its first line is the reason.
            let msg = e.message().lines().next().unwrap_or("malformed").to_owned();
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            anyhow!("{}: {msg}{at}", path.display())
        })?;
        c.check().map_err(|e| anyhow!("{}: {e}", path.display()))?;
        Ok(c)
    }

    fn check(&self) -> Result<(), String> {
        if self.interpreter.is_empty() {
            return Err("interpreter is empty".into());
        }
        if self.profile.is_empty() {
            return Err("profile is empty".into());
        }
        if self.nodialproxy_profile.is_empty() {
            return Err("nodialproxy_profile is empty".into());
        }
        if !self.spproxyd_dir.is_absolute() {
            return Err("spproxyd_dir must be an absolute path".into());
        }
        if self.cache_dir.as_deref().is_some_and(|d| !d.is_absolute()) {
            return Err("cache_dir must be an absolute path".into());
        }
        if let Some(r) = &self.realm {
            if !(r.bucket.starts_with("file:///") || r.bucket.starts_with("s3://")) {
                return Err(format!(
                    "realm.bucket {:?}: expected file:///DIR or s3://BUCKET",
                    r.bucket
                ));
            }
            if !r.cache_dir.is_absolute() {
                return Err("realm.cache_dir must be an absolute path".into());
            }
            if r.name.as_deref().is_some_and(str::is_empty) {
                return Err("realm.name is empty".into());
            }
        }
        Ok(())
    }

    /// spproxyd's σOS API socket.
    pub fn spproxyd_socket(&self) -> PathBuf {
        self.spproxyd_dir.join("spproxyd.sock")
    }

    /// spproxyd's dialproxy socket.
    pub fn dialproxy_socket(&self) -> PathBuf {
        self.spproxyd_dir.join("spproxyd-dialproxy.sock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> anyhow::Result<Config> {
        Config::parse(t, Path::new("/etc/t.toml"))
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
        assert_eq!(Config::default().interpreter, "python3");
        assert_eq!(
            Config::default().dialproxy_socket(),
            Path::new("/tmp/spproxyd/spproxyd-dialproxy.sock")
        );
    }

    #[test]
    fn every_setting_parses() {
        let c = parse(
            r#"
interpreter = "/opt/venv/bin/python"
profile = "sigmaos-strict"
nodialproxy_profile = "/etc/p.toml"
spproxyd_dir = "/run/spp"
relay = false
cache_dir = "/var/cache/sigma-supervise"
[realm]
bucket = "s3://libs"
cache_dir = "/var/cache/sigma"
name = "r1"
"#,
        )
        .unwrap();
        assert_eq!(c.interpreter, "/opt/venv/bin/python");
        assert_eq!(c.nodialproxy_profile, "/etc/p.toml");
        assert!(!c.relay);
        assert_eq!(
            c.cache_dir.as_deref(),
            Some(Path::new("/var/cache/sigma-supervise"))
        );
        assert_eq!(c.spproxyd_socket(), Path::new("/run/spp/spproxyd.sock"));
        let r = c.realm.unwrap();
        assert_eq!(
            (r.bucket.as_str(), r.name.as_deref()),
            ("s3://libs", Some("r1"))
        );
    }

    #[test]
    fn mistakes_are_one_line_errors_naming_the_file() {
        for (text, want) in [
            ("interpreterr = \"x\"", "unknown field"),
            ("relay = 3", "invalid type"),
            ("interpreter = ", "line 1"),
            ("spproxyd_dir = \"rel\"", "absolute"),
            ("cache_dir = \"c\"", "absolute"),
            (
                "[realm]\nbucket = \"http://x\"\ncache_dir = \"/c\"",
                "file:///DIR",
            ),
            ("[realm]\nbucket = \"s3://b\"", "cache_dir"),
            ("interpreter = \"\"", "empty"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with("/etc/t.toml: "), "{text}: {e}");
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "{text}: {e}");
        }
    }
}
