//! A fault-injecting HTTPS proxy for the integration tests. It sits in front
//! of a real API server (TLS, token auth), forwards every request unchanged
//! and, for the requests a [`Rule`] matches, stages what a real server cannot
//! be asked for: a hang, a delay, a reset connection or an error status.
//!
//! Each request is forwarded on a connection of its own to the upstream, over
//! HTTP/1.1 (the proxy offers no ALPN, so its clients speak HTTP/1.1 too).

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// What the proxy does with a request a rule matches.
#[derive(Clone)]
pub enum Fault {
    /// Read the request and never answer (the connection stays open until
    /// the proxy is dropped).
    Hang,
    /// Wait this long, then forward the request.
    Delay(Duration),
    /// Forward the request, then never answer (the server applied it; its
    /// answer is lost on the way, as a write's is when the leader it went
    /// to dies).
    Lost,
    /// Read the request, then reset the TCP connection (the client sees
    /// ECONNRESET and no answer).
    Reset,
    /// Answer this status with a Kubernetes `Status` body, without
    /// forwarding; 429 also carries `Retry-After: 1`.
    Status(u16),
    /// Run this (blocking: a concurrent writer, say) off the proxy's thread,
    /// then forward the request.
    Before(Arc<dyn Fn() + Send + Sync>),
    /// Answer this status, content type and body, without forwarding (what
    /// a server that serves other things answers: the API server's plain
    /// `404 page not found` for a group it does not serve, say).
    Answer(u16, &'static str, String),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Hang => f.write_str("Hang"),
            Fault::Lost => f.write_str("Lost"),
            Fault::Delay(d) => write!(f, "Delay({d:?})"),
            Fault::Reset => f.write_str("Reset"),
            Fault::Status(code) => write!(f, "Status({code})"),
            Fault::Before(_) => f.write_str("Before(..)"),
            Fault::Answer(code, _, _) => write!(f, "Answer({code})"),
        }
    }
}

/// A fault for the requests that match `method` (exactly) and whose path
/// with query contains `path_contains`; `None` matches any. `times`: how many
/// requests it applies to before it is removed (`None`: every one).
#[derive(Clone, Debug)]
pub struct Rule {
    pub method: Option<String>,
    pub path_contains: Option<String>,
    /// Matches only this path (with its query), when set.
    pub path_is: Option<String>,
    /// Matches only a request whose body contains this, when set.
    pub body_contains: Option<String>,
    pub times: Option<usize>,
    pub fault: Fault,
}

/// The faults both datastore suites stage on every request, by name: a
/// black hole, slow answers, reset connections, refused credentials,
/// throttling. Each suite adds its own contention storm.
pub fn common_faults() -> Vec<(&'static str, Rule)> {
    vec![
        ("black-holed", Rule::always(Fault::Hang)),
        (
            "2 s per answer",
            Rule::always(Fault::Delay(std::time::Duration::from_secs(2))),
        ),
        ("connections reset", Rule::always(Fault::Reset)),
        ("401", Rule::always(Fault::Status(401))),
        ("429", Rule::always(Fault::Status(429))),
    ]
}

impl Rule {
    /// Every request.
    pub fn always(fault: Fault) -> Rule {
        Rule {
            method: None,
            path_contains: None,
            path_is: None,
            body_contains: None,
            times: None,
            fault,
        }
    }

    pub fn on(method: &str, path_contains: &str, fault: Fault) -> Rule {
        Rule {
            method: Some(method.to_owned()),
            path_contains: Some(path_contains.to_owned()),
            path_is: None,
            body_contains: None,
            times: None,
            fault,
        }
    }

    /// Only requests whose body contains `text` (an etcd transaction that
    /// writes: `request_put`).
    #[allow(dead_code)]
    pub fn with_body(self, text: &str) -> Rule {
        Rule {
            body_contains: Some(text.to_owned()),
            ..self
        }
    }

    /// Applies to the first `n` matching requests only.
    pub fn times(self, n: usize) -> Rule {
        Rule {
            times: Some(n),
            ..self
        }
    }

    /// Requests for exactly `path` (with no query).
    pub fn exactly(method: &str, path: &str, fault: Fault) -> Rule {
        Rule {
            method: Some(method.to_owned()),
            path_contains: None,
            path_is: Some(path.to_owned()),
            body_contains: None,
            times: None,
            fault,
        }
    }

    fn matches(&self, method: &str, path: &str, body: &[u8]) -> bool {
        self.times != Some(0)
            && self.body_contains.as_deref().is_none_or(|text| {
                body.windows(text.len().max(1))
                    .any(|w| w == text.as_bytes())
            })
            && self.method.as_deref().is_none_or(|m| m == method)
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
            && self.path_is.as_deref().is_none_or(|p| path == p)
    }
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    requests: Vec<(String, String)>,
    /// Body bytes forwarded: requests (to the upstream), answers (back).
    bytes: (u64, u64),
}

