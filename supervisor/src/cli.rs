//! The command line: [`Cli`] (a run's options, flattened from the modules that use them),
//! [`Sub`] (the `publish` subcommand; completions' hidden ones) and [`Pin`]. Values only: `main`
//! parses, `run` reads.
#![forbid(unsafe_code)]

use crate::{completions, container, doctor, sigma_api};
use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

/// Run PROGRAM as a σOS proc under a seccomp user-notify supervisor.
///
/// The proc runs in a σcontainer: its own user, mount, pid, network, IPC and UTS namespaces, as
/// an unprivileged uid with no capabilities, in a fresh root that shows read-only /usr, /lib*,
/// /bin, a curated /etc, the interpreter's prefix and the script's directory, the working
/// directory read-write unless it is a home, a shared /tmp or (for root) a system directory
/// (--cwd rw|ro|none), a private /tmp, a minimal /dev and its own /proc. The supervisor's
/// cache, buckets and state are never visible. --bind/--bind-rw add host paths;
/// with --trace or --stats, a write refused because the jail shows a directory read-only gets a
/// one-line hint naming the flag that makes it writable. Landlock and the seccomp list are
/// further layers. A PROGRAM that collides with a subcommand name (`publish`) can be given
/// after `--`.
#[derive(Debug, Parser)]
#[command(
    name = "sigma-supervise",
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub sub: Option<Sub>,

    #[command(flatten)]
    pub realm: realmfs::RealmOpts,

    #[command(flatten)]
    pub sigma: sigma_api::SigmaOpts,

    #[command(flatten)]
    pub jail: container::JailOpts,

    /// Builtin profile name (sigmaos, permissive) or a TOML profile file.
    #[arg(long, value_name = "NAME|FILE", default_value = "sigmaos")]
    pub profile: String,

    /// Serve host DIR to the target at the virtual path PREFIX (repeatable). DIR itself is hidden
    /// from the target; files under it are opened by the supervisor, read-only.
    #[arg(long = "serve", value_name = "PREFIX=DIR", value_parser = parse_serve)]
    pub serve: Vec<String>,

    /// Hand the environment variable NAME to the proc although its name says it is a credential
    /// (`AWS_*`, `*TOKEN*`, `*SECRET*`, `*PASS*`, `*_KEY`, ...) or its value is a URL with a
    /// password (withheld by default).
    /// Repeatable.
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,

    /// Let the proc inherit the supervisor's descriptor N (a pipe, a socket, a jobserver's
    /// ends). Only stdin, stdout and stderr are inherited by default: a descriptor the
    /// supervisor's own caller left open would reach the proc unasked. Repeatable.
    #[arg(long = "pass-fd", value_name = "N", value_parser = clap::value_parser!(u32).range(3..))]
    pub pass_fd: Vec<u32>,

    /// One line per notified call (pid, syscall, path, decision, µs) to FILE, or stderr. A write
    /// the jail refuses as read-only is `continue(read-only in the jail)`, with a hint on stderr.
    /// FILE is never reached through a symlink (but in /dev and /proc: /dev/stderr).
    #[arg(long, value_name = "FILE", num_args = 0..=1, require_equals = true, default_missing_value = "-")]
    pub trace: Option<PathBuf>,

    /// Print counts per syscall and decision, the time spent deciding, and wall time, at exit.
    /// In the jail, writes refused as read-only are counted (`read-only`) and hinted, once per
    /// directory: for that alone only the calls that write are notified, never a read.
    #[arg(long)]
    pub stats: bool,

    /// CPU placement of the target and the notification thread. `off` leaves it to the
    /// scheduler (SYNC_WAKE_UP wakes each side on the other's CPU); `shared` pins both to the CPU
    /// the supervisor starts on (the target then cannot use more than one CPU); `auto` is
    /// `shared` under a real-time policy (where SYNC_WAKE_UP's same-CPU wakeup does not apply),
    /// else `off`.
    #[arg(long, value_enum, default_value_t = Pin::Auto)]
    pub pin: Pin,

    /// Notify path calls even when no path rule needs them (for --stats, measurement,
    /// debugging). Without it, a run with no serve/deny rule and no --trace lets the kernel run
    /// path calls directly.
    #[arg(long)]
    pub always_notify: bool,

    /// Notify refused calls so each refused syscall name is logged once (by default the kernel
    /// refuses them itself, at no cost).
    #[arg(long)]
    pub audit: bool,

    /// When the program exits, the processes it left behind get SIGTERM, then SIGKILL after
    /// this many seconds (decimals allowed).
    #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = parse_grace)]
    pub grace: std::time::Duration,

    /// A pool's zygote (started by `sigma-supervise pool`): its σcontainer is a proc's without
    /// the working directory, Landlock (its children apply their own) or notifications, its
    /// filter the profile's plus the calls that complete a child's jail; the view is said on
    /// descriptor N (passed to it) first.
    #[arg(long, value_name = "N", hide = true)]
    pub zygote_ctl: Option<u32>,

    /// Start the proc from the running pool's zygote (`sigma-supervise pool --help`) or fail;
    /// without it a running pool is used when the run allows (see --stats).
    #[arg(long)]
    pub warm: bool,

    /// Do not set SYNC_WAKE_UP on the listener (measurement only).
    #[arg(long, hide = true)]
    pub no_sync_wakeup: bool,

    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// The program (looked up on PATH) and its arguments.
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

