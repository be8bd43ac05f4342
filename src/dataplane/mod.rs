//! The pod's network, behind one seam: [`Dataplane`] — DoNetworking in its
//! two halves (the pair before the addresses are known, then addresses,
//! routes and sysctls), CHECK's verification, CleanUpNamespace and the
//! removal of a host link — which the veth layout ([`veth`]) implements
//! today, exactly as Calico lays it out. One dataplane is opened per call
//! ([`open`]): its host netlink socket serves every host-side operation of
//! that call. [`fake`] (tests, or the `test-fakes` feature) records every
//! operation without root.

pub mod netlink;
pub mod netns;
pub mod routes;
pub mod sysctl;
pub mod veth;

#[cfg(any(test, feature = "test-fakes"))]
pub mod fake;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use tokio::time::Instant;

pub use netns::NetNs;
pub use veth::{CleanupOutcome, Networking, NetworkingOutcome, PodNetwork, Prepared};

/// The pod's network as one call sees it.
#[async_trait::async_trait]
pub trait Dataplane: Send + Sync {
    /// DoNetworking, the part that needs no addresses (it runs while the
    /// IPAM allocates): the pod's interface pair, each end in its
    /// namespace. Undone by the dataplane itself when it fails.
    async fn prepare(&self, netns: &Path, net: &Networking) -> Result<PreparedPod, DataplaneError>;

    /// DoNetworking, the rest, once the addresses are known: sysctls,
    /// links up, container routes and addresses, host routes. On failure
    /// the pair is removed.
    async fn finish(
        &self,
        pod: &PreparedPod,
        net: &Networking,
    ) -> Result<NetworkingOutcome, DataplaneError>;

    /// CHECK: everything `finish` made is there (`expected_mac`: the
    /// container interface's MAC when known).
    async fn check(
        &self,
        netns: &Path,
        expected: &Networking,
        expected_mac: Option<MacAddr>,
    ) -> Result<(), DataplaneError>;

    /// CleanUpNamespace: the pod's interface (its host peer and host routes
    /// go with it). A netns or interface already gone is success.
    async fn clean_up(
        &self,
        netns: &str,
        ifname: &str,
        deadline: Instant,
    ) -> Result<CleanupOutcome, DataplaneError>;

    /// Removes a host link by name (a sandbox whose netns is gone, a
    /// rollback, GC); `false` when there was none.
    async fn delete_host_link(&self, name: &str) -> Result<bool, DataplaneError>;
}

/// A pod whose interface pair `prepare` made: its namespace, opened, and
/// the pair's links.
pub struct PreparedPod {
    pub pod: PodNetwork,
    pub links: Prepared,
}

/// The dataplane of one call: the veth layout on this kernel.
pub fn open() -> Arc<dyn Dataplane> {
    Arc::new(veth::VethDataplane::new(Arc::new(veth::KernelNamespaces)))
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum DataplaneError {
    #[error("{0}")]
    Netns(String),
    #[error("{op}: {msg}")]
    Netlink { op: String, errno: i32, msg: String },
    /// EEXIST from the kernel.
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    Sysctl(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Check(String),
}

impl From<DataplaneError> for crate::cni::Error {
    fn from(e: DataplaneError) -> Self {
        use crate::cni::error::Kind;
        let kind = match e {
            DataplaneError::Timeout(_) => Kind::TimedOut,
            _ => Kind::Dataplane,
        };
        crate::cni::Error::caused(kind, "", e)
    }
}

/// An Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The host-side MAC of every Calico veth.
    pub const CALICO_HOST: MacAddr = MacAddr([0xee; 6]);

    pub fn from_slice(bytes: &[u8]) -> Option<MacAddr> {
        <[u8; 6]>::try_from(bytes).ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(format!("invalid MAC address {s:?}"));
        }
        let mut out = [0u8; 6];
        for (slot, part) in out.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(format!("invalid MAC address {s:?}"));
            }
            *slot =
                u8::from_str_radix(part, 16).map_err(|_| format!("invalid MAC address {s:?}"))?;
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip() {
        let m: MacAddr = "CA:FE:ca:fe:ca:fe".parse().unwrap();
        assert_eq!(m.to_string(), "ca:fe:ca:fe:ca:fe");
        assert_eq!(MacAddr::CALICO_HOST.to_string(), "ee:ee:ee:ee:ee:ee");
        assert!("invalid MAC address".parse::<MacAddr>().is_err());
        assert!("ca:fe:ca:fe:ca".parse::<MacAddr>().is_err());
    }
}
