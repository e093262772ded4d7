//! A [`JailSpec`] turned into steps before fork: paths checked and converted once, the order of
//! mounts fixed (parents before children, hides last), so the forked init only executes.
use crate::error::JailError;
use crate::spec::{Bind, JailSpec, Net};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Where the new root is assembled in init's own mount namespace (a fresh tmpfs is mounted over
/// it after every bind source has been cloned, so nothing of the host's `/tmp` is visible).
pub const BUILD_ROOT: &str = "/tmp";

/// One step of building the proc's root, in order. Paths are absolute host paths under
/// `BUILD_ROOT` (before pivot_root) unless said otherwise.
#[derive(Debug)]
pub enum Step {
    /// Become the proc's user inside the namespace (a root supervisor's child starts as an
    /// unmapped id); capabilities in the new user namespace are kept.
    Identity {
        uid: u32,
        gid: u32,
    },
    /// Make every mount private (nothing propagates back to the host).
    PrivateMounts,
    /// Clone bind source trees (open_tree) before the build root is covered.
    CloneSources,
    /// A tmpfs at `BUILD_ROOT`: the future `/`.
    BuildRoot,
    Dir {
        path: CString,
        mode: u32,
    },
    /// An empty file (mount point for a file bind).
    File {
        path: CString,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    /// Attach the cloned tree of bind `index` at `path`.
    Attach {
        index: usize,
        path: CString,
    },
    Tmpfs {
        path: CString,
        data: CString,
        flags: u64,
    },
    Proc {
        path: CString,
    },
    Devpts {
        path: CString,
    },
    /// Read-only over-mount of `/proc/sys`-like paths onto themselves.
    ReadOnly {
        path: CString,
    },
    Write {
        path: CString,
        data: Vec<u8>,
        mode: u32,
    },
    /// A copy of source `index` (a host file opened at [`Step::CloneSources`], at most
    /// `COPY_MAX` bytes, read-only like the root) at `path`: see [`crate::Bind::copy`].
    Copy {
        index: usize,
        path: CString,
    },
    /// Hide a directory (empty read-only tmpfs) or a file (empty read-only file) if present.
    Hide {
        path: CString,
        dir: bool,
    },
    Pivot,
    RootReadOnly,
    Hostname {
        name: CString,
    },
    /// The proc's own network namespace with loopback up: made by the target while init builds
    /// the root, then joined by init (see `world::private_net`).
    Loopback,
}

impl Step {
    /// Short name for error messages.
    pub fn what(&self) -> &'static str {
        match self {
            Step::Identity { .. } => "taking the proc's uid/gid",
            Step::PrivateMounts => "making mounts private",
            Step::CloneSources => "cloning a bind source (open_tree)",
            Step::BuildRoot => "mounting the new root",
            Step::Dir { .. } => "creating a directory",
            Step::File { .. } => "creating a mount point",
            Step::Symlink { .. } => "creating a symlink",
            Step::Attach { .. } => "attaching a bind (move_mount)",
            Step::Tmpfs { .. } => "mounting a tmpfs",
            Step::Proc { .. } => "mounting /proc",
            Step::Devpts { .. } => "mounting /dev/pts",
            Step::ReadOnly { .. } => "making a path read-only",
            Step::Write { .. } => "writing a generated file",
            Step::Copy { .. } => "copying a file into the root",
            Step::Hide { .. } => "hiding a path",
            Step::Pivot => "pivot_root",
            Step::RootReadOnly => "making / read-only",
            Step::Hostname { .. } => "sethostname",
            Step::Loopback => "making the proc's network namespace (loopback up)",
        }
    }
}

/// A failed step, as the child reports it: which step (index into [`Plan::steps`], or a
/// privilege stage), which bind for [`Step::CloneSources`], and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageError {
    pub step: u32,
    pub detail: u32,
    pub errno: i32,
}

