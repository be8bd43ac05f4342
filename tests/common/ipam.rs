//! One test's Calico IPAM world, on the embedded store or on the test
//! bed's real API server: a node, address ranges of its own, pools, the
//! `calico-ipam` personality (this binary under that name), and the IPAM
//! objects read back in the backend's own JSON (v3 objects from the
//! embedded store, Calico's CRD objects from the API server — in
//! `crd.projectcalico.org/v1`, or the v3 CRDs (see [`crd_api`]); their
//! `spec`s are the same).
//!
//! Isolation on the shared API server (IPAM objects are cluster-scoped):
//! every world takes a /20 and a /48 that no pool or block of the cluster
//! overlaps, its own Node (with a label only it carries, which every pool
//! it makes selects), and on drop deletes what it made — its pools, the
//! blocks inside its ranges, its node's affinities, the handles holding
//! addresses in its ranges (and the ones it wrote itself).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::{ListFilter, Resource, Store};
use ipnet::IpNet;
use serde_json::{Value, json};

use super::testbed::{Namespace, Testbed, testbed};
use super::{CALICO, CNI_BIN, Outcome, block_on, env_of, exec, unique};

#[allow(unused_imports)]
pub use calico_cni::datastore::ipam_model::{BlockAffinity, IpPool, IpamBlock, IpamHandle, Node};
#[allow(unused_imports)]
pub use calico_cni::datastore::model::WorkloadEndpoint;

/// The API group and version of Calico's CRDs the KDD worlds use:
/// `crd.projectcalico.org/v1`, or, with `CALICO_TEST_API_GROUP` set to
/// `projectcalico.org/v3` (the test command's second KDD pass), Calico
/// v3.32's native v3 CRDs — the plugin told so by `calico_api_group`.
pub fn crd_api() -> &'static str {
    if v3_mode() {
        "projectcalico.org/v3"
    } else {
        "crd.projectcalico.org/v1"
    }
}

/// Whether the KDD worlds run on the v3 CRDs.
pub fn v3_mode() -> bool {
    std::env::var("CALICO_TEST_API_GROUP").is_ok_and(|g| g == "projectcalico.org/v3")
}

/// A kind's CRD plural in the group in use (written here, not taken from
/// the plugin: the v3 group names the IPAM configuration differently).
pub fn crd_plural(kind: &calico_cni::datastore::Kind) -> &'static str {
    match kind.plural {
        "ipamconfigs" if v3_mode() => "ipamconfigurations",
        plural => plural,
    }
}

/// A CRD object read from the API server, as the tests compare it (the v1
/// shape): BlockAffinity's `deleted` is a boolean in the v3 CRD, the IPAM
/// configuration's kind IPAMConfiguration.
fn as_read(mut object: Value) -> Value {
    if let Some(b) = object.pointer("/spec/deleted").and_then(Value::as_bool)
        && object["kind"] == "BlockAffinity"
    {
        object["spec"]["deleted"] = json!(b.to_string());
    }
    if object["kind"] == "IPAMConfiguration" {
        object["kind"] = json!("IPAMConfig");
    }
    object
}

/// An object in the v1 shape as the API server's CRD in use takes it.
fn as_written(mut object: Value) -> Value {
    object["apiVersion"] = json!(crd_api());
    if v3_mode() {
        if object["kind"] == "BlockAffinity"
            && let Some(d) = object.pointer("/spec/deleted").and_then(Value::as_str)
        {
            object["spec"]["deleted"] = json!(d == "true");
        }
        if object["kind"] == "IPAMConfig" {
            object["kind"] = json!("IPAMConfiguration");
        }
    }
    object
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded store: a file of the test's own.
    Embedded,
    /// The test bed's kube-apiserver.
    Kdd,
    /// The test bed's etcd cluster for Calico (three members, TLS).
    Etcd,
}

/// The shared etcd cluster: objects read and written through the plugin's
/// own etcd backend (Calico's key layout is checked against the raw keys
/// in tests/etcd_datastore.rs).
struct Etcd {
    access: super::etcd::EtcdAccess,
    label: String,
    pools: Mutex<Vec<String>>,
    handles: Mutex<Vec<String>>,
}

