//! The standard view a program gets: what a demanding user expects to just work, and nothing
//! of the host's secrets.
//!
//! - read-only: `/usr`, `/bin`, `/sbin`, `/lib*` (symlinks kept as symlinks), `/sys`, a curated
//!   `/etc` (an allow-list: no shadow, gshadow, sudoers, ssh keys, ...; `passwd`/`group`
//!   generated with the proc's own user; its small files copied, its directories bound), the
//!   program's prefix when it lives outside `/usr`
//!   (a venv and the interpreter it points to, pyenv), the directory of each argument that names
//!   an existing file (the script);
//! - the working directory read-write (or read-only, or not at all: [`CwdMode`]);
//! - private `/tmp`, minimal `/dev`, fresh `/proc` — see [`crate::plan`].
use crate::{Bind, GeneratedFile, JailSpec};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// How the working directory appears in the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CwdMode {
    #[default]
    Rw,
    Ro,
    None,
}

/// What the CLI knows about the run.
#[derive(Debug, Clone)]
pub struct ViewOptions {
    /// The program as resolved on PATH (possibly a symlink, e.g. a venv's python).
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    pub cwd_mode: CwdMode,
    pub uid: u32,
    pub gid: u32,
}

/// Top-level /etc entries a program may need; everything else in /etc stays outside.
const ETC_ALLOW: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "fonts",
    "gai.conf",
    "host.conf",
    "hosts",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "locale.gen",
    "localtime",
    "login.defs",
    "lsb-release",
    "magic",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "protocols",
    "pki",
    "python3",
    "python3.11",
    "resolv.conf",
    "rpc",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
    "xdg",
];

/// Host directories every jail shows read-only when they exist.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/sys",
];

/// Whether jail path `p` lies in the standard read-only system view: the system dirs above or
/// the curated `/etc`.
pub fn is_system_path(p: &Path) -> bool {
    p.starts_with("/etc") || SYSTEM_DIRS.iter().any(|d| p.starts_with(d))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// A directory too broad to show whole: `/`, a home directory, `/home`, `/root`.
fn too_broad(p: &Path) -> bool {
    p == Path::new("/")
        || p == Path::new("/home")
        || p == Path::new("/root")
        || p.parent() == Some(Path::new("/home"))
        || home().as_deref() == Some(p)
}

/// Whether `p` is already visible through the system dirs.
fn in_system(p: &Path) -> bool {
    SYSTEM_DIRS
        .iter()
        .filter(|d| **d != "/sys")
        .any(|d| p.starts_with(d))
}

/// The install prefix of a program at `p` (`PREFIX/bin/prog` → `PREFIX`), else its directory.
fn prefix_of(p: &Path) -> Option<PathBuf> {
    let dir = p.parent()?;
    let prefix = if dir.file_name().is_some_and(|n| n == "bin" || n == "shims") {
        dir.parent()?
    } else {
        dir
    };
    if too_broad(prefix) {
        if too_broad(dir) {
            return None;
        }
        return Some(dir.to_path_buf());
    }
    Some(prefix.to_path_buf())
}

impl ViewOptions {
    /// The standard jail for this run.
    pub fn spec(&self) -> JailSpec {
        let mut s = JailSpec::new(self.uid, self.gid);
        for d in SYSTEM_DIRS {
            let p = Path::new(d);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(t) = std::fs::read_link(p) {
                        s.symlinks.push((p.to_path_buf(), t));
                    }
                }
                Ok(_) => s.binds.push(Bind::ro(p).optional()),
                Err(_) => {}
            }
        }
        self.etc(&mut s);
        // The program and what it really is (a venv's python is a symlink to an interpreter
        // elsewhere; a pyenv shim runs the version under the same root).
        let mut progs = vec![self.program.clone()];
        if let Ok(real) = std::fs::canonicalize(&self.program) {
            progs.push(real);
        }
        if let Some(abs) = absolute(&self.program, &self.cwd) {
            progs.push(abs);
        }
        for p in progs {
            if in_system(&p) {
                continue;
            }
            if let Some(prefix) = prefix_of(&p) {
                push_ro(&mut s, prefix);
            }
        }
        // The script: the first argument that is not an option, if it names a file outside the
        // system's own trees; its directory is shown read-only (only the file itself when the
        // directory is too broad to show).
        if let Some(a) = self
            .args
            .iter()
            .skip(1)
            .find(|a| !a.as_encoded_bytes().starts_with(b"-"))
        {
            if let Some(abs) = absolute(Path::new(a), &self.cwd) {
                let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
                let system = ["/etc", "/proc", "/sys", "/dev", "/boot", "/run", "/var"]
                    .iter()
                    .any(|d| abs.starts_with(d));
                if abs.is_file() && !system && !in_system(&abs) {
                    match abs.parent() {
                        Some(dir) if !too_broad(dir) => push_ro(&mut s, dir.to_path_buf()),
                        _ => push_ro(&mut s, abs.clone()),
                    }
                }
            }
        }
        match self.cwd_mode {
            CwdMode::None => {}
            _ if self.cwd == Path::new("/") => {}
            mode => {
                let b = Bind::ro(&self.cwd).idmapped();
                s.binds.push(if mode == CwdMode::Rw {
                    Bind { rw: true, ..b }
                } else {
                    b
                });
                s.workdir = Some(self.cwd.clone());
            }
        }
        s
    }

    fn etc(&self, s: &mut JailSpec) {
        // Optional: entries this host lacks are skipped when the plan is made. Its small files
        // are copied into the root rather than bound (see `Bind::copy`).
        for e in ETC_ALLOW {
            s.binds
                .push(Bind::ro(Path::new("/etc").join(e)).optional().copyable());
        }
        let name = if self.uid == 0 { "root" } else { "sigma" };
        let home = if self.uid == 0 { "/root" } else { "/tmp" };
        let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
        if self.uid != 0 {
            passwd.push_str(&format!(
                "{name}:x:{}:{}:σOS proc:{home}:/bin/sh\n",
                self.uid, self.gid
            ));
        }
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        let mut group = String::from("root:x:0:\n");
        if self.gid != 0 {
            group.push_str(&format!("{name}:x:{}:\n", self.gid));
        }
        group.push_str("nogroup:x:65534:\n");
        s.files.push(GeneratedFile {
            dst: "/etc/passwd".into(),
            contents: passwd.into_bytes(),
        });
        s.files.push(GeneratedFile {
            dst: "/etc/group".into(),
            contents: group.into_bytes(),
        });
        s.files.push(GeneratedFile {
            dst: "/etc/hostname".into(),
            contents: b"sigma\n".to_vec(),
        });
    }
}

