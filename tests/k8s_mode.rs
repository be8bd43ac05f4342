//! Kubernetes mode end to end, as root: the built binary with K8S_POD_* args
//! against the test bed's real kube-apiserver, with the CNI's own token and
//! RBAC, through the fault proxy (which logs every request and stages the
//! faults a real server cannot be asked for); real namespaces, Debian's
//! host-local; pod annotations read back through the API, endpoint records
//! and kernel state read back.

mod common;

use std::time::{Duration, Instant};

use calico_cni::datastore::names::veth_name_for_workload;
use common::faultproxy::{Fault, FaultProxy, Rule};
use common::testbed::{Namespace, Node, Testbed, testbed};
use common::*;
use serde_json::{Value, json};

const POD_IP: &str = "cni.projectcalico.org/podIP";
const POD_IPS: &str = "cni.projectcalico.org/podIPs";
const CONTAINER_ID: &str = "cni.projectcalico.org/containerID";

/// A cluster: the test bed with a namespace of this test's own (host veth
/// names derive from it, and tests run in parallel), the fault proxy in
/// front of the API server, and a plugin config that reaches the API server
/// through the proxy with the CNI's token.
struct Cluster {
    bed: &'static Testbed,
    ns: Namespace,
    /// The node the pods are bound to (and the plugin's nodename).
    node: String,
    proxy: FaultProxy,
    setup: Setup,
    conf: Value,
}

impl Cluster {
    /// `None` when the test cannot run (see `testbed`).
    fn new(test: &str, datastore: &str) -> Option<Cluster> {
        if !root_or_skip(test) {
            return None;
        }
        let bed = testbed(test)?;
        let ns = bed.namespace(json!({}), json!({}));
        let proxy = FaultProxy::start(
            bed.api(),
            &bed.ca(),
            bed.var("TESTBED_PROXY_CERT").as_ref(),
            bed.var("TESTBED_PROXY_KEY").as_ref(),
        );
        let setup = Setup::new("1.0.0", false);
        let kubeconfig = bed.kubeconfig(
            setup.dir.path(),
            "calico-kubeconfig",
            &proxy.url(),
            json!({"token": bed.cni_token()}),
        );
        let mut conf = setup.conf.clone();
        conf["datastore_type"] = json!(datastore);
        conf["policy"] = json!({"type": "k8s"});
        conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
        conf["deadline_seconds"] = json!(3);
        Some(Cluster {
            bed,
            ns,
            node: "test-node".into(),
            proxy,
            setup,
            conf,
        })
    }

    /// Binds the pods to a real Node of this test's own, which
    /// kube-controller-manager gave its pod CIDRs; the plugin's nodename.
    fn with_node(&mut self) -> Node {
        let node = self.bed.node(&format!("node-{}", unique()));
        self.node = node.name.clone();
        self.conf["nodename"] = json!(node.name);
        node
    }

    /// Creates pod `name` (labels, a named port, the default service account).
    fn pod(&self, name: &str, annotations: Value) -> Value {
        self.pod_with(name, annotations, "default")
    }

    fn pod_with(&self, name: &str, annotations: Value, service_account: &str) -> Value {
        self.ns.create_pod(json!({
            "metadata": {"name": name, "generateName": "web-",
                         "labels": {"app": "web"}, "annotations": annotations},
            "spec": {"nodeName": self.node, "serviceAccountName": service_account,
                     "containers": [{"name": "c", "image": "i",
                                     "ports": [{"name": "anamedport", "containerPort": 555, "protocol": "TCP"}]}]}
        }))
    }

    /// Replaces the namespace's annotations.
    fn set_namespace_annotations(&self, annotations: Value) {
        let (code, v) = self.bed.admin_typed(
            "PATCH",
            &format!("/api/v1/namespaces/{}", self.ns.name),
            Some(&json!([{"op": "add", "path": "/metadata/annotations", "value": annotations}])),
            "application/json-patch+json",
        );
        assert_eq!(code, 200, "{v}");
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
        self.run_args(command, pod, container, netns, conf, "eth0", "")
    }

    /// With interface `ifname` and `extra` CNI_ARGS (`;IP=..`).
    #[allow(clippy::too_many_arguments)]
    fn run_args(
        &self,
        command: &str,
        pod: &str,
        container: &str,
        netns: &str,
        conf: &Value,
        ifname: &str,
        extra: &str,
    ) -> Outcome {
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={container}{extra}",
            self.ns.name
        );
        self.setup.run_with(
            command,
            container,
            netns,
            ifname,
            conf,
            &[("CNI_ARGS", &args)],
        )
    }

    /// The config with a kubeconfig of its own (through the proxy) whose
    /// user entry is `user`; the kubeconfig's path.
    fn conf_with_user(&self, name: &str, user: Value) -> (Value, std::path::PathBuf) {
        let kc = self
            .bed
            .kubeconfig(self.setup.dir.path(), name, &self.proxy.url(), user);
        let mut conf = self.conf.clone();
        conf["kubernetes"]["kubeconfig"] = json!(kc);
        (conf, kc)
    }

    fn veth(&self, pod: &str) -> String {
        veth_name_for_workload(&self.ns.name, pod, None)
    }

    fn annotations(&self, pod: &str) -> Value {
        self.ns.pod(pod).expect("pod")["metadata"]["annotations"].clone()
    }
}

