//! Calico's IPAM resources, field for field as Calico stores them
//! (calico-behaviour.md §10.4): IPPool, IPAMBlock, BlockAffinity,
//! IPAMHandle, IPAMConfig, IPReservation, and the Node whose labels pool
//! nodeSelectors match. The spec structs keep fields they do not know
//! (`extra`), so a read-modify-write never drops what a newer Calico wrote.
//!
//! On the Kubernetes datastore these are the `crd.projectcalico.org/v1`
//! objects; the embedded store keeps the same JSON. Names follow Calico:
//! a block is its CIDR with `.`, `:` and `/` as `-` (`10-0-0-0-26`), an
//! affinity `<node>-<block name>` (hashed when too long), a handle its
//! lower-cased ID.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::impl_resource;
use super::model::{API_VERSION, ObjectMeta};

/// Label: base32 of SHA3-256 of the node name (KDD host lookups use it).
pub const LABEL_HOSTNAME_HASH: &str = "projectcalico.org/hostname-hash";
/// Label: `host` (or `virtual`).
pub const LABEL_AFFINITY_TYPE: &str = "projectcalico.org/affinity-type";
/// Label: `4` or `6`.
pub const LABEL_IP_VERSION: &str = "projectcalico.org/ip-version";

/// Allocation attributes Calico records per address.
pub const ATTR_NODE: &str = "node";
pub const ATTR_POD: &str = "pod";
pub const ATTR_NAMESPACE: &str = "namespace";
pub const ATTR_TIMESTAMP: &str = "timestamp";

/// The IPPool block sizes applied when none is given.
pub const DEFAULT_BLOCK_SIZE_V4: u8 = 26;
pub const DEFAULT_BLOCK_SIZE_V6: u8 = 122;

/// Unknown fields of a spec, kept as read.
type Extra = BTreeMap<String, Value>;

fn is_false(b: &bool) -> bool {
    !*b
}

macro_rules! resource {
    ($ty:ident, $spec:ident, $kind:literal, $plural:literal, $etcd:ident) => {
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default, rename_all = "camelCase")]
        pub struct $ty {
            pub kind: String,
            pub api_version: String,
            pub metadata: ObjectMeta,
            pub spec: $spec,
        }

        impl Default for $ty {
            fn default() -> Self {
                $ty {
                    kind: $kind.to_string(),
                    api_version: API_VERSION.to_string(),
                    metadata: ObjectMeta::default(),
                    spec: $spec::default(),
                }
            }
        }

        impl $ty {
            /// A cluster-scoped object with this name and spec.
            pub fn new(name: &str, spec: $spec) -> $ty {
                $ty {
                    metadata: ObjectMeta::named("", name),
                    spec,
                    ..$ty::default()
                }
            }
        }

        impl_resource!($ty, $kind, $plural, namespaced: false, $etcd);
    };
}

