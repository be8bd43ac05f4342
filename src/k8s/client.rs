//! The Kubernetes API client of one invocation, built with kube from the
//! network config: `kubernetes.kubeconfig`, the `kubernetes.k8s_api_root` /
//! `policy.k8s_api_root` overrides, `policy.k8s_auth_token` and the
//! certificate options. Every process reads the kubeconfig (and a token or
//! tokenFile in it) afresh, every request has a timeout and the whole call
//! the invocation's deadline, and a rejected token is reported with the
//! kubeconfig it came from and, for a JWT, when it expired.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::config::{KubeConfigOptions, Kubeconfig};
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use crate::cni::NetConf;
use crate::k8s::objects::{Namespace, Node, Pod};

/// How long one request may take at most (the deadline may cut it shorter).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The API group of Calico's CRDs in the Kubernetes datastore.
pub const CALICO_CRD_GROUP: &str = "crd.projectcalico.org";
pub const CALICO_CRD_VERSION: &str = "v1";

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
}

impl From<K8sError> for crate::cni::Error {
    fn from(e: K8sError) -> Self {
        match e {
            K8sError::Config(m) => crate::cni::Error::InvalidConfig(m),
            K8sError::Timeout(m) => crate::cni::Error::TryAgainLater(m),
            other => crate::cni::Error::Kubernetes(other.to_string()),
        }
    }
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

/// A Kubernetes client bound to one invocation's deadline.
#[derive(Clone)]
pub struct K8sClient {
    client: kube::Client,
    credentials: Credentials,
    deadline: Instant,
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
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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

/// The HTTP client: rustls (the kubeconfig's CA and client certificate),
/// the API server's base URI, and the bearer token on every request. It is
/// put together here rather than with kube's own builder, whose auth layer
/// links exec and auth-provider support (JSONPath, regex: half a megabyte)
/// that a CNI plugin's kubeconfig never uses.
fn build_client(config: &kube::Config, token: Option<&str>) -> Result<kube::Client, K8sError> {
    use kube::client::ConfigExt;
    let https = config.rustls_https_connector().map_err(|e| {
        K8sError::Config(format!("failed to set up TLS for the Kubernetes API: {e}"))
    })?;
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(https);
    let authorization = token
        .map(|t| {
            let mut value = http::HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                K8sError::Config("the bearer token contains invalid characters".into())
            })?;
            value.set_sensitive(true);
            Ok::<_, K8sError>(value)
        })
        .transpose()?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .map_request(move |mut request: http::Request<kube::client::Body>| {
            if let Some(value) = &authorization {
                request
                    .headers_mut()
                    .insert(http::header::AUTHORIZATION, value.clone());
            }
            request
        })
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, K8sError> {
    Kubeconfig::read_from(path)
        .map_err(|e| K8sError::Config(format!("failed to read kubeconfig {}: {e}", path.display())))
}

impl K8sClient {
    /// Builds the client for this invocation from the network config.
    pub async fn from_conf(conf: &NetConf, deadline: Instant) -> Result<K8sClient, K8sError> {
        let root = [&conf.kubernetes.k8s_api_root, &conf.policy.k8s_api_root]
            .into_iter()
            .find(|r| !r.is_empty())
            .map(|r| api_root(r).to_string());
        let kubeconfig_path = (!conf.kubernetes.kubeconfig.is_empty())
            .then(|| PathBuf::from(&conf.kubernetes.kubeconfig));
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
            if !conf.policy.k8s_certificate_authority.is_empty() {
                cluster.certificate_authority = Some(conf.policy.k8s_certificate_authority.clone());
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
            if !conf.policy.k8s_auth_token.is_empty() {
                credentials.token = Some(conf.policy.k8s_auth_token.clone());
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
            if info.exec.is_some() || info.auth_provider.is_some() {
                return Err(K8sError::Config(format!(
                    "kubeconfig {kubeconfig_name}: exec and auth-provider credentials are not supported; use a token, a tokenFile or client certificates"
                )));
            }
            // The bearer token is added per request below.
            info.token = None;
            info.token_file = None;
            if !conf.policy.k8s_client_certificate.is_empty() {
                info.client_certificate = Some(conf.policy.k8s_client_certificate.clone());
                info.client_certificate_data = None;
            }
            if !conf.policy.k8s_client_key.is_empty() {
                info.client_key = Some(conf.policy.k8s_client_key.clone());
                info.client_key_data = None;
            }
        }
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| K8sError::Config(format!("invalid kubeconfig {kubeconfig_name}: {e}")))?;
        let client = build_client(&config, credentials.token.as_deref())?;
        Ok(K8sClient {
            client,
            credentials,
            deadline,
        })
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

    /// Runs one request within the invocation's deadline; 404 is `None`.
    async fn call<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<Option<T>, K8sError> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, request).await {
            Err(_) => Err(K8sError::Timeout(format!(
                "{what}: no answer from the Kubernetes API server within the deadline"
            ))),
            Ok(Ok(v)) => Ok(Some(v)),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(None),
            Ok(Err(e)) => Err(self.map_err(what, e)),
        }
    }

