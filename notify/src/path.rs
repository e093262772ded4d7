//! Resolving paths as the target sees them: dirfd via `/proc/<pid>/fd/<n>`, cwd via
//! `/proc/<pid>/cwd`, absolute paths via `/proc/<pid>/root`.
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

use crate::sys;
use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;
use std::ffi::{CStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};

/// Turn (dirfd, path) of target `pid` into an absolute path in the target's view
/// (lexically normalised, no symlinks followed). AT_FDCWD = cwd.
///
/// Errors (errnos for the target): ENOENT for an empty path (use [`fd_path`] for
/// AT_EMPTY_PATH), EBADF for a dirfd the target does not have, ENOTDIR when a relative path is
/// given with a dirfd that is not a directory, ENAMETOOLONG past PATH_MAX, ESRCH→ENOENT if
/// the target is gone. An absolute path ignores dirfd, as the kernel does.
///
/// One-off form of [`ProcView::absolute_into`] (the receive loop keeps a [`ProcView`]).
pub fn absolute(pid: u32, dirfd: i32, path: &CStr) -> Result<PathBuf, Errno> {
    let mut out = Vec::new();
    ProcView::default().absolute_into(pid, dirfd, path.to_bytes(), &mut out)?;
    Ok(PathBuf::from(OsString::from_vec(out)))
}

/// How many targets' `/proc/<tid>` directories a [`ProcView`] keeps open (and how many
/// targets' cwds it remembers).
const PROC_DIRS: usize = 8;

/// How many changes of cwd a [`ProcView`] follows until each has taken effect; past that it
/// reads every cwd from /proc for the rest of the run.
const MOVING_MAX: usize = 64;

/// While changes of cwd are pending, every this many cwds read from /proc the pending changes
/// whose thread is gone are dropped ([`ProcView::prune_moving`]).
const PRUNE_EVERY: u32 = 16;

/// Resolves target paths for the receive loop without allocating per call (its buffers keep
/// their capacity) and without walking `/proc/<tid>` each time: the last few targets'
/// `/proc/<tid>` directories stay open.
///
/// A cached directory stays bound to the task it was opened for (a `/proc/<tid>` inode holds that
/// task's `struct pid`, not its number): once the task is gone every look-up through it fails,
/// even if the number has been reused by then. A failure through a cached directory is
/// therefore retried once through a freshly opened one, so a stale entry costs a retry and
/// never answers for another process.
#[derive(Default)]
pub struct ProcView {
    dirs: Vec<(u32, OwnedFd)>,
    /// Slot replaced next once `dirs` is full.
    next: usize,
    bufs: Bufs,
    /// Every change of a target's cwd is notified ([`ProcView::set_cwd_changes_seen`]).
    cwd_seen: bool,
    start_cwd: StartCwd,
    /// Targets whose chdir or fchdir has been answered and not yet seen to return (see
    /// [`ProcView::task_seen`]): while any is, a cwd may be about to change.
    moving: Vec<u32>,
    /// `moving` overflowed: cwds are read from /proc for the rest of the run.
    moving_lost: bool,
    /// Cwds read from /proc while `moving` was not empty (see [`ProcView::prune_moving`]).
    unsettled_reads: u32,
    /// Targets' cwds read since every change of cwd took effect (see [`Cwd`]).
    cwds: Vec<Cwd>,
    /// Directories targets passed as dirfds (see [`Dir`]), at most [`PROC_DIRS`].
    dir_names: Vec<Dir>,
    /// Open files targets passed as dirfds naming a directory whose name cannot change (see
    /// [`Held`]), at most [`PROC_DIRS`].
    held: Vec<Held>,
    /// Taking or comparing a target's descriptor was refused (no ptrace access, no kcmp in
    /// this kernel): dirfds are always named through /proc.
    hold_refused: bool,
    /// Our process id, once asked (kcmp's other process).
    me: u32,
    /// The mount of the base directory the last [`ProcView::absolute_into`] used, when it was
    /// known without a system call more: (pid, dirfd, mount id), for [`ProcView::mount_id`].
    last_mnt: Option<(u32, i32, u64)>,
}

