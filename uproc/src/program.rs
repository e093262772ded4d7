//! The proc's program, read from binfs by the trampoline's own pid (binfs serves a file only
//! to the pid procd started; any other pid that opens it blocks forever): a binary is found in
//! or copied into the trampoline's program cache ([`fetcher::programs`]), else copied into a
//! sealed memfd, and the jailed target execs it through its own `/proc/self/fd/N`; a script's
//! text is kept to be shown read-only at `/sigma/bin/NAME` in the jail. Nothing else ever
//! opens binfs, and only this thread (FUSE names the calling thread, not the process): the
//! trampoline reads it before any thread starts.
#![forbid(unsafe_code)]

use anyhow::{anyhow, bail, Context as _};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::ffi::OsString;
use std::fs::File;
use std::io::Read as _;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// Where a script is shown in the jail (read-only, in the jail's own root).
pub const SCRIPT_DIR: &str = "/sigma/bin";
/// Largest binary copied (binfs's programs are executables, not data sets).
const MAX_BINARY: u64 = 4 << 30;
/// Largest script kept in memory and written into the jail.
const MAX_SCRIPT: u64 = 16 << 20;
/// `MFD_EXEC` (Linux 6.3): executable whatever `vm.memfd_noexec` says; older kernels refuse
/// the flag (EINVAL) and make every memfd executable anyway.
const MFD_EXEC: u32 = 0x10;

/// What runs, decided by the program's name and first bytes.
#[derive(Debug)]
pub enum Program {
    /// An executable, in a sealed memfd, or `cached` in the trampoline's program cache
    /// ([`fetcher::programs`]); read-only and close-on-exec either way (the exec is its last use).
    Binary { fd: OwnedFd, cached: bool },
    /// A Python script (`*.py`, or a `#!` line naming python): the configured interpreter
    /// runs it from [`SCRIPT_DIR`].
    Python { text: Vec<u8> },
    /// Another script: run by the interpreter its `#!` line names (and its one argument), as
    /// the kernel would, from [`SCRIPT_DIR`].
    Script {
        text: Vec<u8>,
        interpreter: PathBuf,
        arg: Option<OsString>,
    },
    /// The program is the interpreter itself (`python`, `python3`, `python3.12`): the
    /// configured one runs with the proc's arguments; binfs is not read.
    Interpreter,
}

impl Program {
    /// Whether the configured Python interpreter runs it.
    pub fn is_python(&self) -> bool {
        matches!(self, Program::Python { .. } | Program::Interpreter)
    }
}