    /// One request to `path` (which must be made of valid names).
    async fn send<T: DeserializeOwned>(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        self.client.request::<T>(request).await
    }

    fn get(path: &str) -> http::Request<Vec<u8>> {
        http::Request::get(path)
            .body(Vec::new())
            .expect("a GET request builds")
    }

    /// GET of one object; 404 is `None`.
    async fn get_object<T: DeserializeOwned>(
        &self,
        what: String,
        path: String,
    ) -> Result<Option<T>, K8sError> {
        self.call(&what, self.send(Self::get(&path))).await
    }

    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            segment(namespace)?,
            segment(name)?
        );
        self.get_object(format!("error getting pod {namespace}/{name}"), path)
            .await
    }

    pub async fn namespace(&self, name: &str) -> Result<Option<Namespace>, K8sError> {
        let path = format!("/api/v1/namespaces/{}", segment(name)?);
        self.get_object(format!("error getting namespace {name}"), path)
            .await
    }

    pub async fn node(&self, name: &str) -> Result<Option<Node>, K8sError> {
        let path = format!("/api/v1/nodes/{}", segment(name)?);
        self.get_object(format!("error getting node {name}"), path)
            .await
    }

    /// Strategic-merge PATCH of a pod's `status` subresource; `Ok(None)`
    /// when the pod does not exist. A 409 (a failed resourceVersion or uid
    /// precondition) is [`PatchError::Conflict`].
    pub async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<Pod>, PatchError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/status",
            segment(namespace).map_err(PatchError::Other)?,
            segment(name).map_err(PatchError::Other)?
        );
        let request = http::Request::patch(path)
            .header(
                http::header::CONTENT_TYPE,
                "application/strategic-merge-patch+json",
            )
            .body(serde_json::to_vec(patch).expect("JSON values serialize"))
            .expect("a PATCH request builds");
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let what = format!("error patching pod {namespace}/{name}");
        match tokio::time::timeout(remaining, self.send::<Pod>(request)).await {
            Err(_) => Err(PatchError::Other(K8sError::Timeout(format!(
                "{what}: no answer within the deadline"
            )))),
            Ok(Ok(pod)) => Ok(Some(pod)),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(None),
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                Err(PatchError::Conflict(status.message.clone()))
            }
            Ok(Err(e)) => Err(PatchError::Other(self.map_err(&what, e))),
        }
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
        self.get_object(format!("error getting {kind}({name})"), path)
            .await
    }
}

/// A name as one URL path segment: Kubernetes names never need escaping,
/// so anything that would is refused rather than sent.
fn segment(name: &str) -> Result<&str, K8sError> {
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

/// A PATCH failed: a precondition (409), or anything else.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PatchError {
    #[error("update conflict: {0}")]
    Conflict(String),
    #[error("{0}")]
    Other(K8sError),
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
