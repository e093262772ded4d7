//! Resolving paths as the target sees them: dirfd via /proc/<pid>/fd/<n>, cwd via
//! /proc/<pid>/cwd, absolute paths via /proc/<pid>/root.
//!
//! The result is *lexical*: `.`, `..` and repeated slashes are folded without looking at the
//! file system, and symlinks are NOT followed (so `a/link/..` becomes `a`, which may differ from
//! what the kernel would do). That is by design: this module only names the file in the
//! target's view; the supervisor then opens it itself, relative to the target's root
//! ([`open_root`]) with `openat2(RESOLVE_IN_ROOT | RESOLVE_BENEATH ...)`, which resolves
//! symlinks safely and cannot escape. Never grant access on a lexical path alone.
//!
//! Target view: `/proc/<pid>/cwd` and `/proc/<pid>/fd/<n>` read as paths from *our* root. If
//! the target has another root (chroot), that root's own path (`/proc/<pid>/root`) is stripped
//! so the result is what the target itself would call the file. A deleted cwd/dir shows as
//! `<path> (deleted)` in /proc and is returned as such (opening it then fails with ENOENT).
#![forbid(unsafe_code)]

use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::{stat, Mode, SFlag};
use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Turn (dirfd, path) of target `pid` into an absolute path in the target's view
/// (lexically normalised, no symlinks followed). AT_FDCWD = cwd.
///
/// Errors (errnos for the target): ENOENT for an empty path (use [`fd_path`] for
/// AT_EMPTY_PATH), EBADF for a dirfd the target does not have, ENOTDIR when a relative path is
/// given with a dirfd that is not a directory, ENAMETOOLONG past PATH_MAX, ESRCH→ENOENT if
/// the target is gone. An absolute path ignores dirfd, as the kernel does.
pub fn absolute(pid: u32, dirfd: i32, path: &CStr) -> Result<PathBuf, Errno> {
    let bytes = path.to_bytes();
    if bytes.is_empty() {
        return Err(Errno::ENOENT);
    }
    if bytes.len() >= crate::mem::PATH_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    let p = Path::new(OsStr::from_bytes(bytes));
    if p.is_absolute() {
        return Ok(normalize(p));
    }
    let base = if dirfd == libc::AT_FDCWD {
        cwd(pid)?
    } else {
        dir_path(pid, dirfd)?
    };
    Ok(join_normalized(&base, p))
}

/// The target's cwd in its own view.
pub fn cwd(pid: u32) -> Result<PathBuf, Errno> {
    let link = readlink_proc(&format!("/proc/{pid}/cwd")).map_err(gone)?;
    in_target_view(pid, link)
}

/// What the target's fd `fd` names, in its own view (for AT_EMPTY_PATH and friends).
/// EBADF if the target has no such fd; for non-file fds (pipes, sockets, anon inodes) the
/// kernel's pseudo name (`pipe:[123]`) is returned unchanged, not an absolute path.
pub fn fd_path(pid: u32, fd: i32) -> Result<PathBuf, Errno> {
    if fd < 0 {
        return Err(Errno::EBADF);
    }
    let link = readlink_proc(&format!("/proc/{pid}/fd/{fd}")).map_err(fd_err)?;
    if !link.is_absolute() {
        return Ok(link);
    }
    in_target_view(pid, link)
}

/// The target's dirfd as a directory path in its own view (EBADF / ENOTDIR).
fn dir_path(pid: u32, dirfd: i32) -> Result<PathBuf, Errno> {
    if dirfd < 0 {
        return Err(Errno::EBADF);
    }
    let proc_link = format!("/proc/{pid}/fd/{dirfd}");
    let link = readlink_proc(&proc_link).map_err(fd_err)?;
    if !link.is_absolute() {
        // pipe:[..], socket:[..], anon_inode:[..]
        return Err(Errno::ENOTDIR);
    }
    // stat follows the magic link to the open file itself.
    let st = stat(proc_link.as_str()).map_err(fd_err)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR {
        return Err(Errno::ENOTDIR);
    }
    in_target_view(pid, link)
}

fn readlink_proc(p: &str) -> Result<PathBuf, Errno> {
    nix::fcntl::readlink(p).map(PathBuf::from)
}

/// The target no longer exists → ENOENT (its notification is gone too).
fn gone(e: Errno) -> Errno {
    match e {
        Errno::ESRCH => Errno::ENOENT,
        e => e,
    }
}

/// A missing /proc/<pid>/fd/<n> means the target has no such fd.
fn fd_err(e: Errno) -> Errno {
    match e {
        Errno::ENOENT | Errno::ESRCH => Errno::EBADF,
        e => e,
    }
}

/// Strip the target's root (as seen from our root) from a path read from /proc.
fn in_target_view(pid: u32, link: PathBuf) -> Result<PathBuf, Errno> {
    if !link.is_absolute() {
        // "(unreachable)/..." and similar: not nameable from the target's root.
        return Err(Errno::ENOENT);
    }
    let root = readlink_proc(&format!("/proc/{pid}/root")).map_err(gone)?;
    Ok(strip_root(&root, &link))
}

fn strip_root(root: &Path, link: &Path) -> PathBuf {
    if root == Path::new("/") {
        return normalize(link);
    }
    match link.strip_prefix(root) {
        Ok(rest) => join_normalized(Path::new("/"), rest),
        // Outside the target's root (it escaped or holds an fd from outside): keep our view.
        Err(_) => normalize(link),
    }
}

/// Lexical normalisation of an absolute path: folds `//`, `.` and `..` (`..` at `/` stays at
/// `/`). A relative input is taken relative to `/`. Trailing slashes are dropped.
pub fn normalize(path: &Path) -> PathBuf {
    join_normalized(Path::new("/"), path)
}

