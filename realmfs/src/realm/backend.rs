//! Choosing the lazy backend for a realm that is not complete: the root's image, else the
//! realm's FUSE server, else notification (why not is remembered for a day).
#![forbid(unsafe_code)]

use super::fetching::reporter;
use super::opts::Lazy;
use super::plan::RealmPlan;
use super::served::{FuseServed, LazyServed, LazyView};
use anyhow::anyhow;
use std::path::Path;

/// Whether `path` was modified less than `age` ago.
pub(super) fn recent(path: &Path, age: std::time::Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|e| e < age)
}

/// A realm's memory of why its image could not be made (root's lazy backend).
pub(super) const IMAGE_UNAVAILABLE: &str = "lazy-unavailable";

/// ... and why its FUSE server could not be had.
pub(super) const FUSE_UNAVAILABLE: &str = "fuse-unavailable";

impl RealmPlan {
    /// The lazy backend (`RealmOpts::lazy`): the realm's image (materialised from its index
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
                crate::lazy::prepare_in_background(&self.root, &self.realm_dir, key, &self.bucket)
            {
                tracing::info!(realm = %self.opts.realm, "lazy image not started: {e}");
            }
        }
    }

    /// [`lazy_image`](Self::lazy_image), or why not (for `--stats`).
    pub(super) fn try_lazy_image(&mut self, jailed: bool) -> Result<LazyView, String> {
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
        let load = || crate::snapshot::snapshot_index(&self.realm_dir, &self.bucket);
        let mut loaded = None;
        let key = match std::fs::read_to_string(&key_file)
            .ok()
            .and_then(|s| s.strip_prefix(id.as_str()).map(|k| k.trim().to_owned()))
            .filter(|k| k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            Some(k) => k,
            None => {
                let index = load().map_err(|_| "index snapshot unreadable")?;
                let k = crate::snapshot::key_of(&index);
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
        if !loud && jailed && !crate::lazy::image_ready(&self.realm_dir, &key) {
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
        let made = crate::lazy::LazyImage::prepare_keyed(&self.realm_dir, &key, index);
        self.lazy_or_why(made.map(LazyView::Image), loud, IMAGE_UNAVAILABLE)
    }

    /// The realm's FUSE mount of snapshot `key` (its server started if none serves it).
    /// `image_note`: why root's run is not served by an image (for `--stats`).
    pub(super) fn fuse_mount(
        &mut self,
        key: &str,
        loud: bool,
        image_note: Option<String>,
    ) -> Result<LazyView, String> {
        let m = crate::fuse::attach(
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
    pub(super) fn lazy_or_why(
        &mut self,
        made: Result<LazyView, crate::snapshot::LazyError>,
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
                        *entries = crate::snapshot::entries_from_lib(packages, &installed);
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
                crate::snapshot::remember(&unavailable, &e);
                Err(format!("unavailable ({e})"))
            }
        }
    }

    /// Serve `image` (already bound at the prefix): mark it and answer its first touches.
    /// `jail_init`: see [`crate::lazy::FillServer::start`].
    pub fn start_lazy(
        self,
        image: crate::lazy::LazyImage,
        jail_init: Option<std::os::fd::OwnedFd>,
    ) -> anyhow::Result<LazyServed> {
        // Completed like a realm served by notification: once every package is installed, the
        // next start mounts the lib dir and the image is no longer needed.
        let (rt, cache, reported, _) = self.open_cache(false, true, None)?;
        let report = reporter(reported, self.opts.realm.clone(), self.bucket.clone());
        let from_lib = image.lib_entries.len();
        let server = crate::lazy::FillServer::start(
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

    /// The realm shown by its FUSE server ([`crate::fuse`]): only its `--stats` line.
    pub fn fuse_served(self, mount: crate::fuse::FuseMount) -> FuseServed {
        FuseServed {
            realm: self.opts.realm,
            bucket: self.bucket,
            mount,
        }
    }
}
