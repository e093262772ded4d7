//! Trampoline mode: `sigma-supervise` installed as σOS's `uproc-trampoline`, the program procd
//! execs for every proc (or `sigma-supervise trampoline PID PROG true|false ARGS…`). The
//! contract is translated into the ordinary command line and run by the ordinary `run`: the
//! same jail, profile, Landlock, receive loop and exit status as any supervised run.
//!
//! ```text
//! procd ──exec──▶ uproc-trampoline PID /mnt/binfs/NAME-vV true|false ARGS…
//!   │  (this pid; procd's new mount, pid and UTS namespaces; σOS's environment only)
//!   ├─ uproc::contract  argv and SIGMACONFIG/SIGMAPRINCIPAL checked, one line if malformed
//!   ├─ uproc::config    trampoline.toml beside the binary, or /etc/sigma-supervise/
//!   ├─ uproc::program   PROG read by this pid, main thread: binary → program cache or memfd,
//!   │                script → /sigma/bin/NAME in the jail, python3 → the interpreter
//!   ├─ jail::procfs  /proc is procd's pid namespace's: this one's mounted in a mount
//!   │                namespace of the trampoline's own
//!   ├─ spproxy::dialproxy  `true`: [i32 LE len+4][SIGMAPRINCIPAL] → SIGMA_DIALPROXY_FD
//!   ├─ spproxy::relay      SIGMA_SPPROXY_FD: a pair to the supervisor, spproxyd dialled and
//!   │                a relay thread started on the proc's first request (sees Exited)
//!   ▼
//! Cli::try_parse_from(--profile P --cwd none --net … --sigma off --pass-env SIGMA… -- CMD)
//!   └─ run(): jailed target execs /proc/self/fd/N (its own /proc) or
//!             `python3 /sigma/bin/NAME ARGS`; binfs is never shown in the jail
//!   ◀ the program's exit status, or death by its signal (jail::death: as procd's pid-namespace
//!     init, a fault's signal by the fault itself); status 0 without Exited → 125
//! ```
//!
//! What a proc is, by its binfs name (`NAME-vVERSION`, the version dropped):
//! `python`, `python3`, `python3.12` run the configured interpreter with the proc's arguments
//! (binfs is not read); `NAME.py`, or a file whose `#!` line names python, is a script run as
//! `INTERPRETER /sigma/bin/NAME ARGS` (the script itself is the binfs program); another `#!`
//! script runs under the interpreter its line names; anything else is a binary.
//!
//! Network: with dialproxy (`true`) the proc has loopback only and reaches σOS through its
//! dialproxy connection; with `false` it dials σOS itself and gets the host's network, and a
//! binary runs under `nodialproxy_profile` (`sigmaos-nodialproxy`: `sigmaos` plus the sockets
//! σOS's own trampoline allows such a proc). A Python proc keeps `profile` either way: its only
//! way to σOS is the relay.
#![deny(unsafe_code)]

use crate::cli::Cli;
use crate::failure::Failure;
use crate::on_demand::OnDemand;
use anyhow::{anyhow, Context as _};
use clap::Parser as _;
use spproxy::{dialproxy, relay};
use std::ffi::OsString;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uproc::config::{self, Config};
use uproc::contract;
use uproc::program::{self, Program};

/// The name σOS's procd execs (found on its PATH).
pub const PROGRAM_NAME: &str = "uproc-trampoline";
/// The subcommand of the same mode.
pub const SUBCOMMAND: &str = "trampoline";
/// Exit status of a proc that ended with status 0 but never called Exited.
pub const NOT_EXITED_EXIT: u8 = 125;

/// The command line of trampoline mode and its plan, when this process runs in it: `None` for
/// an ordinary run; an error (one line) for a malformed contract, configuration or program.
pub fn cli() -> Option<anyhow::Result<(Cli, Plan)>> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let named = argv
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == PROGRAM_NAME);
    let rest = if named {
        &argv[1..]
    } else if argv.get(1).is_some_and(|a| a == SUBCOMMAND) {
        &argv[2..]
    } else {
        return None;
    };
    Some(build(rest))
}

/// What the ordinary run does differently for a proc of σOS's.
pub struct Plan {
    pid: String,
    /// The binary, executed by the target as `/proc/self/fd/N`.
    exec: Option<OwnedFd>,
    /// It is a file of the program cache, which Landlock must allow by its descriptor (a
    /// memfd needs no rule).
    exec_cached: bool,
    /// A script shown in the jail.
    files: Vec<jail::GeneratedFile>,
    /// binfs (PROG's directory) and the program cache: never shown in the jail.
    binfs: PathBuf,
    cache_dir: Option<PathBuf>,
    dialproxy: Option<OwnedFd>,
    /// The proc's end of its σOS connection and the relay behind it.
    spproxy: Option<OwnedFd>,
    relay: Option<relay::Unstarted>,
    seen: Option<Arc<relay::Seen>>,
    /// The configured interpreter runs the proc: its only way to σOS is the relay.
    python: bool,
    /// spproxyd's socket, shown at the same path in the jail: a binary whose σOS client dials
    /// it itself (SIGMACONFIG's `useSPProxy`); nothing else of its directory is shown.
    spproxyd: Option<PathBuf>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("pid", &self.pid)
            .field("exec", &self.exec)
            .field("binfs", &self.binfs)
            .field("python", &self.python)
            .finish_non_exhaustive()
    }
}