/// `base` joined with `rel` and normalised lexically; an absolute `rel` replaces `base`.
pub fn join_normalized(base: &Path, rel: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    let push = |c: Component<'_>, out: &mut PathBuf| match c {
        Component::Prefix(_) | Component::RootDir | Component::CurDir => {}
        Component::ParentDir => {
            out.pop();
        }
        Component::Normal(s) => out.push(s),
    };
    if !rel.is_absolute() {
        for c in base.components() {
            push(c, &mut out);
        }
    }
    for c in rel.components() {
        push(c, &mut out);
    }
    out
}

/// An absolute target path as a path relative to the target's root, for
/// `openat2(root_fd, rel, RESOLVE_IN_ROOT)` (`/` becomes `.`).
pub fn relative_to_root(abs: &Path) -> &Path {
    let rel = abs.strip_prefix("/").unwrap_or(abs);
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

fn open_path(p: &str, dir: bool) -> Result<OwnedFd, Errno> {
    let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    if dir {
        flags |= OFlag::O_DIRECTORY;
    }
    open(p, flags, Mode::empty())
}

/// The target's root directory as an O_PATH fd (base for `openat2(RESOLVE_IN_ROOT)`).
pub fn open_root(pid: u32) -> Result<OwnedFd, Errno> {
    open_path(&format!("/proc/{pid}/root"), true).map_err(gone)
}

/// The target's cwd as an O_PATH fd.
pub fn open_cwd(pid: u32) -> Result<OwnedFd, Errno> {
    open_path(&format!("/proc/{pid}/cwd"), true).map_err(gone)
}

/// The target's fd `fd` re-opened as an O_PATH fd on the same file (EBADF if missing).
pub fn open_fd(pid: u32, fd: i32) -> Result<OwnedFd, Errno> {
    if fd < 0 {
        return Err(Errno::EBADF);
    }
    open_path(&format!("/proc/{pid}/fd/{fd}"), false).map_err(fd_err)
}

/// The directory a (dirfd, relative path) pair starts from, as an O_PATH fd: the target's cwd
/// for AT_FDCWD, else its dirfd (EBADF / ENOTDIR).
pub fn open_dirfd(pid: u32, dirfd: i32) -> Result<OwnedFd, Errno> {
    if dirfd == libc::AT_FDCWD {
        return open_cwd(pid);
    }
    if dirfd < 0 {
        return Err(Errno::EBADF);
    }
    let p = format!("/proc/{pid}/fd/{dirfd}");
    open_path(&p, true).map_err(fd_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> String {
        normalize(Path::new(s)).to_string_lossy().into_owned()
    }

    #[test]
    fn normalises_lexically() {
        assert_eq!(n("/"), "/");
        assert_eq!(n("//"), "/");
        assert_eq!(n("/a//b///c"), "/a/b/c");
        assert_eq!(n("/a/./b/."), "/a/b");
        assert_eq!(n("/a/b/../c"), "/a/c");
        assert_eq!(n("/a/b/../../.."), "/");
        assert_eq!(n("/../../etc/passwd"), "/etc/passwd");
        assert_eq!(n("/a/b/"), "/a/b");
        assert_eq!(n("/a/..."), "/a/...");
        assert_eq!(n("/a/.hidden/..x"), "/a/.hidden/..x");
    }

    #[test]
    fn joins_relative_and_absolute() {
        let j = |b: &str, r: &str| join_normalized(Path::new(b), Path::new(r));
        assert_eq!(j("/home/u", "x/y"), Path::new("/home/u/x/y"));
        assert_eq!(j("/home/u", "../v/./w"), Path::new("/home/v/w"));
        assert_eq!(j("/home/u", "../../../../x"), Path::new("/x"));
        assert_eq!(j("/home/u", "./"), Path::new("/home/u"));
        assert_eq!(j("/home/u", "/etc//hosts"), Path::new("/etc/hosts"));
        assert_eq!(j("/", ".."), Path::new("/"));
    }

    #[test]
    fn strips_the_targets_root() {
        let s = |r: &str, l: &str| strip_root(Path::new(r), Path::new(l));
        assert_eq!(s("/", "/a/b"), Path::new("/a/b"));
        assert_eq!(s("/srv/realm", "/srv/realm/home"), Path::new("/home"));
        assert_eq!(s("/srv/realm", "/srv/realm"), Path::new("/"));
        // Not a component prefix: left in our view.
        assert_eq!(s("/srv/realm", "/srv/realmx/a"), Path::new("/srv/realmx/a"));
    }

    #[test]
    fn relative_to_root_never_starts_with_slash() {
        assert_eq!(relative_to_root(Path::new("/")), Path::new("."));
        assert_eq!(relative_to_root(Path::new("/a/b")), Path::new("a/b"));
    }

    #[test]
    fn resolves_against_our_own_process() {
        let me = std::process::id();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute(me, libc::AT_FDCWD, c"x/../y").unwrap(),
            cwd.join("y")
        );
        assert_eq!(
            absolute(me, 12345, c"/etc/./hosts").unwrap(),
            Path::new("/etc/hosts")
        );
        assert_eq!(absolute(me, libc::AT_FDCWD, c""), Err(Errno::ENOENT));
        assert_eq!(absolute(me, 100_000, c"rel"), Err(Errno::EBADF));
        assert_eq!(absolute(me, -5, c"rel"), Err(Errno::EBADF));
        let long = std::ffi::CString::new(vec![b'a'; 5000]).unwrap();
        assert_eq!(
            absolute(me, libc::AT_FDCWD, &long),
            Err(Errno::ENAMETOOLONG)
        );
    }
}
