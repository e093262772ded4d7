//! A realm's libraries, served to the target at `--lib-prefix` (default `/sigma/lib`).
//!
//! The path of one call under the prefix: handler → policy rule (serve, prefix = the realm's lib
//! dir) → [`RealmResolver::lookup`] on the receive loop (never blocks) →
//! * the prefix itself: the *superlib*, a host directory of empty placeholders, one per top-level
//!   entry of the bucket index (packages, modules, `*.dist-info`, `*.libs`). Listing or stat'ing
//!   the prefix shows everything the realm could import and fetches nothing.
//! * a top-level entry the index does not know: ENOENT at once.
//! * an entry whose package is installed in the realm: served from the realm lib dir inline.
//! * an entry whose package this run is downloading: its skeleton (every directory and file
//!   name) is in the lib dir as soon as the download starts ([`fetcher::Placement`]); a
//!   directory, or a file the unpacker has verified, is served from the lib dir inline, so an
//!   import runs while the rest of its package is still arriving.
//! * otherwise [`Lookup::Fetch`]: a [`crate::serve::Deferred`] worker starts
//!   `RealmCache::ensure_path` on this module's tokio runtime (single flight across tasks and
//!   processes is the fetcher's) and waits until the file it needs is verified or the package
//!   installed, then the same serve function answers the call.
//!
//! Failures (store down, credentials, missing bucket or object, integrity) fail the call with
//! ENOENT (not there) or EIO (everything else) within the fetcher's bounded time, print one line
//! per distinct cause, and are remembered for [`FAIL_TTL`] so a package that cannot be fetched
//! costs one bounded wait, not one per call.
#![forbid(unsafe_code)]

use crate::serve::{Lookup, Resolver, Served};
use anyhow::{anyhow, Context as _};
use fetcher::index::TopLevelEntry;
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchConfig, FetchError, Index, RealmCache};
use nix::errno::Errno;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a failed fetch of a package is answered from memory before it is tried again.
pub const FAIL_TTL: Duration = Duration::from_secs(10);

/// Packages prefetched at once (each install streams, decompresses and hashes on its own thread).
const PREFETCH_PARALLEL: usize = 4;

/// How long a run whose target has exited waits for the installs it has placed in the lib dir
/// (a target that needed a package's first files may exit before the rest has arrived); past
/// this, the install is cut and the next run's recovery starts it over.
const FINISH_BOUND: Duration = Duration::from_secs(120);

/// Archive bytes a run downloads, unasked, to complete its realm (see `complete_realm`): small
/// enough that a supervisor whose target exits at once waits a fraction of a second for it.
const COMPLETE_MAX_BYTES: u64 = 8 << 20;

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

/// The lazy backend's [`fetcher::Placement`]: nothing to tell (its image shows every name).
struct NoSkeleton;

impl fetcher::Placement for NoSkeleton {
    fn placed(&self, _pkg: &fetcher::index::Package) {}
    fn ended(&self, _pkg: &fetcher::index::Package, _result: Result<(), &FetchError>) {}
}

/// Whether `path` was modified less than `age` ago.
fn recent(path: &Path, age: std::time::Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|e| e < age)
}

/// A realm's memory of why its image could not be made (root's lazy backend).
const IMAGE_UNAVAILABLE: &str = "lazy-unavailable";
/// ... and why its FUSE server could not be had.
const FUSE_UNAVAILABLE: &str = "fuse-unavailable";

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

/// The realm's host paths, known before the target starts (no network, no threads).
pub struct RealmPlan {
    pub opts: RealmOpts,
    /// Names fetched in parallel as soon as the realm starts (see [`imports_of`]).
    pub prefetch: Vec<String>,
    /// Interpreter that byte-compiles a package after this run installs it (the target's own
    /// python, so the `.pyc` files match it); `None`: no compile.
    pub compile_with: Option<PathBuf>,
    pub bucket: String,
    pub root: PathBuf,
    pub lib: PathBuf,
    realm_dir: PathBuf,
    /// The bucket's index could not be had before the start ([`tree_view`](Self::tree_view)).
    unreachable: Option<FetchError>,
    /// Run streaming downloads in fill processes that outlive the run ([`crate::fill`]).
    pub delegate: bool,
    /// The realm's index snapshot was fetched for this run ([`tree_view`](Self::tree_view)).
    snapshot_fetched: bool,
    /// Why the lazy backend does not serve this run (for `--stats`).
    lazy_note: Option<String>,
    /// The lazy image to make off this run's path ([`prepare_image`](Self::prepare_image)).
    image_to_make: Option<String>,
}

