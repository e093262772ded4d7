//! `sigma-supervise [OPTIONS] [--] PROGRAM [ARGS...]`: run an unmodified program as a σOS-style
//! proc. The child installs the profile's seccomp filter (allow-list, user-notify for path calls)
//! and execs; this process answers the notifications from outside the filter.
//!
//! `main` parses the command line ([`Cli`], in `cli.rs`; trampoline/ builds one too, with its
//! plan) and calls [`run`], which builds the values of one run and calls down. Data flows one way:
//!
//! ```text
//! main (cli) ─▶ run ─┬─▶ realmfs::show (mounts, or a serve rule) ─────────────┐
//!                    ├─▶ compiled (the profile's policy + filter, cached)     │
//!                    ├─▶ container (JailOpts → jail::JailSpec), sigma_api     │
//!                    ├─▶ spawn (prepare → fork: jailed or bare → Child) ◀─────┘
//!                    └─▶ supervisor (event loop; reaps, forwards signals)
//!                           │ one notification
//!                           ▼
//!                        handlers (dispatch → path routine / socket / signal)
//!                           │ a path, resolved            │ a served path
//!                           ▼                             ▼
//!                        policy (Continue/Deny/Serve)  serve (realmfs's resolver, host opens)
//!                           │
//!                           ▼
//!                        reply::answer (the single place an outcome becomes the answer)
//! ```
//!
//! Leaves every layer may use and none imports back from: `reply.rs`, `failure.rs`,
//! `calls.rs` (what the policy is told of the handlers), `on_demand.rs`, `stats.rs`, `sys.rs`.
//! Beside the call path: `readonly.rs` (the read-only hints), `publish.rs` (the subcommand),
//! `completions.rs` (shell completions and the man page, from the same `Cli`),
//! `trampoline/` (σOS's uproc-trampoline contract, read by the `uproc` crate, made a run).
#![deny(unsafe_code)]

mod calls;
mod cli;
mod compiled;
mod completions;
mod container;
mod doctor;
mod failure;
mod handlers;
mod on_demand;
mod policy;
mod publish;
mod readonly;
mod reply;
mod run;
mod serve;
mod sigma_api;
mod spawn;
mod stats;
mod supervisor;
mod sys;
mod trampoline;

use clap::Parser as _;
use std::process::ExitCode;

use cli::{Cli, Sub};

/// In the static musl build, mimalloc: musl's allocator makes the start-up's parsing (clap,
/// the compiled profile's JSON) and the fetch's buffers several times slower.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    pool::cli::main_if_asked(); // `sigma-supervise pool ...`: the pool, or its --status/--stop
    jail::mark("main");
    // σOS's procd runs this binary as `uproc-trampoline`: its contract becomes the command line.
    let (cli, plan) = match trampoline::cli() {
        None => (Cli::parse(), None),
        Some(Ok((cli, plan))) => (cli, Some(plan)),
        Some(Err(e)) => {
            eprintln!("{}: {e:#}", trampoline::PROGRAM_NAME);
            exit_flushed(125)
        }
    };
    jail::mark("clap");
    init_logging(cli.verbose);
    jail::mark("parsed");
    match &cli.sub {
        Some(Sub::Publish(args)) => return publish::main(args),
        Some(Sub::Doctor(args)) => return doctor::main(args),
        Some(Sub::Generate(what)) => {
            return completions::main(what, <Cli as clap::CommandFactory>::command)
        }
        None => {}
    }
    let end = match run::run(cli, plan) {
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
