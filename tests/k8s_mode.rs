//! Kubernetes mode end to end, as root: the built binary with K8S_POD_* args
//! against the in-repo test API server, real namespaces and Debian's
//! host-local; pod annotations, endpoint records and kernel state read back.

mod common;

use std::time::Duration;

use calico_cni::datastore::names::veth_name_for_workload;
use common::apiserver::{FakeApiServer, Fault};
use common::*;
use serde_json::{Value, json};

const POD_IP: &str = "cni.projectcalico.org/podIP";
const POD_IPS: &str = "cni.projectcalico.org/podIPs";
const CONTAINER_ID: &str = "cni.projectcalico.org/containerID";

/// A cluster: the test API server with ClusterInformation ready, namespace
/// `test` and a pod in it on `test-node`; and a plugin config pointing at it.
struct Cluster {
    /// A namespace of this test's own: host veth names derive from it, and
    /// tests run in parallel.
    ns: String,
    server: FakeApiServer,
    setup: Setup,
    conf: Value,
    kubeconfig: std::path::PathBuf,
}

impl Cluster {
    fn new(datastore: &str) -> Cluster {
        let server = FakeApiServer::start();
        server.put_custom(
            "crd.projectcalico.org",
            "v1",
            "clusterinformations",
            json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "ClusterInformation",
                   "metadata": {"name": "default"}, "spec": {"datastoreReady": true}}),
        );
        let ns = format!("t{}", unique());
        server.put_namespace(json!({"metadata": {"name": ns, "annotations": {}}}));
        let setup = Setup::new("1.0.0", false);
        let kubeconfig = write_kubeconfig(setup.dir.path(), &server.url(), json!({"token": "t"}));
        let mut conf = setup.conf.clone();
        conf["datastore_type"] = json!(datastore);
        conf["policy"] = json!({"type": "k8s"});
        conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
        conf["deadline_seconds"] = json!(3);
        Cluster {
            ns,
            server,
            setup,
            conf,
            kubeconfig,
        }
    }

    fn pod(&self, name: &str, annotations: Value) -> Value {
        self.server.put_pod(json!({
            "metadata": {"name": name, "namespace": self.ns, "generateName": "web-",
                         "labels": {"app": "web"}, "annotations": annotations},
            "spec": {"nodeName": "test-node", "serviceAccountName": "default",
                     "containers": [{"name": "c", "image": "i",
                                     "ports": [{"name": "anamedport", "containerPort": 555, "protocol": "TCP"}]}]}
        }))
    }

    fn run(&self, command: &str, pod: &str, container: &str, netns: &str) -> Outcome {
        self.run_with(command, pod, container, netns, &self.conf)
    }

    fn run_with(
        &self,
        command: &str,
        pod: &str,
        container: &str,
        netns: &str,
        conf: &Value,
    ) -> Outcome {
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container}",
            self.ns
        );
        self.setup.run_with(
            command,
            container,
            netns,
            "eth0",
            conf,
            &[("CNI_ARGS", &args)],
        )
    }

    fn veth(&self, pod: &str) -> String {
        veth_name_for_workload(&self.ns, pod, None)
    }

    fn annotations(&self, pod: &str) -> Value {
        self.server.pod(&self.ns, pod).unwrap()["metadata"]["annotations"].clone()
    }
}

fn pod_ip(result: &Value) -> String {
    result["ips"][0]["address"].as_str().unwrap().to_string()
}