fn build(args: &[OsString]) -> anyhow::Result<(Cli, Plan)> {
    let contract = contract::parse(args, |k| std::env::var_os(k))?;
    let config = Config::load()?;
    let cache = config.cache_dir.as_deref().map(|dir| program::CacheAt {
        dir,
        realm: &contract.realm,
    });
    let program = program::load(&contract.prog, &contract.name, cache)?;
    // After binfs is read (by this pid, in procd's mount namespace), before anything forks.
    jail::procfs::ensure_own().map_err(|e| anyhow!("{e}"))?;
    let python = program.is_python();
    let script_at = Path::new(program::SCRIPT_DIR).join(&contract.name);
    let mut command: Vec<OsString> = Vec::new();
    let mut files = Vec::new();
    let (mut exec, mut exec_cached) = (None, false);
    match program {
        Program::Binary { fd, cached } => {
            // argv[0] as upstream gives it: PROG.
            command.push(contract.prog.clone().into_os_string());
            (exec, exec_cached) = (Some(fd), cached);
        }
        Program::Interpreter => command.push(config.interpreter.clone().into()),
        Program::Python { text } => {
            command.push(config.interpreter.clone().into());
            command.push(script_at.clone().into_os_string());
            files.push(jail::GeneratedFile {
                dst: script_at,
                contents: text,
            });
        }
        Program::Script {
            text,
            interpreter,
            arg,
        } => {
            command.push(interpreter.into_os_string());
            command.extend(arg);
            command.push(script_at.clone().into_os_string());
            files.push(jail::GeneratedFile {
                dst: script_at,
                contents: text,
            });
        }
    }
    command.extend(contract.args.iter().cloned());

    let dialproxy = match &contract.principal {
        Some(p) => Some(dialproxy::connect(&config.dialproxy_socket(), p)?),
        None => None,
    };
    // The σOS API: spproxyd's socket, relayed (or handed over as is). A Python proc has no
    // other way to σOS: no spproxyd is an error for it; a binary runs without.
    let sock = config.spproxyd_socket();
    let present = std::fs::symlink_metadata(&sock).is_ok_and(|m| m.file_type().is_socket());
    if !present && python {
        return Err(anyhow!(
            "no spproxyd socket at {} (the proc's σOS API; spproxyd_dir in {} moves it)",
            sock.display(),
            config::FILE_NAME
        ));
    }
    let (mut spproxy, mut relay, mut seen) = (None, None, None);
    let sigma: OsString = if present && config.relay {
        let s = Arc::new(relay::Seen::default());
        let (end, unstarted) =
            relay::pair(sock.clone(), Arc::clone(&s)).context("socketpair for the σOS relay")?;
        nix::fcntl::fcntl(
            &end,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| anyhow!("clearing close-on-exec on the σOS relay: {e}"))?;
        (spproxy, relay, seen) = (Some(end), Some(unstarted), Some(s));
        "off".into()
    } else if present {
        sock.into_os_string()
    } else {
        "off".into()
    };

    // σOS's procd hands no working directory of the proc's: it starts at `/`, as upstream.
    let mut argv: Vec<OsString> = vec![
        "sigma-supervise".into(),
        "--profile".into(),
        if contract.dialproxy || python {
            &config.profile
        } else {
            &config.nodialproxy_profile
        }
        .into(),
        "--cwd".into(),
        "none".into(),
        "--net".into(),
        if contract.dialproxy { "none" } else { "host" }.into(),
        "--sigma".into(),
        sigma,
    ];
    // The environment is σOS's own, made by procd: none of it is withheld as a credential.
    for (k, _) in std::env::vars_os() {
        if k.as_encoded_bytes().starts_with(b"SIGMA") {
            argv.extend(["--pass-env".into(), k]);
        }
    }
    if let (true, Some(r)) = (python, &config.realm) {
        argv.extend([
            "--bucket".into(),
            r.bucket.clone().into(),
            "--cache-dir".into(),
        ]);
        argv.push(r.cache_dir.clone().into_os_string());
        let name = r
            .name
            .clone()
            .or_else(|| Some(contract.realm.clone()).filter(|n| !n.is_empty()));
        if let Some(n) = name {
            argv.extend(["--realm".into(), n.into()]);
        }
    }
    argv.push("--".into());
    argv.extend(command);
    let cli = Cli::try_parse_from(&argv).map_err(|e| {
        let msg = e.to_string();
        anyhow!(
            "{}",
            msg.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ")
        )
    })?;
    // As upstream: the proc's exec time is when its program starts.
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        std::env::set_var("SIGMA_EXEC_TIME", now.as_micros().to_string());
    }
    let plan = Plan {
        pid: contract.pid,
        exec,
        exec_cached,
        files,
        binfs: contract
            .prog
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        cache_dir: config.cache_dir.clone(),
        dialproxy,
        spproxy,
        relay,
        seen,
        python,
        spproxyd: (contract.use_spproxy && !python && present).then(|| config.spproxyd_socket()),
    };
    Ok((cli, plan))
}