fn pod_ip(result: &Value) -> String {
    result["ips"][0]["address"].as_str().unwrap().to_string()
}

#[test]
fn kdd_add_writes_pod_annotations_and_del_clears_them() {
    let Some(c) = Cluster::new("kdd_add_writes_pod_annotations", "kubernetes") else {
        return;
    };
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let before = c.proxy.requests().len();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    let requests = c.proxy.requests()[before..].to_vec();
    let ip = pod_ip(&result);
    assert!(ip.ends_with("/32"));
    let veth = c.veth("pod1");
    assert_eq!(result["interfaces"][0]["name"], json!(veth));
    assert!(host_link_exists(&veth));
    let ann = c.annotations("pod1");
    assert_eq!(ann[POD_IP], json!(ip));
    assert_eq!(ann[POD_IPS], json!(ip));
    assert_eq!(ann[CONTAINER_ID], json!(cid));
    // The happy path's API requests (README: "API requests per ADD"): the
    // readiness check, the pod and its namespace at once, then the patch.
    let mut summary: Vec<String> = requests
        .iter()
        .map(|(m, p)| format!("{m} {}", p.split('?').next().unwrap_or(p)))
        .collect();
    assert_eq!(
        summary.last().map(String::as_str),
        Some(format!("PATCH /api/v1/namespaces/{}/pods/pod1/status", c.ns.name).as_str()),
        "{summary:#?}"
    );
    summary.sort();
    let mut expected = vec![
        "GET /apis/crd.projectcalico.org/v1/clusterinformations/default".to_string(),
        format!("GET /api/v1/namespaces/{}/pods/pod1", c.ns.name),
        format!("GET /api/v1/namespaces/{}", c.ns.name),
        format!("PATCH /api/v1/namespaces/{}/pods/pod1/status", c.ns.name),
    ];
    expected.sort();
    assert_eq!(summary, expected);

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
    let Some(c) = Cluster::new("policy_k8s_on_the_embedded_store", "local") else {
        return;
    };
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
    assert_eq!(w["metadata"]["namespace"], json!(c.ns.name));
    assert_eq!(w["metadata"]["generateName"], "web-");
    let labels = &w["metadata"]["labels"];
    assert_eq!(labels["app"], "web");
    assert_eq!(labels["projectcalico.org/namespace"], json!(c.ns.name));
    assert_eq!(labels["projectcalico.org/orchestrator"], "k8s");
    assert_eq!(labels["projectcalico.org/serviceaccount"], "default");
    assert_eq!(
        w["spec"]["profiles"],
        json!([
            format!("kns.{}", c.ns.name),
            format!("ksa.{}.default", c.ns.name)
        ])
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
    let Some(c) = Cluster::new("races_leave_the_newer_sandbox_alone", "kubernetes") else {
        return;
    };
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
    let Some(c) = Cluster::new("api_server_down_or_hanging", "kubernetes") else {
        return;
    };
    c.pod("pod1", json!({}));
    let veth = c.veth("pod1");
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();

    for fault in [
        Fault::Hang,
        Fault::Delay(Duration::from_secs(4)),
        Fault::Reset,
        Fault::Status(500),
        Fault::Status(503),
        Fault::Status(429),
    ] {
        // ADD of another sandbox fails within the deadline and leaves nothing.
        c.proxy.push(Rule::always(fault.clone()));
        let other = Netns::new();
        let started = std::time::Instant::now();
        let out = c.run("ADD", "pod1", &container_id(), &other.path());
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{fault:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(out.code, 1, "{fault:?}");
        let code = out.error_code();
        if matches!(fault, Fault::Hang | Fault::Delay(_)) {
            assert_eq!(
                code, 11,
                "{fault:?}: a timeout is 'try again later': {}",
                out.stdout
            );
        }
        assert!(
            other
                .ip_json(&["link", "show"])
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["ifname"] != "eth0"),
            "{fault:?}: no eth0 left"
        );
        assert_eq!(
            c.setup.reservations().len(),
            1,
            "{fault:?}: only the first pod's address"
        );
        c.proxy.clear();
        assert_eq!(
            c.annotations("pod1")[CONTAINER_ID],
            json!(cid),
            "{fault:?}: the first sandbox's record is untouched"
        );
    }

    // DEL while the API server hangs: the local teardown completes, the
    // record is left for a later DEL, and the outcome is an error.
    c.proxy.push(Rule::always(Fault::Hang));
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
    c.proxy.clear();
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
    let Some(c) = Cluster::new("annotation_rules_refuse", "kubernetes") else {
        return;
    };
    for (i, (annotations, expect)) in [
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
    ]
    .into_iter()
    .enumerate()
    {
        let pod = format!("pod{i}");
        c.pod(&pod, annotations.clone());
        let ns = Netns::new();
        let cid = container_id();
        let out = c.run("ADD", &pod, &cid, &ns.path());
        assert_eq!(out.code, 1, "{annotations}");
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(msg.contains(expect), "{annotations}: {msg}");
        assert!(!host_link_exists(&c.veth(&pod)));
        assert!(c.setup.reservations().is_empty());
        assert!(c.annotations(&pod).get(POD_IP).is_none());
    }
}

#[test]
fn hw_addr_and_floating_ips() {
    let Some(mut c) = Cluster::new("hw_addr_and_floating_ips", "local") else {
        return;
    };
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
    let Some(mut c) = Cluster::new("use_pod_cidr", "kubernetes") else {
        return;
    };
    let node = c.with_node();
    let pod_cidr: ipnet::Ipv4Net = node.pod_cidr().parse().unwrap();
    c.conf["ipam"]["ranges"] = json!([[{"subnet": "usePodCidr"}]]);
    c.conf["ipam"]["routes"] = json!([{"dst": "10.123.0.0/16"}, {"dst": "10.124.0.0/16"}]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let before = c.proxy.requests().len();
    let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    let ip: ipnet::Ipv4Net = pod_ip(&result).parse().unwrap();
    assert!(
        pod_cidr.contains(&ip.addr()),
        "{ip} from the node's podCIDR {pod_cidr} (kube-controller-manager's)"
    );
    assert!(
        c.proxy.requests()[before..]
            .iter()
            .any(|(m, p)| m == "GET" && p.starts_with(&format!("/api/v1/nodes/{}", node.name))),
        "the Node was read"
    );
    let routes: Vec<String> = ns.route_dsts();
    assert!(
        routes.contains(&"10.123.0.0/16".to_string())
            && routes.contains(&"10.124.0.0/16".to_string()),
        "{routes:?}"
    );
    assert!(
        !routes.contains(&"default".to_string()),
        "no default route without include_default_routes: {routes:?}"
    );
    assert_eq!(c.annotations("pod1")[POD_IP], json!(ip.to_string()));
    // DEL releases with the usePodCidr placeholder rewritten.
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert!(c.setup.reservations().is_empty());
}

/// Every range layout with `usePodCidr` that Calico accepts, with Debian's
/// host-local (1.1.1) and upstream's (1.9.1, the peers build): ADD takes
/// the Node's pod CIDRs, CHECK passes (the placeholders are made valid for
/// it as for DEL), and DEL releases the reservation (its placeholders
/// overlap no other range, which upstream host-local would refuse: "range
/// set 0 overlaps with 1", and the address would stay reserved forever).
#[test]
fn use_pod_cidr_layouts_check_and_release_with_both_host_locals() {
    let test = "use_pod_cidr_layouts_check_and_release_with_both_host_locals";
    let Some(mut c) = Cluster::new(test, "kubernetes") else {
        return;
    };
    let Some(upstream) = common::testbed::peer(test, "host-local") else {
        return;
    };
    let upstream_dir = upstream.parent().unwrap().display().to_string();
    let node = c.with_node();
    let cidrs = node.get()["spec"]["podCIDRs"].clone();
    let pod_v4: ipnet::IpNet = cidrs[0].as_str().unwrap().parse().unwrap();
    let extra = format!("{}/24", c.setup.subnet.trim_end_matches("/24"));
    let layouts = [
        json!({"subnet": "usePodCidr"}),
        json!({"ranges": [[{"subnet": "usePodCidr"}]]}),
        json!({"ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]]}),
        json!({"ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}], [{"subnet": extra}]]}),
        json!({"ranges": [[{"subnet": extra}], [{"subnet": "usePodCidr"}]],
               "routes": [{"dst": "10.123.0.0/16"}], "include_default_routes": true}),
        json!({"subnet": "usePodCidr", "ranges": [[{"subnet": "usePodCidrIPv6"}]]}),
    ];
    c.pod("pod1", json!({}));
    for cni_path in [CNI_BIN.to_string(), upstream_dir] {
        for layout in &layouts {
            let mut conf = c.conf.clone();
            let data_dir = conf["ipam"]["dataDir"].clone();
            conf["ipam"] = json!({"type": "host-local", "dataDir": data_dir});
            for (k, v) in layout.as_object().unwrap() {
                if k == "include_default_routes" {
                    conf[k] = v.clone();
                } else {
                    conf["ipam"][k] = v.clone();
                }
            }
            let ns = Netns::new();
            let cid = container_id();
            let args = format!(
                "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
                c.ns.name
            );
            let run = |command: &str, conf: &Value| {
                c.setup.run_with(
                    command,
                    &cid,
                    &ns.path(),
                    "eth0",
                    conf,
                    &[("CNI_ARGS", &args), ("CNI_PATH", &cni_path)],
                )
            };
            let what = format!("{cni_path} {layout}");
            let result = run("ADD", &conf).assert_ok().json();
            let ips: Vec<ipnet::IpNet> = result["ips"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["address"].as_str().unwrap().parse().unwrap())
                .collect();
            assert!(
                ips.iter().any(|ip| pod_v4.contains(&ip.addr())),
                "{what}: {ips:?} from {pod_v4}"
            );
            assert!(!c.setup.reservations().is_empty(), "{what}");
            let mut check = conf.clone();
            check["prevResult"] = result.clone();
            let out = run("CHECK", &check);
            assert_eq!(out.code, 0, "{what}: CHECK {out:?}");
            run("DEL", &conf).assert_ok();
            assert!(
                c.setup.reservations().is_empty(),
                "{what}: DEL left {:?}",
                c.setup.reservations()
            );
            assert!(ns.link("eth0").is_none(), "{what}");
        }
    }
}

/// A plain-HTTP readiness gate on loopback answering `status` to every
/// request, until the process ends.
fn readiness_gate(status: u16) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/ready", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            let _ = std::io::Write::write_all(
                &mut conn,
                format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    url
}

#[test]
fn readiness_gates_service_account_and_more_annotation_checks() {
    let Some(mut c) = Cluster::new("readiness_gates_service_account", "local") else {
        return;
    };
    // A gate that answers 200 lets ADD through.
    c.conf["readiness_gates"] = json!([readiness_gate(200)]);
    c.pod_with("pod2", json!({}), "testserviceaccount");
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod2", &cid, &ns.path()).assert_ok();
    let w = &c.setup.endpoints()[0];
    assert_eq!(
        w["spec"]["profiles"],
        json!([
            format!("kns.{}", c.ns.name),
            format!("ksa.{}.testserviceaccount", c.ns.name)
        ])
    );
    assert_eq!(
        w["metadata"]["labels"]["projectcalico.org/serviceaccount"],
        "testserviceaccount"
    );
    c.run("DEL", "pod2", &cid, &ns.path()).assert_ok();

    // A gate given as a string is a config error; a gate that never says
    // ready (503), or is closed, times out.
    let mut bad = c.conf.clone();
    bad["readiness_gates"] = json!("http://127.0.0.1:9/x");
    assert_eq!(
        c.run_with("ADD", "pod2", &container_id(), &ns.path(), &bad)
            .error_code(),
        7
    );
    for gate in [readiness_gate(503), "http://127.0.0.1:9/never".to_string()] {
        let mut closed = c.conf.clone();
        closed["readiness_gates"] = json!([gate]);
        closed["deadline_seconds"] = json!(1);
        assert_eq!(
            c.run_with("ADD", "pod2", &container_id(), &ns.path(), &closed)
                .error_code(),
            11
        );
    }

    // ipAddrsNoIpam needs calico-ipam and its feature flag.
    c.pod(
        "pod3",
        json!({"cni.projectcalico.org/ipAddrsNoIpam": "[\"10.0.0.1\"]"}),
    );
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
    let Some(c) = Cluster::new("second_interface_keeps_the_endpoint", "local") else {
        return;
    };
    c.pod("pod1", json!({}));
    c.pod("pod1-1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();
    // The same container ADDed again on eth1: the endpoint keeps eth0.
    c.run_args("ADD", "pod1", &cid, &ns.path(), &c.conf, "eth1", "")
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
    c.run_args("DEL", "pod1", &cid, &ns.path(), &c.conf, "eth1", "")
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
    let Some(mut c) = Cluster::new("explicit_ip_from_the_pod_cidr", "kubernetes") else {
        return;
    };
    let node = c.with_node();
    let pod_cidr: ipnet::Ipv4Net = node.pod_cidr().parse().unwrap();
    let wanted = std::net::Ipv4Addr::from(u32::from(pod_cidr.network()) + 42);
    c.conf["ipam"]["ranges"] = json!([[{"subnet": "usePodCidr"}]]);
    c.conf["include_default_routes"] = json!(true);
    c.conf["ipam"]["routes"] = json!([{"dst": "10.123.0.0/16"}]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    for _ in 0..2 {
        let cid = container_id();
        let ip_arg = format!(";IP={wanted}");
        let r = c
            .run_args("ADD", "pod1", &cid, &ns.path(), &c.conf, "eth0", &ip_arg)
            .assert_ok()
            .json();
        assert_eq!(pod_ip(&r), format!("{wanted}/32"));
        let routes: Vec<String> = ns.route_dsts();
        assert!(
            routes.contains(&"default".to_string())
                && routes.contains(&"10.123.0.0/16".to_string()),
            "{routes:?}"
        );
        c.run_args("DEL", "pod1", &cid, &ns.path(), &c.conf, "eth0", &ip_arg)
            .assert_ok();
    }
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn dual_pod_cidrs_and_two_ipv4_ranges() {
    let Some(mut c) = Cluster::new("dual_pod_cidrs_and_two_ipv4_ranges", "kubernetes") else {
        return;
    };
    // kube-controller-manager gives the Node a /24 and a /64.
    let node = c.with_node();
    let cidrs = node.get()["spec"]["podCIDRs"].clone();
    assert_eq!(cidrs.as_array().map(Vec::len), Some(2), "{cidrs}");
    let extra = format!("{}/24", c.setup.subnet.trim_end_matches("/24"));
    c.conf["ipam"]["ranges"] = json!([
        [{"subnet": "usePodCidr"}],
        [{"subnet": "usePodCidrIPv6"}],
        [{"subnet": extra}]
    ]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let r = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
    assert_eq!(r["ips"].as_array().unwrap().len(), 3, "{r}");
    let v6: ipnet::Ipv6Net = cidrs[1].as_str().unwrap().parse().unwrap();
    let got6: ipnet::Ipv6Net = r["ips"][1]["address"].as_str().unwrap().parse().unwrap();
    assert!(v6.contains(&got6.addr()), "{got6} from {v6}");
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
    let ann = c.annotations("pod1");
    assert_eq!(
        ann[POD_IPS].as_str().unwrap().split(',').count(),
        3,
        "{ann}"
    );
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn calico_ipam_annotation_validation_errors() {
    let Some(mut c) = Cluster::new("calico_ipam_annotation_validation_errors", "kubernetes") else {
        return;
    };
    c.conf["ipam"] = json!({"type": "calico-ipam"});
    // calico-ipam is this binary under another name.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(CALICO, bin.path().join("calico-ipam")).unwrap();
    let cni_path = format!("{}:{CNI_BIN}", bin.path().display());
    for (i, (namespace_annotations, pod_annotations, expect)) in [
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
    ]
    .into_iter()
    .enumerate()
    {
        c.set_namespace_annotations(namespace_annotations.clone());
        let pod = format!("pod{i}");
        c.pod(&pod, pod_annotations.clone());
        let ns = Netns::new();
        let cid = container_id();
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
            c.ns.name
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
        assert!(!host_link_exists(&c.veth(&pod)));
        assert!(c.annotations(&pod).get(POD_IP).is_none());
    }
}

#[test]
fn a_role_without_pods_status_patch_makes_add_fail_clearly() {
    let Some(c) = Cluster::new("a_role_without_pods_status_patch", "kubernetes") else {
        return;
    };
    let rules: Vec<Value> = c
        .bed
        .cni_rules()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["resources"] != json!(["pods/status"]))
        .cloned()
        .collect();
    assert_eq!(rules.len() + 1, c.bed.cni_rules().as_array().unwrap().len());
    let sa = c.bed.service_account("kube-system", json!(rules));
    let (conf, _) = c.conf_with_user("no-status-patch", json!({"token": sa.token}));
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let out = c.run_with("ADD", "pod1", &cid, &ns.path(), &conf);
    assert_eq!(out.code, 1);
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains("forbidden") && msg.contains("pods/status"),
        "the API server's refusal, naming the subresource: {msg}"
    );
    assert!(!host_link_exists(&c.veth("pod1")), "rolled back");
    assert!(c.setup.reservations().is_empty(), "address released");
    assert!(c.annotations("pod1").get(POD_IP).is_none());
    // With the full role the same pod works.
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
}

#[test]
fn the_token_file_is_read_afresh_by_every_call() {
    let Some(c) = Cluster::new("the_token_file_is_read_afresh", "kubernetes") else {
        return;
    };
    let token_file = c.setup.dir.path().join("token");
    let (conf, kc) = c.conf_with_user("token-file", json!({"tokenFile": token_file}));
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let mint = || c.bed.token("kube-system", "calico-cni-plugin", 600);
    std::fs::write(&token_file, mint()).unwrap();
    c.run_with("ADD", "pod1", &cid, &ns.path(), &conf)
        .assert_ok();
    // Rotated between two calls, as calico-node's token refresher does.
    std::fs::write(&token_file, mint()).unwrap();
    c.run_with("DEL", "pod1", &cid, &ns.path(), &conf)
        .assert_ok();
    assert_eq!(c.annotations("pod1")[POD_IP], "", "DEL reached the API");
    // A token the server does not know: the next call says which file, and
    // the failed ADD leaves nothing.
    std::fs::write(&token_file, "revoked").unwrap();
    let out = c.run_with("ADD", "pod1", &container_id(), &ns.path(), &conf);
    assert_eq!(out.code, 1);
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!("tokenFile {}", token_file.display()))
            && msg.contains(kc.to_str().unwrap()),
        "{msg}"
    );
    assert!(!host_link_exists(&c.veth("pod1")));
    assert!(c.setup.reservations().is_empty());
}

#[test]
fn a_deleted_service_account_or_an_expired_token_names_the_kubeconfig() {
    let Some(c) = Cluster::new("a_deleted_service_account", "kubernetes") else {
        return;
    };
    let sa = c.bed.service_account("kube-system", c.bed.cni_rules());
    let (conf, kc) = c.conf_with_user("own-sa", json!({"token": sa.token}));
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    c.run_with("ADD", "pod1", &cid, &ns.path(), &conf)
        .assert_ok();
    c.run_with("DEL", "pod1", &cid, &ns.path(), &conf)
        .assert_ok();
    sa.delete();
    // The API server stops accepting the token once the account is gone.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let out = loop {
        let cid = container_id();
        let out = c.run_with("ADD", "pod1", &cid, &ns.path(), &conf);
        if out.code != 0 {
            break out;
        }
        c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
        assert!(
            std::time::Instant::now() < end,
            "a deleted ServiceAccount's token is still accepted"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains("rejected") && msg.contains(kc.to_str().unwrap()) && msg.contains("401"),
        "{msg}"
    );
    assert!(
        !msg.contains(&sa.token),
        "the token is never printed: {msg}"
    );
    assert!(!host_link_exists(&c.veth("pod1")));

    // An expired token signed with the cluster's own key: the expiry, with its time.
    let uid = c
        .bed
        .get("/api/v1/namespaces/kube-system/serviceaccounts/calico-cni-plugin")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let expired_at = std::time::SystemTime::now() - Duration::from_secs(7200);
    let jwt = c
        .bed
        .signed_jwt("kube-system", "calico-cni-plugin", &uid, expired_at);
    let (conf, kc) = c.conf_with_user("expired", json!({"token": jwt}));
    let out = c.run_with("ADD", "pod1", &container_id(), &ns.path(), &conf);
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    let when = rfc3339_utc(expired_at);
    assert!(
        msg.contains(&format!("the token expired at {when}")) && msg.contains(kc.to_str().unwrap()),
        "{msg} (expected {when})"
    );
    assert!(!host_link_exists(&c.veth("pod1")));
    assert!(c.setup.reservations().is_empty());
}

/// RFC 3339 in UTC to the second, as the plugin prints it.
fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_concurrent_writer_is_never_overwritten_blindly() {
    let Some(c) = Cluster::new("a_concurrent_writer", "kubernetes") else {
        return;
    };
    c.pod("pod1", json!({}));
    let pod_path = c.ns.pod_path("pod1");
    let bed = c.bed;
    // Another writer changes the pod right before the plugin's next status
    // patch reaches the API server.
    let writes_before_next_patch = |patch: Value| {
        let path = pod_path.clone();
        let write = Fault::Before(std::sync::Arc::new(move || {
            bed.merge_patch(&path, &patch);
        }));
        c.proxy
            .push(Rule::on("PATCH", "/pods/pod1/status", write).times(1));
    };
    let patches = |since: usize| {
        c.proxy.requests()[since..]
            .iter()
            .filter(|(m, p)| m == "PATCH" && p.contains("/pods/pod1/status"))
            .count()
    };
    let ns = Netns::new();
    let x = container_id();

    // ADD: the patch carries only the plugin's annotations, so the other
    // writer's label survives.
    writes_before_next_patch(json!({"metadata": {"labels": {"writer": "add"}}}));
    let r = c.run("ADD", "pod1", &x, &ns.path()).assert_ok().json();
    let pod = c.ns.pod("pod1").unwrap();
    assert_eq!(pod["metadata"]["labels"]["writer"], "add");
    assert_eq!(pod["metadata"]["annotations"][POD_IP], json!(pod_ip(&r)));

    // DEL: its patch is conditional on the resourceVersion it read; the
    // other writer's change makes it 409, the plugin reads again and retries.
    writes_before_next_patch(json!({"metadata": {"labels": {"writer": "del"}}}));
    let before = c.proxy.requests().len();
    c.run("DEL", "pod1", &x, &ns.path()).assert_ok();
    assert_eq!(patches(before), 2, "refused once (409), then retried");
    let pod = c.ns.pod("pod1").unwrap();
    assert_eq!(pod["metadata"]["labels"]["writer"], "del");
    assert_eq!(pod["metadata"]["annotations"][POD_IP], "");

    // A new sandbox Z takes over X's endpoint (an update on the revision
    // read): the other writer's change makes it 409; the plugin reads the
    // pod again, sees it still X's, and retries on the new revision.
    let x = container_id();
    c.run("ADD", "pod1", &x, &ns.path()).assert_ok();
    let z = container_id();
    let nz = Netns::new();
    writes_before_next_patch(json!({"metadata": {"labels": {"writer": "update"}}}));
    let before = c.proxy.requests().len();
    let rz = c.run("ADD", "pod1", &z, &nz.path()).assert_ok().json();
    assert_eq!(patches(before), 2, "refused once (409), then retried");
    let pod = c.ns.pod("pod1").unwrap();
    assert_eq!(pod["metadata"]["labels"]["writer"], "update");
    assert_eq!(pod["metadata"]["annotations"][CONTAINER_ID], json!(z));
    assert_eq!(pod["metadata"]["annotations"][POD_IP], json!(pod_ip(&rz)));
    c.run("DEL", "pod1", &x, &ns.path()).assert_ok();
    c.run("DEL", "pod1", &z, &nz.path()).assert_ok();

    // A stale DEL racing a newer sandbox's ADD: the re-read shows the pod
    // is now Y's, so the plugin leaves Y's addresses alone.
    let x = container_id();
    c.run("ADD", "pod1", &x, &ns.path()).assert_ok();
    let y = container_id();
    writes_before_next_patch(json!({"metadata": {"annotations": {
        CONTAINER_ID: y, POD_IP: "10.9.9.9/32", POD_IPS: "10.9.9.9/32"}}}));
    let before = c.proxy.requests().len();
    c.run("DEL", "pod1", &x, &ns.path()).assert_ok();
    assert_eq!(patches(before), 1, "no second patch once the pod is Y's");
    let ann = c.annotations("pod1");
    assert_eq!(ann[CONTAINER_ID], json!(y));
    assert_eq!(ann[POD_IP], "10.9.9.9/32");
    assert!(c.setup.reservations().is_empty(), "X's address released");
}

#[test]
fn check_follows_custom_routes_and_fails_when_one_is_gone() {
    let Some(mut c) = Cluster::new("check_follows_custom_routes", "kubernetes") else {
        return;
    };
    c.conf["ipam"]["routes"] = json!([{"dst": "10.123.0.0/16"}, {"dst": "10.124.0.0/16"}]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    for include_defaults in [false, true] {
        c.conf["include_default_routes"] = json!(include_defaults);
        let result = c.run("ADD", "pod1", &cid, &ns.path()).assert_ok().json();
        let mut check = c.conf.clone();
        check["prevResult"] = result;
        c.run_with("CHECK", "pod1", &cid, &ns.path(), &check)
            .assert_ok();
        let defaults = ns.ip_json(&["-4", "route", "show", "default"]);
        assert_eq!(
            defaults.as_array().unwrap().len(),
            usize::from(include_defaults),
            "{defaults}"
        );
        // A route ADD made is deleted behind the plugin's back: CHECK says so.
        let del = ns.exec(&["ip", "route", "del", "10.124.0.0/16"]);
        assert!(
            del.status.success(),
            "{}",
            String::from_utf8_lossy(&del.stderr)
        );
        let out = c.run_with("CHECK", "pod1", &cid, &ns.path(), &check);
        assert_eq!(out.code, 1);
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(msg.contains("10.124.0.0/16"), "{msg}");
        c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();
    }
}

/// policy_setup_timeout_seconds: ADD waits, once the endpoint is written,
/// for Felix's status file of this very endpoint (named as Calico names
/// it; files of another pod or interface do not end the wait), returns as
/// soon as it appears, succeeds with a warning when it never does, and a
/// negative setting is refused before anything is done.
#[test]
fn policy_setup_wait_holds_add_until_the_endpoints_status_file_appears() {
    let Some(mut c) = Cluster::new("policy_setup_wait", "local") else {
        return;
    };
    let status = tempfile::tempdir().unwrap();
    c.conf["deadline_seconds"] = json!(30);
    c.conf["policy_setup_timeout_seconds"] = json!(20);
    c.conf["endpoint_status_dir"] = json!(status.path());
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let name = |pod: &str, ifname: &str| format!("k8s {}%2F{pod} {ifname}", c.ns.name);
    let (dir, mine, others) = (
        status.path().to_path_buf(),
        name("pod1", "eth0"),
        [name("pod2", "eth0"), name("pod1", "eth1")],
    );
    // Felix: the other endpoints' files first, this one's a second later.
    let felix = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        for other in others {
            std::fs::write(dir.join(other), b"{}").unwrap();
        }
        std::thread::sleep(Duration::from_millis(1000));
        std::fs::write(dir.join(mine), b"{\"ifaceName\":\"x\"}").unwrap();
        Instant::now()
    });
    let t0 = Instant::now();
    c.run("ADD", "pod1", &cid, &ns.path()).assert_ok();
    let (done, took) = (Instant::now(), t0.elapsed());
    let written = felix.join().unwrap();
    assert!(
        done >= written,
        "ADD returned before the endpoint's status file existed"
    );
    assert!(
        took < Duration::from_secs(15),
        "ADD waited {took:?}: not woken by the file"
    );
    assert_eq!(c.setup.endpoints().len(), 1);
    c.run("DEL", "pod1", &cid, &ns.path()).assert_ok();

    // Never written: ADD succeeds once the setting's time has passed, and
    // says why in the log.
    c.conf["policy_setup_timeout_seconds"] = json!(2);
    let (ns2, cid2) = (Netns::new(), container_id());
    c.pod("pod3", json!({}));
    let t0 = Instant::now();
    c.run("ADD", "pod3", &cid2, &ns2.path()).assert_ok();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "{took:?}"
    );
    let log = std::fs::read_to_string(c.setup.dir.path().join("log/cni.log")).unwrap();
    assert!(
        log.contains(&format!(
            "timed out waiting for endpoint status file '{}/k8s {}%2Fpod3 eth0': file not found",
            status.path().display(),
            c.ns.name
        )),
        "{log}"
    );
    c.run("DEL", "pod3", &cid2, &ns2.path()).assert_ok();

    // Negative: Calico's message, and nothing done.
    c.conf["policy_setup_timeout_seconds"] = json!(-1);
    let (ns3, cid3) = (Netns::new(), container_id());
    let out = c.run("ADD", "pod1", &cid3, &ns3.path());
    assert_eq!(out.error_code(), 7, "{out:?}");
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("invalid pod startup delay of -1"),
        "{out:?}"
    );
    assert!(c.setup.endpoints().is_empty());
    assert!(c.setup.reservations().is_empty());
    assert!(ns3.link("eth0").is_none());
    assert!(!host_link_exists(&c.veth("pod1")));
}

/// A readiness gate over https on loopback (the test bed's fault-proxy
/// certificate: 127.0.0.1, signed by the test bed's CA) answering 200.
fn tls_readiness_gate(bed: &Testbed) -> String {
    let config = std::sync::Arc::new(common::faultproxy::server_config(
        bed.var("TESTBED_PROXY_CERT").as_ref(),
        bed.var("TESTBED_PROXY_KEY").as_ref(),
    ));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/ready", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(tls) = rustls::ServerConnection::new(config.clone()) else {
                continue;
            };
            let mut stream = rustls::StreamOwned::new(tls, conn);
            let mut buf = [0u8; 4096];
            // (A client that refuses the certificate ends the handshake here.)
            if std::io::Read::read(&mut stream, &mut buf).is_ok() {
                let _ = std::io::Write::write_all(
                    &mut stream,
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                stream.conn.send_close_notify();
                let _ = std::io::Write::flush(&mut stream);
            }
        }
    });
    url
}

