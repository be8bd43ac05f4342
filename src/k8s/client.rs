//! The Kubernetes API client of one invocation, built with kube from a
//! [`K8sConfig`]: a kubeconfig and its overrides (API root, token,
//! certificates). Every process reads the kubeconfig (and a token or
//! tokenFile in it) afresh, every request is bounded by [`REQUEST_TIMEOUT`]
//! and the whole call by the invocation's deadline, and a rejected token is
//! reported with the kubeconfig it came from and, for a JWT, when it
//! expired.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::config::{KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use crate::connection_gate::{Announcing, ConnectionGate};
use crate::k8s::config::K8sConfig;
use crate::k8s::objects::{Namespace, Node, Pod};

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

/// A copy of a request, to send it again.
fn clone_request(request: &http::Request<Vec<u8>>) -> http::Request<Vec<u8>> {
    let mut copy = http::Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// The API group of Calico's CRDs in the Kubernetes datastore.
pub const CALICO_CRD_GROUP: &str = "crd.projectcalico.org";
pub const CALICO_CRD_VERSION: &str = "v1";
/// The group of Calico's native v3 CRDs (Calico v3.32's mode without its
/// aggregated API server).
pub const CALICO_V3_GROUP: &str = "projectcalico.org";

/// Which CRDs hold Calico's objects on an API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalicoApiGroup {
    /// `crd.projectcalico.org/v1` (every Calico release).
    CrdV1,
    /// `projectcalico.org/v3` as CRDs.
    V3,
}

impl CalicoApiGroup {
    /// A `calico_api_group` / `CALICO_API_GROUP` value as Calico reads it:
    /// `projectcalico.org/v3` (any case) is v3, any other value v1; `None`
    /// when unset (discovery decides).
    pub fn from_setting(value: &str) -> Option<CalicoApiGroup> {
        match value.trim() {
            "" => None,
            v if v.eq_ignore_ascii_case("projectcalico.org/v3") => Some(CalicoApiGroup::V3),
            _ => Some(CalicoApiGroup::CrdV1),
        }
    }

    /// Calico's discovery rule: v3 only when the API server serves
    /// `projectcalico.org` and not `crd.projectcalico.org` (a cluster with
    /// Calico's aggregated API server serves both, its data in the v1 CRDs).
    pub fn discovered(served: &[String]) -> CalicoApiGroup {
        let serves = |g: &str| served.iter().any(|s| s == g);
        if serves(CALICO_V3_GROUP) && !serves(CALICO_CRD_GROUP) {
            CalicoApiGroup::V3
        } else {
            CalicoApiGroup::CrdV1
        }
    }

    /// `group/version`.
    pub fn api_version(self) -> &'static str {
        match self {
            CalicoApiGroup::CrdV1 => "crd.projectcalico.org/v1",
            CalicoApiGroup::V3 => "projectcalico.org/v3",
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum K8sError {
    #[error("{0}")]
    Config(String),
    /// 401: the credentials were rejected.
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Api(String),
    /// The deadline passed, or the server did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// 409 Conflict: a resourceVersion or uid precondition failed.
    #[error("update conflict: {0}")]
    Conflict(String),
    /// 409 AlreadyExists.
    #[error("{0}")]
    AlreadyExists(String),
    /// 404 for the path itself (no object's NotFound): the API server
    /// serves no such group or resource.
    #[error("{0}: the API server serves no such resource")]
    NotServed(String),
}

/// Where the credentials came from, for error messages (never the secret).
#[derive(Debug, Clone, Default)]
struct Credentials {
    /// The kubeconfig file, if one was used.
    kubeconfig: Option<PathBuf>,
    /// The bearer token in use, to read a JWT's expiry from.
    token: Option<String>,
    /// Where the token was read from.
    token_source: String,
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

/// A Kubernetes client bound to one invocation's deadline. It remembers
/// the pods it read or patched (shared by its clones), so that whoever reads
/// a pod once in a call — the workload's ADD, the Kubernetes datastore's
/// endpoint record — reads it once, and a write is conditional on the
/// revision that was read.
#[derive(Clone)]
pub struct K8sClient {
    client: kube::Client,
    credentials: Credentials,
    deadline: Instant,
    pods: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, String), Pod>>>,
    /// The call's first request opens the connection alone (HTTP/2).
    opening: std::sync::Arc<ConnectionGate>,
    /// The API server's URL.
    server: String,
}

/// `https://host:6443/api/v1/...` → `https://host:6443` (Calico strips the
/// path from `/api/` on).
fn api_root(root: &str) -> &str {
    root.find("/api/")
        .map_or(root, |i| &root[..i])
        .trim_end_matches('/')
}

/// The `exp` claim of a JWT, if the token is one.
pub fn jwt_expiry(token: &str) -> Option<SystemTime> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    Some(UNIX_EPOCH + Duration::from_secs(exp))
}

/// RFC 3339 (UTC, seconds) for an error message.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
        .unwrap_or(jiff::Timestamp::MAX)
        .to_string()
}

