//! The realm options of `sigma-supervise` (flattened into its command line).
#![forbid(unsafe_code)]

use std::path::PathBuf;

/// Realm options of `sigma-supervise`.
#[derive(Debug, Clone, clap::Args)]
pub struct RealmOpts {
    /// Realm whose libraries the target sees (one cache per realm; content is shared).
    #[arg(long, value_name = "NAME", default_value = "local")]
    pub realm: String,

    /// Library bucket: s3://BUCKET[/PREFIX] (standard AWS configuration) or file:///DIR, as
    /// `publish` takes it. Without one the target has no library dir.
    #[arg(long, value_name = "URL", env = "SIGMA_LIB_BUCKET")]
    pub bucket: Option<String>,

    /// Cache root shared by every realm, also holding the compiled profiles [default:
    /// $XDG_CACHE_HOME/sigma-supervise or ~/.cache/sigma-supervise; none where $HOME is not a
    /// directory: a run makes no home]. Hidden from the target.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Where the target sees the realm's libraries (appended to PYTHONPATH).
    #[arg(long, value_name = "PATH", default_value = "/sigma/lib")]
    pub lib_prefix: PathBuf,

    /// Bound on reaching the bucket (connect, request, retries) before a call fails, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub fetch_timeout: f64,

    /// Fetch only what the target asks for: neither the packages a Python command names
    /// (`-c CODE`, `-m MOD`, or the script's `import` lines) before it asks, nor, during a run,
    /// the few megabytes that would complete a realm it has mostly installed.
    #[arg(long)]
    pub no_prefetch: bool,

    /// Serve a realm that is not completely installed from a lazily filled ext4 image
    /// (placeholders filled by the kernel's pre-content events on first touch; no notifications).
    /// Needs root (a loop mount and fanotify in the initial namespace) and Linux 6.14+; a
    /// realm's first run is served by notification (it has no index snapshot yet). `auto`: where
    /// possible, else quietly by the realm's FUSE server or by notification (a failure is
    /// remembered for a day); a jailed run that finds no image has it made off its path, for
    /// the next run, and is served meanwhile by the FUSE server. An ordinary user's realm: the
    /// FUSE server. `always` (`--lazy`): makes the image in the run if need be, saying why it
    /// falls back; `never`: by notification.
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        env = "SIGMA_SUPERVISE_LAZY",
        default_value_t = Lazy::Auto,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "always"
    )]
    pub lazy: Lazy,

    /// Where a jailed run's downloads run: in a fill process of their own that completes a
    /// package after the run has exited and writes what the import does not read first with
    /// idle CPU only (`auto`, `always`), or in the supervisor, which then finishes what it
    /// started before exiting (`never`). An unjailed run always downloads itself.
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        env = "SIGMA_SUPERVISE_FILL_PROCESS",
        default_value_t = FillProcess::Auto
    )]
    pub fill_process: FillProcess,
}

/// See [`RealmOpts::lazy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lazy {
    Auto,
    Always,
    Never,
}

/// See [`RealmOpts::fill_process`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FillProcess {
    Auto,
    Always,
    Never,
}

impl FillProcess {
    /// Whether a run (jailed or not) delegates its downloads to fill processes.
    pub fn delegates(self, jailed: bool) -> bool {
        // An unjailed supervisor waits for every child it has: a fill process would hold the
        // run open (see crate::fill).
        jailed && self != FillProcess::Never
    }
}
