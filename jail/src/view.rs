//! The standard view a program gets: what a demanding user expects to just work, and nothing
//! of the host's secrets.
//!
//! - read-only: `/usr`, `/bin`, `/sbin`, `/lib*` (symlinks kept as symlinks), `/sys`, a curated
//!   `/etc` (an allow-list: no shadow, gshadow, sudoers, ssh keys, ...; `passwd`/`group`
//!   generated with the proc's own user; its small files copied, its directories bound), the
//!   program's prefix when it lives outside `/usr` (a venv and the interpreter it points to,
//!   pyenv; a script's `#!` interpreter; of `~/.local` only `bin`, `lib`, `lib64`), the
//!   directory of the first argument that names an existing file (the script);
//! - the working directory read-write (or read-only, or not at all: [`CwdMode`]);
//! - private `/tmp`, minimal `/dev`, fresh `/proc` — see [`crate::Plan`].
use crate::spec::{Bind, GeneratedFile, JailSpec};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// How the working directory appears in the jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CwdMode {
    /// [`CwdMode::Withheld`] where [`cwd_withheld`] says it is not a place to show (a home, a
    /// shared temporary directory, a system directory), else [`CwdMode::Rw`].
    #[default]
    Auto,
    Rw,
    Ro,
    None,
    /// Not shown, but the proc starts at the same path, in an empty read-only directory that
    /// holds only the files the command line names there (the decision of [`CwdMode::Auto`],
    /// for a caller that has made it already).
    Withheld,
}

/// Why the working directory `cwd` is not shown by default, or `None` when it is: a directory
/// that holds more than the user's project (`~` with its keys and dotfiles, `/tmp` with every
/// user's files) or, for a supervisor started by root, the system itself (`/etc`, `/usr`,
/// `/var`, ...): root's working directory is idmapped, so root's files in it would be the
/// proc's own to rewrite. An ordinary user's proc has no more rights there than the user (a
/// service's workspace under `/var/lib` stays shown).
pub fn cwd_withheld(cwd: &Path) -> Option<&'static str> {
    if cwd == Path::new("/") {
        // The proc starts at its own root: nothing of the host's is there to withhold.
        None
    } else if shared_tmp(cwd) {
        Some("a temporary directory every user shares")
    } else if home_like(cwd) {
        Some("a home directory or a directory of homes")
    } else if nix::unistd::geteuid().is_root()
        && (is_system_path(cwd)
            || (SYSTEM_TREES.iter().any(|d| cwd.starts_with(d)) && !under_shared_tmp(cwd)))
    {
        Some("a system directory")
    } else {
        None
    }
}

/// Host trees of the system's own state and configuration: a file named on the command line
/// there shows nothing more, and a working directory there is not shown (except in a shared
/// temporary directory among them, `/var/tmp/...`).
const SYSTEM_TREES: &[&str] = &["/etc", "/boot", "/dev", "/proc", "/run", "/sys", "/var"];

/// A directory every user may create files in (sticky and world-writable: `/tmp`,
/// `/var/tmp`, `/dev/shm`).
fn shared_tmp(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o1002 == 0o1002)
}

