//! What a failed fetch tells the target (an errno) and the user (one line per cause), and how
//! long a run waits for what it fetches.
#![forbid(unsafe_code)]

use fetcher::FetchError;
use nix::errno::Errno;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a failed fetch of a package is answered from memory before it is tried again.
pub const FAIL_TTL: Duration = Duration::from_secs(10);

/// How long a run whose target has exited waits for the installs it has placed in the lib dir
/// (a target that needed a package's first files may exit before the rest has arrived); past
/// this, the install is cut and the next run's recovery starts it over.
pub(super) const FINISH_BOUND: Duration = Duration::from_secs(120);

pub(super) fn report_once(
    reported: &Mutex<HashSet<String>>,
    realm: &str,
    bucket: &str,
    e: &FetchError,
) {
    let msg = e.to_string();
    let new = reported
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(msg.clone());
    if new {
        eprintln!("sigma-supervise: realm {realm}, bucket {bucket}: {msg}");
    }
}

/// Says a fetch error to the user (once per message: [`report_once`]).
pub(super) type ReportFn = Arc<dyn Fn(&FetchError) + Send + Sync>;

/// [`report_once`] for `realm` and `bucket`, as a [`ReportFn`].
pub(super) fn reporter(
    reported: Arc<Mutex<HashSet<String>>>,
    realm: String,
    bucket: String,
) -> ReportFn {
    Arc::new(move |e| report_once(&reported, &realm, &bucket, e))
}

/// The errno a failed fetch gives the target's call.
pub fn errno_for(e: &FetchError) -> Errno {
    if e.is_not_found() {
        Errno::ENOENT
    } else {
        Errno::EIO
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts/removes: a panic cannot leave these maps inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