/// `python`, `python3`, `python3.12`, `python2.7`.
pub fn is_python_name(name: &str) -> bool {
    name.strip_prefix("python").is_some_and(|v| {
        v.is_empty()
            || v.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Where a binary may be cached: the trampoline's `cache_dir` and the proc's realm.
pub struct CacheAt<'a> {
    pub dir: &'a Path,
    pub realm: &'a str,
}

/// Reads `prog` (named `name`, without its version).
pub fn load(prog: &Path, name: &str, cache: Option<CacheAt<'_>>) -> anyhow::Result<Program> {
    if is_python_name(name) {
        return Ok(Program::Interpreter);
    }
    let file = File::open(prog).with_context(|| format!("opening {}", prog.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("stat of {}", prog.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", prog.display());
    }
    let mut head = [0u8; 256];
    let n =
        read_at_full(&file, &mut head).with_context(|| format!("reading {}", prog.display()))?;
    let head = &head[..n];
    if head.starts_with(b"#!") || name.ends_with(".py") {
        if meta.len() > MAX_SCRIPT {
            bail!(
                "{}: a script larger than {MAX_SCRIPT} bytes",
                prog.display()
            );
        }
        let mut text = Vec::with_capacity(meta.len() as usize);
        (&file)
            .take(MAX_SCRIPT + 1)
            .read_to_end(&mut text)
            .with_context(|| format!("reading {}", prog.display()))?;
        if text.len() as u64 > MAX_SCRIPT {
            bail!(
                "{}: a script larger than {MAX_SCRIPT} bytes",
                prog.display()
            );
        }
        return Ok(match shebang(&text) {
            None => Program::Python { text },
            Some((interp, arg)) if names_python(&interp, arg.as_deref()) => {
                Program::Python { text }
            }
            Some((interpreter, arg)) => {
                if !interpreter.is_absolute() {
                    bail!(
                        "{}: its #! line names {}, not an absolute path",
                        prog.display(),
                        interpreter.display()
                    );
                }
                Program::Script {
                    text,
                    interpreter,
                    arg: arg.map(OsString::from),
                }
            }
        });
    }
    if meta.len() > MAX_BINARY {
        bail!(
            "{}: a program larger than {MAX_BINARY} bytes",
            prog.display()
        );
    }
    if let Some(c) = cache.filter(|c| fetcher::programs::usable(c.dir)) {
        let entry = fetcher::programs::Entry::of(c.dir, c.realm, prog, &file)?;
        match entry.open().map_or_else(|| entry.fill(&file), Ok) {
            Ok(f) => {
                return Ok(Program::Binary {
                    fd: f.into(),
                    cached: true,
                })
            }
            // The proc still runs, from memory.
            Err(e) => tracing::warn!("{e:#}"),
        }
    }
    let fd = sealed_copy(&file, name)
        .with_context(|| format!("copying {} into memory", prog.display()))?;
    Ok(Program::Binary { fd, cached: false })
}

fn read_at_full(f: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A `#!` line's interpreter and its one optional argument, as the kernel splits it.
fn shebang(text: &[u8]) -> Option<(PathBuf, Option<String>)> {
    let line = text.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|b| *b == b'\n').unwrap_or(line.len())];
    let line = std::str::from_utf8(line)
        .ok()?
        .trim_matches([' ', '\t', '\r']);
    let (interp, arg) = match line.find([' ', '\t']) {
        Some(i) => (&line[..i], Some(line[i..].trim_matches([' ', '\t']))),
        None => (line, None),
    };
    if interp.is_empty() {
        return None;
    }
    Some((
        PathBuf::from(interp),
        arg.filter(|a| !a.is_empty()).map(str::to_owned),
    ))
}

/// `#!/usr/bin/python3`, `#!/usr/bin/env python3`.
fn names_python(interp: &Path, arg: Option<&str>) -> bool {
    let base = interp.file_name().and_then(|n| n.to_str()).unwrap_or("");
    is_python_name(base)
        || (base == "env"
            && arg
                .and_then(|a| a.split_whitespace().next())
                .is_some_and(is_python_name))
}

/// `file`'s bytes in a sealed, close-on-exec memfd, handed back as a read-only descriptor.
fn sealed_copy(file: &File, name: &str) -> anyhow::Result<OwnedFd> {
    let label = format!("sigma-proc:{name}");
    let base = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let fd = match memfd_create(
        label.as_str(),
        base | MFdFlags::from_bits_retain(MFD_EXEC as _),
    ) {
        Err(nix::errno::Errno::EINVAL) => memfd_create(label.as_str(), base),
        r => r,
    }
    .map_err(|e| anyhow!("memfd_create: {e}"))?;
    let mut out = File::from(fd);
    let mut src = file;
    // copy_file_range or sendfile where the kernel can; read/write otherwise.
    std::io::copy(&mut src, &mut out).map_err(|e| anyhow!("{e}"))?;
    fcntl(
        &out,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE
                | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| anyhow!("sealing the memfd: {e}"))?;
    // A read-only descriptor of the same file: no writer is left open for the exec.
    let ro = File::open(format!("/proc/self/fd/{}", out.as_raw_fd()));
    Ok(match ro {
        Ok(ro) => OwnedFd::from(ro),
        Err(_) => OwnedFd::from(out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_names() {
        for n in ["python", "python3", "python3.12", "python2.7"] {
            assert!(is_python_name(n), "{n}");
        }
        for n in [
            "pythonx",
            "python3.",
            "python.3",
            "py",
            "python3-config",
            "python3..1",
        ] {
            assert!(!is_python_name(n), "{n}");
        }
    }

    #[test]
    fn shebang_lines_split_as_the_kernel_does() {
        assert_eq!(
            shebang(b"#!/bin/sh -e\nx"),
            Some(("/bin/sh".into(), Some("-e".into())))
        );
        assert_eq!(
            shebang(b"#! /usr/bin/env  python3 \n"),
            Some(("/usr/bin/env".into(), Some("python3".into())))
        );
        assert_eq!(shebang(b"#!\n"), None);
        assert_eq!(shebang(b"print(1)"), None);
        assert!(names_python(Path::new("/usr/bin/env"), Some("python3 -u")));
        assert!(names_python(Path::new("/opt/v/bin/python"), None));
        assert!(!names_python(Path::new("/bin/sh"), None));
    }

    #[test]
    fn a_binary_is_copied_sealed_and_read_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("tool-v1.0");
        std::fs::write(&p, b"\x7fELF and some bytes").unwrap();
        let Program::Binary { fd, cached: false } = load(&p, "tool", None).unwrap() else {
            panic!("not a binary");
        };
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS).unwrap();
        assert_eq!(seals & libc::F_SEAL_WRITE, libc::F_SEAL_WRITE);
        let flags = fcntl(&fd, FcntlArg::F_GETFD).unwrap();
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let fl = fcntl(&fd, FcntlArg::F_GETFL).unwrap();
        assert_eq!(fl & libc::O_ACCMODE, libc::O_RDONLY);
        let got = std::fs::read(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert_eq!(got, b"\x7fELF and some bytes");
    }

    #[test]
    fn scripts_and_interpreters_are_told_apart() {
        let d = tempfile::tempdir().unwrap();
        let w = |n: &str, t: &[u8]| {
            let p = d.path().join(n);
            std::fs::write(&p, t).unwrap();
            p
        };
        assert!(matches!(
            load(&w("a-v1", b"print(1)"), "a.py", None).unwrap(),
            Program::Python { .. }
        ));
        assert!(matches!(
            load(&w("b-v1", b"#!/usr/bin/env python3\n"), "b", None).unwrap(),
            Program::Python { .. }
        ));
        match load(&w("c-v1", b"#!/bin/sh -e\necho\n"), "c", None).unwrap() {
            Program::Script {
                interpreter,
                arg,
                text,
            } => {
                assert_eq!(interpreter, Path::new("/bin/sh"));
                assert_eq!(arg.as_deref(), Some(std::ffi::OsStr::new("-e")));
                assert_eq!(text, b"#!/bin/sh -e\necho\n");
            }
            p => panic!("{p:?}"),
        }
        assert!(load(&w("e-v1", b"#!sh\n"), "e", None)
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        // The interpreter itself: binfs is not even opened.
        assert!(matches!(
            load(Path::new("/nonexistent/python3-v3"), "python3", None).unwrap(),
            Program::Interpreter
        ));
        assert!(load(d.path(), "dir", None)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
        assert!(load(&d.path().join("none"), "none", None).is_err());
    }
}
