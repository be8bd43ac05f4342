//! One request to the API server (kube's errors as [`K8sError`]): bounded by [`REQUEST_TIMEOUT`] and the
//! call's deadline, a throttled (429) one sent again, the call's first
//! request going alone until its connection is up; and the generic verbs on
//! JSON objects: GET (how fresh: [`Freshness`]), a paged list, create,
//! replace and delete with preconditions.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use super::{K8sClient, K8sError};

/// How long one request may take at most (the deadline may cut it shorter).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Objects per page of a list (client-go's pager's default).
const LIST_PAGE: usize = 500;

/// How many times a throttled (429) request is sent in all.
const THROTTLED_ATTEMPTS: u32 = 10;
/// The wait after a 429 that names none (client-go's figure).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait after a 429 honoured (the deadline usually cuts first).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);

/// What the API server's 429 says when a read asked of its watch cache
/// finds the cache not yet filled.
const CACHE_INITIALIZING: &str = "storage is (re)initializing";

/// `uri` with its `resourceVersion=0` (a read from the watch cache) taken
/// out: the same read as of now. `None` when it has none.
fn without_cache_read(uri: &http::Uri) -> Option<http::Uri> {
    let query = uri.query()?;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| *pair != "resourceVersion=0")
        .collect();
    if kept.len() == query.split('&').count() {
        return None;
    }
    let path = if kept.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{}", uri.path(), kept.join("&"))
    };
    path.parse().ok()
}

/// A copy of a request, to send it again.
fn clone_request(request: &http::Request<Vec<u8>>) -> http::Request<Vec<u8>> {
    let mut copy = http::Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// How current a GET's answer must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// As of now (read through to etcd).
    Latest,
    /// As the API server's watch cache holds it; as of now when the cache
    /// lacks it (an object made a moment ago).
    Cached,
    /// As the watch cache holds it, its "not found" included: for an
    /// object whose absence means defaults (the IPAM configuration, which
    /// most clusters never make), so that such a cluster does not pay a
    /// read as of now on every call.
    CacheOnly,
}

impl Freshness {
    /// `Cached` when `cached`, else `Latest`.
    pub fn cached(cached: bool) -> Freshness {
        if cached {
            Freshness::Cached
        } else {
            Freshness::Latest
        }
    }
}

/// A label selector as a query parameter value.
pub(super) fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A name as one URL path segment: Kubernetes names never need escaping,
/// so anything that would is refused rather than sent.
pub fn segment(name: &str) -> Result<&str, K8sError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(K8sError::Config(format!(
            "{name:?} is not a valid Kubernetes object name"
        )));
    }
    Ok(name)
}