/// The stages of shedding privilege (shed.rs), reported with `step` = `SHED_BASE + n`.
pub const SHED_BASE: u32 = 0x1000;
pub const SHED_STAGES: &[&str] = &[
    "setting resource limits",
    "setting securebits",
    "dropping the bounding set",
    "clearing ambient capabilities",
    "clearing capabilities (capset)",
    "no_new_privs",
    "Landlock",
    "entering the working directory",
    "joining the cgroup",
    "loading the jail's seccomp guard",
];

/// A prepared jail: the spec plus its steps and the bind sources.
#[derive(Debug)]
pub struct Plan {
    pub spec: JailSpec,
    pub steps: Vec<Step>,
    /// Bind sources (host paths) and whether each is read-write.
    pub sources: Vec<(CString, bool)>,
    /// Bind destinations inside the jail (for error messages and Landlock).
    pub source_dsts: Vec<PathBuf>,
    /// Whether each source wants an idmapped mount.
    pub idmap: Vec<bool>,
    /// Whether each source is a file to copy ([`Step::Copy`]), opened rather than cloned.
    pub copies: Vec<bool>,
    /// The supervisor makes the idmapped trees (a root supervisor with idmapped binds) once
    /// init exists and sends them to it ([`Plan::prepare_idmapped`],
    /// [`crate::send_idmapped`], [`crate::world::receive_idmapped`]).
    pub idmapped_later: bool,
    /// `/proc/<pid>/uid_map` and `gid_map` lines.
    pub uid_map: String,
    pub gid_map: String,
    pub workdir: CString,
    /// The jail's own seccomp filter (built before fork, loaded last in [`crate::shed`]).
    pub guard: Option<crate::guard::Guard>,
}

fn cstr(p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailError::Nul {
        path: p.display().to_string(),
    })
}

/// An absolute, `..`-free jail path.
fn check_abs(p: &Path) -> Result<(), JailError> {
    if !p.is_absolute() {
        return Err(JailError::Relative {
            path: p.display().to_string(),
        });
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(JailError::DotDot {
            path: p.display().to_string(),
        });
    }
    Ok(())
}

/// The largest file a [`crate::Bind::copy`] bind is copied as (the curated `/etc`'s largest
/// on Debian, `mime.types`, is ~72 KB; anything larger is bound).
pub const COPY_MAX: u64 = 256 << 10;

/// What a bind's source is, for the plan.
#[derive(Clone, Copy)]
enum Kind {
    Dir,
    File,
    /// A file shown as a copy ([`Step::Copy`]).
    Copy,
}

/// Whether a file with metadata `m` may be shown as a copy: a regular file anyone may read
/// (a copy grants nothing a bind would not), at most [`COPY_MAX`] bytes.
fn copyable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    m.is_file() && m.len() <= COPY_MAX && m.permissions().mode() & 0o444 == 0o444
}

/// `p` inside the build root.
fn built(p: &Path) -> PathBuf {
    let rel = p.strip_prefix("/").unwrap_or(p);
    Path::new(BUILD_ROOT).join(rel)
}

/// Mount-point kinds, to create parents once and in order.
struct Tree {
    dirs: std::collections::BTreeSet<PathBuf>,
}

impl Tree {
    /// Every ancestor of `p` (inside the jail), shallowest first, not yet created.
    fn parents(&mut self, p: &Path, steps: &mut Vec<Step>) -> Result<(), JailError> {
        let mut acc = PathBuf::from("/");
        let comps: Vec<_> = p.components().skip(1).collect();
        for c in comps.iter().take(comps.len().saturating_sub(1)) {
            acc.push(c);
            if self.dirs.insert(acc.clone()) {
                steps.push(Step::Dir {
                    path: cstr(&built(&acc))?,
                    mode: 0o755,
                });
            }
        }
        Ok(())
    }
}

