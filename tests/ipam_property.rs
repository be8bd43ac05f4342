//! The calico-ipam acceptance property, with real processes: 16 concurrent
//! `calico` plugin processes (the built binary; calico-ipam in process for
//! 3 workers in 4, exec'd through a wrapper script for the others), each
//! doing ADD/DEL cycles in a real network namespace of its own, on 8
//! simulated nodes (`nodename`, a host lock file each) sharing one small
//! pool: a /28 in /29 blocks, 2 blocks of 8 addresses for 8 nodes and 16
//! pods, so that 6 nodes never own a block and always borrow, blocks fill,
//! their owners then borrow too, and borrowed addresses are released into
//! other nodes' blocks. Every ADD and every DEL must succeed: each worker
//! holds no address when its ADD starts, so one is always free.
//!
//! Invariants checked while it runs — at every ADD's return (the pod's
//! address on eth0 in its netns; no other live pod holding it; on the
//! embedded store, a store snapshot too) and by a checker thread every
//! ~50 ms (a consistent snapshot of the store, the host's routing table):
//! - no two live pods hold one address (each ADD's result against a shared
//!   map of live pods; the host's /32 routes of the pool: one per address,
//!   each on the veth of a pod in flight, each live pod's on its veth);
//! - every block is well formed (each ordinal either free, once, or
//!   allocated), is a /29 of the pool, and its affinity's BlockAffinity
//!   exists; no affinity is in any state but pending or confirmed;
//! - every allocated ordinal's handle exists and counts exactly the
//!   ordinals it holds in that block, and belongs to a pod in flight (no
//!   leak); no endpoint record holds addresses for a pod not in flight;
//! - every live pod's address is allocated in its block to `net1.<cid>`,
//!   its IPAMHandle holds exactly that one address, and its endpoint record
//!   holds exactly that address.
//!
//! "Live" is ADD returned, DEL not started; "in flight" is ADD started,
//! DEL not returned; both are judged over the window each snapshot took
//! (a sequence number stamps every event).
//!
//! At the end: no handle, no allocated ordinal, no affinity but confirmed
//! ones, no endpoint, no veth or /32 route of the pool on the host, no
//! eth0 left in any netns.
//!
//! Both datastores: the embedded SQLite store (plain CNI: every process
//! opens one file), and the test bed's kube-apiserver (Kubernetes pods, one
//! per worker on its node, a new sandbox ID per cycle — the KDD has no
//! plain-CNI endpoints), where the pool's nodeSelector matches only this
//! test's 8 Nodes and everything cluster-scoped it made is removed at the
//! end.
//!
//! `IPAM_PROPERTY_CYCLES` sets the cycles per worker (default 50, the
//! acceptance figure: 800 cycles per datastore); `IPAM_PROPERTY_POOL_PREFIX=27`
//! doubles the pool (4 blocks, 32 addresses: only the 4 nodes without a
//! block borrow, blocks do not fill).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use calico_cni::datastore::Store;
use calico_cni::datastore::ipam_model::{
    AFFINITY_CONFIRMED, AFFINITY_PENDING, BlockAffinity, IpPool, IpPoolSpec, IpamBlock, IpamHandle,
    affinity_name,
};
use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::names::veth_name_for_workload;
use common::testbed::{Namespace, Node, Testbed, testbed};
use common::*;
use ipnet::{IpNet, Ipv4Net};
use serde_json::{Value, json};

const WORKERS: usize = 16;
const NODES: usize = 8;
/// The pool: a /28 in blocks of /29, 2 blocks of 8 addresses for 8 nodes
/// and at most 16 pods at once (`IPAM_PROPERTY_POOL_PREFIX`: 27 or 28).
const POOL_PREFIX: u8 = 28;
const BLOCK_SIZE: u8 = 29;
/// Cycles per worker (`IPAM_PROPERTY_CYCLES`): 800 per datastore take
/// about 30 s on the embedded store and 2 minutes on the test bed (debug
/// build, 2 cores).
const DEFAULT_CYCLES: usize = 50;
/// Every EXEC_EVERY-th worker's calico-ipam is a wrapper script (exec'd),
/// the others' the `calico-ipam` symlink to this binary (in process).
const EXEC_EVERY: usize = 4;
const NETWORK: &str = "net1";
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
const CRD: &str = "/apis/crd.projectcalico.org/v1";

/// The two tests take turns: their figures are each their own, and 32
/// plugin processes at once on two cores measure the machine, not them.
static SERIAL: Mutex<()> = Mutex::new(());

fn cycles() -> usize {
    match std::env::var("IPAM_PROPERTY_CYCLES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("IPAM_PROPERTY_CYCLES={v:?} is not a number")),
        Err(_) => DEFAULT_CYCLES,
    }
}

fn pool_prefix() -> u8 {
    let prefix = match std::env::var("IPAM_PROPERTY_POOL_PREFIX") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("IPAM_PROPERTY_POOL_PREFIX={v:?} is not a number")),
        Err(_) => POOL_PREFIX,
    };
    assert!(
        (27..=28).contains(&prefix),
        "the pool must be a /27 or a /28 (16 addresses for 16 pods)"
    );
    prefix
}

