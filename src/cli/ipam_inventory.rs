//! What `calico ipam show|check|release` read: the IPAM objects (blocks,
//! handles, pools, ClusterInformation) and who uses which address — the
//! workloads (WorkloadEndpoint records on the embedded store and etcd;
//! pods on the Kubernetes datastore, as Calico's client sees them: their
//! Calico address annotations, else their status addresses) and the nodes'
//! tunnel and WireGuard addresses. Read once, then judged by the commands.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use super::progress::Progress;

use crate::datastore::ipam_model::{IpPool, IpamBlock, IpamHandle, Node};
use crate::datastore::kubernetes::endpoint::{ANNOTATION_POD_IP, ANNOTATION_POD_IPS};
use crate::datastore::model::ClusterInformation;
use crate::datastore::names::WepIdentifiers;
use crate::datastore::open::Opened;
use crate::datastore::{Backend, DatastoreError, EtcdLayout, Kind, ListFilter, Resource};
use crate::k8s::K8sClient;

/// The Calico Node fields (v3 spec paths) that hold an address of the node.
const NODE_ADDRESS_FIELDS: [&[&str]; 5] = [
    &["bgp", "ipv4IPIPTunnelAddr"],
    &["ipv4VXLANTunnelAddr"],
    &["ipv6VXLANTunnelAddr"],
    &["wireguard", "interfaceIPv4Address"],
    &["wireguard", "interfaceIPv6Address"],
];

/// The Kubernetes Node annotations Calico keeps those addresses in.
const NODE_ADDRESS_ANNOTATIONS: [&str; 5] = [
    "projectcalico.org/IPv4IPIPTunnelAddr",
    "projectcalico.org/IPv4VXLANTunnelAddr",
    "projectcalico.org/IPv6VXLANTunnelAddr",
    "projectcalico.org/IPv4WireguardInterfaceAddr",
    "projectcalico.org/IPv6WireguardInterfaceAddr",
];

/// calico-kube-controllers' configuration (read for whether its
/// LoadBalancer controller, whose addresses this tool does not count, is on).
static KUBE_CONTROLLERS: Kind = Kind {
    name: "KubeControllersConfiguration",
    plural: "kubecontrollersconfigurations",
    namespaced: false,
    etcd: EtcdLayout::V3,
};

/// Everything the IPAM commands judge.
#[derive(Debug, Default)]
pub struct Inventory {
    /// Every block, soft-deleted ones included.
    pub blocks: Vec<IpamBlock>,
    /// Every handle, soft-deleted ones included.
    pub handles: Vec<IpamHandle>,
    pub pools: Vec<IpPool>,
    pub cluster: Option<ClusterInformation>,
    /// Each address in use, with its users (`Workload(ns/name)`,
    /// `Node(name)`).
    pub owners: BTreeMap<IpAddr, Vec<String>>,
    pub workload_ips: usize,
    pub node_ips: usize,
    /// The nodes' names, where the datastore keeps nodes (not the embedded
    /// store).
    pub nodes: Option<BTreeSet<String>>,
    /// calico-kube-controllers assigns LoadBalancer addresses (their
    /// services are not read: those addresses may show as leaked).
    pub load_balancer_controller: bool,
}

fn ds(what: &'static str) -> impl Fn(DatastoreError) -> String {
    move |e| format!("{what}: {e}")
}

/// The address of `text` (`10.0.0.1`, `10.0.0.1/32`).
fn address(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    text.parse::<IpNet>()
        .map(|n| n.addr())
        .or_else(|_| text.parse::<IpAddr>())
        .ok()
}

