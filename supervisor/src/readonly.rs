//! The read-only hint. With `--trace` or `--stats`, a write that the kernel refuses because the
//! σcontainer shows its directory read-only (EROFS) is named as such in the trace and stats,
//! and one line on stderr says which flag makes the directory writable, once per directory.
//!
//! The supervisor only explains: the call is continued exactly as without the hint and the
//! kernel refuses it. Whether it will be refused is looked up in the target's own root, as the
//! target sees it: `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` with `O_PATH` (nothing is
//! opened for reading or writing, no device is touched, no magic link is followed), then
//! `fstatvfs` for the mount's `ST_RDONLY`. The path comes from target memory the target may
//! change meanwhile: at worst a hint is wrong, never an outcome.
#![forbid(unsafe_code)]

use crate::calls::{open_writes, Writes};
use jail::shown::Came;
pub use jail::shown::JailMap;
use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::SFlag;
use nix::sys::statvfs::FsFlags;
use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What a write-intent call does, as far as its arguments tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// An open whose flags ask to write ([`open_writes`]).
    Open(u64),
    /// Makes a new entry: refused as read-only only when the entry does not exist yet.
    Creates,
    /// Removes or renames an entry: its directory is written, whether the entry exists or not.
    Entry,
    /// Changes an existing file (mode, owner, times, size).
    Modifies,
}

impl Write {
    /// The write a call declared as `writes` makes with these registers; `None` for a call that
    /// only reads. `how_flags` fetches openat2's `open_how.flags` (target memory), called only
    /// for openat2.
    pub fn of(
        writes: Writes,
        args: &[u64; 6],
        how_flags: impl FnOnce() -> Option<u64>,
    ) -> Option<Write> {
        let open = |flags: u64| open_writes(flags).then_some(Write::Open(flags));
        match writes {
            Writes::No => None,
            // open(2)'s flags are an int: the upper half of the register is not looked at.
            Writes::Open { flags } => open(*args.get(flags)? & u64::from(u32::MAX)),
            Writes::OpenHow => open(how_flags()?),
            Writes::Creat => Some(Write::Open(
                (libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC) as u64,
            )),
            Writes::Creates => Some(Write::Creates),
            Writes::Entry => Some(Write::Entry),
            Writes::Modifies => Some(Write::Modifies),
        }
    }
}

fn has(flags: u64, bits: libc::c_int) -> bool {
    let bits = bits as u64;
    flags & bits == bits
}

/// The file at `abs` (the target's view) in the target's root, as an O_PATH fd, and its type.
fn lookup(root: &OwnedFd, abs: &Path, follow: bool) -> Result<(OwnedFd, SFlag), Errno> {
    let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    if !follow {
        flags |= OFlag::O_NOFOLLOW;
    }
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = openat2(root.as_fd(), notify::path::relative_to_root(abs), how)?;
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    Ok((fd, SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT))
}

/// Whether the mount `fd` lies on is read-only.
fn read_only(fd: &OwnedFd) -> bool {
    nix::sys::statvfs::fstatvfs(fd).is_ok_and(|s| s.flags().contains(FsFlags::ST_RDONLY))
}