impl State {
    /// Logs a request; the fault of the first rule that matches it, if any,
    /// counted against the rule's `times`.
    fn arrive(&mut self, method: &str, path: &str, body: &[u8]) -> Option<Fault> {
        self.requests.push((method.to_owned(), path.to_owned()));
        let index = self
            .rules
            .iter()
            .position(|r| r.matches(method, path, body))?;
        let rule = &mut self.rules[index];
        let fault = rule.fault.clone();
        if let Some(left) = &mut rule.times {
            *left -= 1;
            if *left == 0 {
                self.rules.remove(index);
            }
        }
        Some(fault)
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running proxy; dropping it stops it and closes its connections.
pub struct FaultProxy {
    state: Shared,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 on a free port, serving TLS with `cert_pem` and
    /// `key_pem`, and forwards to `upstream` ("https://host:port"), trusting
    /// only the certificates in `ca_pem` for it. Serves on its own thread.
    pub fn start(upstream: &str, ca_pem: &Path, cert_pem: &Path, key_pem: &Path) -> FaultProxy {
        Self::start_with_identity(upstream, ca_pem, cert_pem, key_pem, None)
    }

    /// As [`FaultProxy::start`], presenting a client certificate and key to
    /// the upstream (an etcd member that requires one).
    pub fn start_with_identity(
        upstream: &str,
        ca_pem: &Path,
        cert_pem: &Path,
        key_pem: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> FaultProxy {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(cert_pem, key_pem)));
        let state = Shared::default();
        let forwarder = Arc::new(Forwarder {
            state: state.clone(),
            upstream: Upstream::new(upstream, ca_pem, identity),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("listener address");
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            rt.expect("tokio runtime")
                .block_on(accept_loop(listener, acceptor, forwarder, stopped));
            // Dropping the runtime drops the connection tasks, hung ones
            // included, which closes their sockets.
        });
        FaultProxy {
            state,
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Adds a rule after the others: for each request, the first rule that
    /// matches applies.
    pub fn push(&self, rule: Rule) {
        if let Fault::Status(code) = rule.fault {
            assert!(
                StatusCode::from_u16(code).is_ok(),
                "Fault::Status({code}): not an HTTP status"
            );
        }
        lock(&self.state).rules.push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        lock(&self.state).rules.clear();
    }

    /// How many rules are left (a rule with `times` goes once used up).
    #[allow(dead_code)]
    pub fn rules_left(&self) -> usize {
        lock(&self.state).rules.len()
    }

    /// Every request received so far, faulted ones included, as (method,
    /// path with query), in order of arrival.
    #[allow(dead_code)]
    pub fn requests(&self) -> Vec<(String, String)> {
        lock(&self.state).requests.clone()
    }

    /// The body bytes forwarded so far: (requests, answers).
    #[allow(dead_code)]
    pub fn bytes(&self) -> (u64, u64) {
        lock(&self.state).bytes
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn ring() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS server configuration with `cert_pem` and `key_pem`.
pub fn server_config(cert_pem: &Path, key_pem: &Path) -> ServerConfig {
    let key = PrivateKeyDer::from_pem_file(key_pem)
        .unwrap_or_else(|e| panic!("{}: {e}", key_pem.display()));
    ServerConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certificates(cert_pem), key)
        .expect("the proxy's certificate and key")
}

fn certificates(pem: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(pem)
        .and_then(|certs| certs.collect())
        .unwrap_or_else(|e| panic!("{}: {e}", pem.display()))
}

/// The server requests are forwarded to.
struct Upstream {
    /// host:port, to connect to.
    addr: String,
    /// The name its certificate must hold.
    name: ServerName<'static>,
    tls: TlsConnector,
}

impl Upstream {
    fn new(url: &str, ca_pem: &Path, identity: Option<(&Path, &Path)>) -> Upstream {
        let uri: Uri = url.parse().expect("the upstream URL");
        assert_eq!(uri.scheme_str(), Some("https"), "upstream {url}: not https");
        let host = uri.host().expect("the upstream host");
        let port = uri.port_u16().unwrap_or(443);
        let name = ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
            .unwrap_or_else(|e| panic!("upstream {url}: {e}"));
        let mut roots = RootCertStore::empty();
        for ca in certificates(ca_pem) {
            roots.add(ca).expect("the upstream CA certificate");
        }
        let config = ClientConfig::builder_with_provider(ring())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots);
        let config = match identity {
            Some((cert, key)) => config
                .with_client_auth_cert(
                    certificates(cert),
                    PrivateKeyDer::from_pem_file(key).expect("the client key"),
                )
                .expect("the client identity"),
            None => config.with_no_client_auth(),
        };
        Upstream {
            addr: format!("{host}:{port}"),
            name,
            tls: TlsConnector::from(Arc::new(config)),
        }
    }

    /// Sends `req` as it is, on a new connection.
    async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, Box<dyn Error + Send + Sync>> {
        let tcp = TcpStream::connect(&self.addr).await?;
        tcp.set_nodelay(true)?;
        let tls = self.tls.connect(self.name.clone(), tcp).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(connection);
        Ok(sender.send_request(req).await?)
    }
}

/// What every connection shares: the rules and log, and the upstream.
struct Forwarder {
    state: Shared,
    upstream: Upstream,
}

type Body = Either<Incoming, Full<Bytes>>;

impl Forwarder {
    /// One request; a `Reset` is asked of the connection through `reset`.
    async fn serve(
        &self,
        req: Request<Incoming>,
        reset: &Notify,
    ) -> Result<Response<Body>, Infallible> {
        // Whole bodies, read first (a rule may look into one) and counted
        // (requests and answers here are small).
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let method = parts.method.as_str();
        let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let fault = lock(&self.state).arrive(method, path, &body);
        let lost = matches!(fault, Some(Fault::Lost));
        match fault {
            None | Some(Fault::Lost) => {}
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            Some(Fault::Before(action)) => {
                tokio::task::spawn_blocking(move || action())
                    .await
                    .expect("the fault proxy's Before action panicked");
            }
            Some(Fault::Status(code)) => {
                return Ok(status(code, "injected by the fault proxy"));
            }
            Some(Fault::Answer(code, content_type, body)) => {
                let mut response = Response::new(Either::Right(Full::new(Bytes::from(body))));
                *response.status_mut() =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
                return Ok(response);
            }
            Some(Fault::Hang) => {
                return std::future::pending().await;
            }
            Some(Fault::Reset) => {
                reset.notify_one();
                return std::future::pending().await;
            }
        }
        lock(&self.state).bytes.0 += body.len() as u64;
        let req = Request::from_parts(parts, Full::new(body));
        if lost {
            if let Ok(answer) = self.upstream.send(req).await {
                let _ = answer.into_body().collect().await;
            }
            return std::future::pending().await;
        }
        Ok(match self.upstream.send(req).await {
            Ok(answer) => {
                let (parts, body) = answer.into_parts();
                match body.collect().await {
                    Ok(body) => {
                        let body = body.to_bytes();
                        lock(&self.state).bytes.1 += body.len() as u64;
                        Response::from_parts(parts, Either::Right(Full::new(body)))
                    }
                    Err(e) => status(502, &format!("the fault proxy's upstream: {e}")),
                }
            }
            Err(e) => status(502, &format!("the fault proxy's upstream: {e}")),
        })
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    acceptor: TlsAcceptor,
    forwarder: Arc<Forwarder>,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("the proxy's listener");
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                // As the clients and servers it stands between: without it a
                // response written in pieces waits on a delayed ACK (40 ms).
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve_connection(tcp, acceptor.clone(), forwarder.clone()));
            }
        }
    }
}

