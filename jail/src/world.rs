//! Building the proc's root, run by init (pid 1 of the new pid namespace, root of the new user
//! namespace, single-threaded) step by step as [`Plan::steps`] lists them. Each step either
//! succeeds or returns the errno with its index, which the supervisor turns into one line.
use crate::plan::{Plan, StageError, Step, BUILD_ROOT};
use crate::sys;
use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::Mode;
use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};

fn at(step: usize, detail: usize) -> impl Fn(Errno) -> StageError {
    move |e| StageError {
        step: step as u32,
        detail: detail as u32,
        errno: e as i32,
    }
}

/// Take the proc's uid/gid inside the namespace, keeping the capabilities the namespace gives
/// (the plan's [`Step::Identity`]; nothing to do when already there). Init takes it in
/// [`build`], after cloning the bind sources with the host user's; the target, forked before,
/// takes it itself.
pub fn identity(plan: &Plan) -> Result<(), StageError> {
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::Identity { uid, gid } = step {
            become_user(*uid, *gid).map_err(at(i, 0))?;
        }
    }
    Ok(())
}

fn become_user(uid: u32, gid: u32) -> Result<(), Errno> {
    if nix::unistd::geteuid().as_raw() != uid || nix::unistd::getegid().as_raw() != gid {
        sys::prctl(libc::PR_SET_KEEPCAPS, 1, 0)?;
        let g = nix::unistd::Gid::from_raw(gid);
        let u = nix::unistd::Uid::from_raw(uid);
        nix::unistd::setresgid(g, g, g)?;
        nix::unistd::setresuid(u, u, u)?;
        sys::restore_effective_caps()?;
        // A change of uid clears the parent-death signal: init (and the target) must still
        // die with their parent, or a killed supervisor would leave the jail running.
        sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0)?;
    }
    Ok(())
}

/// In the target, before its execve: a session and process group of the proc's own, inside its
/// pid namespace (`getsid`, `getpgrp` name the target, not 0 for a leader outside it), where
/// that costs nothing: with no terminal on stdio. A terminal is the controlling terminal of one
/// session only, the user's shell's; a new session would lose it (^C, ^Z, job control).
pub fn own_session_without_terminal() {
    if !stdio_is_a_terminal() {
        let _ = nix::unistd::setsid();
    }
}

/// Whether stdin, stdout or stderr is a terminal: else the target has a session of its own
/// ([`own_session_without_terminal`]), outside the terminal's foreground group, and init
/// passes it the terminal's signals.
pub fn stdio_is_a_terminal() -> bool {
    [
        std::io::stdin().as_fd(),
        std::io::stdout().as_fd(),
        std::io::stderr().as_fd(),
    ]
    .into_iter()
    .any(|fd| nix::unistd::isatty(fd).unwrap_or(false))
}

/// The proc's own network namespace with loopback up (the plan's [`Step::Loopback`]), made by
/// the target while init builds the root: creating a network namespace is the most expensive
/// part of the jail (~0.5 ms), and this way it costs no wall time where a second CPU is free.
/// Nothing to do with `--net host`.
pub fn private_net(plan: &Plan) -> Result<(), StageError> {
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::Loopback = step {
            let err = at(i, 0);
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(&err)?;
            sys::loopback_up().map_err(&err)?;
        }
    }
    Ok(())
}

/// Init joins the network namespace the target made ([`private_net`]), so no process of the
/// jail stays in the host's. `target` is the target's pid.
pub fn join_net(plan: &Plan, target: i32) -> Result<(), StageError> {
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::Loopback = step {
            let err = at(i, 1);
            let pidfd = sys::pidfd_open(target).map_err(&err)?;
            nix::sched::setns(pidfd, nix::sched::CloneFlags::CLONE_NEWNET).map_err(&err)?;
        }
    }
    Ok(())
}

