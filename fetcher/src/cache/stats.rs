//! What one [`super::RealmCache`] counted (this process only).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters of one [`RealmCache`](super::RealmCache) (this process only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Packages downloaded.
    pub packages_fetched: u64,
    /// Packages installed into the realm (downloaded or linked from the CAS).
    pub packages_installed: u64,
    /// Bytes downloaded (archives and index).
    pub bytes_fetched: u64,
    /// GET requests made (index and archives).
    pub gets: u64,
    /// `ensure` calls answered without installing anything.
    pub cache_hits: u64,
    /// Wall time spent inside installs (download, verify, link).
    pub fetch_time: Duration,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) packages_fetched: AtomicU64,
    pub(super) packages_installed: AtomicU64,
    pub(super) bytes_fetched: AtomicU64,
    pub(super) gets: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) fetch_nanos: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> CacheStats {
        CacheStats {
            packages_fetched: self.packages_fetched.load(Ordering::Relaxed),
            packages_installed: self.packages_installed.load(Ordering::Relaxed),
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            gets: self.gets.load(Ordering::Relaxed),
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            fetch_time: Duration::from_nanos(self.fetch_nanos.load(Ordering::Relaxed)),
        }
    }
}