impl RealmPlan {
    /// `None` without `--bucket`. Creates the realm's lib dir (the served directory must exist
    /// when the policy opens it).
    pub fn new(opts: &RealmOpts) -> anyhow::Result<Option<RealmPlan>> {
        let Some(bucket) = opts.bucket.clone() else {
            return Ok(None);
        };
        if !opts.lib_prefix.is_absolute() || opts.lib_prefix == Path::new("/") {
            return Err(anyhow!(
                "--lib-prefix {}: must be an absolute path other than /",
                opts.lib_prefix.display()
            ));
        }
        if !(opts.fetch_timeout > 0.0 && opts.fetch_timeout < 3600.0) {
            return Err(anyhow!(
                "--fetch-timeout must be between 0 and 3600 seconds"
            ));
        }
        // The fetcher checks the full rule when the cache opens; refuse path tricks before any
        // directory is created from the name.
        if opts.realm.is_empty() || opts.realm.starts_with('.') || opts.realm.contains('/') {
            return Err(anyhow!(
                "realm {:?}: use letters, digits, '.', '_', '-', not starting with '.'",
                opts.realm
            ));
        }
        let root = match &opts.cache_dir {
            Some(d) => d.clone(),
            None => fetcher::default_cache_root_if_home().ok_or_else(|| {
                anyhow!(
                    "the default cache root {} is in a home that is not a directory (a run \
                     makes no home): pass --cache-dir DIR (or set XDG_CACHE_HOME)",
                    fetcher::default_cache_root().display()
                )
            })?,
        };
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir().context("current dir")?.join(root)
        };
        let realm_dir = root.join("realms").join(&opts.realm);
        let lib = realm_dir.join("lib");
        std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
        Ok(Some(RealmPlan {
            opts: opts.clone(),
            prefetch: Vec::new(),
            compile_with: None,
            bucket,
            root,
            lib,
            realm_dir,
            unreachable: None,
            snapshot_fetched: false,
            lazy_note: None,
            image_to_make: None,
            delegate: false,
        }))
    }

    /// The number of packages if every package of the realm's snapshot is installed and the
    /// prefix can be a mount point: then nothing is left to decide under the prefix, and the
    /// realm's lib dir is bind-mounted there read-only for the target, so the kernel answers
    /// every call (no notification). `None`: serve the prefix through notifications.
    ///
    /// Without the jail (`jailed` false) the mount point must exist on the host: the prefix is
    /// created as an empty directory if it is missing (and cannot be, for example without
    /// root: then `None`). The jail makes its own mount points in the root it builds.
    pub fn kernel_served(&self, jailed: bool) -> Option<usize> {
        let n = match fetcher::realm_complete(&self.root, &self.opts.realm) {
            Ok(n) => n?,
            Err(e) => {
                tracing::debug!(error = %e, "realm state unreadable; serving by notification");
                return None;
            }
        };
        if !jailed && !self.host_mount_point() {
            return None;
        }
        // Served by the lazy backend while it was incomplete: its images are no longer needed.
        crate::lazyfs::retire(&self.realm_dir);
        Some(n)
    }

    /// The prefix as a directory on the host (created if missing), for mounts without a jail.
    fn host_mount_point(&self) -> bool {
        let prefix = &self.opts.lib_prefix;
        if !prefix.is_dir() {
            if let Err(e) = std::fs::create_dir_all(prefix) {
                tracing::debug!(error = %e, prefix = %prefix.display(), "no mount point");
                return false;
            }
        }
        true
    }

    /// The realm shown from the store's shared package trees ([`fetcher::realm_trees`]): every
    /// package of its snapshot has its content in the store, so each top-level entry is
    /// bind-mounted read-only at the prefix over a listing of placeholders and the kernel
    /// answers every call, with nothing installed for this realm. `None`: serve otherwise.
    ///
    /// A realm never run before has no snapshot: when the store holds content at all, the
    /// bucket's index is fetched now, before the target starts (bounded by the fetch timeout;
    /// a failure is kept for the notification path to report, not tried twice).
    pub fn tree_view(&mut self, jailed: bool) -> Option<fetcher::TreeView> {
        let snapshot = self.realm_dir.join("index.json");
        let mut taken = None;
        if !snapshot.exists() && self.store_has_content() {
            taken = self.fetch_snapshot();
            self.snapshot_fetched = taken.is_some();
        }
        let view = match fetcher::realm_trees_of(&self.root, &self.opts.realm, taken.as_deref()) {
            Ok(v) => v?,
            Err(e) => {
                tracing::debug!(error = %e, "shared trees unusable; serving otherwise");
                return None;
            }
        };
        if let Some(python) = &self.compile_with {
            // Without the interpreter's own bytecode in the trees, a realm of its own (compiled
            // after install) imports faster than sources compiled at every start.
            if !cache_tag_of(python).is_some_and(|t| view.compiled_for(&t)) {
                return None;
            }
        }
        if !jailed && !self.host_mount_point() {
            return None;
        }
        // Served by the lazy backend while the store lacked a package: no longer needed.
        crate::lazyfs::retire(&self.realm_dir);
        Some(view)
    }

    /// Whether the store has any content (a fresh cache root cannot show a realm from trees).
    fn store_has_content(&self) -> bool {
        std::fs::read_dir(self.root.join("cas")).is_ok_and(|mut d| d.next().is_some())
    }

    /// Take the realm's index snapshot now, on a runtime that is gone again before the target
    /// is forked (the supervisor forks single-threaded).
    fn fetch_snapshot(&mut self) -> Option<Arc<Index>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let got = (|| -> Result<Arc<Index>, FetchError> {
            let cfg = self.fetch_config();
            let store: Arc<dyn fetcher::Store> = Arc::new(LazyStore::new(
                &self.bucket,
                &StoreOptions::default(),
                &cfg,
            )?);
            let cache = RealmCache::open(&self.root, &self.opts.realm, store, cfg)?;
            rt.block_on(cache.index())
        })();
        got.map_err(|e| {
            tracing::debug!(error = %e, "no index snapshot before the start");
            self.unreachable = Some(e);
        })
        .ok()
    }

    fn fetch_config(&self) -> FetchConfig {
        FetchConfig {
            overall_timeout: Duration::from_secs_f64(self.opts.fetch_timeout),
            ..FetchConfig::default()
        }
    }

    /// The read-only mounts (source, target) that show `view` at the prefix: the listing
    /// first (a placeholder per entry, shared by every realm with these entries, built once),
    /// then each entry over its own placeholder.
    pub fn tree_mounts(&self, view: &fetcher::TreeView) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
        let listing: Vec<TopLevelEntry> = view.entries.iter().map(|e| e.top_level()).collect();
        let superlib = build_superlib(&self.root.join("superlib"), &listing)?;
        let prefix = &self.opts.lib_prefix;
        Ok(std::iter::once((superlib, prefix.clone()))
            .chain(
                view.entries
                    .iter()
                    .map(|e| (e.source.clone(), prefix.join(&e.name))),
            )
            .collect())
    }

    /// The realm shown from trees ([`tree_view`](Self::tree_view)): only its `--stats` line.
    pub fn trees_resolver(self, view: &fetcher::TreeView) -> KernelServed {
        KernelServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            packages: view.packages(),
            how: "shared package trees",
        }
    }

    /// The lazy backend ([`RealmOpts::lazy`]): the realm's image (materialised from its index
    /// snapshot, mounted, its pre-content group marked), to be bind-mounted read-only at the
    /// prefix and served by [`start_lazy`](Self::start_lazy). `None` (serve through
    /// notifications): `--lazy=never`, no snapshot from an earlier run, no image made yet (with
    /// `auto`, jailed: made off the run's path, [`prepare_image`](Self::prepare_image)), or no
    /// image possible (said on stderr with `--lazy`; with `auto` remembered in the realm's
    /// `lazy-unavailable` for a day, so that runs do not pay for the attempt again).
    pub fn lazy_image(&mut self, jailed: bool) -> Option<LazyView> {
        match self.try_lazy_image(jailed) {
            Ok(img) => Some(img),
            Err(why) => {
                self.lazy_note = Some(why);
                None
            }
        }
    }

    /// Start making the lazy image this run found missing ([`lazy_image`](Self::lazy_image)),
    /// in a process of its own: called once the target is forked (no thread exists before).
    pub fn prepare_image(&self) {
        if let Some(key) = &self.image_to_make {
            if let Err(e) =
                crate::lazyfs::prepare_in_background(&self.root, &self.realm_dir, key, &self.bucket)
            {
                tracing::info!(realm = %self.opts.realm, "lazy image not started: {e}");
            }
        }
    }

    /// [`lazy_image`](Self::lazy_image), or why not (for `--stats`).
    fn try_lazy_image(&mut self, jailed: bool) -> Result<LazyView, String> {
        let loud = match self.opts.lazy {
            Lazy::Never => return Err("off (--lazy=never)".into()),
            Lazy::Always => true,
            Lazy::Auto => false,
        };
        // A loop mount and fanotify's pre-content events need CAP_SYS_ADMIN on the host;
        // without it, a FUSE mount (fusermount3) bound into the proc's jail.
        let root = nix::unistd::geteuid().is_root();
        if !root && !jailed {
            if loud {
                eprintln!(
                    "sigma-supervise: realm {}: the lazy backend needs root or a jail; serving \
                     by notification",
                    self.opts.realm
                );
            }
            return Err("needs root or a jail".into());
        }
        // A snapshot fetched for this run (a realm's first): its image would be made on the
        // path of a cold start, which streams faster by notification.
        let second_run = || {
            if root {
                "its image is made by the realm's second run".to_owned()
            } else {
                "its FUSE server is started by the realm's second run".to_owned()
            }
        };
        if !loud && self.snapshot_fetched {
            return Err(second_run());
        }
        // Why a backend could not be had within the last day (not tried again but with
        // `--lazy`): the image's (root's), the FUSE server's.
        let remembered = |name: &str| {
            let marker = self.realm_dir.join(name);
            recent(&marker, std::time::Duration::from_secs(24 * 3600)).then(|| {
                let why = std::fs::read_to_string(&marker).unwrap_or_default();
                why.lines().next().unwrap_or("?").to_owned()
            })
        };
        let tried_again =
            |why: String| format!("unavailable ({why}); tried again after a day, or with --lazy");
        // Root's backend is the image; where none can be made (an older kernel), and for an
        // ordinary user, the realm's FUSE server, which a jail shows.
        let image_why = if root && !loud {
            remembered(IMAGE_UNAVAILABLE)
        } else {
            None
        };
        let fuse = !root || image_why.is_some();
        if fuse && !jailed {
            return Err(tried_again(image_why.unwrap_or_default()));
        }
        if fuse && !loud {
            if let Some(why) = remembered(FUSE_UNAVAILABLE) {
                return Err(tried_again(match image_why {
                    Some(i) => format!("{i}; FUSE: {why}"),
                    None => why,
                }));
            }
        }
        let snapshot = self.realm_dir.join("index.json");
        // The image's name, remembered with the snapshot's identity (written once, by rename):
        // a warm start does not parse the index (~1 ms for numpy).
        let id = std::fs::metadata(&snapshot)
            .ok()
            .map(|m| format!("{} ", fetcher::cache::identity(&m)))
            .ok_or_else(second_run)?;
        let key_file = self.realm_dir.join("lazy-key");
        let load = || crate::lazyfs::snapshot_index(&self.realm_dir, &self.bucket);
        let mut loaded = None;
        let key = match std::fs::read_to_string(&key_file)
            .ok()
            .and_then(|s| s.strip_prefix(id.as_str()).map(|k| k.trim().to_owned()))
            .filter(|k| k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            Some(k) => k,
            None => {
                let index = load().map_err(|_| "index snapshot unreadable")?;
                let k = crate::lazyfs::LazyImage::key_of(&index);
                // Only an optimisation: a key that cannot be kept is computed again next time.
                let _ = fetcher::cache::write_renamed(&key_file, format!("{id}{k}\n").as_bytes());
                loaded = Some(index);
                k
            }
        };
        if fuse {
            let note = image_why.map(|why| format!("no image: {}", tried_again(why)));
            return self.fuse_mount(&key, loud, note);
        }
        if !jailed && !self.host_mount_point() {
            return Err("no mount point for the prefix".into());
        }
        // Made off this run's path where a jail is there (the supervisor then waits for the
        // jail's init alone, not for the process making it): the run that finds no image is
        // served by notification and the next one finds the image made. `--lazy` makes it here
        // and now.
        if !loud && jailed && !crate::lazyfs::image_ready(&self.realm_dir, &key) {
            let making = "its image is being made for the next run";
            self.image_to_make = Some(key.clone());
            // Meanwhile this run is served by the realm's FUSE server where one can be had
            // (it streams a first touch as the package arrives; notification where not).
            if remembered(FUSE_UNAVAILABLE).is_none() {
                if let Ok(view) = self.fuse_mount(&key, false, Some(making.into())) {
                    return Ok(view);
                }
            }
            return Err(making.into());
        }
        let index = || loaded.map_or_else(load, Ok);
        let made = crate::lazyfs::LazyImage::prepare_keyed(&self.realm_dir, &key, index);
        self.lazy_or_why(made.map(LazyView::Image), loud, IMAGE_UNAVAILABLE)
    }

    /// The realm's FUSE mount of snapshot `key` (its server started if none serves it).
    /// `image_note`: why root's run is not served by an image (for `--stats`).
    fn fuse_mount(
        &mut self,
        key: &str,
        loud: bool,
        image_note: Option<String>,
    ) -> Result<LazyView, String> {
        let m = crate::fusefs::attach(
            &self.root,
            &self.realm_dir,
            key,
            &self.bucket,
            self.opts.fetch_timeout,
        )
        .map(|mut m| {
            m.image_note = image_note;
            m
        });
        self.lazy_or_why(m.map(LazyView::Fuse), loud, FUSE_UNAVAILABLE)
    }

    /// `made`, or why not: said on stderr with `--lazy`, remembered for a day in the realm's
    /// `marker` (see [`lazy_image`](Self::lazy_image)).
    fn lazy_or_why(
        &mut self,
        made: Result<LazyView, crate::lazyfs::LazyError>,
        loud: bool,
        marker: &str,
    ) -> Result<LazyView, String> {
        let unavailable = self.realm_dir.join(marker);
        match made {
            Ok(mut view) => {
                if loud {
                    let _ = std::fs::remove_file(&unavailable);
                }
                // Packages installed already are shown from the lib dir (none if unreadable:
                // then their placeholders are filled like the others'): the kernel serves them
                // from the installed files, without a FUSE request either.
                match fetcher::installed_packages(&self.root, &self.opts.realm) {
                    Ok(installed) => {
                        let (packages, entries) = match &mut view {
                            LazyView::Image(img) => (&img.packages, &mut img.lib_entries),
                            LazyView::Fuse(m) => (&m.packages, &mut m.lib_entries),
                        };
                        *entries = crate::lazyfs::entries_from_lib(packages, &installed);
                        // A marker whose entry is gone (removed by hand): its placeholder
                        // stays.
                        entries.retain(|e| self.lib.join(e).symlink_metadata().is_ok());
                    }
                    Err(e) => tracing::debug!(error = %e, "installed packages unreadable"),
                }
                Ok(view)
            }
            Err(e) => {
                if loud {
                    eprintln!(
                        "sigma-supervise: realm {}: lazy backend unavailable ({e}); serving by \
                         notification",
                        self.opts.realm
                    );
                } else {
                    tracing::info!(realm = %self.opts.realm, "lazy backend unavailable ({e}); \
                                   serving by notification");
                }
                crate::lazyfs::remember(&unavailable, &e);
                Err(format!("unavailable ({e})"))
            }
        }
    }

    /// Serve `image` (already bound at the prefix): mark it and answer its first touches.
    /// `jail_init`: see [`crate::lazyfs::FillServer::start`].
    pub fn start_lazy(
        self,
        image: crate::lazyfs::LazyImage,
        jail_init: Option<std::os::fd::OwnedFd>,
    ) -> anyhow::Result<LazyServed> {
        // Completed like a realm served by notification: once every package is installed, the
        // next start mounts the lib dir and the image is no longer needed.
        let (rt, cache, reported, _) = self.open_cache(false, true, None)?;
        let report = reporter(reported, self.opts.realm.clone(), self.bucket.clone());
        let from_lib = image.lib_entries.len();
        let server = crate::lazyfs::FillServer::start(
            image,
            cache.clone(),
            rt.handle().clone(),
            report,
            jail_init,
        )
        .map_err(|e| anyhow!("realm {}: {e}", self.opts.realm))?;
        Ok(LazyServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            stats: server.stats,
            cache,
            from_lib,
            delegated: self.delegate,
            _rt: rt,
        })
    }

    /// The realm shown by its FUSE server ([`crate::fusefs`]): only its `--stats` line.
    pub fn fuse_served(self, mount: crate::fusefs::FuseMount) -> FuseServed {
        FuseServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            mount,
        }
    }

    /// The realm when [`kernel_served`](Self::kernel_served): only its `--stats` line.
    pub fn kernel_served_resolver(self, packages: usize) -> KernelServed {
        KernelServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            packages,
            how: "lib dir",
        }
    }

    /// The `--serve` rule for the lib dir.
    pub fn serve_rule(&self) -> String {
        format!("{}={}", self.opts.lib_prefix.display(), self.lib.display())
    }

    /// PYTHONPATH for the target: `existing` with the prefix appended.
    pub fn pythonpath(&self, existing: Option<&std::ffi::OsStr>) -> std::ffi::OsString {
        let mut v = std::ffi::OsString::new();
        if let Some(e) = existing.filter(|e| !e.is_empty()) {
            v.push(e);
            v.push(":");
        }
        v.push(self.opts.lib_prefix.as_os_str());
        v
    }

    /// Open the store and the realm cache, get the realm's index (its snapshot, else one GET
    /// bounded by the fetch timeout) and build the superlib. Starts threads: call after fork.
    /// An unreachable index is reported and leaves an empty library, not an error.
    /// The fetch runtime, the realm cache and its index (reported, `None`, if unreachable);
    /// prefetch started. Starts threads: call after fork.
    #[allow(clippy::type_complexity)]
    fn open_cache(
        &self,
        load_index: bool,
        complete: bool,
        streams: Option<&Arc<Streams>>,
    ) -> anyhow::Result<(
        tokio::runtime::Runtime,
        Arc<RealmCache>,
        Arc<Mutex<HashSet<String>>>,
        Option<Arc<Index>>,
    )> {
        let cfg = self.fetch_config();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sigma-fetch")
            .enable_all()
            .build()
            .context("starting the fetch runtime")?;
        // Connected on first use: a realm served from its snapshot and cache never needs it.
        let store: Arc<dyn fetcher::Store> = Arc::new(
            LazyStore::new(&self.bucket, &StoreOptions::default(), &cfg)
                .with_context(|| format!("bucket {}", self.bucket))?,
        );
        let cache = RealmCache::open(&self.root, &self.opts.realm, store, cfg)
            .with_context(|| format!("realm {}", self.opts.realm))?;
        let cache = Arc::new(cache);
        let fill_procs = |started: Box<dyn Fn(&fetcher::index::Package) + Send + Sync>| {
            Arc::new(crate::fill::FillProcs {
                root: self.root.clone(),
                realm: self.opts.realm.clone(),
                bucket: self.bucket.clone(),
                timeout: Duration::from_secs_f64(self.opts.fetch_timeout),
                lib: self.lib.clone(),
                started,
            })
        };
        match streams {
            Some(streams) => {
                // Before any install starts (the prefetch below), so every download streams.
                streams.attach(&cache);
                if self.delegate {
                    let weak = Arc::downgrade(streams);
                    cache.set_delegate(fill_procs(Box::new(move |pkg| {
                        if let Some(streams) = weak.upgrade() {
                            lock(&streams.get_or_insert(&pkg.name).state).delegated = true;
                        }
                    })));
                }
            }
            // The lazy backend's downloads go to fill processes too, so a package a run
            // started is installed after it (and shown from the lib dir from then on); the
            // image, not the lib dir, shows its names meanwhile.
            None if self.delegate => {
                cache.set_placement(Arc::new(NoSkeleton));
                cache.set_delegate(fill_procs(Box::new(|_| {})));
            }
            None => {}
        }
        let reported = Arc::new(Mutex::new(HashSet::new()));
        // The lazy backend needs no index up front (its image map names every file): the
        // fetcher loads it on the first fill, off the target's start-up.
        // An index that could not be had before the start is not waited for twice.
        let index = match self
            .unreachable
            .clone()
            .map(Err)
            .or_else(|| load_index.then(|| rt.block_on(cache.index())))
        {
            Some(Ok(i)) => Some(i),
            Some(Err(e)) => {
                report_once(&reported, &self.opts.realm, &self.bucket, &e);
                None
            }
            None => None,
        };
        let usable = index.is_some() || !load_index;
        if usable && !self.opts.no_prefetch {
            // Fetch what the command names while the interpreter starts; the target's own
            // calls join these installs (single flight) instead of starting them. Then, when
            // asked, complete the realm (see complete_realm).
            let (cache, names) = (cache.clone(), self.prefetch.clone());
            rt.spawn(async move {
                prefetch(&cache, &names).await;
                if complete {
                    complete_realm(&cache).await;
                }
            });
        }
        Ok((rt, cache, reported, index))
    }

    pub fn start(self) -> anyhow::Result<RealmResolver> {
        let streams = Arc::new(Streams {
            lib: self.lib.clone(),
            by_pkg: Mutex::new(HashMap::new()),
            idle: Condvar::new(),
            files: AtomicU64::new(0),
            report: std::sync::OnceLock::new(),
        });
        let (rt, cache, reported, index) = self.open_cache(true, true, Some(&streams))?;
        let report = reporter(
            reported.clone(),
            self.opts.realm.clone(),
            self.bucket.clone(),
        );
        let _ = streams.report.set(report);
        let entries: Vec<TopLevelEntry> = index
            .as_deref()
            .map(Index::top_level_entries)
            .unwrap_or_default();
        let superlib_dir = build_superlib(&self.realm_dir.join("superlib"), &entries)?;
        let superlib = Served::open(self.opts.lib_prefix.clone(), superlib_dir)
            .map_err(|e| anyhow!("superlib: {e}"))?;
        Ok(RealmResolver {
            prefix: self.opts.lib_prefix.clone(),
            owners: entries.into_iter().map(|e| (e.name, e.package)).collect(),
            superlib,
            cache,
            rt: Detached::new(rt),
            streams,
            sh: Arc::new(Outcomes {
                realm: self.opts.realm.clone(),
                bucket: self.bucket,
                installed: Mutex::new(HashSet::new()),
                failed: Mutex::new(HashMap::new()),
                reported,
                cache_tag: self.compile_with.as_deref().and_then(cache_tag_of),
                compile_with: self.compile_with,
            }),
            inline_hits: AtomicU64::new(0),
            streamed_hits: AtomicU64::new(0),
            lazy_note: self.lazy_note,
        })
    }
}