impl JailSpec {
    /// Check every path and fix the order of the steps. Runs before fork.
    pub fn prepare(self) -> Result<Plan, JailError> {
        // Sources are cloned with the identity we were started with (the host user's, so its
        // private directories can be traversed), before taking the proc's.
        let mut steps = vec![
            Step::PrivateMounts,
            Step::CloneSources,
            Step::Identity {
                uid: self.uid,
                gid: self.gid,
            },
            Step::BuildRoot,
        ];
        let mut tree = Tree {
            dirs: Default::default(),
        };
        tree.dirs.insert(PathBuf::from("/"));

        // Binds whose source exists (and whether it is a directory, or a file to copy), the
        // last one for each destination, parents first (a bind nested in another is attached
        // after it).
        let mut uniq: Vec<(&Bind, Kind)> = Vec::new();
        let mut at_dst = std::collections::HashMap::new();
        for b in &self.binds {
            check_abs(&b.dst)?;
            let kind = match std::fs::metadata(&b.src) {
                Ok(m) if m.is_dir() => Kind::Dir,
                Ok(m) if b.copy && copyable(&m) => Kind::Copy,
                Ok(_) => Kind::File,
                Err(_) if b.optional => continue,
                Err(e) => {
                    return Err(JailError::Source {
                        path: b.src.display().to_string(),
                        source: e,
                    })
                }
            };
            match at_dst.entry(&b.dst) {
                std::collections::hash_map::Entry::Occupied(e) => uniq[*e.get()] = (b, kind),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(uniq.len());
                    uniq.push((b, kind));
                }
            }
        }
        uniq.sort_by_key(|(b, _)| b.dst.components().count());
        // A copy is written where its bind would be attached: never into another bind (which
        // shows a host directory).
        let dirs: Vec<PathBuf> = uniq
            .iter()
            .filter(|(_, k)| matches!(k, Kind::Dir))
            .map(|(b, _)| b.dst.clone())
            .collect();
        for (b, kind) in &mut uniq {
            if matches!(kind, Kind::Copy) && dirs.iter().any(|d| b.dst.starts_with(d)) {
                *kind = Kind::File;
            }
        }

        let mut sources = Vec::new();
        let mut source_dsts = Vec::new();
        let mut idmap = Vec::new();
        let mut copies = Vec::new();
        // Fixed parts of every jail.
        for (d, mode) in [("/dev", 0o755), ("/proc", 0o555), ("/tmp", 0o1777)] {
            tree.dirs.insert(PathBuf::from(d));
            steps.push(Step::Dir {
                path: cstr(&built(Path::new(d)))?,
                mode,
            });
        }
        steps.push(Step::Tmpfs {
            path: cstr(&built(Path::new("/tmp")))?,
            data: CString::new(format!("mode=1777,size={}", self.tmp_size)).expect("no NUL"),
            flags: (libc::MS_NOSUID | libc::MS_NODEV),
        });
        steps.push(Step::Proc {
            path: cstr(&built(Path::new("/proc")))?,
        });
        // Symlinks once `/tmp` is the jail's own (a script's linked directory may be there). A
        // link some other path of the jail would pass through is left out: the jail's set-up
        // would follow it out of the new root.
        let through = |l: &Path| {
            let passes = |d: &Path| d != l && d.starts_with(l);
            uniq.iter().any(|(b, _)| passes(&b.dst))
                || self.dirs.iter().any(|d| passes(d))
                || self.files.iter().any(|f| passes(&f.dst))
                || self.symlinks.iter().any(|(d, _)| passes(d))
        };
        let mut symlinks: Vec<_> = self.symlinks.iter().filter(|(d, _)| !through(d)).collect();
        symlinks.sort_by_key(|(d, _)| d.components().count());
        for (dst, target) in symlinks {
            check_abs(dst)?;
            tree.parents(dst, &mut steps)?;
            steps.push(Step::Symlink {
                target: cstr(target)?,
                path: cstr(&built(dst))?,
            });
        }
        let masked = ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"];
        for p in masked.into_iter().filter(|_| self.proc_masked) {
            steps.push(Step::ReadOnly {
                path: cstr(&built(Path::new(p)))?,
            });
        }
        dev_steps(&mut steps, &mut sources, &mut source_dsts, self.dev_tty)?;

