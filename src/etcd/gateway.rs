//! etcd's gRPC gateway: the KV and Maintenance services as JSON over HTTP
//! on each member's client URL (`/v3/kv/range`, `/v3/kv/txn`,
//! `/v3/maintenance/status`), bytes in base64, int64s as strings.
//!
//! Endpoints are tried in turn, starting from the last one that answered;
//! a request moves on to the next endpoint only when it certainly did not
//! reach the cluster (the connection failed) or the member has no leader,
//! so a transaction is never sent twice.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::endpoints::{Endpoints, Failed, Round};
use super::{
    Compare, Credentials, EtcdConfig, EtcdError, KeyValue, Op, OpResponse, RangeRequest, Read, Txn,
    TxnResponse,
};
use crate::connection_gate::{Announcing, ConnectionGate};

/// How long connecting to one member may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a call keeps going round the endpoints while none can serve
/// it (members restarting, a leader being elected: about a second).
const RETRY_WINDOW: Duration = Duration::from_secs(3);

type HttpsClient = Client<Announcing<hyper_rustls::HttpsConnector<HttpConnector>>, Full<Bytes>>;

#[derive(Clone)]
pub struct Gateway {
    client: HttpsClient,
    endpoints: Endpoints,
    /// etcd's user and password, when the cluster has authentication on.
    credentials: Option<Credentials>,
    /// The token `/v3/auth/authenticate` gave for them (simple tokens are
    /// the cluster's, not one member's: any endpoint takes it).
    token: Arc<tokio::sync::Mutex<Option<String>>>,
    /// The call's first request opens the connection alone (HTTP/2).
    gate: Arc<ConnectionGate>,
    /// The cluster's ID, as the first answer's header gave it.
    cluster_id: Arc<std::sync::OnceLock<String>>,
}