resource!(IpPool, IpPoolSpec, "IPPool", "ippools", V3);
resource!(
    IpamBlock,
    IpamBlockSpec,
    "IPAMBlock",
    "ipamblocks",
    IpamBlock
);
resource!(
    BlockAffinity,
    BlockAffinitySpec,
    "BlockAffinity",
    "blockaffinities",
    BlockAffinity
);
resource!(
    IpamHandle,
    IpamHandleSpec,
    "IPAMHandle",
    "ipamhandles",
    IpamHandle
);
resource!(
    IpamConfig,
    IpamConfigSpec,
    "IPAMConfig",
    "ipamconfigs",
    IpamConfig
);
resource!(
    IpReservation,
    IpReservationSpec,
    "IPReservation",
    "ipreservations",
    V3
);
resource!(Node, NodeSpec, "Node", "nodes", V3);

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpPoolSpec {
    pub cidr: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub vxlan_mode: String,
    #[serde(rename = "ipipMode", skip_serializing_if = "String::is_empty")]
    pub ipip_mode: String,
    #[serde(skip_serializing_if = "is_false")]
    pub nat_outgoing: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub disabled: bool,
    #[serde(rename = "disableBGPExport", skip_serializing_if = "is_false")]
    pub disable_bgp_export: bool,
    /// 0 when unset: the family's default.
    #[serde(skip_serializing_if = "is_zero")]
    pub block_size: u8,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node_selector: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace_selector: String,
    /// `Workload`, `Tunnel`, `LoadBalancer`; empty = Workload and Tunnel.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_uses: Vec<String>,
    /// `Automatic` (also when empty) or `Manual`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub assignment_mode: String,
    #[serde(flatten)]
    pub extra: Extra,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

impl IpPoolSpec {
    /// The pool's CIDR, parsed.
    pub fn network(&self) -> Option<IpNet> {
        self.cidr.parse::<IpNet>().ok().map(|n| n.trunc())
    }

    /// `blockSize`, or the family's default.
    pub fn effective_block_size(&self) -> u8 {
        match (self.block_size, self.network()) {
            (0, Some(IpNet::V6(_))) => DEFAULT_BLOCK_SIZE_V6,
            (0, _) => DEFAULT_BLOCK_SIZE_V4,
            (n, _) => n,
        }
    }

    /// `allowedUses`, with Calico's default.
    pub fn uses(&self) -> Vec<String> {
        if self.allowed_uses.is_empty() {
            vec!["Workload".into(), "Tunnel".into()]
        } else {
            self.allowed_uses.clone()
        }
    }

    /// Pools in Manual mode are used only when asked for by name or CIDR.
    pub fn is_automatic(&self) -> bool {
        self.assignment_mode.is_empty() || self.assignment_mode == "Automatic"
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpamBlockSpec {
    pub cidr: String,
    /// `host:<node>` when affine to a node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_claim_time: Option<String>,
    /// Deprecated in Calico (IPAMConfig holds it); kept, always written.
    pub strict_affinity: bool,
    /// Per ordinal: the index into `attributes`, or null when free.
    pub allocations: Vec<Option<usize>>,
    /// Free ordinals, a FIFO: taken from the head, released to the tail.
    pub unallocated: Vec<usize>,
    pub attributes: Vec<AllocationAttribute>,
    pub sequence_number: u64,
    pub sequence_number_for_allocation: BTreeMap<String, u64>,
    pub deleted: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Who an address belongs to: the handle and the owner's attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationAttribute {
    #[serde(rename = "handle_id", skip_serializing_if = "Option::is_none")]
    pub handle_id: Option<String>,
    /// The owner's attributes (Calico's ActiveOwnerAttrs).
    #[serde(rename = "secondary", skip_serializing_if = "BTreeMap::is_empty")]
    pub secondary: BTreeMap<String, String>,
    /// A second owner's (a KubeVirt migration target's pod: Calico's
    /// AlternateOwnerAttrs, stored as Calico v3.32.1's binary stores it,
    /// `alternateOwnerAttrs`; `alternate`, which earlier builds of ours
    /// wrote, is read too).
    #[serde(
        rename = "alternateOwnerAttrs",
        alias = "alternate",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub alternate: BTreeMap<String, String>,
    /// When the addresses pointing here were released: they cool down
    /// (IPAMConfig `ipCooldownSeconds`) before they are free again.
    /// RFC 3339.
    #[serde(rename = "releasedAt", skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BlockAffinitySpec {
    /// `pending`, `confirmed` or `pendingDeletion`.
    pub state: String,
    pub node: String,
    /// `host`.
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub affinity_type: String,
    pub cidr: String,
    /// The v1 CRD keeps this as the string `"true"`/`"false"`.
    pub deleted: String,
    #[serde(flatten)]
    pub extra: Extra,
}

pub const AFFINITY_PENDING: &str = "pending";
pub const AFFINITY_CONFIRMED: &str = "confirmed";
pub const AFFINITY_PENDING_DELETION: &str = "pendingDeletion";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpamHandleSpec {
    #[serde(rename = "handleID")]
    pub handle_id: String,
    /// Addresses held, per block CIDR.
    pub block: BTreeMap<String, usize>,
    pub deleted: bool,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpamConfigSpec {
    pub strict_affinity: bool,
    pub auto_allocate_blocks: bool,
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub max_blocks_per_host: i32,
    /// How long a released address stays unused (0: free at once).
    #[serde(skip_serializing_if = "is_zero_i32")]
    pub ip_cooldown_seconds: i32,
    /// KubeVirt VMs keep their addresses: `Enabled` (also when empty) or
    /// `Disabled`.
    #[serde(
        rename = "kubeVirtVMAddressPersistence",
        skip_serializing_if = "String::is_empty"
    )]
    pub kubevirt_vm_address_persistence: String,
    #[serde(flatten)]
    pub extra: Extra,
}

fn is_zero_i32(n: &i32) -> bool {
    *n == 0
}

impl IpamConfig {
    pub const NAME: &'static str = "default";
}

/// Calico's settings when no IPAMConfig exists.
impl IpamConfigSpec {
    pub fn defaults() -> IpamConfigSpec {
        IpamConfigSpec {
            strict_affinity: false,
            auto_allocate_blocks: true,
            max_blocks_per_host: 0,
            ip_cooldown_seconds: 0,
            kubevirt_vm_address_persistence: String::new(),
            extra: Extra::new(),
        }
    }

    /// The cooldown of released addresses (negative: none).
    pub fn ip_cooldown(&self) -> std::time::Duration {
        std::time::Duration::from_secs(u64::try_from(self.ip_cooldown_seconds).unwrap_or(0))
    }

    /// Whether KubeVirt VMs keep their addresses (unset: yes).
    pub fn kubevirt_persistence(&self) -> bool {
        self.kubevirt_vm_address_persistence != "Disabled"
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct IpReservationSpec {
    #[serde(rename = "reservedCIDRs")]
    pub reserved_cidrs: Vec<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A node as pool nodeSelectors see it: its labels (metadata) only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeSpec {
    #[serde(flatten)]
    pub extra: Extra,
}

/// A CIDR as a resource name: `.`, `:` and `/` become `-`.
pub fn cidr_name(cidr: &IpNet) -> String {
    cidr.to_string().replace(['.', ':', '/'], "-")
}

/// The CIDR a block's name stands for: [`cidr_name`] read back (`10-0-0-0-26`, `fd80-24e2-f998-72d6---122`).
pub fn cidr_of_block_name(name: &str) -> Option<IpNet> {
    let (addr, prefix) = name.rsplit_once('-')?;
    let v4 = addr.replacen('-', ".", 3);
    let text = if v4.parse::<std::net::Ipv4Addr>().is_ok() {
        v4
    } else {
        addr.replace('-', ":")
    };
    format!("{text}/{prefix}").parse().ok()
}

/// The handle's resource name: its ID lower-cased.
pub fn handle_name(handle_id: &str) -> String {
    handle_id.to_lowercase()
}

/// The IPAMHandle's name for `handle_id` on `backend`: etcd keys keep the
/// ID as it is; Calico's Kubernetes datastore lower-cases it (a resource
/// name), and the embedded store does the same.
pub fn handle_name_on(backend: super::Backend, handle_id: &str) -> String {
    match backend {
        super::Backend::Etcd => handle_id.to_string(),
        _ => handle_name(handle_id),
    }
}

/// The BlockAffinity's name for `node` and `cidr` on `backend` (etcd: its
/// key under the node).
pub fn affinity_name_on(backend: super::Backend, node: &str, cidr: &IpNet) -> String {
    match backend {
        super::Backend::Etcd => etcd_affinity_name(node, cidr),
        _ => affinity_name(node, cidr),
    }
}

/// The BlockAffinity's name on etcd: its key below `/calico/ipam/v2/`,
/// `host/<node>/ipv4/block/10.0.0.0-26`.
pub fn etcd_affinity_name(node: &str, cidr: &IpNet) -> String {
    format!(
        "host/{node}/ipv{}/block/{}",
        ip_family(cidr),
        cidr_key_segment(cidr)
    )
}

/// A CIDR as the last segment of an etcd block or affinity key: `/` as `-`.
pub fn cidr_key_segment(cidr: &IpNet) -> String {
    cidr.to_string().replacen('/', "-", 1)
}

/// 4 or 6.
pub fn ip_family(cidr: &IpNet) -> u8 {
    if cidr.addr().is_ipv4() { 4 } else { 6 }
}

/// The BlockAffinity name of `node`'s affinity to `cidr`: `<node>-<cidr
/// name>`, or, when that reaches 253 characters, the node name cut short,
/// the CIDR name and the first 11 hex digits of SHA-256 of
/// `<node>+<cidr name>`.
pub fn affinity_name(node: &str, cidr: &IpNet) -> String {
    use sha2::Digest;
    let block = cidr_name(cidr);
    let name = format!("{node}-{block}");
    if name.len() < 253 {
        return name;
    }
    let digest = sha2::Sha256::digest(format!("{node}+{block}").as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let suffix = format!("-{block}-{}", &hash[..11]);
    let mut keep = 252 - suffix.len();
    while !node.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &node[..keep])
}

/// The hostname-hash label value: SHA3-256 of the node name in standard
/// base32 without padding.
pub fn hostname_hash(node: &str) -> String {
    use sha3::Digest;
    base32_nopad(&sha3::Sha3_256::digest(node.as_bytes()))
}

fn base32_nopad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// The labels Calico stamps on a host BlockAffinity.
pub fn affinity_labels(node: &str, cidr: &IpNet) -> BTreeMap<String, String> {
    let version = if cidr.addr().is_ipv4() { "4" } else { "6" };
    BTreeMap::from([
        (LABEL_HOSTNAME_HASH.to_string(), hostname_hash(node)),
        (LABEL_AFFINITY_TYPE.to_string(), "host".to_string()),
        (LABEL_IP_VERSION.to_string(), version.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The migration target's attributes under Calico v3.32.1's name
    /// (what its binary stores, tests/kubevirt.rs); ours of before read.
    #[test]
    fn the_alternate_owner_is_calicos_alternate_owner_attrs() {
        let attr = AllocationAttribute {
            handle_id: Some("net1.vmi.ns.vm".into()),
            alternate: BTreeMap::from([("pod".into(), "p".into())]),
            ..AllocationAttribute::default()
        };
        let v = serde_json::to_value(&attr).unwrap();
        assert_eq!(
            v,
            json!({"handle_id": "net1.vmi.ns.vm", "alternateOwnerAttrs": {"pod": "p"}})
        );
        let old: AllocationAttribute = serde_json::from_value(
            json!({"handle_id": "net1.vmi.ns.vm", "alternate": {"pod": "p"}}),
        )
        .unwrap();
        assert_eq!(old, attr);
    }

    #[test]
    fn hostname_hash_matches_calico() {
        // block_affinity_hash_internal_test.go
        assert_eq!(
            hostname_hash("node-a"),
            "PY3TQE2E3XMTETLM2MJO3UITKPFB27YUJ4T4E5XGPEJON3SM4QAA"
        );
        assert_eq!(base32_nopad(b"foobar"), "MZXW6YTBOI");
        assert_eq!(base32_nopad(b"f"), "MY");
    }

    #[test]
    fn names() {
        let v4: IpNet = "10.0.0.0/26".parse().unwrap();
        let v6: IpNet = "fd80:24e2:f998:72d6::/122".parse().unwrap();
        assert_eq!(cidr_name(&v4), "10-0-0-0-26");
        assert_eq!(cidr_name(&v6), "fd80-24e2-f998-72d6---122");
        assert_eq!(affinity_name("node-a", &v4), "node-a-10-0-0-0-26");
        assert_eq!(handle_name("k8s-pod-network.ABC"), "k8s-pod-network.abc");
        let long = "n".repeat(250);
        let name = affinity_name(&long, &v4);
        assert_eq!(name.len(), 252);
        assert!(name.starts_with("nnnn"));
        assert!(name.contains("-10-0-0-0-26-"));
    }

    #[test]
    fn block_json_shape() {
        let spec = IpamBlockSpec {
            cidr: "10.0.0.0/30".into(),
            affinity: Some("host:node-a".into()),
            allocations: vec![Some(0), None, None, None],
            unallocated: vec![1, 2, 3],
            attributes: vec![AllocationAttribute {
                handle_id: Some("net1.abc".into()),
                secondary: BTreeMap::from([("node".into(), "node-a".into())]),
                ..AllocationAttribute::default()
            }],
            sequence_number: 1,
            sequence_number_for_allocation: BTreeMap::from([("0".into(), 0)]),
            ..Default::default()
        };
        let value = serde_json::to_value(IpamBlock::new("10-0-0-0-30", spec.clone())).unwrap();
        assert_eq!(
            value["spec"],
            json!({
                "cidr": "10.0.0.0/30", "affinity": "host:node-a", "strictAffinity": false,
                "allocations": [0, null, null, null], "unallocated": [1, 2, 3],
                "attributes": [{"handle_id": "net1.abc", "secondary": {"node": "node-a"}}],
                "sequenceNumber": 1, "sequenceNumberForAllocation": {"0": 0}, "deleted": false
            })
        );
        // Fields from a newer Calico survive a round trip.
        let mut newer = value.clone();
        newer["spec"]["attributes"][0]["futureAttr"] = json!("2026-01-01T00:00:00Z");
        newer["spec"]["future"] = json!(1);
        let back: IpamBlock = serde_json::from_value(newer.clone()).unwrap();
        assert_eq!(serde_json::to_value(back).unwrap(), newer);
    }

    #[test]
    fn pool_defaults() {
        let v6 = IpPoolSpec {
            cidr: "fd00::/64".into(),
            ..Default::default()
        };
        assert_eq!(v6.effective_block_size(), 122);
        assert_eq!(v6.uses(), ["Workload", "Tunnel"]);
        assert!(v6.is_automatic());
        let pool: IpPool = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"cidr": "10.0.0.0/16", "blockSize": 24, "ipipMode": "Never",
                     "allowedUses": ["Tunnel"], "assignmentMode": "Manual"}}))
        .unwrap();
        assert_eq!(pool.spec.effective_block_size(), 24);
        assert!(!pool.spec.is_automatic());
        assert_eq!(pool.spec.ipip_mode, "Never");
    }
}
