//! What the Kubernetes API client is built from: a kubeconfig and the
//! overrides a caller may apply to it. The client's own type, so that this
//! module depends on nothing above it.

use std::path::PathBuf;

/// Where the API server is and which credentials to use. Every field but
/// the kubeconfig is an override of what the kubeconfig says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct K8sConfig {
    /// The kubeconfig file (read afresh by every client built from it).
    pub kubeconfig: Option<PathBuf>,
    /// The API server's base URL (anything from `/api/` on is dropped).
    pub api_root: Option<String>,
    /// A bearer token that wins over the kubeconfig's credentials.
    pub token: Option<String>,
    pub certificate_authority: Option<String>,
    pub client_certificate: Option<String>,
    pub client_key: Option<String>,
}
