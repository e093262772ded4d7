//! `sigma-supervise pool [--preload MODS]... [--python PYTHON] | --status | --stop`.
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// Keep Python zygotes warm for this user's runs (foreground; --status, --stop).
///
/// Siblings forked from one zygote share its address-space layout (ASLR) and the interpreter's
/// hash seed; each proc reseeds `random`, numpy's global generator and multiprocessing's
/// authentication key. So no zygote serves
/// forever: after --recycle-after-forks procs or --recycle-after-secs seconds it is replaced by
/// a fresh one, started ahead of any request.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "sigma-supervise pool")]
pub struct PoolArgs {
    /// A zygote that has imported these modules, comma-separated (repeatable: one zygote per
    /// set; one without preloads is always kept). A run gets the zygote with the most preloads
    /// that are all among its script's imports.
    #[arg(long, value_name = "MOD,...")]
    pub preload: Vec<String>,

    /// The interpreter the zygotes run (a run of another takes the cold path).
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    pub python: PathBuf,

    /// Replace a zygote after it has forked this many procs (its replacement is started ahead,
    /// between requests; the old one serves until the new one is ready).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub recycle_after_forks: u64,

    /// Replace a zygote once it is this many seconds old (default 15 minutes), as above.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub recycle_after_secs: u64,

    /// Learn preloads from use: a set of modules that at least --learn-threshold of the last
    /// --learn-window warm runs imported (each from the interpreter's own path, never the
    /// script's directory) gets a zygote of its own, started between requests.
    #[arg(long, value_name = "on|off", default_value = "on", num_args = 0..=1,
          default_missing_value = "on", value_parser = ["on", "off"])]
    pub learn_preloads: String,

    /// K: how many of the remembered runs must have imported a set.
    #[arg(long, value_name = "K", default_value_t = crate::learn::LearnOpts::default().threshold)]
    pub learn_threshold: usize,

    /// N: how many recent warm runs are remembered (at most 1000).
    #[arg(long, value_name = "N", default_value_t = crate::learn::LearnOpts::default().window)]
    pub learn_window: usize,

    /// M: learned zygotes at most (the least recently used is replaced).
    #[arg(long, value_name = "M", default_value_t = crate::learn::LearnOpts::default().zygotes)]
    pub learned_zygotes: usize,

    /// Zygotes without a σcontainer, for `--no-jail` runs (by default each zygote runs in a
    /// σcontainer of its own and serves jailed runs, each proc completing its own jail).
    #[arg(long)]
    pub no_jail: bool,

    /// The profile of the runs the jailed zygotes serve (a zygote's filter is its procs'
    /// profile's, plus the calls that complete their jails); runs with another go cold.
    #[arg(long, value_name = "NAME|FILE", default_value = "sigmaos")]
    pub profile: String,

    /// Show SRC (read-only, at its own path) in every jailed zygote's view, as `--bind SRC`
    /// does for a run: a preload's directory outside the interpreter's prefix. Runs are served
    /// when they name the same binds. Repeatable.
    #[arg(long, value_name = "SRC")]
    pub bind: Vec<String>,

    /// Show the running pool's zygotes (pid, interpreter, preloads, learned or given, forks,
    /// age) and what it has learned.
    #[arg(long, conflicts_with = "stop")]
    pub status: bool,

    /// Stop the running pool.
    #[arg(long)]
    pub stop: bool,
}

/// `sigma-supervise pool ...` (the first argument): run it and exit; else return.
pub fn main_if_asked() {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "pool") {
        // Named in full: usage and errors say `sigma-supervise pool`.
        let name = std::ffi::OsString::from("sigma-supervise pool");
        let rest = std::env::args_os().skip(2);
        let args = <PoolArgs as clap::Parser>::parse_from(std::iter::once(name).chain(rest));
        std::process::exit(i32::from(main(&args)));
    }
}

/// Run the subcommand; its exit status.
pub fn main(args: &PoolArgs) -> u8 {
    let done = if args.status {
        crate::client::status().map(|st| {
            println!("pool {}", crate::socket_path().display());
            for z in st.zygotes {
                let state = match (z.alive, z.replacing) {
                    (false, _) => "gone".to_owned(),
                    (true, Some(old)) => format!("starting (replaces pid {old})"),
                    (true, None) if z.starting => "starting".to_owned(),
                    (true, None) => "ready".to_owned(),
                };
                println!(
                    "zygote pid {} {} [{}]{} forks {} age {}s {state}",
                    z.pid,
                    z.python,
                    z.preloads.join(","),
                    if z.learned { " learned" } else { "" },
                    z.forks,
                    z.age_secs
                );
            }
            let l = st.learning;
            if l.enabled {
                let counts: Vec<String> = l.counts.iter().map(|(n, c)| format!("{n} {c}")).collect();
                println!(
                    "learning on: a set imported by {} of the last {} runs gets a zygote (at most {}); \
                     {} runs remembered: {}",
                    l.threshold,
                    l.window,
                    l.zygotes,
                    l.runs,
                    if counts.is_empty() { "nothing imported".to_owned() } else { counts.join(", ") }
                );
                if !l.refused.is_empty() {
                    println!("learning refused (failed to import): {}", l.refused.join(","));
                }
            } else {
                println!("learning off");
            }
        })
    } else if args.stop {
        crate::client::stop()
    } else {
        let opts = crate::server::PoolOpts {
            python: args.python.clone(),
            preloads: args
                .preload
                .iter()
                .map(|s| {
                    s.split(',')
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .collect(),
            recycle_after_forks: args.recycle_after_forks,
            jail: (!args.no_jail).then(|| crate::zygote::Jailed {
                profile: args.profile.clone(),
                binds: args.bind.clone(),
            }),
            recycle_after: std::time::Duration::from_secs(args.recycle_after_secs),
            learn: crate::learn::LearnOpts {
                enabled: args.learn_preloads == "on",
                threshold: args.learn_threshold,
                window: args.learn_window,
                zygotes: args.learned_zygotes,
            },
        };
        crate::server::serve(&opts)
    };
    match done {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sigma-supervise pool: {e}");
            1
        }
    }
}
