//! The realm's plan: its host paths and options, known before the target starts, and the ways
//! a complete realm is shown by the kernel (its lib dir, the store's shared trees).
#![forbid(unsafe_code)]

use super::opts::RealmOpts;
use super::python::cache_tag_of;
use super::served::KernelServed;
use super::superlib::build_superlib;
use anyhow::{anyhow, Context as _};
use fetcher::index::TopLevelEntry;
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchConfig, FetchError, Index, RealmCache};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The realm's host paths, known before the target starts (no network, no threads).
pub struct RealmPlan {
    pub opts: RealmOpts,
    /// Names fetched in parallel as soon as the realm starts (see [`imports_of`](super::python::imports_of)).
    pub prefetch: Vec<String>,
    /// Interpreter that byte-compiles a package after this run installs it (the target's own
    /// python, so the `.pyc` files match it); `None`: no compile.
    pub compile_with: Option<PathBuf>,
    pub bucket: String,
    pub root: PathBuf,
    pub lib: PathBuf,
    pub(super) realm_dir: PathBuf,
    /// The bucket's index could not be had before the start ([`tree_view`](Self::tree_view)).
    pub(super) unreachable: Option<FetchError>,
    /// Run streaming downloads in fill processes that outlive the run ([`crate::fill`]).
    pub delegate: bool,
    /// Told the pid of each process this run starts for the realm and waits for itself (a
    /// package's byte-compile): the supervisor's, not the proc's.
    pub on_helper: fn(i32),
    /// The realm's index snapshot was fetched for this run ([`tree_view`](Self::tree_view)).
    pub(super) snapshot_fetched: bool,
    /// Why the lazy backend does not serve this run (for `--stats`).
    pub(super) lazy_note: Option<String>,
    /// The lazy image to make off this run's path ([`prepare_image`](Self::prepare_image)).
    pub(super) image_to_make: Option<String>,
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
            on_helper: |_| {},
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
        // Served by the lazy backend while it was incomplete: its images are no longer needed;
        // nor what a killed run left of its memory trees.
        crate::lazy::retire(&self.realm_dir);
        crate::memory::retire(&self.realm_dir);
        Some(n)
    }

    /// The prefix as a directory on the host (created if missing), for mounts without a jail.
    pub(super) fn host_mount_point(&self) -> bool {
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
        crate::lazy::retire(&self.realm_dir);
        Some(view)
    }

    /// Whether the store has any content (a fresh cache root cannot show a realm from trees).
    pub(super) fn store_has_content(&self) -> bool {
        std::fs::read_dir(self.root.join("cas")).is_ok_and(|mut d| d.next().is_some())
    }

    /// Take the realm's index snapshot now, on a runtime that is gone again before the target
    /// is forked (the supervisor forks single-threaded).
    pub(super) fn fetch_snapshot(&mut self) -> Option<Arc<Index>> {
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

    pub(super) fn fetch_config(&self) -> FetchConfig {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::realm::{FillProcess, Lazy};

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