/// A plugin's stdout on one line (its JSON compacted).
fn compact(stdout: &str) -> String {
    serde_json::from_str::<Value>(stdout)
        .map_or_else(|_| stdout.trim().to_string(), |v| v.to_string())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// The pods of the run, stamped by one global sequence of events.

#[derive(Debug, Clone)]
struct PodRec {
    worker: usize,
    node: String,
    veth: String,
    /// Known once its ADD returned.
    ip: Option<Ipv4Addr>,
    /// Sequence numbers (the record is made as ADD is about to start):
    /// ADD returned (live), DEL about to start, DEL returned.
    live: Option<u64>,
    del: Option<u64>,
    end: Option<u64>,
}

impl PodRec {
    /// Live (ADD returned, DEL not started) throughout a window that
    /// opened at `s0` and is being evaluated at its close.
    fn stable_live(&self, s0: u64) -> bool {
        self.live.is_some_and(|l| l <= s0) && self.del.is_none()
    }
    /// Between ADD start and DEL return at some time in a window that
    /// opened at `s0`, evaluated at its close.
    fn in_flight(&self, s0: u64) -> bool {
        self.end.is_none_or(|e| e > s0)
    }
}

#[derive(Default)]
struct Registry {
    seq: u64,
    /// By container ID.
    pods: HashMap<String, PodRec>,
    /// Addresses of live pods.
    live_ips: HashMap<Ipv4Addr, String>,
}

impl Registry {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

// ---------------------------------------------------------------------------
// A consistent snapshot of the store.

#[derive(Default)]
struct Snapshot {
    blocks: Vec<IpamBlock>,
    handles: Vec<IpamHandle>,
    affinities: Vec<BlockAffinity>,
    /// (container ID, address networks) of each endpoint record.
    endpoints: Vec<(String, Vec<String>)>,
}

/// The endpoint records of a snapshot, from pods (KDD) or WEPs (embedded).
fn endpoint_of_wep(wep: &Value) -> (String, Vec<String>) {
    let cid = wep["spec"]["containerID"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let ips = wep["spec"]["ipNetworks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    (cid, ips)
}

fn endpoint_of_pod(pod: &Value) -> (String, Vec<String>) {
    let ann = &pod["metadata"]["annotations"];
    let cid = ann["cni.projectcalico.org/containerID"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let ips = ann["cni.projectcalico.org/podIPs"]
        .as_str()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    (cid, ips)
}

/// Where the run's state lives.
enum Backend {
    Local {
        db: PathBuf,
    },
    Kdd {
        bed: &'static Testbed,
        namespace: String,
        nodes: Vec<String>,
    },
    Etcd {
        access: common::etcd::EtcdAccess,
        nodes: Vec<String>,
    },
}

impl Backend {
    /// One snapshot: a single SELECT (one read transaction of the WAL), or
    /// lists at one resourceVersion (an etcd revision: across kinds).
    fn snapshot(&self, pool: &Ipv4Net, cids: &HashSet<String>) -> Snapshot {
        match self {
            Backend::Local { db } => local_snapshot(db),
            Backend::Kdd {
                bed,
                namespace,
                nodes,
            } => kdd_snapshot(bed, namespace, nodes, pool, cids),
            Backend::Etcd { access, nodes } => etcd_snapshot(access, nodes, pool, cids),
        }
    }
}

/// One range over `/calico/` (a single etcd revision), decoded with
/// Calico's layout; affinities renamed as the other backends name them,
/// for the checker.
fn etcd_snapshot(
    access: &common::etcd::EtcdAccess,
    nodes: &[String],
    pool: &Ipv4Net,
    cids: &HashSet<String>,
) -> Snapshot {
    use calico_cni::datastore::Resource;
    use calico_cni::datastore::etcd::codec::decode;
    use calico_cni::datastore::model::WorkloadEndpoint;
    let mut snap = Snapshot::default();
    for (key, value) in access.list("/calico/") {
        let kv = calico_cni::etcd::KeyValue {
            key: key.clone(),
            value: serde_json::to_vec(&value).unwrap(),
            create_revision: 1,
            mod_revision: 1,
        };
        let kind = if key.starts_with("/calico/ipam/v2/assignment/") {
            IpamBlock::KIND
        } else if key.starts_with("/calico/ipam/v2/handle/") {
            IpamHandle::KIND
        } else if key.starts_with("/calico/ipam/v2/host/") {
            BlockAffinity::KIND
        } else if key.starts_with("/calico/resources/v3/projectcalico.org/workloadendpoints/") {
            WorkloadEndpoint::KIND
        } else {
            continue;
        };
        let Some(object) = decode(kind, &kv).unwrap() else {
            continue;
        };
        match kind.name {
            "IPAMBlock" => {
                if in_pool(pool, object["spec"]["cidr"].as_str().unwrap_or("")) {
                    snap.blocks.push(serde_json::from_value(object).unwrap());
                }
            }
            "IPAMHandle" => {
                let handle: IpamHandle = serde_json::from_value(object).unwrap();
                if handle_in_scope(&handle, pool, cids) {
                    snap.handles.push(handle);
                }
            }
            "BlockAffinity" => {
                let mut a: BlockAffinity = serde_json::from_value(object).unwrap();
                if nodes.contains(&a.spec.node) || in_pool(pool, &a.spec.cidr) {
                    if let Ok(cidr) = a.spec.cidr.parse::<IpNet>() {
                        a.metadata.name = affinity_name(&a.spec.node, &cidr);
                    }
                    snap.affinities.push(a);
                }
            }
            _ => {
                if nodes.iter().any(|n| object["spec"]["node"] == json!(n)) {
                    snap.endpoints.push(endpoint_of_wep(&object));
                }
            }
        }
    }
    snap
}

fn local_snapshot(db: &Path) -> Snapshot {
    let conn = rusqlite::Connection::open(db).expect("open the store");
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT kind, value FROM resources WHERE kind IN \
             ('IPAMBlock', 'IPAMHandle', 'BlockAffinity', 'WorkloadEndpoint')",
        )
        .unwrap();
    let rows: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    let mut snap = Snapshot::default();
    for (kind, value) in rows {
        let v: Value = serde_json::from_str(&value).unwrap();
        match kind.as_str() {
            "IPAMBlock" => snap.blocks.push(serde_json::from_value(v).unwrap()),
            "IPAMHandle" => snap.handles.push(serde_json::from_value(v).unwrap()),
            "BlockAffinity" => snap.affinities.push(serde_json::from_value(v).unwrap()),
            _ => snap.endpoints.push(endpoint_of_wep(&v)),
        }
    }
    snap
}

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

fn in_pool(pool: &Ipv4Net, cidr: &str) -> bool {
    cidr.parse::<IpNet>().is_ok_and(|n| match n {
        IpNet::V4(n) => pool.contains(&n),
        IpNet::V6(_) => false,
    })
}

/// A handle of this run: one of its containers', or holding addresses in
/// its pool.
fn handle_in_scope(handle: &IpamHandle, pool: &Ipv4Net, cids: &HashSet<String>) -> bool {
    let ours = handle
        .spec
        .handle_id
        .strip_prefix(&format!("{NETWORK}."))
        .is_some_and(|cid| cids.contains(cid));
    ours || handle.spec.block.keys().any(|c| in_pool(pool, c))
}

fn kdd_snapshot(
    bed: &Testbed,
    namespace: &str,
    nodes: &[String],
    pool: &Ipv4Net,
    cids: &HashSet<String>,
) -> Snapshot {
    for _ in 0..5 {
        let (code, blocks) = bed.admin("GET", &format!("{CRD}/ipamblocks"), None);
        assert_eq!(code, 200, "list ipamblocks: {blocks}");
        let rv = blocks["metadata"]["resourceVersion"]
            .as_str()
            .expect("list resourceVersion")
            .to_string();
        let at = format!("resourceVersion={rv}&resourceVersionMatch=Exact");
        let mut lists = Vec::new();
        for path in [
            format!("{CRD}/ipamhandles?{at}"),
            format!("{CRD}/blockaffinities?{at}"),
            format!("/api/v1/namespaces/{namespace}/pods?{at}"),
        ] {
            lists.push(bed.admin("GET", &path, None));
        }
        if lists.iter().any(|(code, _)| *code == 410) {
            continue;
        }
        for (code, v) in &lists {
            assert_eq!(*code, 200, "list at {rv}: {v}");
        }
        let mut snap = Snapshot::default();
        for b in items(&blocks) {
            if in_pool(pool, b["spec"]["cidr"].as_str().unwrap_or("")) {
                snap.blocks.push(serde_json::from_value(b).unwrap());
            }
        }
        for h in items(&lists[0].1) {
            let handle: IpamHandle = serde_json::from_value(h).unwrap();
            if handle_in_scope(&handle, pool, cids) {
                snap.handles.push(handle);
            }
        }
        for a in items(&lists[1].1) {
            let affinity: BlockAffinity = serde_json::from_value(a).unwrap();
            if nodes.contains(&affinity.spec.node) || in_pool(pool, &affinity.spec.cidr) {
                snap.affinities.push(affinity);
            }
        }
        for p in items(&lists[2].1) {
            snap.endpoints.push(endpoint_of_pod(&p));
        }
        return snap;
    }
    panic!("no consistent snapshot of the test bed in 5 attempts (410 Gone)")
}

// ---------------------------------------------------------------------------
// The invariants.

/// What one snapshot showed, for the figures.
#[derive(Default)]
struct SnapStats {
    allocated: usize,
    full_blocks: usize,
    pending_affinities: usize,
}

/// `host:<node>` -> `<node>`.
fn affine_node(block: &IpamBlock) -> Option<&str> {
    block.spec.affinity.as_deref()?.strip_prefix("host:")
}

/// The store invariants of one snapshot taken in a window opened at `s0`,
/// evaluated (under the registry's lock) at its close.
fn check_store(
    snap: &Snapshot,
    reg: &Registry,
    s0: u64,
    pool: &Ipv4Net,
    v: &mut Vec<String>,
) -> SnapStats {
    let mut stats = SnapStats::default();
    let handles: HashMap<&str, &IpamHandle> = snap
        .handles
        .iter()
        .filter(|h| !h.spec.deleted)
        .map(|h| (h.spec.handle_id.as_str(), h))
        .collect();
    let affinities: HashMap<&str, &BlockAffinity> = snap
        .affinities
        .iter()
        .filter(|a| a.spec.deleted != "true")
        .map(|a| (a.metadata.name.as_str(), a))
        .collect();
    stats.pending_affinities = affinities
        .values()
        .filter(|a| a.spec.state == AFFINITY_PENDING)
        .count();
    for a in affinities.values() {
        let state = a.spec.state.as_str();
        if state != AFFINITY_PENDING && state != AFFINITY_CONFIRMED {
            // pendingDeletion is a release of an affinity: nothing here
            // releases one, so it would be a stray write.
            v.push(format!(
                "BlockAffinity {} is in state {state:?}",
                a.metadata.name
            ));
        }
    }
    let live_blocks: Vec<&IpamBlock> = snap.blocks.iter().filter(|b| !b.spec.deleted).collect();
    let mut by_cidr: HashMap<Ipv4Net, &IpamBlock> = HashMap::new();
    for b in &live_blocks {
        let name = &b.metadata.name;
        let Ok(cidr) = b.spec.cidr.parse::<Ipv4Net>() else {
            v.push(format!(
                "block {name}: CIDR {:?} does not parse",
                b.spec.cidr
            ));
            continue;
        };
        if !pool.contains(&cidr) || cidr.prefix_len() != BLOCK_SIZE || cidr.trunc() != cidr {
            v.push(format!(
                "block {name}: {cidr} is not a /{BLOCK_SIZE} of {pool}"
            ));
        }
        by_cidr.insert(cidr, b);
        let n = 1usize << (32 - BLOCK_SIZE);
        let s = &b.spec;
        if s.allocations.len() != n {
            v.push(format!(
                "block {cidr}: {} allocation slots, not {n}",
                s.allocations.len()
            ));
            continue;
        }
        // Each ordinal is either free (once) or allocated.
        let mut free = HashSet::new();
        for &o in &s.unallocated {
            if o >= n || !free.insert(o) {
                v.push(format!(
                    "block {cidr}: unallocated {:?} is out of range or repeats {o}",
                    s.unallocated
                ));
            } else if s.allocations[o].is_some() {
                v.push(format!("block {cidr}: ordinal {o} is free and allocated"));
            }
        }
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for (o, a) in s.allocations.iter().enumerate() {
            let Some(a) = *a else {
                if !free.contains(&o) {
                    v.push(format!(
                        "block {cidr}: ordinal {o} is neither free nor allocated"
                    ));
                }
                continue;
            };
            stats.allocated += 1;
            let Some(handle) = s.attributes.get(a).and_then(|a| a.handle_id.as_deref()) else {
                v.push(format!(
                    "block {cidr}: ordinal {o} has attribute {a} without a handle ({} attributes)",
                    s.attributes.len()
                ));
                continue;
            };
            *held.entry(handle).or_default() += 1;
            let owner = handle
                .strip_prefix(&format!("{NETWORK}."))
                .and_then(|cid| reg.pods.get(cid));
            match owner {
                None => v.push(format!(
                    "block {cidr}: ordinal {o} belongs to {handle}, no pod of this run"
                )),
                Some(p) if !p.in_flight(s0) => v.push(format!(
                    "block {cidr}: ordinal {o} still belongs to {handle} after its DEL returned (leak)"
                )),
                Some(_) => {}
            }
        }
        if s.unallocated.is_empty() {
            stats.full_blocks += 1;
        }
        for (handle, count) in held {
            match handles.get(handle) {
                None => v.push(format!(
                    "block {cidr}: {count} ordinal(s) of handle {handle}, which does not exist"
                )),
                Some(h) => {
                    let recorded = h.spec.block.get(&cidr.to_string()).copied().unwrap_or(0);
                    if recorded != count {
                        v.push(format!(
                            "block {cidr}: handle {handle} holds {count} ordinal(s) here, its IPAMHandle counts {recorded} ({:?})",
                            h.spec.block
                        ));
                    }
                }
            }
        }
        if let Some(node) = affine_node(b) {
            let name = affinity_name(node, &IpNet::V4(cidr));
            match affinities.get(name.as_str()) {
                Some(a) if a.spec.node == node && a.spec.cidr == cidr.to_string() => {}
                Some(a) => v.push(format!(
                    "block {cidr} is affine to {node}; BlockAffinity {name} says node {:?} cidr {:?}",
                    a.spec.node, a.spec.cidr
                )),
                None => v.push(format!(
                    "block {cidr} is affine to {node}, which has no BlockAffinity {name}"
                )),
            }
        }
    }
    // Live pods: their address allocated to their handle, counted there,
    // and in their endpoint record.
    let endpoints: HashMap<&str, &Vec<String>> = snap
        .endpoints
        .iter()
        .filter(|(_, ips)| !ips.is_empty())
        .map(|(cid, ips)| (cid.as_str(), ips))
        .collect();
    for (cid, ips) in &endpoints {
        match reg.pods.get(*cid) {
            Some(p) if p.in_flight(s0) => {}
            _ => v.push(format!(
                "endpoint record of container {cid} holds {ips:?} but its pod is not in flight"
            )),
        }
    }
    for (cid, p) in reg.pods.iter().filter(|(_, p)| p.stable_live(s0)) {
        let ip = p.ip.expect("live pods have an address");
        let handle = format!("{NETWORK}.{cid}");
        let cidr = Ipv4Net::new(ip, BLOCK_SIZE).unwrap().trunc();
        let Some(b) = by_cidr.get(&cidr) else {
            v.push(format!(
                "live pod {cid} ({ip}): its block {cidr} does not exist"
            ));
            continue;
        };
        let o = (u32::from(ip) - u32::from(cidr.network())) as usize;
        let holder = b
            .spec
            .allocations
            .get(o)
            .copied()
            .flatten()
            .and_then(|a| b.spec.attributes.get(a))
            .and_then(|a| a.handle_id.clone());
        if holder.as_deref() != Some(handle.as_str()) {
            v.push(format!(
                "live pod {cid} on {}: {ip} is allocated to {holder:?}, not {handle}",
                p.node
            ));
        }
        match handles.get(handle.as_str()) {
            Some(h) if h.spec.block == BTreeMap::from([(cidr.to_string(), 1)]) => {}
            Some(h) => v.push(format!(
                "live pod {cid}: IPAMHandle {handle} holds {:?}, not 1 in {cidr}",
                h.spec.block
            )),
            None => v.push(format!("live pod {cid}: no IPAMHandle {handle}")),
        }
        let want = format!("{ip}/32");
        match endpoints.get(cid.as_str()) {
            Some(ips) if ips.as_slice() == [want.clone()] => {}
            other => v.push(format!(
                "live pod {cid} ({want}): its endpoint record holds {other:?}"
            )),
        }
    }
    stats
}

/// The host's routes of the pool: each /32 once, on the veth of a pod in
/// flight (its address, once known); each live pod's on its veth.
fn check_routes(routes: &Value, reg: &Registry, s0: u64, pool: &Ipv4Net, v: &mut Vec<String>) {
    let mut seen: HashMap<Ipv4Addr, String> = HashMap::new();
    for r in routes.as_array().expect("route list") {
        let dst = r["dst"].as_str().unwrap_or("");
        let Ok(addr) = dst.trim_end_matches("/32").parse::<Ipv4Addr>() else {
            if dst
                .parse::<Ipv4Net>()
                .is_ok_and(|n| n.contains(&pool.network()) || pool.contains(&n))
            {
                v.push(format!("host route {r} overlaps the pool"));
            }
            continue;
        };
        if !pool.contains(&addr) {
            continue;
        }
        let dev = r["dev"].as_str().unwrap_or("").to_string();
        if dev
            .strip_prefix("if")
            .is_some_and(|n| n.parse::<u32>().is_ok())
        {
            // `ip` names a link by index when it is gone by the time the
            // dump is printed: a veth deleted meanwhile.
            continue;
        }
        if let Some(other) = seen.insert(addr, dev.clone()) {
            v.push(format!("host routes to {addr} on {other} and on {dev}"));
        }
        let owner = reg
            .pods
            .values()
            .any(|p| p.veth == dev && p.in_flight(s0) && p.ip.is_none_or(|ip| ip == addr));
        if !owner {
            v.push(format!(
                "host route {addr} dev {dev}: no pod in flight on that veth with that address"
            ));
        }
    }
    for (cid, p) in reg.pods.iter().filter(|(_, p)| p.stable_live(s0)) {
        let ip = p.ip.unwrap();
        if seen.get(&ip) != Some(&p.veth) {
            v.push(format!(
                "live pod {cid}: host route to {ip} is on {:?}, not {}",
                seen.get(&ip),
                p.veth
            ));
        }
    }
}

// ---------------------------------------------------------------------------
// One run.

struct Worker {
    node: String,
    conf: String,
    cni_path: String,
    netns: Netns,
    /// Kubernetes pods: (namespace, pod name).
    pod: Option<(String, String)>,
}

struct Run {
    name: &'static str,
    /// Where the wrapper script logs each exec'd verb.
    exec_log: PathBuf,
    backend: Backend,
    pool: Ipv4Net,
    cycles: usize,
    workers: Vec<Worker>,
    reg: Mutex<Registry>,
    violations: Mutex<Vec<String>>,
    failures: Mutex<Vec<String>>,
    abort: AtomicBool,
    add_times: Mutex<Vec<Duration>>,
    del_times: Mutex<Vec<Duration>>,
    samples: AtomicUsize,
    add_checks: AtomicUsize,
    max_allocated: AtomicUsize,
    full_block_samples: AtomicUsize,
    pending_samples: AtomicUsize,
}

impl Run {
    fn violation(&self, what: String) {
        eprintln!("{}: INVARIANT: {what}", self.name);
        lock(&self.violations).push(what);
    }

    fn failure(&self, what: String) {
        eprintln!("{}: FAILURE: {what}", self.name);
        lock(&self.failures).push(what);
        self.abort.store(true, Ordering::SeqCst);
    }

    fn veth(&self, w: usize, cid: &str) -> String {
        match &self.workers[w].pod {
            Some((ns, pod)) => veth_name_for_workload(ns, pod, None),
            None => host_veth(cid),
        }
    }

    fn exec(&self, w: usize, command: &str, cid: &str) -> Outcome {
        let worker = &self.workers[w];
        let netns = worker.netns.path();
        let mut env = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &worker.cni_path),
        ]);
        if let Some((ns, pod)) = &worker.pod {
            env.insert(
                "CNI_ARGS".into(),
                format!(
                    "K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}"
                ),
            );
        }
        exec(CALICO, &env, &worker.conf)
    }

    /// The cycles of worker `w`.
    fn work(&self, w: usize) {
        let node = self.workers[w].node.clone();
        for c in 0..self.cycles {
            if self.abort.load(Ordering::SeqCst) {
                return;
            }
            let cid = container_id();
            let veth = self.veth(w, &cid);
            {
                let mut reg = lock(&self.reg);
                reg.next();
                reg.pods.insert(
                    cid.clone(),
                    PodRec {
                        worker: w,
                        node: node.clone(),
                        veth: veth.clone(),
                        ip: None,
                        live: None,
                        del: None,
                        end: None,
                    },
                );
            }
            let t = Instant::now();
            let out = self.exec(w, "ADD", &cid);
            lock(&self.add_times).push(t.elapsed());
            let ip = if out.code == 0 {
                self.added(w, &cid, &out)
            } else {
                self.failure(format!(
                    "worker {w} ({node}) cycle {c}: ADD {cid} failed ({}): {} / {}",
                    out.code,
                    compact(&out.stdout),
                    out.stderr.trim()
                ));
                None
            };
            if let Some(ip) = ip {
                let mut reg = lock(&self.reg);
                let seq = reg.next();
                let p = reg.pods.get_mut(&cid).unwrap();
                p.ip = Some(ip);
                p.live = Some(seq);
                if let Some(other) = reg.live_ips.insert(ip, cid.clone()) {
                    let holder = reg.pods[&other].clone();
                    drop(reg);
                    self.violation(format!(
                        "ADD {cid} (worker {w}, {node}) returned {ip}, which live pod {other} (worker {}, {}) holds",
                        holder.worker, holder.node
                    ));
                }
            }
            if let Some(ip) = ip {
                self.check_netns(w, &cid, ip);
                if matches!(self.backend, Backend::Local { .. }) {
                    // A snapshot is one SELECT here (on the test bed it is
                    // four API lists: the checker's samples only).
                    self.check_store_now();
                }
                // Let the checker see some pods live.
                std::thread::sleep(Duration::from_millis(((w * 7 + c * 13) % 10) as u64));
            }
            {
                let mut reg = lock(&self.reg);
                let seq = reg.next();
                reg.pods.get_mut(&cid).unwrap().del = Some(seq);
                if let Some(ip) = ip
                    && reg.live_ips.get(&ip) == Some(&cid)
                {
                    reg.live_ips.remove(&ip);
                }
            }
            let t = Instant::now();
            let out = self.exec(w, "DEL", &cid);
            lock(&self.del_times).push(t.elapsed());
            if out.code != 0 {
                self.failure(format!(
                    "worker {w} ({node}) cycle {c}: DEL {cid} failed ({}): {} / {}",
                    out.code,
                    compact(&out.stdout),
                    out.stderr.trim()
                ));
                // Clean up for the end checks' sake; they report what stays.
                let _ = self.exec(w, "DEL", &cid);
            }
            let mut reg = lock(&self.reg);
            let seq = reg.next();
            reg.pods.get_mut(&cid).unwrap().end = Some(seq);
        }
    }

    /// The address of a successful ADD, checked: one IPv4 address of the
    /// pool, a /32.
    fn added(&self, w: usize, cid: &str, out: &Outcome) -> Option<Ipv4Addr> {
        let result = out.json();
        let ips: Vec<&str> = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["address"].as_str())
            .collect();
        let [address] = ips.as_slice() else {
            self.failure(format!(
                "ADD {cid} (worker {w}): addresses {ips:?}, not one"
            ));
            return None;
        };
        let net: Ipv4Net = match address.parse() {
            Ok(n) => n,
            Err(e) => {
                self.failure(format!("ADD {cid}: address {address:?}: {e}"));
                return None;
            }
        };
        if !self.pool.contains(&net.addr()) || net.prefix_len() != 32 {
            self.failure(format!(
                "ADD {cid} (worker {w}, {}) got {net}, not a /32 of the pool {} (another pool without a nodeSelector?)",
                self.workers[w].node, self.pool
            ));
            return None;
        }
        Some(net.addr())
    }

    /// The kernel side at ADD's return: eth0 in the pod's netns holds
    /// exactly the address.
    fn check_netns(&self, w: usize, cid: &str, ip: Ipv4Addr) {
        let addrs = self.workers[w]
            .netns
            .ip_json(&["-4", "addr", "show", "dev", "eth0"]);
        let held: Vec<String> = addrs
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
            .collect();
        if held != [format!("{ip}/32")] {
            self.violation(format!(
                "ADD {cid} (worker {w}) returned {ip}; eth0 in its netns holds {held:?}"
            ));
        }
    }

    fn record(&self, stats: &SnapStats) {
        self.max_allocated
            .fetch_max(stats.allocated, Ordering::Relaxed);
        if stats.full_blocks > 0 {
            self.full_block_samples.fetch_add(1, Ordering::Relaxed);
        }
        if stats.pending_affinities > 0 {
            self.pending_samples.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The store invariants, now.
    fn check_store_now(&self) {
        let s0 = lock(&self.reg).seq;
        let snap = self.backend.snapshot(&self.pool, &HashSet::new());
        let mut v = Vec::new();
        let stats = check_store(&snap, &lock(&self.reg), s0, &self.pool, &mut v);
        self.add_checks.fetch_add(1, Ordering::Relaxed);
        self.record(&stats);
        for what in v {
            self.violation(what);
        }
    }

    /// One sample: the host's routes and a store snapshot, in one window.
    fn sample(&self) {
        let s0 = lock(&self.reg).seq;
        let cids: HashSet<String> = lock(&self.reg).pods.keys().cloned().collect();
        let routes = host_ip_json(&["-4", "route", "show"]);
        let snap = self.backend.snapshot(&self.pool, &cids);
        let mut v = Vec::new();
        let stats = {
            let reg = lock(&self.reg);
            check_routes(&routes, &reg, s0, &self.pool, &mut v);
            check_store(&snap, &reg, s0, &self.pool, &mut v)
        };
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.record(&stats);
        for what in v {
            self.violation(what);
        }
    }

    /// Runs the workers and the checker; the wall time.
    fn go(&self) -> Duration {
        let done = AtomicBool::new(false);
        let started = Instant::now();
        std::thread::scope(|s| {
            let checker = s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    self.sample();
                    std::thread::sleep(SAMPLE_EVERY);
                }
            });
            let workers: Vec<_> = (0..self.workers.len())
                .map(|w| s.spawn(move || self.work(w)))
                .collect();
            for (w, h) in workers.into_iter().enumerate() {
                if let Err(e) = h.join() {
                    self.failure(format!("worker {w} panicked: {e:?}"));
                }
            }
            done.store(true, Ordering::SeqCst);
            if let Err(e) = checker.join() {
                self.failure(format!("the checker panicked: {e:?}"));
            }
        });
        started.elapsed()
    }

    /// The end state: nothing allocated, recorded or routed.
    fn check_end(&self) -> Snapshot {
        let cids: HashSet<String> = lock(&self.reg).pods.keys().cloned().collect();
        let snap = self.backend.snapshot(&self.pool, &cids);
        let mut v = Vec::new();
        {
            let reg = lock(&self.reg);
            assert!(reg.pods.values().all(|p| p.end.is_some()));
            assert!(reg.live_ips.is_empty());
            let s0 = reg.seq;
            check_store(&snap, &reg, s0, &self.pool, &mut v);
            let routes = host_ip_json(&["-4", "route", "show"]);
            check_routes(&routes, &reg, s0, &self.pool, &mut v);
        }
        for h in snap.handles.iter().filter(|h| !h.spec.deleted) {
            v.push(format!(
                "at the end: IPAMHandle {} holds {:?}",
                h.spec.handle_id, h.spec.block
            ));
        }
        for b in snap.blocks.iter().filter(|b| !b.spec.deleted) {
            let n = b.spec.allocations.iter().filter(|a| a.is_some()).count();
            if n > 0 || b.spec.unallocated.len() != b.spec.allocations.len() {
                v.push(format!(
                    "at the end: block {} has {n} allocated ordinal(s), unallocated {:?}",
                    b.spec.cidr, b.spec.unallocated
                ));
            }
        }
        for a in snap.affinities.iter().filter(|a| a.spec.deleted != "true") {
            if a.spec.state != AFFINITY_CONFIRMED {
                v.push(format!(
                    "at the end: BlockAffinity {} is {:?}",
                    a.metadata.name, a.spec.state
                ));
            }
        }
        for (cid, ips) in &snap.endpoints {
            // KDD: pods stay, their podIP annotations cleared; embedded: no
            // record at all.
            let kdd = matches!(self.backend, Backend::Kdd { .. });
            if !ips.is_empty() || !kdd {
                v.push(format!(
                    "at the end: endpoint record of container {cid} ({ips:?})"
                ));
            }
        }
        let links = host_ip_json(&["link", "show"]);
        let veths: HashSet<String> = lock(&self.reg)
            .pods
            .values()
            .map(|p| p.veth.clone())
            .collect();
        for l in links.as_array().unwrap() {
            let name = l["ifname"].as_str().unwrap_or("");
            if veths.contains(name) {
                v.push(format!("at the end: host link {name} is still there"));
            }
        }
        for w in &self.workers {
            if w.netns.link("eth0").is_some() {
                v.push(format!("at the end: netns {} still has eth0", w.netns.name));
            }
        }
        for what in v {
            self.violation(what);
        }
        snap
    }

    /// The figures, printed; asserts that nothing failed or tripped.
    fn report(&self, elapsed: Duration, end: &Snapshot) {
        let pct = |times: &Mutex<Vec<Duration>>, p: usize| {
            let mut t = lock(times).clone();
            t.sort();
            t.get((t.len() * p / 100).min(t.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        // Affinity of each block (blocks are never deleted here: all are
        // affine), then each ADD's address against its node.
        let owner: HashMap<Ipv4Net, String> = end
            .blocks
            .iter()
            .filter_map(|b| {
                Some((
                    b.spec.cidr.parse().ok()?,
                    affine_node(b).unwrap_or("").to_string(),
                ))
            })
            .collect();
        let reg = lock(&self.reg);
        let owning: HashSet<&String> = owner.values().collect();
        let (mut adds, mut borrowed, mut owners_borrowed) = (0, 0, 0);
        for p in reg.pods.values() {
            let Some(ip) = p.ip else { continue };
            adds += 1;
            let cidr = Ipv4Net::new(ip, BLOCK_SIZE).unwrap().trunc();
            if owner.get(&cidr).is_some_and(|n| *n != p.node) {
                borrowed += 1;
                if owning.contains(&p.node) {
                    owners_borrowed += 1;
                }
            }
        }
        let mut owners: Vec<String> = owner.iter().map(|(c, n)| format!("{c}->{n}")).collect();
        owners.sort();
        let violations = lock(&self.violations).clone();
        let failures = lock(&self.failures).clone();
        let duplicates = violations
            .iter()
            .filter(|v| v.contains("which live pod") || v.contains("host routes to"))
            .count();
        eprintln!(
            "{}: {} workers x {} cycles on {NODES} nodes, pool {} (/{BLOCK_SIZE} blocks): {adds} ADDs ok in {:.1}s; \
             ADD p50 {:?} p99 {:?}; DEL p50 {:?} p99 {:?}; {} samples, {} store checks at ADD's return; \
             duplicates {duplicates}; borrowed {borrowed} of {adds} allocations ({owners_borrowed} by nodes owning a block); snapshots with a full block {}; snapshots with a pending affinity {}; \
             most addresses allocated at once {}; blocks {owners:?}; violations {}; failures {}",
            self.name,
            self.workers.len(),
            self.cycles,
            self.pool,
            elapsed.as_secs_f64(),
            pct(&self.add_times, 50),
            pct(&self.add_times, 99),
            pct(&self.del_times, 50),
            pct(&self.del_times, 99),
            self.samples.load(Ordering::Relaxed),
            self.add_checks.load(Ordering::Relaxed),
            self.full_block_samples.load(Ordering::Relaxed),
            self.pending_samples.load(Ordering::Relaxed),
            self.max_allocated.load(Ordering::Relaxed),
            violations.len(),
            failures.len(),
        );
        if !(failures.is_empty() && violations.is_empty()) {
            // The plugins' log outlives the run's directory.
            let kept =
                std::env::temp_dir().join(format!("ipam_property-{}-{}.log", self.name, unique()));
            let log = self.exec_log.with_file_name("log").join("cni.log");
            match std::fs::copy(&log, &kept) {
                Ok(_) => eprintln!(
                    "{}: the plugins' log is kept in {}",
                    self.name,
                    kept.display()
                ),
                Err(e) => eprintln!("{}: cannot keep {}: {e}", self.name, log.display()),
            }
        }
        assert!(
            failures.is_empty(),
            "{} failure(s), first: {:#?}",
            failures.len(),
            &failures[..failures.len().min(10)]
        );
        assert!(
            violations.is_empty(),
            "{} invariant violation(s), first: {:#?}",
            violations.len(),
            &violations[..violations.len().min(20)]
        );
        assert_eq!(adds, self.workers.len() * self.cycles);
        // The exec'd path ran: one ADD and one DEL per cycle of its workers.
        let exec_workers = (0..self.workers.len())
            .filter(|w| w % EXEC_EVERY == EXEC_EVERY - 1)
            .count();
        let verbs = std::fs::read_to_string(&self.exec_log).unwrap_or_default();
        let count = |verb: &str| verbs.lines().filter(|l| *l == verb).count();
        assert_eq!(
            (count("ADD"), count("DEL")),
            (exec_workers * self.cycles, exec_workers * self.cycles),
            "calico-ipam exec'd through the wrapper"
        );
    }
}

/// A /27 (or the first /28 of one) for this run that nothing on the host routes (and no pool of the
/// cluster overlaps): 10.240.0.0/13 carved by process id and slot.
fn pick_pool(slot: u32, taken: &[Ipv4Net]) -> Ipv4Net {
    let routes = host_ip_json(&["-4", "route", "show"]);
    let routed: Vec<Ipv4Net> = routes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| {
            let dst = r["dst"].as_str()?;
            dst.parse::<Ipv4Net>()
                .ok()
                .or_else(|| dst.parse::<Ipv4Addr>().ok().map(Ipv4Net::from))
        })
        .collect();
    let base = u32::from(Ipv4Addr::new(10, 240, 0, 0));
    let slots = 1u32 << (27 - 13);
    let first = (std::process::id() * 2 + slot) % slots;
    for i in 0..slots {
        let index = (first + i * 2) % slots;
        let net = Ipv4Net::new(Ipv4Addr::from(base + (index << (32 - 27))), 27).unwrap();
        let clash = |n: &Ipv4Net| n.contains(&net.network()) || net.contains(&n.network());
        if !routed.iter().any(clash) && !taken.iter().any(clash) {
            return Ipv4Net::new(net.network(), pool_prefix()).unwrap();
        }
    }
    panic!("no free /27 in 10.240.0.0/13")
}

/// `<dir>/bin/calico-ipam` -> this binary (in process), and
/// `<dir>/bin-exec/calico-ipam`, a script exec'ing it (the exec'd path),
/// which logs each verb to `<dir>/exec.log`.
fn cni_paths(dir: &Path) -> (String, String) {
    let bin = dir.join("bin");
    let wrapped = dir.join("bin-exec");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&wrapped).unwrap();
    std::os::unix::fs::symlink(CALICO, bin.join("calico-ipam")).unwrap();
    let script = wrapped.join("calico-ipam");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$CNI_COMMAND\" >> {}\nexec {} \"$@\"\n",
            dir.join("exec.log").display(),
            bin.join("calico-ipam").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (bin.display().to_string(), wrapped.display().to_string())
}