        for (b, kind) in uniq {
            tree.parents(&b.dst, &mut steps)?;
            let path = cstr(&built(&b.dst))?;
            let index = sources.len();
            let copy = matches!(kind, Kind::Copy);
            match kind {
                Kind::Dir => {
                    if tree.dirs.insert(b.dst.clone()) {
                        steps.push(Step::Dir {
                            path: path.clone(),
                            mode: 0o755,
                        });
                    }
                }
                Kind::File => steps.push(Step::File { path: path.clone() }),
                Kind::Copy => {}
            }
            // A copy is written from its source (opened, not cloned: never read-write or
            // idmapped); a bind's source is attached.
            steps.push(if copy {
                Step::Copy { index, path }
            } else {
                Step::Attach { index, path }
            });
            sources.push((cstr(&b.src)?, b.rw && !copy));
            source_dsts.push(b.dst.clone());
            idmap.resize(index, false);
            idmap.push(b.idmap && !copy);
            copies.resize(index, false);
            copies.push(copy);
        }
        idmap.resize(sources.len(), false);
        copies.resize(sources.len(), false);
        for d in &self.dirs {
            check_abs(d)?;
            tree.parents(d, &mut steps)?;
            if tree.dirs.insert(d.clone()) {
                steps.push(Step::Dir {
                    path: cstr(&built(d))?,
                    mode: 0o755,
                });
            }
        }
        for f in &self.files {
            check_abs(&f.dst)?;
            tree.parents(&f.dst, &mut steps)?;
            steps.push(Step::Write {
                path: cstr(&built(&f.dst))?,
                data: f.contents.clone(),
                mode: 0o644,
            });
        }
        for h in &self.hides {
            check_abs(h)?;
            // Only what the jail shows needs hiding: a host path under some bind's source,
            // hidden where that bind shows it.
            let dir = std::fs::metadata(h).map(|m| m.is_dir()).unwrap_or(true);
            let mut at: Vec<PathBuf> = Vec::new();
            for b in &self.binds {
                if let Ok(rest) = h.strip_prefix(&b.src) {
                    let p = if rest.as_os_str().is_empty() {
                        b.dst.clone()
                    } else {
                        b.dst.join(rest)
                    };
                    if !at.contains(&p) {
                        at.push(p);
                    }
                }
            }
            for p in at {
                steps.push(Step::Hide {
                    path: cstr(&built(&p))?,
                    dir,
                });
            }
        }
        steps.push(Step::Pivot);
        steps.push(Step::RootReadOnly);
        steps.push(Step::Hostname {
            name: CString::new(self.hostname.clone()).map_err(|_| JailError::Nul {
                path: self.hostname.clone(),
            })?,
        });
        if self.net == Net::Loopback {
            steps.push(Step::Loopback);
        }
        let workdir = match &self.workdir {
            Some(w) => {
                check_abs(w)?;
                cstr(w)?
            }
            None => CString::new("/").expect("no NUL"),
        };
        let idmapped_later =
            idmap.iter().any(|&b| b) && nix::unistd::geteuid().is_root() && self.host_uid != 0;
        Ok(Plan {
            uid_map: format!("{} {} 1\n", self.uid, self.host_uid),
            gid_map: format!("{} {} 1\n", self.gid, self.host_gid),
            spec: self,
            steps,
            idmapped_later,
            sources,
            source_dsts,
            idmap,
            copies,
            workdir,
            guard: None,
        })
    }
}

/// The harmless character devices a jail's /dev binds from the host (those the host has), each
/// read-write (Landlock lets the proc write them): /dev/tty only with a terminal.
pub(crate) fn dev_nodes(tty: bool) -> Vec<PathBuf> {
    ["null", "zero", "full", "random", "urandom", "tty"]
        .into_iter()
        .filter(|n| tty || *n != "tty")
        .map(|name| PathBuf::from("/dev").join(name))
        .filter(|host| std::fs::metadata(host).is_ok())
        .collect()
}