/// Inside (not at) a shared temporary directory: a user's own directory there.
fn under_shared_tmp(p: &Path) -> bool {
    p.ancestors().skip(1).any(shared_tmp)
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

/// Whether `p` is the user's home: `$HOME`, or the home the password database gives the real
/// user (where `$HOME` was pointed elsewhere).
fn is_home(p: &Path) -> bool {
    static PASSWD_HOME: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    std::env::var_os("HOME").is_some_and(|h| Path::new(&h) == p)
        || PASSWD_HOME
            .get_or_init(|| {
                let user = nix::unistd::User::from_uid(nix::unistd::getuid());
                user.ok().flatten().map(|u| u.dir)
            })
            .as_deref()
            == Some(p)
}

/// A directory too broad to show whole: [`home_like`], or a temporary directory every user
/// shares.
fn too_broad(p: &Path) -> bool {
    home_like(p) || shared_tmp(p)
}

/// `/`, a home directory, `/home`, `/root`.
fn home_like(p: &Path) -> bool {
    p == Path::new("/")
        || p == Path::new("/home")
        || p == Path::new("/root")
        || p.parent() == Some(Path::new("/home"))
        || is_home(p)
}

/// The terminal device on the supervisor's stdin, stdout or stderr (the proc inherits them).
fn inherited_terminal() -> Option<PathBuf> {
    use std::io::IsTerminal as _;
    use std::os::unix::fs::FileTypeExt as _;
    let fd = if std::io::stdin().is_terminal() {
        0
    } else if std::io::stdout().is_terminal() {
        1
    } else if std::io::stderr().is_terminal() {
        2
    } else {
        return None;
    };
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let m = std::fs::metadata(&path).ok()?;
    m.file_type().is_char_device().then_some(path)
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
        // The terminal the proc inherits, where bwrap shows it too: its device at
        // /dev/console, so ttyname(3) (`tty`, `os.ttyname`) finds it in the jail's /dev (whose
        // devpts is an instance of its own). The proc holds it open already; the guard keeps
        // TIOCSTI away from it.
        if let Some(tty) = inherited_terminal() {
            s.binds.push(Bind::ro(tty).at("/dev/console"));
            s.dev_tty = true;
        }
        // The working directory first: what it shows read-write (a venv, the script) is not
        // shown again read-only below.
        let mode = match self.cwd_mode {
            CwdMode::Auto if cwd_withheld(&self.cwd).is_some() => CwdMode::Withheld,
            CwdMode::Auto => CwdMode::Rw,
            mode => mode,
        };
        match mode {
            CwdMode::None | CwdMode::Auto => {}
            CwdMode::Withheld => {
                // Not shown, but the proc starts where the user is: in the system view's
                // directory of that name (`/usr/lib`, `/etc`, the private `/tmp`), else in an
                // empty read-only directory at that path, holding what the command line named
                // in it; where the jail's own trees (`/etc`, `/dev`, `/proc`) have nothing of
                // that name, at `/`.
                let c = &self.cwd;
                let own = ["/etc", "/dev", "/proc", "/tmp"];
                let at_own = own.iter().any(|d| c == Path::new(d));
                if SYSTEM_DIRS.iter().any(|d| c.starts_with(d)) || at_own {
                    s.workdir = Some(c.clone());
                } else if c != Path::new("/") && !own.iter().any(|d| c.starts_with(d)) {
                    s.dirs.push(c.clone());
                    s.workdir = Some(c.clone());
                }
            }
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
        // The program and what it really is (a venv's python is a symlink to an interpreter
        // elsewhere; a pyenv shim runs the version under the same root).
        let mut progs = vec![self.program.clone()];
        if let Ok(real) = std::fs::canonicalize(&self.program) {
            progs.push(real);
        }
        if let Some(abs) = absolute(&self.program, &self.cwd) {
            // A script's interpreter is what the kernel runs (a venv's console script names
            // the venv's python, itself a symlink to an interpreter elsewhere): shown as the
            // program.
            let interp = interpreter_of(&abs);
            progs.push(abs);
            if let Some(interp) = interp {
                if let Ok(real) = std::fs::canonicalize(&interp) {
                    progs.push(real);
                }
                progs.push(interp);
            }
        }
        for p in progs {
            // A relative name (`./tool`) counts in its absolute form, pushed above.
            if !p.is_absolute() || in_system(&p) {
                continue;
            }
            match prefix_of(&p) {
                Some(prefix) => push_prefix(&mut s, prefix),
                // In a directory too broad to show: the program alone.
                None if p.is_file() => push_ro(&mut s, p),
                None => {}
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
                let named = notify::path::join_normalized(&self.cwd, Path::new(a));
                let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
                let system =
                    SYSTEM_TREES.iter().any(|d| abs.starts_with(d)) && !under_shared_tmp(&abs);
                if abs.is_file() && !system && !in_system(&abs) {
                    match abs.parent() {
                        Some(dir) if !too_broad(dir) => push_ro(&mut s, dir.to_path_buf()),
                        _ => push_ro(&mut s, abs.clone()),
                    }
                    // Named through a symlinked directory: that link too, where it lies
                    // outside what the jail shows already.
                    if named != abs {
                        push_link(&mut s, &named);
                    }
                }
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

/// The interpreter a script's `#!` line names, one level deep as the kernel reads it; for
/// `/usr/bin/env NAME` (options skipped), NAME as found on PATH. `None` for a binary, or an
/// interpreter that is not an absolute path to an executable file (a `#!` line planted to
/// name a host file shows nothing the kernel would not run).
fn interpreter_of(script: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    use std::os::unix::ffi::OsStrExt as _;
    // The kernel reads at most this much of the line (BINPRM_BUF_SIZE).
    let mut head = [0u8; 256];
    let mut f = std::fs::File::open(script).ok()?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let line = head[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&c| c == b'\n').unwrap_or(line.len())];
    let mut words = line
        .split(|c| c.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let interp = Path::new(std::ffi::OsStr::from_bytes(words.next()?));
    if !interp.is_absolute() {
        return None;
    }
    let found = if interp.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.starts_with(b"-") && !w.contains(&b'='))?;
        let name = std::ffi::OsStr::from_bytes(name);
        if name.as_bytes().contains(&b'/') {
            PathBuf::from(name)
        } else {
            find_on_path(name)?
        }
    } else {
        interp.to_path_buf()
    };
    // Only what the kernel could run.
    (found.is_absolute() && executable(&found)).then_some(found)
}

/// The first executable file named `name` on PATH (`/usr/bin:/bin` without one; an empty
/// entry is the working directory), as a shell or env(1) finds a program.
pub fn find_on_path(name: &std::ffi::OsStr) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".").join(name)
            } else {
                d.join(name)
            }
        })
        .find(|c| executable(c))
}

