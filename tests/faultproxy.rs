//! The fault-injecting HTTPS proxy (tests/common/faultproxy.rs) in front of a
//! tiny HTTPS upstream that echoes what it receives: forwarding, each fault,
//! rule order and counts, and the request log. Certificates are made with the
//! `openssl` CLI for each test.

mod common;

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::block_on;
use common::faultproxy::{Fault, FaultProxy, Rule};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderMap, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const TOKEN: &str = "Bearer s3cret";

/// A CA, and a certificate for 127.0.0.1 it signed for each of `names`
/// (`<name>.pem`, `<name>.key`), in a temporary directory.
fn pki(names: &[&str]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let openssl = |args: &str| {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(dir.path())
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args}: {out:?}");
    };
    let ec_key = "-nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
    openssl(&format!(
        "req -x509 {ec_key} -days 1 -subj /CN=faultproxy-test-ca \
         -addext basicConstraints=critical,CA:TRUE -keyout ca.key -out ca.pem"
    ));
    std::fs::write(dir.path().join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    for name in names {
        openssl(&format!(
            "req -new {ec_key} -subj /CN={name} -keyout {name}.key -out {name}.csr"
        ));
        openssl(&format!(
            "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
             -extfile san.ext -out {name}.pem"
        ));
    }
    dir
}

fn ring() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_roots(ca_pem: &Path) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

/// Starts the echoing upstream on the current runtime: it answers 200 with
/// the method, path with query, Authorization and body it received, as JSON,
/// and counts the requests in `hits`.
fn start_upstream(dir: &Path, hits: Arc<AtomicUsize>) -> SocketAddr {
    let certs = CertificateDer::pem_file_iter(dir.join("upstream.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("upstream.key")).unwrap();
    let config = ServerConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, hits) = (acceptor.clone(), hits.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req| echo(hits.clone(), req));
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service);
                let _ = connection.await;
            });
        }
    });
    addr
}

async fn echo(
    hits: Arc<AtomicUsize>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    hits.fetch_add(1, Ordering::SeqCst);
    let method = req.method().to_string();
    let path = req.uri().path_and_query().map(|pq| pq.to_string());
    let auth = req
        .headers()
        .get(AUTHORIZATION)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let echo = json!({"method": method, "path": path, "authorization": auth,
        "body": String::from_utf8_lossy(&body)});
    let mut response = Response::new(Full::new(Bytes::from(echo.to_string())));
    response
        .headers_mut()
        .insert("x-upstream", "echo".parse().unwrap());
    Ok(response)
}

/// A proxy in front of an echoing upstream, and a client for the proxy.
struct Fixture {
    proxy: FaultProxy,
    /// Requests the upstream received.
    hits: Arc<AtomicUsize>,
    client: TlsConnector,
    _pki: TempDir,
}

/// Must be called on a runtime, which serves the upstream.
fn fixture() -> Fixture {
    let pki = pki(&["upstream", "proxy"]);
    let dir = pki.path();
    let hits = Arc::new(AtomicUsize::new(0));
    let upstream = start_upstream(dir, hits.clone());
    let file = |name: &str| -> PathBuf { dir.join(name) };
    let proxy = FaultProxy::start(
        &format!("https://{upstream}"),
        &file("ca.pem"),
        &file("proxy.pem"),
        &file("proxy.key"),
    );
    let config = ClientConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(ca_roots(&file("ca.pem")))
        .with_no_client_auth();
    Fixture {
        proxy,
        hits,
        client: TlsConnector::from(Arc::new(config)),
        _pki: pki,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

type BoxError = Box<dyn Error + Send + Sync>;

impl Fixture {
    /// One request through the proxy, with the bearer token, on a new
    /// connection; the answer's body parsed as JSON.
    async fn send(&self, method: &str, path: &str, body: &str) -> Result<Answer, BoxError> {
        let authority = self.proxy.url().trim_start_matches("https://").to_owned();
        let tcp = TcpStream::connect(&authority).await?;
        let name = ServerName::try_from("127.0.0.1")?;
        let tls = self.client.connect(name, tcp).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, authority)
            .header(AUTHORIZATION, TOKEN)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))?;
        let (parts, body) = sender.send_request(req).await?.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: serde_json::from_slice(&body)?,
        })
    }

    async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, "").await.unwrap()
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn requests(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect()
}