fn base_conf(dir: &Path, node: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "calico",
        "log_level": "info",
        "log_file_path": dir.join("log/cni.log"),
        "nodename": node,
        "mtu_file": dir.join("mtu"),
        "release_queue_dir": dir.join("release-queue"),
        "ipam_lock_file": dir.join(format!("lock-{node}")),
        "ipam": {"type": "calico-ipam"},
    })
}

#[allow(clippy::too_many_arguments)]
fn new_run(
    name: &'static str,
    backend: Backend,
    pool: Ipv4Net,
    cycles: usize,
    dir: &Path,
    nodes: &[String],
    configure: impl Fn(&mut Value),
    pods: Option<(&str, Vec<String>)>,
) -> Run {
    let (in_process, exec_path) = cni_paths(dir);
    let workers = (0..WORKERS)
        .map(|w| {
            let node = nodes[w % NODES].clone();
            let mut conf = base_conf(dir, &node);
            configure(&mut conf);
            Worker {
                conf: conf.to_string(),
                cni_path: if w % EXEC_EVERY == EXEC_EVERY - 1 {
                    exec_path.clone()
                } else {
                    in_process.clone()
                },
                netns: Netns::new(),
                pod: pods
                    .as_ref()
                    .map(|(ns, names)| (ns.to_string(), names[w].clone())),
                node,
            }
        })
        .collect();
    Run {
        name,
        exec_log: dir.join("exec.log"),
        backend,
        pool,
        cycles,
        workers,
        reg: Mutex::new(Registry::default()),
        violations: Mutex::new(Vec::new()),
        failures: Mutex::new(Vec::new()),
        abort: AtomicBool::new(false),
        add_times: Mutex::new(Vec::new()),
        del_times: Mutex::new(Vec::new()),
        samples: AtomicUsize::new(0),
        add_checks: AtomicUsize::new(0),
        max_allocated: AtomicUsize::new(0),
        full_block_samples: AtomicUsize::new(0),
        pending_samples: AtomicUsize::new(0),
    }
}