/// Install the packages that provide `names` (a Python command's imports), a few at a time.
async fn prefetch(cache: &RealmCache, names: &[String]) {
    if names.is_empty() {
        return;
    }
    match cache.prefetch(names, PREFETCH_PARALLEL).await {
        Ok(outs) => {
            for o in outs {
                match o {
                    Ok(o) => tracing::debug!(package = %o.package, "prefetched"),
                    Err(e) => tracing::debug!(error = %e, "prefetch failed"),
                }
            }
        }
        Err(e) => tracing::debug!(error = %e, "prefetch failed"),
    }
}

/// Install, during the run, the realm's packages its targets have not touched yet when what is
/// left to download is small (at most [`COMPLETE_MAX_BYTES`] of archives; content already in
/// the store only costs links): the realm is then complete, and its next start is a plain
/// read-only mount the kernel serves, with no notification at all. A realm with more left (a
/// large bucket mostly unused) stays served by notification. Best effort: a target that exits
/// first ends the run and the completion with it (the next run tries again).
async fn complete_realm(cache: &RealmCache) {
    let Ok(index) = cache.index().await else {
        return;
    };
    let missing: Vec<&fetcher::index::Package> = index
        .packages()
        .values()
        .filter(|p| !cache.is_installed(&p.name))
        .collect();
    let to_download: u64 = missing
        .iter()
        .filter(|p| !cache.in_store(p))
        .map(|p| p.archive.size)
        .sum();
    if missing.is_empty() || to_download > COMPLETE_MAX_BYTES {
        return;
    }
    let names: Vec<String> = missing
        .iter()
        .filter_map(|p| p.top_level.first().cloned())
        .collect();
    tracing::debug!(packages = names.len(), to_download, "completing the realm");
    prefetch(cache, &names).await;
}