/// A kubeconfig with one empty cluster, user and context, for a config that
/// names the API server and credentials directly.
fn minimal_kubeconfig() -> Kubeconfig {
    use kube::config::{AuthInfo, Cluster, Context, NamedAuthInfo, NamedCluster, NamedContext};
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: "cluster".into(),
            cluster: Some(Cluster::default()),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "user".into(),
            auth_info: Some(AuthInfo::default()),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "context".into(),
            context: Some(Context {
                cluster: "cluster".into(),
                user: Some("user".into()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("context".into()),
        ..Kubeconfig::default()
    }
}

/// The User-Agent of every API request.
const USER_AGENT: &str = concat!(
    "calico/",
    env!("CARGO_PKG_VERSION"),
    " (linux/amd64) calico-cni"
);

/// The HTTP client: rustls (the kubeconfig's CA and client certificate),
/// the API server's base URI, and the bearer token on every request (or
/// kube's auth layer: an exec credential plugin's token, refreshed when it
/// expires, or an auth provider's; it links JSONPath and regex, about half
/// a megabyte, for kube's gcp provider). Put together here rather than with
/// kube's own builder, to add the token and the user agent as Calico does.
fn build_client(
    config: &kube::Config,
    token: Option<&str>,
    auth: Option<kube::client::middleware::AuthLayer>,
    opening: &std::sync::Arc<ConnectionGate>,
) -> Result<kube::Client, K8sError> {
    use kube::client::ConfigExt;
    let http =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(
            Announcing::new(https_connector(config)?, std::sync::Arc::clone(opening)),
        );
    let authorization = token
        .map(|t| {
            let mut value = http::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                K8sError::Config("the bearer token contains invalid characters".into())
            })?;
            value.set_sensitive(true);
            Ok::<_, K8sError>(value)
        })
        .transpose()?;
    // As Calico's client-go identifies itself: the API server names the
    // field manager of our writes after it ("calico"), as for Calico's.
    let user_agent = http::HeaderValue::from_static(USER_AGENT);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .map_request(move |mut request: http::Request<kube::client::Body>| {
            if let Some(value) = &authorization {
                request
                    .headers_mut()
                    .insert(http::header::AUTHORIZATION, value.clone());
            }
            request
                .headers_mut()
                .insert(http::header::USER_AGENT, user_agent.clone());
            request
        })
        .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// HTTPS to the API server offering HTTP/2 (ALPN `h2`, then `http/1.1`),
/// as client-go does: every request of a call then shares one connection
/// and one TLS handshake, however many are in flight at once (kube's own
/// connector offers HTTP/1.1 only: a connection, and a handshake on both
/// sides, per concurrent request). The TLS settings are kube's (the
/// kubeconfig's CA, client certificate, `tls-server-name`).
fn https_connector(
    config: &kube::Config,
) -> Result<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    K8sError,
> {
    use kube::client::ConfigExt;
    let fail = |e: &dyn std::fmt::Display| {
        K8sError::Config(format!("failed to set up TLS for the Kubernetes API: {e}"))
    };
    let tls = config.rustls_client_config().map_err(|e| fail(&e))?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| fail(&format!("tls-server-name {name:?}: {e}")))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    Ok(builder.enable_http1().enable_http2().wrap_connector(http))
}

fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, K8sError> {
    let fail = |e: &dyn std::fmt::Display| {
        K8sError::Config(format!("failed to read kubeconfig {}: {e}", path.display()))
    };
    // kube decodes a file that starts with a UTF-16 byte-order mark two
    // bytes at a time and panics (index out of bounds) on an odd length:
    // such a file is rejected here (found by fuzz/, kubeconfig target).
    if let Ok(bytes) = std::fs::read(path)
        && let [0xFF, 0xFE, ..] | [0xFE, 0xFF, ..] = bytes.as_slice()
        && !bytes.len().is_multiple_of(2)
    {
        return Err(fail(&"invalid UTF-16: an odd number of bytes"));
    }
    Kubeconfig::read_from(path).map_err(|e| fail(&e))
}

