//! A jail completed per proc, for a pool's zygote (sigma-pool): what a zygote's view shares
//! with a run's ([`ViewKey`]), and the run's own binds as detached mount trees the zygote's
//! child attaches ([`request_trees`]).
//!
//! A zygote runs in a jail built as a cold proc's is, from the same [`JailSpec`] less what
//! belongs to one run: its working directory, the script's directory, the σOS socket, the
//! user's `--bind`s. A run may be forked from it when its own spec is the zygote's plus binds
//! ([`ViewKey::extra_binds`]); those binds the client clones here (it has the rights, the zygote
//! never sees a host path) and the child attaches them in a root of its own.
#![allow(unsafe_code)]

use crate::spec::{Bind, JailSpec};
use crate::sys;
use nix::errno::Errno;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// What a proc's world is made of, without what differs between two runs of one user
/// (the host id a root supervisor draws per proc, its lock, the working directory): equal keys
/// and a superset of binds mean the zygote's view is the run's, less those binds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ViewKey {
    /// Each bind, in a fixed form.
    pub binds: Vec<String>,
    /// Where each bind is shown, in the same order.
    pub dsts: Vec<PathBuf>,
    /// Paths hidden under the binds.
    pub hides: Vec<PathBuf>,
    /// Everything else of the spec that shapes the root, the identity and the limits, one
    /// entry per part of [`PARTS`].
    pub rest: Vec<String>,
    /// The host ids the proc's ids map to (the zygote's, for the client's idmapped trees).
    pub host_uid: u32,
    pub host_gid: u32,
}

fn bind_key(b: &Bind) -> String {
    format!("{b:?}")
}

impl ViewKey {
    /// The [`ViewKey`] of `spec`. Landlock is left out: a zygote runs without it (it would forbid
    /// the mounts its children make) and each child applies the run's own.
    pub fn of(spec: &JailSpec) -> ViewKey {
        let s = spec;
        let rest = vec![
            format!("{:?}", (s.uid, s.gid)),
            format!("{:?}", (&s.files, &s.symlinks, &s.dirs)),
            format!("{:?}", s.tmp_size),
            format!("{:?}", (&s.hostname, s.net)),
            // The pids limit is each proc's own (RLIMIT_NPROC in a user namespace of its own).
            format!("{:?}", (s.limits.memory, s.limits.cpus)),
            format!("{:?}", s.fd_files),
            format!("{:?}", s.dev_tty),
        ];
        ViewKey {
            binds: s.binds.iter().map(bind_key).collect(),
            dsts: s.binds.iter().map(|b| b.dst.clone()).collect(),
            hides: s.hides.clone(),
            rest,
            host_uid: s.host_uid,
            host_gid: s.host_gid,
        }
    }
}

/// The paths `spec` hides under `extra` binds (the child hides them as a cold jail does).
pub fn hides_under(spec: &JailSpec, extra: &[&Bind]) -> Vec<PathBuf> {
    spec.hides
        .iter()
        .filter(|h| extra.iter().any(|b| h.starts_with(&b.dst)))
        .cloned()
        .collect()
}

/// Where the proc may write: its read-write binds and the devices its /dev binds (with `/tmp`,
/// `/dev/shm` and `/dev/pts`, which every proc has), as Landlock is told in a cold jail.
pub fn writable_dsts(spec: &JailSpec) -> Vec<PathBuf> {
    spec.binds
        .iter()
        .filter(|b| b.rw)
        .map(|b| b.dst.clone())
        .chain(crate::plan::dev_nodes(spec.dev_tty))
        .collect()
}

/// What each entry of [`ViewKey::rest`] is, for the line that says which differs.
pub const PARTS: [&str; 7] = [
    "the ids inside",
    "the generated files",
    "the size of /tmp",
    "the network",
    "the memory or CPU limit",
    "the files passed by descriptor",
    "a terminal",
];

