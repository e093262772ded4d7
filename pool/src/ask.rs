//! A run asks for a warm proc: what the caller knows makes it differ from a cold start
//! ([`Run::unlike`]), then [`crate::choose`]'s rules, then the pool. The answer says which
//! start the run takes, and why (shown by `--stats`).
#![forbid(unsafe_code)]

use crate::client::{self, Outcome, Started, WarmRequest};
use crate::{choose, PoolError};
use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A run as its supervisor prepared it for a cold start.
pub struct Run<'a> {
    pub argv: Vec<&'a [u8]>,
    /// `KEY=VALUE` each, as the proc gets it.
    pub env: Vec<&'a [u8]>,
    /// The proc's compiled filter (native `struct sock_filter` array).
    pub filter: Vec<u8>,
    /// Descriptors the proc inherits at their own numbers.
    pub fds: Vec<BorrowedFd<'a>>,
    /// What the caller's cold start does that a zygote does not, each of [`UNLIKE`].
    pub unlike: [bool; 3],
    /// The run's σcontainer, as its cold start would build it (a jailed run).
    pub jail: Option<&'a jail::JailSpec>,
    /// The run's profile (`--profile`).
    pub profile: &'a str,
    /// `--stats`: a warm proc says its unique memory as it ends.
    pub stats: bool,
}

/// Why a run is [`Run::unlike`] a warm one.
pub const UNLIKE: [&str; 3] = [
    "the profile hides or over-mounts paths",
    "--pass-fd",
    "the profile notifies sendmsg (the proc could not hand its listener over)",
];

/// Ask the pool for `run`'s proc unless something makes it differ from a cold one: the proc
/// if warm, and the line `--stats` shows (which start, and why). A pool or zygote that failed
/// is said at once, in one line. Err: `required` (`--warm`) and the run must start cold.
pub fn ask(run: Run<'_>, required: bool) -> Result<(Option<Started>, String), PoolError> {
    let start = start(run, required)?;
    let said = match &start {
        Ok(s) => format!("warm start (zygote {})", s.zygote),
        Err((why, _)) if required => return Err(PoolError::Refused(format!("--warm: {why}"))),
        Err((why, failed)) => {
            if *failed {
                eprintln!("sigma-supervise: {why}: starting cold");
            }
            format!("cold start: {why}")
        }
    };
    Ok((start.ok(), said))
}

/// The proc, or why not (and whether something failed).
fn start(run: Run<'_>, required: bool) -> Result<Result<Started, (String, bool)>, PoolError> {
    let cold = |why: &str| Ok(Err((why.to_owned(), false)));
    let command: Vec<OsString> = run
        .argv
        .iter()
        .map(|a| OsStr::from_bytes(a).into())
        .collect();
    let program = Path::new(command.first().map_or(OsStr::new(""), |a| a.as_os_str()));
    let python = program
        .file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"python"));
    if !python {
        return cold("not a Python interpreter");
    }
    // Said first, as --warm says it: without a pool, what else keeps a run cold is moot.
    let no_pool = || match required {
        true => Err(PoolError::NoPool),
        false => cold("no pool is running"),
    };
    if !crate::socket_path().exists() {
        return no_pool();
    }
    if let Some(i) = run.unlike.iter().position(|&u| u) {
        return cold(UNLIKE[i]);
    }
    if let Some(why) = choose::cold_reason(&command) {
        return cold(&why);
    }
    let pairs = client::env_pairs(&run.env);
    let Ok(python) = crate::server::which(program) else {
        return cold("the interpreter is not found on PATH");
    };
    let req = WarmRequest {
        python: &python,
        argv: &run.argv,
        env: &run.env,
        imports: choose::imports_of(&command),
        startup: choose::startup_env_of(&pairs),
        filter: run.filter,
        fds: run.fds,
        jail: run.jail,
        profile: run.profile,
        stats: run.stats,
    };
    Ok(match client::start(&req) {
        Ok(Outcome::Warm(s)) => Ok(s),
        Ok(Outcome::Cold(why)) => {
            let failed = why.contains("gone") || why.contains("ended");
            Err((why, failed))
        }
        Err(PoolError::NoPool) => return no_pool(),
        Err(e) => Err((format!("the pool failed: {e}"), true)),
    })
}