/// A file this process may execute.
fn executable(p: &Path) -> bool {
    p.is_file() && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
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

/// Paths the command line names (an argument, or an option's value after `=`) that exist on
/// the host where the jail shows nothing at that name: a program's input named on its command
/// line is not shown by being named (the command line may come from whoever spawns procs), and
/// a failed run says which `--bind` would show it. `shown`: where the jail's binds show a host
/// path at its own name. At most `max`, in order.
pub fn unshown_named(args: &[OsString], cwd: &Path, shown: &[PathBuf], max: usize) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = Vec::new();
    for a in args.iter().skip(1) {
        if out.len() == max {
            break;
        }
        let b = a.as_bytes();
        let named = if b.starts_with(b"-") {
            match b.iter().position(|&c| c == b'=') {
                Some(eq) => std::ffi::OsStr::from_bytes(&b[eq + 1..]),
                None => continue,
            }
        } else {
            a.as_os_str()
        };
        if named.is_empty() {
            continue;
        }
        // Lexically: `.` and `..` resolved, symlinks not followed.
        let p = notify::path::join_normalized(cwd, Path::new(named));
        if std::fs::symlink_metadata(&p).is_ok()
            && !shown.iter().any(|d| p.starts_with(d))
            && !out.contains(&p)
        {
            out.push(p);
        }
    }
    out
}

/// Show a program's install prefix read-only. A user's `~/.local` is also where programs
/// keep their data and state (`share/`, `state/`: keyrings, histories): of it only what an
/// install puts there (`bin`, `lib`, `lib64`) is shown.
fn push_prefix(s: &mut JailSpec, prefix: PathBuf) {
    let user_local =
        prefix.file_name().is_some_and(|n| n == ".local") && prefix.parent().is_some_and(home_like);
    if !user_local {
        return push_ro(s, prefix);
    }
    for d in ["bin", "lib", "lib64"] {
        let p = prefix.join(d);
        if p.is_dir() {
            push_ro(s, p);
        }
    }
}

/// Add a read-only bind unless an existing bind already shows it. Idmapped: what the command
/// line names is the user's, and a root supervisor's proc reads it as root would (as it does
/// its working directory; an ordinary user's proc runs as that user already).
fn push_ro(s: &mut JailSpec, p: PathBuf) {
    if s.binds
        .iter()
        .any(|b| p.starts_with(&b.src) && b.src == b.dst)
    {
        return;
    }
    s.binds.push(Bind::ro(p).idmapped());
}