/// The relay is work the supervisor's loop starts on the proc's first request.
impl OnDemand for relay::Unstarted {
    fn readable(self: Box<Self>) -> Option<Box<dyn OnDemand>> {
        self.start_if_asked()
            .map(|r| Box::new(r) as Box<dyn OnDemand>)
    }
}

impl Plan {
    /// What the target execs instead of PROGRAM: its own `/proc/self/fd/N` (the memfd's
    /// number, the same in the target, which inherits it across fork and closes it at exec).
    pub fn exec_path(&self) -> Option<PathBuf> {
        self.exec
            .as_ref()
            .map(|fd| PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())))
    }

    /// The jail, adjusted: the script shown, nothing of `/proc/self/fd` (the view would show
    /// the program's "prefix") and nothing of binfs shown; a cached binary allowed by its
    /// descriptor alone.
    pub fn shape(&self, spec: &mut jail::JailSpec) {
        // The view shows a program's prefix: a cached binary's would be the cache's.
        let unseen: Vec<&Path> = [self.binfs.as_path(), Path::new("/mnt/binfs")]
            .into_iter()
            .chain(self.cache_dir.as_deref())
            .collect();
        spec.binds.retain(|b| {
            !b.src.starts_with("/proc") && !unseen.iter().any(|d| b.src.starts_with(d))
        });
        for dir in unseen {
            if spec.binds.iter().any(|b| dir.starts_with(&b.src)) {
                spec.hides.push(dir.to_path_buf());
            }
        }
        spec.files.extend(self.files.iter().cloned());
        if let (Some(fd), true) = (&self.exec, self.exec_cached) {
            spec.fd_files.push(fd.as_raw_fd());
        }
        if let Some(sock) = &self.spproxyd {
            // A socket's connect needs no write access to the mount; the proc sees it as its own.
            spec.binds.push(jail::Bind::ro(sock.clone()).idmapped());
        }
    }

    /// The proc's descriptors: dialproxy's and its σOS connection.
    pub fn hand_over(&mut self, prepared: &mut crate::spawn::Prepared) -> anyhow::Result<()> {
        if let Some(fd) = self.dialproxy.take() {
            let n = fd.as_raw_fd().to_string();
            prepared.pass_fd(fd, dialproxy::ENV_DIALPROXY_FD, &n)?;
        }
        if let Some(fd) = self.spproxy.take() {
            let n = fd.as_raw_fd().to_string();
            prepared.pass_fd(fd, spproxy::ENV_SPPROXY_FD, &n)?;
        }
        Ok(())
    }

    /// The relay, started by the supervisor's loop on the proc's first request.
    pub fn on_demand(&mut self) -> Option<Box<dyn OnDemand>> {
        self.relay.take().map(|r| Box::new(r) as Box<dyn OnDemand>)
    }

    /// How the run ends for procd: a status 0 without an Exited that σOS accepted (for a proc
    /// whose σOS connection is the relay) is an error, else procd would record nothing and its
    /// waiter wait forever.
    pub fn finish(&self, end: jail::init::Ended) -> Result<jail::init::Ended, Failure> {
        if let jail::init::Ended::Killed(sig) = end {
            // As procd's init, a raised signal would be ignored: a fault's is reproduced.
            jail::death::as_init_by_fault(sig);
        }
        let Some(seen) = &self.seen else {
            return Ok(end);
        };
        let relayed = self.python || seen.used.load(Ordering::Relaxed);
        if matches!(end, jail::init::Ended::Exited(0))
            && relayed
            && !seen.exited.load(Ordering::Relaxed)
            && !seen.lost.load(Ordering::Relaxed)
        {
            return Err(Failure {
                error: anyhow!(
                    "proc {}: exited with status 0 without calling Exited (σOS would record \
                     nothing and wait for it forever)",
                    self.pid
                ),
                code: NOT_EXITED_EXIT,
            });
        }
        Ok(end)
    }
}