impl Gateway {
    pub fn new(conf: &EtcdConfig) -> Result<Gateway, EtcdError> {
        let endpoints = Endpoints::new(conf)?;
        let needs_tls = conf.endpoints.iter().any(|e| e.starts_with("https://"));
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        let tls = if needs_tls {
            super::tls::client_config(conf)?
        } else {
            Arc::new(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .map_err(|e| EtcdError::Config(format!("TLS: {e}")))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(Arc::unwrap_or_clone(tls))
            .https_or_http()
            .enable_http1()
            // ALPN h2 first: etcd serves its gateway over HTTP/2 too (one
            // connection for every request of the call).
            .enable_http2()
            .wrap_connector(http);
        let gate = Arc::default();
        let client = Client::builder(TokioExecutor::new())
            .build(Announcing::new(connector, Arc::clone(&gate)));
        Ok(Gateway {
            client,
            endpoints,
            credentials: conf.credentials.clone(),
            token: Arc::default(),
            gate,
            cluster_id: Arc::default(),
        })
    }

    /// The token to send, authenticating first when there is none yet;
    /// `None` without credentials.
    async fn token(&self, deadline: Instant) -> Result<Option<String>, EtcdError> {
        let Some(c) = &self.credentials else {
            return Ok(None);
        };
        let mut token = self.token.lock().await;
        if let Some(t) = token.as_ref() {
            return Ok(Some(t.clone()));
        }
        let body = json!({ "name": c.username, "password": c.password });
        let answer = self
            .call_as("/v3/auth/authenticate", &body, None, deadline)
            .await
            .map_err(|e| match e {
                EtcdError::Unauthorized(m) | EtcdError::Server(m) => EtcdError::Unauthorized(
                    format!("authenticating to etcd as {:?}: {m}", c.username),
                ),
                e => e,
            })?;
        let fresh = answer
            .get("token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| EtcdError::Server("etcd's authenticate answer carries no token".into()))?
            .to_string();
        *token = Some(fresh.clone());
        Ok(Some(fresh))
    }

    pub fn endpoints(&self) -> &[String] {
        self.endpoints.urls()
    }

    /// POSTs `body` to `path` on the endpoints in turn, bounded by the
    /// deadline; rounds of all endpoints are repeated, with a growing
    /// pause, for [`RETRY_WINDOW`] while none can serve the call.
    /// [`Self::call_as`] with the credentials' token; a token the cluster
    /// no longer knows (expired, or the member restarted) is renewed once.
    /// The ID of the cluster that answered, once one has: a cluster
    /// rebuilt on the same endpoints has another.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.get().map(String::as_str)
    }

    async fn call(&self, path: &str, body: &Value, deadline: Instant) -> Result<Value, EtcdError> {
        let answer = self.call_authenticated(path, body, deadline).await?;
        // A uint64, as a string (or a number) in the gateway's JSON.
        let id = match answer.pointer("/header/cluster_id") {
            Some(Value::String(s)) => s.parse::<u64>().ok(),
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        if let Some(id) = id.filter(|&id| id != 0) {
            let _ = self.cluster_id.set(format!("{id:x}"));
        }
        Ok(answer)
    }

    async fn call_authenticated(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Value, EtcdError> {
        let token = self.token(deadline).await?;
        match self.call_as(path, body, token.as_deref(), deadline).await {
            Err(EtcdError::Unauthorized(m))
                if token.is_some() && m.contains("invalid auth token") =>
            {
                tracing::debug!("etcd no longer knows the auth token; authenticating again");
                *self.token.lock().await = None;
                let token = self.token(deadline).await?;
                self.call_as(path, body, token.as_deref(), deadline).await
            }
            other => other,
        }
    }

    async fn call_as(
        &self,
        path: &str,
        body: &Value,
        token: Option<&str>,
        deadline: Instant,
    ) -> Result<Value, EtcdError> {
        let bytes = Bytes::from(serde_json::to_vec(body).expect("JSON values serialize"));
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let round = self
                .endpoints
                .round(path, deadline, |i| {
                    self.attempt(&self.endpoints.urls()[i], path, bytes.clone(), token)
                })
                .await;
            let errors = match round {
                Ok(v) => return Ok(v),
                Err(Round::Retryable(errors)) => errors,
                Err(failed) => return Err(failed.into_error()),
            };
            let now = Instant::now();
            let within = now.duration_since(started) + pause < RETRY_WINDOW;
            if errors.is_empty() || !within || now + pause >= deadline {
                return Err(Round::Retryable(errors).into_error());
            }
            tracing::debug!(%path, "no etcd endpoint could serve the request; again in {pause:?}");
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    async fn attempt(
        &self,
        endpoint: &str,
        path: &str,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<Value, Failed> {
        let mut request = http::Request::post(format!("{endpoint}{path}"))
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(t) = token {
            // The gateway hands `Authorization` to etcd as the token.
            request = request.header(http::header::AUTHORIZATION, t);
        }
        let request = request.body(Full::new(body)).map_err(|e| Failed {
            error: EtcdError::Config(format!("etcd endpoint {endpoint:?}: {e}")),
            try_next: true,
        })?;
        let turn = self.gate.turn().await;
        let asked = Instant::now();
        let sent = self.client.request(request).await;
        tracing::debug!(
            %endpoint,
            %path,
            ok = sent.as_ref().is_ok_and(|r| r.status().is_success()),
            ms = asked.elapsed().as_secs_f64() * 1e3,
            "etcd request"
        );
        if sent.is_ok() {
            self.gate.opened();
        }
        drop(turn);
        let response = sent.map_err(|e| {
            // Not connected: the request never reached the member.
            let try_next = e.is_connect();
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            Failed {
                error: EtcdError::Unavailable(text),
                try_next,
            }
        })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Failed {
                error: EtcdError::Unavailable(format!("reading etcd's answer: {e}")),
                try_next: false,
            })?
            .to_bytes();
        if body.starts_with(b"CommonName of client") {
            // etcd with authentication on will not take a client
            // certificate's name for a user on its gateway (Calico's gRPC
            // client can): say what would work.
            return Err(Failed {
                error: EtcdError::Unauthorized(format!(
                    "etcd has authentication enabled and its gateway refuses client certificates ({}): \
                     authenticate with ETCD_USERNAME and ETCD_PASSWORD and no etcd_cert_file/etcd_key_file",
                    String::from_utf8_lossy(&body).trim()
                )),
                try_next: false,
            });
        }
        let value: Value = serde_json::from_slice(&body).map_err(|e| Failed {
            error: EtcdError::Server(format!(
                "etcd answered {status} with a body that is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )),
            try_next: false,
        })?;
        if status.is_success() && value.get("error").is_none() {
            return Ok(value);
        }
        Err(classify(status, &value))
    }

    pub async fn range(
        &self,
        range: &RangeRequest,
        deadline: Instant,
    ) -> Result<Vec<KeyValue>, EtcdError> {
        let answer = self
            .call("/v3/kv/range", &range_json(range), deadline)
            .await?;
        parse_range(&answer)
    }

    /// Several ranges in one read-only transaction (served as a range is:
    /// without a round to the leader when every one is serializable).
    pub async fn ranges(
        &self,
        ranges: &[RangeRequest],
        deadline: Instant,
    ) -> Result<Vec<Vec<KeyValue>>, EtcdError> {
        let success: Vec<Value> = ranges
            .iter()
            .map(|r| json!({ "request_range": range_json(r) }))
            .collect();
        let answer = self
            .call("/v3/kv/txn", &json!({ "success": success }), deadline)
            .await?;
        let answers = answer
            .get("responses")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if answers.len() != ranges.len() {
            return Err(EtcdError::Server(format!(
                "etcd answered {} of {} reads of a transaction",
                answers.len(),
                ranges.len()
            )));
        }
        answers
            .iter()
            .map(|a| parse_range(a.get("response_range").unwrap_or(&Value::Null)))
            .collect()
    }

    pub async fn txn(&self, txn: &Txn, deadline: Instant) -> Result<TxnResponse, EtcdError> {
        let body = json!({
            "compare": txn.compare.iter().map(compare_json).collect::<Vec<_>>(),
            "success": txn.success.iter().map(op_json).collect::<Vec<_>>(),
            "failure": txn.failure.iter().map(op_json).collect::<Vec<_>>(),
        });
        let answer = self.call("/v3/kv/txn", &body, deadline).await?;
        let succeeded = answer
            .get("succeeded")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let ops = if succeeded {
            &txn.success
        } else {
            &txn.failure
        };
        let answers = answer
            .get("responses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut responses = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let a = answers.get(i).cloned().unwrap_or(Value::Null);
            responses.push(match op {
                Op::Put(..) => OpResponse::Put,
                Op::Get(_) => {
                    let range = a.get("response_range").cloned().unwrap_or(json!({}));
                    OpResponse::Get(parse_range(&range)?.pop())
                }
                Op::Delete(_) => OpResponse::Delete(int(a
                    .pointer("/response_delete_range/deleted")
                    .unwrap_or(&Value::Null))),
            });
        }
        Ok(TxnResponse {
            succeeded,
            revision: header_revision(&answer),
            responses,
        })
    }

    pub async fn status(&self, deadline: Instant) -> Result<String, EtcdError> {
        let answer = self
            .call("/v3/maintenance/status", &json!({}), deadline)
            .await?;
        let version = answer.get("version").and_then(Value::as_str).unwrap_or("?");
        let leader = answer.get("leader").map(int).unwrap_or(0);
        if leader == 0 {
            return Err(EtcdError::Unavailable(format!(
                "etcd {version} answers but has no leader"
            )));
        }
        Ok(format!("etcd {version}, leader {leader:x}"))
    }
}

/// An int64 of the gateway's JSON: a string, or a number.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn header_revision(answer: &Value) -> i64 {
    answer
        .pointer("/header/revision")
        .map(int)
        .unwrap_or_default()
}

#[derive(Deserialize)]
struct RawKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, alias = "createRevision")]
    create_revision: Value,
    #[serde(default, alias = "modRevision")]
    mod_revision: Value,
}

fn parse_range(answer: &Value) -> Result<Vec<KeyValue>, EtcdError> {
    let Some(kvs) = answer.get("kvs") else {
        return Ok(Vec::new());
    };
    let raw: Vec<RawKv> = serde_json::from_value(kvs.clone())
        .map_err(|e| EtcdError::Server(format!("etcd's range answer is malformed: {e}")))?;
    raw.into_iter()
        .map(|kv| {
            let key = B64
                .decode(&kv.key)
                .ok()
                .and_then(|k| String::from_utf8(k).ok())
                .ok_or_else(|| EtcdError::Server("etcd returned a malformed key".into()))?;
            let value = B64
                .decode(&kv.value)
                .map_err(|e| EtcdError::Server(format!("etcd returned a malformed value: {e}")))?;
            Ok(KeyValue {
                key,
                value,
                create_revision: int(&kv.create_revision),
                mod_revision: int(&kv.mod_revision),
            })
        })
        .collect()
}

fn compare_json(c: &Compare) -> Value {
    match c {
        Compare::Version(key, version) => json!({
            "key": B64.encode(key), "result": "EQUAL", "target": "VERSION",
            "version": version.to_string(),
        }),
        Compare::ModRevision(key, revision) => json!({
            "key": B64.encode(key), "result": "EQUAL", "target": "MOD",
            "mod_revision": revision.to_string(),
        }),
    }
}

fn range_json(range: &RangeRequest) -> Value {
    let mut body = json!({ "key": B64.encode(&range.key) });
    if range.read == Read::Serializable {
        body["serializable"] = json!(true);
    }
    if let Some(end) = &range.range_end {
        body["range_end"] = json!(B64.encode(end));
    }
    if range.keys_only {
        body["keys_only"] = json!(true);
    }
    body
}

fn op_json(op: &Op) -> Value {
    match op {
        Op::Put(key, value) => json!({
            "request_put": { "key": B64.encode(key), "value": B64.encode(value) }
        }),
        Op::Get(key) => json!({ "request_range": { "key": B64.encode(key) } }),
        Op::Delete(key) => json!({ "request_delete_range": { "key": B64.encode(key) } }),
    }
}

/// An error answer: `{"error"|"message": ..., "code": <gRPC code>}`.
fn classify(status: http::StatusCode, value: &Value) -> Failed {
    let message = value
        .get("message")
        .or_else(|| value.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("no message")
        .to_string();
    let code = value.get("code").map(int).unwrap_or(0);
    let text = format!("etcd answered {status}: {message}");
    let (error, try_next) = match code {
        // Unauthenticated, PermissionDenied.
        16 | 7 => (EtcdError::Unauthorized(text), false),
        // DeadlineExceeded.
        4 => (EtcdError::Timeout(text), false),
        // Unavailable: no leader, a leader change, or a proposal that timed
        // out (lost with a leader that died). Every write is a transaction
        // compared on a revision, so sending one again after an ambiguous
        // failure cannot apply it twice: it fails its compare instead.
        14 => (EtcdError::Unavailable(text), true),
        // ResourceExhausted "too many requests": the member's apply lags
        // its commits, and it refused the request before proposing it; the
        // next member (or the next round) can take it. (Other
        // ResourceExhausted answers, a full database say, do not pass.)
        8 if message.contains("too many requests") => (EtcdError::Unavailable(text), true),
        _ if message.contains("timed out") => (EtcdError::Timeout(text), false),
        _ => (EtcdError::Server(text), false),
    };
    Failed { error, try_next }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_etcds_error_answers() {
        let answer = |code: u64, message: &str| json!({"code": code, "message": message});
        let c = |status: u16, v: Value| {
            let f = classify(http::StatusCode::from_u16(status).unwrap(), &v);
            (f.try_next, f.error)
        };
        let (next, e) = c(503, answer(14, "etcdserver: leader changed"));
        assert!(next && matches!(e, EtcdError::Unavailable(_)), "{e}");
        let (next, e) = c(429, answer(8, "etcdserver: too many requests"));
        assert!(next && matches!(e, EtcdError::Unavailable(_)), "{e}");
        let (next, e) = c(429, answer(8, "etcdserver: mvcc: database space exceeded"));
        assert!(!next && matches!(e, EtcdError::Server(_)), "{e}");
        let (next, e) = c(401, answer(16, "etcdserver: invalid auth token"));
        assert!(!next && matches!(e, EtcdError::Unauthorized(_)), "{e}");
        let (next, e) = c(504, answer(4, "context deadline exceeded"));
        assert!(!next && matches!(e, EtcdError::Timeout(_)), "{e}");
        // Not etcd's shape (a proxy's page): final.
        let (next, e) = c(429, json!({"text": "slow down"}));
        assert!(!next && matches!(e, EtcdError::Server(_)), "{e}");
    }
}