/// A minimal /dev: a tmpfs with the harmless character devices bound from the host, a private
/// devpts, shm, and the usual symlinks.
fn dev_steps(
    steps: &mut Vec<Step>,
    sources: &mut Vec<(CString, bool)>,
    dsts: &mut Vec<PathBuf>,
    tty: bool,
) -> Result<(), JailError> {
    steps.push(Step::Tmpfs {
        path: cstr(&built(Path::new("/dev")))?,
        data: CString::new("mode=0755,size=64k").expect("no NUL"),
        flags: (libc::MS_NOSUID | libc::MS_NOEXEC),
    });
    for host in dev_nodes(tty) {
        let path = cstr(&built(&host))?;
        steps.push(Step::File { path: path.clone() });
        steps.push(Step::Attach {
            index: sources.len(),
            path,
        });
        // Device nodes are written (null, tty): their bind stays read-write, which grants
        // nothing beyond the node itself.
        sources.push((cstr(&host)?, true));
        dsts.push(host);
    }
    for (d, mode) in [("/dev/pts", 0o755), ("/dev/shm", 0o1777)] {
        steps.push(Step::Dir {
            path: cstr(&built(Path::new(d)))?,
            mode,
        });
    }
    steps.push(Step::Devpts {
        path: cstr(&built(Path::new("/dev/pts")))?,
    });
    steps.push(Step::Tmpfs {
        path: cstr(&built(Path::new("/dev/shm")))?,
        data: CString::new("mode=1777,size=256m").expect("no NUL"),
        flags: (libc::MS_NOSUID | libc::MS_NODEV),
    });
    for (link, target) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
        ("/dev/core", "/proc/kcore"),
    ] {
        if link == "/dev/core" {
            continue;
        }
        steps.push(Step::Symlink {
            target: CString::new(target).expect("no NUL"),
            path: cstr(&built(Path::new(link)))?,
        });
    }
    Ok(())
}

