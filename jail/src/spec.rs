//! The world of one proc as one plain value: a [`JailSpec`] (identity, the root's [`Bind`]s and
//! generated files, network, [`Limits`]) that the CLI fills and tests construct. A leaf: it
//! names no step of the set-up, which all read it ([`JailSpec::prepare`] is in `plan.rs`).
#![forbid(unsafe_code)]

use crate::hostid;
use std::path::PathBuf;
use std::time::Duration;

/// One bind of a host path into the proc's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path (resolved by the kernel at set-up; symlinks followed).
    pub src: PathBuf,
    /// Absolute path inside the jail.
    pub dst: PathBuf,
    /// Read-write (else read-only, nosuid, nodev, recursively).
    pub rw: bool,
    /// Skip silently when `src` does not exist (standard binds such as `/lib32`).
    pub optional: bool,
    /// With a root supervisor: show files owned by host root as the proc's own (an idmapped
    /// mount; see `idmap.rs`). For the user's own directories (working dir, script, --bind).
    pub idmap: bool,
    /// Where `src` is a small world-readable file, the jail may show a copy made while it is
    /// built instead of a bind (`COPY_MAX`): a file written instead of a mount made
    /// (and torn down with the jail). For the curated `/etc`'s files, never the user's binds.
    pub copy: bool,
}

impl Bind {
    pub fn ro(src: impl Into<PathBuf>) -> Bind {
        let src = src.into();
        Bind {
            dst: src.clone(),
            src,
            rw: false,
            optional: false,
            idmap: false,
            copy: false,
        }
    }
    pub fn rw(src: impl Into<PathBuf>) -> Bind {
        Bind {
            rw: true,
            ..Bind::ro(src)
        }
    }
    pub fn at(mut self, dst: impl Into<PathBuf>) -> Bind {
        self.dst = dst.into();
        self
    }
    pub fn optional(mut self) -> Bind {
        self.optional = true;
        self
    }
    pub fn idmapped(mut self) -> Bind {
        self.idmap = true;
        self
    }
    pub fn copyable(mut self) -> Bind {
        self.copy = true;
        self
    }
}

/// A file the jail shows with generated contents (read-only), e.g. `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    pub dst: PathBuf,
    pub contents: Vec<u8>,
}

/// The proc's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Net {
    /// A network namespace of its own with loopback only.
    #[default]
    Loopback,
    /// The host's network namespace.
    Host,
}

/// Resource limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Processes (threads included) the proc's user may have: `RLIMIT_NPROC`, counted per user
    /// in the proc's own user namespace, plus the cgroup's `pids.max` where one can be made.
    pub pids: Option<u64>,
    /// Memory in bytes (cgroup `memory` controller; address space is not limited).
    pub memory: Option<u64>,
    /// CPUs (e.g. 1.5), through the cgroup `cpu` controller's CFS quota.
    pub cpus: Option<f64>,
}

/// The world of one proc.
#[derive(Debug, Clone)]
pub struct JailSpec {
    /// Identity inside the jail (never 0 by default).
    pub uid: u32,
    pub gid: u32,
    /// Host identity the inside ids map to: the supervisor's own ids when it is not root; an
    /// unprivileged id of the proc's own when it is ([`hostid`]).
    pub host_uid: u32,
    pub host_gid: u32,
    /// Keeps `host_uid` this proc's alone (held until the run ends; see [`hostid`]).
    pub host_lock: Option<std::sync::Arc<hostid::Lock>>,
    /// Binds, in any order (applied parents first).
    pub binds: Vec<Bind>,
    /// Generated read-only files (curated `/etc/passwd`, `/etc/group`, ...).
    pub files: Vec<GeneratedFile>,
    /// Symlinks to create in the root (dst → target), e.g. `/bin → usr/bin`.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Empty directories to create (mount points the supervisor fills later, e.g. a served
    /// library prefix).
    pub dirs: Vec<PathBuf>,
    /// Paths hidden inside the jail even when they lie under a bind (an empty read-only tmpfs over
    /// a directory, an empty file over a file): the cache, the bucket, the supervisor's state.
    pub hides: Vec<PathBuf>,
    /// Private `/tmp` size in bytes.
    pub tmp_size: u64,
    /// Directory the target starts in (must exist in the jail), else `/`.
    pub workdir: Option<PathBuf>,
    pub hostname: String,
    pub net: Net,
    pub limits: Limits,
    /// Landlock as a second layer (degrades with a warning where the kernel lacks it).
    pub landlock: bool,
    /// Files outside the jail's root that the proc may read and execute by descriptor: the
    /// numbers of descriptors the target inherits (a program handed over as a descriptor,
    /// as trampoline mode's cached binary). Landlock allows each of these files and nothing
    /// beside it; what the descriptor's own mode and owner refuse stays refused.
    pub fd_files: Vec<i32>,
    /// After the program exits: SIGTERM to what is left, then SIGKILL after this long.
    pub grace: Duration,
    /// `/dev/tty` in the jail's `/dev`: only for a proc with a terminal on its stdio. Else it
    /// would open the terminal of the session the supervisor was started from, where a proc
    /// whose output is redirected could still write, and turn echo off for the user's shell.
    pub dev_tty: bool,
    /// `/proc/sys`, `/proc/sysrq-trigger`, `/proc/irq` and `/proc/bus` read-only over-mounts.
    /// Off only for a pool's zygote, whose children each mount a `/proc` of their own (masked
    /// so): the kernel lets a user namespace mount proc only where one is fully visible.
    pub proc_masked: bool,
}

impl JailSpec {
    /// An empty world for `uid`/`gid` inside, mapped to the supervisor's identity (or, when the
    /// supervisor is root, to a host id of the proc's own).
    pub fn new(uid: u32, gid: u32) -> JailSpec {
        let host = hostid::allocate();
        JailSpec {
            uid,
            gid,
            host_uid: host.uid,
            host_gid: host.gid,
            host_lock: host.lock,
            binds: Vec::new(),
            files: Vec::new(),
            symlinks: Vec::new(),
            dirs: Vec::new(),
            hides: Vec::new(),
            tmp_size: 1 << 30,
            workdir: None,
            hostname: "sigma".into(),
            net: Net::Loopback,
            limits: Limits {
                pids: Some(512),
                ..Limits::default()
            },
            landlock: true,
            fd_files: Vec::new(),
            grace: Duration::from_secs(2),
            dev_tty: false,
            proc_masked: true,
        }
    }
}