#[test]
fn concurrent_add_del_on_the_embedded_store_keeps_every_ipam_invariant() {
    if !root_or_skip("ipam_property_embedded") {
        return;
    }
    let _serial = lock(&SERIAL);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let pool = pick_pool(0, &[]);
    {
        let store = LocalStore::open(&db, Duration::from_secs(10)).unwrap();
        let s: &dyn Store = &store;
        block_on(s.create(&mut IpPool::new(
            &format!("prop-{}", unique()),
            IpPoolSpec {
                cidr: pool.to_string(),
                block_size: BLOCK_SIZE,
                ..Default::default()
            },
        )))
        .unwrap();
    }
    let nodes: Vec<String> = (0..NODES).map(|i| format!("node-{i}")).collect();
    let run = new_run(
        "embedded",
        Backend::Local { db: db.clone() },
        pool,
        cycles(),
        dir.path(),
        &nodes,
        |conf| conf["local_datastore_path"] = json!(db),
        None,
    );
    let elapsed = run.go();
    let end = run.check_end();
    // The typed API agrees with the raw snapshot.
    let store = LocalStore::open(&db, Duration::from_secs(10)).unwrap();
    let s: &dyn Store = &store;
    let handles =
        block_on(s.list::<IpamHandle>("", &calico_cni::datastore::ListFilter::All)).unwrap();
    let blocks =
        block_on(s.list::<IpamBlock>("", &calico_cni::datastore::ListFilter::All)).unwrap();
    assert!(handles.is_empty(), "{handles:?}");
    assert_eq!(blocks.len(), end.blocks.len());
    run.report(elapsed, &end);
}

