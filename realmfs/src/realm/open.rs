//! A run's fetching: the runtime, the realm cache (downloads streamed into the lib dir or
//! delegated to fill processes), the prefetch, and the notification path's start.
#![forbid(unsafe_code)]

use super::fetching::{report_once, reporter};
use super::plan::RealmPlan;
use super::python::cache_tag_of;
use super::resolver::{Detached, Outcomes, RealmResolver};
use super::streams::Streams;
use super::superlib::build_superlib;
use crate::fill::StartedFn;
use crate::memory::{MemoryRoot, MEMORY_FS};
use crate::serve::Served;
use anyhow::{anyhow, Context as _};
use fetcher::index::TopLevelEntry;
use fetcher::store::{lazy::LazyStore, StoreOptions};
use fetcher::{FetchError, Index, RealmCache};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Packages prefetched at once (each install streams, decompresses and hashes on its own thread).
pub(super) const PREFETCH_PARALLEL: usize = 4;

/// Archive bytes a run downloads, unasked, to complete its realm (see `complete_realm`): small
/// enough that a supervisor whose target exits at once waits a fraction of a second for it.
pub(super) const COMPLETE_MAX_BYTES: u64 = 8 << 20;

/// The lazy backend's [`fetcher::Placement`]: nothing to tell (its image shows every name).
pub(super) struct NoSkeleton;

impl fetcher::Placement for NoSkeleton {
    fn placed(&self, _pkg: &fetcher::index::Package) {}
    fn ended(&self, _pkg: &fetcher::index::Package, _result: Result<(), &FetchError>) {}
}

/// Install the packages that provide `names` (a Python command's imports), a few at a time.
pub(super) async fn prefetch(cache: &RealmCache, names: &[String]) {
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
pub(super) async fn complete_realm(cache: &RealmCache) {
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

impl RealmPlan {
    /// Open the store and the realm cache, get the realm's index (its snapshot, else one GET
    /// bounded by the fetch timeout) and build the superlib. Starts threads: call after fork.
    /// An unreachable index is reported and leaves an empty library, not an error.
    /// The fetch runtime, the realm cache and its index (reported, `None`, if unreachable);
    /// prefetch started. Starts threads: call after fork.
    #[allow(clippy::type_complexity)]
    pub(super) fn open_cache(
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
        jail::mark("fetch:runtime");
        // Connected on first use: a realm served from its snapshot and cache never needs it.
        let store: Arc<dyn fetcher::Store> = Arc::new(
            LazyStore::new(&self.bucket, &StoreOptions::default(), &cfg)
                .with_context(|| format!("bucket {}", self.bucket))?,
        );
        let cache = RealmCache::open(&self.root, &self.opts.realm, store, cfg)
            .with_context(|| format!("realm {}", self.opts.realm))?;
        let cache = Arc::new(cache);
        jail::mark("fetch:cache");
        let fill_procs = |memory: Option<MemoryRoot>, started: StartedFn| {
            Arc::new(crate::fill::FillProcs {
                root: self.root.clone(),
                realm: self.opts.realm.clone(),
                bucket: self.bucket.clone(),
                timeout: Duration::from_secs_f64(self.opts.fetch_timeout),
                lib: self.lib.clone(),
                memory,
                prefix: self.opts.lib_prefix.clone(),
                started,
            })
        };
        match streams {
            Some(streams) => {
                // Before any install starts (the prefetch below), so every download streams.
                streams.attach(&cache);
                if self.delegate {
                    let weak = Arc::downgrade(streams);
                    // A package this run streams is served from a memory tree where one can
                    // be had (see crate::memory).
                    let memory = MemoryRoot::for_realm(Path::new(MEMORY_FS), &self.realm_dir);
                    cache.set_delegate(fill_procs(
                        memory,
                        Box::new(move |pkg, memory| {
                            if let Some(streams) = weak.upgrade() {
                                streams.delegated(pkg, memory);
                            }
                        }),
                    ));
                }
            }
            // The lazy backend's downloads go to fill processes too, so a package a run
            // started is installed after it (and shown from the lib dir from then on); the
            // image, not the lib dir, shows its names meanwhile.
            None if self.delegate => {
                cache.set_placement(Arc::new(NoSkeleton));
                cache.set_delegate(fill_procs(None, Box::new(|_, _| {})));
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
        jail::mark("fetch:index");
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
            memory_files: AtomicU64::new(0),
            mounts: Mutex::new(HashSet::new()),
            bytes: AtomicU64::new(0),
            placed_bytes: AtomicU64::new(0),
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
            superlib: Arc::new(superlib),
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
                on_helper: self.on_helper,
            }),
            inline_hits: AtomicU64::new(0),
            streamed_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            lazy_note: self.lazy_note,
        })
    }
}
