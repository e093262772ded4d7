//! The realm's byte budget for the scratch directory, shared by every connection.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The realm's byte budget for the scratch directory.
pub struct Quota {
    limit: u64,
    /// Bytes held: counted by walking the directory (as long as the directory is large) when a
    /// request first needs the count, not at every start of a server.
    used: OnceLock<AtomicU64>,
    /// The directory to count (`None`: the count was given).
    dir: Option<PathBuf>,
}

impl Quota {
    /// A quota of which `used` bytes are taken.
    pub fn new(limit: u64, used: u64) -> Quota {
        Quota {
            limit,
            used: OnceLock::from(AtomicU64::new(used)),
            dir: None,
        }
    }

    /// A quota over what `dir` holds, counted when first needed.
    pub fn of_dir(limit: u64, dir: PathBuf) -> Quota {
        Quota {
            limit,
            used: OnceLock::new(),
            dir: Some(dir),
        }
    }

    fn counter(&self) -> &AtomicU64 {
        self.used
            .get_or_init(|| AtomicU64::new(self.dir.as_deref().map_or(0, usage)))
    }

    /// Takes `n` bytes; `false` (nothing taken) if they do not fit.
    pub fn reserve(&self, n: u64) -> bool {
        n == 0
            || self
                .counter()
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    u.checked_add(n).filter(|&t| t <= self.limit)
                })
                .is_ok()
    }

    pub fn release(&self, n: u64) {
        let _ = self
            .counter()
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                Some(u.saturating_sub(n))
            });
    }

    pub fn used(&self) -> u64 {
        self.counter().load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// Apparent bytes of the files under `dir`, symlinks not followed.
pub fn usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    total = total.saturating_add(e.metadata().map_or(0, |m| m.len()))
                }
                _ => {}
            }
        }
    }
    total
}
