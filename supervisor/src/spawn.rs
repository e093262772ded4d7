//! Starting the target: everything is built before fork (C strings, pointer arrays, the compiled
//! filter, the list of mounts); the child then only makes system calls:
//! new mount namespace → hide served dirs → over-mount denied paths → no_new_privs + filter →
//! hand the listener to the parent (it takes it with pidfd_getfd) → wait for "go" → execve.
//! (A jailed target may pass the listener itself and exec at once: [`Prepared::pass_listener`].)
#![forbid(unsafe_code)]

use crate::failure::Failure;
use crate::policy::Policy;
use crate::sys;
use anyhow::{anyhow, Context as _};
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::unistd::{access, AccessFlags};
use notify::CompiledFilter;
use std::ffi::{c_char, CStr, CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
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
struct DenyMount {
    target: CString,
    is_dir: bool,
}

/// Empty file and directory used as bind sources for denied paths; removed once the child has
/// made its mounts (the mounts keep the inodes alive).
pub struct Scratch {
    dir: PathBuf,
    file: CString,
    subdir: CString,
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
    path: CString,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    envp_ptrs: Vec<*const c_char>,
    filter: CompiledFilter,
    hides: Vec<CString>,
    /// Read-only bind mounts (source, target), made before the hides.
    binds: Vec<(CString, CString)>,
    denies: Vec<DenyMount>,
    scratch: Option<Scratch>,
    pin_cpu: Option<usize>,
    /// Descriptors the target inherits (close-on-exec already cleared); ours close after fork.
    inherited: Vec<OwnedFd>,
    /// Descriptors of the supervisor's own caller the target inherits (`--pass-fd`): every
    /// other one from 3 up is closed at its exec.
    passed: Vec<u32>,
    /// Every descriptor the target keeps from 3 up (see [`Prepared::kept_fds`]).
    kept: Vec<u32>,
    /// The σcontainer the target runs in (`None` only with `--no-jail`).
    jail: Option<jail::JailSpec>,
    /// The jail's own seccomp guard (jailed runs).
    guard: Option<jail::guard::Guard>,
    /// The filter lets the target pass its listener with sendmsg(2) (see
    /// [`Prepared::pass_listener`]).
    pass_listener: bool,
}

impl Prepared {
    /// The jailed target passes its seccomp listener over the start-up socket (SCM_RIGHTS) and
    /// execs at once, instead of waiting until the supervisor has taken the descriptor from it
    /// (one round trip between two processes fewer on the way to the program). Only where the
    /// installed filter allows sendmsg(2) outright, and only when nothing must be ready before
    /// the program's first call (not with the lazy backend, whose marks come first): then
    /// [`Child::release`] has nothing left to do.
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
    fn kept_fds(&self) -> Vec<u32> {
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

/// Whether an environment variable's name says it holds a credential (or leads to one): `AWS_*`,
/// and any name with TOKEN, SECRET, PASS (PASSWORD, PASSWD, PASSPHRASE, SMTP_PASS), CREDENTIAL,
/// AUTH, ACCESS_KEY, APIKEY or COOKIE in it, a word PWD, PAT or DSN (`MYSQL_PWD`, `GITHUB_PAT`,
/// `SENTRY_DSN`; not the working directory's `PWD`/`OLDPWD`), or ending in `_KEY` (API keys),
/// case-insensitively. Such variables stay with the supervisor.
pub fn is_credential(name: &[u8]) -> bool {
    let up = name.to_ascii_uppercase();
    let has = |w: &[u8]| up.windows(w.len()).any(|x| x == w);
    let word = |w: &[u8]| up.split(|&b| b == b'_').any(|x| x == w);
    up.starts_with(b"AWS_")
        || up.ends_with(b"_KEY")
        || [
            &b"TOKEN"[..],
            b"SECRET",
            b"PASS",
            b"CREDENTIAL",
            b"AUTH",
            b"ACCESS_KEY",
            b"APIKEY",
            b"COOKIE",
        ]
        .iter()
        .any(|w| has(w))
        || (up != b"PWD"
            && up != b"OLDPWD"
            && [&b"PWD"[..], b"PAT", b"DSN"].iter().any(|w| word(w)))
}

/// Whether an environment variable's value carries a password in a URL's user part
/// (`postgres://admin:pw@db/x`, `http://user:pw@proxy:3128`): withheld whatever its name.
pub fn carries_password(value: &[u8]) -> bool {
    let Some(at) = value.windows(3).position(|w| w == b"://") else {
        return false;
    };
    let rest = &value[at + 3..];
    let authority = rest
        .split(|&b| b == b'/' || b == b'?' || b == b'#')
        .next()
        .unwrap_or_default();
    match authority.iter().rposition(|&b| b == b'@') {
        Some(i) => authority[..i].contains(&b':'),
        None => false,
    }
}

#[cfg(test)]
#[test]
fn credential_names() {
    for n in [
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "gh_token",
        "DB_PASSWORD",
        "PGPASSWORD",
        "OPENAI_API_KEY",
        "AZURE_CLIENT_SECRET",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SSH_AUTH_SOCK",
        "XAUTHORITY",
        "MINIO_ACCESS_KEY_ID",
        "GPG_PASSPHRASE",
        "SMTP_PASS",
        "MYSQL_PWD",
        "GITHUB_PAT",
        "SENTRY_DSN",
        "OPENAI_APIKEY",
        "SESSION_COOKIE",
    ] {
        assert!(is_credential(n.as_bytes()), "{n}");
    }
    for v in [
        "postgres://admin:hunter2@db:5432/app",
        "http://u:pw@proxy:3128",
        "redis://:pw@cache/0",
    ] {
        assert!(carries_password(v.as_bytes()), "{v}");
    }
    for v in [
        "https://example.invalid/a:b@c",
        "postgres://db/app",
        "ssh://git@host/repo",
        "/usr/bin:/bin",
        "http://proxy:3128",
    ] {
        assert!(!carries_password(v.as_bytes()), "{v}");
    }
    for n in [
        "PATH",
        "HOME",
        "PYTHONPATH",
        "LANG",
        "TERM",
        "SIGMA_SPPROXY_FD",
        "KEYBOARD",
        "PWD",
        "OLDPWD",
        "PATH_INFO",
        "DISPLAY",
    ] {
        assert!(!is_credential(n.as_bytes()), "{n}");
    }
}

fn cstring(s: &OsStr) -> anyhow::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| anyhow!("`{}` contains a NUL byte", s.to_string_lossy()))
}

fn ptrs(v: &[CString]) -> Vec<*const c_char> {
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
            let pass = !(is_credential(k.as_bytes()) || carries_password(v.as_bytes()))
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

/// Child → parent messages on the status pipe: (tag, value), 8 bytes each.
const MSG_LISTENER: u32 = 0;
const STAGES: &[&str] = &[
    "listener",
    "unshare(CLONE_NEWNS)",
    "making / private",
    "hiding a served directory",
    "bind-mounting a directory read-only",
    "over-mounting a denied path",
    "setting CPU affinity",
    "installing the seccomp filter",
    "waiting for the supervisor",
    "execve",
];
const STAGE_UNSHARE: u32 = 1;
const STAGE_PRIVATE: u32 = 2;
const STAGE_HIDE: u32 = 3;
const STAGE_BIND: u32 = 4;
const STAGE_DENY: u32 = 5;
const STAGE_AFFINITY: u32 = 6;
const STAGE_FILTER: u32 = 7;
const STAGE_HANDOFF: u32 = 8;
pub const STAGE_EXEC: u32 = 9;

fn send(fd: &OwnedFd, tag: u32, value: i32) {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&tag.to_ne_bytes());
    msg[4..].copy_from_slice(&value.to_ne_bytes());
    let _ = nix::unistd::write(fd, &msg);
}

/// Read one 8-byte message; `None` on EOF (the child exec'd or died).
pub fn recv_msg(fd: &OwnedFd) -> Option<(u32, i32)> {
    let mut msg = [0u8; 8];
    let mut got = 0;
    while got < msg.len() {
        match nix::unistd::read(fd, &mut msg[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
    let tag = u32::from_ne_bytes(msg[..4].try_into().expect("4 bytes"));
    let value = i32::from_ne_bytes(msg[4..].try_into().expect("4 bytes"));
    Some((tag, value))
}

/// The low byte of a setup message's tag is the stage; the rest the index of the mount.
fn stage_tag(stage: u32, index: usize) -> u32 {
    stage | ((index as u32) << 8)
}

fn describe_stage(p: &Prepared, tag: u32, errno: i32) -> String {
    let (stage, index) = (tag & 0xff, (tag >> 8) as usize);
    let what = STAGES.get(stage as usize).copied().unwrap_or("setup");
    let target = match stage {
        STAGE_HIDE => p.hides.get(index).map(|c| c.to_string_lossy().into_owned()),
        STAGE_BIND => p
            .binds
            .get(index)
            .map(|(_, t)| t.to_string_lossy().into_owned()),
        STAGE_DENY => p
            .denies
            .get(index)
            .map(|d| d.target.to_string_lossy().into_owned()),
        _ => None,
    };
    let target = target.map(|t| format!(" {t}")).unwrap_or_default();
    format!(
        "{what}{target} failed in the child: {}",
        Errno::from_raw(errno).desc()
    )
}

/// The started child: its listener is ours; it waits for [`Child::go`] before execve.
pub struct Child {
    /// The process the supervisor waits for: the target itself, or the jail's init.
    pub pid: i32,
    pub display: String,
    pub listener: OwnedFd,
    /// Where the exec result arrives: an errno message, or EOF once execve succeeded.
    status_rx: OwnedFd,
    go_tx: Option<OwnedFd>,
    /// Where the jail's init writes the proc's exit status once nothing of it is left, before
    /// its own exit tears down the namespaces (see jail::init).
    pub ended_rx: Option<OwnedFd>,
    /// The jail's cgroup, removed when dropped (keep it until the run ends).
    pub cgroup: Option<jail::limits::Cgroup>,
    /// The lock that keeps the proc's host id its own (keep it until the run ends).
    pub host_lock: Option<std::sync::Arc<jail::hostid::Lock>>,
    /// `pid` is the init of the proc's pid namespace (else the target, with no jail).
    pub jailed: bool,
}

impl Child {
    /// Let the child execve. Whatever it does from then on that is notified waits in the kernel
    /// until the notification thread reads it, so the supervisor releases the child first and
    /// starts its threads while the program loads.
    pub fn release(&mut self) {
        if let Some(go) = self.go_tx.take() {
            jail::mark("go");
            let _ = nix::unistd::write(&go, b"g");
        }
    }

    /// Wait until the child has exec'd (released first if it was not); the exec failure
    /// (errno) if there was one.
    pub fn exec_result(mut self) -> Result<(), i32> {
        self.release();
        match recv_msg(&self.status_rx) {
            Some((STAGE_EXEC, errno)) => Err(errno),
            _ => Ok(()),
        }
    }
}

/// Bind `src` at `target` read-only, nosuid, nodev (child-safe: two system calls).
fn bind_read_only(src: &CStr, target: &CStr) -> nix::Result<()> {
    jail::world::bind_read_only(src, target, MsFlags::empty())
}

/// Pin the calling process to `cpu` (the notification thread gets the same one).
fn pin_to(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

fn child_main(p: &Prepared, status_tx: &OwnedFd, go_rx: &OwnedFd, old_mask: &SigSet) -> ! {
    let _ = old_mask.thread_set_mask();
    sys::default_disposition(Signal::SIGPIPE);
    let _ = sys::set_parent_death_kill();
    let fail = |stage: u32, e: Errno| -> ! {
        send(status_tx, stage, e as i32);
        sys::exit_now(125)
    };
    // A mount namespace only when there is something to hide or over-mount (its setup and
    // teardown cost a little on every run).
    if !p.hides.is_empty() || !p.denies.is_empty() || !p.binds.is_empty() {
        if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
            fail(STAGE_UNSHARE, e)
        }
        if let Err(e) = mount(
            None::<&CStr>,
            c"/",
            None::<&CStr>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&CStr>,
        ) {
            fail(STAGE_PRIVATE, e)
        }
    }
    for (i, (src, target)) in p.binds.iter().enumerate() {
        if let Err(e) = bind_read_only(src, target) {
            fail(stage_tag(STAGE_BIND, i), e)
        }
    }
    for (i, dir) in p.hides.iter().enumerate() {
        if let Err(e) = mount(
            Some(c"tmpfs"),
            dir.as_c_str(),
            Some(c"tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(c"mode=0555,size=4k"),
        ) {
            fail(stage_tag(STAGE_HIDE, i), e)
        }
    }
    if let Some(scratch) = &p.scratch {
        for (i, d) in p.denies.iter().enumerate() {
            let src = if d.is_dir {
                scratch.subdir.as_c_str()
            } else {
                scratch.file.as_c_str()
            };
            if let Err(e) = bind_read_only(src, &d.target) {
                fail(stage_tag(STAGE_DENY, i), e)
            }
        }
    }
    if let Some(cpu) = p.pin_cpu {
        if let Err(e) = pin_to(cpu) {
            fail(STAGE_AFFINITY, e)
        }
    }
    // From here on the filter applies: only read/write/close (allowed by every profile) until
    // execve. Where a path rule has execve notified, the parent's notification thread is
    // running before the parent waits for the exec (see supervisor::supervise).
    let listener = match p.filter.install() {
        Ok(fd) => fd,
        Err(e) => fail(STAGE_FILTER, e),
    };
    send(status_tx, MSG_LISTENER, listener.as_raw_fd());
    let mut b = [0u8; 1];
    match nix::unistd::read(go_rx, &mut b) {
        Ok(1) => {}
        Ok(_) => sys::exit_now(125),
        Err(e) => fail(STAGE_HANDOFF, e),
    }
    drop(listener);
    // Nothing of the supervisor's caller but stdio and what was asked for.
    jail::cloexec_fds_from_except(3, &p.kept);
    let e = sys::execve(&p.path, &p.argv_ptrs, &p.envp_ptrs);
    send(status_tx, STAGE_EXEC, e as i32);
    sys::exit_now(if e == Errno::ENOENT { 127 } else { 126 })
}

/// Fork the child, let it set itself up, and take its listener. Must run while this process has
/// one thread.
pub fn spawn(mut p: Prepared) -> Result<Child, Failure> {
    p.kept = p.kept_fds();
    if let Some(spec) = p.jail.take() {
        return spawn_jailed(p, spec);
    }
    sys::set_child_subreaper().context("PR_SET_CHILD_SUBREAPER")?;
    sys::default_disposition(Signal::SIGCHLD);
    let old_mask = handled_signals()
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .context("blocking signals")?;
    let (status_rx, status_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let pid = sys::fork().context("fork")?;
    if pid == 0 {
        drop(status_rx);
        drop(go_tx);
        child_main(&p, &status_tx, &go_rx, &old_mask)
    }
    drop(status_tx);
    drop(go_rx);
    let setup_failed = |msg: String| -> Failure {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        anyhow!("cannot start {}: {msg}", p.display).into()
    };
    let fd = match recv_msg(&status_rx) {
        Some((MSG_LISTENER, fd)) => fd,
        Some((tag, errno)) => return Err(setup_failed(describe_stage(&p, tag, errno))),
        None => return Err(setup_failed("the child exited during setup".into())),
    };
    let pidfd = sys::pidfd_open(pid, 0).context("pidfd_open")?;
    let listener = sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(|e| {
        setup_failed(format!(
            "taking the seccomp listener (pidfd_getfd): {}",
            e.desc()
        ))
    })?;
    Ok(Child {
        pid,
        display: p.display.clone(),
        listener,
        status_rx,
        go_tx: Some(go_tx),
        ended_rx: None,
        cgroup: None,
        host_lock: None,
        jailed: false,
    })
    // `p` (with the scratch bind sources) drops here: the child's mounts are made (the listener
    // only comes after them) and keep the inodes alive.
}

/// Jailed start-up messages (child → supervisor, one SEQPACKET datagram each):
/// [kind, a, b, c] as native-endian 32-bit words.
const J_LISTENER: u32 = 1;
const J_JAIL_STAGE: u32 = 2;
const J_STAGE: u32 = 3;
/// The listener itself rides along (SCM_RIGHTS) and the target is already on its way to execve.
const J_LISTENER_PASSED: u32 = 4;

fn jsend(fd: &OwnedFd, kind: u32, a: u32, b: u32, c: i32) {
    let mut msg = [0u8; 16];
    msg[..4].copy_from_slice(&kind.to_ne_bytes());
    msg[4..8].copy_from_slice(&a.to_ne_bytes());
    msg[8..12].copy_from_slice(&b.to_ne_bytes());
    msg[12..].copy_from_slice(&c.to_ne_bytes());
    let _ = nix::unistd::write(fd, &msg);
}

/// [`J_LISTENER_PASSED`] with the listener itself (SCM_RIGHTS); false if sendmsg failed (a
/// filter that refuses it), and the caller falls back to [`J_LISTENER`].
fn jsend_fd(fd: &OwnedFd, listener: BorrowedFd<'_>) -> bool {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut msg = [0u8; 16];
    msg[..4].copy_from_slice(&J_LISTENER_PASSED.to_ne_bytes());
    let fds = [listener.as_raw_fd()];
    let iov = [std::io::IoSlice::new(&msg)];
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        ) {
            Ok(16) => return true,
            Err(Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// One jailed start-up message, the sender's pid in our pid namespace (SO_PASSCRED) and the
/// descriptor it passed, if any.
fn jrecv(fd: &OwnedFd) -> Option<([u32; 4], Option<i32>, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
    let mut buf = [0u8; 16];
    let mut cmsg = nix::cmsg_space!(UnixCredentials, [RawFd; 1]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            fd.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) if m.bytes == 16 => {
                let mut pid = None;
                let mut passed = None;
                if let Ok(cmsgs) = m.cmsgs() {
                    for c in cmsgs {
                        match c {
                            ControlMessageOwned::ScmCredentials(cred) => pid = Some(cred.pid()),
                            ControlMessageOwned::ScmRights(fds) => {
                                // Owned at once, so extra ones close.
                                for f in fds.into_iter().map(sys::received_fd) {
                                    if passed.is_none() {
                                        passed = Some(f);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                let w = |i: usize| u32::from_ne_bytes(buf[i * 4..i * 4 + 4].try_into().expect("4"));
                return Some(([w(0), w(1), w(2), w(3)], pid, passed));
            }
            Ok(_) => return None,
            Err(Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
}

/// Read one byte from `fd` (a "go" from the supervisor); false on EOF or error.
fn wait_byte(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    loop {
        match nix::unistd::read(fd, &mut b) {
            Ok(1) => return true,
            Err(Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// The target's end of the start-up handshake with init.
struct WithInit {
    /// "network ready" (our network namespace exists; init joins it).
    net_tx: OwnedFd,
    /// "world ready" (the root is built and we are in it), then "world final" (the old root
    /// detached, `/` read-only: see `jail::world::finish`).
    world_rx: OwnedFd,
    /// The supervisor's "id maps written" (a pipe init reads too).
    maps_rx: OwnedFd,
}

/// The target inside the jail (pid 2): its network namespace while init builds the root, then
/// shed privilege, filter, hand the listener over, exec.
fn jailed_target(
    p: &Prepared,
    plan: &jail::Plan,
    status: &OwnedFd,
    go_rx: &OwnedFd,
    exec_tx: &OwnedFd,
    old_mask: &SigSet,
    init: WithInit,
) -> ! {
    let _ = old_mask.thread_set_mask();
    sys::default_disposition(Signal::SIGPIPE);
    let _ = sys::set_parent_death_kill();
    if let Err(e) = jail::world::private_net(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // The supervisor's word that the id maps are written (one byte of the two it writes; init
    // reads the other).
    if !wait_byte(&init.maps_rx) {
        sys::exit_now(125)
    }
    drop(init.maps_rx);
    if let Err(e) = jail::world::identity(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // The supervisor takes our listener with pidfd_getfd, and init our network namespace with
    // setns: both need us dumpable (after the change of ids, which resets it; execve decides
    // afresh for the program).
    let _ = nix::sys::prctl::set_dumpable(true);
    let _ = nix::unistd::write(&init.net_tx, b"n");
    drop(init.net_tx);
    // What needs no root, while init builds it.
    if let Err(e) = jail::shed::drop_privileges(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    // EOF: init failed (and said why) or died.
    if !wait_byte(&init.world_rx) {
        sys::exit_now(125)
    }
    jail::mark("world-seen");
    if let Err(e) = jail::shed::confine(plan) {
        jsend(status, J_JAIL_STAGE, e.step, e.detail, e.errno);
        sys::exit_now(125)
    }
    jail::mark("shed");
    if let Some(cpu) = p.pin_cpu {
        if let Err(e) = pin_to(cpu) {
            jsend(status, J_STAGE, STAGE_AFFINITY, 0, e as i32);
            sys::exit_now(125)
        }
    }
    let listener = match p.filter.install() {
        Ok(fd) => fd,
        Err(e) => {
            jsend(status, J_STAGE, STAGE_FILTER, 0, e as i32);
            sys::exit_now(125)
        }
    };
    jail::mark("filter");
    // The listener in flight in the socket stays open after our exec closes ours; else the
    // supervisor takes it from us (pidfd_getfd) and says when.
    if !(p.pass_listener && jsend_fd(status, listener.as_fd())) {
        jsend(status, J_LISTENER, listener.as_raw_fd() as u32, 0, 0);
        if !wait_byte(go_rx) {
            sys::exit_now(125)
        }
    }
    jail::mark("released");
    drop(listener);
    // Init detached the old root meanwhile (EOF: it failed, and said why).
    if !wait_byte(&init.world_rx) {
        sys::exit_now(125)
    }
    drop(init.world_rx);
    // Nothing of the supervisor's caller but stdio and what was asked for.
    jail::cloexec_fds_from_except(3, &p.kept);
    let e = sys::execve(&p.path, &p.argv_ptrs, &p.envp_ptrs);
    send(exec_tx, STAGE_EXEC, e as i32);
    sys::exit_now(if e == Errno::ENOENT { 127 } else { 126 })
}

/// Start the target in its σcontainer: clone init into new namespaces, map its ids, let it
/// build the root and fork the target, then take the target's listener.
fn spawn_jailed(mut p: Prepared, spec: jail::JailSpec) -> Result<Child, Failure> {
    use nix::sys::socket::{setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType};
    jail::userns_available().map_err(|why| anyhow!(jail::JailError::NoUserns { why }))?;
    let cgroup = jail::limits::Cgroup::create(
        &format!("sigma-supervise.{}", std::process::id()),
        &spec.limits,
    )
    .map_err(|e| anyhow!("{e}"))?;
    jail::mark("cgroup");
    let grace = spec.grace;
    let mut plan = spec.prepare().map_err(anyhow::Error::from)?;
    jail::mark("plan");
    plan.guard = match p.guard.take() {
        Some(g) => Some(g),
        None => Some(jail::guard::Guard::new().context("building the jail's seccomp guard")?),
    };
    sys::set_child_subreaper().context("PR_SET_CHILD_SUBREAPER")?;
    sys::default_disposition(Signal::SIGCHLD);
    let old_mask = handled_signals()
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .context("blocking signals")?;
    let (status_rx, status_tx) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("socketpair")?;
    setsockopt(&status_rx, sockopt::PassCred, &true).context("SO_PASSCRED")?;
    let (maps_rx, maps_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    // The idmapped trees, made while init clones the other sources (see jail's idmap.rs).
    let (ids_rx, ids_tx) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .context("socketpair")?;
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let (exec_rx, exec_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    // init's word of how the program ended (see jail::init). With a cgroup the supervisor still
    // waits for init itself to leave (removing the group must wait until it has).
    // Non-blocking: the report is read once init has gone too, when it may not be there.
    let (ended_rx, ended_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .context("pipe2")?;
    jail::mark("clone");
    let pid = jail::clone_into_namespaces(&plan.spec)
        .map_err(|e| anyhow!("cannot create the jail's namespaces: {}", e.desc()))?;
    if pid == 0 {
        // init: pid 1 of the proc's pid namespace.
        drop(status_rx);
        drop(maps_tx);
        drop(ids_tx);
        drop(go_tx);
        drop(exec_rx);
        drop(ended_rx);
        let _ = sys::set_parent_death_kill();
        let fail = |e: jail::StageError| -> ! {
            jsend(&status_tx, J_JAIL_STAGE, e.step, e.detail, e.errno);
            sys::exit_now(125)
        };
        let pipes = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .and_then(|n| Ok((n, nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)));
        let ((net_rx, net_tx), (world_rx, world_tx)) = match pipes {
            Ok(p) => p,
            Err(e) => {
                jsend(&status_tx, J_STAGE, STAGE_EXEC, 0, e as i32);
                sys::exit_now(125)
            }
        };
        // The target makes its network namespace while we build the root (see jail's docs),
        // starting at once: it is the longest step of a jailed start and needs only the
        // capabilities the new user namespace gave us, not the id maps. With a cgroup, only
        // once the supervisor has moved us into it (before the maps' byte): a process forked
        // before stays in the cgroup it was forked in, and the limits would miss the proc.
        let joined_first = cgroup.is_some();
        if joined_first && !wait_byte(&maps_rx) {
            sys::exit_now(125)
        }
        let target = match sys::fork() {
            Ok(0) => {
                drop(net_rx);
                drop(world_tx);
                drop(ids_rx);
                let init = WithInit {
                    net_tx,
                    world_rx,
                    maps_rx,
                };
                jailed_target(&p, &plan, &status_tx, &go_rx, &exec_tx, &old_mask, init)
            }
            Ok(t) => t,
            Err(e) => {
                jsend(&status_tx, J_STAGE, STAGE_EXEC, 0, e as i32);
                sys::exit_now(125)
            }
        };
        drop(net_tx);
        drop(world_rx);
        // What needs no id mapping is done while the supervisor writes the maps.
        let mut trees = match jail::world::clone_sources(&plan) {
            Ok(t) => t,
            Err(e) => fail(e),
        };
        // Dumpable only until the supervisor has written the id maps, which it does through
        // our /proc files; then nobody in the jail may read init's memory (a copy of the
        // supervisor's) or its /proc files.
        if !joined_first && !wait_byte(&maps_rx) {
            sys::exit_now(125)
        }
        let _ = nix::sys::prctl::set_dumpable(false);
        drop(maps_rx);
        jail::mark("init-maps");
        if let Err(e) = jail::world::receive_idmapped(&plan, &mut trees, ids_rx.as_fd()) {
            fail(e)
        }
        drop(ids_rx);
        if let Err(e) = jail::world::build(&plan, trees) {
            fail(e)
        }
        jail::mark("world");
        // EOF: the target failed (and said why) or died.
        if !wait_byte(&net_rx) {
            sys::exit_now(125)
        }
        if let Err(e) = jail::world::join_net(&plan, target) {
            fail(e)
        }
        let _ = nix::unistd::write(&world_tx, b"w");
        // While the target sheds its privileges (it waits for this before its execve).
        if let Err(e) = jail::world::finish(&plan) {
            fail(e)
        }
        jail::mark("world-final");
        let _ = nix::unistd::write(&world_tx, b"f");
        // init keeps nothing of the target's: no pipe, no inherited socket.
        jail::close_fds_from_except(3, ended_tx.as_fd());
        jail::init::run(target, &handled_signals(), grace, Some(ended_tx))
    }
    drop(ended_tx);
    drop(status_tx);
    drop(maps_rx);
    drop(go_rx);
    drop(exec_tx);
    let setup_failed = |msg: String| -> Failure {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        anyhow!("cannot start {}: {msg}", p.display).into()
    };
    if let Err(e) = plan.write_id_maps(pid) {
        return Err(setup_failed(e.to_string()));
    }
    if let Some(cg) = &cgroup {
        if let Err(e) = cg.join(pid) {
            return Err(setup_failed(e));
        }
    }
    jail::mark("maps");
    // One byte for init, one for the target (each reads one).
    let _ = nix::unistd::write(&maps_tx, b"gg");
    drop(maps_tx);
    drop(ids_rx);
    if plan.idmapped_later {
        if let Err(e) = plan
            .prepare_idmapped()
            .and_then(|trees| jail::send_idmapped(&trees, ids_tx.as_fd()))
        {
            return Err(setup_failed(e));
        }
        jail::mark("idmapped");
    }
    drop(ids_tx);
    let (listener, go_tx) = match jrecv(&status_rx) {
        // Already on its way to execve: nothing left to release.
        Some(([J_LISTENER_PASSED, ..], Some(_), Some(listener))) if p.pass_listener => {
            jail::mark("listener");
            (listener, None)
        }
        Some(([J_LISTENER, fd, _, _], Some(tpid), _)) => {
            jail::mark("listener");
            let pidfd = sys::pidfd_open(tpid, 0).context("pidfd_open")?;
            let listener = sys::pidfd_getfd(pidfd.as_fd(), fd as i32).map_err(|e| {
                setup_failed(format!(
                    "taking the seccomp listener (pidfd_getfd): {}",
                    e.desc()
                ))
            })?;
            (listener, Some(go_tx))
        }
        Some(([J_JAIL_STAGE, step, detail, errno], _, _)) => {
            return Err(setup_failed(plan.describe(jail::StageError {
                step,
                detail,
                errno: errno as i32,
            })))
        }
        Some(([J_STAGE, stage, _, errno], _, _)) => {
            return Err(setup_failed(describe_stage(&p, stage, errno as i32)))
        }
        _ => return Err(setup_failed("the jail's init exited during setup".into())),
    };
    Ok(Child {
        pid,
        display: p.display.clone(),
        listener,
        status_rx: exec_rx,
        go_tx,
        ended_rx: Some(ended_rx),
        cgroup,
        host_lock: plan.spec.host_lock.take(),
        jailed: true,
    })
}