/// https readiness gates, as Calico's Go client takes them: verified
/// against the system's roots (here the test bed's CA, named by
/// SSL_CERT_FILE); a gate whose certificate does not verify never opens.
#[test]
fn https_readiness_gates_are_verified() {
    let Some(mut c) = Cluster::new("https_readiness_gates", "local") else {
        return;
    };
    c.conf["readiness_gates"] = json!([tls_readiness_gate(c.bed)]);
    c.pod("pod1", json!({}));
    let ns = Netns::new();
    let cid = container_id();
    let args = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
        c.ns.name
    );
    let ca = c.bed.ca();
    let ca = ca.to_str().unwrap();
    // (The API server is reached by the kubeconfig's own CA, whatever the
    // roots.)
    let run = |command: &str, conf: &Value, roots: Option<&str>| {
        let mut env = vec![("CNI_ARGS", args.as_str())];
        env.extend(roots.map(|r| ("SSL_CERT_FILE", r)));
        c.setup
            .run_with(command, &cid, &ns.path(), "eth0", conf, &env)
    };
    run("ADD", &c.conf, Some(ca)).assert_ok();
    run("DEL", &c.conf, Some(ca)).assert_ok();
    // Without the CA among the roots the certificate does not verify: the
    // gate stays closed until the deadline, and nothing is done.
    let mut conf = c.conf.clone();
    conf["deadline_seconds"] = json!(1);
    let out = run("ADD", &conf, None);
    assert_eq!(out.error_code(), 11, "{out:?}");
    assert!(c.setup.endpoints().is_empty());
    assert!(ns.link("eth0").is_none());
}
