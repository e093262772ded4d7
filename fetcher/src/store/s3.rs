//! S3 backend (aws-sdk-s3), configured the standard AWS way: environment variables, profiles,
//! `AWS_ENDPOINT_URL`, region. Path-style addressing is forced whenever an endpoint URL is set.
//!
//! The SDK's own retries are disabled; [`crate::FetchConfig`] drives retries with jittered
//! backoff, and the SDK's connect/read timeouts are set to the overall bound so that a down or
//! silent server fails within it.

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::Client;
use bytes::Bytes;

use super::api::{check_key, GetObject, Store, StoreOptions};
use crate::config::FetchConfig;
use crate::error::{FetchError, Result};
use crate::retry::retrying;

/// A bucket (optionally a key prefix inside it) on an S3-compatible service.
#[derive(Debug, Clone)]
pub struct S3Store {
    name: String,
    bucket: String,
    prefix: String,
    client: Client,
    cfg: FetchConfig,
}

impl S3Store {
    /// Configure a client from the standard AWS sources plus `opts`, for `bucket`/`prefix`.
    /// No request is made here.
    pub async fn connect(
        bucket: &str,
        prefix: &str,
        opts: &StoreOptions,
        cfg: &FetchConfig,
    ) -> Result<Self> {
        if bucket.is_empty() {
            return Err(FetchError::invalid("bucket s3://", "missing bucket name"));
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(cfg.overall_timeout)
                    .read_timeout(cfg.overall_timeout)
                    .build(),
            );
        if let Some(ep) = &opts.endpoint_url {
            loader = loader.endpoint_url(ep);
        }
        let endpoint = opts.endpoint_url.clone().or_else(|| {
            ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        });
        // The SDK has no client of its own (no default HTTPS client is built in): the
        // loader's serves S3 and the credential providers (STS, SSO, IMDS, ECS) alike. A
        // plain-HTTP S3 endpoint needs no certificate authorities, but credentials from the
        // standard chain (a role to assume, an SSO session) may still come over HTTPS from
        // AWS: then the providers get the system's CAs and S3 alone the client without.
        let plain = endpoint.is_some_and(|e| e.starts_with("http://"));
        let chain = opts.credentials.is_none() && !env_credentials();
        loader = loader.http_client(http_client(plain && !chain)?);
        if let Some(r) = &opts.region {
            loader = loader.region(Region::new(r.clone()));
        }
        if let Some((ak, sk)) = &opts.credentials {
            loader = loader.credentials_provider(Credentials::new(ak, sk, None, None, "static"));
        } else if env_credentials() {
            // What the standard chain would pick first anyway; naming it spares building the
            // chain's other providers (an STS client with its own TLS set-up, ~3 ms a start).
            loader = loader.credentials_provider(
                aws_config::environment::credentials::EnvironmentVariableCredentialsProvider::new(),
            );
        }
        let sdk = loader.load().await;
        let mut b = aws_sdk_s3::config::Builder::from(&sdk);
        if plain && chain {
            b = b.http_client(http_client(true)?);
        }
        if sdk.region().is_none() {
            b = b.region(Region::new("us-east-1"));
        }
        b = b.force_path_style(opts.force_path_style || sdk.endpoint_url().is_some());
        let prefix = prefix.trim_matches('/').to_owned();
        let name = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        Ok(S3Store {
            name,
            bucket: bucket.to_owned(),
            prefix,
            client: Client::from_conf(b.build()),
            cfg: cfg.clone(),
        })
    }

    /// The underlying SDK client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Create the bucket (an existing bucket owned by us is not an error).
    pub async fn create_bucket(&self) -> Result<()> {
        let r = retrying(
            &self.cfg,
            &self.name,
            "create bucket",
            self.cfg.overall_timeout,
            || async {
                self.client
                    .create_bucket()
                    .bucket(&self.bucket)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| self.map_err("", e))
            },
        )
        .await;
        match r {
            Err(FetchError::Invalid { cause, .. }) if cause.contains("BucketAlreadyOwnedByYou") => {
                Ok(())
            }
            other => other,
        }
    }

    fn full_key(&self, key: &str) -> Result<String> {
        check_key(&self.name, key)?;
        Ok(if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        })
    }

    fn map_err<E>(
        &self,
        key: &str,
        err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    ) -> FetchError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let bucket = self.name.clone();
        match &err {
            SdkError::ServiceError(se) => {
                let status = se.raw().status().as_u16();
                let code = se.err().code().unwrap_or("");
                let msg = se.err().message().unwrap_or("");
                let cause = if code.is_empty() {
                    format!("HTTP {status}")
                } else if msg.is_empty() {
                    format!("{code} (HTTP {status})")
                } else {
                    format!("{code}: {msg} (HTTP {status})")
                };
                match (code, status) {
                    ("NoSuchBucket", _) => FetchError::BucketNotFound { bucket },
                    ("NoSuchKey", _) | ("NotFound", _) | (_, 404) => FetchError::NotFound {
                        bucket,
                        key: key.to_owned(),
                    },
                    ("AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch", _)
                    | (_, 401 | 403) => FetchError::PermissionDenied { bucket, cause },
                    (_, 429 | 500..=599) | ("SlowDown" | "RequestTimeout", _) => {
                        FetchError::Unavailable { bucket, cause }
                    }
                    _ => FetchError::Invalid {
                        what: bucket,
                        cause,
                    },
                }
            }
            SdkError::ConstructionFailure(_) => {
                let cause = innermost(&err);
                if about_credentials(&err) {
                    FetchError::PermissionDenied {
                        bucket,
                        cause: format!("no usable credentials: {cause}"),
                    }
                } else {
                    FetchError::Invalid {
                        what: bucket,
                        cause,
                    }
                }
            }
            SdkError::DispatchFailure(_)
            | SdkError::TimeoutError(_)
            | SdkError::ResponseError(_) => {
                let cause = innermost(&err);
                if about_credentials(&err) {
                    FetchError::PermissionDenied {
                        bucket,
                        cause: format!("no usable credentials: {cause}"),
                    }
                } else {
                    FetchError::Unavailable { bucket, cause }
                }
            }
            _ => FetchError::Unavailable {
                bucket,
                cause: innermost(&err),
            },
        }
    }
}

