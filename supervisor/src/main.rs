//! `sigma-supervise [OPTIONS] [--] PROGRAM [ARGS...]`: run an unmodified program as a σOS-style
//! proc. The child installs the profile's seccomp filter (allow-list, user-notify for path calls)
//! and execs; this process answers the notifications from outside the filter.
//!
//! The path of one call: `main` (cli) → [`spawn`] (fork, mounts, filter, listener hand-off) →
//! [`supervisor`] (receive loop on a dedicated thread) → [`handlers`] (one module per syscall
//! family, one shared path routine) → [`serve`] (host-side opens under served dirs).
#![deny(unsafe_code)]

mod calls;
mod compiled;
mod container;
mod failure;
mod handlers;
mod on_demand;
mod policy;
mod publish;
mod readonly;
mod reply;
mod serve;
mod sigma_api;
mod spawn;
mod stats;
mod supervisor;
mod sys;
mod trampoline;

use clap::{Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

pub use failure::Failure;

/// In the static musl build, mimalloc: musl's allocator makes the start-up's parsing (clap,
/// the compiled profile's JSON) and the fetch's buffers several times slower.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

    /// Trampoline mode's plan for the run (see [`trampoline`]; never parsed).
    #[arg(skip)]
    pub trampoline: Option<trampoline::Plan>,
}

#[derive(Debug)]
pub enum Sub {
    /// Publish wheels, a requirements file or package directories to a library bucket
    /// (archives first, index last).
    Publish(fetcher::cli::PublishArgs),
}

const PUBLISH: &str = "publish";
const PUBLISH_ABOUT: &str = "Publish wheels, a requirements file or package directories to a \
                             library bucket (archives first, index last)";

/// `Sub` by hand, for one thing the derive cannot say: `publish`'s own arguments are added
/// only when it is parsed or its help is asked for (`Command::defer`), so a run of a program
/// does not build them.
impl clap::Subcommand for Sub {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
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
    }
}

impl clap::FromArgMatches for Sub {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Self::from_arg_matches_mut(&mut matches.clone())
    }

    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        match matches.remove_subcommand() {
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

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    // The AWS SDK warns about each credential provider it tried; a failed fetch is reported
    // once, in one line, by the realm (with the credentials to check), so its warnings are
    // shown only from -v on.
    let default = match verbose {
        0 => "warn,aws_config=error",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();
}

fn main() -> ExitCode {
    // A helper of the realm's (this binary again under a name of its own) runs here and exits.
    realmfs::helper_main();
    jail::mark("main");
    // σOS's procd runs this binary as `uproc-trampoline`: its contract becomes the command line.
    let cli = match trampoline::cli() {
        None => Cli::parse(),
        Some(Ok(cli)) => cli,
        Some(Err(e)) => {
            eprintln!("{}: {e:#}", trampoline::PROGRAM_NAME);
            exit_flushed(125)
        }
    };
    jail::mark("clap");
    init_logging(cli.verbose);
    jail::mark("parsed");
    if let Some(Sub::Publish(args)) = &cli.sub {
        return publish::main(args);
    }
    let end = match run(cli) {
        Ok(end) => {
            jail::mark("finished");
            end
        }
        Err(failure) => {
            eprintln!("sigma-supervise: {:#}", failure.error);
            jail::init::Ended::Exited(failure.code)
        }
    };
    if let jail::init::Ended::Killed(sig) = end {
        // Die of the program's signal, as the program did bare: a shell that waits for the
        // run tells a ^C from an exit status of 130 (bash ends a loop or script only for the
        // former) and names the signal ("Killed", "Segmentation fault").
        flush_stdio();
        sys::die_of(i32::from(sig));
    }
    exit_flushed(end.code())
}

fn flush_stdio() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
}

/// Ends the process without the C runtime's teardown: stdio flushed, then `_exit`. Nothing is
/// left for the teardown to do (every file, lock and temporary went with `run`'s state), and
/// the allocator's exit handler would hand back its memory a region at a time (each a TLB
/// shootdown across CPUs) while the kernel drops the whole address space at once.
fn exit_flushed(code: u8) -> ! {
    flush_stdio();
    sys::exit_now(i32::from(code))
}


/// `--trace FILE` (without `=`) is `--trace` to stderr with FILE as the program: when that
/// program is not found, say how to name the file.
fn trace_hint(f: Failure, cli: &Cli) -> Failure {
    let args: Vec<OsString> = std::env::args_os().collect();
    let after_trace = args
        .windows(2)
        .any(|w| w[0] == "--trace" && w[1] == cli.command[0]);
    if f.code == 127 && cli.trace.as_deref() == Some(std::path::Path::new("-")) && after_trace {
        let error = anyhow::anyhow!("{} (--trace takes its file as --trace=FILE)", f.error);
        return Failure { error, code: 127 };
    }
    f
}