impl Etcd {
    /// A store of the cluster. Made afresh per use: its connections belong
    /// to the runtime of the call.
    fn store(&self) -> calico_cni::datastore::etcd::EtcdStore {
        use calico_cni::etcd::{EtcdClient, EtcdConfig};
        let conf = EtcdConfig {
            endpoints: self.access.endpoints.clone(),
            ca_cert_file: Some(self.access.ca.clone()),
            cert_file: Some(self.access.cert.clone()),
            key_file: Some(self.access.key.clone()),
            credentials: None,
            discovery_srv: None,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        calico_cni::datastore::etcd::EtcdStore::new(EtcdClient::new(&conf, deadline).unwrap())
    }
}

/// ClusterInformation `default`, ready, on the shared etcd cluster (as
/// calico-node would have written it), and KubeControllersConfiguration
/// `default` (as calico-kube-controllers would: calicoctl ipam check reads
/// it).
pub fn ensure_etcd_cluster_information(access: &super::etcd::EtcdAccess) {
    let v3 = "/calico/resources/v3/projectcalico.org";
    for (plural, kind, uid, spec) in [
        (
            "clusterinformations",
            "ClusterInformation",
            1,
            json!({"clusterGUID": "0123456789abcdef0123456789abcdef",
                   "clusterType": "k8s,bgp", "datastoreReady": true}),
        ),
        (
            "kubecontrollersconfigurations",
            "KubeControllersConfiguration",
            2,
            json!({"healthChecks": "Enabled", "logSeverityScreen": "Info",
                   "etcdV3CompactionPeriod": "10m",
                   "controllers": {"node": {"reconcilerPeriod": "5m", "leakGracePeriod": "15m"},
                                   "loadBalancer": {"assignIPs": "AllServices"}}}),
        ),
    ] {
        let key = format!("{v3}/{plural}/default");
        if access.get(&key).is_none() {
            let object = json!({"kind": kind, "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": "default", "uid": format!("6e1e1a3c-0000-4000-8000-00000000000{uid}"),
                             "creationTimestamp": "2026-12-01T00:00:00Z"},
                "spec": spec});
            access.put(&key, &object.to_string());
        }
    }
}

struct Kdd {
    bed: &'static Testbed,
    /// The label (`calico-test`) only this world's node carries.
    label: String,
    /// Pools and handles this world created.
    pools: Mutex<Vec<String>>,
    handles: Mutex<Vec<String>>,
    /// Last, so that it is deleted after the IPAM objects.
    node: super::testbed::Node,
}

/// One test's IPAM world.
pub struct World {
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    /// The node name (`nodename` of the configs).
    pub node: String,
    /// A directory holding `calico-ipam`, a symlink to the built binary.
    pub bin: PathBuf,
    /// `ipam_lock_file`.
    pub lock_file: PathBuf,
    /// This world's address ranges: a /20 and a /48.
    pub v4_base: IpNet,
    pub v6_base: IpNet,
    local: Option<LocalStore>,
    kdd: Option<Kdd>,
    etcd: Option<Etcd>,
    pool_seq: AtomicU32,
}

static SLOT: AtomicU32 = AtomicU32::new(0);
/// 40 second octets (10.200-239) of 16 /20s each: clear of the host-local
/// subnets of `Setup` (10.100-199), the property tests (10.240.0.0/13) and
/// the test bed (10.250.0.0/16, 10.251.0.0/24), whose host routes or
/// blocks would collide with these.
const SLOTS: u32 = 40 * 16;

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The address ranges of the first slot, from `start` on, that overlaps
/// none of the ranges `taken` on `where_`.
fn free_slot(start: u32, taken: &[IpNet], where_: &str) -> (IpNet, IpNet) {
    let slot = (0..SLOTS)
        .map(|_| (start + SLOT.fetch_add(1, Ordering::Relaxed)) % SLOTS)
        .find(|&s| {
            let (a, b) = slot_nets(s);
            !taken.iter().any(|t| overlaps(t, &a) || overlaps(t, &b))
        })
        .unwrap_or_else(|| panic!("a free address range on {where_}"));
    slot_nets(slot)
}

fn slot_nets(slot: u32) -> (IpNet, IpNet) {
    let (x, k) = (200 + slot / 16, slot % 16);
    (
        format!("10.{x}.{}.0/20", k * 16).parse().unwrap(),
        format!("fd5c:{x:x}:{k:x}::/48").parse().unwrap(),
    )
}

