//! The Linux dataplane: the pod's veth pair, addresses, routes and sysctls,
//! laid out exactly as Calico lays them out.

pub mod linux;
pub mod netlink;
pub mod netns;
pub mod routes;
pub mod sysctl;

#[cfg(test)]
mod fake;

use std::fmt;
use std::str::FromStr;

pub use linux::{CleanupOutcome, Networking, NetworkingOutcome, PodNetwork};
pub use netns::NetNs;

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
        match e {
            DataplaneError::Timeout(m) => crate::cni::Error::TryAgainLater(m),
            other => crate::cni::Error::Dataplane(other.to_string()),
        }
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
