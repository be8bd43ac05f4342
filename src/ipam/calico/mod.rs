//! Calico's IP address management, on the store API: the allocator
//! ([`allocator`]) over blocks ([`block`]), pools ([`pools`]) and their
//! selectors ([`selector`]), the host lock ([`lock`]) and the copies of
//! the blocks written under it ([`block_cache`]), the allocations asked
//! of its holder ([`intents`]), the
//! `calico-ipam` verbs ([`verbs`]) that the personality and the in-process
//! path of the `calico` plugin share, and what the operator's commands ask
//! of it ([`operator`]).

pub mod allocator;
pub mod block;
pub mod block_cache;
pub mod intents;
pub mod kubevirt;
pub mod lock;
pub mod operator;
pub mod pools;
pub mod selector;
pub mod verbs;

use crate::datastore::DatastoreError;

/// Why an IPAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The request cannot be met as asked (a pool that does not exist, an
    /// address outside every pool, a bad selector).
    #[error("{0}")]
    Invalid(String),
    /// No pool qualifies.
    #[error("{0}")]
    NoPools(String),
    /// A family got fewer addresses than asked for.
    #[error("{0}")]
    Exhausted(String),
    /// The address asked for is held.
    #[error("{0}")]
    InUse(String),
    /// Concurrent writers kept winning.
    #[error("{0}")]
    Contention(String),
    #[error("{what}: {source}")]
    Datastore {
        what: String,
        #[source]
        source: DatastoreError,
    },
}

impl From<IpamError> for crate::cni::Error {
    fn from(e: IpamError) -> Self {
        match e {
            IpamError::Datastore { what, source } => source.context(&what),
            other => crate::cni::Error::caused(crate::cni::error::Kind::Ipam, "", other),
        }
    }
}