/// What the Kubernetes run made that is cluster-scoped: removed on drop.
struct KddObjects {
    bed: &'static Testbed,
    pool_name: String,
    pool: Ipv4Net,
    nodes: Vec<String>,
}

impl Drop for KddObjects {
    fn drop(&mut self) {
        let bed = self.bed;
        let list = |plural: &str| match bed.admin("GET", &format!("{CRD}/{plural}"), None) {
            (200, v) => items(&v),
            _ => Vec::new(),
        };
        let name = |o: &Value| o["metadata"]["name"].as_str().unwrap_or("").to_string();
        for h in list("ipamhandles") {
            let spec = &h["spec"]["block"];
            let ours = spec
                .as_object()
                .is_some_and(|m| m.keys().any(|c| in_pool(&self.pool, c)));
            if ours {
                let _ = bed.admin("DELETE", &format!("{CRD}/ipamhandles/{}", name(&h)), None);
            }
        }
        for b in list("ipamblocks") {
            if in_pool(&self.pool, b["spec"]["cidr"].as_str().unwrap_or("")) {
                let _ = bed.admin("DELETE", &format!("{CRD}/ipamblocks/{}", name(&b)), None);
            }
        }
        for a in list("blockaffinities") {
            let node = a["spec"]["node"].as_str().unwrap_or("");
            if self.nodes.iter().any(|n| n == node)
                || in_pool(&self.pool, a["spec"]["cidr"].as_str().unwrap_or(""))
            {
                let _ = bed.admin(
                    "DELETE",
                    &format!("{CRD}/blockaffinities/{}", name(&a)),
                    None,
                );
            }
        }
        let _ = bed.admin("DELETE", &format!("{CRD}/ippools/{}", self.pool_name), None);
    }
}

