//! `sigma-supervise publish --bucket URL (-r requirements.txt | WHEELS_OR_DIRS...)`: the
//! fetcher's publish (`fetcher::cli`), one report line per package on stdout.
#![forbid(unsafe_code)]

use fetcher::cli::{run_publish, PublishArgs};
use fetcher::FetchConfig;
use std::process::ExitCode;

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
    match rt.block_on(run_publish(args, &FetchConfig::default())) {
        Ok(reports) => {
            for r in reports {
                println!("{r}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sigma-supervise publish: {e}");
            ExitCode::from(1)
        }
    }
}