/// A directory a target passed as a dirfd, by identity (mount, device, inode: one directory
/// of one mount, whichever fd number names it), and its name in the targets' view if that
/// cannot change ([`ProcView::name_is_fixed`]; else read from /proc at every call).
struct Dir {
    id: DirId,
    fixed: Option<Vec<u8>>,
}

/// A directory's mount, device (major, minor) and inode.
type DirId = (u64, u32, u32, u64);

/// What a statx asks for a [`DirId`] (and the file's type).
const DIR_ID_MASK: u32 = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID;

/// The [`DirId`] of a statx asked for [`DIR_ID_MASK`], if the kernel answered all of it.
fn id_of(st: &libc::statx) -> Option<DirId> {
    (st.stx_mask & DIR_ID_MASK == DIR_ID_MASK).then_some((
        st.stx_mnt_id,
        st.stx_dev_major,
        st.stx_dev_minor,
        st.stx_ino,
    ))
}

/// Our duplicate of an open file a target passed as dirfd `fd`, a directory (`id`) whose
/// name cannot change. While that descriptor of the target is still this open file (kcmp, one
/// system call: [`sys::same_file`]) it names that directory, whichever thread or process of
/// the target passes it, without a look-up in /proc; a number closed and reused is another
/// file and is named through /proc again.
struct Held {
    fd: i32,
    id: DirId,
    file: OwnedFd,
}

/// A target's cwd, read from /proc once no change of cwd was pending: it stays that cwd until
/// a target changes one (which clears them all). `fixed`: its name cannot change either
/// ([`ProcView::name_is_fixed`]), so it is used without a look-up; otherwise it is read from
/// /proc at every call (remembered only so the name is not checked again).
///
/// Keyed by thread id: a number reused by a new thread before any change of cwd (after the
/// host's whole pid space has cycled) would find its predecessor's cwd. That name is a lexical
/// one in the target's own view, as every name here is: the kernel resolves the call, and a
/// serve opens beneath the target's root, so it grants nothing the target could not reach.
struct Cwd {
    tid: u32,
    fixed: Option<(Vec<u8>, u64)>,
}

/// The cwd every target starts with, while no target has changed its own.
#[derive(Default)]
enum StartCwd {
    /// Not read yet.
    #[default]
    Unknown,
    /// Normalised, in the targets' view.
    Known(Vec<u8>),
    /// Its name could change without a notification, or a target has changed (or is about to
    /// change) its cwd ([`ProcView::cwd_changes`]): always read from /proc.
    Unusable,
}

/// Whether `st` (asked for any mask) is the root of a mount.
pub fn is_mount_root(st: &libc::statx) -> bool {
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    st.stx_attributes_mask & root != 0 && st.stx_attributes & root != 0
}

#[derive(Default)]
struct Bufs {
    /// Every target has the same root for the whole run (see [`ProcView::set_root_fixed`]).
    root_fixed: bool,
    /// `root` holds that root.
    root_known: bool,
    /// A link read from /proc (cwd, fd/N).
    link: Vec<u8>,
    /// The target's root as /proc shows it.
    root: Vec<u8>,
    /// `root` normalised.
    root_norm: Vec<u8>,
    /// The normalised base directory.
    base: Vec<u8>,
}

/// `fd/<n>` (or `cwd` for AT_FDCWD), NUL-terminated, in a stack buffer.
struct ProcName {
    buf: [u8; 16],
    len: usize,
}

impl ProcName {
    fn new(dirfd: i32) -> Self {
        use std::io::Write as _;
        let mut buf = [0u8; 16];
        let len = if dirfd == libc::AT_FDCWD {
            buf[..4].copy_from_slice(b"cwd\0");
            4
        } else {
            let mut w = &mut buf[..];
            // "fd/" + at most 11 characters of an i32 + NUL = 15 bytes: always fits.
            let _ = write!(w, "fd/{dirfd}\0");
            16 - w.len()
        };
        ProcName { buf, len }
    }

    fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_with_nul(&self.buf[..self.len]).unwrap_or(c"")
    }

    /// Without the NUL.
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len.saturating_sub(1)]
    }
}

