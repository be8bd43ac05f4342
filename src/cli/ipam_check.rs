//! `calico ipam check [--show-problem-ips] [--show-all-ips] [-o FILE]`:
//! calicoctl's IPAM consistency check, in its wording and order, on every
//! datastore — allocations no workload or node uses (leaked), addresses in
//! use without an allocation or outside every active pool, handles that
//! hold nothing, allocations naming a missing handle — and, beyond
//! calicoctl, blocks whose affinity names no node, soft-deleted objects
//! left stored, and the release queue's dead letters on this node. With
//! `-o FILE`, calicoctl's JSON report, which `calico ipam release
//! --from-report` (and calicoctl's) act on.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::ipam_inventory::{Allocation, Inventory};
use super::progress::Progress;
use crate::plugin::journal::Owed;

/// How many nodes the "top nodes" section lists.
const TOP_NODES: usize = 20;

/// The check's options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Show {
    pub problem_ips: bool,
    pub all_ips: bool,
}

/// One allocation in the JSON report (calicoctl's field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportAllocation {
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub handle: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub creation_timestamp: String,
    pub in_use: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub borrowed: bool,
    pub owners: Option<Vec<String>>,
}

/// A handle that holds nothing, as the report records it (Go field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakedHandle {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "UID")]
    pub uid: Option<String>,
    #[serde(rename = "Revision")]
    pub revision: String,
}

/// The JSON report (calicoctl's `-o FILE`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub version: String,
    #[serde(rename = "clusterGUID")]
    pub cluster_guid: String,
    pub datastore_locked: bool,
    pub cluster_information_revision: String,
    pub cluster_type: String,
    pub allocations: BTreeMap<String, Vec<ReportAllocation>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaked_handles: Vec<LeakedHandle>,
}

/// The check's outcome: the text, the report, how many problems.
#[derive(Debug)]
pub struct Checked {
    pub text: String,
    pub report: Report,
    pub problems: usize,
}