impl ViewKey {
    /// Which part of the σcontainer differs from `other`'s (a run's) beside binds, if one
    /// does. A path `other` hides is hidden here too wherever a bind of ours would show it.
    pub fn differs(&self, other: &ViewKey) -> Option<&'static str> {
        if let Some(i) = (0..PARTS.len()).find(|&i| self.rest.get(i) != other.rest.get(i)) {
            return Some(PARTS[i]);
        }
        let shown = |h: &PathBuf| self.dsts.iter().any(|d| h.starts_with(d));
        if other
            .hides
            .iter()
            .any(|h| shown(h) && !self.hides.contains(h))
        {
            return Some("a path the run hides is shown");
        }
        None
    }

    /// The binds of `run` beyond this (a zygote's) key, or why `run` cannot be forked from it:
    /// something else differs, a bind of the zygote's is not the run's, or a run's bind would
    /// cover a path the zygote's view shows or hides (the child attaches over its view).
    pub fn extra_binds<'a>(&self, run: &'a JailSpec) -> Result<Vec<&'a Bind>, String> {
        let key = ViewKey::of(run);
        if let Some(part) = self.differs(&key) {
            return Err(format!("its σcontainer differs from the zygote's: {part}"));
        }
        if let Some(b) = self.binds.iter().find(|b| !key.binds.contains(b)) {
            return Err(format!(
                "the zygote's view has a bind the run's has not: {b}"
            ));
        }
        let extra: Vec<&Bind> = run
            .binds
            .iter()
            .filter(|b| !self.binds.contains(&bind_key(b)))
            .collect();
        let covered = |p: &Path| extra.iter().any(|b| p.starts_with(&b.dst));
        if let Some(b) = run
            .binds
            .iter()
            .filter(|b| self.binds.contains(&bind_key(b)))
            .find(|b| covered(&b.dst))
        {
            return Err(format!(
                "{} is shown under the run's own bind",
                b.dst.display()
            ));
        }
        if extra
            .iter()
            .any(|b| b.dst == Path::new("/") || b.optional && !b.src.exists())
        {
            return Err("a bind of the run's cannot be attached".into());
        }
        if extra.len() > MAX_TREES {
            return Err(format!("more than {MAX_TREES} binds of its own"));
        }
        Ok(extra)
    }
}

/// A user namespace mapping root to `ids`, for idmapping a run's binds to a zygote's host ids
/// ([`request_trees`]): made once per zygote by a root pool and handed to each client with its
/// answer, so that a run does not make its own. None where it would not be used (not root, or
/// the zygote runs as root).
pub fn id_mapper(ids: (u32, u32)) -> Result<Option<OwnedFd>, String> {
    if !nix::unistd::geteuid().is_root() || ids.0 == 0 {
        return Ok(None);
    }
    crate::idmap::mapping_userns(ids.0, ids.1).map(Some)
}

/// The most binds of its own a warm run may have.
pub const MAX_TREES: usize = 32;
const _: () = assert!(MAX_TREES <= sys::MAX_PASSED_FDS);