/// The jail directory whose read-only mount makes the kernel refuse `w` on `abs` (a path in
/// the target's view; `follow`: whether its last symlink is followed) with EROFS, if that is
/// what will happen. Cases the kernel answers otherwise first (EEXIST, EISDIR, ENOENT, a device
/// node, which stays writable on a read-only mount) get no hint.
pub fn refused_dir(pid: u32, abs: &Path, w: Write, follow: bool) -> Option<PathBuf> {
    let root = notify::path::open_root(pid).ok()?;
    let parent = abs.parent().map(Path::to_path_buf);
    let dir_ro = |p: &Path| {
        lookup(&root, p, true).is_ok_and(|(fd, kind)| kind == SFlag::S_IFDIR && read_only(&fd))
    };
    let in_ro_parent = || parent.clone().filter(|p| dir_ro(p));
    match w {
        Write::Open(flags) => {
            if has(flags, libc::O_TMPFILE) {
                // An unnamed file in the directory `abs`.
                return dir_ro(abs).then(|| abs.to_path_buf());
            }
            let creat = has(flags, libc::O_CREAT);
            let excl = creat && has(flags, libc::O_EXCL);
            let follow = follow && !has(flags, libc::O_NOFOLLOW) && !excl;
            match lookup(&root, abs, follow) {
                Ok((fd, kind)) => {
                    let writes = flags & libc::O_ACCMODE as u64 != libc::O_RDONLY as u64
                        || has(flags, libc::O_TRUNC);
                    // Existing: O_EXCL fails with EEXIST, a directory with EISDIR, a device
                    // node is writable on a read-only mount.
                    let refused = kind == SFlag::S_IFREG && !excl && writes && read_only(&fd);
                    if refused {
                        parent
                    } else {
                        None
                    }
                }
                Err(Errno::ENOENT) if creat => in_ro_parent(),
                Err(_) => None,
            }
        }
        Write::Creates => match lookup(&root, abs, false) {
            Err(Errno::ENOENT) => in_ro_parent(),
            _ => None,
        },
        Write::Entry => in_ro_parent(),
        Write::Modifies => match lookup(&root, abs, follow) {
            Ok((fd, kind))
                if (kind == SFlag::S_IFREG || kind == SFlag::S_IFDIR || kind == SFlag::S_IFLNK)
                    && read_only(&fd) =>
            {
                if kind == SFlag::S_IFDIR {
                    Some(abs.to_path_buf())
                } else {
                    parent
                }
            }
            _ => None,
        },
    }
}

/// For the read-only jail directory `dir`: the key it is hinted once under (the host
/// directory, or the jail path for the system view) and the hint.
fn hint(map: &JailMap, dir: &Path) -> (PathBuf, String) {
    let line = match map.origin(dir) {
        Came::Supervisors => format!(
            "{} is read-only in the jail: the supervisor serves it (realm libraries, --serve) \
             and no flag makes it writable",
            shown(dir)
        ),
        Came::WithheldCwd => format!(
            "{} is read-only in the jail: the working directory is not shown there by default \
             (a home, shared temporary or system directory); --cwd rw shows it writable",
            shown(dir)
        ),
        Came::System => format!(
            "{} is read-only in the jail: it is part of the read-only system view",
            shown(dir)
        ),
        Came::Cwd { host } => {
            let line = format!(
                "{} is read-only in the jail: --cwd rw makes it writable",
                shown(&host)
            );
            return (host, line);
        }
        Came::Bind { host } => {
            let line = if host == dir {
                format!(
                    "{} is read-only in the jail: --bind-rw {} makes it writable",
                    shown(&host),
                    shown(&host)
                )
            } else {
                format!(
                    "{} (at {} in the jail) is read-only in the jail: --bind-rw {}:{} makes it \
                     writable",
                    shown(&host),
                    shown(dir),
                    shown(&host),
                    shown(dir)
                )
            };
            return (host, line);
        }
    };
    (dir.to_path_buf(), line)
}

