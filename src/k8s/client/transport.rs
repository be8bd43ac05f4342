//! The HTTP client: HTTPS with the kubeconfig's TLS settings, HTTP/2 by
//! ALPN, Calico's user agent and the bearer token on every request.

use super::K8sError;
use crate::connection_gate::{Announcing, ConnectionGate};

/// `https://host:6443/api/v1/...` → `https://host:6443` (Calico strips the
/// path from `/api/` on).
pub(super) fn api_root(root: &str) -> &str {
    root.find("/api/")
        .map_or(root, |i| &root[..i])
        .trim_end_matches('/')
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
pub(super) fn build_client(
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
}