fn cidr_of(object: &Value) -> Option<IpNet> {
    object["spec"]["cidr"]
        .as_str()
        .and_then(|c| c.parse::<IpNet>().ok())
}

impl World {
    /// `None` when the test cannot run here (the test bed, for Kdd).
    pub fn new(test: &str, backend: Backend) -> Option<World> {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(CALICO, bin.join("calico-ipam")).unwrap();
        let start = std::process::id().wrapping_mul(7) % SLOTS;
        let mut world = World {
            backend,
            node: "node-a".into(),
            bin,
            lock_file: dir.path().join("run/ipam.lock"),
            v4_base: slot_nets(0).0,
            v6_base: slot_nets(0).1,
            local: None,
            kdd: None,
            etcd: None,
            pool_seq: AtomicU32::new(0),
            dir,
        };
        match backend {
            Backend::Embedded => {
                let n = (start + SLOT.fetch_add(1, Ordering::Relaxed)) % SLOTS;
                (world.v4_base, world.v6_base) = slot_nets(n);
                world.local = Some(
                    LocalStore::open(&world.dir.path().join("store.db"), Duration::from_secs(10))
                        .unwrap(),
                );
            }
            Backend::Kdd => {
                let bed = testbed(test)?;
                // Ranges no pool or block of the cluster overlaps.
                let mut taken: Vec<IpNet> = Vec::new();
                for plural in ["ippools", "ipamblocks"] {
                    let list = bed
                        .get(&format!("/apis/{}/{plural}", crd_api()))
                        .expect("list");
                    taken.extend(list["items"].as_array().unwrap().iter().filter_map(cidr_of));
                }
                (world.v4_base, world.v6_base) = free_slot(start, &taken, "the test bed");
                let label = unique();
                let node = bed.node(&format!("node-{}", unique()));
                bed.merge_patch(
                    &format!("/api/v1/nodes/{}", node.name),
                    &json!({"metadata": {"labels": {"calico-test": label}}}),
                );
                world.node = node.name.clone();
                world.kdd = Some(Kdd {
                    bed,
                    label,
                    pools: Mutex::new(Vec::new()),
                    handles: Mutex::new(Vec::new()),
                    node,
                });
            }
            Backend::Etcd => {
                let access = super::etcd::calico_etcd(test)?;
                world.attach_etcd(access, start);
            }
        }
        Some(world)
    }

    /// A world on the etcd cluster `access` names (the test bed's, or a
    /// private one): ClusterInformation ensured, free ranges, its own Node.
    pub fn on_etcd(test: &str, access: super::etcd::EtcdAccess) -> Option<World> {
        let mut world = World::new(test, Backend::Embedded)?;
        world.local = None;
        world.backend = Backend::Etcd;
        let start = std::process::id().wrapping_mul(7) % SLOTS;
        world.attach_etcd(access, start);
        Some(world)
    }

    fn attach_etcd(&mut self, access: super::etcd::EtcdAccess, start: u32) {
        let world = self;
        ensure_etcd_cluster_information(&access);
        let etcd = Etcd {
            access,
            label: unique(),
            pools: Mutex::new(Vec::new()),
            handles: Mutex::new(Vec::new()),
        };
        let store = etcd.store();
        let s: &dyn Store = &store;
        let mut taken: Vec<IpNet> = Vec::new();
        for kind in [IpPool::KIND, IpamBlock::KIND] {
            let list = block_on(s.list_objects(kind, "", &ListFilter::All)).unwrap();
            taken.extend(list.iter().filter_map(cidr_of));
        }
        (world.v4_base, world.v6_base) = free_slot(start, &taken, "the etcd cluster");
        world.node = format!("node-{}", unique());
        let node = json!({"kind": "Node", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": world.node, "labels": {"calico-test": etcd.label}},
            "spec": {}});
        block_on(s.create_object(Node::KIND, node)).unwrap();
        world.etcd = Some(etcd);
    }