/// The first symlink on the way to `named` (a path as the command line spells it, `.` and
/// `..` resolved), as a symlink in the jail: `/tmp/link/h.py`, with `/tmp/link` a link to the
/// shown `/tmp/tmp.X`, opens there as it does bare. Only a link whose own directory holds no
/// link (the jail makes its parents as directories), outside the system's trees and what a
/// bind shows (there it is the host's own).
fn push_link(s: &mut JailSpec, named: &Path) {
    let mut at = PathBuf::from("/");
    for c in named
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .skip(1)
    {
        at.push(c);
        let Ok(m) = std::fs::symlink_metadata(&at) else {
            return;
        };
        if !m.file_type().is_symlink() {
            continue;
        }
        let system = SYSTEM_TREES.iter().any(|d| at.starts_with(d)) && !under_shared_tmp(&at);
        if system || in_system(&at) || s.binds.iter().any(|b| at.starts_with(&b.dst)) {
            return;
        }
        if let Ok(target) = std::fs::read_link(&at) {
            if !s.symlinks.iter().any(|(p, _)| *p == at) {
                s.symlinks.push((at, target));
            }
        }
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scripts_interpreter_is_read_from_its_first_line() {
        let d = tempfile::tempdir().unwrap();
        let f = |name: &str, text: &[u8]| {
            let p = d.path().join(name);
            std::fs::write(&p, text).unwrap();
            interpreter_of(&p)
        };
        assert_eq!(f("named", b"#!/bin/sh -e\necho\n"), Some("/bin/sh".into()));
        assert_eq!(f("spaced", b"#!  /bin/sh\n"), Some("/bin/sh".into()));
        // Found on PATH through env, its options and assignments skipped.
        let sh = find_on_path("sh".as_ref()).unwrap();
        assert_eq!(f("env", b"#!/usr/bin/env -S A=1 sh -x\n"), Some(sh));
        assert_eq!(
            f("env-path", b"#!/usr/bin/env /bin/sh\n"),
            Some("/bin/sh".into())
        );
        // Not an interpreter to show: a binary, a relative name, a missing file, a line
        // past what the kernel reads, nothing after env.
        assert_eq!(f("binary", b"\x7fELF\x02\x01"), None);
        assert_eq!(f("relative", b"#!sh\n"), None);
        assert_eq!(f("missing", b"#!/nonexistent/bin/tool\n"), None);
        let mut long = b"#!".to_vec();
        long.extend(std::iter::repeat_n(b'/', 300));
        long.extend(b"bin/sh\n");
        assert_eq!(f("long", &long), None);
        assert_eq!(f("bare-env", b"#!/usr/bin/env\n"), None);
        let plain = d.path().join("plain");
        std::fs::write(&plain, b"not a program").unwrap();
        let line = format!("#!{}\n", plain.display());
        assert_eq!(f("not-executable", line.as_bytes()), None);
    }

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
        let v = run_of("/usr/bin/true", "/", CwdMode::Rw);
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

    #[test]
    fn a_home_a_shared_tmp_or_a_system_directory_is_not_shown_as_the_cwd() {
        // `/` is never shown (the proc has a root of its own), and nothing is said about it.
        assert_eq!(cwd_withheld(Path::new("/")), None);
        for d in ["/root", "/home", "/home/alice", "/tmp"] {
            assert!(cwd_withheld(Path::new(d)).is_some(), "{d}");
        }
        // System directories: for root (whose working directory is idmapped) only.
        let root = nix::unistd::geteuid().is_root();
        for d in ["/etc", "/usr/lib", "/var/lib"] {
            assert_eq!(cwd_withheld(Path::new(d)).is_some(), root, "{d}");
        }
        let project = tempfile_dir("withheld");
        assert_eq!(cwd_withheld(&project), None);
        let view = |cwd: &Path, mode| run_of("/usr/bin/true", cwd, mode);
        // By default the home is an empty directory the proc starts in, not a bind.
        let s = view(Path::new("/root"), CwdMode::Auto).spec();
        assert!(
            !s.binds.iter().any(|b| b.dst == Path::new("/root")),
            "{s:?}"
        );
        assert_eq!(s.dirs, [PathBuf::from("/root")]);
        assert_eq!(s.workdir.as_deref(), Some(Path::new("/root")));
        // Root's run in the system view's own directory: no new one, nothing writable.
        if root {
            let s = view(Path::new("/usr/lib"), CwdMode::Auto).spec();
            assert!(s.dirs.is_empty() && !s.binds.iter().any(|b| b.rw), "{s:?}");
            assert_eq!(s.workdir.as_deref(), Some(Path::new("/usr/lib")));
        }
        // Asked for, it is shown; a project directory is shown by default.
        let s = view(Path::new("/root"), CwdMode::Rw).spec();
        assert!(s.binds.iter().any(|b| b.dst == Path::new("/root") && b.rw));
        let s = view(&project, CwdMode::Auto).spec();
        assert!(s.binds.iter().any(|b| b.dst == project && b.rw), "{s:?}");
        std::fs::remove_dir_all(&project).unwrap();
    }

    #[test]
    fn a_venv_inside_the_working_directory_stays_as_writable_as_the_directory() {
        let dir = tempfile_dir("venv");
        std::fs::create_dir_all(dir.join("v/bin")).unwrap();
        std::fs::write(dir.join("v/bin/python"), b"").unwrap();
        let view = |mode| run_of(dir.join("v/bin/python"), &dir, mode);
        let shown = |s: &JailSpec| -> Vec<(PathBuf, bool)> {
            s.binds
                .iter()
                .filter(|b| b.dst.starts_with(&dir))
                .map(|b| (b.dst.clone(), b.rw))
                .collect()
        };
        let rw = view(CwdMode::Rw).spec();
        let none = view(CwdMode::None).spec();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(shown(&rw), [(dir.clone(), true)]);
        // Without the working directory the venv is still shown, read-only.
        assert_eq!(shown(&none), [(dir.join("v"), false)]);
    }

    #[test]
    fn a_program_in_a_directory_too_broad_to_show_is_shown_alone() {
        // A program straight in a shared temporary directory: the file, not the directory.
        let tmp = std::env::temp_dir();
        let prog = tmp.join(format!("view-prog-{}", std::process::id()));
        std::fs::write(&prog, b"").unwrap();
        let s = run_of(&prog, "/", CwdMode::None).spec();
        std::fs::remove_file(&prog).unwrap();
        if shared_tmp(&tmp) {
            assert!(s.binds.iter().any(|b| b.src == prog), "{:?}", s.binds);
            assert!(!s.binds.iter().any(|b| b.src == tmp), "{:?}", s.binds);
        }
    }

    #[test]
    fn a_failed_runs_hint_names_what_its_command_line_names_and_the_jail_does_not_show() {
        let data = tempfile_dir("unshown");
        let project = tempfile_dir("unshown-project");
        std::fs::write(data.join("in.csv"), b"").unwrap();
        std::fs::write(project.join("local.csv"), b"").unwrap();
        let mut opt = std::ffi::OsString::from("--in=");
        opt.push(data.join("in.csv"));
        let args: Vec<std::ffi::OsString> = vec![
            "python3".into(),
            "job.py".into(),
            opt,
            data.join("x/../in.csv").into(),
            "local.csv".into(),
            "/no/such/path/here".into(),
            "-v".into(),
            data.clone().into(),
        ];
        let shown = [project.clone(), PathBuf::from("/usr")];
        let all = unshown_named(&args, &project, &shown, 8);
        let first = unshown_named(&args, &project, &shown, 1);
        std::fs::remove_dir_all(&data).unwrap();
        std::fs::remove_dir_all(&project).unwrap();
        // Once each (`x/..` taken lexically); not what is shown, absent, or an option alone.
        assert_eq!(all, [data.join("in.csv"), data.clone()]);
        assert_eq!(first, [data.join("in.csv")]);
    }

    /// The view of `program` (with no arguments) run from `cwd`, as uid/gid 1000.
    fn run_of(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>, mode: CwdMode) -> ViewOptions {
        let program = program.into();
        ViewOptions {
            args: vec![program.clone().into()],
            program,
            cwd: cwd.into(),
            cwd_mode: mode,
            uid: 1000,
            gid: 1000,
        }
    }

    fn tempfile_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("view-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_program_named_relative_to_the_cwd_shows_its_absolute_prefix() {
        let dir = tempfile_dir("rel");
        std::fs::create_dir_all(dir.join("tools")).unwrap();
        std::fs::write(dir.join("tools/run"), b"").unwrap();
        let s = run_of("./tools/run", &dir, CwdMode::None).spec();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(s.binds.iter().all(|b| b.src.is_absolute()), "{:?}", s.binds);
        assert!(
            s.binds.iter().any(|b| b.src == dir.join("tools")),
            "{:?}",
            s.binds
        );
    }

    #[test]
    fn a_script_through_a_symlinked_directory_shows_the_link_and_its_directory_idmapped() {
        let dir = tempfile_dir("link");
        let real = dir.join("real");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("h.py"), b"print(1)").unwrap();
        std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
        let mut v = run_of("/usr/bin/python3", "/", CwdMode::None);
        v.args.push(dir.join("link/h.py").into());
        let s = v.spec();
        std::fs::remove_dir_all(&dir).unwrap();
        let shown = s
            .binds
            .iter()
            .find(|b| b.src == real)
            .expect("the script's directory");
        assert!(shown.idmap && !shown.rw, "{shown:?}");
        assert_eq!(s.symlinks.last(), Some(&(dir.join("link"), real.clone())));
    }
}