/// The steps that need no id mapping: every mount private, the bind sources cloned
/// (`open_tree`, with the host user's identity, so its private directories can be traversed).
/// Init runs them while the supervisor writes the id maps; [`build`] takes the trees. Those the
/// supervisor idmaps ([`Plan::idmapped_later`]) are left for [`receive_idmapped`].
pub fn clone_sources(plan: &Plan) -> Result<Vec<Option<OwnedFd>>, StageError> {
    let mut trees: Vec<Option<OwnedFd>> = Vec::with_capacity(plan.sources.len());
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::PrivateMounts => mount(
                None::<&CStr>,
                c"/",
                None::<&CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&CStr>,
            )
            .map_err(at(i, 0))?,
            Step::CloneSources => {
                for (j, (src, rw)) in plan.sources.iter().enumerate() {
                    if plan.idmapped_later && plan.idmap.get(j).copied().unwrap_or(false) {
                        trees.push(None);
                        continue;
                    }
                    if plan.copies.get(j).copied().unwrap_or(false) {
                        trees.push(Some(open_copied(src).map_err(at(i, j))?));
                        continue;
                    }
                    trees.push(Some(clone_source(src, *rw).map_err(at(i, j))?));
                }
            }
            _ => {}
        }
    }
    Ok(trees)
}

fn clone_source(src: &CStr, rw: bool) -> Result<OwnedFd, Errno> {
    let tree = sys::clone_tree(src)?;
    let mut attrs = sys::MOUNT_ATTR_NOSUID;
    if !rw {
        attrs |= sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV;
    }
    sys::set_tree_attrs(tree.as_fd(), attrs)?;
    Ok(tree)
}

/// In init, after [`clone_sources`] when [`Plan::idmapped_later`]: the trees the supervisor
/// idmapped, from `sock`; a source it could not idmap (a filesystem without support) is cloned
/// here as it is. Still with the host user's identity.
pub fn receive_idmapped(
    plan: &Plan,
    trees: &mut [Option<OwnedFd>],
    sock: std::os::fd::BorrowedFd<'_>,
) -> Result<(), StageError> {
    if !plan.idmapped_later {
        return Ok(());
    }
    let step = plan
        .steps
        .iter()
        .position(|s| matches!(s, Step::CloneSources))
        .unwrap_or(0);
    let sent = crate::idmap::receive(sock, trees.len()).ok_or(at(step, 0)(Errno::EPROTO))?;
    for (j, tree) in sent {
        if let Some(slot) = trees.get_mut(j) {
            *slot = Some(tree);
        }
    }
    for (j, slot) in trees.iter_mut().enumerate() {
        if slot.is_none() {
            let (src, rw) = &plan.sources[j];
            *slot = Some(clone_source(src, *rw).map_err(at(step, j))?);
        }
    }
    Ok(())
}