impl K8sClient {
    pub(super) fn map_err(&self, what: &str, e: kube::Error) -> K8sError {
        match e {
            kube::Error::Api(status) if status.code == 401 => self.describe_unauthorized(&status),
            kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
                K8sError::AlreadyExists(format!("{what}: {}", status.message))
            }
            kube::Error::Api(status) if status.code == 409 => {
                K8sError::Conflict(format!("{what}: {}", status.message))
            }
            kube::Error::Api(status) if status.code == 403 => {
                K8sError::Forbidden(format!("{what}: {} (403)", status.message))
            }
            kube::Error::Api(status) => {
                K8sError::Api(format!("{what}: {} ({})", status.message, status.code))
            }
            other => {
                let text = other.to_string();
                if text.contains("timed out") || text.contains("deadline") {
                    K8sError::Timeout(format!("{what}: {text}"))
                } else {
                    K8sError::Api(format!("{what}: {text}"))
                }
            }
        }
    }

    /// Sends one request, bounded by [`REQUEST_TIMEOUT`] and the
    /// invocation's deadline; 404 is `None`.
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        what: &str,
        mut request: http::Request<Vec<u8>>,
    ) -> Result<Option<T>, K8sError> {
        for attempt in 1.. {
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            let limit = remaining.min(REQUEST_TIMEOUT);
            let sent = tokio::time::timeout(limit, async {
                let turn = self.opening.turn().await;
                let asked = Instant::now();
                let answer = self.client.request::<T>(clone_request(&request)).await;
                tracing::debug!(
                    method = %request.method(),
                    uri = %request.uri(),
                    ok = answer.is_ok(),
                    ms = asked.elapsed().as_secs_f64() * 1e3,
                    "API request"
                );
                if !matches!(
                    &answer,
                    Err(kube::Error::HyperError(_) | kube::Error::Service(_))
                ) {
                    self.opening.opened();
                }
                drop(turn);
                answer
            });
            let answer = sent.await;
            // A read from the watch cache that meets a cache still being
            // filled (the first seconds after kube-apiserver starts: a 429
            // "storage is (re)initializing", asking for a second's wait) is
            // sent again at once as a read as of now, which the API server
            // answers from etcd meanwhile.
            if let Ok(Err(kube::Error::Api(status))) = &answer
                && status.code == 429
                && status.message.contains(CACHE_INITIALIZING)
                && let Some(uri) = without_cache_read(request.uri())
            {
                tracing::debug!(%uri, "{what}: the watch cache is not ready; reading as of now");
                *request.uri_mut() = uri;
                continue;
            }
            return match answer {
                Err(_) if limit < REQUEST_TIMEOUT => Err(K8sError::Timeout(format!(
                    "{what}: no answer from the Kubernetes API server within the deadline"
                ))),
                Err(_) => Err(K8sError::Timeout(format!(
                    "{what}: no answer from the Kubernetes API server within {}s",
                    REQUEST_TIMEOUT.as_secs()
                ))),
                Ok(Ok(v)) => Ok(Some(v)),
                Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
                    if status.reason == "NotFound" {
                        Ok(None)
                    } else {
                        Err(K8sError::NotServed(what.to_string()))
                    }
                }
                // Throttled (API priority and fairness, or a proxy): the
                // request was not processed, so it is sent again after the
                // wait the server asks for, as client-go does, while the
                // deadline leaves room for it.
                Ok(Err(kube::Error::Api(status)))
                    if status.code == 429 && attempt < THROTTLED_ATTEMPTS =>
                {
                    let wait = status
                        .details
                        .as_ref()
                        .map(|d| Duration::from_secs(d.retry_after_seconds.into()))
                        .filter(|w| !w.is_zero())
                        .unwrap_or(DEFAULT_RETRY_AFTER)
                        .min(MAX_RETRY_AFTER);
                    if Instant::now() + wait < self.deadline {
                        tracing::debug!(?wait, attempt, "{what}: throttled (429), sending again");
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    Err(self.map_err(what, kube::Error::Api(status)))
                }
                // A read whose connection failed under it (closed by the
                // server as another request on it was refused, say) is
                // sent again once, on a new connection: it changes
                // nothing, so a second send is safe.
                Ok(Err(kube::Error::Service(e)))
                    if request.method() == http::Method::GET && attempt == 1 =>
                {
                    tracing::debug!("{what}: the connection failed ({e}); sending again");
                    continue;
                }
                Ok(Err(e)) => Err(self.map_err(what, e)),
            };
        }
        unreachable!("the loop returns")
    }

    pub(super) fn request(
        method: http::Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<&Value>,
    ) -> http::Request<Vec<u8>> {
        let mut builder = http::Request::builder().method(method).uri(path);
        if let Some(ct) = content_type {
            builder = builder.header(http::header::CONTENT_TYPE, ct);
        }
        builder
            .body(body.map_or_else(Vec::new, |b| {
                serde_json::to_vec(b).expect("JSON values serialize")
            }))
            .expect("a request of valid names builds")
    }

    /// GET of one object at `path` (made of valid names); 404 is `None`.
    pub async fn get_json(&self, what: &str, path: &str) -> Result<Option<Value>, K8sError> {
        self.get(what, path, Freshness::Latest).await
    }

    /// GET of one object at `path` (made of valid names); 404 is `None`.
    /// `fresh`: how current the answer must be (see [`Freshness`]). The
    /// watch cache's answer (`resourceVersion=0`) costs no read through to
    /// etcd and is at most a few milliseconds behind the latest write (0.8
    /// ms of the servers' CPU against 2.8 ms for a read as of now, measured
    /// on the test bed): for reads that shape a decision but are no write's
    /// precondition — what a write rests on is read as of now, or checked
    /// by the write itself (a resourceVersion precondition).
    pub async fn get<T: DeserializeOwned>(
        &self,
        what: &str,
        path: &str,
        fresh: Freshness,
    ) -> Result<Option<T>, K8sError> {
        if fresh != Freshness::Latest {
            let from_cache = format!("{path}?resourceVersion=0");
            let found = self
                .call(
                    what,
                    Self::request(http::Method::GET, &from_cache, None, None),
                )
                .await?;
            if found.is_some() || fresh == Freshness::CacheOnly {
                return Ok(found);
            }
        }
        self.call(what, Self::request(http::Method::GET, path, None, None))
            .await
    }

    /// The items of a collection, optionally with a label selector, in
    /// pages as client-go's pager asks for them (`limit`, then
    /// `continue`). `cached`: as the API server's watch cache has them
    /// (`resourceVersion=0`), at once; else as of now, which the API server
    /// answers only once its cache has caught up with the latest write to
    /// any resource (it asks etcd for a progress notification: 60-70 ms
    /// after a write, measured on the test bed).
    pub async fn list_json(
        &self,
        what: &str,
        path: &str,
        label_selector: Option<&str>,
        cached: bool,
    ) -> Result<Vec<Value>, K8sError> {
        let mut query = format!("?limit={LIST_PAGE}");
        if cached {
            query.push_str("&resourceVersion=0");
        }
        if let Some(selector) = label_selector {
            query.push_str(&format!("&labelSelector={}", query_escape(selector)));
        }
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = match &next {
                Some(token) => format!("{path}{query}&continue={}", query_escape(token)),
                None => format!("{path}{query}"),
            };
            let list: Option<Value> = self
                .call(what, Self::request(http::Method::GET, &page, None, None))
                .await?;
            let Some(mut list) = list else {
                return Ok(items);
            };
            if let Some(Value::Array(page)) = list.get_mut("items").map(Value::take) {
                items.extend(page);
            }
            next = list
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if next.is_none() {
                return Ok(items);
            }
        }
    }

    /// POST of a new object into the collection at `path`; a 409 is
    /// [`K8sError::AlreadyExists`].
    pub async fn create_json(
        &self,
        what: &str,
        path: &str,
        object: &Value,
    ) -> Result<Value, K8sError> {
        let request = Self::request(
            http::Method::POST,
            path,
            Some("application/json"),
            Some(object),
        );
        self.call(what, request)
            .await?
            .ok_or_else(|| K8sError::Api(format!("{what}: the collection does not exist")))
    }

    /// PUT of an object carrying the resourceVersion it was read at: a 409
    /// is [`K8sError::Conflict`], a 404 `None`.
    pub async fn replace_json(
        &self,
        what: &str,
        path: &str,
        object: &Value,
    ) -> Result<Option<Value>, K8sError> {
        let request = Self::request(
            http::Method::PUT,
            path,
            Some("application/json"),
            Some(object),
        );
        self.call(what, request).await
    }

    /// DELETE, with uid and resourceVersion preconditions when given: a 409
    /// is [`K8sError::Conflict`], a 404 `None`.
    pub async fn delete_json(
        &self,
        what: &str,
        path: &str,
        uid: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<Option<()>, K8sError> {
        let mut preconditions = serde_json::Map::new();
        if let Some(uid) = uid {
            preconditions.insert("uid".into(), uid.into());
        }
        if let Some(rv) = resource_version {
            preconditions.insert("resourceVersion".into(), rv.into());
        }
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions
        });
        let request = Self::request(
            http::Method::DELETE,
            path,
            Some("application/json"),
            Some(&body),
        );
        Ok(self.call::<Value>(what, request).await?.map(|_| ()))
    }
}

#[cfg(test)]
mod tests {
    use super::without_cache_read;

    #[test]
    fn a_cache_read_becomes_a_read_as_of_now() {
        let as_now = |uri: &str| without_cache_read(&uri.parse().unwrap()).map(|u| u.to_string());
        assert_eq!(
            as_now("/apis/g/v1/things/a?resourceVersion=0").as_deref(),
            Some("/apis/g/v1/things/a")
        );
        assert_eq!(
            as_now("/apis/g/v1/things?limit=500&resourceVersion=0&labelSelector=x%3Dy").as_deref(),
            Some("/apis/g/v1/things?limit=500&labelSelector=x%3Dy")
        );
        assert_eq!(as_now("/apis/g/v1/things?limit=500"), None);
        assert_eq!(as_now("/apis/g/v1/things?resourceVersion=10"), None);
        assert_eq!(as_now("/apis/g/v1/things/a"), None);
    }
}
