//! `sigma-supervise doctor`: what this host gives each feature of a run, a line each, found by
//! the probes the run itself acts on ([`realmfs::host::findings`]: [`jail::host`]'s and the
//! realm's). Exit status 1 when no proc could be jailed (or no seccomp listener had).
#![forbid(unsafe_code)]

use std::process::ExitCode;

/// Check this host: what each feature of a run will use here and why, and the flag or package
/// that changes a fallback. Exit status 1 when a proc could not be jailed at all.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub realm: realmfs::RealmOpts,
}

pub fn main(args: &DoctorArgs) -> ExitCode {
    let kernel = jail::host::kernel_release();
    println!(
        "sigma-supervise {} on Linux {kernel}",
        env!("CARGO_PKG_VERSION")
    );
    let (found, runs) = realmfs::host::findings(&args.realm);
    for f in &found {
        println!("{f}");
    }
    if runs {
        return ExitCode::SUCCESS;
    }
    println!("a proc cannot be jailed and supervised on this host: every run fails");
    ExitCode::from(1)
}