/// A path for one line of output: control characters become `?`.
fn shown(p: &Path) -> String {
    p.to_string_lossy()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Most distinct hints printed; later read-only refusals are only counted.
const MAX_HINTS: usize = 32;

#[derive(Default)]
struct Log {
    seen: HashSet<PathBuf>,
    lines: Vec<String>,
    unlisted: u64,
}

/// The hints of one run: printed once each, listed again by `--stats`.
pub struct Hints {
    map: JailMap,
    log: Mutex<Log>,
}

impl Hints {
    pub fn new(map: JailMap) -> Hints {
        Hints {
            map,
            log: Mutex::new(Log::default()),
        }
    }

    /// A write into read-only jail directory `dir` is about to be refused: the first time for
    /// this directory, say which flag would make it writable (stderr).
    pub fn note(&self, dir: &Path) {
        let (key, line) = hint(&self.map, dir);
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.seen.contains(&key) {
            return;
        }
        if log.lines.len() >= MAX_HINTS {
            log.unlisted = log.unlisted.saturating_add(1);
            return;
        }
        eprintln!("sigma-supervise: {line}");
        log.seen.insert(key);
        log.lines.push(line);
    }

    /// The hints for the `--stats` report, one line each (empty when there were none).
    pub fn report(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for l in &log.lines {
            out.push_str("sigma-supervise stats: hint: ");
            out.push_str(l);
            out.push('\n');
        }
        if log.unlisted > 0 {
            out.push_str(&format!(
                "sigma-supervise stats: hint: {} more refused writes in read-only directories \
                 not listed\n",
                log.unlisted
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(i: usize, v: u64) -> [u64; 6] {
        let mut a = [0; 6];
        a[i] = v;
        a
    }

    #[test]
    fn only_opens_that_ask_to_write_are_writes() {
        let openat = Writes::Open { flags: 2 };
        let of = |flags: libc::c_int| Write::of(openat, &args(2, flags as u64), || None);
        for reads in [
            libc::O_RDONLY,
            libc::O_RDONLY | libc::O_CLOEXEC,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            libc::O_PATH,
            libc::O_RDONLY | libc::O_APPEND | libc::O_NONBLOCK,
        ] {
            assert_eq!(of(reads), None, "{reads:#o}");
        }
        for writes in [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            libc::O_RDONLY | libc::O_CREAT,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_TMPFILE | libc::O_RDWR,
            libc::O_WRONLY | libc::O_APPEND,
        ] {
            assert_eq!(of(writes), Some(Write::Open(writes as u64)), "{writes:#o}");
        }
        // open(2)'s flags are an int: garbage above it does not make a read a write.
        assert_eq!(
            Write::of(openat, &args(2, 0xffff_ffff_0000_0000), || None),
            None
        );
        // openat2 reads its flags only when asked, and only for itself.
        assert_eq!(
            Write::of(Writes::OpenHow, &[0; 6], || Some(libc::O_RDWR as u64)),
            Some(Write::Open(libc::O_RDWR as u64))
        );
        assert_eq!(Write::of(Writes::OpenHow, &[0; 6], || None), None);
        assert_eq!(
            Write::of(Writes::No, &[0; 6], || panic!("not an openat2")),
            None
        );
        assert!(matches!(
            Write::of(Writes::Creat, &[0; 6], || None),
            Some(Write::Open(f)) if has(f, libc::O_CREAT) && has(f, libc::O_WRONLY)
        ));
        assert_eq!(
            Write::of(Writes::Entry, &[0; 6], || None),
            Some(Write::Entry)
        );
    }

    #[test]
    fn every_writing_call_is_declared_and_no_reading_one_is() {
        let writes = |name: &str| {
            crate::handlers::SPECS
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name}"))
                .writes
        };
        for name in [
            "mkdir",
            "mkdirat",
            "unlink",
            "unlinkat",
            "rmdir",
            "rename",
            "renameat",
            "renameat2",
            "link",
            "linkat",
            "symlink",
            "symlinkat",
            "truncate",
            "utimensat",
            "chmod",
            "fchmodat",
            "chown",
            "lchown",
            "fchownat",
            "mknod",
            "mknodat",
            "creat",
            "open",
            "openat",
            "openat2",
        ] {
            assert_ne!(writes(name), Writes::No, "{name}");
        }
        for name in [
            "stat",
            "newfstatat",
            "statx",
            "access",
            "readlink",
            "execve",
            "chdir",
        ] {
            assert_eq!(writes(name), Writes::No, "{name}");
        }
        assert_eq!(writes("open"), Writes::Open { flags: 1 });
        assert_eq!(writes("openat"), Writes::Open { flags: 2 });
    }

    fn map() -> JailMap {
        let mut spec = jail::JailSpec::new(1000, 1000);
        spec.binds.push(jail::Bind::ro("/usr"));
        spec.binds.push(jail::Bind::ro("/etc/hosts"));
        spec.binds.push(jail::Bind::ro("/home/u/scripts"));
        spec.binds.push(jail::Bind::ro("/home/u/work").idmapped());
        spec.binds
            .push(jail::Bind::ro("/srv/data").at("/data").idmapped());
        spec.binds
            .push(jail::Bind::ro("/var/cache/sigma/r/lib").at("/sigma/lib"));
        spec.hides.push("/var/cache/sigma".into());
        spec.dirs.push("/srv/served".into());
        spec.workdir = Some("/home/u/work".into());
        JailMap::new(&spec, true, None, &[PathBuf::from("/data")])
    }

    #[test]
    fn hints_name_the_flag_and_the_host_directory() {
        let m = map();
        let hint = |d: &str| hint(&m, Path::new(d));
        let (key, line) = hint("/home/u/work/sub");
        assert_eq!(key, Path::new("/home/u/work/sub"));
        assert_eq!(
            line,
            "/home/u/work/sub is read-only in the jail: --cwd rw makes it writable"
        );
        assert_eq!(
            hint("/home/u/scripts").1,
            "/home/u/scripts is read-only in the jail: --bind-rw /home/u/scripts makes it writable"
        );
        let (key, line) = hint("/data/x");
        assert_eq!(key, Path::new("/srv/data/x"));
        assert_eq!(
            line,
            "/srv/data/x (at /data/x in the jail) is read-only in the jail: --bind-rw \
             /srv/data/x:/data/x makes it writable"
        );
        for system in ["/usr/lib/python3", "/", "/etc", "/proc/sys/kernel"] {
            let (key, line) = hint(system);
            assert_eq!(key, Path::new(system));
            assert_eq!(
                line,
                format!(
                    "{system} is read-only in the jail: it is part of the read-only system view"
                )
            );
        }
        for served in ["/sigma/lib/numpy", "/srv/served/x"] {
            assert_eq!(
                hint(served).1,
                format!(
                    "{served} is read-only in the jail: the supervisor serves it (realm \
                     libraries, --serve) and no flag makes it writable"
                )
            );
        }
        // Without --cwd ro the same directory is an ordinary bind.
        let mut spec = jail::JailSpec::new(1000, 1000);
        spec.binds.push(jail::Bind::ro("/home/u/work"));
        spec.workdir = Some("/home/u/work".into());
        let m = JailMap::new(&spec, false, None, &[]);
        assert!(super::hint(&m, Path::new("/home/u/work"))
            .1
            .contains("--bind-rw /home/u/work "));
        assert_eq!(shown(Path::new("/a\nb")), "/a?b");
        // A working directory `--cwd auto` did not show: the flag that shows it, not "served".
        let mut spec = jail::JailSpec::new(1000, 1000);
        spec.dirs.push("/root".into());
        spec.workdir = Some("/root".into());
        let m = JailMap::new(&spec, false, Some(Path::new("/root")), &[]);
        let (key, line) = super::hint(&m, Path::new("/root"));
        assert_eq!(key, Path::new("/root"));
        assert!(line.ends_with("--cwd rw shows it writable"), "{line}");
    }

    #[test]
    fn each_directory_is_hinted_once_and_listed_in_the_report() {
        let h = Hints::new(map());
        h.note(Path::new("/home/u/work"));
        h.note(Path::new("/home/u/work"));
        h.note(Path::new("/usr/lib"));
        let r = h.report();
        assert_eq!(r.lines().count(), 2, "{r}");
        assert!(r
            .lines()
            .all(|l| l.starts_with("sigma-supervise stats: hint: ")));
        for i in 0..100 {
            h.note(&Path::new("/usr/lib").join(i.to_string()));
        }
        let r = h.report();
        assert_eq!(r.lines().count(), MAX_HINTS + 1, "{r}");
        assert!(r.ends_with("70 more refused writes in read-only directories not listed\n"));
    }
}