    /// The shared etcd cluster's access (an Etcd world).
    /// Calico's calicoctl (`binary`) on this world's datastore (`args`):
    /// its stdout; panics with its output when it fails.
    pub fn calicoctl(&self, binary: &std::path::Path, args: &[&str]) -> String {
        let bed = testbed("calicoctl").expect("the test bed");
        let mut cmd = std::process::Command::new(binary);
        cmd.args(args)
            .arg("--allow-version-mismatch")
            .env_clear()
            .env("KUBECONFIG", bed.var("KUBECONFIG"));
        match self.backend {
            Backend::Kdd => {
                cmd.env("DATASTORE_TYPE", "kubernetes");
            }
            _ => {
                let a = self.etcd_access();
                cmd.env("DATASTORE_TYPE", "etcdv3")
                    .env("ETCD_ENDPOINTS", a.endpoints_csv())
                    .env("ETCD_CA_CERT_FILE", &a.ca)
                    .env("ETCD_CERT_FILE", &a.cert)
                    .env("ETCD_KEY_FILE", &a.key);
            }
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "calicoctl {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    pub fn etcd_access(&self) -> &super::etcd::EtcdAccess {
        &self.etcd.as_ref().expect("an Etcd world").access
    }

    /// The BlockAffinity of this world's node for `block`, as the backend
    /// names it.
    pub fn affinity(&self, block: &IpNet) -> Option<Value> {
        let name = match self.backend {
            Backend::Etcd => {
                let v = if block.addr().is_ipv4() { 4 } else { 6 };
                let segment = block.to_string().replacen('/', "-", 1);
                format!("host/{}/ipv{v}/block/{segment}", self.node)
            }
            _ => format!(
                "{}-{}",
                self.node,
                block.to_string().replace(['.', ':', '/'], "-")
            ),
        };
        self.get::<BlockAffinity>(&name)
    }

    /// The name of the IPAMHandle of `handle_id` on this backend: its ID
    /// lower-cased (Kubernetes, embedded), as it is (etcd).
    pub fn handle_name(&self, handle_id: &str) -> String {
        match self.backend {
            Backend::Etcd => handle_id.to_string(),
            _ => handle_id.to_lowercase(),
        }
    }

    pub fn bed(&self) -> &'static Testbed {
        self.kdd.as_ref().expect("a Kdd world").bed
    }

    /// The `i`-th /24 of this world's /20.
    pub fn v4(&self, i: u8) -> IpNet {
        assert!(i < 16);
        let IpAddr::V4(base) = self.v4_base.network() else {
            unreachable!()
        };
        let o = base.octets();
        format!("{}.{}.{}.0/24", o[0], o[1], o[2] + i)
            .parse()
            .unwrap()
    }

    /// The `i`-th /64 of this world's /48.
    pub fn v6(&self, i: u16) -> IpNet {
        let IpAddr::V6(base) = self.v6_base.network() else {
            unreachable!()
        };
        let mut s = base.segments();
        s[3] = i;
        IpNet::new(std::net::Ipv6Addr::from(s).into(), 64).unwrap()
    }

    /// Creates an IPPool for `cidr` (`extra`: more spec fields); on the API
    /// server it selects only this world's node unless `extra` says
    /// otherwise. Its name.
    pub fn pool(&self, cidr: &str, extra: Value) -> String {
        let name = format!(
            "t-{}-{}",
            self.node,
            self.pool_seq.fetch_add(1, Ordering::Relaxed)
        );
        let mut spec = json!({"cidr": cidr});
        if let Some(label) = self.label() {
            spec["nodeSelector"] = json!(format!("calico-test == '{label}'"));
        }
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        if let Some(kdd) = &self.kdd {
            kdd.pools.lock().unwrap().push(name.clone());
        }
        if let Some(etcd) = &self.etcd {
            etcd.pools.lock().unwrap().push(name.clone());
        }
        self.create::<IpPool>(json!({"metadata": {"name": name}, "spec": spec}));
        name
    }

    /// Creates an object of kind `R` (kind and apiVersion filled in).
    pub fn create<R: Resource>(&self, mut object: Value) -> Value {
        object["kind"] = json!(R::KIND.name);
        if let Some(etcd) = &self.etcd {
            object["apiVersion"] = json!("projectcalico.org/v3");
            if R::KIND.name == IpamHandle::KIND.name {
                let name = object["metadata"]["name"].as_str().unwrap().to_string();
                etcd.handles.lock().unwrap().push(name);
            }
            let store = etcd.store();
            let s: &dyn Store = &store;
            return block_on(s.create_object(R::KIND, object)).unwrap();
        }
        match (&self.local, &self.kdd) {
            (Some(store), _) => {
                object["apiVersion"] = json!("projectcalico.org/v3");
                let s: &dyn Store = store;
                block_on(s.create_object(R::KIND, object)).unwrap()
            }
            (None, Some(kdd)) => {
                let object = as_written(object);
                if R::KIND.name == IpamHandle::KIND.name {
                    let name = object["metadata"]["name"].as_str().unwrap().to_string();
                    kdd.handles.lock().unwrap().push(name);
                }
                as_read(kdd.bed.create(
                    &format!("/apis/{}/{}", crd_api(), crd_plural(R::KIND)),
                    &object,
                ))
            }
            (None, None) => unreachable!(),
        }
    }

