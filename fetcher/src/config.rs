//! Retry, backoff and timeout configuration shared by every backend and the cache.

use std::time::Duration;

/// How hard and how long to try the store.
///
/// * `overall_timeout` bounds everything up to the first byte of an answer, retries included:
///   a down or silent server fails with [`crate::FetchError::Unavailable`] within it.
/// * `read_timeout` bounds the silence between two chunks of a body being downloaded; a large
///   object may take longer than `overall_timeout` as long as bytes keep arriving.
/// * `transfer_timeout` bounds one whole upload (publish only).
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Retries after the first attempt (transient errors only).
    pub retries: u32,
    /// First backoff; doubles each retry, with full jitter.
    pub base_backoff: Duration,
    /// Upper bound of one backoff sleep.
    pub max_backoff: Duration,
    /// Bound of connect + request + retries until the answer starts (default 2 s).
    pub overall_timeout: Duration,
    /// Bound of silence between body chunks (default 10 s).
    pub read_timeout: Duration,
    /// Bound of one whole upload (default 300 s).
    pub transfer_timeout: Duration,
    /// Show a progress bar on stderr (only if it is a terminal, and only for downloads that take
    /// longer than `progress_after`).
    pub progress: bool,
    /// Delay before a progress bar appears (default 0.5 s).
    pub progress_after: Duration,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            retries: 3,
            base_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            overall_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(10),
            transfer_timeout: Duration::from_secs(300),
            progress: true,
            progress_after: Duration::from_millis(500),
        }
    }
}

impl FetchConfig {
    /// The sleep before retry number `attempt` (0-based): uniform in
    /// `[0, min(max_backoff, base_backoff * 2^attempt)]` ("full jitter").
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base_backoff
            .saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX));
        let cap = exp.min(self.max_backoff);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        let cfg = FetchConfig {
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            ..FetchConfig::default()
        };
        let samples: Vec<Duration> = (0..200).map(|_| cfg.backoff(10)).collect();
        assert!(samples.iter().all(|d| *d <= Duration::from_millis(100)));
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(distinct.len() > 10, "backoff is not jittered: {distinct:?}");
        assert!((0..200).all(|_| cfg.backoff(0) <= Duration::from_millis(10)));
    }
}
