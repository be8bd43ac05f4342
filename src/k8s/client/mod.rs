//! The Kubernetes API client of one invocation, built with kube from a
//! [`K8sConfig`]: a kubeconfig and its overrides (API root, token,
//! certificates). Every process reads the kubeconfig (and a token or
//! tokenFile in it) afresh, every request is bounded by [`REQUEST_TIMEOUT`]
//! and the whole call by the invocation's deadline, and a rejected token is
//! reported with the kubeconfig it came from and, for a JWT, when it
//! expired.
//!
//! Here: the client of one call, its making from the config, and the pods
//! it read. Beside it: `groups` (Calico's API groups), `errors` (its
//! error), `credentials` (the kubeconfig, the token and its expiry, a 401
//! told with them), `transport` (HTTPS, HTTP/2 by ALPN, the bearer token on
//! every request), `requests` (one request, its retries and kube's errors; GET, list,
//! create, replace, delete), `resources` (the pods, namespaces, nodes and
//! Calico objects read and patched), `watch` (one object followed: a list,
//! then watches from its resourceVersion).

mod credentials;
mod errors;
mod groups;
mod requests;
mod resources;
mod transport;
mod watch;

use kube::config::KubeConfigOptions;
use secrecy::ExposeSecret;
use tokio::time::Instant;

use crate::connection_gate::ConnectionGate;
use crate::k8s::config::K8sConfig;
use crate::k8s::objects::Pod;

use credentials::{Credentials, minimal_kubeconfig, read_kubeconfig};
pub use credentials::{jwt_expiry, rfc3339};
pub use errors::K8sError;
pub use groups::{CALICO_CRD_GROUP, CALICO_CRD_VERSION, CALICO_V3_GROUP, CalicoApiGroup};
pub use requests::{Freshness, REQUEST_TIMEOUT, segment};
use transport::{api_root, build_client};
pub use watch::Watched;

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

    pub(super) fn remember(&self, namespace: &str, name: &str, pod: Option<&Pod>) {
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
}
