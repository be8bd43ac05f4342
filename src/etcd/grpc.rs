//! The etcd client's transport on the etcd-client crate (gRPC over tonic):
//! built only with the `etcd-grpc` feature, to measure it against the
//! gateway (BENCHMARKS.md, "etcd client: gRPC gateway vs etcd-client").
//!
//! The same surface and semantics as [`super::gateway::Gateway`]: the
//! endpoints are tried in turn, starting from the last one that answered,
//! and a request moves on only when it certainly did not reach the member
//! (no connection) or the member has no leader, or lost it while waiting
//! for a read index (etcd's retryable "leader changed"), so a transaction
//! is never sent twice. Each endpoint has a client of its own: the crate's
//! balanced channel over all of them fails a request sent to a member that
//! is down (etcdv3/etcd-client#39) and connects to every member at once.
//! TLS with the CA (else the system's roots) and the client certificate
//! (the files checked by `tls.rs`, as the gateway does); every call bounded
//! by the deadline and [`REQUEST_TIMEOUT`]. The crate's `connect` must run
//! on the runtime (it spawns the channel's worker), so a client is made at
//! the first request to its endpoint.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompareOp, ConnectOptions, GetOptions, Identity, KvClient, TlsOptions,
    TxnOpResponse,
};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::endpoints::{Endpoints, Failed, Round};
use super::{Compare, EtcdConfig, EtcdError, KeyValue, Op, OpResponse, Txn, TxnResponse};

/// How long connecting to one member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct Grpc {
    endpoints: Endpoints,
    options: ConnectOptions,
    /// One client per endpoint, made at its first use.
    clients: Arc<Vec<OnceCell<Client>>>,
}

fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path)
        .map_err(|e| EtcdError::Config(format!("reading {what} {}: {e}", path.display())))
}

