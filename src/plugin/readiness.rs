//! Readiness gates (`readiness_gates`): before an ADD touches anything, each
//! URL must answer an HTTP GET with a status from 200 to 399. Calico polls
//! every 5 s for up to 30 s; this plugin polls every 250 ms, within the same
//! 30 s and the invocation's deadline, so a pod starts as soon as the gate
//! opens. `http://` and `https://` gates, as Calico's Go client takes them:
//! https verified against the system's roots (`SSL_CERT_FILE` names
//! another bundle), no client certificate.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::cni::error::Unsupported;
use crate::cni::{Error, Result};

const GATE_LIMIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(250);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

type GateClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<bytes::Bytes>>;

/// Parses every gate first: a bad URL fails the ADD before any waiting.
pub fn parse_gates(gates: &[String]) -> Result<Vec<http::Uri>> {
    gates
        .iter()
        .map(|g| {
            let uri: http::Uri = g.parse().map_err(|e| {
                Error::invalid_config(format!("invalid URL set for ReadinessGates:{g} Error:{e}"))
            })?;
            match uri.scheme_str() {
                Some("http" | "https") if uri.host().is_some() => Ok(uri),
                _ => Err(Error::unsupported(Unsupported::ReadinessGateUrl(
                    g.to_string(),
                ))),
            }
        })
        .collect()
}

/// The client the gates are asked with: HTTP/1.1, TLS for https against
/// the system's roots.
fn client() -> GateClient {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map(|b| b.with_root_certificates(roots).with_no_client_auth())
    .unwrap_or_else(|_| {
        rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
    });
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

/// One GET; the status code, if the server answered.
async fn status_of(client: &GateClient, uri: &http::Uri) -> Option<u16> {
    let request = http::Request::get(uri.clone())
        .header(http::header::USER_AGENT, "calico-cni")
        .body(Empty::new())
        .ok()?;
    tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(request))
        .await
        .ok()?
        .ok()
        .map(|response| response.status().as_u16())
}

/// Waits until every gate is open, or fails when 30 s (or the deadline) pass.
pub async fn wait_for_gates(gates: &[String], deadline: Instant) -> Result<()> {
    let gates = parse_gates(gates)?;
    let until = deadline.min(Instant::now() + GATE_LIMIT);
    let client = client();
    for gate in &gates {
        loop {
            match status_of(&client, gate).await {
                Some(code) if (200..400).contains(&code) => break,
                last => {
                    if Instant::now() + POLL >= until {
                        return Err(Error::timed_out(format!(
                            "readiness gate {gate} is not ready (last answer: {})",
                            last.map_or("none".to_string(), |c| c.to_string())
                        )));
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn gate_urls_are_checked() {
        assert!(parse_gates(&["http://127.0.0.1:9099/readiness".into()]).is_ok());
        assert!(parse_gates(&["https://calico-node.example:9099/readiness".into()]).is_ok());
        assert_eq!(
            parse_gates(&["ftp://127.0.0.1/x".into()])
                .unwrap_err()
                .code(),
            2
        );
        let e = parse_gates(&["::not a url".into()]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid URL set for ReadinessGates:::not a url Error:"),
            "{e}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waits_for_an_open_gate_and_times_out_on_a_closed_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Answers 503 twice, then 200.
        tokio::spawn(async move {
            for i in 0.. {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let status = if i < 2 {
                    "503 Service Unavailable"
                } else {
                    "200 OK"
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let gate = format!("http://127.0.0.1:{port}/ready");
        let started = Instant::now();
        wait_for_gates(&[gate], Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        assert!(started.elapsed() >= POLL * 2);

        let closed = "http://127.0.0.1:9/never".to_string();
        let e = wait_for_gates(&[closed], Instant::now() + Duration::from_millis(600))
            .await
            .unwrap_err();
        assert_eq!(e.code(), 11);
    }
}