    /// [`Store::write_together`] on this world's store (the embedded store
    /// and etcd: the stores that write several objects at once).
    pub fn write_together(
        &self,
        writes: Vec<calico_cni::datastore::Write>,
    ) -> Result<Vec<Value>, calico_cni::datastore::DatastoreError> {
        use calico_cni::datastore::Write;
        if let Some(etcd) = &self.etcd {
            for w in &writes {
                if let Write::Create(kind, object) = w
                    && kind.name == IpamHandle::KIND.name
                {
                    let name = object["metadata"]["name"].as_str().unwrap().to_string();
                    etcd.handles.lock().unwrap().push(name);
                }
            }
            let store = etcd.store();
            let s: &dyn Store = &store;
            assert!(s.writes_together());
            return block_on(s.write_together(writes));
        }
        let s: &dyn Store = self.local.as_ref().expect("a store that writes together");
        assert!(s.writes_together());
        block_on(s.write_together(writes))
    }

    /// Replaces an object as read (its resourceVersion must still hold).
    pub fn update<R: Resource>(&self, object: Value) -> Value {
        if let Some(etcd) = &self.etcd {
            let store = etcd.store();
            let s: &dyn Store = &store;
            return block_on(s.update_object(R::KIND, object)).unwrap();
        }
        match (&self.local, &self.kdd) {
            (Some(store), _) => {
                let s: &dyn Store = store;
                block_on(s.update_object(R::KIND, object)).unwrap()
            }
            (None, Some(kdd)) => {
                let name = object["metadata"]["name"].as_str().unwrap();
                let path = format!("/apis/{}/{}/{name}", crd_api(), crd_plural(R::KIND));
                let (code, v) = kdd.bed.admin("PUT", &path, Some(&as_written(object)));
                assert_eq!(code, 200, "PUT {path}: {v}");
                kdd.bed
                    .await_cached(&path, v["metadata"]["resourceVersion"].as_str());
                as_read(v)
            }
            (None, None) => unreachable!(),
        }
    }

    /// Deletes the cluster-scoped object `name` of kind `R` (absent: fine).
    pub fn delete<R: Resource>(&self, name: &str) {
        use calico_cni::datastore::Precondition;
        let s: Box<dyn Store>;
        let s: &dyn Store = match (&self.etcd, &self.local, &self.kdd) {
            (Some(etcd), _, _) => {
                s = Box::new(etcd.store());
                s.as_ref()
            }
            (None, Some(store), _) => store,
            (None, None, Some(kdd)) => {
                let path = format!("/apis/{}/{}/{name}", crd_api(), crd_plural(R::KIND));
                kdd.bed.delete(&path);
                kdd.bed.await_cached(&path, None);
                return;
            }
            _ => unreachable!(),
        };
        match block_on(s.delete_object(R::KIND, "", name, &Precondition::default())) {
            Ok(()) | Err(calico_cni::datastore::DatastoreError::NotFound(_)) => {}
            Err(e) => panic!("deleting {}({name}): {e}", R::KIND.name),
        }
    }

    /// The object `name` of kind `R`, as the backend stores it.
    pub fn get<R: Resource>(&self, name: &str) -> Option<Value> {
        if let Some(etcd) = &self.etcd {
            let store = etcd.store();
            let s: &dyn Store = &store;
            return block_on(s.get_object(R::KIND, "", name)).unwrap();
        }
        match (&self.local, &self.kdd) {
            (Some(store), _) => {
                let s: &dyn Store = store;
                block_on(s.get_object(R::KIND, "", name)).unwrap()
            }
            (None, Some(kdd)) => kdd
                .bed
                .get(&format!(
                    "/apis/{}/{}/{name}",
                    crd_api(),
                    crd_plural(R::KIND)
                ))
                .map(as_read),
            (None, None) => unreachable!(),
        }
    }