#[derive(Debug)]
pub enum Sub {
    /// Publish wheels, a requirements file or package directories to a library bucket
    /// (archives first, index last).
    Publish(fetcher::cli::PublishArgs),
    /// Shell completions and the man page (hidden).
    Generate(completions::Generate),
    /// What this host gives each feature of a run (`doctor`).
    Doctor(doctor::DoctorArgs),
}

const PUBLISH: &str = "publish";
const DOCTOR: &str = "doctor";
const POOL_ABOUT: &str = "Keep Python zygotes warm for this user's runs: a run with the pool up starts from a forked, pre-imported proc (`pool --help`)";
const PUBLISH_ABOUT: &str = "Publish wheels, a requirements file or package directories to a \
                             library bucket (archives first, index last)";

/// `Sub` by hand, for one thing the derive cannot say: `publish`'s own arguments are added
/// only when it is parsed or its help is asked for (`Command::defer`), so a run of a program
/// does not build them.
impl clap::Subcommand for Sub {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        let cmd = if completions::generating() {
            cmd
        } else {
            <completions::Generate as clap::Subcommand>::augment_subcommands(cmd)
        };
        let cmd = cmd.subcommand(<doctor::DoctorArgs as clap::Args>::augment_args(
            clap::Command::new(DOCTOR),
        ));
        // Listed with its own arguments for --help, completions and the man page; it is
        // dispatched before this parser (pool::cli), so they are built only when shown.
        let cmd = cmd.subcommand(clap::Command::new("pool").about(POOL_ABOUT).defer(|cmd| {
            <pool::cli::PoolArgs as clap::Args>::augment_args(cmd)
                .about(POOL_ABOUT)
                .long_about(None)
        }));
        cmd.subcommand(
            clap::Command::new(PUBLISH)
                .about(PUBLISH_ABOUT)
                // The arguments' own doc comment would otherwise become the subcommand's.
                .defer(|cmd| {
                    <fetcher::cli::PublishArgs as clap::Args>::augment_args(cmd)
                        .about(PUBLISH_ABOUT)
                        .long_about(None)
                }),
        )
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        name == PUBLISH
            || name == DOCTOR
            || <completions::Generate as clap::Subcommand>::has_subcommand(name)
    }
}

impl clap::FromArgMatches for Sub {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut matches.clone())
    }

    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        use clap::Subcommand as _;
        if matches
            .subcommand_name()
            .is_some_and(completions::Generate::has_subcommand)
        {
            return completions::Generate::from_arg_matches_mut(matches).map(Sub::Generate);
        }
        match matches.remove_subcommand() {
            Some((name, mut sub)) if name == DOCTOR => Ok(Sub::Doctor(
                <doctor::DoctorArgs as clap::FromArgMatches>::from_arg_matches_mut(&mut sub)?,
            )),
            Some((name, mut sub)) if name == PUBLISH => Ok(Sub::Publish(
                <fetcher::cli::PublishArgs as clap::FromArgMatches>::from_arg_matches_mut(
                    &mut sub,
                )?,
            )),
            Some((name, _)) => Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                format!("no subcommand `{name}`"),
            )),
            None => Err(clap::Error::raw(
                clap::error::ErrorKind::MissingSubcommand,
                "a subcommand is required",
            )),
        }
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pin {
    /// `shared` under SCHED_FIFO/SCHED_RR, else `off`.
    Auto,
    /// Leave placement to the scheduler (SYNC_WAKE_UP lets it co-locate).
    Off,
    /// Pin the target and the notification thread to the same single CPU.
    Shared,
}