impl Grpc {
    pub fn new(conf: &EtcdConfig) -> Result<Grpc, EtcdError> {
        let endpoints = Endpoints::new(conf)?;
        let https = conf.endpoints.iter().any(|e| e.starts_with("https://"));
        for e in &conf.endpoints {
            if https && e.starts_with("http://") {
                return Err(EtcdError::Config(
                    "etcd endpoints mix http:// and https:// URLs".into(),
                ));
            }
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_require_leader(true);
        if let Some(c) = &conf.credentials {
            options = options.with_user(c.username.clone(), c.password.clone());
        }
        if https {
            // Parsed as the gateway parses them, for the same Config errors
            // now: tonic would only fail at the first connection.
            super::tls::client_config(conf)?;
            let mut tls = TlsOptions::new();
            tls = match &conf.ca_cert_file {
                Some(ca) => {
                    tls.ca_certificate(Certificate::from_pem(read(ca, "etcd_ca_cert_file")?))
                }
                None => tls.with_native_roots(),
            };
            if let (Some(cert), Some(key)) = (&conf.cert_file, &conf.key_file) {
                let cert = read(cert, "etcd_cert_file")?;
                let key = read(key, "etcd_key_file")?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        }
        Ok(Grpc {
            clients: Arc::new(conf.endpoints.iter().map(|_| OnceCell::new()).collect()),
            endpoints,
            options,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        self.endpoints.urls()
    }

    /// The ID of the cluster that answered: not kept by this transport
    /// (so no node-local copies are used with it).
    pub fn cluster_id(&self) -> Option<&str> {
        None
    }

    /// Runs `call` on the endpoints' clients in turn, bounded by the
    /// deadline.
    async fn call<T, F, Fut>(&self, what: &str, deadline: Instant, call: F) -> Result<T, EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let what = format!(", {what}");
        let call = &call;
        self.endpoints
            .round(&what, deadline, |index| async move {
                let endpoint = &self.endpoints.urls()[index];
                let answer = async {
                    let client = self.clients[index]
                        .get_or_try_init(|| Client::connect([endpoint], Some(self.options.clone())))
                        .await?;
                    call(client.clone()).await
                };
                answer.await.map_err(|e| {
                    let (error, try_next) = classify(e);
                    Failed { error, try_next }
                })
            })
            .await
            .map_err(Round::into_error)
    }

    pub async fn range(
        &self,
        range: &super::RangeRequest,
        deadline: Instant,
    ) -> Result<Vec<KeyValue>, EtcdError> {
        let mut options = GetOptions::new();
        if range.read == super::Read::Serializable {
            options = options.with_serializable();
        }
        if let Some(end) = &range.range_end {
            options = options.with_range(end.clone());
        }
        if range.keys_only {
            options = options.with_keys_only();
        }
        let key = range.key.as_str();
        let mut answer = self
            .call("range", deadline, |c| {
                let options = options.clone();
                async move { kv(&c).get(key, Some(options)).await }
            })
            .await?;
        answer.take_kvs().into_iter().map(key_value).collect()
    }

    /// Several ranges, each on its own (this transport is for measurement).
    pub async fn ranges(
        &self,
        ranges: &[super::RangeRequest],
        deadline: Instant,
    ) -> Result<Vec<Vec<KeyValue>>, EtcdError> {
        futures::future::try_join_all(ranges.iter().map(|r| self.range(r, deadline))).await
    }

    pub async fn txn(&self, txn: &Txn, deadline: Instant) -> Result<TxnResponse, EtcdError> {
        let request = etcd_client::Txn::new()
            .when(txn.compare.iter().map(compare).collect::<Vec<_>>())
            .and_then(txn.success.iter().map(op).collect::<Vec<_>>())
            .or_else(txn.failure.iter().map(op).collect::<Vec<_>>());
        let answer = self
            .call("txn", deadline, |c| {
                let request = request.clone();
                async move { kv(&c).txn(request).await }
            })
            .await?;
        let mut responses = Vec::new();
        for r in answer.op_responses() {
            responses.push(match r {
                TxnOpResponse::Put(_) => OpResponse::Put,
                TxnOpResponse::Get(mut g) => {
                    OpResponse::Get(g.take_kvs().pop().map(key_value).transpose()?)
                }
                TxnOpResponse::Delete(d) => OpResponse::Delete(d.deleted()),
                TxnOpResponse::Txn(_) => {
                    return Err(EtcdError::Server(
                        "etcd answered a nested transaction it was not sent".into(),
                    ));
                }
            });
        }
        Ok(TxnResponse {
            succeeded: answer.succeeded(),
            revision: answer.header().map(|h| h.revision()).unwrap_or_default(),
            responses,
        })
    }

    pub async fn status(&self, deadline: Instant) -> Result<String, EtcdError> {
        let answer = self
            .call("status", deadline, |mut c| async move { c.status().await })
            .await?;
        let version = answer.version();
        let leader = answer.leader();
        if leader == 0 {
            return Err(EtcdError::Unavailable(format!(
                "etcd {version} answers but has no leader"
            )));
        }
        Ok(format!("etcd {version}, leader {leader:x}"))
    }
}

/// The client's KV service without tonic's 4 MiB limit on an answer (the
/// gateway has none, and etcd none on what it sends): listing a large
/// cluster's IPAM blocks passes it.
fn kv(client: &Client) -> KvClient {
    client.kv_client().max_decoding_message_size(usize::MAX)
}

fn key_value(kv: etcd_client::KeyValue) -> Result<KeyValue, EtcdError> {
    let (create_revision, mod_revision) = (kv.create_revision(), kv.mod_revision());
    let (key, value) = kv.into_key_value();
    let key = String::from_utf8(key)
        .map_err(|_| EtcdError::Server("etcd returned a malformed key".into()))?;
    Ok(KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
    })
}

fn compare(c: &Compare) -> etcd_client::Compare {
    match c {
        Compare::Version(key, version) => {
            etcd_client::Compare::version(key.as_str(), CompareOp::Equal, *version)
        }
        Compare::ModRevision(key, revision) => {
            etcd_client::Compare::mod_revision(key.as_str(), CompareOp::Equal, *revision)
        }
    }
}

fn op(op: &Op) -> etcd_client::TxnOp {
    match op {
        Op::Put(key, value) => etcd_client::TxnOp::put(key.as_str(), value.as_slice(), None),
        Op::Get(key) => etcd_client::TxnOp::get(key.as_str(), None),
        Op::Delete(key) => etcd_client::TxnOp::delete(key.as_str(), None),
    }
}

/// The crate's error as one of ours, with its causes, and whether the next
/// endpoint may be tried: the request certainly did not reach the member
/// (no connection: tonic's `ConnectError` in the causes, or the service
/// never became ready), or the member has no leader or lost it.
fn classify(e: etcd_client::Error) -> (EtcdError, bool) {
    use etcd_client::Error as E;
    use tonic::Code;
    let mut text = e.to_string();
    let mut not_sent = false;
    if let E::GRpcStatus(status) = &e {
        let mut source = std::error::Error::source(status);
        while let Some(s) = source {
            not_sent |= s.is::<tonic::ConnectError>();
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        // tonic-build's clients, when the channel's poll_ready failed.
        not_sent |= status.message().starts_with("Service was not ready");
    }
    match &e {
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidMetadataValue(_) => {
            (EtcdError::Config(text), false)
        }
        E::TransportError(_) | E::IoError(_) | E::EndpointError(_) => {
            (EtcdError::Unavailable(text), true)
        }
        E::GRpcStatus(_) if not_sent => (EtcdError::Unavailable(text), true),
        E::GRpcStatus(status) => match status.code() {
            Code::Unauthenticated | Code::PermissionDenied => {
                (EtcdError::Unauthorized(text), false)
            }
            Code::DeadlineExceeded => (EtcdError::Timeout(text), false),
            // A member without a leader has not applied anything; nor has
            // one whose wait for a read index ended as the leader changed
            // (etcd's ErrLeaderChanged, "a retryable error").
            Code::Unavailable => {
                let m = status.message();
                let retry = m.contains("no leader") || m.contains("leader changed");
                (EtcdError::Unavailable(text), retry)
            }
            _ if status.message().contains("timed out") => (EtcdError::Timeout(text), false),
            _ => (EtcdError::Server(text), false),
        },
        _ => (EtcdError::Server(text), false),
    }
}