#[test]
fn kdd_add_writes_pod_annotations_and_del_clears_them() {
    if !root_or_skip("kdd_add_writes_pod_annotations") {
        return;
    }
    let c = Cluster::new("kubernetes");
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    c.server.reset_requests();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    let requests = c.server.requests();
    let ip = pod_ip(&result);
    assert!(ip.ends_with("/32"));
    let veth = c.veth("pod1");
    assert_eq!(result["interfaces"][0]["name"], json!(veth));
    assert!(host_link_exists(&veth));
    let ann = c.annotations("pod1");
    assert_eq!(ann[POD_IP], json!(ip));
    assert_eq!(ann[POD_IPS], json!(ip));
    assert_eq!(ann[CONTAINER_ID], json!(cid));
    // The happy path's API requests (README: "API requests per ADD").
    let summary: Vec<String> = requests
        .iter()
        .map(|(m, p)| format!("{m} {}", p.split('?').next().unwrap_or(p)))
        .collect();
    assert_eq!(
        summary,
        vec![
            "GET /apis/crd.projectcalico.org/v1/clusterinformations/default".to_string(),
            format!("GET /api/v1/namespaces/{}/pods/pod1", c.ns),
            format!("GET /api/v1/namespaces/{}", c.ns),
            format!("GET /api/v1/namespaces/{}/pods/pod1", c.ns),
            format!("PATCH /api/v1/namespaces/{}/pods/pod1/status", c.ns),
        ],
        "{summary:#?}"
    );

    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    let ann = c.annotations("pod1");
    assert_eq!(ann[POD_IP], "");
    assert_eq!(ann[POD_IPS], "");
    assert_eq!(
        ann[CONTAINER_ID],
        json!(cid),
        "containerID is left in place"
    );
    assert!(!host_link_exists(&veth));
    assert!(c.setup.reservations().is_empty());
    // DEL again: idempotent.
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
}

#[test]
fn policy_k8s_on_the_embedded_store_records_calicos_endpoint() {
    if !root_or_skip("policy_k8s_on_the_embedded_store") {
        return;
    }
    let c = Cluster::new("local");
    c.pod(
        "pod1",
        json!({"cni.projectcalico.org/allowedSourcePrefixes": "[\"8.8.8.8/32\",\"1.1.1.5/24\"]"}),
    );
    let ns = Netns::new();
    let cid = container_id();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    let weps = c.setup.endpoints();
    assert_eq!(weps.len(), 1);
    let w = &weps[0];
    assert_eq!(w["metadata"]["name"], "test--node-k8s-pod1-eth0");
    assert_eq!(w["metadata"]["namespace"], json!(c.ns));
    assert_eq!(w["metadata"]["generateName"], "web-");
    let labels = &w["metadata"]["labels"];
    assert_eq!(labels["app"], "web");
    assert_eq!(labels["projectcalico.org/namespace"], json!(c.ns));
    assert_eq!(labels["projectcalico.org/orchestrator"], "k8s");
    assert_eq!(labels["projectcalico.org/serviceaccount"], "default");
    assert_eq!(
        w["spec"]["profiles"],
        json!([format!("kns.{}", c.ns), format!("ksa.{}.default", c.ns)])
    );
    assert_eq!(w["spec"]["serviceAccountName"], "default");
    assert_eq!(w["spec"]["pod"], "pod1");
    assert_eq!(w["spec"]["containerID"], json!(cid));
    assert_eq!(w["spec"]["ipNetworks"], json!([pod_ip(&result)]));
    assert_eq!(
        w["spec"]["ports"],
        json!([{"name": "anamedport", "protocol": "TCP", "port": 555, "hostPort": 0, "hostIP": ""}])
    );
    assert_eq!(
        w["spec"]["allowSpoofedSourcePrefixes"],
        json!(["8.8.8.8/32", "1.1.1.0/24"])
    );
    // Host sysctls of §11 item 34.
    let veth = c.veth("pod1");
    assert_eq!(host_sysctl(&format!("net/ipv6/conf/{veth}/accept_ra")), "0");
    assert_eq!(
        host_sysctl(&format!("net/ipv4/conf/{veth}/route_localnet")),
        "1"
    );
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert!(c.setup.endpoints().is_empty());
}