#[test]
fn concurrent_add_del_on_the_kubernetes_datastore_keeps_every_ipam_invariant() {
    let test = "ipam_property_kubernetes";
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = testbed(test) else {
        return;
    };
    let _serial = lock(&SERIAL);
    let tag = unique();
    let dir = tempfile::tempdir().unwrap();
    // Nodes labelled for the pool's selector: only these match it.
    let nodes: Vec<Node> = (0..NODES)
        .map(|i| bed.node(&format!("prop-{tag}-{i}")))
        .collect();
    for n in &nodes {
        bed.merge_patch(
            &format!("/api/v1/nodes/{}", n.name),
            &json!({"metadata": {"labels": {"calico-prop": tag}}}),
        );
    }
    let node_names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let (code, pools) = bed.admin("GET", &format!("{CRD}/ippools"), None);
    assert_eq!(code, 200, "{pools}");
    let taken: Vec<Ipv4Net> = items(&pools)
        .iter()
        .filter_map(|p| p["spec"]["cidr"].as_str()?.parse().ok())
        .collect();
    let pool = pick_pool(1, &taken);
    let pool_name = format!("prop-{tag}");
    let _objects = KddObjects {
        bed,
        pool_name: pool_name.clone(),
        pool,
        nodes: node_names.clone(),
    };
    bed.create(
        &format!("{CRD}/ippools"),
        &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
                "metadata": {"name": pool_name},
                "spec": {"cidr": pool.to_string(), "blockSize": BLOCK_SIZE,
                         "nodeSelector": format!("calico-prop == '{tag}'"),
                         "allowedUses": ["Workload", "Tunnel"]}}),
    );
    // One pod per worker on its node (no kubelet: they just sit there;
    // tolerating everything, so that no eviction takes them meanwhile).
    let ns: Namespace = bed.namespace(json!({}), json!({}));
    let pod_names: Vec<String> = (0..WORKERS).map(|w| format!("pod-{w}")).collect();
    for (w, pod) in pod_names.iter().enumerate() {
        ns.create_pod(json!({
            "metadata": {"name": pod},
            "spec": {"nodeName": node_names[w % NODES],
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "i"}]}
        }));
    }
    let kubeconfig = bed.cni_kubeconfig();
    let run = new_run(
        "kubernetes",
        Backend::Kdd {
            bed,
            namespace: ns.name.clone(),
            nodes: node_names.clone(),
        },
        pool,
        cycles(),
        dir.path(),
        &node_names,
        |conf| {
            conf["datastore_type"] = json!("kubernetes");
            conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
            conf["policy"] = json!({"type": "k8s"});
        },
        Some((&ns.name, pod_names.clone())),
    );
    let elapsed = run.go();
    let end = run.check_end();
    run.report(elapsed, &end);
}

