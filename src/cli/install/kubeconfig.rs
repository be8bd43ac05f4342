//! The CNI plugin's kubeconfig (`<net.d>/calico-kubeconfig`) as Calico's
//! install-cni writes it: one cluster `local` (the API server the pod
//! reaches, its CA or `insecure-skip-tls-verify`), one user `calico` with a
//! token minted for the CNI's ServiceAccount with the TokenRequest API, one
//! context `calico-context`; mode 0600.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine;
use serde_json::json;
use tokio::time::Instant;

use crate::k8s::client::jwt_expiry;
use crate::k8s::{K8sClient, K8sConfig, K8sError};

/// How long a minted token is valid (what Calico requests).
pub const TOKEN_SECONDS: u64 = 24 * 60 * 60;

/// Where the installer runs as a pod: its ServiceAccount's mounted files.
#[derive(Debug, Clone)]
pub struct InCluster {
    /// The directory holding `token`, `ca.crt` and `namespace`.
    pub dir: PathBuf,
    /// `KUBERNETES_SERVICE_PROTOCOL`://`KUBERNETES_SERVICE_HOST`:`PORT`.
    pub server: String,
    /// `SKIP_TLS_VERIFY=true`: the kubeconfig trusts any certificate.
    pub skip_tls_verify: bool,
    /// `KUBECONFIG`: the credentials that mint the token, instead of the
    /// pod's own.
    pub kubeconfig: Option<PathBuf>,
    /// The ServiceAccount the token is for (`CALICO_CNI_SERVICE_ACCOUNT`).
    pub service_account: String,
    /// The token's requested lifetime in seconds.
    pub token_seconds: u64,
}

/// A token and when it expires (from its claims, when it says).
#[derive(Debug, Clone)]
pub struct Token {
    pub token: String,
    pub expires: Option<SystemTime>,
}

/// Why no kubeconfig could be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create a token for ServiceAccount {namespace}/{service_account}: {source}")]
    Token {
        namespace: String,
        service_account: String,
        #[source]
        source: K8sError,
    },
}

fn read(path: &Path) -> Result<String, KubeconfigError> {
    std::fs::read_to_string(path).map_err(|source| KubeconfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The server URL of the API as a pod reaches it; an IPv6 address in
/// brackets (Calico brackets every host, which its Go clients accept and
/// URL parsers elsewhere do not).
pub fn server_url(protocol: &str, host: &str, port: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("{protocol}://[{host}]:{port}")
    } else {
        format!("{protocol}://{host}:{port}")
    }
}

impl InCluster {
    /// Whether the installer runs in a pod (its ServiceAccount token is
    /// mounted).
    pub fn detected(dir: &Path) -> bool {
        dir.join("token").is_file()
    }

    /// The pod's namespace, its own token (read now: kubelet rotates it),
    /// and the client config with which it acts (`KUBECONFIG`'s instead,
    /// when set).
    pub fn own_credentials(&self) -> Result<(String, String, K8sConfig), KubeconfigError> {
        let namespace = read(&self.dir.join("namespace"))?.trim().to_string();
        let own = read(&self.dir.join("token"))?.trim().to_string();
        let conf = match &self.kubeconfig {
            Some(path) => K8sConfig {
                kubeconfig: Some(path.clone()),
                ..K8sConfig::default()
            },
            None => K8sConfig {
                api_root: Some(self.server.clone()),
                token: Some(own.clone()),
                certificate_authority: Some(self.dir.join("ca.crt").display().to_string()),
                ..K8sConfig::default()
            },
        };
        Ok((namespace, own, conf))
    }

    /// A fresh token for the CNI's ServiceAccount (TokenRequest); where the
    /// API server has no TokenRequest for it, the pod's own token.
    pub async fn mint(&self, deadline: Instant) -> Result<Token, KubeconfigError> {
        let (namespace, own, conf) = self.own_credentials()?;
        let failed = |source| KubeconfigError::Token {
            namespace: namespace.clone(),
            service_account: self.service_account.clone(),
            source,
        };
        let client = K8sClient::new(&conf, deadline).await.map_err(failed)?;
        let path = format!(
            "/api/v1/namespaces/{}/serviceaccounts/{}/token",
            crate::k8s::client::segment(&namespace).map_err(failed)?,
            crate::k8s::client::segment(&self.service_account).map_err(failed)?
        );
        let request = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": self.token_seconds}
        });
        let what = format!(
            "TokenRequest for ServiceAccount {namespace}/{}",
            self.service_account
        );
        match client.create_json(&what, &path, &request).await {
            Ok(answer) => {
                let token = answer["status"]["token"]
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        failed(K8sError::Api(format!("{what}: no token in the answer")))
                    })?
                    .to_string();
                let expires = answer["status"]["expirationTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(SystemTime::from)
                    .or_else(|| jwt_expiry(&token));
                Ok(Token { token, expires })
            }
            // No such subresource (a very old API server): the pod's own.
            Err(K8sError::Api(m)) if m.contains("does not exist") => Ok(Token {
                expires: jwt_expiry(&own),
                token: own,
            }),
            Err(e) => Err(failed(e)),
        }
    }

    /// The kubeconfig's text for `token`.
    pub fn render(&self, token: &str) -> Result<String, KubeconfigError> {
        let trust = if self.skip_tls_verify {
            "    insecure-skip-tls-verify: true\n".to_string()
        } else {
            let ca =
                std::fs::read(self.dir.join("ca.crt")).map_err(|source| KubeconfigError::Read {
                    path: self.dir.join("ca.crt"),
                    source,
                })?;
            format!(
                "    certificate-authority-data: \"{}\"\n",
                base64::engine::general_purpose::STANDARD.encode(ca)
            )
        };
        Ok(format!(
            "# The Calico CNI plugin's kubeconfig, written by calico install.\n\
             apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: local\n  cluster:\n    server: {server}\n{trust}\
             users:\n\
             - name: calico\n  user:\n    token: \"{token}\"\n\
             contexts:\n\
             - name: calico-context\n  context:\n    cluster: local\n    user: calico\n\
             current-context: calico-context\n",
            server = self.server,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        assert_eq!(
            server_url("https", "10.96.0.1", "443"),
            "https://10.96.0.1:443"
        );
        assert_eq!(
            server_url("https", "fd00::1", "443"),
            "https://[fd00::1]:443"
        );
        assert_eq!(
            server_url("https", "api.example", "6443"),
            "https://api.example:6443"
        );
    }

    #[test]
    fn the_kubeconfig_reads_back_as_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), b"-----BEGIN CERTIFICATE-----\n").unwrap();
        let mut cluster = InCluster {
            dir: dir.path().to_path_buf(),
            server: "https://10.96.0.1:443".into(),
            skip_tls_verify: false,
            kubeconfig: None,
            service_account: "calico-cni-plugin".into(),
            token_seconds: TOKEN_SECONDS,
        };
        let text = cluster.render("abc.def.ghi").unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("calico-context"));
        let c = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(c.server.as_deref(), Some("https://10.96.0.1:443"));
        assert!(c.certificate_authority_data.is_some());
        cluster.skip_tls_verify = true;
        let kc = kube::config::Kubeconfig::from_yaml(&cluster.render("t").unwrap()).unwrap();
        let c = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(c.insecure_skip_tls_verify, Some(true));
        assert!(c.certificate_authority_data.is_none());
    }
}