fn absolute(p: &Path, cwd: &Path) -> Option<PathBuf> {
    if p.as_os_str().is_empty() {
        return None;
    }
    Some(if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    })
}

/// Add a read-only bind unless an existing bind already shows it.
fn push_ro(s: &mut JailSpec, p: PathBuf) {
    if s.binds
        .iter()
        .any(|b| p.starts_with(&b.src) && b.src == b.dst)
    {
        return;
    }
    s.binds.push(Bind::ro(p));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_and_root_are_never_shown_whole() {
        assert!(too_broad(Path::new("/")));
        assert!(too_broad(Path::new("/root")));
        assert!(too_broad(Path::new("/home/alice")));
        assert_eq!(
            prefix_of(Path::new("/root/bin/tool")),
            Some(PathBuf::from("/root/bin"))
        );
        assert_eq!(
            prefix_of(Path::new("/root/.pyenv/shims/python3")),
            Some(PathBuf::from("/root/.pyenv"))
        );
        assert_eq!(
            prefix_of(Path::new("/opt/py/bin/python3")),
            Some(PathBuf::from("/opt/py"))
        );
    }

    #[test]
    fn etc_is_an_allow_list_without_secrets() {
        let v = ViewOptions {
            program: "/usr/bin/true".into(),
            args: vec!["true".into()],
            cwd: "/".into(),
            cwd_mode: CwdMode::Rw,
            uid: 1000,
            gid: 1000,
        };
        let s = v.spec();
        for secret in ["shadow", "gshadow", "sudoers", "ssh", "ssl/private"] {
            let p = Path::new("/etc").join(secret);
            assert!(!s.binds.iter().any(|b| b.src.starts_with(&p)), "{secret}");
        }
        let passwd = s
            .files
            .iter()
            .find(|f| f.dst == Path::new("/etc/passwd"))
            .unwrap();
        assert!(String::from_utf8_lossy(&passwd.contents).contains(":1000:1000:"));
        // cwd `/` is never bound.
        assert!(s.workdir.is_none());
        // A system file named on the command line shows nothing more.
        let v = ViewOptions {
            args: vec!["cat".into(), "/etc/shadow".into()],
            ..v
        };
        assert!(!v.spec().binds.iter().any(|b| b.src == Path::new("/etc")));
    }
}