/// What the etcd run made: removed on drop.
struct EtcdObjects {
    access: common::etcd::EtcdAccess,
    pool: Ipv4Net,
    nodes: Vec<String>,
    pool_name: String,
}

impl Drop for EtcdObjects {
    fn drop(&mut self) {
        let a = &self.access;
        for (key, value) in a.list("/calico/ipam/v2/handle/") {
            let ours = value["block"]
                .as_object()
                .is_some_and(|m| m.keys().any(|c| in_pool(&self.pool, c)));
            if ours {
                a.delete_prefix(&key);
            }
        }
        for (key, value) in a.list("/calico/ipam/v2/assignment/ipv4/") {
            if in_pool(&self.pool, value["cidr"].as_str().unwrap_or("")) {
                a.delete_prefix(&key);
            }
        }
        for node in &self.nodes {
            a.delete_prefix(&format!("/calico/ipam/v2/host/{node}/"));
            a.delete_prefix(&format!(
                "/calico/resources/v3/projectcalico.org/nodes/{node}"
            ));
        }
        a.delete_prefix(&format!(
            "/calico/resources/v3/projectcalico.org/ippools/{}",
            self.pool_name
        ));
    }
}

#[test]
fn concurrent_add_del_on_etcd_keeps_every_ipam_invariant() {
    let test = "ipam_property_etcd";
    if !root_or_skip(test) {
        return;
    }
    let Some(access) = common::etcd::calico_etcd(test) else {
        return;
    };
    common::ipam::ensure_etcd_cluster_information(&access);
    let _serial = lock(&SERIAL);
    let tag = unique();
    let dir = tempfile::tempdir().unwrap();
    let node_names: Vec<String> = (0..NODES).map(|i| format!("prop-{tag}-{i}")).collect();
    let taken: Vec<Ipv4Net> = access
        .list("/calico/resources/v3/projectcalico.org/ippools/")
        .iter()
        .filter_map(|(_, p)| p["spec"]["cidr"].as_str()?.parse().ok())
        .collect();
    let pool = pick_pool(2, &taken);
    let pool_name = format!("prop-{tag}");
    let _objects = EtcdObjects {
        access: access.clone(),
        pool,
        nodes: node_names.clone(),
        pool_name: pool_name.clone(),
    };
    for n in &node_names {
        access.put(
            &format!("/calico/resources/v3/projectcalico.org/nodes/{n}"),
            &json!({"kind": "Node", "apiVersion": "projectcalico.org/v3",
                    "metadata": {"name": n, "labels": {"calico-prop": tag}}, "spec": {}})
            .to_string(),
        );
    }
    access.put(
        &format!("/calico/resources/v3/projectcalico.org/ippools/{pool_name}"),
        &json!({"kind": "IPPool", "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": pool_name},
                "spec": {"cidr": pool.to_string(), "blockSize": BLOCK_SIZE,
                         "nodeSelector": format!("calico-prop == '{tag}'"),
                         "allowedUses": ["Workload", "Tunnel"]}})
        .to_string(),
    );
    let conf_access = access.clone();
    let run = new_run(
        "etcd",
        Backend::Etcd {
            access: access.clone(),
            nodes: node_names.clone(),
        },
        pool,
        cycles(),
        dir.path(),
        &node_names,
        |conf| {
            conf["datastore_type"] = json!("etcdv3");
            conf["etcd_endpoints"] = json!(conf_access.endpoints_csv());
            conf["etcd_ca_cert_file"] = json!(conf_access.ca);
            conf["etcd_cert_file"] = json!(conf_access.cert);
            conf["etcd_key_file"] = json!(conf_access.key);
        },
        None,
    );
    let elapsed = run.go();
    let end = run.check_end();
    run.report(elapsed, &end);
}

/// The checker has teeth: a consistent state passes, and each kind of
/// breakage it looks for is reported (no root needed).
#[test]
fn the_checker_reports_each_broken_invariant() {
    use calico_cni::datastore::ipam_model::{
        AllocationAttribute, BlockAffinitySpec, IpamBlockSpec, IpamHandleSpec,
    };
    let pool: Ipv4Net = "10.240.0.0/28".parse().unwrap();
    let cidr: Ipv4Net = "10.240.0.8/29".parse().unwrap();
    let mut reg = Registry {
        seq: 10,
        ..Registry::default()
    };
    let pod = |ip: Option<Ipv4Addr>, live, del, end| PodRec {
        worker: 0,
        node: "n1".into(),
        veth: "caliaaaaaaaaaaa".into(),
        ip,
        live,
        del,
        end,
    };
    let ip = Ipv4Addr::new(10, 240, 0, 9);
    reg.pods
        .insert("aaaaaaaaaaaac".into(), pod(Some(ip), Some(2), None, None));
    reg.pods.insert(
        "bbbbbbbbbbbbc".into(),
        pod(Some(ip), Some(1), Some(3), Some(4)),
    );
    let handle = |block: &[(&str, usize)]| {
        IpamHandle::new(
            "net1.aaaaaaaaaaaac",
            IpamHandleSpec {
                handle_id: "net1.aaaaaaaaaaaac".into(),
                block: block.iter().map(|(c, n)| (c.to_string(), *n)).collect(),
                ..Default::default()
            },
        )
    };
    let good = || Snapshot {
        blocks: vec![IpamBlock::new(
            "10-240-0-8-29",
            IpamBlockSpec {
                cidr: cidr.to_string(),
                affinity: Some("host:n1".into()),
                allocations: vec![None, Some(0), None, None, None, None, None, None],
                unallocated: vec![2, 3, 4, 5, 6, 7, 0],
                attributes: vec![AllocationAttribute {
                    handle_id: Some("net1.aaaaaaaaaaaac".into()),
                    ..Default::default()
                }],
                ..Default::default()
            },
        )],
        handles: vec![handle(&[("10.240.0.8/29", 1)])],
        affinities: vec![BlockAffinity::new(
            &affinity_name("n1", &IpNet::V4(cidr)),
            BlockAffinitySpec {
                state: AFFINITY_CONFIRMED.into(),
                node: "n1".into(),
                cidr: cidr.to_string(),
                deleted: "false".into(),
                ..Default::default()
            },
        )],
        endpoints: vec![("aaaaaaaaaaaac".into(), vec!["10.240.0.9/32".into()])],
    };
    let violations = |snap: &Snapshot| {
        let mut v = Vec::new();
        check_store(snap, &reg, 5, &pool, &mut v);
        v
    };
    assert_eq!(violations(&good()), Vec::<String>::new());
    type Breakage<'a> = Box<dyn Fn(&mut Snapshot) + 'a>;
    let broken: Vec<(&str, Breakage)> = vec![
        (
            "its IPAMHandle counts 2",
            Box::new(|s| s.handles = vec![handle(&[("10.240.0.8/29", 2)])]),
        ),
        ("which does not exist", Box::new(|s| s.handles.clear())),
        (
            "is free and allocated",
            Box::new(|s| s.blocks[0].spec.unallocated.push(1)),
        ),
        (
            "neither free nor allocated",
            Box::new(|s| s.blocks[0].spec.unallocated.pop().map(|_| ()).unwrap()),
        ),
        (
            "after its DEL returned (leak)",
            Box::new(|s| {
                let b = &mut s.blocks[0].spec;
                b.unallocated.retain(|&o| o != 2);
                b.allocations[2] = Some(1);
                b.attributes.push(AllocationAttribute {
                    handle_id: Some("net1.bbbbbbbbbbbbc".into()),
                    ..Default::default()
                });
                s.handles.push(IpamHandle::new(
                    "net1.bbbbbbbbbbbbc",
                    IpamHandleSpec {
                        handle_id: "net1.bbbbbbbbbbbbc".into(),
                        block: BTreeMap::from([("10.240.0.8/29".into(), 1)]),
                        ..Default::default()
                    },
                ));
            }),
        ),
        ("no BlockAffinity", Box::new(|s| s.affinities.clear())),
        (
            "is in state \"pendingDeletion\"",
            Box::new(|s| s.affinities[0].spec.state = "pendingDeletion".into()),
        ),
        (
            "its endpoint record holds None",
            Box::new(|s| s.endpoints.clear()),
        ),
        (
            "but its pod is not in flight",
            Box::new(|s| {
                s.endpoints
                    .push(("bbbbbbbbbbbbc".into(), vec!["10.240.0.9/32".into()]))
            }),
        ),
        (
            "is allocated to None",
            Box::new(|s| {
                let b = &mut s.blocks[0].spec;
                b.allocations[1] = None;
                b.unallocated.push(1);
            }),
        ),
    ];
    for (expect, breakage) in broken {
        let mut snap = good();
        breakage(&mut snap);
        let v = violations(&snap);
        assert!(v.iter().any(|m| m.contains(expect)), "{expect}: {v:?}");
    }
    // Routes: the live pod's on its veth passes; a second route to its
    // address, or none, does not.
    let routes = |r: Value| {
        let mut v = Vec::new();
        check_routes(&r, &reg, 5, &pool, &mut v);
        v
    };
    let ours = json!({"dst": "10.240.0.9", "dev": "caliaaaaaaaaaaa"});
    assert_eq!(routes(json!([ours])), Vec::<String>::new());
    let v = routes(json!([ours, {"dst": "10.240.0.9", "dev": "calizzzzzzzzzzz"}]));
    assert!(
        v.iter().any(|m| m.contains("host routes to 10.240.0.9")),
        "{v:?}"
    );
    let v = routes(json!([]));
    assert!(
        v.iter()
            .any(|m| m.contains("host route to 10.240.0.9 is on None")),
        "{v:?}"
    );
}

