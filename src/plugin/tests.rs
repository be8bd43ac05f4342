//! The verbs against the recording fakes, without root: the dataplane's
//! ([`crate::dataplane::fake`]), the IPAM's ([`crate::ipam::fake`]) and a
//! recording wrapper of the endpoint records on a real embedded store, all
//! writing one journal in the order things happen. ADD's step order and its
//! rollback after each step, DEL's teardown order, CHECK's findings, GC.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::cni::env::{CniEnv, Invocation};
use crate::cni::{Error, Request, Result};
use crate::dataplane::fake::{FakeDataplane, Journal};
use crate::datastore::endpoints::{Endpoints, StoredEndpoints};
use crate::datastore::local::LocalStore;
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::names::WepIdentifiers;
use crate::datastore::{DatastoreError, Precondition, Store};
use crate::ipam::Owner;
use crate::ipam::fake::FakeIpam;
use crate::plugin::context::Context;
use crate::plugin::workload;

/// The endpoint records of a real embedded store, each write journalled;
/// a create fails when `fail_create` is set.
struct RecordingEndpoints {
    inner: StoredEndpoints,
    journal: Journal,
    fail_create: bool,
}

impl RecordingEndpoints {
    fn log(&self, line: String) {
        self.journal.lock().unwrap().push(line);
    }
}

#[async_trait::async_trait]
impl Endpoints for RecordingEndpoints {
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        self.inner.get(namespace, name).await
    }
    async fn find(
        &self,
        namespace: &str,
        ids: &WepIdentifiers,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        self.inner.find(namespace, ids).await
    }
    async fn create(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        self.log(format!("record create {}", wep.spec.container_id));
        if self.fail_create {
            return Err(DatastoreError::Unavailable("injected".into()));
        }
        self.inner.create(wep).await
    }
    async fn update(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        self.log(format!("record update {}", wep.spec.container_id));
        self.inner.update(wep).await
    }
    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        self.log(format!("record delete {name}"));
        self.inner.delete(namespace, name, precondition).await
    }
    async fn all(&self) -> Result<Option<Vec<WorkloadEndpoint>>, DatastoreError> {
        self.inner.all().await
    }
}

/// One node: a store, the fakes, the journal.
struct Node {
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    journal: Journal,
    dataplane: FakeDataplane,
    ipam: Arc<FakeIpam>,
    fail_create: bool,
}

const NETNS: &str = "/fake/netns/pod1";

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(
            &dir.path().join("store.db"),
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        let journal: Journal = Arc::new(Mutex::new(Vec::new()));
        Node {
            store: Arc::new(store),
            dataplane: FakeDataplane::new(&[NETNS], Some(&journal)),
            ipam: FakeIpam::new(&journal, "10.0.0.5/32"),
            journal,
            fail_create: false,
            dir,
        }
    }

    fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.1.0", "name": "net1", "type": "calico", "nodename": "node1",
            "datastore_type": "local",
            "local_datastore_path": self.dir.path().join("store.db"),
            "mtu_file": self.dir.path().join("mtu"),
            "ipam": {"type": "fake-ipam"}
        })
    }

    fn context(&self, command: &str, cid: &str, ifname: &str, conf: &Value) -> Context {
        let vars: HashMap<String, String> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", if command == "GC" { "" } else { NETNS }),
            ("CNI_IFNAME", ifname),
            ("CNI_PATH", "/nonexistent"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let Invocation::Command(env) = CniEnv::from_vars(vars).unwrap() else {
            panic!("a command")
        };
        let req = Request::new(*env, conf.to_string().as_bytes()).unwrap();
        let endpoints = Arc::new(RecordingEndpoints {
            inner: StoredEndpoints::new(Arc::clone(&self.store)),
            journal: Arc::clone(&self.journal),
            fail_create: self.fail_create,
        });
        Context::with_dataplane(req, self.dataplane.dataplane.clone())
            .with_ipam(self.ipam.clone())
            .with_datastore(Arc::clone(&self.store), endpoints)
    }

    async fn add(&self, cid: &str, ifname: &str) -> Result<crate::cni::CniResult> {
        let ctx = self.context("ADD", cid, ifname, &self.conf());
        crate::plugin::cmd_add(&ctx, workload::of(&ctx)).await
    }

    async fn del(&self, cid: &str, ifname: &str) -> Result<()> {
        let ctx = self.context("DEL", cid, ifname, &self.conf());
        crate::plugin::cmd_del(&ctx, workload::of(&ctx)).await
    }

    fn journal(&self) -> Vec<String> {
        self.journal.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.journal.lock().unwrap().clear();
    }

    /// Where `line` (a prefix) first stands in the journal.
    fn at(&self, line: &str) -> usize {
        let j = self.journal();
        j.iter()
            .position(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("{line:?} not in {j:#?}"))
    }

    async fn records(&self) -> Vec<WorkloadEndpoint> {
        self.store
            .list("", &crate::datastore::ListFilter::All)
            .await
            .unwrap()
    }
}