/// A realm image bind-mounted at the prefix, filled on first touch: nothing reaches the
/// notification path.
pub struct LazyServed {
    realm: String,
    bucket: String,
    stats: Arc<crate::lazyfs::FillStats>,
    cache: Arc<RealmCache>,
    /// Top-level entries shown from the lib dir over the image.
    from_lib: usize,
    /// Downloads go to fill processes (which finish them on their own).
    delegated: bool,
    _rt: tokio::runtime::Runtime,
}

impl Resolver for LazyServed {
    fn lookup<'a>(&'a self, _served: &'a Served, _rest: &Path) -> Lookup<'a> {
        Lookup::Local
    }

    /// An install this process downloads itself (no fill process: `--fill-process never`, or
    /// no jail) may still be under way after the target has its files: finished here (at most
    /// [`FINISH_BOUND`]), so the package is complete for the next run, as with notifications.
    fn finish(&self) {
        if self.delegated {
            return;
        }
        self.stats.wait_installs(FINISH_BOUND);
    }

    fn report(&self) -> Option<String> {
        let (f, c) = (&self.stats, self.cache.stats());
        Some(format!(
            "sigma-supervise realm {} ({}): backend lazy (ext4 image, pre-content events; \
             {} installed entries shown from the lib dir): filled {} files, {} bytes; already \
             present {}; denied {}; fetched {} packages, {} bytes, {} GETs\n",
            self.realm,
            self.bucket,
            self.from_lib,
            f.filled.load(Ordering::Relaxed),
            f.bytes.load(Ordering::Relaxed),
            f.present.load(Ordering::Relaxed),
            f.denied.load(Ordering::Relaxed),
            c.packages_fetched,
            c.bytes_fetched,
            c.gets
        ))
    }
}