#[test]
fn races_leave_the_newer_sandbox_alone() {
    if !root_or_skip("races_leave_the_newer_sandbox_alone") {
        return;
    }
    let c = Cluster::new("kubernetes");
    c.pod("pod1", json!({}));
    let veth = c.veth("pod1");

    // ADD X, ADD Y, DEL X.
    let (nx, ny) = (Netns::new(), Netns::new());
    let (x, y) = (container_id(), container_id());
    c.run("ADD", "pod1", &x, &nx.path()).assert_ok();
    let ry = c.run("ADD", "pod1", &y, &ny.path()).assert_ok().json();
    c.run("DEL", "pod1", &x, &nx.path()).assert_ok();
    let ann = c.annotations("pod1");
    assert_eq!(ann[CONTAINER_ID], json!(y));
    assert_eq!(ann[POD_IP], json!(pod_ip(&ry)));
    assert!(host_link_exists(&veth), "Y's veth is intact");
    assert_eq!(
        ny.ip_json(&["link", "show", "dev", "eth0"])
            .as_array()
            .map_or(0, |a| a.len()),
        1
    );
    assert_eq!(
        c.setup.reservations().len(),
        1,
        "Y's address is still reserved"
    );
    c.run("DEL", "pod1", &y, &ny.path()).assert_ok();
    assert_eq!(c.annotations("pod1")[POD_IP], "");

    // ADD X, DEL X, ADD Y, DEL X (a stale DEL after the new sandbox).
    let (x, y) = (container_id(), container_id());
    c.run("ADD", "pod1", &x, &nx.path()).assert_ok();
    c.run("DEL", "pod1", &x, &nx.path()).assert_ok();
    let ry = c.run("ADD", "pod1", &y, &ny.path()).assert_ok().json();
    c.run("DEL", "pod1", &x, &nx.path()).assert_ok();
    let ann = c.annotations("pod1");
    assert_eq!(ann[CONTAINER_ID], json!(y));
    assert_eq!(ann[POD_IP], json!(pod_ip(&ry)));
    assert!(host_link_exists(&veth));
    assert_eq!(c.setup.reservations().len(), 1);
    c.run("DEL", "pod1", &y, &ny.path()).assert_ok();
    assert!(!host_link_exists(&veth));
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn api_server_down_or_hanging() {
    if !root_or_skip("api_server_down_or_hanging") {
        return;
    }
    let c = Cluster::new("kubernetes");
    c.pod("pod1", json!({}));
    let veth = c.veth("pod1");
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();

    for fault in [Fault::Hang, Fault::ServerError] {
        // ADD of another sandbox fails within the deadline and leaves nothing.
        c.server.set_fault(fault.clone());
        let other = Netns::new();
        let started = std::time::Instant::now();
        let out = c.run("ADD", "pod1", &container_id(), &other.path());
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{fault:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(out.code, 1, "{fault:?}");
        assert!(
            other
                .ip_json(&["link", "show", "dev", "eth0"])
                .as_array()
                .is_none_or(|a| a.is_empty())
        );
        assert_eq!(
            c.setup.reservations().len(),
            1,
            "{fault:?}: only the first pod's address"
        );
        c.server.set_fault(Fault::None);
    }

    // DEL while the API server hangs: the local teardown completes, the
    // record is left for a later DEL, and the outcome is an error.
    c.server.set_fault(Fault::Hang);
    let started = std::time::Instant::now();
    let out = c.run("DEL", "pod1", &cid, &ns.path());
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.code, 1);
    assert!(!host_link_exists(&veth), "veth removed");
    assert!(c.setup.reservations().is_empty(), "address released");
    c.server.set_fault(Fault::None);
    assert_eq!(
        c.annotations("pod1")[CONTAINER_ID],
        json!(cid),
        "record untouched"
    );
    // A later DEL finishes the record.
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert_eq!(c.annotations("pod1")[POD_IP], "");
}

#[test]
fn annotation_rules_refuse_before_anything_changes() {
    if !root_or_skip("annotation_rules_refuse") {
        return;
    }
    let c = Cluster::new("kubernetes");
    for (annotations, expect) in [
        (
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.0.0.1\"]"}),
            "ipAddrs is not compatible with configured IPAM: host-local",
        ),
        (
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.0.0.1\"]", "cni.projectcalico.org/ipAddrsNoIpam": "[\"10.0.0.1\"]"}),
            "can't have both annotations",
        ),
        (
            json!({"cni.projectcalico.org/hwAddr": "invalid MAC address"}),
            "cni.projectcalico.org/hwAddr",
        ),
        (
            json!({"cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\"]"}),
            "requested feature is not enabled: floating_ips",
        ),
        (
            json!({"cni.projectcalico.org/allowedSourcePrefixes": "[\"nope\"]"}),
            "nope",
        ),
    ] {
        c.pod("pod1", annotations.clone());
        let ns = Netns::new();
        let cid = container_id();
        let out = c.run("ADD", "pod1", &cid, &ns.path());
        assert_eq!(out.code, 1, "{annotations}");
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(msg.contains(expect), "{annotations}: {msg}");
        assert!(!host_link_exists(&c.veth("pod1")));
        assert!(c.setup.reservations().is_empty());
        assert!(c.annotations("pod1").get(POD_IP).is_none());
    }
}

