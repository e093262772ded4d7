//! Realms the kernel serves (a bind mount, the lazy image, the FUSE mount): nothing reaches the
//! notification path, the resolver only says how for `--stats`.
#![forbid(unsafe_code)]

use super::fetching::FINISH_BOUND;
use crate::serve::{Lookup, Resolver, Served};
use fetcher::RealmCache;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A realm image bind-mounted at the prefix, filled on first touch: nothing reaches the
/// notification path.
pub struct LazyServed {
    pub(super) realm: String,
    pub(super) bucket: String,
    pub(super) stats: Arc<crate::lazy::FillStats>,
    pub(super) cache: Arc<RealmCache>,
    /// Top-level entries shown from the lib dir over the image.
    pub(super) from_lib: usize,
    /// Downloads go to fill processes (which finish them on their own).
    pub(super) delegated: bool,
    pub(super) _rt: tokio::runtime::Runtime,
}

impl Resolver for LazyServed {
    fn lookup(&self, _served: &Served, _rest: &Path) -> Lookup {
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
    Image(crate::lazy::LazyImage),
    /// The realm's FUSE server's mount (an ordinary user).
    Fuse(crate::fuse::FuseMount),
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
/// the run's hold on the mount ([`crate::fuse::FuseMount`]) until the run ends.
pub struct FuseServed {
    pub(super) realm: String,
    pub(super) bucket: String,
    pub(super) mount: crate::fuse::FuseMount,
}

impl Resolver for FuseServed {
    fn lookup(&self, _served: &Served, _rest: &Path) -> Lookup {
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
    pub(super) realm: String,
    pub(super) bucket: String,
    pub(super) packages: usize,
    /// What is mounted.
    pub(super) how: &'static str,
}

impl Resolver for KernelServed {
    fn lookup(&self, _served: &Served, _rest: &Path) -> Lookup {
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