fn run(mut cli: Cli) -> Result<jail::init::Ended, Failure> {
    // Trampoline mode: the proc's binary, read from binfs into a memfd.
    let memfd = cli
        .trampoline
        .as_ref()
        .and_then(trampoline::Plan::exec_path);
    let program = match memfd {
        Some(memfd) => memfd,
        None => spawn::find_program(&cli.command[0]).map_err(|f| trace_hint(f, &cli))?,
    };
    // A realm's lib dir is one more served dir (see realmfs), on the target's PYTHONPATH.
    let mut realm = realmfs::RealmPlan::new(&cli.realm)?;
    let mut serves = cli.serve.clone();
    // A realm with nothing left to fetch is mounted, not served (see RealmPlan::kernel_served).
    let mut kernel_served = None;
    // Or shown from the store's shared package trees (see RealmPlan::tree_view).
    let mut trees = None;
    let mut lazy = None;
    if let Some(r) = &mut realm {
        r.compile_with = realmfs::realm::python_of(&program);
        r.delegate = r.opts.fill_process.delegates(!cli.jail.no_jail);
        r.on_helper = handlers::signal::register_helper;
        if r.compile_with.is_some() {
            r.prefetch = realmfs::realm::imports_of(&cli.command);
        }
        kernel_served = r.kernel_served(!cli.jail.no_jail);
        if kernel_served.is_none() {
            trees = r.tree_view(!cli.jail.no_jail);
        }
        if kernel_served.is_none() && trees.is_none() {
            lazy = r.lazy_image(!cli.jail.no_jail);
            if lazy.is_none() {
                serves.push(r.serve_rule());
            }
        }
        std::env::set_var(
            "PYTHONPATH",
            r.pythonpath(std::env::var_os("PYTHONPATH").as_deref()),
        );
    }
    jail::mark("realm");
    let trace = stats::TraceSink::open(cli.trace.as_deref())?;
    // The compiled profiles' cache and the embedded server's scratch; none in a home that does
    // not exist.
    let cache_root = cli
        .realm
        .cache_dir
        .clone()
        .or_else(fetcher::default_cache_root_if_home);
    // Tracing or counting in the jail: writes it refuses as read-only are explained.
    let hints = !cli.jail.no_jail && (trace.is_some() || cli.stats);
    let compiled::Compiled {
        policy,
        elide,
        filter,
        guard,
        sendmsg_allowed,
        execve_allowed,
        cached,
    } = compiled::compile(
        &compiled::Options {
            profile: &cli.profile,
            serves: &serves,
            audit: cli.audit,
            jailed: !cli.jail.no_jail,
            notify_paths: cli.always_notify || trace.is_some(),
            read_only_hints: hints,
        },
        cache_root.as_deref(),
    )?;
    tracing::debug!(cached, "profile {} compiled", cli.profile);
    jail::mark("policy");
    // One CPU for both the target and the notification thread (chosen once).
    let pin_cpu = match cli.pin {
        Pin::Off => None,
        Pin::Auto if !sys::is_realtime() => None,
        Pin::Auto | Pin::Shared => sys::current_cpu(),
    };
    if elide {
        tracing::info!("no path rule and no --trace: path calls run without notification");
        if hints {
            tracing::info!("--stats: calls that write stay notified for the read-only hint");
        }
    }
    let mut api =
        sigma_api::SigmaApi::from_opts(&cli.sigma, &cli.realm.realm, cache_root.as_deref())?;
    jail::mark("api");
    let s3_dir = match &cli.sigma.s3 {
        sigma_api::S3Backend::Dir(d) => Some(format!("file://{}", d.display())),
        sigma_api::S3Backend::Aws => None,
    };
    let hidden = container::supervisor_paths(
        cli.realm.cache_dir.as_deref(),
        cli.realm.bucket.as_deref(),
        s3_dir.as_deref(),
        cli.sigma.scratch_dir.as_deref(),
    );
    let mut jail = cli.jail.spec(&program, &cli.command, &hidden, cli.grace)?;
    if let (Some(t), Some(spec)) = (&cli.trampoline, jail.as_mut()) {
        t.shape(spec);
    }
    jail::mark("spec");
    // Where the jail shows host paths at their own names, for the hint of a failed run.
    let shown: Option<Vec<PathBuf>> = jail.as_ref().map(|s| {
        s.binds
            .iter()
            .filter(|b| b.src == b.dst)
            .map(|b| b.dst.clone())
            .collect()
    });
    let mut prepared = spawn::prepare(
        &program,
        &cli.command,
        &policy,
        spawn::Programs { filter, guard },
        pin_cpu,
        jail,
        &cli.pass_env,
    )?;
    prepared.home_inside_jail()?;
    // The lazy backend marks its image once the target exists, before the program may touch it.
    prepared.pass_listener(
        !matches!(lazy, Some(realmfs::realm::LazyView::Image(_))) && sendmsg_allowed,
    );
    if let Some((fd, number)) = api.take_target_end() {
        prepared.pass_fd(fd, spproxy::ENV_SPPROXY_FD, &number)?;
    }
    // σOS's Go client dials /tmp/spproxyd/spproxyd.sock itself: the jail shows the server there.
    if let Some(dir) = prepared.jail().and_then(|_| api.jail_socket_dir()) {
        prepared.bind_read_only(&dir, std::path::Path::new(sigma_api::SPPROXYD_DIR))?;
    }
    prepared.keep_inherited(&cli.pass_fd);
    if let Some(t) = &mut cli.trampoline {
        t.hand_over(&mut prepared)?;
    }
    if let Some(r) = &realm {
        if kernel_served.is_some() {
            prepared.bind_read_only(&r.lib, &r.opts.lib_prefix)?;
        }
        if let Some(view) = &trees {
            for (src, dst) in r.tree_mounts(view)? {
                prepared.bind_read_only(&src, &dst)?;
            }
        }
        if let Some(view) = &lazy {
            prepared.bind_read_only(view.mnt(), &r.opts.lib_prefix)?;
            for e in view.lib_entries() {
                prepared.bind_read_only(&r.lib.join(e), &r.opts.lib_prefix.join(e))?;
            }
        }
        prepared.hide_also(&r.root)?;
    }
    jail::mark("prepared");
    let hints = prepared.jail().filter(|_| hints).map(|spec| {
        let map = readonly::JailMap::new(
            spec,
            cli.jail.cwd == container::CwdArg::Ro,
            cli.jail.withheld_cwd().map(|(dir, _)| dir).as_deref(),
            &cli.jail.bind_dsts(),
        );
        readonly::Hints::new(map)
    });
    let mut child = spawn::spawn(prepared)?;
    if let Some(r) = &realm {
        r.prepare_image();
    }
    // Our memory holds credentials and our /proc files lead to the host: not dumpable, so no
    // process of the user's (a proc included) can read or ptrace them. (Only now: the jail's
    // id maps are written through our child's /proc files, which dumpability guards too.)
    let _ = nix::sys::prctl::set_dumpable(false);
    // Threads (the fetch runtime) only after fork; the child waits to be released.
    let resolver: Box<dyn serve::Resolver> = match realm {
        Some(r) => match (kernel_served, trees.as_ref(), lazy) {
            (Some(n), _, _) => Box::new(r.kernel_served_resolver(n)),
            (None, Some(view), _) => Box::new(r.trees_resolver(view)),
            // Marked before the target is released: its first touch already waits for a fill.
            (None, None, Some(realmfs::realm::LazyView::Fuse(m))) => Box::new(r.fuse_served(m)),
            (None, None, Some(realmfs::realm::LazyView::Image(img))) => {
                // The child's view is built (it waits to be released): mark the proc's mount of
                // the image. Our child, not yet reaped: the pid names it.
                img.watch(child.pid, &r.opts.lib_prefix)
                    .map_err(|e| anyhow::anyhow!("realm {}: lazy backend: {e}", r.opts.realm))?;
                let init = (!cli.jail.no_jail)
                    .then(|| sys::pidfd_open(child.pid, 0))
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("pidfd_open of the jail's init: {e}"))?;
                Box::new(r.start_lazy(img, init)?)
            }
            // Notified calls wait in the kernel until the notification thread reads them: the
            // program loads while the realm's cache, runtime and prefetch start.
            (None, None, None) => {
                child.release();
                let resolver = r.start()?;
                jail::mark("resolver");
                Box::new(resolver)
            }
        },
        None => Box::new(serve::LocalDirs),
    };
    // The program loads while the realm server and the notification thread start.
    child.release();
    let mut on_demand = api.on_demand();
    on_demand.extend(
        cli.trampoline
            .as_mut()
            .and_then(trampoline::Plan::on_demand),
    );
    let status = supervisor::supervise(
        child,
        policy,
        trace,
        cli.stats,
        pin_cpu,
        !cli.no_sync_wakeup,
        resolver,
        cli.grace,
        hints,
        on_demand,
        execve_allowed,
        sigma_api::evict,
    )?;
    if status.code() != 0 && cli.trampoline.is_none() {
        if let (Some(shown), Ok(cwd)) = (&shown, std::env::current_dir()) {
            for p in jail::view::unshown_named(&cli.command, &cwd, shown, 3) {
                eprintln!(
                    "sigma-supervise: {} is named on the command line but not shown in the jail: \
                     --bind {0} shows it read-only (--bind-rw {0} writable)",
                    p.display()
                );
            }
        }
    }
    let end = api.finish(status, cli.stats, cli.sigma.require_started)?;
    match &cli.trampoline {
        Some(t) => t.finish(end),
        None => Ok(end),
    }
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
            None => panic!("publish not parsed as a subcommand"),
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