const CID: &str = "a1b2c3d4e5f6";
const VETH: &str = "calia1b2c3d4e5f";

#[tokio::test(flavor = "current_thread")]
async fn add_takes_its_steps_in_order() {
    let node = Node::new();
    let result = node.add(CID, "eth0").await.unwrap();
    assert_eq!(result.ips[0].address.to_string(), "10.0.0.5/32");
    assert_eq!(result.interfaces[0].name, VETH);
    // The IPAM starts first; the pair is made ahead (its names are free)
    // while the datastore is read, before the allocation; then addresses
    // and routes, and meanwhile the record (known once the addresses and
    // the pair are: written while the links are configured).
    let in_order = |steps: &[&str]| {
        let at: Vec<usize> = steps.iter().map(|s| node.at(s)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{:#?}", node.journal());
    };
    let veth = format!("dataplane host: create veth {VETH} peer eth0");
    let record = format!("record create {CID}");
    in_order(&[
        "ipam START ADD",
        &veth,
        "ipam ADD",
        "dataplane pod: route 0.0.0.0/0 via 169.254.1.1",
        "dataplane pod: addr 10.0.0.5/32",
        "dataplane host: route 10.0.0.5/32",
    ]);
    // (The record goes beside the links' configuration: which of the two
    // reaches its first step first is the scheduler's choice.)
    in_order(&["ipam ADD", &record]);
    let records = node.records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].spec.ip_networks, ["10.0.0.5/32"]);
    assert_eq!(records[0].spec.interface_name, VETH);
}

/// The MTU calico/node writes (`/var/lib/calico/mtu`, here the config's
/// `mtu_file`) is the pod's and is reported on its interface, as Calico's
/// result has it; with neither file nor `mtu`, no `mtu` is reported.
#[tokio::test(flavor = "current_thread")]
async fn add_reports_the_mtu_the_node_file_gives() {
    let node = Node::new();
    let result = node.add(CID, "eth0").await.unwrap();
    assert_eq!(result.interfaces[1].mtu, None);
    node.del(CID, "eth0").await.unwrap();

    std::fs::write(node.dir.path().join("mtu"), "1400\n").unwrap();
    node.clear();
    let result = node.add(CID, "eth0").await.unwrap();
    assert_eq!(result.interfaces[1].mtu, Some(1400));
    assert_eq!(result.interfaces[0].mtu, None);
    let veth = format!("dataplane host: create veth {VETH} peer eth0 mtu 1400");
    node.at(&veth);
    // A repeat ADD of the same container answers from the record alike.
    let again = node.add(CID, "eth0").await.unwrap();
    assert_eq!(again.interfaces[1].mtu, Some(1400));
}