/// A store that, right after the allocator's `nth` list of IPAM blocks,
/// plays two other plugins' writes: A's last free address taken, one of
/// full block B's released. The list the allocator got is then stale.
struct RacingStore {
    inner: LocalStore,
    block_lists: AtomicUsize,
    nth: usize,
    /// The backend it answers as (the Kubernetes API's lists carry whole
    /// blocks, which borrowing writes on: a stale one must not hide a
    /// freed address).
    backend: calico_cni::datastore::Backend,
}

#[async_trait::async_trait]
impl Store for RacingStore {
    fn backend(&self) -> calico_cni::datastore::Backend {
        self.backend
    }
    async fn get_object(
        &self,
        kind: &'static calico_cni::datastore::Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, calico_cni::datastore::DatastoreError> {
        self.inner.get_object(kind, namespace, name).await
    }
    async fn list_objects(
        &self,
        kind: &'static calico_cni::datastore::Kind,
        namespace: &str,
        filter: &calico_cni::datastore::ListFilter,
    ) -> Result<Vec<Value>, calico_cni::datastore::DatastoreError> {
        let list = self.inner.list_objects(kind, namespace, filter).await?;
        if kind.name == "IPAMBlock" && self.block_lists.fetch_add(1, Ordering::SeqCst) == self.nth {
            let s: &dyn Store = &self.inner;
            let mut a = s.get::<IpamBlock>("", "10-240-0-0-29").await?.unwrap();
            a.spec.unallocated.retain(|&o| o != 7);
            a.spec.allocations[7] = Some(0);
            s.update(&mut a).await?;
            let mut b = s.get::<IpamBlock>("", "10-240-0-8-29").await?.unwrap();
            b.spec.allocations[0] = None;
            b.spec.unallocated.push(0);
            s.update(&mut b).await?;
        }
        Ok(list)
    }
    async fn create_object(
        &self,
        kind: &'static calico_cni::datastore::Kind,
        object: Value,
    ) -> Result<Value, calico_cni::datastore::DatastoreError> {
        self.inner.create_object(kind, object).await
    }
    async fn update_object(
        &self,
        kind: &'static calico_cni::datastore::Kind,
        object: Value,
    ) -> Result<Value, calico_cni::datastore::DatastoreError> {
        self.inner.update_object(kind, object).await
    }
    async fn delete_object(
        &self,
        kind: &'static calico_cni::datastore::Kind,
        namespace: &str,
        name: &str,
        precondition: &calico_cni::datastore::Precondition,
    ) -> Result<(), calico_cni::datastore::DatastoreError> {
        self.inner
            .delete_object(kind, namespace, name, precondition)
            .await
    }
}

struct NoLabels;

#[async_trait::async_trait]
impl calico_cni::ipam::calico::pools::SelectorLabels for NoLabels {
    async fn node_labels(
        &self,
    ) -> Result<BTreeMap<String, String>, calico_cni::ipam::calico::IpamError> {
        Ok(BTreeMap::new())
    }
    async fn namespace_labels(
        &self,
    ) -> Result<BTreeMap<String, String>, calico_cni::ipam::calico::IpamError> {
        Ok(BTreeMap::new())
    }
}

/// A host without a block borrows; while it does, the block it meant to
/// borrow from fills and another frees an address. Calico's borrowing
/// walks the pool's blocks reading each afresh, so it finds the freed
/// address; an allocator that only tries the blocks its earlier list showed
/// with free space fails with "Assigned 0 out of 1" though the pool has a
/// free address. What the property test's exactly-full pool can meet (16
/// addresses, 16 pods: a pod's DEL and the next ADD elsewhere land in the
/// borrower's window).
#[test]
fn borrowing_finds_an_address_freed_in_a_block_that_was_full() {
    for backend in [
        calico_cni::datastore::Backend::Local,
        calico_cni::datastore::Backend::Kubernetes,
    ] {
        borrowing_finds_an_address_freed_as_on(backend);
    }
}

fn borrowing_finds_an_address_freed_as_on(backend: calico_cni::datastore::Backend) {
    use calico_cni::datastore::ipam_model::AllocationAttribute;
    use calico_cni::ipam::calico::allocator::{Allocator, AutoAssign};
    use calico_cni::ipam::calico::block::new_block;
    let dir = tempfile::tempdir().unwrap();
    let inner = LocalStore::open(&dir.path().join("store.db"), Duration::from_secs(10)).unwrap();
    let store = RacingStore {
        inner,
        block_lists: AtomicUsize::new(0),
        // The one list: the new-block search's, which the borrowing then
        // walks (reading each block afresh, or writing on it as listed).
        nth: 0,
        backend,
    };
    let s: &dyn Store = &store;
    block_on(async {
        s.create(&mut IpPool::new(
            "p",
            IpPoolSpec {
                cidr: "10.240.0.0/28".into(),
                block_size: 29,
                ..Default::default()
            },
        ))
        .await
        .unwrap();
        // A: 7 of 8 held (ordinal 7 free); B: all 8 held.
        for (cidr, owner, free) in [
            ("10.240.0.0/29", "a", vec![7]),
            ("10.240.0.8/29", "b", vec![]),
        ] {
            let net: IpNet = cidr.parse().unwrap();
            let mut spec = new_block(&net, Some(format!("host:{owner}")), None);
            spec.attributes = vec![AllocationAttribute {
                handle_id: Some("net1.others".into()),
                ..Default::default()
            }];
            spec.allocations = (0..8).map(|o| (!free.contains(&o)).then_some(0)).collect();
            spec.unallocated = free;
            s.create(&mut IpamBlock::new(&cidr.replace(['.', '/'], "-"), spec))
                .await
                .unwrap();
        }
        let attrs = BTreeMap::new();
        let got = Allocator::new(s, "borrower")
            .auto_assign(&AutoAssign {
                num4: 1,
                num6: 0,
                handle: "net1.borrower",
                attrs: &attrs,
                pools4: &[],
                pools6: &[],
                max_blocks: 0,
                labels: &NoLabels,
            })
            .await;
        let got = got.unwrap_or_else(|e| {
            panic!("{backend:?}: the pool has a free address (10.240.0.8): {e}")
        });
        assert_eq!(got.v4, ["10.240.0.8/29".parse::<IpNet>().unwrap()]);
    });
}
