//! The credentials: the kubeconfig read afresh by every process (or one
//! made from the overrides alone), where the token came from, and a JWT's
//! expiry for the messages that report a rejected or expiring token (a
//! 401 told with where the credentials came from and when a JWT expired).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::config::Kubeconfig;
use serde_json::Value;

use super::{K8sClient, K8sError};

/// Where the credentials came from, for error messages (never the secret).
#[derive(Debug, Clone, Default)]
pub(super) struct Credentials {
    /// The kubeconfig file, if one was used.
    pub(super) kubeconfig: Option<PathBuf>,
    /// The bearer token in use, to read a JWT's expiry from.
    pub(super) token: Option<String>,
    /// Where the token was read from.
    pub(super) token_source: String,
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
pub(super) fn minimal_kubeconfig() -> Kubeconfig {
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

pub(super) fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, K8sError> {
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
    pub(super) fn describe_unauthorized(&self, status: &kube::core::Status) -> K8sError {
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

    /// A digest of the credentials this client presents: where they came
    /// from and the bearer token itself (never the token: a SHA-256 over
    /// both), so that a caller can tell whether a later call presents the
    /// same ones (a token file rotated, an inline token replaced).
    pub fn credentials_digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"calico-cni credentials\0");
        h.update(self.credentials.token_source.as_bytes());
        h.update(b"\0");
        h.update(
            self.credentials
                .token
                .as_deref()
                .unwrap_or_default()
                .as_bytes(),
        );
        h.finalize().into()
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
