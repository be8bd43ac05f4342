//! The pod's network, behind one seam: [`Dataplane`] — DoNetworking in its
//! two halves (the pair before the addresses are known, then addresses,
//! routes and sysctls), CHECK's verification, CleanUpNamespace and the
//! removal of a host link. Two implementations: the local layout
//! ([`veth`]: a veth or netkit pair exactly as Calico lays it out, with
//! rtnetlink) and an external dataplane spoken to over Calico's CNI
//! backend protocol ([`grpc`], `dataplane_options.type: "grpc"`). One
//! dataplane is opened per call ([`open`]): the local one's host netlink
//! socket serves every host-side operation of that call. [`fake`] (tests,
//! or the `test-fakes` feature) records every operation without root.

pub mod grpc;
pub mod namespace_cleanup;
pub mod netlink;
pub mod netns;
pub mod routes;
pub mod sysctl;
pub mod veth;

#[cfg(any(test, feature = "test-fakes"))]
pub mod fake;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use serde_json::{Map, Value};
use tokio::time::Instant;

pub use netns::NetNs;
pub use veth::{PodNetwork, Prepared};

/// The pod's network as one call sees it.
#[async_trait::async_trait]
pub trait Dataplane: Send + Sync {
    /// DoNetworking, the part that needs no addresses (it runs while the
    /// IPAM allocates): the pod's interface pair, each end in its
    /// namespace. Undone by the dataplane itself when it fails.
    async fn prepare(&self, netns: &Path, net: &Networking) -> Result<PreparedPod, DataplaneError>;

    /// The pair made ahead, before the ADD knows it will need one (while
    /// it reads the datastore), and only where neither end's name is
    /// taken: nothing existing is ever removed. `None` when a name is
    /// taken, on any failure (the ADD's own [`Dataplane::prepare`] then
    /// meets and reports it) and on a dataplane that makes nothing ahead.
    /// A pair so made that the ADD does not use is deleted by name.
    async fn prepare_ahead(&self, _netns: &Path, _net: &Networking) -> Option<PreparedPod> {
        None
    }

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

    /// An external dataplane, which makes the pod's interfaces itself (it
    /// is told the workload's routes as given, not the local layout's).
    fn is_remote(&self) -> bool {
        false
    }
}

/// A pod as `prepare` left it for `finish`.
pub enum PreparedPod {
    /// The local layout: the pod's namespace, opened, and the pair's links.
    Local { pod: PodNetwork, links: Prepared },
    /// A remote dataplane, which does all its work in `finish`: the netns.
    Remote { netns: PathBuf },
}

impl PreparedPod {
    /// What `finish` will answer when it succeeds, where that is known
    /// before it runs (the local layout: the pair is made); `None` for a
    /// remote dataplane, which names the interface itself.
    pub fn outcome_ahead(&self) -> Option<NetworkingOutcome> {
        match self {
            PreparedPod::Local { links, .. } => Some(NetworkingOutcome {
                container_mac: links.container_mac,
                host_interface: None,
            }),
            PreparedPod::Remote { .. } => None,
        }
    }
}

/// The dataplane of one call, as `dataplane_options` chooses it: the
/// gRPC dataplane for `type: "grpc"`, else the local layout on this
/// kernel. (A `type` of any other value is refused by ADD's config check;
/// a DEL with it tears down locally.)
pub fn open(options: &Map<String, Value>) -> Arc<dyn Dataplane> {
    match options.get("type").and_then(Value::as_str) {
        Some("grpc") => Arc::new(grpc::GrpcDataplane::new(options)),
        _ => Arc::new(veth::VethDataplane::new(Arc::new(veth::KernelNamespaces))),
    }
}

/// What ADD asks of the dataplane.
#[derive(Debug, Clone)]
pub struct Networking {
    pub ifname: String,
    pub host_veth: String,
    /// The pod's addresses, already /32 and /128.
    pub ips: Vec<IpNet>,
    /// Destinations routed via the gateway inside the container.
    pub routes: Vec<IpNet>,
    /// 0: kernel default.
    pub mtu: u32,
    pub queues: u32,
    /// veth or netkit.
    pub device: DeviceKind,
    /// A requested container MAC (hwAddr annotation); kernel-assigned if None.
    pub container_mac: Option<MacAddr>,
    pub allow_ip_forwarding: bool,
    pub skip_host_routes: bool,
    pub deadline: Instant,
    /// The addresses as the IPAM gave them (prefix and gateway): what a
    /// remote dataplane is told.
    pub ipam_addresses: Vec<(IpNet, Option<IpAddr>)>,
    /// The workload, for a remote dataplane.
    pub workload: WorkloadInfo,
}

/// What a remote dataplane is told of the workload: its endpoint's
/// identifiers, labels, annotations and ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub endpoint: String,
    pub node: String,
    pub orchestrator: String,
    pub pod: String,
    pub ports: Vec<WorkloadPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadPort {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    pub host_port: u16,
    pub host_ip: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkingOutcome {
    pub container_mac: MacAddr,
    /// The host interface, when the dataplane named it (a remote one);
    /// else the one asked for.
    pub host_interface: Option<String>,
}

/// What DEL found in the pod netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupOutcome {
    /// No netns path was given, or it no longer exists.
    NetnsGone,
    /// The netns exists but the interface did not.
    LinkGone,
    Deleted,
    /// Deleted as far as anyone can see (the pair is gone from both
    /// namespaces, its routes with it); the kernel is still tearing it
    /// down on a thread of this process, which does not exit before.
    Unlisted,
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
    /// A remote dataplane refused, failed or could not be reached.
    #[error("{0}")]
    Remote(String),
    /// The dataplane's configuration is unusable.
    #[error("{0}")]
    Config(String),
}

impl DataplaneError {
    /// The kernel does not support what was asked (EOPNOTSUPP, which is
    /// ENOTSUP on Linux): a netkit pair on a kernel without netkit.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, DataplaneError::Netlink { errno, .. }
            if *errno == libc::EOPNOTSUPP || *errno == libc::ENOTSUP)
    }
}

/// The kind of interface pair a pod gets (`device_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceKind {
    #[default]
    Veth,
    /// netkit (Linux 6.7+), falling back to veth where the kernel has none.
    Netkit,
}

impl From<DataplaneError> for crate::cni::Error {
    fn from(e: DataplaneError) -> Self {
        use crate::cni::error::Kind;
        let kind = match e {
            DataplaneError::Config(msg) => return crate::cni::Error::invalid_config(msg),
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