impl Inventory {
    /// Reads the IPAM objects and the users of addresses; `k8s` is the API
    /// client of a Kubernetes datastore (pods and nodes are read with it).
    /// Each read is a phase of `progress`.
    pub async fn read(
        opened: &Opened,
        k8s: Option<&K8sClient>,
        progress: &Progress,
    ) -> Result<Inventory, String> {
        let store = opened.store.as_ref();
        progress.phase("reading the IPAM blocks, handles and pools", None);
        let (blocks, handles, pools, cluster) = futures::future::try_join4(
            store.list::<IpamBlock>("", &ListFilter::All),
            store.list::<IpamHandle>("", &ListFilter::All),
            store.list::<IpPool>("", &ListFilter::All),
            store.get::<ClusterInformation>("", ClusterInformation::NAME),
        )
        .await
        .map_err(ds("reading the IPAM objects"))?;
        let controllers = store
            .get_object(&KUBE_CONTROLLERS, "", "default")
            .await
            .map_err(ds("reading KubeControllersConfiguration"))?;
        let mut pools = pools;
        pools.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut inventory = Inventory {
            blocks,
            handles,
            pools,
            cluster,
            load_balancer_controller: controllers
                .is_some_and(|c| !c["spec"]["controllers"]["loadBalancer"].is_null()),
            ..Inventory::default()
        };
        let read = format!(
            "read {} IPAM blocks, {} handles and {} pools",
            inventory.blocks.len(),
            inventory.handles.len(),
            inventory.pools.len()
        );
        match (store.backend(), k8s) {
            (Backend::Kubernetes, Some(client)) => {
                progress.phase(&format!("{read}; reading the pods and nodes"), None);
                inventory.read_kubernetes(client).await?;
            }
            (Backend::Kubernetes, None) => {
                return Err("the Kubernetes datastore needs its API client".into());
            }
            (backend, _) => {
                progress.phase(&format!("{read}; reading the workload endpoints"), None);
                let weps = opened
                    .endpoints
                    .all()
                    .await
                    .map_err(ds("listing WorkloadEndpoints"))?
                    .unwrap_or_default();
                for wep in weps {
                    let owner =
                        format!("Workload({}/{})", wep.metadata.namespace, wep.metadata.name);
                    for ip in wep.spec.ip_networks.iter().filter_map(|n| address(n)) {
                        inventory.add_workload(ip, &owner);
                    }
                }
                if backend == Backend::Etcd {
                    progress.phase("reading the nodes", None);
                    let nodes = store
                        .list_objects(Node::KIND, "", &ListFilter::All)
                        .await
                        .map_err(ds("listing Nodes"))?;
                    inventory.nodes = Some(BTreeSet::new());
                    for node in nodes {
                        let name = node["metadata"]["name"].as_str().unwrap_or_default();
                        for path in NODE_ADDRESS_FIELDS {
                            let mut at = &node["spec"];
                            for key in path {
                                at = &at[*key];
                            }
                            if let Some(ip) = at.as_str().and_then(address) {
                                inventory.add_node(ip, name);
                            }
                        }
                        inventory.note_node(name);
                    }
                }
            }
        }
        Ok(inventory)
    }

