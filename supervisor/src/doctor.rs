//! `sigma-supervise doctor`: what this host gives each feature of a run, a line each, found by
//! the probes the run itself acts on ([`jail::host`], [`realmfs::host`]). Exit status 1 when no
//! proc could be jailed (or no seccomp listener had).
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
    use jail::host;
    println!(
        "sigma-supervise {} on Linux {}",
        env!("CARGO_PKG_VERSION"),
        host::kernel_release()
    );
    let userns = host::userns();
    let jailed = userns.ok;
    let seccomp = host::seccomp();
    // No jail, or no listener: no proc can run as a run would run it.
    let fatal = !jailed
        || seccomp
            .iter()
            .any(|f| !f.ok && f.feature == "seccomp user-notify");
    let root = realmfs::host::cache_root(&args.realm);
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let mut found = vec![userns, host::landlock()];
    found.extend(seccomp);
    found.extend([host::cgroup(), host::idmap(&cwd)]);
    found.extend([
        realmfs::host::cache_fs(&root),
        realmfs::host::pre_content(&args.realm),
        realmfs::host::fuse(),
        realmfs::host::backend(&args.realm, jailed),
    ]);
    found.extend(realmfs::host::bucket(&args.realm));
    for f in &found {
        println!("{f}");
    }
    if !fatal {
        return ExitCode::SUCCESS;
    }
    println!("a proc cannot be jailed and supervised on this host: every run fails");
    ExitCode::from(1)
}