    /// Every object of kind `R` (on the API server: the whole cluster's).
    pub fn list<R: Resource>(&self) -> Vec<Value> {
        if let Some(etcd) = &self.etcd {
            let store = etcd.store();
            let s: &dyn Store = &store;
            return block_on(s.list_objects(R::KIND, "", &ListFilter::All)).unwrap();
        }
        match (&self.local, &self.kdd) {
            (Some(store), _) => {
                let s: &dyn Store = store;
                block_on(s.list_objects(R::KIND, "", &ListFilter::All)).unwrap()
            }
            (None, Some(kdd)) => kdd
                .bed
                .get(&format!("/apis/{}/{}", crd_api(), crd_plural(R::KIND)))
                .expect("list")["items"]
                .as_array()
                .unwrap()
                .iter()
                .cloned()
                .map(as_read)
                .collect(),
            (None, None) => unreachable!(),
        }
    }

    /// The WorkloadEndpoints of `namespace` (embedded and etcd stores).
    pub fn endpoints(&self, namespace: &str) -> Vec<Value> {
        if let Some(etcd) = &self.etcd {
            let store = etcd.store();
            let s: &dyn Store = &store;
            return block_on(s.list_objects(WorkloadEndpoint::KIND, namespace, &ListFilter::All))
                .unwrap();
        }
        let store = self.local.as_ref().expect("the embedded or etcd store");
        let s: &dyn Store = store;
        block_on(s.list_objects(WorkloadEndpoint::KIND, namespace, &ListFilter::All)).unwrap()
    }

    /// The IPAM blocks inside this world's ranges.
    pub fn blocks(&self) -> Vec<Value> {
        self.list::<IpamBlock>()
            .into_iter()
            .filter(|b| cidr_of(b).is_some_and(|c| self.owns(&c)))
            .collect()
    }

    /// This world's node's BlockAffinities.
    pub fn affinities(&self) -> Vec<Value> {
        self.list::<BlockAffinity>()
            .into_iter()
            .filter(|a| a["spec"]["node"] == json!(self.node))
            .collect()
    }

    fn owns(&self, net: &IpNet) -> bool {
        self.v4_base.contains(net) || self.v6_base.contains(net)
    }

