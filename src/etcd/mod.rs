//! The etcd v3 client of one invocation: key ranges and transactions on
//! Calico's etcd cluster, every endpoint of `etcd_endpoints` tried in turn,
//! TLS with a CA and a client certificate, every request bounded by
//! [`REQUEST_TIMEOUT`] and the invocation's deadline. A leaf: it knows
//! nothing of Calico's keys (the datastore's etcd backend does).
//!
//! The transport is etcd's own gRPC gateway (JSON over HTTP/2, or HTTP/1.1
//! where a member offers no h2, on the client port), on the hyper and rustls the Kubernetes client already
//! links: BENCHMARKS.md has the measurements against the etcd-client crate
//! (gRPC over tonic) that made the choice.

mod batch;
pub use batch::Hold;
mod endpoints;
#[cfg(not(feature = "etcd-grpc"))]
mod gateway;
#[cfg(feature = "etcd-grpc")]
mod grpc;
pub mod srv;
mod tls;

/// The transport: the gateway, or the etcd-client crate with the
/// measurement-only `etcd-grpc` feature (BENCHMARKS.md).
#[cfg(not(feature = "etcd-grpc"))]
type Transport = gateway::Gateway;
#[cfg(feature = "etcd-grpc")]
type Transport = grpc::Grpc;

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

/// How long one request may take at most (the deadline may cut it shorter).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the cluster is and how to authenticate to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `https://host:port` or `http://host:port`, in the order to try.
    pub endpoints: Vec<String>,
    pub ca_cert_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// etcd's own users (`ETCD_USERNAME`, `ETCD_PASSWORD`): the client
    /// authenticates once and sends the token with every request.
    pub credentials: Option<Credentials>,
    /// The DNS domain whose SRV records name the members
    /// (`etcd_discovery_srv`), when `endpoints` are to be found there.
    pub discovery_srv: Option<String>,
}

impl EtcdConfig {
    /// The config with its members found, when DNS SRV records name them.
    pub async fn resolved(mut self, deadline: Instant) -> Result<EtcdConfig, EtcdError> {
        if let Some(domain) = self.discovery_srv.take() {
            self.endpoints = srv::discover(&domain, deadline).await?;
        }
        Ok(self)
    }
}

/// A user name and password for etcd's authentication; the password never
/// shows in a `Debug` rendering (nor, so, in a log line).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// A configuration that cannot work (no endpoint, unreadable key, ...).
    #[error("{0}")]
    Config(String),
    /// No endpoint could be reached, or the cluster has no leader.
    #[error("{0}")]
    Unavailable(String),
    /// The deadline passed, or the cluster did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// The cluster rejected the credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// Any other answer of the cluster.
    #[error("{0}")]
    Server(String),
}

/// A key and its value as stored, with its revisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// A condition of a transaction (always "equal").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key's version (0: the key does not exist).
    Version(String, i64),
    /// The key's mod_revision.
    ModRevision(String, i64),
}

/// An operation of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(String, Vec<u8>),
    Get(String),
    Delete(String),
}

/// A transaction: `success` runs when every compare holds, else `failure`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

/// The answer to one operation of the branch that ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResponse {
    Put,
    Get(Option<KeyValue>),
    /// How many keys were deleted.
    Delete(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    /// The cluster's revision after the transaction.
    pub revision: i64,
    pub responses: Vec<OpResponse>,
}

/// One range of keys to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: String,
    /// The end of the range (exclusive); `None`: the key alone.
    pub range_end: Option<Vec<u8>>,
    pub keys_only: bool,
    pub read: Read,
}

impl RangeRequest {
    fn key(key: &str, read: Read) -> RangeRequest {
        RangeRequest {
            key: key.to_string(),
            range_end: None,
            keys_only: false,
            read,
        }
    }

    /// Every key under `prefix`.
    fn prefix(prefix: &str, keys_only: bool, read: Read) -> RangeRequest {
        RangeRequest {
            key: prefix.to_string(),
            range_end: Some(prefix_end(prefix.as_bytes())),
            keys_only,
            read,
        }
    }
}