impl ProcView {
    /// Run `f` on `/proc/<pid>`: through the cached directory first, and on any failure there
    /// once more through a freshly opened one (which then replaces it in the cache).
    fn with_dir<T>(
        &mut self,
        pid: u32,
        mut f: impl FnMut(BorrowedFd<'_>, &mut Bufs) -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        if let Some(i) = self.dirs.iter().position(|(p, _)| *p == pid) {
            match f(self.dirs[i].1.as_fd(), &mut self.bufs) {
                Ok(v) => return Ok(v),
                Err(_) => {
                    self.dirs.swap_remove(i);
                }
            }
        }
        let mut name = [0u8; 24];
        let len = {
            use std::io::Write as _;
            let mut w = &mut name[..];
            // "/proc/" + at most 10 digits of a u32 = 16 bytes: always fits.
            let _ = write!(w, "/proc/{pid}");
            24 - w.len()
        };
        let dir = open(
            &name[..len],
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(gone)?;
        let r = f(dir.as_fd(), &mut self.bufs);
        if self.dirs.len() < PROC_DIRS {
            self.dirs.push((pid, dir));
        } else {
            self.dirs[self.next % PROC_DIRS] = (pid, dir);
            self.next = (self.next + 1) % PROC_DIRS;
        }
        r
    }

    /// Declare that no target can change its root directory (the filter refuses chroot,
    /// pivot_root and setns, so every target keeps the root the first one had when the filter
    /// was installed): the root link is then read once, on first need, and kept.
    pub fn set_root_fixed(&mut self, fixed: bool) {
        self.bufs.root_fixed = fixed;
        self.bufs.root_known = false;
    }

    /// Declare that no target can change its cwd without a notification that reaches
    /// [`cwd_changes`](Self::cwd_changes) first (chdir and fchdir notified or refused; the root
    /// fixed, see [`set_root_fixed`](Self::set_root_fixed)). Until a target changes its cwd,
    /// every target's cwd is the one they all started with (they descend from one process,
    /// and nothing else moves a cwd), so a path relative to it costs no /proc look-up once it
    /// has been read, where its name cannot change either: a mount root (which cannot be
    /// renamed) whose mount point lies on the targets' read-only root.
    pub fn set_cwd_changes_seen(&mut self, seen: bool) {
        self.cwd_seen = seen;
    }

    /// Target `tid` is about to change its cwd (its chdir or fchdir is being decided): the
    /// start cwd and every remembered cwd are forgotten, and cwds are read from /proc until
    /// `tid` has been seen again ([`task_seen`](Self::task_seen)). Called before that call is
    /// answered, so no remembered cwd is used once it may be stale: the change takes effect
    /// after the answer, when `tid` runs again, and the kernel also moves every task sharing
    /// `tid`'s cwd (threads, `CLONE_FS`), whose calls in between are read from /proc.
    pub fn cwd_changes(&mut self, tid: u32) {
        self.start_cwd = StartCwd::Unusable;
        self.cwds.clear();
        if !self.moving.contains(&tid) {
            if self.moving.len() < MOVING_MAX {
                self.moving.push(tid);
            } else {
                self.moving_lost = true;
            }
        }
    }

    /// A notification of target `tid` has arrived (call first, for every notification): a
    /// change of cwd it made before has taken effect (it has returned from that call to make
    /// this one). Once every change has, cwds are stable until the next one.
    pub fn task_seen(&mut self, tid: u32) {
        if !self.moving.is_empty() {
            self.moving.retain(|&t| t != tid);
        }
    }

    /// A change of cwd whose thread is gone has taken effect, or never will: every
    /// [`PRUNE_EVERY`] cwds read from /proc while changes are pending, those whose thread no
    /// longer exists are dropped. (A thread that changes its cwd and exits without another
    /// notified call, as a `subprocess` child given a `cwd` may, is never seen again.) A thread
    /// that has exited but is not reaped yet still counts until a later prune.
    fn prune_moving(&mut self) {
        self.unsettled_reads = self.unsettled_reads.wrapping_add(1);
        if self.unsettled_reads.is_multiple_of(PRUNE_EVERY) {
            self.moving
                .retain(|t| Path::new(&format!("/proc/{t}")).symlink_metadata().is_ok());
        }
    }

    /// Whether cwds read now stay what they are until the next [`cwd_changes`](Self::cwd_changes)
    /// (so they are remembered).
    pub fn cwds_settled(&self) -> bool {
        self.cwd_seen && self.bufs.root_fixed && self.moving.is_empty() && !self.moving_lost
    }

    /// Whether a target's cwd is the start cwd, already read: it is none of the supervisor's
    /// served directories then (those are reached only through an injected fd, by fchdir).
    pub fn cwd_is_start(&self) -> bool {
        matches!(self.start_cwd, StartCwd::Known(_))
    }

    /// [`absolute`] into `out` (replacing its contents): an absolute `path` costs no system
    /// call; a relative one reads the base directory's and the root's links from /proc (the
    /// cwd only until the start cwd is known, see
    /// [`set_cwd_changes_seen`](Self::set_cwd_changes_seen)).
    pub fn absolute_into(
        &mut self,
        pid: u32,
        dirfd: i32,
        path: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Errno> {
        if path.is_empty() {
            return Err(Errno::ENOENT);
        }
        if path.len() >= crate::mem::PATH_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if path[0] == b'/' {
            join_normalized_into(b"/", path, out);
            return Ok(());
        }
        if dirfd != libc::AT_FDCWD && dirfd < 0 {
            return Err(Errno::EBADF);
        }
        self.last_mnt = None;
        if dirfd != libc::AT_FDCWD {
            if let Some(d) = self.held_dir(pid, dirfd) {
                if let Some(base) = &d.fixed {
                    join_normalized_into(base, path, out);
                    self.last_mnt = Some((pid, dirfd, d.id.0));
                    return Ok(());
                }
            }
        }
        let mut remembered = false;
        if dirfd == libc::AT_FDCWD {
            if let StartCwd::Known(base) = &self.start_cwd {
                join_normalized_into(base, path, out);
                return Ok(());
            }
            if !self.moving.is_empty() {
                self.prune_moving();
            }
            if self.cwds_settled() {
                if let Some(c) = self.cwds.iter().find(|c| c.tid == pid) {
                    if let Some((base, mnt)) = &c.fixed {
                        join_normalized_into(base, path, out);
                        self.last_mnt = Some((pid, dirfd, *mnt));
                        return Ok(());
                    }
                    remembered = true;
                }
            }
        }
        let name = ProcName::new(dirfd);
        let mut dir_id = None;
        let dir_names = std::mem::take(&mut self.dir_names);
        let named = self.with_dir(pid, |proc, bufs| {
            if dirfd == libc::AT_FDCWD {
                sys::readlinkat_into(proc, name.as_cstr(), &mut bufs.link).map_err(gone)?;
            } else {
                // statx follows the magic link to the open file itself (a pipe's or socket's
                // inode is no directory either); its mount is asked in the same call, for
                // `mount_id`, and with its inode it says which directory this is.
                let st = sys::statx_at(proc, name.as_cstr(), 0, DIR_ID_MASK).map_err(fd_err)?;
                if u32::from(st.stx_mode) & libc::S_IFMT != libc::S_IFDIR {
                    return Err(Errno::ENOTDIR);
                }
                if let Some(id) = id_of(&st) {
                    dir_id = Some(id);
                    if let Some(Dir {
                        fixed: Some(base), ..
                    }) = dir_names.iter().find(|d| d.id == id)
                    {
                        bufs.base.clone_from(base);
                        return Ok(true);
                    }
                }
                sys::readlinkat_into(proc, name.as_cstr(), &mut bufs.link).map_err(fd_err)?;
                if bufs.link.first() != Some(&b'/') {
                    // pipe:[..], socket:[..], anon_inode:[..]
                    return Err(Errno::ENOTDIR);
                }
            }
            if bufs.link.first() != Some(&b'/') {
                // "(unreachable)/..." and similar: not nameable from the target's root.
                return Err(Errno::ENOENT);
            }
            if !(bufs.root_fixed && bufs.root_known) {
                sys::readlinkat_into(proc, c"root", &mut bufs.root).map_err(gone)?;
                bufs.root_known = bufs.root_fixed;
            }
            strip_root_into(&bufs.root, &bufs.link, &mut bufs.root_norm, &mut bufs.base);
            Ok(false)
        });
        self.dir_names = dir_names;
        let named = named?;
        if let Some(id) = dir_id {
            self.last_mnt = Some((pid, dirfd, id.0));
            let mut fixed_name = named;
            if !named && self.bufs.root_fixed && !self.dir_names.iter().any(|d| d.id == id) {
                let fixed = match self.name_is_fixed(pid, name.as_bytes()) {
                    Ok(Some(_)) => Some(self.bufs.base.clone()),
                    _ => None,
                };
                fixed_name = fixed.is_some();
                keep(&mut self.dir_names, id.3 as usize, Dir { id, fixed });
            }
            if fixed_name {
                self.hold(pid, dirfd, id);
            }
        }
        if dirfd == libc::AT_FDCWD && self.cwd_seen && self.bufs.root_fixed {
            if matches!(self.start_cwd, StartCwd::Unknown) {
                self.start_cwd = match self.name_is_fixed(pid, b"cwd") {
                    Ok(Some(_)) => StartCwd::Known(self.bufs.base.clone()),
                    _ => StartCwd::Unusable,
                };
            } else if !remembered && self.cwds_settled() {
                let fixed = match self.name_is_fixed(pid, b"cwd") {
                    Ok(Some(mnt)) => Some((self.bufs.base.clone(), mnt)),
                    _ => None,
                };
                keep(&mut self.cwds, pid as usize, Cwd { tid: pid, fixed });
            }
        }
        join_normalized_into(&self.bufs.base, path, out);
        Ok(())
    }

    /// The named directory `pid`'s `dirfd` refers to, if that descriptor is an open file we
    /// hold (see [`Held`]).
    fn held_dir(&mut self, pid: u32, dirfd: i32) -> Option<&Dir> {
        if self.held.is_empty() {
            return None;
        }
        if self.me == 0 {
            self.me = std::process::id();
        }
        let me = self.me;
        let mut refused = false;
        let found = self.held.iter().position(|h| {
            h.fd == dirfd
                && match sys::same_file(pid, dirfd, me, h.file.as_fd()) {
                    Ok(same) => same,
                    Err(e) => {
                        // No kcmp here (or no ptrace access to this target): stop holding.
                        refused |= matches!(e, Errno::ENOSYS | Errno::EPERM | Errno::EACCES);
                        false
                    }
                }
        });
        if refused {
            self.hold_refused = true;
            self.held.clear();
            return None;
        }
        let id = self.held[found?].id;
        self.dir_names.iter().find(|d| d.id == id)
    }

    /// Hold `pid`'s `dirfd`, just named as directory `id` whose name cannot change, so that
    /// its next uses are recognised by one kcmp (see [`Held`]).
    fn hold(&mut self, pid: u32, dirfd: i32, id: DirId) {
        if self.hold_refused {
            return;
        }
        let file = match sys::take_file(pid, dirfd) {
            Ok(f) => f,
            Err(Errno::EPERM | Errno::EACCES | Errno::ENOSYS) => {
                self.hold_refused = true;
                return;
            }
            Err(_) => return,
        };
        // The number may have been closed and reused since it was named: held only if it is
        // still that directory.
        let st = sys::statx_at(file.as_fd(), c"", libc::AT_EMPTY_PATH, DIR_ID_MASK);
        if st.ok().as_ref().and_then(id_of) != Some(id) {
            return;
        }
        let held = Held {
            fd: dirfd,
            id,
            file,
        };
        // Another open of the same directory under the same number replaces the last one.
        match self.held.iter_mut().find(|h| h.fd == dirfd && h.id == id) {
            Some(h) => *h = held,
            None => keep(&mut self.held, dirfd as usize, held),
        }
    }

    /// Whether the name of `pid`'s cwd (`bufs.base`, just read) can change only by a change of
    /// cwd, and if so the cwd's mount. Walking up from the cwd, every directory must be a
    /// mount root (rename refuses it, and its name is its mount point's, one level up) or lie
    /// on a read-only mount (nothing can be renamed through it), until one lies on the root's
    /// mount, which must be read-only (nothing there or above can be renamed). The cwd's bind
    /// in a jail passes (on the root, or on the jail's own `/tmp`, itself a mount on the root),
    /// and so does any directory of the jail's read-only root or binds.
    ///
    /// `start` names the directory in `/proc/<pid>` (`cwd` or `fd/<n>`).
    fn name_is_fixed(&mut self, pid: u32, start: &[u8]) -> Result<Option<u64>, Errno> {
        // One level per component of the directory's name, and the root.
        let levels = self
            .bufs
            .base
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .count();
        self.with_dir(pid, |proc, _| {
            let mnt = libc::STATX_MNT_ID;
            let read_only = |name: &CStr| -> Result<bool, Errno> {
                let fd = nix::fcntl::openat(
                    proc,
                    name,
                    OFlag::O_PATH | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )?;
                let fs = nix::sys::statvfs::fstatvfs(&fd)?;
                Ok(fs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
            };
            let root = sys::statx_at(proc, c"root", 0, mnt)?;
            let mut name = start.to_vec();
            let mut cwd_mnt = None;
            for _ in 0..=levels {
                let c = std::ffi::CString::new(name.clone()).map_err(|_| Errno::EINVAL)?;
                let dir = sys::statx_at(proc, &c, 0, mnt)?;
                if dir.stx_mask & mnt == 0 {
                    return Ok(None);
                }
                let cwd_mnt = *cwd_mnt.get_or_insert(dir.stx_mnt_id);
                if dir.stx_mnt_id == root.stx_mnt_id {
                    return Ok(read_only(c"root")?.then_some(cwd_mnt));
                }
                if !is_mount_root(&dir) && !read_only(&c)? {
                    return Ok(None);
                }
                name.extend_from_slice(b"/..");
            }
            Ok(None)
        })
    }

    /// The mount id of what the target's `dirfd` (its cwd for AT_FDCWD) refers to.
    /// Known without a look-up when it is the base the last [`absolute_into`](Self::absolute_into)
    /// of that target and dirfd used and it asked or remembered its mount.
    pub fn mount_id(&mut self, pid: u32, dirfd: i32) -> Result<u64, Errno> {
        if dirfd != libc::AT_FDCWD && dirfd < 0 {
            return Err(Errno::EBADF);
        }
        if let Some((p, d, mnt)) = self.last_mnt.take() {
            if (p, d) == (pid, dirfd) {
                return Ok(mnt);
            }
        }
        let name = ProcName::new(dirfd);
        self.with_dir(pid, |proc, _| {
            sys::statx_at(proc, name.as_cstr(), 0, libc::STATX_MNT_ID).map(|st| st.stx_mnt_id)
        })
    }
}

/// Remember `item` among at most [`PROC_DIRS`]: once full, in the slot `hint` picks (any
/// slot will do: what is forgotten is read from /proc again).
fn keep<T>(v: &mut Vec<T>, hint: usize, item: T) {
    if v.len() < PROC_DIRS {
        v.push(item);
    } else {
        v[hint % PROC_DIRS] = item;
    }
}

/// `link` in the target's view given its `root` (both as /proc shows them) into `out`: the
/// byte form of [`strip_root`] (the kernel's links have no `.` or `..` components, so
/// normalising before or after stripping is the same).
fn strip_root_into(root: &[u8], link: &[u8], root_norm: &mut Vec<u8>, out: &mut Vec<u8>) {
    join_normalized_into(b"/", root, root_norm);
    join_normalized_into(b"/", link, out);
    let r = root_norm.as_slice();
    if r == b"/" {
        return;
    }
    if out.as_slice() == r {
        out.truncate(1);
    } else if out.starts_with(r) && out.get(r.len()) == Some(&b'/') {
        out.drain(..r.len());
    }
    // Otherwise outside the target's root (it escaped or holds an fd from outside): our view.
}

/// Byte form of [`join_normalized`] into `out` (replacing its contents): `base` joined with
/// `rel`, `//`, `.` and `..` folded (`..` at `/` stays at `/`), no trailing slash; an absolute
/// `rel` replaces `base`. Allocates only while `out` grows.
pub fn join_normalized_into(base: &[u8], rel: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(b'/');
    let push = |c: &[u8], out: &mut Vec<u8>| match c {
        b"" | b"." => {}
        b".." => {
            let cut = out.iter().rposition(|&b| b == b'/').unwrap_or(0);
            out.truncate(cut.max(1));
        }
        c => {
            if out.len() > 1 {
                out.push(b'/');
            }
            out.extend_from_slice(c);
        }
    };
    if rel.first() != Some(&b'/') {
        for c in base.split(|&b| b == b'/') {
            push(c, out);
        }
    }
    for c in rel.split(|&b| b == b'/') {
        push(c, out);
    }
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

/// A missing `/proc/<pid>/fd/<n>` means the target has no such fd.
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
    fn a_change_of_cwd_by_a_thread_that_is_gone_settles() {
        // A process that changed its cwd and exited (reaped) is never seen again: after a few
        // cwds read from /proc its change no longer keeps cwds from being remembered.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let mut view = ProcView::default();
        view.set_root_fixed(true);
        view.set_cwd_changes_seen(true);
        let me = std::process::id();
        let mut out = Vec::new();
        view.absolute_into(me, libc::AT_FDCWD, b"x", &mut out)
            .unwrap();
        view.cwd_changes(gone);
        assert!(!view.cwds_settled());
        for _ in 0..PRUNE_EVERY {
            view.absolute_into(me, libc::AT_FDCWD, b"x", &mut out)
                .unwrap();
        }
        assert!(view.cwds_settled());
        // A live one keeps them from it until it is seen again.
        view.cwd_changes(me);
        for _ in 0..2 * PRUNE_EVERY {
            view.absolute_into(me, libc::AT_FDCWD, b"x", &mut out)
                .unwrap();
        }
        assert!(!view.cwds_settled());
        view.task_seen(me);
        assert!(view.cwds_settled());
        let cwd = std::env::current_dir().unwrap().join("x");
        assert_eq!(out, cwd.as_os_str().as_encoded_bytes());
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

    #[test]
    fn byte_normalisation_matches_the_path_one() {
        let parts = ["", "/", "//", ".", "..", "a", "b", "...", ".x", "x.."];
        let mut out = Vec::new();
        // Every sequence of up to four parts joined by `/`, as base and as relative path.
        let mut seqs = vec![String::new()];
        for _ in 0..4 {
            let more: Vec<String> = seqs
                .iter()
                .flat_map(|s| parts.iter().map(move |p| format!("{s}/{p}")))
                .collect();
            seqs.extend(more.iter().map(|s| s[1..].to_owned()));
            seqs.extend(more);
            seqs.sort();
            seqs.dedup();
            if seqs.len() > 4000 {
                break;
            }
        }
        for rel in &seqs {
            for base in ["/", "/home/u", "/a/b/c"] {
                join_normalized_into(base.as_bytes(), rel.as_bytes(), &mut out);
                let want = join_normalized(Path::new(base), Path::new(rel));
                assert_eq!(
                    out,
                    want.as_os_str().as_encoded_bytes(),
                    "{base:?} + {rel:?}"
                );
            }
        }
    }

    #[test]
    fn byte_root_stripping_matches_the_path_one() {
        let (mut r, mut out) = (Vec::new(), Vec::new());
        for (root, link) in [
            ("/", "/a/b"),
            ("/srv/realm", "/srv/realm/home"),
            ("/srv/realm", "/srv/realm"),
            ("/srv/realm", "/srv/realmx/a"),
            ("/srv/realm", "/elsewhere"),
            ("/srv/realm", "/srv/realm/x (deleted)"),
        ] {
            strip_root_into(root.as_bytes(), link.as_bytes(), &mut r, &mut out);
            let want = strip_root(Path::new(root), Path::new(link));
            assert_eq!(out, want.as_os_str().as_encoded_bytes(), "{root} {link}");
        }
    }

    #[test]
    fn proc_view_resolves_like_the_one_off_form() {
        let me = std::process::id();
        let mut v = ProcView::default();
        let mut out = Vec::new();
        let dir = std::fs::File::open("/tmp").unwrap();
        let dirfd = std::os::fd::AsRawFd::as_raw_fd(&dir);
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let filefd = std::os::fd::AsRawFd::as_raw_fd(&file);
        for _ in 0..3 {
            for (fd, p) in [
                (libc::AT_FDCWD, &b"x/../y"[..]),
                (dirfd, b"a/./b"),
                (12345, b"/etc/./hosts"),
                (libc::AT_FDCWD, b""),
                (100_000, b"rel"),
                (-5, b"rel"),
                (filefd, b"rel"),
            ] {
                let c = std::ffi::CString::new(p).unwrap();
                let want = absolute(me, fd, &c);
                let got = v.absolute_into(me, fd, p, &mut out);
                match want {
                    Ok(w) => {
                        assert_eq!(got, Ok(()));
                        assert_eq!(out, w.as_os_str().as_encoded_bytes());
                    }
                    Err(e) => assert_eq!(got, Err(e), "{fd} {p:?}"),
                }
            }
        }
        assert_eq!(v.dirs.len(), 1, "one cached /proc directory for one pid");
        v.set_root_fixed(true);
        for _ in 0..2 {
            v.absolute_into(me, libc::AT_FDCWD, b"x", &mut out).unwrap();
            let want = std::env::current_dir().unwrap().join("x");
            assert_eq!(out, want.as_os_str().as_encoded_bytes());
            assert!(v.bufs.root_known);
        }
        let cwd_mnt = v.mount_id(me, libc::AT_FDCWD).unwrap();
        assert!(cwd_mnt > 0);
        assert_eq!(v.mount_id(me, 100_000), Err(Errno::ENOENT));
    }

    #[test]
    fn a_stale_proc_directory_never_answers_for_a_reused_pid() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let stale = open(
            format!("/proc/{}", child.id()).as_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let mut v = ProcView::default();
        let mut out = Vec::new();
        // The dead child's directory filed under the child's pid: ENOENT, as for any gone task.
        v.dirs.push((child.id(), stale.try_clone().unwrap()));
        assert_eq!(
            v.absolute_into(child.id(), libc::AT_FDCWD, b"x", &mut out),
            Err(Errno::ENOENT)
        );
        // ... and filed under a pid in use again (ours): resolved through a fresh directory.
        v.dirs.clear();
        v.dirs.push((me, stale));
        v.absolute_into(me, libc::AT_FDCWD, b"x", &mut out).unwrap();
        let cwd = std::env::current_dir().unwrap().join("x");
        assert_eq!(out, cwd.as_os_str().as_encoded_bytes());
        assert_eq!(v.dirs.len(), 1);
    }

    #[test]
    fn proc_view_keeps_a_bounded_number_of_directories() {
        let mut v = ProcView::default();
        let mut out = Vec::new();
        let me = std::process::id();
        // Pids that do not exist fail without being cached; our own is cached once.
        for pid in [u32::MAX - 1, u32::MAX - 2] {
            assert_eq!(
                v.absolute_into(pid, libc::AT_FDCWD, b"x", &mut out),
                Err(Errno::ENOENT)
            );
        }
        assert!(v.dirs.is_empty());
        v.absolute_into(me, libc::AT_FDCWD, b"x", &mut out).unwrap();
        assert_eq!(v.dirs.len(), 1);
        let mut kids: Vec<_> = (0..PROC_DIRS + 3)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("100")
                    .spawn()
                    .unwrap()
            })
            .collect();
        for k in &kids {
            v.absolute_into(k.id(), libc::AT_FDCWD, b"x", &mut out)
                .unwrap();
            assert!(v.dirs.len() <= PROC_DIRS);
        }
        // The most recent ones are kept.
        let last = kids.last().unwrap().id();
        assert!(v.dirs.iter().any(|(p, _)| *p == last));
        for k in &mut kids {
            k.kill().unwrap();
            k.wait().unwrap();
        }
    }
}