/// The lazy backend's view of an incomplete realm, bound read-only at the prefix.
pub enum LazyView {
    /// An ext4 image with pre-content events (root).
    Image(crate::lazyfs::LazyImage),
    /// The realm's FUSE server's mount (an ordinary user).
    Fuse(crate::fusefs::FuseMount),
}

impl LazyView {
    /// Where it is mounted on the host.
    pub fn mnt(&self) -> &Path {
        match self {
            LazyView::Image(i) => &i.mnt,
            LazyView::Fuse(f) => &f.mnt,
        }
    }

    /// Top-level entries shown from the lib dir over it.
    pub fn lib_entries(&self) -> &[String] {
        match self {
            LazyView::Image(i) => &i.lib_entries,
            LazyView::Fuse(f) => &f.lib_entries,
        }
    }
}

/// A realm shown by its FUSE server: the kernel asks the server, nothing reaches here. Keeps
/// the run's hold on the mount ([`crate::fusefs::FuseMount`]) until the run ends.
pub struct FuseServed {
    realm: String,
    bucket: String,
    mount: crate::fusefs::FuseMount,
}

impl Resolver for FuseServed {
    fn lookup<'a>(&'a self, _served: &'a Served, _rest: &Path) -> Lookup<'a> {
        Lookup::Local
    }

    fn report(&self) -> Option<String> {
        Some(format!(
            "sigma-supervise realm {} ({}): backend lazy (FUSE{}: the realm's server, pid {}, \
             {}; {} installed entries shown from the lib dir): the server so far: {}\n",
            self.realm,
            self.bucket,
            match &self.mount.image_note {
                Some(note) => format!("; {note}"),
                None => String::new(),
            },
            self.mount.server,
            if self.mount.started {
                "started by this run"
            } else {
                "already serving"
            },
            self.mount.lib_entries.len(),
            std::fs::read_to_string(&self.mount.stats)
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "no counters".into()),
        ))
    }
}

/// A complete realm bind-mounted at the prefix (its lib dir, or the shared trees of its
/// packages): the kernel serves it, nothing reaches here.
pub struct KernelServed {
    realm: String,
    bucket: String,
    packages: usize,
    /// What is mounted.
    how: &'static str,
}

impl Resolver for KernelServed {
    fn lookup<'a>(&'a self, _served: &'a Served, _rest: &Path) -> Lookup<'a> {
        Lookup::Local
    }

    fn report(&self) -> Option<String> {
        Some(format!(
            "sigma-supervise realm {} ({}): backend kernel (bind mount): all {} packages \
             installed; {} mounted read-only, served by the kernel\n",
            self.realm, self.bucket, self.packages, self.how
        ))
    }
}

/// Build (once per distinct set of entries) `<base>/<hash>/` with one empty placeholder per
/// top-level entry: staged under a temporary name and renamed into place, so a reader never
/// sees half a listing; concurrent supervisors of a realm build the same name and share it.
pub fn build_superlib(base: &Path, entries: &[TopLevelEntry]) -> anyhow::Result<PathBuf> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for e in entries {
        (&e.name, e.is_dir).hash(&mut h);
    }
    let dir = base.join(format!("{:016x}", h.finish()));
    if dir.is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(base).with_context(|| format!("creating {}", base.display()))?;
    let tmp = base.join(format!(
        ".tmp-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let staged = (|| -> std::io::Result<()> {
        std::fs::create_dir(&tmp)?;
        for e in entries {
            // Index names are single normal components (the fetcher validates them).
            let p = tmp.join(&e.name);
            if e.is_dir {
                std::fs::create_dir(&p)?;
            } else {
                std::fs::File::create(&p)?;
            }
        }
        std::fs::File::open(&tmp)?.sync_all()
    })();
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e).with_context(|| format!("building the superlib in {}", tmp.display()));
    }
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another supervisor of this realm put the same listing there first.
        Err(_) if dir.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e).with_context(|| format!("renaming the superlib to {}", dir.display()))
        }
    }
}

fn report_once(reported: &Mutex<HashSet<String>>, realm: &str, bucket: &str, e: &FetchError) {
    let msg = e.to_string();
    let new = reported
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(msg.clone());
    if new {
        eprintln!("sigma-supervise: realm {realm}, bucket {bucket}: {msg}");
    }
}

/// The errno a failed fetch gives the target's call.
pub fn errno_for(e: &FetchError) -> Errno {
    if e.is_not_found() {
        Errno::ENOENT
    } else {
        Errno::EIO
    }
}

/// Serves the realm's lib prefix; every other served directory is plain local.
pub struct RealmResolver {
    prefix: PathBuf,
    /// Top-level entry → owning package (from the realm's index).
    owners: HashMap<String, String>,
    superlib: Served,
    cache: Arc<RealmCache>,
    rt: Detached,
    /// Packages being downloaded into the lib dir by this run.
    streams: Arc<Streams>,
    sh: Arc<Outcomes>,
    inline_hits: AtomicU64,
    /// Calls answered inline from a package still being downloaded.
    streamed_hits: AtomicU64,
    /// Why the lazy backend does not serve this run.
    lazy_note: Option<String>,
}