/// Build the root from the cloned sources ([`clone_sources`]) and pivot into it (every other
/// step but the network, made by [`private_net`], and the old root's removal, [`finish`]). On
/// return the process's `/` is the jail and its working directory is `/`.
pub fn build(plan: &Plan, trees: Vec<Option<OwnedFd>>) -> Result<(), StageError> {
    // Every directory and file is made with the mode the plan gives it (init's own umask; the
    // target, forked earlier, keeps the user's).
    nix::sys::stat::umask(Mode::empty());
    for (i, step) in plan.steps.iter().enumerate() {
        let err = at(i, 0);
        match step {
            Step::Identity { uid, gid } => become_user(*uid, *gid).map_err(&err)?,
            Step::Loopback | Step::PrivateMounts | Step::CloneSources => {}
            Step::BuildRoot => {
                let root = std::ffi::CString::new(BUILD_ROOT).expect("no NUL");
                mount(
                    Some(c"tmpfs"),
                    root.as_c_str(),
                    Some(c"tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(c"mode=0755,size=16m"),
                )
                .map_err(&err)?
            }
            Step::Dir { path, mode } => {
                // Made with the mode the jail shows (no umask here, see above); one made
                // earlier (a mount point's own root) gets it too.
                match nix::unistd::mkdir(path.as_c_str(), Mode::from_bits_truncate(*mode)) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) => {
                        let _ = nix::sys::stat::fchmodat(
                            nix::fcntl::AT_FDCWD,
                            path.as_c_str(),
                            Mode::from_bits_truncate(*mode),
                            nix::sys::stat::FchmodatFlags::FollowSymlink,
                        );
                    }
                    Err(e) => return Err(err(e)),
                }
            }
            // One call, no descriptor: mknod makes a regular file as open(O_CREAT) would.
            Step::File { path } => match nix::sys::stat::mknod(
                path.as_c_str(),
                nix::sys::stat::SFlag::S_IFREG,
                Mode::from_bits_truncate(0o644),
                0,
            ) {
                Ok(()) | Err(Errno::EEXIST) => {}
                // A mount point that already exists inside an earlier bind.
                Err(Errno::EROFS) | Err(Errno::EISDIR) => {}
                Err(e) => return Err(err(e)),
            },
            Step::Symlink { target, path } => {
                match nix::unistd::symlinkat(
                    target.as_c_str(),
                    nix::fcntl::AT_FDCWD,
                    path.as_c_str(),
                ) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Step::Attach { index, path } => {
                let tree = trees
                    .get(*index)
                    .and_then(Option::as_ref)
                    .ok_or(err(Errno::EINVAL))?;
                sys::attach_tree(tree.as_fd(), path).map_err(&err)?
            }
            Step::Tmpfs { path, data, flags } => mount(
                Some(c"tmpfs"),
                path.as_c_str(),
                Some(c"tmpfs"),
                MsFlags::from_bits_truncate(*flags as libc::c_ulong),
                Some(data.as_c_str()),
            )
            .map_err(&err)?,
            Step::Proc { path } => mount(
                Some(c"proc"),
                path.as_c_str(),
                Some(c"proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&CStr>,
            )
            .map_err(&err)?,
            Step::Devpts { path } => mount(
                Some(c"devpts"),
                path.as_c_str(),
                Some(c"devpts"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some(c"newinstance,ptmxmode=0666,mode=620"),
            )
            .map_err(&err)?,
            Step::ReadOnly { path } => match bind_read_only(path, path, MsFlags::MS_NOEXEC) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(err(e)),
            },
            Step::Copy { index, path } => {
                let from = trees
                    .get(*index)
                    .and_then(Option::as_ref)
                    .ok_or(err(Errno::EINVAL))?;
                copy_in(from.as_fd(), path).map_err(&err)?
            }
            Step::Write { path, data, mode } => {
                let fd = open(
                    path.as_c_str(),
                    OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_TRUNC | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(*mode),
                )
                .map_err(&err)?;
                let mut off = 0;
                while off < data.len() {
                    match nix::unistd::write(&fd, &data[off..]) {
                        Ok(n) => off += n,
                        Err(Errno::EINTR) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
            }
            Step::Hide { path, dir } => {
                let r = if *dir {
                    mount(
                        Some(c"tmpfs"),
                        path.as_c_str(),
                        Some(c"tmpfs"),
                        MsFlags::MS_RDONLY
                            | MsFlags::MS_NOSUID
                            | MsFlags::MS_NODEV
                            | MsFlags::MS_NOEXEC,
                        Some(c"mode=0555,size=4k"),
                    )
                } else {
                    // A file: an empty read-only file over it (its source goes before pivot).
                    hide_file(path.as_c_str())
                };
                match r {
                    // Not there, or not reachable: init looks it up as the proc's user, through
                    // the same bind, so a directory on the way that the proc may not search
                    // (EACCES) keeps the proc from it as well. Another bind that shows the path
                    // has a step of its own.
                    Ok(()) | Err(Errno::ENOENT) | Err(Errno::ENOTDIR) | Err(Errno::EACCES) => {}
                    Err(e) => return Err(err(e)),
                }
            }
            Step::Pivot => {
                let _ = nix::unistd::unlink(EMPTY);
                let root = std::ffi::CString::new(BUILD_ROOT).expect("no NUL");
                nix::unistd::chdir(root.as_c_str()).map_err(&err)?;
                // The old root goes under the new one, to be detached by `finish`.
                nix::unistd::mkdir(OLD_ROOT_IN_BUILD, Mode::S_IRWXU).map_err(&err)?;
                sys::pivot_root(c".", OLD_ROOT_IN_BUILD).map_err(&err)?;
                nix::unistd::chdir(c"/").map_err(&err)?;
            }
            // In `finish`, once the old root is gone.
            Step::RootReadOnly => {}
            Step::Hostname { name } => {
                nix::unistd::sethostname(std::ffi::OsStr::new(name.to_str().unwrap_or("sigma")))
                    .map_err(&err)?
            }
        }
    }
    Ok(())
}

/// Detach the old root (which pivot_root left at `OLD_ROOT`), remove its directory and make
/// `/` read-only: the last steps of [`build`], split off because detaching a mount tree waits
/// for an (expedited) RCU grace period, ~0.1 ms. Init runs them while the target sheds its
/// privileges; the target waits for them before it runs the program.
pub fn finish(plan: &Plan) -> Result<(), StageError> {
    for (i, step) in plan.steps.iter().enumerate() {
        let err = at(i, 0);
        match step {
            Step::Pivot => {
                // The whole old tree (every host mount the namespace was copied with).
                umount2(OLD_ROOT, MntFlags::MNT_DETACH).map_err(&err)?;
                nix::unistd::unlinkat(
                    nix::fcntl::AT_FDCWD,
                    OLD_ROOT,
                    nix::unistd::UnlinkatFlags::RemoveDir,
                )
                .map_err(&err)?;
            }
            Step::RootReadOnly => mount(
                None::<&CStr>,
                c"/",
                None::<&CStr>,
                MsFlags::MS_BIND
                    | MsFlags::MS_REMOUNT
                    | MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV,
                None::<&CStr>,
            )
            .map_err(&err)?,
            _ => {}
        }
    }
    Ok(())
}

/// Where pivot_root puts the old root (a directory of the new root until [`finish`]).
const OLD_ROOT: &CStr = c"/.sigma-old-root";
/// [`OLD_ROOT`] relative to the build root, before the pivot.
const OLD_ROOT_IN_BUILD: &CStr = c".sigma-old-root";

/// The empty file bound over hidden files, made in the build root and unlinked before pivot.
const EMPTY: &CStr = c"/tmp/.sigma-empty";

/// A source to copy ([`Step::Copy`]), opened with the host user's identity as the sources
/// to bind are cloned: a regular file (a source swapped for a FIFO or device since the plan is
/// refused, never waited on).
fn open_copied(src: &CStr) -> nix::Result<OwnedFd> {
    let from = open(
        src,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let st = nix::sys::stat::fstat(&from)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Errno::EINVAL);
    }
    Ok(from)
}

/// Copy `from` (see [`open_copied`]) to `path` in the build root: at most
/// [`crate::plan::COPY_MAX`] bytes, mode 0644. No allocation: safe in a forked child.
fn copy_in(from: std::os::fd::BorrowedFd<'_>, path: &CStr) -> nix::Result<()> {
    let to = open(
        path,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    let max = crate::plan::COPY_MAX as usize;
    let mut done = 0usize;
    loop {
        // One byte past the limit: a file grown since the plan is an error, not cut short.
        match nix::sys::sendfile::sendfile(&to, from, None, max + 1 - done) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                done += n;
                if done > max {
                    return Err(Errno::EFBIG);
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

fn hide_file(path: &CStr) -> nix::Result<()> {
    match open(
        EMPTY,
        OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o444),
    ) {
        Ok(_) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    bind_read_only(EMPTY, path, MsFlags::MS_NOEXEC)
}

/// Bind `src` at `target` (recursively), then make that mount read-only, nosuid, nodev plus
/// `extra` (a bind ignores the flags, so the remount is a second call). Two system calls, no
/// allocation: safe in a forked child.
pub fn bind_read_only(src: &CStr, target: &CStr, extra: MsFlags) -> nix::Result<()> {
    mount(
        Some(src),
        target,
        None::<&CStr>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&CStr>,
    )?;
    mount(
        None::<&CStr>,
        target,
        None::<&CStr>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | extra,
        None::<&CStr>,
    )
}