/// Serves one client connection until it ends or a request asks for a reset,
/// which closes the socket with SO_LINGER 0: the kernel sends an RST.
async fn serve_connection(tcp: TcpStream, acceptor: TlsAcceptor, forwarder: Arc<Forwarder>) {
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let reset = Arc::new(Notify::new());
    let service = {
        let reset = reset.clone();
        service_fn(move |req| {
            let (forwarder, reset) = (forwarder.clone(), reset.clone());
            async move { forwarder.serve(req, &reset).await }
        })
    };
    let mut connection = http1::Builder::new().serve_connection(TokioIo::new(tls), service);
    let reset_asked = tokio::select! {
        _ = &mut connection => false,
        () = reset.notified() => true,
    };
    if reset_asked {
        let (tcp, _) = connection.into_parts().io.into_inner().into_inner();
        let _ = tcp.set_zero_linger();
    }
}

/// An error answer as the API server writes one.
fn status(code: u16, message: &str) -> Response<Body> {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message});
    if let Some(reason) = reason(code) {
        status["reason"] = json!(reason);
    }
    status["code"] = json!(code.as_u16());
    if code == StatusCode::TOO_MANY_REQUESTS {
        // As the API server's NewTooManyRequests: the wait in the body too.
        status["details"] = json!({"retryAfterSeconds": 1});
    }
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(status.to_string()))));
    *response.status_mut() = code;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if code == StatusCode::TOO_MANY_REQUESTS {
        headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// The `reason` the API server gives a status (k8s.io/apimachinery's
/// `NewGenericServerResponse`, and `Expired` for 410 as its watch cache
/// answers a too-old resourceVersion); none for a code it has no reason for.
fn reason(code: StatusCode) -> Option<&'static str> {
    Some(match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        500.. => "InternalError",
        _ => return None,
    })
}