fn parse_serve(s: &str) -> Result<String, String> {
    policies::parse_serve_arg(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_grace(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    std::time::Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d <= std::time::Duration::from_secs(3600))
        .ok_or_else(|| format!("`{s}`: give 0 to 3600 seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_publish_keeps_its_help() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
        let mut cmd = Cli::command();
        let top = cmd.render_help().to_string();
        assert!(top.contains("publish  Publish wheels"), "{top}");
        let publish = cmd.find_subcommand_mut(PUBLISH).unwrap();
        let help = publish.render_help().to_string();
        assert!(help.starts_with(PUBLISH_ABOUT), "{help}");
        assert!(help.contains("--bucket <BUCKET>"), "{help}");
    }

    #[test]
    fn cli_takes_program_and_its_hyphen_args_verbatim() {
        let cli = Cli::try_parse_from([
            "sigma-supervise",
            "--stats",
            "python3",
            "-c",
            "print(1)",
            "--stats",
        ])
        .unwrap();
        assert!(cli.stats);
        assert_eq!(cli.command, ["python3", "-c", "print(1)", "--stats"]);
        assert_eq!(cli.profile, "sigmaos");
        assert_eq!(cli.trace, None);
        assert!(!cli.audit);
        assert_eq!(cli.grace, std::time::Duration::from_secs(2));
    }

    #[test]
    fn grace_takes_decimal_seconds_and_refuses_nonsense() {
        let cli =
            Cli::try_parse_from(["sigma-supervise", "--grace", "0.5", "--audit", "p"]).unwrap();
        assert_eq!(cli.grace, std::time::Duration::from_millis(500));
        assert!(cli.audit);
        for bad in ["-1", "x", "1e9", "NaN"] {
            assert!(
                Cli::try_parse_from(["sigma-supervise", "--grace", bad, "p"]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn trace_without_file_means_stderr() {
        let cli = Cli::try_parse_from(["sigma-supervise", "--trace", "prog"]).unwrap();
        assert_eq!(cli.trace.as_deref(), Some(std::path::Path::new("-")));
        assert_eq!(cli.command, ["prog"]);
        let cli = Cli::try_parse_from(["sigma-supervise", "--trace=/tmp/t", "prog"]).unwrap();
        assert_eq!(cli.trace.as_deref(), Some(std::path::Path::new("/tmp/t")));
    }

    #[test]
    fn serve_is_repeatable_and_validated() {
        let cli = Cli::try_parse_from([
            "sigma-supervise",
            "--serve",
            "/a=/tmp",
            "--serve",
            "/b/c=/var",
            "prog",
        ])
        .unwrap();
        assert_eq!(cli.serve, ["/a=/tmp", "/b/c=/var"]);
        assert!(Cli::try_parse_from(["sigma-supervise", "--serve", "rel=/tmp", "p"]).is_err());
        assert!(Cli::try_parse_from(["sigma-supervise", "--serve", "/a", "p"]).is_err());
    }

    #[test]
    fn publish_is_a_subcommand_and_programs_still_parse() {
        let cli = Cli::try_parse_from([
            "sigma-supervise",
            "publish",
            "--bucket",
            "file:///tmp/b",
            "-r",
            "req.txt",
        ])
        .unwrap();
        match cli.sub {
            Some(Sub::Publish(a)) => {
                assert_eq!(a.bucket, "file:///tmp/b");
                assert_eq!(a.requirements, [PathBuf::from("req.txt")]);
            }
            other => panic!("publish not parsed as a subcommand: {other:?}"),
        }
        let cli = Cli::try_parse_from([
            "sigma-supervise",
            "--realm",
            "r",
            "--bucket",
            "s3://b",
            "python3",
            "x.py",
            "publish",
        ])
        .unwrap();
        assert!(cli.sub.is_none());
        assert_eq!(cli.command, ["python3", "x.py", "publish"]);
        assert_eq!(cli.realm.realm, "r");
        assert_eq!(cli.realm.bucket.as_deref(), Some("s3://b"));
        let cli = Cli::try_parse_from(["sigma-supervise", "--", "publish"]).unwrap();
        assert!(cli.sub.is_none());
        assert_eq!(cli.command, ["publish"]);
        let cli = Cli::try_parse_from(["sigma-supervise", "python3"]).unwrap();
        assert_eq!(cli.realm.realm, "local");
        assert_eq!(cli.realm.bucket, None);
    }

    #[test]
    fn program_is_required() {
        assert!(Cli::try_parse_from(["sigma-supervise", "--stats"]).is_err());
    }
}