/// Detached mount trees of `binds` (open_tree clones, read-only where the bind is), in order,
/// ready to be attached in a zygote's child. A root client idmaps a bind marked so to the
/// zygote's host ids `ids` (see `idmap.rs`); an ordinary user clones them in a user and mount
/// namespace of a short-lived helper's (open_tree needs CAP_SYS_ADMIN over the mount's
/// namespace), which sends them back. `mapper` is a user namespace that maps to `ids`
/// ([`id_mapper`], kept by the pool for its zygote): without it a root client makes one.
pub fn request_trees(
    binds: &[&Bind],
    ids: (u32, u32),
    mapper: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Vec<OwnedFd>, String> {
    let sources: Vec<(CString, bool, bool)> = binds
        .iter()
        .map(|b| {
            CString::new(b.src.as_os_str().as_encoded_bytes())
                .map(|c| (c, b.rw, b.idmap))
                .map_err(|_| format!("{}: a NUL in the path", b.src.display()))
        })
        .collect::<Result<_, _>>()?;
    if nix::unistd::geteuid().is_root() {
        let made = match mapper {
            None if sources.iter().any(|s| s.2) => id_mapper(ids)?,
            _ => None,
        };
        let userns = mapper.or(made.as_ref().map(|u| u.as_fd()));
        return sources
            .iter()
            .map(|(src, rw, idmap)| clone_one(src, *rw, userns.filter(|_| *idmap)))
            .collect();
    }
    in_helper(&sources)
}

fn attrs(rw: bool) -> u64 {
    match rw {
        true => sys::MOUNT_ATTR_NOSUID,
        false => sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV,
    }
}

fn clone_one(
    src: &CString,
    rw: bool,
    userns: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<OwnedFd, String> {
    let name = src.to_string_lossy();
    let tree = sys::clone_tree(src).map_err(|e| format!("bind {name}: open_tree: {}", e.desc()))?;
    if let Some(u) = userns {
        match sys::idmap_tree(tree.as_fd(), u) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::EOPNOTSUPP) => {}
            Err(e) => return Err(format!("bind {name}: idmapping: {}", e.desc())),
        }
    }
    sys::set_tree_attrs(tree.as_fd(), attrs(rw))
        .map_err(|e| format!("bind {name}: mount_setattr: {}", e.desc()))?;
    Ok(tree)
}

/// An ordinary user's trees: a forked helper enters a user and mount namespace of its own
/// (mapping the user to itself), clones each source and sends the trees back in one message.
fn in_helper(sources: &[(CString, bool, bool)]) -> Result<Vec<OwnedFd>, String> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let uid_map = CString::new(format!("{0} {0} 1\n", nix::unistd::geteuid())).expect("digits");
    let gid_map = CString::new(format!("{0} {0} 1\n", nix::unistd::getegid())).expect("digits");
    // SAFETY: the caller is single-threaded (a run before its threads start); the child only
    // makes system calls on data prepared above, then `_exit`s.
    let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) }
        .map_err(|e| format!("cloning the run's binds: {}", e.desc()))?;
    if pid == 0 {
        drop(ours);
        let write = |path: &std::ffi::CStr, data: &[u8]| -> bool {
            match nix::fcntl::open(
                path,
                nix::fcntl::OFlag::O_WRONLY,
                nix::sys::stat::Mode::empty(),
            ) {
                Ok(fd) => nix::unistd::write(&fd, data).is_ok(),
                Err(_) => false,
            }
        };
        let mapped = write(c"/proc/self/setgroups", b"deny")
            && write(c"/proc/self/uid_map", uid_map.as_bytes())
            && write(c"/proc/self/gid_map", gid_map.as_bytes());
        let trees: Result<Vec<OwnedFd>, String> = match mapped {
            true => sources
                .iter()
                .map(|(s, rw, _)| clone_one(s, *rw, None))
                .collect(),
            false => Err("mapping the helper's ids".into()),
        };
        let code = match trees {
            Ok(t) => {
                let fds: Vec<RawFd> = t.iter().map(|f| f.as_raw_fd()).collect();
                sys::send_with_fds(theirs.as_fd(), b"ok", &fds).map_or(1, |_| 0)
            }
            Err(why) => {
                let _ = sys::send_with_fds(theirs.as_fd(), why.as_bytes(), &[]);
                1
            }
        };
        sys::exit_now(code)
    }
    drop(theirs);
    let got = receive(ours.as_fd(), sources.len());
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    got
}

fn receive(sock: std::os::fd::BorrowedFd<'_>, n: usize) -> Result<Vec<OwnedFd>, String> {
    let mut buf = [0u8; 512];
    let (bytes, fds) = sys::recv_with_fds(sock, &mut buf)
        .map_err(|e| format!("receiving the run's binds: {e}"))?;
    let said = &buf[..bytes.min(buf.len())];
    if said != b"ok" {
        return Err(String::from_utf8_lossy(said).into_owned());
    }
    if fds.len() != n {
        return Err(format!(
            "the run's binds: {} trees for {n} binds",
            fds.len()
        ));
    }
    Ok(fds)
}