impl Plan {
    /// One line describing a failure reported by the child.
    pub fn describe(&self, e: StageError) -> String {
        let errno = nix::errno::Errno::from_raw(e.errno).desc();
        if e.step >= SHED_BASE {
            let what = SHED_STAGES
                .get((e.step - SHED_BASE) as usize)
                .copied()
                .unwrap_or("dropping privileges");
            return format!("jail: {what} failed: {errno}");
        }
        let Some(step) = self.steps.get(e.step as usize) else {
            return format!("jail: set-up failed: {errno}");
        };
        let path = match step {
            Step::CloneSources => self
                .sources
                .get(e.detail as usize)
                .map(|(s, _)| s.to_string_lossy().into_owned()),
            Step::Dir { path, .. }
            | Step::File { path }
            | Step::Symlink { path, .. }
            | Step::Attach { path, .. }
            | Step::Tmpfs { path, .. }
            | Step::Proc { path }
            | Step::Devpts { path }
            | Step::ReadOnly { path }
            | Step::Write { path, .. }
            | Step::Copy { path, .. }
            | Step::Hide { path, .. } => Some(
                path.to_string_lossy()
                    .strip_prefix(BUILD_ROOT)
                    .unwrap_or("/")
                    .to_owned(),
            ),
            _ => None,
        };
        let path = path.map(|p| format!(" {p}")).unwrap_or_default();
        let what = match step {
            Step::CloneSources if self.copies.get(e.detail as usize) == Some(&true) => {
                "opening a file to copy"
            }
            _ => step.what(),
        };
        format!("jail: {what}{path} failed: {errno}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_readable_files_marked_copyable_are_copied_and_the_rest_bound() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let small = d.path().join("small");
        std::fs::write(&small, "x").unwrap();
        let big = d.path().join("big");
        std::fs::write(&big, vec![0u8; COPY_MAX as usize + 1]).unwrap();
        let private = d.path().join("private");
        std::fs::write(&private, "x").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds
            .push(Bind::ro(&small).at("/etc/small").copyable());
        spec.binds.push(Bind::ro(&small).at("/etc/plain"));
        spec.binds.push(Bind::ro(&big).at("/etc/big").copyable());
        spec.binds
            .push(Bind::ro(&private).at("/etc/private").copyable());
        // Into a directory another bind shows: bound, never written into that directory.
        spec.binds.push(Bind::ro(d.path()).at("/shown"));
        spec.binds
            .push(Bind::ro(&small).at("/shown/inner").copyable());
        let plan = spec.prepare().unwrap();
        let built = |p: &str| CString::new(format!("{BUILD_ROOT}{p}")).unwrap();
        let copied: Vec<_> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Copy { index, path } => {
                    assert!(plan.copies[*index]);
                    Some((plan.sources[*index].0.clone(), path.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            copied,
            [(
                CString::new(small.to_str().unwrap()).unwrap(),
                built("/etc/small")
            )]
        );
        for p in ["/etc/plain", "/etc/big", "/etc/private", "/shown/inner"] {
            assert!(
                plan.steps
                    .iter()
                    .any(|s| matches!(s, Step::Attach { path, .. } if *path == built(p))),
                "{p} is bound"
            );
        }
        assert_eq!(plan.copies.iter().filter(|&&c| c).count(), 1);
        assert_eq!(plan.copies.len(), plan.sources.len());
        // A copy that cannot be opened says so, with its host path.
        let clone_step = plan
            .steps
            .iter()
            .position(|s| matches!(s, Step::CloneSources))
            .unwrap();
        let index = plan.copies.iter().position(|&c| c).unwrap();
        let msg = plan.describe(StageError {
            step: clone_step as u32,
            detail: index as u32,
            errno: libc::EACCES,
        });
        assert!(
            msg.starts_with(&format!("jail: opening a file to copy {}", small.display())),
            "{msg}"
        );
    }

    #[test]
    fn a_symlink_another_path_of_the_jail_passes_through_is_left_out() {
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/usr/share").at("/tmp/link/data"));
        spec.symlinks
            .push(("/tmp/link".into(), "/elsewhere".into()));
        spec.symlinks
            .push(("/tmp/alone".into(), "/elsewhere".into()));
        let plan = spec.prepare().unwrap();
        let links: Vec<_> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Symlink { path, .. } => Some(path.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        assert!(links.iter().any(|p| p.ends_with("/tmp/alone")), "{links:?}");
        assert!(!links.iter().any(|p| p.ends_with("/tmp/link")), "{links:?}");
    }

    #[test]
    fn parents_come_before_children_and_hides_last() {
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/usr/share").at("/a/b/c"));
        spec.binds.push(Bind::ro("/usr").at("/a"));
        spec.hides.push(PathBuf::from("/usr/share/doc"));
        let plan = spec.prepare().unwrap();
        let pos = |want: &str| {
            plan.steps
                .iter()
                .position(|s| match s {
                    Step::Attach { path, .. } => path.to_str().unwrap() == want,
                    _ => false,
                })
                .unwrap()
        };
        assert!(pos("/tmp/a") < pos("/tmp/a/b/c"));
        let hides: Vec<_> = plan
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Step::Hide { path, .. } => Some((i, path.to_str().unwrap().to_owned())),
                _ => None,
            })
            .collect();
        // Hidden wherever a bind shows it, after every attach.
        let at: Vec<_> = hides.iter().map(|(_, p)| p.as_str()).collect();
        assert!(
            at.contains(&"/tmp/a/share/doc") && at.contains(&"/tmp/a/b/c/doc"),
            "{at:?}"
        );
        assert!(hides.iter().all(|(i, _)| *i > pos("/tmp/a/b/c")));
        assert!(matches!(plan.steps[0], Step::PrivateMounts));
        assert_eq!(plan.uid_map, format!("1000 {} 1\n", plan.spec.host_uid));
    }

    #[test]
    fn relative_and_dotdot_destinations_are_refused() {
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/usr").at("usr"));
        assert!(matches!(spec.prepare(), Err(JailError::Relative { .. })));
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/usr").at("/x/../etc"));
        assert!(matches!(spec.prepare(), Err(JailError::DotDot { .. })));
    }

    #[test]
    fn missing_source_is_an_error_unless_optional() {
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/no/such/dir").optional());
        let plan = spec.prepare().unwrap();
        assert!(plan
            .sources
            .iter()
            .all(|(s, _)| s.to_str() != Ok("/no/such/dir")));
        let mut spec = JailSpec::new(1000, 1000);
        spec.binds.push(Bind::ro("/no/such/dir"));
        let e = spec.prepare().unwrap_err().to_string();
        assert!(e.contains("/no/such/dir"), "{e}");
    }
}