    /// Whether a line of text names an address or a CIDR of this world.
    #[allow(dead_code)]
    pub fn owns_text(&self, line: &str) -> bool {
        line.split(|c: char| !(c.is_ascii_hexdigit() || ".:/".contains(c)))
            .filter_map(|t| {
                t.parse::<IpNet>()
                    .ok()
                    .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from))
            })
            .any(|n| self.owns(&n))
    }

    /// Every address allocated in this world's blocks, with its handle.
    pub fn allocations(&self) -> Vec<(IpAddr, String)> {
        self.blocks().iter().flat_map(block_allocations).collect()
    }

    /// The addresses the blocks record for `handle`.
    pub fn addresses_of(&self, handle: &str) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self
            .allocations()
            .into_iter()
            .filter(|(_, h)| h == handle)
            .map(|(ip, _)| ip)
            .collect();
        out.sort();
        out
    }

    /// The IPAMHandle of `handle_id`.
    pub fn handle(&self, handle_id: &str) -> Option<Value> {
        self.get::<IpamHandle>(&self.handle_name(handle_id))
    }

    /// The label only this world's node carries (shared backends).
    fn label(&self) -> Option<&str> {
        self.kdd
            .as_ref()
            .map(|k| k.label.as_str())
            .or(self.etcd.as_ref().map(|e| e.label.as_str()))
    }

    /// The calico-ipam config of this world: network `net1`, this node,
    /// the lock file in the test's directory, debug logging to `log/`.
    pub fn conf(&self) -> Value {
        let dir = self.dir.path();
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": "net1",
            "type": "calico",
            "nodename": self.node,
            "ipam_lock_file": self.lock_file,
            "log_level": "debug",
            "log_file_path": dir.join("log/cni.log"),
            "mtu_file": dir.join("mtu"),
            "local_datastore_path": dir.join("store.db"),
            "ipam": {"type": "calico-ipam"},
        });
        match self.backend {
            Backend::Embedded => conf["datastore_type"] = json!("local"),
            Backend::Kdd => {
                conf["datastore_type"] = json!("kubernetes");
                conf["kubernetes"] = json!({"kubeconfig": self.bed().cni_kubeconfig()});
                if v3_mode() {
                    // As the tigera operator writes it into the conflist.
                    conf["calico_api_group"] = json!(crd_api());
                }
            }
            Backend::Etcd => {
                let a = self.etcd_access();
                conf["datastore_type"] = json!("etcdv3");
                conf["etcd_endpoints"] = json!(a.endpoints_csv());
                conf["etcd_ca_cert_file"] = json!(a.ca);
                conf["etcd_cert_file"] = json!(a.cert);
                conf["etcd_key_file"] = json!(a.key);
            }
        }
        conf
    }

    /// The conf with `ipam` fields set.
    pub fn conf_with_ipam(&self, ipam: Value) -> Value {
        let mut conf = self.conf();
        for (k, v) in ipam.as_object().unwrap() {
            conf["ipam"][k] = v.clone();
        }
        conf
    }

    /// The debug log written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/cni.log")).unwrap_or_default()
    }

    /// Runs `calico-ipam` (this binary under that name) with `conf`.
    pub fn ipam(&self, command: &str, cid: &str, conf: &Value, cni_args: &str) -> Outcome {
        let mut env = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/not-needed"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &self.bin.display().to_string()),
        ]);
        if !cni_args.is_empty() {
            env.insert("CNI_ARGS".into(), cni_args.into());
        }
        exec(
            &self.bin.join("calico-ipam").display().to_string(),
            &env,
            &conf.to_string(),
        )
    }

    /// Runs the `calico` plugin; its calico-ipam is found in `cni_path`
    /// (default: this world's `bin`, then the system's plugins).
    pub fn plugin(
        &self,
        command: &str,
        cid: &str,
        netns: &str,
        conf: &Value,
        cni_args: &str,
        cni_path: Option<&str>,
    ) -> Outcome {
        let default_path = format!("{}:{CNI_BIN}", self.bin.display());
        let path = cni_path.unwrap_or(&default_path);
        self.run_plugin(command, cid, netns, conf, cni_args, &[("CNI_PATH", path)])
    }

    /// Runs the `calico` plugin with extra environment variables.
    pub fn plugin_with_env(
        &self,
        command: &str,
        cid: &str,
        netns: &str,
        conf: &Value,
        cni_args: &str,
        extra: &[(&str, &str)],
    ) -> Outcome {
        self.run_plugin(command, cid, netns, conf, cni_args, extra)
    }

    /// The plugin with this world's CNI_PATH unless `extra` sets another.
    fn run_plugin(
        &self,
        command: &str,
        cid: &str,
        netns: &str,
        conf: &Value,
        cni_args: &str,
        extra: &[(&str, &str)],
    ) -> Outcome {
        let path = format!("{}:{CNI_BIN}", self.bin.display());
        let mut env: HashMap<String, String> = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &path),
        ]);
        if !cni_args.is_empty() {
            env.insert("CNI_ARGS".into(), cni_args.into());
        }
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        exec(CALICO, &env, &conf.to_string())
    }

    /// Creates pod `name` in `ns` (a namespace of the test bed), bound to
    /// this world's node.
    pub fn pod(&self, ns: &Namespace, name: &str, annotations: Value) {
        ns.create_pod(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": self.node, "containers": [{"name": "c", "image": "i"}]}
        }));
    }
}

