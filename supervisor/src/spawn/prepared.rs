//! Everything the target needs, built before fork ([`Prepared`]): C strings and pointer arrays
//! for execve, the environment the proc gets (credentials withheld, see [`jail::env`]), the
//! served dirs to hide and denied paths to over-mount (or, jailed, the σcontainer's spec), the
//! descriptors it inherits.
#![forbid(unsafe_code)]

use crate::failure::Failure;
use crate::policy::Policy;
use anyhow::{anyhow, Context as _};
use nix::sys::signal::{SigSet, Signal};
use nix::unistd::{access, AccessFlags};
use notify::CompiledFilter;
use std::ffi::{c_char, CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Signals the supervisor handles synchronously (sigwaitinfo) instead of by default action.
pub fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(s);
    }
    set
}

/// Resolve PROGRAM as a shell would: a name with `/` as given, else the first executable match
/// on PATH. Not found → 127, not executable → 126.
pub fn find_program(arg0: &OsStr) -> Result<PathBuf, Failure> {
    let shown = arg0.to_string_lossy();
    let not_found = |what: String| Failure {
        error: anyhow!(what),
        code: 127,
    };
    if arg0.as_bytes().contains(&b'/') {
        let p = PathBuf::from(arg0);
        if !p.exists() {
            return Err(not_found(format!("{shown}: no such file")));
        }
        if p.is_dir() || access(&p, AccessFlags::X_OK).is_err() {
            return Err(Failure {
                error: anyhow!("{shown}: not an executable file"),
                code: 126,
            });
        }
        return Ok(p);
    }
    jail::view::find_on_path(arg0)
        .ok_or_else(|| not_found(format!("{shown}: command not found on PATH")))
}

/// An over-mount that makes the kernel itself refuse a denied path.
pub(super) struct DenyMount {
    pub(super) target: CString,
    pub(super) is_dir: bool,
}

/// Empty file and directory used as bind sources for denied paths; removed once the child has
/// made its mounts (the mounts keep the inodes alive).
pub struct Scratch {
    dir: PathBuf,
    pub(super) file: CString,
    pub(super) subdir: CString,
}

