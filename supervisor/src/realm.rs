//! A realm's libraries, served to the target at `--lib-prefix` (default `/sigma/lib`).
//!
//! The path of one call under the prefix: handler → policy rule (serve, prefix = the realm's lib
//! dir) → [`RealmResolver::lookup`] on the receive loop (never blocks) →
//! * the prefix itself: the *superlib*, a host directory of empty placeholders, one per top-level
//!   entry of the bucket index (packages, modules, `*.dist-info`, `*.libs`). Listing or stat'ing
//!   the prefix shows everything the realm could import and fetches nothing.
//! * a top-level entry the index does not know: ENOENT at once.
//! * an entry whose package is installed in the realm: served from the realm lib dir inline.
//! * otherwise [`Lookup::Fetch`]: a [`crate::serve::Deferred`] worker runs
//!   `RealmCache::ensure_path` on this module's tokio runtime (single flight across tasks and
//!   processes is the fetcher's), then the same serve function answers the call.
//!
//! Failures (store down, credentials, missing bucket or object, integrity) fail the call with
//! ENOENT (not there) or EIO (everything else) within the fetcher's bounded time, print one line
//! per distinct cause, and are remembered for [`FAIL_TTL`] so a package that cannot be fetched
//! costs one bounded wait, not one per call.
#![forbid(unsafe_code)]

use crate::serve::{Lookup, Resolver, Served};
use anyhow::{anyhow, Context as _};
use fetcher::index::TopLevelEntry;
use fetcher::store::{open_store, StoreOptions};
use fetcher::{FetchConfig, FetchError, Index, RealmCache};
use nix::errno::Errno;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a failed fetch of a package is answered from memory before it is tried again.
pub const FAIL_TTL: Duration = Duration::from_secs(10);

/// Realm options of `sigma-supervise`.
#[derive(Debug, Clone, clap::Args)]
pub struct RealmOpts {
    /// Realm whose libraries the target sees (one cache per realm; content is shared).
    #[arg(long, value_name = "NAME", default_value = "local")]
    pub realm: String,

    /// Library bucket: s3://BUCKET[/PREFIX] (standard AWS configuration) or file:///DIR.
    /// Without one the target has no library dir.
    #[arg(long, value_name = "URL")]
    pub bucket: Option<String>,

    /// Cache root shared by every realm [default: $XDG_CACHE_HOME/sigma-supervise or
    /// ~/.cache/sigma-supervise]. Hidden from the target.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Where the target sees the realm's libraries (appended to PYTHONPATH).
    #[arg(long, value_name = "PATH", default_value = "/sigma/lib")]
    pub lib_prefix: PathBuf,

    /// Bound on reaching the bucket (connect, request, retries) before a call fails, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub fetch_timeout: f64,
}