impl K8sClient {
    /// The same client (connection pool and credentials) with its
    /// requests bound to another deadline (cleanup budgets).
    pub fn until(&self, deadline: Instant) -> K8sClient {
        K8sClient {
            deadline,
            ..self.clone()
        }
    }

    /// The API server's URL (as the kubeconfig names it).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Builds the client for one invocation, whose requests all end by
    /// `deadline`.
    pub async fn new(conf: &K8sConfig, deadline: Instant) -> Result<K8sClient, K8sError> {
        let root = conf.api_root.as_deref().map(|r| api_root(r).to_string());
        let kubeconfig_path = conf.kubeconfig.clone();
        let mut credentials = Credentials {
            kubeconfig: kubeconfig_path.clone(),
            ..Credentials::default()
        };

        // One kubeconfig (the file, or one made from the overrides alone),
        // with every override of the network config applied to it.
        let mut kc = match &kubeconfig_path {
            Some(path) => read_kubeconfig(path)?,
            None if root.is_some() => minimal_kubeconfig(),
            None => {
                return Err(K8sError::Config(
                    "no Kubernetes API configured: set kubernetes.kubeconfig or kubernetes.k8s_api_root".into(),
                ));
            }
        };
        let context_name = kc.current_context.clone().unwrap_or_default();
        let context = kc
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.clone())
            .ok_or_else(|| {
                K8sError::Config(format!("kubeconfig has no context {context_name:?}"))
            })?;
        if let Some(cluster) = kc
            .clusters
            .iter_mut()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_mut())
        {
            if let Some(root) = &root {
                cluster.server = Some(root.clone());
            }
            if let Some(ca) = &conf.certificate_authority {
                cluster.certificate_authority = Some(ca.clone());
                cluster.certificate_authority_data = None;
            }
        }
        let kubeconfig_name = kubeconfig_path.as_ref().map_or_else(
            || "the network config".to_string(),
            |p| p.display().to_string(),
        );
        if let Some(info) = kc
            .auth_infos
            .iter_mut()
            .find(|a| Some(&a.name) == context.user.as_ref())
            .and_then(|auth| auth.auth_info.as_mut())
        {
            if let Some(token) = &conf.token {
                credentials.token = Some(token.clone());
                credentials.token_source = "policy.k8s_auth_token".into();
            } else if let Some(token) = &info.token {
                credentials.token = Some(token.expose_secret().to_string());
                credentials.token_source = format!("the token in {kubeconfig_name}");
            } else if let Some(file) = &info.token_file {
                // Read now: a rotated file is what this call uses.
                let token = std::fs::read_to_string(file).map_err(|e| {
                    K8sError::Config(format!(
                        "failed to read tokenFile {file} of kubeconfig {kubeconfig_name}: {e}"
                    ))
                })?;
                credentials.token = Some(token.trim().to_string());
                credentials.token_source = format!("tokenFile {file} of {kubeconfig_name}");
            }
            if credentials.token.is_none() {
                // A credential plugin's token (exec) or an auth provider's
                // (oidc's id-token): kube's auth layer below gets it.
                if let Some(exec) = &info.exec {
                    credentials.token_source = format!(
                        "the exec credential plugin {:?} of {kubeconfig_name}",
                        exec.command.as_deref().unwrap_or_default()
                    );
                } else if let Some(provider) = &info.auth_provider {
                    credentials.token_source =
                        format!("the {:?} auth provider of {kubeconfig_name}", provider.name);
                }
            } else {
                info.exec = None;
                info.auth_provider = None;
            }
            // The bearer token is added per request below.
            info.token = None;
            info.token_file = None;
            if let Some(cert) = &conf.client_certificate {
                info.client_certificate = Some(cert.clone());
                info.client_certificate_data = None;
            }
            if let Some(key) = &conf.client_key {
                info.client_key = Some(key.clone());
                info.client_key_data = None;
            }
        }
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| K8sError::Config(format!("invalid kubeconfig {kubeconfig_name}: {e}")))?;
        // An exec plugin runs now (a process: off the runtime's thread).
        let auth = {
            let config = config.clone();
            crate::handoff::spawn_blocking(move || {
                use kube::client::ConfigExt;
                config.auth_layer()
            })
            .await
            .map_err(|e| K8sError::Config(format!("the credential plugin stopped: {e}")))?
            .map_err(|e| {
                K8sError::Unauthorized(format!(
                    "kubeconfig {kubeconfig_name}: getting credentials: {e}"
                ))
            })?
        };
        let opening = std::sync::Arc::default();
        let client = build_client(&config, credentials.token.as_deref(), auth, &opening)?;
        Ok(K8sClient {
            client,
            credentials,
            deadline,
            pods: Default::default(),
            opening,
            server: config.cluster_url.to_string(),
        })
    }

    fn remember(&self, namespace: &str, name: &str, pod: Option<&Pod>) {
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), name.to_string());
        match pod {
            Some(pod) => pods.insert(key, pod.clone()),
            None => pods.remove(&key),
        };
    }

    /// The pod as this call last read (or patched) it, if it did.
    pub fn cached_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// When the bearer token this client presents expires (a JWT's `exp`),
    /// and where the token came from (never the token).
    pub fn token_expiry(&self) -> Option<(SystemTime, String)> {
        let exp = self.credentials.token.as_deref().and_then(jwt_expiry)?;
        let from = match (
            &self.credentials.kubeconfig,
            self.credentials.token_source.is_empty(),
        ) {
            (_, false) => self.credentials.token_source.clone(),
            (Some(path), true) => format!("the token in {}", path.display()),
            (None, true) => "the configured token".into(),
        };
        Some((exp, from))
    }

    fn describe_unauthorized(&self, status: &kube::core::Status) -> K8sError {
        let from = match (
            &self.credentials.kubeconfig,
            self.credentials.token_source.is_empty(),
        ) {
            (_, false) => self.credentials.token_source.clone(),
            (Some(path), true) => format!("the credentials in {}", path.display()),
            (None, true) => "the configured credentials".into(),
        };
        let mut msg = format!(
            "the Kubernetes API server rejected {from} ({} {})",
            status.code, status.reason
        );
        if let Some(exp) = self.credentials.token.as_deref().and_then(jwt_expiry) {
            if exp <= SystemTime::now() {
                msg.push_str(&format!(
                    ": the token expired at {}; refresh the kubeconfig (calico-node's token refresher writes it)",
                    rfc3339(exp)
                ));
            } else {
                msg.push_str(&format!(
                    ": the token (valid until {}) was not accepted",
                    rfc3339(exp)
                ));
            }
        }
        K8sError::Unauthorized(msg)
    }

    fn map_err(&self, what: &str, e: kube::Error) -> K8sError {
        match e {
            kube::Error::Api(status) if status.code == 401 => self.describe_unauthorized(&status),
            kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists" => {
                K8sError::AlreadyExists(format!("{what}: {}", status.message))
            }
            kube::Error::Api(status) if status.code == 409 => {
                K8sError::Conflict(format!("{what}: {}", status.message))
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
    async fn call<T: DeserializeOwned>(
        &self,
        what: &str,
        request: http::Request<Vec<u8>>,
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
            return match sent.await {
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

    fn request(
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

    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        self.read_pod(namespace, name, false).await
    }

    /// [`K8sClient::pod`] as the API server's watch cache holds it (the
    /// kubelet that runs the call learnt of the pod from a watch the cache
    /// serves). A write on the pod carries the resourceVersion read, so a
    /// stale read makes that write fail and read again.
    pub async fn pod_cached(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        self.read_pod(namespace, name, true).await
    }

    /// The pod, remembered for the rest of the call.
    async fn read_pod(
        &self,
        namespace: &str,
        name: &str,
        cached: bool,
    ) -> Result<Option<Pod>, K8sError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            segment(namespace)?,
            segment(name)?
        );
        let what = format!("error getting pod {namespace}/{name}");
        let pod = self.get(&what, &path, Freshness::cached(cached)).await?;
        self.remember(namespace, name, pod.as_ref());
        Ok(pod)
    }

    /// The pod as this call read it, else read now.
    pub async fn pod_once(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        match self.cached_pod(namespace, name) {
            Some(pod) => Ok(Some(pod)),
            None => self.pod(namespace, name).await,
        }
    }

    /// A namespace, for its labels and annotations (never written here):
    /// as the watch cache holds it.
    pub async fn namespace(&self, name: &str) -> Result<Option<Namespace>, K8sError> {
        let path = format!("/api/v1/namespaces/{}", segment(name)?);
        self.get(
            &format!("error getting namespace {name}"),
            &path,
            Freshness::Cached,
        )
        .await
    }

    /// A node; `cached`: as the watch cache holds it (its labels and pod
    /// CIDRs for a decision, no write).
    pub async fn node(&self, name: &str, cached: bool) -> Result<Option<Node>, K8sError> {
        let path = format!("/api/v1/nodes/{}", segment(name)?);
        self.get(
            &format!("error getting node {name}"),
            &path,
            Freshness::cached(cached),
        )
        .await
    }

    /// Every pod bound to `node`, in all namespaces.
    pub async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, K8sError> {
        let path = format!(
            "/api/v1/pods?fieldSelector={}",
            query_escape(&format!("spec.nodeName={node}"))
        );
        let what = format!("error listing the pods of node {node}");
        let list: Option<Value> = self
            .call(&what, Self::request(http::Method::GET, &path, None, None))
            .await?;
        let items = list
            .and_then(|mut l| l.get_mut("items").map(Value::take))
            .unwrap_or(Value::Array(Vec::new()));
        serde_json::from_value(items).map_err(|e| K8sError::Api(format!("{what}: {e}")))
    }

    /// Merge PATCH of a node's annotations; `Ok(None)` when it does not exist.
    pub async fn annotate_node(
        &self,
        name: &str,
        annotations: &serde_json::Map<String, Value>,
    ) -> Result<Option<Node>, K8sError> {
        let path = format!("/api/v1/nodes/{}", segment(name)?);
        let what = format!("error annotating node {name}");
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let request = Self::request(
            http::Method::PATCH,
            &path,
            Some("application/merge-patch+json"),
            Some(&patch),
        );
        self.call(&what, request).await
    }

    /// Strategic-merge PATCH of a pod's `status` subresource; `Ok(None)`
    /// when the pod does not exist. A 409 (a failed resourceVersion or uid
    /// precondition) is [`K8sError::Conflict`].
    pub async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<Pod>, K8sError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/status",
            segment(namespace)?,
            segment(name)?
        );
        let what = format!("error patching pod {namespace}/{name}");
        let request = Self::request(
            http::Method::PATCH,
            &path,
            Some("application/strategic-merge-patch+json"),
            Some(patch),
        );
        let patched: Option<Pod> = self.call(&what, request).await?;
        self.remember(namespace, name, patched.as_ref());
        Ok(patched)
    }

    /// One cluster-scoped Calico CRD object (crd.projectcalico.org/v1), as JSON.
    pub async fn calico_resource(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
    ) -> Result<Option<Value>, K8sError> {
        let path = format!(
            "/apis/{CALICO_CRD_GROUP}/{CALICO_CRD_VERSION}/{plural}/{}",
            segment(name)?
        );
        self.get_json(&format!("error getting {kind}({name})"), &path)
            .await
    }

    /// The API groups the server serves (`/apis`).
    pub async fn served_groups(&self) -> Result<Vec<String>, K8sError> {
        let list: Option<Value> = self
            .call(
                "error discovering the API groups",
                Self::request(http::Method::GET, "/apis", None, None),
            )
            .await?;
        Ok(list
            .as_ref()
            .and_then(|l| l.get("groups"))
            .and_then(Value::as_array)
            .map(|groups| {
                groups
                    .iter()
                    .filter_map(|g| g.get("name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// A label selector as a query parameter value.
fn query_escape(s: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_root_is_stripped_from_api_on() {
        assert_eq!(
            api_root("https://10.96.0.1:443/api/v1/"),
            "https://10.96.0.1:443"
        );
        assert_eq!(api_root("https://k8s:6443/"), "https://k8s:6443");
    }

    #[test]
    fn jwt_expiry_is_read_from_the_payload() {
        use base64::Engine;
        let enc =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let token = format!(
            "{}.{}.sig",
            enc(&serde_json::json!({"alg":"RS256"})),
            enc(&serde_json::json!({"exp": 1700000000}))
        );
        let exp = jwt_expiry(&token).unwrap();
        assert_eq!(rfc3339(exp), "2023-11-14T22:13:20Z");
        assert!(jwt_expiry("not-a-jwt").is_none());
    }
}