/// The SDK's own HTTP client, rustls on ring, trusting the system's certificate authorities.
/// For a plain-HTTP endpoint (a local or on-site S3) its trust store is empty: no TLS handshake
/// is made there, so there is no need to read and parse the system's CA bundle (~2-3 ms at
/// every start), and a TLS connection through it would trust no server.
fn http_client(plain: bool) -> Result<aws_sdk_s3::config::SharedHttpClient> {
    use aws_smithy_http_client::tls;
    let trust = if plain {
        tls::TrustStore::empty()
    } else {
        tls::TrustStore::default()
    };
    let ctx = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .map_err(|e| FetchError::invalid("http client", e))?;
    Ok(aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .tls_context(ctx)
        .build_https())
}

/// Whether the environment holds an access key and its secret (the standard chain's first source).
fn env_credentials() -> bool {
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .all(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

/// True if any message in the error's source chain is about missing or refused credentials.
fn about_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        let m = format!("{e:?}").to_ascii_lowercase();
        // The credentials chain reports as CredentialsError::ProviderError (IMDS: FailedToLoadToken).
        if ["credential", "imds", "providererror", "failedtoloadtoken"]
            .iter()
            .any(|w| m.contains(w))
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// The most specific message in an error's source chain (e.g. "Connection refused (os error 111)").
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut msgs = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        msgs.push(e.to_string());
        cur = e.source();
    }
    // Keep the last two distinct messages: the mechanism and its cause.
    msgs.dedup();
    let n = msgs.len();
    msgs[n.saturating_sub(2)..].join(": ")
}

#[async_trait]
impl Store for S3Store {
    fn name(&self) -> &str {
        &self.name
    }

    async fn get(&self, key: &str) -> Result<GetObject> {
        let full = self.full_key(key)?;
        let out = retrying(
            &self.cfg,
            &self.name,
            "GET",
            self.cfg.overall_timeout,
            || async {
                self.client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(&full)
                    .send()
                    .await
                    .map_err(|e| self.map_err(key, e))
            },
        )
        .await?;
        let size = out.content_length().and_then(|n| u64::try_from(n).ok());
        let name = self.name.clone();
        let body = futures::stream::unfold(Some(out.body), move |state| {
            let name = name.clone();
            async move {
                let mut body = state?;
                match body.try_next().await {
                    Ok(Some(chunk)) => Some((Ok(chunk), Some(body))),
                    Ok(None) => None,
                    Err(e) => Some((
                        Err(FetchError::Unavailable {
                            bucket: name,
                            cause: format!("download interrupted: {}", innermost(&e)),
                        }),
                        None,
                    )),
                }
            }
        });
        Ok(GetObject {
            size,
            body: Box::pin(body),
        })
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        let full = self.full_key(key)?;
        retrying(
            &self.cfg,
            &self.name,
            "PUT",
            self.cfg.transfer_timeout,
            || async {
                self.client
                    .put_object()
                    .bucket(&self.bucket)
                    .key(&full)
                    .body(data.clone().into())
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| self.map_err(key, e))
            },
        )
        .await
    }

    async fn head(&self, key: &str) -> Result<Option<u64>> {
        let full = self.full_key(key)?;
        let r = retrying(
            &self.cfg,
            &self.name,
            "HEAD",
            self.cfg.overall_timeout,
            || async {
                self.client
                    .head_object()
                    .bucket(&self.bucket)
                    .key(&full)
                    .send()
                    .await
                    .map_err(|e| self.map_err(key, e))
            },
        )
        .await;
        match r {
            Ok(out) => Ok(Some(
                out.content_length()
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0),
            )),
            Err(FetchError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let full = self.full_key(key)?;
        retrying(
            &self.cfg,
            &self.name,
            "DELETE",
            self.cfg.overall_timeout,
            || async {
                self.client
                    .delete_object()
                    .bucket(&self.bucket)
                    .key(&full)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| self.map_err(key, e))
            },
        )
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let full_prefix = format!("{strip}{prefix}");
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = retrying(
                &self.cfg,
                &self.name,
                "LIST",
                self.cfg.overall_timeout,
                || async {
                    self.client
                        .list_objects_v2()
                        .bucket(&self.bucket)
                        .prefix(&full_prefix)
                        .set_continuation_token(token.clone())
                        .send()
                        .await
                        .map_err(|e| self.map_err(prefix, e))
                },
            )
            .await?;
            for obj in out.contents() {
                if let Some(k) = obj.key().and_then(|k| k.strip_prefix(&strip)) {
                    keys.push(k.to_owned());
                }
            }
            match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_owned()),
                _ => break,
            }
        }
        keys.sort();
        Ok(keys)
    }
}