/// The realm's host paths, known before the target starts (no network, no threads).
pub struct RealmPlan {
    pub opts: RealmOpts,
    /// Interpreter that byte-compiles a package after this run installs it (the target's own
    /// python, so the `.pyc` files match it); `None`: no compile.
    pub compile_with: Option<PathBuf>,
    pub bucket: String,
    pub root: PathBuf,
    pub lib: PathBuf,
    realm_dir: PathBuf,
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
        let root = opts
            .cache_dir
            .clone()
            .unwrap_or_else(fetcher::default_cache_root);
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
            compile_with: None,
            bucket,
            root,
            lib,
            realm_dir,
        }))
    }

    /// The number of packages if every package of the realm's snapshot is installed and the
    /// prefix can be a mount point: then nothing is left to decide under the prefix, and the
    /// realm's lib dir is bind-mounted there read-only for the target, so the kernel answers
    /// every call (no notification). `None`: serve the prefix through notifications.
    ///
    /// The mount point must exist on the host: the prefix is created as an empty directory if
    /// it is missing (and cannot be, for example without root: then `None`).
    pub fn kernel_served(&self) -> Option<usize> {
        let n = match fetcher::realm_complete(&self.root, &self.opts.realm) {
            Ok(n) => n?,
            Err(e) => {
                tracing::debug!(error = %e, "realm state unreadable; serving by notification");
                return None;
            }
        };
        let prefix = &self.opts.lib_prefix;
        if !prefix.is_dir() {
            if let Err(e) = std::fs::create_dir_all(prefix) {
                tracing::debug!(error = %e, prefix = %prefix.display(), "no mount point");
                return None;
            }
        }
        Some(n)
    }

    /// The realm when [`kernel_served`](Self::kernel_served): only its `--stats` line.
    pub fn kernel_served_resolver(self, packages: usize) -> KernelServed {
        KernelServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            packages,
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
    pub fn start(self) -> anyhow::Result<RealmResolver> {
        let cfg = FetchConfig {
            overall_timeout: Duration::from_secs_f64(self.opts.fetch_timeout),
            ..FetchConfig::default()
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sigma-fetch")
            .enable_all()
            .build()
            .context("starting the fetch runtime")?;
        let store = rt
            .block_on(open_store(&self.bucket, &StoreOptions::default(), &cfg))
            .with_context(|| format!("bucket {}", self.bucket))?;
        let cache = RealmCache::open(&self.root, &self.opts.realm, store, cfg)
            .with_context(|| format!("realm {}", self.opts.realm))?;
        let reported = Mutex::new(HashSet::new());
        let index = match rt.block_on(cache.index()) {
            Ok(i) => Some(i),
            Err(e) => {
                report_once(&reported, &self.opts.realm, &self.bucket, &e);
                None
            }
        };
        let entries: Vec<TopLevelEntry> = index
            .as_deref()
            .map(Index::top_level_entries)
            .unwrap_or_default();
        let superlib_dir = build_superlib(&self.realm_dir.join("superlib"), &entries)?;
        let superlib = Served::open(self.opts.lib_prefix.clone(), superlib_dir)
            .map_err(|e| anyhow!("superlib: {e}"))?;
        Ok(RealmResolver {
            prefix: self.opts.lib_prefix.clone(),
            realm: self.opts.realm.clone(),
            bucket: self.bucket,
            owners: entries.into_iter().map(|e| (e.name, e.package)).collect(),
            superlib,
            cache,
            rt,
            installed: Mutex::new(HashSet::new()),
            failed: Mutex::new(HashMap::new()),
            reported,
            inline_hits: AtomicU64::new(0),
            cache_tag: self.compile_with.as_deref().and_then(cache_tag_of),
            compile_with: self.compile_with,
        })
    }
}

/// A complete realm bind-mounted at the prefix: the kernel serves it, nothing reaches here.
pub struct KernelServed {
    realm: String,
    bucket: String,
    packages: usize,
}

impl Resolver for KernelServed {
    fn lookup<'a>(&'a self, _served: &'a Served, _rest: &Path) -> Lookup<'a> {
        Lookup::Local
    }

    fn report(&self) -> Option<String> {
        Some(format!(
            "sigma-supervise realm {} ({}): all {} packages installed; lib dir mounted \
             read-only, served by the kernel\n",
            self.realm, self.bucket, self.packages
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
    realm: String,
    bucket: String,
    /// Top-level entry → owning package (from the realm's index).
    owners: HashMap<String, String>,
    superlib: Served,
    cache: RealmCache,
    rt: tokio::runtime::Runtime,
    /// Packages known complete (saves the marker stat).
    installed: Mutex<HashSet<String>>,
    /// Package → when its fetch failed and with which errno.
    failed: Mutex<HashMap<String, (Instant, Errno)>>,
    reported: Mutex<HashSet<String>>,
    inline_hits: AtomicU64,
    compile_with: Option<PathBuf>,
    /// `cpython-311` for `python3.11`, when the interpreter's file name tells.
    cache_tag: Option<String>,
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

impl RealmResolver {
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
        if lock(&self.installed).contains(pkg) {
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        // A marker stat: another process (or an earlier run) may have installed it.
        if self.cache.is_installed(pkg) {
            lock(&self.installed).insert(pkg.to_owned());
            self.inline_hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Local;
        }
        if let Some(&(at, errno)) = lock(&self.failed).get(pkg) {
            if at.elapsed() < FAIL_TTL {
                return Lookup::Fail(errno);
            }
        }
        Lookup::Fetch
    }

    fn fetch(&self, served: &Served, rest: &Path) -> Result<(), Errno> {
        if served.prefix != self.prefix {
            return Ok(());
        }
        let pkg = self.owner(rest).ok_or(Errno::ENOENT)?.to_owned();
        match self.rt.block_on(self.cache.ensure_path(rest)) {
            Ok(Some(out)) => {
                tracing::debug!(package = %out.package, fetched = out.fetched, "ensured");
                // Published bytecode for this interpreter needs no compile.
                let shipped = out.bytecode.is_some() && out.bytecode == self.cache_tag;
                if out.installed && !shipped {
                    self.compile(&out.dir);
                }
                lock(&self.installed).insert(pkg);
                Ok(())
            }
            Ok(None) => Err(Errno::ENOENT),
            Err(e) => {
                report_once(&self.reported, &self.realm, &self.bucket, &e);
                let errno = errno_for(&e);
                lock(&self.failed).insert(pkg, (Instant::now(), errno));
                Err(errno)
            }
        }
    }

    fn report(&self) -> Option<String> {
        let s = self.cache.stats();
        Some(format!(
            "sigma-supervise realm {} ({}): fetched {} packages, {} bytes, {} GETs; installed {}; \
             cache hits {}; fetch time {:.3} ms\n",
            self.realm,
            self.bucket,
            s.packages_fetched,
            s.bytes_fetched,
            s.gets,
            s.packages_installed,
            s.cache_hits + self.inline_hits.load(Ordering::Relaxed),
            s.fetch_time.as_secs_f64() * 1e3
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
