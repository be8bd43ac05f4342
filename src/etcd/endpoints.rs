//! The members of one cluster as a transport tries them: in turn, starting
//! from the one that answered last, each attempt bounded by the deadline
//! and [`REQUEST_TIMEOUT`]; a request moves on to the next member only
//! when the attempt says it may (it certainly did not reach the cluster,
//! or the member could not serve it), so a transaction is never sent twice.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

use super::{EtcdConfig, EtcdError, REQUEST_TIMEOUT};

/// Why one attempt failed, and whether the next endpoint may be tried.
pub struct Failed {
    pub error: EtcdError,
    pub try_next: bool,
}

/// How a round of the endpoints failed: for good, or with every endpoint
/// unable to serve (their errors; none when the deadline left no time to
/// ask).
pub enum Round {
    Final(EtcdError),
    Retryable(Vec<String>),
}

impl Round {
    /// The error a caller reports when it stops going round.
    pub fn into_error(self) -> EtcdError {
        match self {
            Round::Final(e) => e,
            Round::Retryable(errors) if errors.is_empty() => {
                EtcdError::Timeout("the deadline passed before etcd could be asked".into())
            }
            Round::Retryable(errors) => EtcdError::Unavailable(format!(
                "no etcd endpoint could serve the request: {}",
                errors.join("; ")
            )),
        }
    }
}

#[derive(Clone)]
pub struct Endpoints {
    urls: Arc<Vec<String>>,
    /// The endpoint that answered last.
    preferred: Arc<AtomicUsize>,
}

impl Endpoints {
    /// The configured endpoints: http:// or https:// URLs, without a
    /// trailing slash.
    pub fn new(conf: &EtcdConfig) -> Result<Endpoints, EtcdError> {
        for e in &conf.endpoints {
            if !(e.starts_with("https://") || e.starts_with("http://")) {
                return Err(EtcdError::Config(format!(
                    "etcd endpoint {e:?} is not an http:// or https:// URL"
                )));
            }
        }
        Ok(Endpoints {
            urls: Arc::new(
                conf.endpoints
                    .iter()
                    .map(|e| e.trim_end_matches('/').to_string())
                    .collect(),
            ),
            preferred: Arc::new(AtomicUsize::new(0)),
        })
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// One round: `attempt(index)` (on the endpoint `urls()[index]`) on
    /// each endpoint in turn until one answers or fails for good. `what`
    /// names the request in the timeout message, after the endpoint's URL.
    pub async fn round<T, F, Fut>(
        &self,
        what: &str,
        deadline: Instant,
        attempt: F,
    ) -> Result<T, Round>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = Result<T, Failed>>,
    {
        let n = self.urls.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut errors = Vec::new();
        for i in 0..n {
            let index = (first + i) % n;
            let endpoint = &self.urls[index];
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            let limit = remaining.min(REQUEST_TIMEOUT);
            match tokio::time::timeout(limit, attempt(index)).await {
                Ok(Ok(v)) => {
                    self.preferred.store(index, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(Failed { error, try_next })) => {
                    tracing::debug!(%endpoint, %what, "etcd request failed: {error}");
                    if !try_next {
                        return Err(Round::Final(error));
                    }
                    errors.push(format!("{endpoint}: {error}"));
                }
                Err(_) => {
                    return Err(Round::Final(EtcdError::Timeout(format!(
                        "no answer from etcd ({endpoint}{what}) within {:.1}s",
                        limit.as_secs_f64()
                    ))));
                }
            }
        }
        Err(Round::Retryable(errors))
    }
}