/// Runs the check over `inv` (and this node's dead letters), its steps
/// phases of `progress`.
pub fn check(
    inv: &Inventory,
    dead: &[Owed],
    show: Show,
    version: &str,
    progress: &Progress,
) -> Checked {
    let show_problems = show.problem_ips || show.all_ips;
    let mut out = String::from("Checking IPAM for inconsistencies...\n\n");
    let mut problems = 0;

    // The blocks and what they record.
    let allocations = inv.allocations();
    let mut live: Vec<_> = inv.live_blocks().collect();
    live.sort_by_key(|(_, c)| *c);
    out += "Loading all IPAM blocks...\n";
    out += &format!("Found {} IPAM blocks.\n", live.len());
    progress.phase("checking blocks", Some(live.len() as u64));
    for (i, (b, cidr)) in live.iter().enumerate() {
        progress.tick(i as u64 + 1);
        out += &format!(
            " IPAM block {cidr} affinity={}:\n",
            b.spec.affinity.as_deref().unwrap_or("<none>")
        );
        if show.all_ips {
            for a in allocations.iter().filter(|a| cidr.contains(&a.ip)) {
                out += &format!("  {} allocated; attrs {}\n", a.ip, a.attrs_text());
            }
        }
    }
    out += &format!("IPAM blocks record {} allocations.\n\n", allocations.len());

    let pools = inv.active_pools();
    out += "Loading all IPAM pools...\n";
    for p in &pools {
        out += &format!("  {p}\n");
    }
    out += &format!("Found {} active IP pools.\n\n", pools.len());

    out += "Loading all nodes.\n";
    out += &format!("Found {} node tunnel IPs.\n\n", inv.node_ips);
    out += "Loading all service load balancer IPs.\n";
    out += if inv.load_balancer_controller {
        "The LoadBalancer kubecontroller is configured, but this tool does not read services: addresses it assigned show as leaked\n\n"
    } else {
        "No configuration for LoadBalancer kubecontroller found, skipping service check\n\n"
    };
    out += "Loading all workload endpoints.\n";
    out += &format!("Found {} workload IPs.\n", inv.workload_ips);
    out += &format!(
        "Workloads and nodes are using {} IPs.\n\n",
        inv.workload_ips + inv.node_ips
    );

    out += "Loading all handles\n";
    out += &format!("Looking for top (up to {TOP_NODES}) nodes by allocations...\n");
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &allocations {
        if let Some(node) = a.attrs.get("node") {
            *per_node.entry(node).or_default() += 1;
        }
    }
    let mut ranked: Vec<(&str, usize)> = per_node.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (node, n) in ranked.iter().take(TOP_NODES) {
        out += &format!("  {node} has {n} allocations\n");
    }
    if let Some((_, most)) = ranked.first() {
        out += &format!(
            "Node with most allocations has {most}; median is {}\n",
            ranked[ranked.len() / 2].1
        );
    }
    out += "\n";

    // Allocations nothing uses.
    out += "Scanning for IPs that are allocated but not actually in use...\n";
    let allocated: HashSet<IpAddr> = allocations.iter().map(|a| a.ip).collect();
    progress.phase("checking allocations", Some(allocations.len() as u64));
    let leaked: Vec<&Allocation> = allocations
        .iter()
        .enumerate()
        .inspect(|(i, _)| progress.tick(*i as u64 + 1))
        .filter(|(_, a)| !inv.owners.contains_key(&a.ip))
        .map(|(_, a)| a)
        .collect();
    if show_problems {
        for a in &leaked {
            out += &format!("  {} leaked; attrs {}\n", a.ip, a.attrs_text());
        }
    }
    out += &format!(
        "Found {} IPs that are allocated in IPAM but not actually in use.\n",
        leaked.len()
    );
    problems += leaked.len();

    // Addresses in use without an allocation.
    out += "Scanning for IPs that are in use by a workload or node but not allocated in IPAM...\n";
    let (mut outside, mut unallocated) = (0, 0);
    progress.phase("checking addresses in use", Some(inv.owners.len() as u64));
    for (i, (ip, owners)) in inv.owners.iter().enumerate() {
        progress.tick(i as u64 + 1);
        if owners.len() > 1 && show_problems {
            out += &format!("  {ip} has multiple owners.\n");
        }
        if allocated.contains(ip) {
            continue;
        }
        let owner = &owners[0];
        if !pools.iter().any(|p| p.contains(ip)) {
            outside += 1;
            if show_problems {
                out += &format!("  {ip} in use by {owner} is not in any active IP pool.\n");
            }
        } else {
            unallocated += 1;
            if show_problems {
                out += &format!(
                    "  {ip} in use by {owner} and in active IPAM pool but has no IPAM allocation.\n"
                );
            }
        }
    }
    out += &format!("Found {outside} in-use IPs that are not in active IP pools.\n");
    out += &format!(
        "Found {unallocated} in-use IPs that are in active IP pools but have no corresponding IPAM allocation.\n\n"
    );
    problems += outside + unallocated;

    // Handles that hold nothing, and handles the blocks name that are gone.
    out += "Scanning for IPAM handles with no matching IPs...\n";
    let named: BTreeSet<&str> = allocations
        .iter()
        .filter_map(|a| a.handle.as_deref())
        .collect();
    // (Soft-deleted handles too, as calicoctl: one that holds nothing is
    // leaked whatever its mark.)
    let mut leaked_handles = Vec::new();
    let mut matched = 0;
    let mut sorted_handles: Vec<_> = inv.handles.iter().collect();
    sorted_handles.sort_by(|a, b| a.spec.handle_id.cmp(&b.spec.handle_id));
    progress.phase("checking handles", Some(sorted_handles.len() as u64));
    for (i, h) in sorted_handles.into_iter().enumerate() {
        progress.tick(i as u64 + 1);
        if named.contains(h.spec.handle_id.as_str()) {
            matched += 1;
            continue;
        }
        if show.all_ips {
            out += &format!("  {} doesn't have any active IPs.\n", h.spec.handle_id);
        }
        leaked_handles.push(LeakedHandle {
            id: h.spec.handle_id.clone(),
            uid: Some(h.metadata.uid.clone()).filter(|u| !u.is_empty()),
            revision: h.metadata.resource_version.clone(),
        });
    }
    out += &format!(
        "Found {} handles with no matching IPs (and {matched} handles with matches).\n",
        leaked_handles.len()
    );
    problems += leaked_handles.len();
    out += "Scanning for IPs with missing handle...\n";
    let existing: HashSet<&str> = inv
        .handles
        .iter()
        .map(|h| h.spec.handle_id.as_str())
        .collect();
    let missing: Vec<&&str> = named.iter().filter(|h| !existing.contains(**h)).collect();
    if show_problems {
        for h in &missing {
            out += &format!("  {h} is in use in a block but doesn't exist.\n");
        }
    }
    out += &format!(
        "Found {} handles mentioned in blocks with no matching handle resource.\n",
        missing.len()
    );

    // Beyond calicoctl: affinities naming no node, soft-deleted leftovers,
    // dead letters.
    out += "Scanning for IPAM blocks whose affinity names no node...\n";
    match &inv.nodes {
        None => out += "The embedded datastore keeps no nodes, skipping the affinity check.\n",
        Some(nodes) => {
            let orphans: Vec<_> = live
                .iter()
                .filter_map(|(b, cidr)| {
                    let node = b.spec.affinity.as_deref()?.strip_prefix("host:")?;
                    (!nodes.contains(node)).then_some((cidr, node))
                })
                .collect();
            if show_problems {
                for (cidr, node) in &orphans {
                    out +=
                        &format!("  IPAM block {cidr} is affine to {node}, which is not a node.\n");
                }
            }
            out += &format!(
                "Found {} IPAM blocks affine to a node that does not exist.\n",
                orphans.len()
            );
            problems += orphans.len();
        }
    }
    // (A soft-deleted handle holding nothing is a leaked handle above.)
    out += "Scanning for soft-deleted IPAM blocks...\n";
    let mut deleted: Vec<&str> = inv
        .blocks
        .iter()
        .filter(|b| b.spec.deleted)
        .map(|b| b.spec.cidr.as_str())
        .collect();
    deleted.sort();
    if show_problems {
        for d in &deleted {
            out += &format!("  IPAM block {d} is marked deleted but still stored.\n");
        }
    }
    out += &format!(
        "Found {} soft-deleted IPAM blocks still stored.\n",
        deleted.len()
    );
    problems += deleted.len();
    out += "Scanning this node's release queue for dead letters...\n";
    if show_problems {
        for o in dead {
            out += &format!(
                "  {} {} {}: {}\n",
                o.network,
                o.container_id,
                o.ifname,
                o.dead_reason.as_deref().unwrap_or(&o.error)
            );
        }
    }
    out += &format!(
        "Found {} releases this node gave up on (calico ipam queue list --dead).\n",
        dead.len()
    );
    problems += dead.len();
    out += &format!("Check complete; found {problems} problems.\n");

    let cluster = inv.cluster.as_ref();
    let mut report_allocations: BTreeMap<String, Vec<ReportAllocation>> = BTreeMap::new();
    progress.phase("building the report", Some(allocations.len() as u64));
    for (i, a) in allocations.iter().enumerate() {
        progress.tick(i as u64 + 1);
        let attr = |k: &str| a.attrs.get(k).cloned().unwrap_or_default();
        let owners = inv.owners.get(&a.ip).cloned();
        report_allocations
            .entry(a.ip.to_string())
            .or_default()
            .push(ReportAllocation {
                ip: a.ip.to_string(),
                handle: a.handle.clone().unwrap_or_default(),
                sequence_number: a.sequence_number,
                pod: attr("pod"),
                namespace: attr("namespace"),
                node: attr("node"),
                kind: attr("type"),
                creation_timestamp: attr("timestamp"),
                in_use: owners.is_some(),
                borrowed: a.borrowed(),
                owners,
            });
    }
    let report = Report {
        version: version.to_string(),
        cluster_guid: cluster
            .map(|c| c.spec.cluster_guid.clone())
            .unwrap_or_default(),
        datastore_locked: cluster.and_then(|c| c.spec.datastore_ready) == Some(false),
        cluster_information_revision: cluster
            .map(|c| c.metadata.resource_version.clone())
            .unwrap_or_default(),
        cluster_type: cluster
            .map(|c| c.spec.cluster_type.clone())
            .unwrap_or_default(),
        allocations: report_allocations,
        leaked_handles,
    };
    Checked {
        text: out,
        report,
        problems,
    }
}