#[test]
fn hw_addr_and_floating_ips() {
    if !root_or_skip("hw_addr_and_floating_ips") {
        return;
    }
    let mut c = Cluster::new("local");
    c.conf["feature_control"] = json!({"floating_ips": true});
    c.pod(
        "pod1",
        json!({"cni.projectcalico.org/hwAddr": "ca:fe:ca:fe:ca:fe", "cni.projectcalico.org/floatingIPs": "[\"1.1.1.1\"]"}),
    );
    let ns = Netns::new();
    let cid = container_id();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    let link = &ns.ip_json(&["link", "show", "dev", "eth0"])[0];
    assert_eq!(link["address"], "ca:fe:ca:fe:ca:fe");
    let w = &c.setup.endpoints()[0];
    let internal = pod_ip(&result).split('/').next().unwrap().to_string();
    assert_eq!(
        w["spec"]["ipNATs"],
        json!([{"internalIP": internal, "externalIP": "1.1.1.1"}])
    );
    assert_eq!(w["spec"]["mac"], "ca:fe:ca:fe:ca:fe");
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
}

#[test]
fn use_pod_cidr_takes_the_nodes_pod_cidr_and_custom_routes() {
    if !root_or_skip("use_pod_cidr") {
        return;
    }
    let mut c = Cluster::new("kubernetes");
    c.server.put_node(
        json!({"metadata": {"name": "test-node"}, "spec": {"podCIDRs": ["10.242.7.0/24"]}}),
    );
    c.conf["ipam"]["ranges"] = json!([[{"subnet": "usePodCidr"}]]);
    c.conf["ipam"]["routes"] = json!([{"dst": "10.123.0.0/16"}, {"dst": "10.124.0.0/16"}]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    assert!(pod_ip(&result).starts_with("10.242.7."), "{result}");
    let routes: Vec<String> = ns
        .ip_json(&["-4", "route"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dst"].as_str().unwrap().to_string())
        .collect();
    assert!(
        routes.contains(&"10.123.0.0/16".to_string())
            && routes.contains(&"10.124.0.0/16".to_string()),
        "{routes:?}"
    );
    assert!(
        !routes.contains(&"default".to_string()),
        "no default route without include_default_routes: {routes:?}"
    );
    // DEL releases with the usePodCidr placeholder rewritten.
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert!(c.setup.reservations().is_empty());
    let _ = &c.kubeconfig;
}

#[test]
fn readiness_gates_service_account_and_more_annotation_checks() {
    if !root_or_skip("readiness_gates_service_account") {
        return;
    }
    let mut c = Cluster::new("local");
    // A gate that answers 200 (the test server's /version) lets ADD through.
    c.conf["readiness_gates"] = json!([format!("{}/version", c.server.url())]);
    c.server.put_pod(json!({
        "metadata": {"name": "pod2", "namespace": c.ns},
        "spec": {"nodeName": "test-node", "serviceAccountName": "testserviceaccount",
                 "containers": [{"name": "c", "image": "i"}]}
    }));
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod2", &cid, &ns.path()).assert_ok();
    let w = &c.setup.endpoints()[0];
    assert_eq!(
        w["spec"]["profiles"],
        json!([
            format!("kns.{}", c.ns),
            format!("ksa.{}.testserviceaccount", c.ns)
        ])
    );
    assert_eq!(
        w["metadata"]["labels"]["projectcalico.org/serviceaccount"],
        "testserviceaccount"
    );
    c.run("DEL", "pod2", &cid, &ns.path()).assert_ok();

    // A gate given as a string is a config error; a closed gate times out.
    let mut bad = c.conf.clone();
    bad["readiness_gates"] = json!("http://127.0.0.1:9/x");
    assert_eq!(
        c.run_with("ADD", "pod2", &container_id(), &ns.path(), &bad)
            .error_code(),
        7
    );
    let mut closed = c.conf.clone();
    closed["readiness_gates"] = json!(["http://127.0.0.1:9/never"]);
    closed["deadline_seconds"] = json!(1);
    assert_eq!(
        c.run_with("ADD", "pod2", &container_id(), &ns.path(), &closed)
            .error_code(),
        11
    );

    // ipAddrsNoIpam needs calico-ipam and its feature flag.
    c.server.put_pod(json!({
        "metadata": {"name": "pod3", "namespace": c.ns,
                     "annotations": {"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.0.0.1\"]"}},
        "spec": {"nodeName": "test-node", "containers": [{"name": "c", "image": "i"}]}
    }));
    c.conf["readiness_gates"] = json!([]);
    let out = c.run("ADD", "pod3", &container_id(), &ns.path());
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap()
            .contains("ipAddrsNoIpam is not compatible with configured IPAM: host-local"),
        "{}",
        out.stdout
    );
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn second_interface_keeps_the_endpoint_and_similar_pod_names_stay_apart() {
    if !root_or_skip("second_interface_keeps_the_endpoint") {
        return;
    }
    let c = Cluster::new("local");
    c.pod("pod1", json!({}));
    c.pod("pod1-1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();
    // The same container ADDed again on eth1: the endpoint keeps eth0.
    let args = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
        c.ns
    );
    c.setup
        .run_with(
            "ADD",
            &cid,
            &ns.path(),
            "eth1",
            &c.conf,
            &[("CNI_ARGS", &args)],
        )
        .assert_ok();
    let weps = c.setup.endpoints();
    assert_eq!(weps.len(), 1, "{weps:#?}");
    assert_eq!(weps[0]["spec"]["endpoint"], "eth0");
    assert_eq!(weps[0]["metadata"]["name"], "test--node-k8s-pod1-eth0");
    // A pod named like it (pod1-1) gets its own endpoint.
    let ns2 = Netns::new();
    let cid2 = container_id();
    c.run("ADD", "pod1-1", &cid2, &ns2.path()).assert_ok();
    let names: Vec<Value> = c
        .setup
        .endpoints()
        .iter()
        .map(|w| w["metadata"]["name"].clone())
        .collect();
    assert_eq!(
        names,
        vec![
            json!("test--node-k8s-pod1--1-eth0"),
            json!("test--node-k8s-pod1-eth0")
        ]
    );
    c.setup
        .run_with(
            "DEL",
            &cid,
            &ns.path(),
            "eth1",
            &c.conf,
            &[("CNI_ARGS", &args)],
        )
        .assert_ok();
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    c.run("DEL", "pod1-1", &cid2, &ns2.path()).assert_ok();
    assert!(c.setup.endpoints().is_empty());
    assert!(
        c.setup.reservations().is_empty(),
        "{:?}",
        c.setup.reservations()
    );
}

#[test]
fn explicit_ip_from_the_pod_cidr_is_given_again_after_del() {
    if !root_or_skip("explicit_ip_from_the_pod_cidr") {
        return;
    }
    let mut c = Cluster::new("kubernetes");
    c.server.put_node(
        json!({"metadata": {"name": "test-node"}, "spec": {"podCIDRs": ["10.241.0.0/24"]}}),
    );
    c.conf["ipam"]["ranges"] = json!([[{"subnet": "usePodCidr"}]]);
    c.conf["include_default_routes"] = json!(true);
    c.conf["ipam"]["routes"] = json!([{"dst": "10.123.0.0/16"}]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    for _ in 0..2 {
        let cid = container_id();
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid};IP=10.241.0.42",
            c.ns
        );
        let r = c
            .setup
            .run_with(
                "ADD",
                &cid,
                &ns.path(),
                "eth0",
                &c.conf,
                &[("CNI_ARGS", &args)],
            )
            .assert_ok()
            .json();
        assert_eq!(pod_ip(&r), "10.241.0.42/32");
        let routes: Vec<String> = ns
            .ip_json(&["-4", "route"])
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["dst"].as_str().unwrap().to_string())
            .collect();
        assert!(
            routes.contains(&"default".to_string())
                && routes.contains(&"10.123.0.0/16".to_string()),
            "{routes:?}"
        );
        c.setup
            .run_with(
                "DEL",
                &cid,
                &ns.path(),
                "eth0",
                &c.conf,
                &[("CNI_ARGS", &args)],
            )
            .assert_ok();
    }
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn dual_pod_cidrs_and_two_ipv4_ranges() {
    if !root_or_skip("dual_pod_cidrs_and_two_ipv4_ranges") {
        return;
    }
    let mut c = Cluster::new("kubernetes");
    c.server.put_node(json!({"metadata": {"name": "test-node"},
        "spec": {"podCIDRs": ["10.240.10.0/24", "fd00:dead:beef::/96"]}}));
    c.conf["ipam"]["ranges"] = json!([
        [{"subnet": "usePodCidr"}],
        [{"subnet": "usePodCidrIPv6"}],
        [{"subnet": "10.240.100.0/24"}]
    ]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let r = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    assert_eq!(r["ips"].as_array().unwrap().len(), 3, "{r}");
    let v6_default = ns.ip_json(&["-6", "route", "show", "default"]);
    assert_eq!(v6_default[0]["gateway"], "fe80::ecee:eeff:feee:eeee");
    let addrs = &ns.ip_json(&["addr", "show", "dev", "eth0"])[0]["addr_info"];
    let global_v4 = addrs
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet" && a["scope"] == "global")
        .count();
    assert_eq!(global_v4, 2, "one IPv4 address per IPv4 range");
    assert!(
        addrs
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a.get("tentative").is_none()),
        "{addrs}"
    );
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn calico_ipam_annotation_validation_errors() {
    if !root_or_skip("calico_ipam_annotation_validation_errors") {
        return;
    }
    let mut c = Cluster::new("kubernetes");
    c.conf["ipam"] = json!({"type": "calico-ipam"});
    // calico-ipam is this binary under another name.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(CALICO, bin.path().join("calico-ipam")).unwrap();
    let cni_path = format!("{}:{CNI_BIN}", bin.path().display());
    for (namespace_annotations, pod_annotations, expect) in [
        (
            json!({"cni.projectcalico.org/ipFamilies": "[\"IPv5\"]"}),
            json!({}),
            "error parsing ipFamilies",
        ),
        (
            json!({"cni.projectcalico.org/ipv4pools": "not json"}),
            json!({}),
            "ipv4pools",
        ),
        (
            json!({}),
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.0.0.300\"]"}),
            "invalid IP format: 10.0.0.300",
        ),
        (
            json!({}),
            json!({"cni.projectcalico.org/ipAddrs": "[]"}),
            "specified but empty",
        ),
        (
            json!({}),
            json!({"cni.projectcalico.org/ipAddrs": "[\"10.0.0.1\",\"10.0.0.2\"]"}),
            "cannot have more than one IPv4 address",
        ),
        (
            json!({}),
            json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.0.0.1\"]"}),
            "requested feature is not enabled: ip_addrs_no_ipam",
        ),
    ] {
        c.server.put_namespace(
            json!({"metadata": {"name": c.ns, "annotations": namespace_annotations}}),
        );
        c.pod("pod1", pod_annotations.clone());
        let ns = Netns::new();
        let cid = container_id();
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
            c.ns
        );
        let out = c.setup.run_with(
            "ADD",
            &cid,
            &ns.path(),
            "eth0",
            &c.conf,
            &[("CNI_ARGS", &args), ("CNI_PATH", &cni_path)],
        );
        assert_eq!(out.code, 1, "{pod_annotations}");
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(
            msg.contains(expect),
            "{namespace_annotations} {pod_annotations}: {msg}"
        );
        assert!(!host_link_exists(&c.veth("pod1")));
        assert!(c.annotations("pod1").get(POD_IP).is_none());
    }
}