#[test]
fn forwards_the_request_and_the_answer_unchanged() {
    block_on(async {
        let f = fixture();
        let path = "/api/v1/namespaces/ns1/pods?fieldManager=calico&dryRun=All";
        let answer = f.send("POST", path, r#"{"kind":"Pod"}"#).await.unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.headers["x-upstream"], "echo");
        let echo = json!({"method": "POST", "path": path, "authorization": TOKEN,
            "body": r#"{"kind":"Pod"}"#});
        assert_eq!(answer.body, echo);
        assert_eq!(f.hits(), 1);
        assert_eq!(f.proxy.requests(), requests(&[("POST", path)]));
    });
}

#[test]
fn status_answers_without_forwarding() {
    block_on(async {
        let f = fixture();
        f.proxy.push(Rule::on("GET", "/pods", Fault::Status(429)));
        let answer = f.get("/api/v1/namespaces/ns1/pods/p1").await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers[RETRY_AFTER], "1");
        assert_eq!(answer.headers[CONTENT_TYPE], "application/json");
        let body = &answer.body;
        assert_eq!(
            (&body["kind"], &body["apiVersion"]),
            (&json!("Status"), &json!("v1"))
        );
        assert_eq!(
            (&body["status"], &body["code"]),
            (&json!("Failure"), &json!(429))
        );
        assert_eq!(body["reason"], "TooManyRequests");
        assert!(body["message"].is_string(), "{body}");
        assert_eq!(f.hits(), 0);
        // Another method, or another path, is forwarded.
        let answer = f
            .send("PATCH", "/api/v1/namespaces/ns1/pods/p1", "{}")
            .await
            .unwrap();
        assert_eq!((answer.status, f.hits()), (StatusCode::OK, 1));
        assert_eq!(f.get("/api/v1/nodes/n1").await.status, StatusCode::OK);
        assert_eq!(f.hits(), 2);
    });
}

#[test]
fn status_reasons() {
    block_on(async {
        let f = fixture();
        for (code, reason) in [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (404, "NotFound"),
        ] {
            f.proxy.clear();
            f.proxy.push(Rule::always(Fault::Status(code)));
            let answer = f.get("/version").await;
            assert_eq!(answer.status.as_u16(), code);
            assert_eq!(
                (&answer.body["reason"], &answer.body["code"]),
                (&json!(reason), &json!(code))
            );
            assert!(answer.headers.get(RETRY_AFTER).is_none());
        }
        assert_eq!(f.hits(), 0);
    });
}

#[test]
fn the_first_matching_rule_applies() {
    block_on(async {
        let f = fixture();
        f.proxy.push(Rule::on("GET", "/nodes/", Fault::Status(404)));
        f.proxy.push(Rule::always(Fault::Status(503)));
        assert_eq!(
            f.get("/api/v1/nodes/n1").await.status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            f.get("/api/v1/namespaces/ns1").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        f.proxy.clear();
        assert_eq!(f.get("/api/v1/nodes/n1").await.status, StatusCode::OK);
    });
}

#[test]
fn a_body_rule_applies_only_to_bodies_that_contain_its_text() {
    block_on(async {
        let f = fixture();
        f.proxy
            .push(Rule::on("POST", "/v3/kv/txn", Fault::Status(503)).with_body("request_put"));
        let read = r#"{"success":[{"request_range":{"key":"a2V5"}}]}"#;
        let write = r#"{"success":[{"request_put":{"key":"a2V5","value":"dg=="}}]}"#;
        let status = |answer: Result<Answer, BoxError>| answer.expect("an answer").status;
        assert_eq!(
            status(f.send("POST", "/v3/kv/txn", read).await),
            StatusCode::OK
        );
        assert_eq!(
            status(f.send("POST", "/v3/kv/txn", write).await),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(f.hits(), 1, "the write was not forwarded");
    });
}

#[test]
fn times_limits_a_rule_then_requests_are_forwarded() {
    block_on(async {
        let f = fixture();
        f.proxy.push(Rule::always(Fault::Status(500)).times(1));
        assert_eq!(
            f.get("/version").await.status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(f.hits(), 0);
        assert_eq!(f.get("/version").await.status, StatusCode::OK);
        assert_eq!(f.get("/version").await.status, StatusCode::OK);
        assert_eq!(f.hits(), 2);
    });
}

#[test]
fn delay_waits_then_forwards() {
    block_on(async {
        let f = fixture();
        let delay = Duration::from_millis(400);
        f.proxy.push(Rule::always(Fault::Delay(delay)));
        let start = Instant::now();
        let answer = f.get("/version").await;
        assert!(
            start.elapsed() >= delay,
            "answered after {:?}",
            start.elapsed()
        );
        assert_eq!((answer.status, f.hits()), (StatusCode::OK, 1));
    });
}

#[test]
fn hang_never_answers() {
    block_on(async {
        let f = fixture();
        f.proxy.push(Rule::on("GET", "/pods/p1", Fault::Hang));
        let sent = tokio::time::timeout(
            Duration::from_secs(1),
            f.get("/api/v1/namespaces/ns1/pods/p1"),
        )
        .await;
        assert!(sent.is_err(), "answered despite Hang");
        assert_eq!(f.hits(), 0);
        // Other requests, on other connections, are still served.
        assert_eq!(f.get("/version").await.status, StatusCode::OK);
        let log = [
            ("GET", "/api/v1/namespaces/ns1/pods/p1"),
            ("GET", "/version"),
        ];
        assert_eq!(f.proxy.requests(), requests(&log));
    });
}

#[test]
fn reset_resets_the_connection() {
    block_on(async {
        let f = fixture();
        f.proxy.push(Rule::on("DELETE", "", Fault::Reset));
        let Err(error) = f
            .send("DELETE", "/api/v1/namespaces/ns1/pods/p1", "{}")
            .await
        else {
            panic!("answered despite Reset");
        };
        let mut cause: Option<&(dyn Error + 'static)> = Some(error.as_ref());
        let mut io = None;
        while let Some(e) = cause {
            io = io.or(e.downcast_ref::<std::io::Error>());
            cause = e.source();
        }
        let kind = io.map(std::io::Error::kind);
        assert_eq!(kind, Some(std::io::ErrorKind::ConnectionReset), "{error:?}");
        assert_eq!(f.hits(), 0);
        assert_eq!(f.get("/version").await.status, StatusCode::OK);
    });
}