    /// Pods (not host-networked, not finished, scheduled) and nodes.
    async fn read_kubernetes(&mut self, client: &K8sClient) -> Result<(), String> {
        let (pods, nodes) = futures::future::try_join(
            client.list_json("error listing pods", "/api/v1/pods", None, false),
            client.list_json("error listing nodes", "/api/v1/nodes", None, false),
        )
        .await
        .map_err(|e| format!("reading pods and nodes: {e}"))?;
        for pod in &pods {
            let spec = &pod["spec"];
            let node = spec["nodeName"].as_str().unwrap_or_default();
            let phase = pod["status"]["phase"].as_str().unwrap_or_default();
            if spec["hostNetwork"] == Value::Bool(true)
                || node.is_empty()
                || matches!(phase, "Succeeded" | "Failed")
            {
                continue;
            }
            let meta = &pod["metadata"];
            let (namespace, name) = (
                meta["namespace"].as_str().unwrap_or_default(),
                meta["name"].as_str().unwrap_or_default(),
            );
            let ids = WepIdentifiers {
                node: node.to_string(),
                orchestrator: "k8s".into(),
                endpoint: "eth0".into(),
                pod: name.to_string(),
                ..WepIdentifiers::default()
            };
            let owner = format!(
                "Workload({namespace}/{})",
                ids.name().unwrap_or_else(|_| name.to_string())
            );
            let annotations = &meta["annotations"];
            let mut ips: Vec<IpAddr> = annotations[ANNOTATION_POD_IPS]
                .as_str()
                .or(annotations[ANNOTATION_POD_IP].as_str())
                .unwrap_or_default()
                .split(',')
                .filter_map(address)
                .collect();
            if ips.is_empty() {
                ips = pod["status"]["podIPs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["ip"].as_str().and_then(address))
                    .collect();
            }
            for ip in ips {
                self.add_workload(ip, &owner);
            }
        }
        self.nodes = Some(BTreeSet::new());
        for node in &nodes {
            let name = node["metadata"]["name"].as_str().unwrap_or_default();
            for key in NODE_ADDRESS_ANNOTATIONS {
                if let Some(ip) = node["metadata"]["annotations"][key]
                    .as_str()
                    .and_then(address)
                {
                    self.add_node(ip, name);
                }
            }
            self.note_node(name);
        }
        Ok(())
    }

    fn add_workload(&mut self, ip: IpAddr, owner: &str) {
        self.workload_ips += 1;
        self.owners.entry(ip).or_default().push(owner.to_string());
    }

    fn add_node(&mut self, ip: IpAddr, name: &str) {
        self.node_ips += 1;
        self.owners
            .entry(ip)
            .or_default()
            .push(format!("Node({name})"));
    }

    fn note_node(&mut self, name: &str) {
        if let Some(nodes) = &mut self.nodes {
            nodes.insert(name.to_string());
        }
    }

    /// The blocks not soft-deleted, with their CIDRs.
    pub fn live_blocks(&self) -> impl Iterator<Item = (&IpamBlock, IpNet)> {
        self.blocks
            .iter()
            .filter(|b| !b.spec.deleted)
            .filter_map(|b| b.spec.cidr.parse::<IpNet>().ok().map(|c| (b, c)))
    }

    /// The enabled pools' CIDRs.
    pub fn active_pools(&self) -> Vec<IpNet> {
        self.pools
            .iter()
            .filter(|p| !p.spec.disabled)
            .filter_map(|p| p.spec.network())
            .collect()
    }
}

/// One allocation of a block, as the commands see it.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub ip: IpAddr,
    pub handle: Option<String>,
    /// The block's sequence number at the allocation, when recorded.
    pub sequence_number: Option<u64>,
    /// The allocation's attributes (`node`, `namespace`, `pod`, `timestamp`…).
    pub attrs: BTreeMap<String, String>,
    /// The block's affinity (`host:<node>`), if any.
    pub affinity: Option<String>,
}

impl Allocation {
    /// Allocated to a node other than the one the block is affine to.
    pub fn borrowed(&self) -> bool {
        match (self.attrs.get("node"), &self.affinity) {
            (Some(node), Some(affinity)) => affinity.strip_prefix("host:") != Some(node.as_str()),
            _ => false,
        }
    }

    /// `Main:<handle> Extra:k=v,k=v` as Calico prints an allocation's
    /// attributes.
    pub fn attrs_text(&self) -> String {
        let extra: Vec<String> = self.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "Main:{} Extra:{}",
            self.handle.as_deref().unwrap_or("<none>"),
            extra.join(",")
        )
    }
}

impl Inventory {
    /// Every allocation of the live blocks, in block then ordinal order
    /// (addresses cooling down after their release are none).
    pub fn allocations(&self) -> Vec<Allocation> {
        let mut out = Vec::new();
        let mut blocks: Vec<(&IpamBlock, IpNet)> = self.live_blocks().collect();
        blocks.sort_by_key(|(_, c)| *c);
        for (b, cidr) in blocks {
            for (ordinal, attr) in b.spec.allocations.iter().enumerate() {
                let Some(attr) = attr else { continue };
                let attribute = b.spec.attributes.get(*attr);
                if attribute.is_some_and(|a| a.released_at.is_some()) {
                    // Released, cooling down: no one's allocation.
                    continue;
                }
                out.push(Allocation {
                    ip: crate::ipam::calico::block::address_at(&cidr, ordinal),
                    handle: attribute.and_then(|a| a.handle_id.clone()),
                    sequence_number: b
                        .spec
                        .sequence_number_for_allocation
                        .get(&ordinal.to_string())
                        .copied(),
                    attrs: attribute.map(|a| a.secondary.clone()).unwrap_or_default(),
                    affinity: b.spec.affinity.clone(),
                });
            }
        }
        out
    }
}
