//! Retries with jittered exponential backoff, bounded by an overall timeout.

use std::future::Future;
use std::time::Duration;

use crate::config::FetchConfig;
use crate::error::{FetchError, Result};

/// Run `op` until it succeeds, fails with a non-transient error, runs out of retries, or `bound`
/// has passed since the first attempt (then `Unavailable`, naming the last transient cause).
pub(crate) async fn retrying<T, F, Fut>(
    cfg: &FetchConfig,
    bucket: &str,
    what: &str,
    bound: Duration,
    mut op: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut last: Option<String> = None;
    let last_ref = &mut last;
    let run = async move {
        let mut attempt = 0u32;
        loop {
            match op().await {
                Err(e) if e.is_transient() && attempt < cfg.retries => {
                    tracing::debug!(bucket, what, attempt, error = %e, "transient error, retrying");
                    *last_ref = Some(match &e {
                        FetchError::Unavailable { cause, .. } => cause.clone(),
                        other => other.to_string(),
                    });
                    tokio::time::sleep(cfg.backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    };
    match tokio::time::timeout(bound, run).await {
        Ok(r) => r,
        Err(_) => Err(FetchError::Unavailable {
            bucket: bucket.to_owned(),
            cause: match last {
                Some(c) => format!("{what}: no answer within {bound:?} (last error: {c})"),
                None => format!("{what}: no answer within {bound:?}"),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn down() -> FetchError {
        FetchError::Unavailable {
            bucket: "b".into(),
            cause: "refused".into(),
        }
    }

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let cfg = FetchConfig {
            base_backoff: Duration::from_millis(1),
            ..FetchConfig::default()
        };
        let calls = AtomicU32::new(0);
        let r = retrying(&cfg, "b", "get", Duration::from_secs(5), || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(down())
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn gives_up_after_retries_and_does_not_retry_permanent() {
        let cfg = FetchConfig {
            retries: 2,
            base_backoff: Duration::from_millis(1),
            ..FetchConfig::default()
        };
        let calls = AtomicU32::new(0);
        let r: Result<()> = retrying(&cfg, "b", "get", Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(down())
        })
        .await;
        assert!(matches!(r, Err(FetchError::Unavailable { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let r: Result<()> = retrying(&cfg, "b", "get", Duration::from_secs(5), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(FetchError::NotFound {
                bucket: "b".into(),
                key: "k".into(),
            })
        })
        .await;
        assert!(matches!(r, Err(FetchError::NotFound { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn overall_bound_cuts_a_hanging_attempt() {
        let cfg = FetchConfig::default();
        let r: Result<()> = retrying(&cfg, "b", "get", Duration::from_millis(100), || async {
            std::future::pending::<()>().await;
            Ok(())
        })
        .await;
        let e = r.unwrap_err();
        assert!(e.to_string().contains("no answer within 100ms"), "{e}");
    }
}