impl World {
    /// Removes what an Etcd world made: its pools, the blocks in its
    /// ranges, its node's affinities, the handles in its ranges or of its
    /// own, its Node.
    fn drop_etcd(&self, etcd: &Etcd) {
        let store = etcd.store();
        let s: &dyn Store = &store;
        let handles = etcd.handles.lock().unwrap().clone();
        for kind in [IpamHandle::KIND, IpamBlock::KIND, BlockAffinity::KIND] {
            let Ok(list) = block_on(s.list_objects(kind, "", &ListFilter::All)) else {
                continue;
            };
            for item in list {
                let name = item["metadata"]["name"].as_str().unwrap_or_default();
                let mine = if kind.name == IpamBlock::KIND.name {
                    cidr_of(&item).is_some_and(|c| self.owns(&c))
                } else if kind.name == BlockAffinity::KIND.name {
                    item["spec"]["node"] == json!(self.node)
                } else {
                    handles.iter().any(|h| h == name)
                        || item["spec"]["block"].as_object().is_some_and(|b| {
                            b.keys()
                                .filter_map(|c| c.parse::<IpNet>().ok())
                                .any(|c| self.owns(&c))
                        })
                };
                if mine {
                    let _ = block_on(s.delete_object(kind, "", name, &Default::default()));
                }
            }
        }
        for pool in etcd.pools.lock().unwrap().iter() {
            let _ = block_on(s.delete_object(IpPool::KIND, "", pool, &Default::default()));
        }
        let weps = block_on(s.list_objects(WorkloadEndpoint::KIND, "", &ListFilter::All));
        for wep in weps.unwrap_or_default() {
            if wep["spec"]["node"] == json!(self.node) {
                let ns = wep["metadata"]["namespace"].as_str().unwrap_or_default();
                let name = wep["metadata"]["name"].as_str().unwrap_or_default();
                let _ = block_on(s.delete_object(
                    WorkloadEndpoint::KIND,
                    ns,
                    name,
                    &Default::default(),
                ));
            }
        }
        let _ = block_on(s.delete_object(Node::KIND, "", &self.node, &Default::default()));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(etcd) = &self.etcd {
            self.drop_etcd(etcd);
            return;
        }
        let Some(kdd) = &self.kdd else { return };
        let bed = kdd.bed;
        let mine = |object: &Value, plural: &str| -> bool {
            match plural {
                "ipamblocks" => cidr_of(object).is_some_and(|c| self.owns(&c)),
                "blockaffinities" => object["spec"]["node"] == json!(self.node),
                _ => {
                    kdd.handles
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|h| object["metadata"]["name"] == json!(h))
                        || object["spec"]["block"].as_object().is_some_and(|b| {
                            b.keys()
                                .filter_map(|c| c.parse::<IpNet>().ok())
                                .any(|c| self.owns(&c))
                        })
                }
            }
        };
        for plural in ["ipamhandles", "ipamblocks", "blockaffinities"] {
            let path = format!("/apis/{}/{plural}", crd_api());
            let (code, list) = bed.admin("GET", &path, None);
            if code != 200 {
                continue;
            }
            for item in list["items"].as_array().into_iter().flatten() {
                if mine(item, plural) {
                    let name = item["metadata"]["name"].as_str().unwrap_or_default();
                    let _ = bed.admin("DELETE", &format!("{path}/{name}"), None);
                }
            }
        }
        for pool in kdd.pools.lock().unwrap().iter() {
            let _ = bed.admin(
                "DELETE",
                &format!("/apis/{}/ippools/{pool}", crd_api()),
                None,
            );
        }
    }
}

/// The allocated addresses of a block (JSON), with their handle IDs.
pub fn block_allocations(block: &Value) -> Vec<(IpAddr, String)> {
    let cidr = cidr_of(block).expect("block cidr");
    let attrs = block["spec"]["attributes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    block["spec"]["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter_map(|(ordinal, a)| a.as_u64().map(|i| (ordinal, i as usize)))
        .map(|(ordinal, i)| {
            let handle = attrs[i]["handle_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (address_at(&cidr, ordinal), handle)
        })
        .collect()
}

/// The address at `ordinal` of a block.
pub fn address_at(cidr: &IpNet, ordinal: usize) -> IpAddr {
    match cidr.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) + ordinal as u32).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) + ordinal as u128).into()),
    }
}

/// Calico's hostname-hash label computed here, independently of the
/// plugin: standard base32, no padding, of SHA3-256 of the node name.
pub fn hostname_hash(node: &str) -> String {
    use sha3::Digest;
    let digest = sha3::Sha3_256::digest(node.as_bytes());
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let bits: Vec<bool> = digest
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1 == 1))
        .collect();
    bits.chunks(5)
        .map(|c| {
            let v = c
                .iter()
                .chain(std::iter::repeat(&false))
                .take(5)
                .fold(0usize, |acc, &b| acc << 1 | usize::from(b));
            alphabet[v] as char
        })
        .collect()
}

/// The address of a result entry (`ips[i].address`).
pub fn address(result: &Value, i: usize) -> IpNet {
    result["ips"][i]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips[{i}] in {result}"))
        .parse()
        .unwrap()
}