impl Scratch {
    fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("sigma-supervise.{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating scratch dir {}", dir.display()))?;
        let file = dir.join("empty");
        std::fs::write(&file, b"").with_context(|| format!("creating {}", file.display()))?;
        let subdir = dir.join("emptydir");
        std::fs::create_dir_all(&subdir)
            .with_context(|| format!("creating {}", subdir.display()))?;
        Ok(Scratch {
            file: cstring(file.as_os_str())?,
            subdir: cstring(subdir.as_os_str())?,
            dir,
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Everything the child needs, built before fork.
pub struct Prepared {
    pub display: String,
    pub(super) path: CString,
    pub(super) _argv: Vec<CString>,
    pub(super) _envp: Vec<CString>,
    pub(super) argv_ptrs: Vec<*const c_char>,
    pub(super) envp_ptrs: Vec<*const c_char>,
    pub(super) filter: CompiledFilter,
    pub(super) hides: Vec<CString>,
    /// Read-only bind mounts (source, target), made before the hides.
    pub(super) binds: Vec<(CString, CString)>,
    pub(super) denies: Vec<DenyMount>,
    pub(super) scratch: Option<Scratch>,
    pub(super) pin_cpu: Option<usize>,
    /// Descriptors the target inherits (close-on-exec already cleared); ours close after fork.
    pub(super) inherited: Vec<OwnedFd>,
    /// Descriptors of the supervisor's own caller the target inherits (`--pass-fd`): every
    /// other one from 3 up is closed at its exec.
    pub(super) passed: Vec<u32>,
    /// Every descriptor the target keeps from 3 up (see [`Prepared::kept_fds`]).
    pub(super) kept: Vec<u32>,
    /// The σcontainer the target runs in (`None` only with `--no-jail`).
    pub(super) jail: Option<jail::JailSpec>,
    /// The jail's own seccomp guard (jailed runs).
    pub(super) guard: Option<jail::guard::Guard>,
    /// The filter lets the target pass its listener with sendmsg(2) (see
    /// [`Prepared::pass_listener`]).
    pub(super) pass_listener: bool,
}

impl Prepared {
    /// The jailed target passes its seccomp listener over the start-up socket (SCM_RIGHTS) and
    /// execs at once, instead of waiting until the supervisor has taken the descriptor from it
    /// (one round trip between two processes fewer on the way to the program). Only where the
    /// installed filter allows sendmsg(2) outright, and only when nothing must be ready before
    /// the program's first call (not with the lazy backend, whose marks come first): then
    /// `Child::release` has nothing left to do.
    pub fn pass_listener(&mut self, on: bool) {
        self.pass_listener = on;
    }

    /// Let the target inherit `fd` (its close-on-exec flag must be clear) and set `key=value`
    /// in its environment, replacing an inherited value.
    pub fn pass_fd(&mut self, fd: OwnedFd, key: &str, value: &str) -> anyhow::Result<()> {
        self.set_env(key, value)?;
        self.inherited.push(fd);
        Ok(())
    }

    /// Let the target inherit these descriptors of the supervisor's caller besides stdio.
    pub fn keep_inherited(&mut self, fds: &[u32]) {
        self.passed = fds.to_vec();
    }

    /// Every descriptor the target keeps from 3 up, sorted (computed before fork: no
    /// allocation after it).
    pub(super) fn kept_fds(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.passed.clone();
        v.extend(self.inherited.iter().map(|f| f.as_raw_fd() as u32));
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Set `key=value` in the target's environment, replacing an inherited value.
    pub fn set_env(&mut self, key: &str, value: &str) -> anyhow::Result<()> {
        let prefix = format!("{key}=");
        self._envp
            .retain(|kv| !kv.as_bytes().starts_with(prefix.as_bytes()));
        let kv = format!("{key}={value}");
        self._envp.push(cstring(OsStr::new(&kv))?);
        self.envp_ptrs = ptrs(&self._envp);
        Ok(())
    }

    /// In the jail, a home directory the proc cannot see is replaced by its private /tmp, so
    /// tools that keep caches and settings under `~` work (for the proc's lifetime).
    pub fn home_inside_jail(&mut self) -> anyhow::Result<()> {
        let Some(spec) = &self.jail else {
            return Ok(());
        };
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let visible = home.as_deref().is_some_and(|h| {
            spec.binds
                .iter()
                .any(|b| h.starts_with(&b.dst) && std::fs::metadata(&b.src).is_ok())
        });
        if !visible {
            self.set_env("HOME", "/tmp")?;
        }
        Ok(())
    }
}

/// The seccomp programs the target installs: the profile's and, jailed, the jail's guard.
pub struct Programs {
    pub filter: CompiledFilter,
    pub guard: Option<jail::guard::Guard>,
}

pub(super) fn cstring(s: &OsStr) -> anyhow::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| anyhow!("`{}` contains a NUL byte", s.to_string_lossy()))
}

pub(super) fn ptrs(v: &[CString]) -> Vec<*const c_char> {
    v.iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

pub fn prepare(
    program: &Path,
    command: &[OsString],
    policy: &Policy,
    programs: Programs,
    pin_cpu: Option<usize>,
    jail: Option<jail::JailSpec>,
    pass_env: &[String],
) -> anyhow::Result<Prepared> {
    let Programs { filter, guard } = programs;
    let path = cstring(program.as_os_str())?;
    let argv = command
        .iter()
        .map(|a| cstring(a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The supervisor's cloud credentials are its own: the target reaches S3 only through the
    // realm server (`name/s3/...`) and the fetcher, never with the keys themselves. The same for
    // anything named like a credential, unless the user hands it through by name.
    let mut withheld = Vec::new();
    let envp = std::env::vars_os()
        .filter(|(k, v)| {
            let pass = !(jail::env::is_credential(k.as_bytes())
                || jail::env::carries_password(v.as_bytes()))
                || pass_env.iter().any(|p| p.as_bytes() == k.as_bytes());
            if !pass {
                withheld.push(k.to_string_lossy().into_owned());
            }
            pass
        })
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            cstring(OsStr::from_bytes(&kv))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !withheld.is_empty() {
        tracing::info!(
            "not passed to the proc (--pass-env NAME to pass one): {}",
            withheld.join(" ")
        );
    }
    let hides = policy
        .served()
        .iter()
        .map(|s| cstring(s.dir.as_os_str()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut denies = Vec::new();
    let mut jail = jail;
    if let Some(spec) = &mut jail {
        // In the jail the served dirs and denied paths are simply not shown: hidden where a
        // bind would show them, absent otherwise. A served prefix is an empty directory.
        for s in policy.served() {
            spec.hides.push(s.dir.clone());
            spec.dirs.push(s.prefix.clone());
        }
        for p in policy.denied_paths() {
            let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            spec.hides.push(real);
        }
    }
    for p in policy.denied_paths().iter().filter(|_| jail.is_none()) {
        // Over-mount what the path resolves to (bind and read-only remount must name the same
        // mount, and a symlink's target is what an open through it would reach).
        match std::fs::canonicalize(p).and_then(|real| Ok((std::fs::metadata(&real)?, real))) {
            Ok((m, real)) => denies.push(DenyMount {
                target: cstring(real.as_os_str())?,
                is_dir: m.is_dir(),
            }),
            // Nothing there to protect: the path rule alone answers calls on it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(path = %p.display(), "denied path does not exist; no over-mount")
            }
            Err(e) => return Err(e).with_context(|| format!("denied path {}", p.display())),
        }
    }
    let hides = if jail.is_some() { Vec::new() } else { hides };
    let scratch = if denies.is_empty() {
        None
    } else {
        Some(Scratch::create()?)
    };
    let (argv_ptrs, envp_ptrs) = (ptrs(&argv), ptrs(&envp));
    Ok(Prepared {
        display: program.display().to_string(),
        path,
        _argv: argv,
        _envp: envp,
        argv_ptrs,
        envp_ptrs,
        filter,
        hides,
        binds: Vec::new(),
        denies,
        scratch,
        pin_cpu,
        inherited: Vec::new(),
        passed: Vec::new(),
        kept: Vec::new(),
        jail,
        guard,
        pass_listener: false,
    })
}

impl Prepared {
    /// Also hide `dir` from the target (an empty read-only tmpfs over it), after the served
    /// dirs: a directory that contains a served one (a realm's cache root) hides it too.
    pub fn hide_also(&mut self, dir: &Path) -> anyhow::Result<()> {
        match &mut self.jail {
            Some(spec) => spec.hides.push(dir.to_path_buf()),
            None => self.hides.push(cstring(dir.as_os_str())?),
        }
        Ok(())
    }

    /// The σcontainer the target will run in, as it stands (`None` with `--no-jail`).
    pub fn jail(&self) -> Option<&jail::JailSpec> {
        self.jail.as_ref()
    }

    /// Show `src` to the target at `target` (an existing directory), read-only, nosuid, nodev:
    /// the kernel answers every call under it, nothing is notified. Made before the hides, so
    /// hiding a directory that contains `src` does not hide the bind.
    pub fn bind_read_only(&mut self, src: &Path, target: &Path) -> anyhow::Result<()> {
        match &mut self.jail {
            Some(spec) => spec.binds.push(jail::Bind::ro(src).at(target)),
            None => self
                .binds
                .push((cstring(src.as_os_str())?, cstring(target.as_os_str())?)),
        }
        Ok(())
    }
}
