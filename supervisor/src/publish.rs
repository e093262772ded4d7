//! `sigma-supervise publish --bucket URL (-r requirements.txt | WHEELS_OR_DIRS...)`: the
//! fetcher's publish (`fetcher::cli`), one report line per package on stdout. The import trace
//! that orders each archive runs the packages' code, so it runs as a proc: this binary, jailed
//! under the `sigmaos` profile, with only the publish's temporary directory shown (read-only).
#![forbid(unsafe_code)]

use fetcher::cli::{run_publish_traced, PublishArgs};
use fetcher::{FetchConfig, TraceRunner};
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// The import trace, run by this binary in its jail.
fn jailed_trace() -> Option<TraceRunner> {
    let exe = std::env::current_exe().ok()?;
    Some(TraceRunner(Arc::new(
        move |python: &Path, dir: &Path, args: &[OsString]| {
            let mut c = std::process::Command::new(&exe);
            c.arg("--cwd")
                .arg("none")
                .arg("--sigma")
                .arg("off")
                .arg("--bind")
                .arg(dir)
                .arg("--")
                .arg(python)
                .args(args);
            c
        },
    )))
}

/// Run the subcommand; exit status 0, or 1 with one line on stderr.
pub fn main(args: &PublishArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sigma-supervise publish: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run_publish_traced(
        args,
        &FetchConfig::default(),
        jailed_trace(),
    )) {
        Ok(reports) => {
            // A reader that went away (`| head`) is not a failure of the publish.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            for r in reports {
                if writeln!(out, "{r}").is_err() {
                    break;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sigma-supervise publish: {e}");
            ExitCode::from(1)
        }
    }
}