/// A leftover host veth of the pod's name is not touched ahead: the pair
/// is then made as Calico makes it, the leftover removed first, while the
/// IPAM allocates.
#[tokio::test(flavor = "current_thread")]
async fn add_replaces_a_leftover_pair_while_it_allocates() {
    let node = Node::new();
    node.dataplane.host().insert_link(VETH, None, 1500);
    node.add(CID, "eth0").await.unwrap();
    let journal = node.journal();
    let creates: Vec<usize> = (0..journal.len())
        .filter(|&i| journal[i].contains(&format!("create veth {VETH}")))
        .collect();
    assert_eq!(creates.len(), 2, "tried ahead (refused: taken), then made");
    let at = [
        node.at("ipam START ADD"),
        node.at("ipam ADD"),
        node.at(&format!("dataplane host: delete {VETH}")),
        creates[1],
        node.at(&format!("record create {CID}")),
    ];
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{journal:#?}");
}

/// A failure at each step of ADD leaves nothing: no interface, no record,
/// and the allocation released.
#[tokio::test(flavor = "current_thread")]
async fn add_rolls_back_after_each_step() {
    for step in ["ipam", "veth", "route", "address", "host route", "record"] {
        let mut node = Node::new();
        match step {
            "ipam" => node.ipam.fail("ADD"),
            "record" => node.fail_create = true,
            _ => {
                let side = match step {
                    "veth" | "host route" => node.dataplane.host(),
                    _ => node.dataplane.pod(),
                };
                side.state.lock().unwrap().fail_on = Some(
                    match step {
                        "veth" => "host: create veth",
                        "route" => "pod: route",
                        "address" => "pod: addr",
                        _ => "host: route",
                    }
                    .into(),
                );
            }
        }
        let e = node.add(CID, "eth0").await.unwrap_err();
        assert!(e.to_string().contains("inject"), "{step}: {e}");
        assert!(
            node.dataplane.host().state.lock().unwrap().links.is_empty(),
            "{step}: the host veth is left: {:#?}",
            node.journal()
        );
        assert!(
            node.dataplane.pod().state.lock().unwrap().links.is_empty(),
            "{step}"
        );
        assert!(node.records().await.is_empty(), "{step}");
        let j = node.journal();
        let released = j.iter().rposition(|l| l == "ipam DEL");
        assert!(
            released.is_some(),
            "{step}: the allocation is not released: {j:#?}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn del_releases_the_address_only_once_the_interface_is_gone() {
    let node = Node::new();
    node.add(CID, "eth0").await.unwrap();
    node.clear();
    node.del(CID, "eth0").await.unwrap();
    assert!(node.at("ipam START DEL") < node.at("dataplane pod: delete eth0"));
    assert!(node.at("dataplane pod: delete eth0") < node.at("ipam DEL"));
    node.at("record delete");
    assert!(node.records().await.is_empty());
    assert!(node.dataplane.host().state.lock().unwrap().links.is_empty());
    // Idempotent.
    node.del(CID, "eth0").await.unwrap();
}

/// The sandbox's netns is gone: the plain container's host veth (named
/// after it) goes, and the rest as usual.
#[tokio::test(flavor = "current_thread")]
async fn del_with_the_netns_gone_removes_the_host_veth() {
    let node = Node::new();
    node.add(CID, "eth0").await.unwrap();
    node.dataplane.remove_netns(NETNS);
    node.clear();
    node.del(CID, "eth0").await.unwrap();
    assert!(node.at(&format!("dataplane host: delete {VETH}")) < node.at("ipam DEL"));
    assert!(node.records().await.is_empty());
}

/// DEL completes its local part whatever else fails, and reports every
/// failure, with the most severe one's code.
#[tokio::test(flavor = "current_thread")]
async fn del_reports_every_failure() {
    let node = Node::new();
    node.add(CID, "eth0").await.unwrap();
    node.ipam.fail("DEL");
    node.dataplane.pod().state.lock().unwrap().fail_on = Some("pod: delete".into());
    let e = node.del(CID, "eth0").await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("injected DEL failure"), "{text}");
    assert!(text.contains("pod: delete eth0"), "{text}");
    assert!(matches!(e, Error::Several(ref v) if v.len() == 2), "{e:?}");
    assert_eq!(
        e.code(),
        crate::cni::error::code::DATAPLANE,
        "the first of equals"
    );
    // The record part still ran.
    assert!(node.records().await.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn check_finds_what_add_made_and_what_is_missing() {
    let node = Node::new();
    let result = node.add(CID, "eth0").await.unwrap();
    let mut conf = node.conf();
    conf["prevResult"] = result.to_version(crate::cni::Version::V1_1_0).unwrap();
    let check = |conf: Value| {
        let ctx = node.context("CHECK", CID, "eth0", &conf);
        async move { crate::plugin::cmd_check(&ctx, workload::of(&ctx)).await }
    };
    check(conf.clone()).await.unwrap();
    node.at("ipam CHECK");
    // An address prevResult names is not on the interface.
    let mut other = conf.clone();
    other["prevResult"]["ips"][0]["address"] = json!("10.0.0.9/32");
    let e = check(other).await.unwrap_err();
    assert!(e.to_string().contains("lacks address 10.0.0.9/32"), "{e}");
    // No record.
    let ctx = node.context("DEL", CID, "eth0", &node.conf());
    let name = ctx.endpoint_name().unwrap();
    let record = node.records().await.remove(0);
    node.store
        .delete::<WorkloadEndpoint>("default", &name, &Precondition::default())
        .await
        .unwrap();
    let e = check(conf.clone()).await.unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    node.store.create(&mut record.clone()).await.unwrap();
    check(conf.clone()).await.unwrap();
    // A host route gone.
    node.dataplane.host().state.lock().unwrap().routes.clear();
    let e = check(conf).await.unwrap_err();
    assert!(e.to_string().contains("host route 10.0.0.5/32"), "{e}");
}

/// GC with the valid attachments: another attachment's record and host
/// veth go, the valid one's stay; the IPAM collects with the same list.
#[tokio::test(flavor = "current_thread")]
async fn gc_collects_what_is_not_valid() {
    let node = Node::new();
    node.add(CID, "eth0").await.unwrap();
    // A sandbox lost without a DEL: its record and its host veth are left.
    let stale = "f6e5d4c3b2a1";
    let mut lost = node.records().await.remove(0);
    lost.metadata = crate::datastore::model::ObjectMeta::named(
        "default",
        &lost.metadata.name.replace(CID, stale),
    );
    lost.spec.container_id = stale.into();
    lost.spec.interface_name = "calif6e5d4c3b2a".into();
    node.store.create(&mut lost).await.unwrap();
    node.dataplane
        .host()
        .state
        .lock()
        .unwrap()
        .links
        .push(crate::dataplane::netlink::LinkState {
            index: 77,
            name: "calif6e5d4c3b2a".into(),
            mac: None,
            mtu: 1500,
            up: true,
        });
    *node.ipam.owners.lock().unwrap() = Some(vec![Owner {
        container_id: stale.into(),
        pod: None,
    }]);
    node.clear();
    let mut conf = node.conf();
    conf["cni.dev/valid-attachments"] = json!([{"containerID": CID, "ifname": "eth0"}]);
    let ctx = node.context("GC", "", "eth0", &conf);
    crate::plugin::cmd_gc(&ctx).await.unwrap();
    node.at("dataplane host: delete calif6e5d4c3b2a");
    node.at("record delete");
    node.at(&format!("ipam GC valid=[{CID:?}]"));
    let left: Vec<String> = node
        .records()
        .await
        .into_iter()
        .map(|w| w.spec.container_id)
        .collect();
    assert_eq!(left, [CID]);
    // Again: nothing more to do.
    node.clear();
    crate::plugin::cmd_gc(&ctx).await.unwrap();
    assert!(
        !node
            .journal()
            .iter()
            .any(|l| l.starts_with("record delete"))
    );
}