/// A client of one cluster bound to one invocation's deadline.
#[derive(Clone)]
pub struct EtcdClient {
    transport: Transport,
    deadline: Instant,
    /// Reads made at once, sent in one request ([`batch`]).
    reads: std::sync::Arc<batch::Batch>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.transport.endpoints())
            .finish()
    }
}

impl EtcdClient {
    /// A client of the cluster `conf` names; reads the certificate files.
    pub fn new(conf: &EtcdConfig, deadline: Instant) -> Result<EtcdClient, EtcdError> {
        if conf.endpoints.is_empty() {
            return Err(EtcdError::Config("no etcd endpoints configured".into()));
        }
        Ok(EtcdClient {
            transport: Transport::new(conf)?,
            deadline,
            reads: Default::default(),
        })
    }

    /// The cluster's endpoints, as configured.
    pub fn endpoints(&self) -> &[String] {
        self.transport.endpoints()
    }

    /// The cluster's ID, once a member has answered this client.
    pub fn cluster_id(&self) -> Option<&str> {
        self.transport.cluster_id()
    }

    /// The deadline every request of this client is bounded by.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The same client bound to another deadline (cleanup budgets).
    pub fn until(&self, deadline: Instant) -> EtcdClient {
        EtcdClient {
            transport: self.transport.clone(),
            deadline,
            reads: Default::default(),
        }
    }

    /// The value of `key`, `None` when absent.
    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        self.get_as(key, Read::Linearizable).await
    }

    /// [`EtcdClient::get`] as the member that answers has it (a
    /// serializable read; see [`EtcdClient::list_local`]).
    pub async fn get_local(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        self.get_as(key, Read::Serializable).await
    }

    async fn get_as(&self, key: &str, read: Read) -> Result<Option<KeyValue>, EtcdError> {
        let mut kvs = self.range(RangeRequest::key(key, read)).await?;
        Ok(kvs.pop())
    }

    /// Holds this client's reads back until the hold is dropped
    /// ([`batch::Hold`]): the reads its holder makes meanwhile go with
    /// those made before.
    pub fn hold_reads(&self) -> batch::Hold {
        self.reads.hold()
    }

    /// Reads `range`, in one request with the reads made at the same time.
    async fn range(&self, range: RangeRequest) -> Result<Vec<KeyValue>, EtcdError> {
        self.reads.read(&self.transport, range, self.deadline).await
    }

    /// Every key under `prefix` (with values unless `keys_only`), in key
    /// order, as of now (a linearizable read: the member asks the leader
    /// how far the cluster has got first).
    pub async fn list(&self, prefix: &str, keys_only: bool) -> Result<Vec<KeyValue>, EtcdError> {
        self.range(RangeRequest::prefix(prefix, keys_only, Read::Linearizable))
            .await
    }

    /// [`EtcdClient::list`] as the member that answers has it, which may
    /// lag the cluster by the last few writes (a serializable read: no
    /// round to the leader), as the Kubernetes API server's watch cache
    /// serves lists. For data a writer checks again anyway (every write is
    /// compare-and-swap on what it read).
    pub async fn list_local(&self, prefix: &str) -> Result<Vec<KeyValue>, EtcdError> {
        self.range(RangeRequest::prefix(prefix, false, Read::Serializable))
            .await
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: &Txn) -> Result<TxnResponse, EtcdError> {
        self.transport.txn(txn, self.deadline).await
    }

    /// The cluster's status as the first endpoint that answers sees it:
    /// its version and leader.
    pub async fn status(&self) -> Result<String, EtcdError> {
        self.transport.status(self.deadline).await
    }
}

/// How current a range must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// As of now: the member confirms with the leader first.
    Linearizable,
    /// As the member answering has applied it.
    Serializable,
}

/// The smallest key after every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"/calico/"), b"/calico0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
