//! What the operator's commands ask of calico-ipam (`calico ipam release`,
//! `calico-ipam -upgrade`): an address freed, or assigned on a node's
//! behalf, with the allocator's rules — the command line holds no
//! allocator of its own.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::IpamError;
pub use super::allocator::AddressRelease;
use super::allocator::Allocator;
use crate::datastore::Store;

/// Frees `ip`, whoever holds it; with `expected` (handle, sequence
/// number) only while its allocation is still that one.
pub async fn release_address(
    store: &dyn Store,
    ip: IpAddr,
    expected: Option<(&str, u64)>,
) -> Result<AddressRelease, IpamError> {
    Allocator::new(store, "")
        .release_address(ip, expected)
        .await
}

/// Addresses assigned on one node's behalf: the node's IPIP tunnel address
/// and the host-local allocations `calico-ipam -upgrade` migrates.
pub struct NodeAddresses<'a> {
    allocator: Allocator<'a>,
}

impl<'a> NodeAddresses<'a> {
    pub fn new(store: &'a dyn Store, node: &'a str) -> NodeAddresses<'a> {
        NodeAddresses {
            allocator: Allocator::new(store, node),
        }
    }

    /// Assigns `ip` to `handle` with `attrs`; [`IpamError::InUse`] when it
    /// is held.
    pub async fn assign(
        &self,
        ip: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<IpNet, IpamError> {
        self.allocator.assign_ip(ip, handle, attrs).await
    }

    /// Makes `handle`'s count of the addresses of `ip`'s block right (a
    /// repeated assignment); false when no block holds `ip`.
    pub async fn reconcile(&self, ip: IpAddr, handle: &str) -> Result<bool, IpamError> {
        self.allocator.reconcile_address(ip, handle).await
    }
}