/// The fetch runtime of a run served by notification. Dropped, it does not wait for its
/// blocking tasks: a fill process's install goes on without the run (the task reading its
/// report would otherwise hold the run's exit until the whole package is in), and the installs
/// the run made itself were waited for by [`Resolver::finish`], or are cut for a proc the user
/// stopped, as by a kill: the next run recovers them.
struct Detached {
    handle: tokio::runtime::Handle,
    rt: Option<tokio::runtime::Runtime>,
}

impl Detached {
    fn new(rt: tokio::runtime::Runtime) -> Self {
        Detached {
            handle: rt.handle().clone(),
            rt: Some(rt),
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What the resolver remembers of finished ensures (shared with the tasks that run them).
struct Outcomes {
    realm: String,
    bucket: String,
    /// Packages known complete (saves the marker stat).
    installed: Mutex<HashSet<String>>,
    /// Package → when its fetch failed and with which errno.
    failed: Mutex<HashMap<String, (Instant, Errno)>>,
    reported: Arc<Mutex<HashSet<String>>>,
    compile_with: Option<PathBuf>,
    /// `cpython-311` for `python3.11`, when the interpreter's file name tells.
    cache_tag: Option<String>,
}

/// Says a fetch error to the user (once per message: [`report_once`]).
type ReportFn = Arc<dyn Fn(&FetchError) + Send + Sync>;

/// [`report_once`] for `realm` and `bucket`, as a [`ReportFn`].
fn reporter(reported: Arc<Mutex<HashSet<String>>>, realm: String, bucket: String) -> ReportFn {
    Arc::new(move |e| report_once(&reported, &realm, &bucket, e))
}

/// Packages whose download streams into the lib dir (see [`fetcher::Placement`]): from
/// `placed` to the end of the install, their names are all there and a file may be served
/// once the unpacker has announced it verified.
struct Streams {
    lib: PathBuf,
    by_pkg: Mutex<HashMap<String, Arc<Stream>>>,
    /// Notified (with `by_pkg`) when a placed install ends.
    idle: Condvar,
    /// Files announced verified while their package was incomplete.
    files: AtomicU64,
    /// Says a failed install (once per message, as the ensure that started it does): set once
    /// the cache is open. A waiter may be answered, and the run end, before that ensure ends.
    report: std::sync::OnceLock<ReportFn>,
}

/// One package's download, as the resolver's waiters see it.
#[derive(Default)]
struct Stream {
    state: Mutex<StreamState>,
    changed: Condvar,
}

#[derive(Default)]
struct StreamState {
    /// The package's files not verified yet (index paths); `None` until its skeleton is placed.
    pending: Option<HashSet<String>>,
    /// The wait is over: the package is installed (`Ok`) or its ensure failed.
    done: Option<Result<(), Errno>>,
    /// An ensure of the package was started for this stream's waiters.
    started: bool,
    /// The download runs in a fill process, which completes it whether or not this run lasts.
    delegated: bool,
}

impl StreamState {
    /// Whether `rel` (a normalised path under the prefix) can be served from the lib dir now:
    /// the skeleton is placed and `rel` is not a file still to come (a directory, a verified
    /// file, or a name the package does not have, which the kernel answers).
    fn servable(&self, rel: &str) -> bool {
        matches!(self.done, Some(Ok(())))
            || (self.done.is_none() && self.pending.as_ref().is_some_and(|p| !p.contains(rel)))
    }
}

impl Stream {
    fn finish(&self, result: Result<(), Errno>) {
        lock(&self.state).done.get_or_insert(result);
        self.changed.notify_all();
    }
}

impl Streams {
    /// Make `cache`'s downloads stream into its lib dir, each verified file announced here.
    fn attach(self: &Arc<Self>, cache: &RealmCache) {
        cache.set_placement(self.clone());
        let weak = Arc::downgrade(self);
        cache.set_file_hook(Arc::new(move |_sha: &str, file: &Path| {
            if let Some(streams) = weak.upgrade() {
                streams.verified(file);
            }
        }));
    }

    /// Wait, at most `bound`, until no install this process placed in the lib dir is under
    /// way (a fill process's install goes on without this run).
    fn wait_placed(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let mut map = lock(&self.by_pkg);
        loop {
            let busy = map.values().any(|st| {
                let s = lock(&st.state);
                s.pending.is_some() && s.done.is_none() && !s.delegated
            });
            let left = deadline.saturating_duration_since(Instant::now());
            if !busy || left.is_zero() {
                return;
            }
            map = self
                .idle
                .wait_timeout(map, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Installs left to fill processes that have not ended yet.
    fn arriving(&self) -> usize {
        lock(&self.by_pkg)
            .values()
            .filter(|st| {
                let s = lock(&st.state);
                s.delegated && s.done.is_none()
            })
            .count()
    }

    fn get(&self, pkg: &str) -> Option<Arc<Stream>> {
        lock(&self.by_pkg).get(pkg).cloned()
    }

    fn get_or_insert(&self, pkg: &str) -> Arc<Stream> {
        lock(&self.by_pkg)
            .entry(pkg.to_owned())
            .or_default()
            .clone()
    }

    /// The unpacker verified the file at `file` (a lib-dir path while a stream is placed).
    fn verified(&self, file: &Path) {
        let Some(rel) = file.strip_prefix(&self.lib).ok().and_then(Path::to_str) else {
            return;
        };
        for st in lock(&self.by_pkg).values() {
            let removed = lock(&st.state)
                .pending
                .as_mut()
                .is_some_and(|p| p.remove(rel));
            if removed {
                self.files.fetch_add(1, Ordering::Relaxed);
                st.changed.notify_all();
                return;
            }
        }
    }
}

impl fetcher::Placement for Streams {
    fn placed(&self, pkg: &fetcher::index::Package) {
        let st = self.get_or_insert(&pkg.name);
        lock(&st.state).pending = Some(pkg.files.iter().map(|f| f.path.clone()).collect());
        st.changed.notify_all();
        if jail::marking() {
            jail::mark(&format!("placed:{}", pkg.name));
        }
    }

    fn ended(&self, pkg: &fetcher::index::Package, result: Result<(), &FetchError>) {
        if jail::marking() {
            jail::mark(&format!("ended:{}", pkg.name));
        }
        if let (Err(e), Some(report)) = (result, self.report.get()) {
            report(e);
        }
        // Later lookups see the marker (or, after a failure, start over); waiters keep theirs.
        let mut map = lock(&self.by_pkg);
        if let Some(st) = map.remove(&pkg.name) {
            st.finish(result.map_err(errno_for));
        }
        drop(map);
        self.idle.notify_all();
    }
}

/// `rest` as the index spells paths (`numpy/core/x.py`), if it is made of plain names only.
fn index_path(rest: &Path) -> Option<String> {
    let mut out = String::new();
    for c in rest.components() {
        let Component::Normal(name) = c else {
            return None;
        };
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(name.to_str()?);
    }
    Some(out)
}

/// The bytecode cache tag of a CPython, from the name its path resolves to (`python3.11` →
/// `cpython-311`); `None` when the name does not tell (then a package is compiled after install).
pub fn cache_tag_of(python: &Path) -> Option<String> {
    let real = std::fs::canonicalize(python).ok()?;
    let version = real.file_name()?.to_str()?.strip_prefix("python")?;
    let (major, minor) = version.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(major) && digits(minor)).then(|| format!("cpython-{major}{minor}"))
}

/// The interpreter to byte-compile with, if PROGRAM is a CPython (`python`, `python3.11`).
pub fn python_of(program: &Path) -> Option<PathBuf> {
    let name = program.file_name()?.to_str()?;
    name.starts_with("python").then(|| program.to_path_buf())
}

/// Top-level module names a Python command line is about to import, for prefetching: the
/// `import` lines of `-c CODE` or of the script (its first MiB), or the `-m` module. A
/// heuristic: a name missed here is fetched when the target first touches it, a name found
/// here that no package provides is ignored.
pub fn imports_of(command: &[std::ffi::OsString]) -> Vec<String> {
    let mut args = command.iter().skip(1).map(|a| a.to_string_lossy());
    let mut source = None;
    while let Some(a) = args.next() {
        match &*a {
            "-c" => {
                source = args.next().map(|c| c.into_owned());
                break;
            }
            "-m" => return args.next().map(|m| top_name(&m)).into_iter().collect(),
            "-X" | "-W" | "--check-hash-based-pycs" => {
                args.next();
            }
            s if s.starts_with("-c") && s.len() > 2 => {
                source = Some(s[2..].to_owned());
                break;
            }
            s if s.starts_with('-') => {}
            _ => {
                // The script: its path as given, not as lossily decoded.
                let script = &command[command.len() - args.len() - 1];
                let mut text = Vec::new();
                // Regular files only: a FIFO or /dev/stdin would block here or eat the
                // target's input.
                let regular = std::fs::metadata(script).is_ok_and(|m| m.is_file());
                if let Some(f) = regular.then(|| std::fs::File::open(script).ok()).flatten() {
                    use std::io::Read as _;
                    let _ = f.take(1 << 20).read_to_end(&mut text);
                }
                source = Some(String::from_utf8_lossy(&text).into_owned());
                break;
            }
        }
    }
    let mut names: Vec<String> = Vec::new();
    for stmt in source.iter().flat_map(|s| s.split(['\n', ';'])) {
        let stmt = stmt.trim();
        let found: Vec<String> = if let Some(rest) = stmt.strip_prefix("import ") {
            rest.split(',')
                .filter_map(|n| n.split_whitespace().next())
                .map(top_name)
                .collect()
        } else if let Some(rest) = stmt.strip_prefix("from ") {
            rest.split_whitespace()
                .next()
                .filter(|m| !m.starts_with('.'))
                .map(top_name)
                .into_iter()
                .collect()
        } else {
            continue;
        };
        for n in found {
            let ident = !n.is_empty()
                && n.chars().all(|c| c.is_alphanumeric() || c == '_')
                && !n.starts_with(|c: char| c.is_ascii_digit());
            if ident && !names.contains(&n) {
                names.push(n);
            }
        }
    }
    names
}

fn top_name(dotted: &str) -> String {
    dotted.split('.').next().unwrap_or("").to_owned()
}

fn first_component(rest: &Path) -> Option<&str> {
    match rest.components().next()? {
        Component::Normal(c) => c.to_str(),
        _ => None,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts/removes: a panic cannot leave these maps inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Outcomes {
    /// Record how the ensure of `pkg` ended and turn it into the target's answer.
    fn record(
        &self,
        pkg: &str,
        result: Result<Option<fetcher::EnsureOutcome>, FetchError>,
    ) -> Result<(), Errno> {
        match result {
            Ok(Some(out)) => {
                tracing::debug!(package = %out.package, fetched = out.fetched, "ensured");
                // Published bytecode for this interpreter needs no compile.
                let shipped = out.bytecode.is_some() && out.bytecode == self.cache_tag;
                if out.installed && !shipped {
                    self.compile(&out.dir);
                }
                lock(&self.installed).insert(pkg.to_owned());
                Ok(())
            }
            Ok(None) => Err(Errno::ENOENT),
            Err(e) => {
                report_once(&self.reported, &self.realm, &self.bucket, &e);
                let errno = errno_for(&e);
                lock(&self.failed).insert(pkg.to_owned(), (Instant::now(), errno));
                Err(errno)
            }
        }
    }

    /// Byte-compile a package this run installed, as pip does at install time, so later runs
    /// import from `.pyc` (the target cannot write into the read-only prefix). In the
    /// background: the target's own import does not wait; the supervisor reaps it at exit.
    fn compile(&self, entry: &Path) {
        let Some(py) = self.compile_with.clone() else {
            return;
        };
        let entry = entry.to_path_buf();
        let _ = std::thread::Builder::new()
            .name("sigma-compile".into())
            .spawn(move || {
                let r = std::process::Command::new(&py)
                    .args(["-I", "-m", "compileall", "-q", "-j", "0"])
                    .arg(&entry)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn();
                // The supervisor's reaper may collect it first (ECHILD here): nothing to do.
                if let Ok(mut c) = r {
                    // Ours, not the proc's: the orphan rule leaves it to finish.
                    crate::handlers::signal::register_helper(c.id() as i32);
                    let _ = c.wait();
                }
            });
    }
}

impl RealmResolver {
    fn owner(&self, rest: &Path) -> Option<&str> {
        self.owners.get(first_component(rest)?).map(String::as_str)
    }
}

impl Resolver for RealmResolver {
    fn lookup<'a>(&'a self, served: &'a Served, rest: &Path) -> Lookup<'a> {
        if served.prefix != self.prefix {
            return Lookup::Local;
        }
        if rest.as_os_str().is_empty() {
            return Lookup::At(&self.superlib);
        }
        let Some(pkg) = self.owner(rest) else {
            return Lookup::Fail(Errno::ENOENT);
        };
        if lock(&self.sh.installed).contains(pkg) {
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        // Being downloaded by this run: what is there already is served from the lib dir.
        if let Some(st) = self.streams.get(pkg) {
            let servable = index_path(rest).is_some_and(|rel| lock(&st.state).servable(&rel));
            if servable {
                self.streamed_hits.fetch_add(1, Ordering::Relaxed);
                return Lookup::Local;
            }
        }
        // A marker stat: another process (or an earlier run) may have installed it.
        if self.cache.is_installed(pkg) {
            lock(&self.sh.installed).insert(pkg.to_owned());
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        if let Some(&(at, errno)) = lock(&self.sh.failed).get(pkg) {
            if at.elapsed() < FAIL_TTL {
                return Lookup::Fail(errno);
            }
        }
        Lookup::Fetch
    }

    /// Runs on a deferred worker: make sure an ensure of the package is under way, then wait
    /// until `rest` is servable (its file verified, or the package installed) or the ensure
    /// failed. The ensure runs as a task of its own, so it is never cut short by a waiter that
    /// got its file early.
    fn fetch(&self, served: &Served, rest: &Path) -> Result<(), Errno> {
        if served.prefix != self.prefix {
            return Ok(());
        }
        let pkg = self.owner(rest).ok_or(Errno::ENOENT)?.to_owned();
        let st = self.streams.get_or_insert(&pkg);
        let start = !std::mem::replace(&mut lock(&st.state).started, true);
        if start {
            let (cache, sh, st2, rest2) = (
                self.cache.clone(),
                self.sh.clone(),
                st.clone(),
                rest.to_path_buf(),
            );
            let streams = self.streams.clone();
            self.rt.handle.spawn(async move {
                let result = sh.record(&pkg, cache.ensure_path(&rest2).await);
                // A stream nobody placed (already installed, linked from the store, or failed
                // before a download) ends here; a placed one usually ended already.
                {
                    let mut map = lock(&streams.by_pkg);
                    if map.get(&pkg).is_some_and(|s| Arc::ptr_eq(s, &st2)) {
                        map.remove(&pkg);
                    }
                }
                st2.finish(result);
            });
        }
        let rel = index_path(rest);
        let marks = jail::marking().then(|| format!("{}", rest.display()));
        if let Some(m) = &marks {
            jail::mark(&format!("wait:{m}"));
        }
        let state = st
            .changed
            .wait_while(lock(&st.state), |s| {
                s.done.is_none() && !rel.as_deref().is_some_and(|r| s.servable(r))
            })
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = &marks {
            jail::mark(&format!("woke:{m}"));
        }
        match state.done {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// A target may exit once it has the files it needed, before the rest of a package it
    /// started has arrived: that install is finished here, so the package is complete for the
    /// next run instead of fetched again.
    fn finish(&self) {
        self.streams.wait_placed(FINISH_BOUND);
    }

    fn report(&self) -> Option<String> {
        let s = self.cache.stats();
        Some(format!(
            "sigma-supervise realm {} ({}): backend notification{}: fetched {} packages, {} \
             bytes, {} GETs; installed {}; cache hits {}; fetch time {:.3} ms; streamed {} \
             files, {} calls served before their package was complete; {} packages still \
             arriving (left to their fill processes)\n",
            self.sh.realm,
            self.sh.bucket,
            self.lazy_note
                .as_ref()
                .map(|n| format!(" (lazy backend: {n})"))
                .unwrap_or_default(),
            s.packages_fetched,
            s.bytes_fetched,
            s.gets,
            s.packages_installed,
            s.cache_hits + self.inline_hits.load(Ordering::Relaxed),
            s.fetch_time.as_secs_f64() * 1e3,
            self.streams.files.load(Ordering::Relaxed),
            self.streamed_hits.load(Ordering::Relaxed),
            self.streams.arriving()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, is_dir: bool) -> TopLevelEntry {
        TopLevelEntry {
            name: name.into(),
            is_dir,
            package: "p".into(),
        }
    }

    #[test]
    fn cache_tag_follows_links_to_the_versioned_name() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("python3.12");
        std::fs::write(&real, "").unwrap();
        std::os::unix::fs::symlink(&real, tmp.path().join("python3")).unwrap();
        std::fs::write(tmp.path().join("python"), "").unwrap();
        std::fs::write(tmp.path().join("python3.x"), "").unwrap();
        let tag = |n: &str| cache_tag_of(&tmp.path().join(n));
        assert_eq!(tag("python3").as_deref(), Some("cpython-312"));
        assert_eq!(tag("python3.12").as_deref(), Some("cpython-312"));
        assert_eq!(tag("python"), None, "the name does not tell");
        assert_eq!(tag("python3.x"), None);
        assert_eq!(tag("missing"), None);
    }

    #[test]
    fn superlib_lists_every_entry_and_is_shared() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("superlib");
        let es = [
            entry("numpy", true),
            entry("numpy.libs", true),
            entry("numpy-2.1.3.dist-info", true),
            entry("six.py", false),
        ];
        let d = build_superlib(&base, &es).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().into_string().unwrap(), e.path().is_dir()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("numpy".to_string(), true),
                ("numpy-2.1.3.dist-info".to_string(), true),
                ("numpy.libs".to_string(), true),
                ("six.py".to_string(), false)
            ]
        );
        // Same entries: the same directory, nothing staged left behind.
        assert_eq!(build_superlib(&base, &es).unwrap(), d);
        let other = build_superlib(&base, &es[..1]).unwrap();
        assert_ne!(other, d);
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 2);
        // No index: an empty listing.
        let empty = build_superlib(&base, &[]).unwrap();
        assert_eq!(std::fs::read_dir(empty).unwrap().count(), 0);
    }

    #[test]
    fn imports_named_by_a_python_command() {
        let cmd = |a: &[&str]| imports_of(&a.iter().map(|s| s.into()).collect::<Vec<_>>());
        assert_eq!(
            cmd(&[
                "python3",
                "-I",
                "-c",
                "import numpy as np, six; from pandas.core import x"
            ]),
            ["numpy", "six", "pandas"]
        );
        assert_eq!(
            cmd(&[
                "python3",
                "-X",
                "importtime",
                "-c",
                "from . import x;import a.b"
            ]),
            ["a"]
        );
        assert_eq!(cmd(&["python3", "-m", "pytest.main", "-q"]), ["pytest"]);
        let tmp = tempfile::tempdir().unwrap();
        let script = tmp.path().join("s.py");
        std::fs::write(
            &script,
            "#!/usr/bin/env python3\nimport os\n  import yaml\nx = 'import'\n",
        )
        .unwrap();
        let s = script.to_str().unwrap();
        assert_eq!(
            cmd(&["python3", "-u", s, "-c", "import no"]),
            ["os", "yaml"]
        );
        assert!(cmd(&["python3", "/nonexistent.py"]).is_empty());
        assert!(
            cmd(&["python3", "/dev/stdin"]).is_empty(),
            "never reads a device"
        );
        assert!(cmd(&["python3", tmp.path().to_str().unwrap()]).is_empty());
        assert!(cmd(&["python3"]).is_empty());
    }

    #[test]
    fn errnos_of_fetch_failures() {
        let nf = FetchError::NoSuchPackage {
            bucket: "b".into(),
            name: "x".into(),
        };
        let down = FetchError::Unavailable {
            bucket: "b".into(),
            cause: "refused".into(),
        };
        assert_eq!(errno_for(&nf), Errno::ENOENT);
        assert_eq!(errno_for(&down), Errno::EIO);
    }

    #[test]
    fn plan_appends_the_prefix_to_pythonpath() {
        let tmp = tempfile::tempdir().unwrap();
        let opts = RealmOpts {
            realm: "r".into(),
            bucket: Some("file:///nonexistent".into()),
            cache_dir: Some(tmp.path().to_path_buf()),
            lib_prefix: "/sigma/lib".into(),
            fetch_timeout: 2.0,
            no_prefetch: false,
            lazy: Lazy::Never,
            fill_process: FillProcess::Auto,
        };
        let plan = RealmPlan::new(&opts).unwrap().unwrap();
        assert!(plan.lib.is_dir());
        assert_eq!(plan.pythonpath(None), "/sigma/lib");
        assert_eq!(plan.pythonpath(Some("/a:/b".as_ref())), "/a:/b:/sigma/lib");
        assert_eq!(
            plan.serve_rule(),
            format!("/sigma/lib={}/realms/r/lib", tmp.path().display())
        );
        let bad = RealmOpts {
            realm: "../x".into(),
            ..opts.clone()
        };
        assert!(RealmPlan::new(&bad).is_err());
        let none = RealmOpts {
            bucket: None,
            ..opts
        };
        assert!(RealmPlan::new(&none).unwrap().is_none());
    }
}
