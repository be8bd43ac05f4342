//! containerd end to end, as root: a containerd of the test's own (CRI,
//! runc) execs the built plugin exactly as on a Kubernetes node, for a pod
//! created in the test bed's API server. What the pod got is read back
//! from the kernel (the sandbox's netns, the host's veth, routes, iptables
//! and tc), from host-local's data directory and from the pod's
//! annotations; then the sandbox is stopped and removed and nothing may be
//! left.
//!
//! `kubernetes_mode_plain_conflist`: `calico` alone, cniVersion 1.0.0.
//! `kubernetes_mode_chained_portmap_bandwidth`: calico -> portmap ->
//! bandwidth, cniVersion 1.1.0 (so CRI Status runs the chain's STATUS), a
//! hostPort and the bandwidth annotations.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use calico_cni::datastore::names::veth_name_for_workload;
use common::containerd::{self, Containerd, SandboxNetns};
use common::testbed::{Namespace, Testbed, testbed};
use common::*;
use serde_json::{Value, json};

const POD_IP: &str = "cni.projectcalico.org/podIP";
const POD_IPS: &str = "cni.projectcalico.org/podIPs";
const CONTAINER_ID: &str = "cni.projectcalico.org/containerID";
const NETWORK: &str = "k8s-pod-network";

/// The test bed and the tools, or why the test cannot run.
fn bed(test: &str, tools: &[&str]) -> Option<&'static Testbed> {
    let bed = testbed(test)?;
    if let Some(why) = containerd::missing(bed, tools) {
        cannot_run(test, &why);
        return None;
    }
    Some(bed)
}

static SUBNET: AtomicU32 = AtomicU32::new(0);

/// A /24 of this test's own under 10.99/16 (no other test uses 10.99):
/// a random base per process, then one apart per test.
fn subnet() -> String {
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| u32::from_str_radix(&unique()[..8], 16).unwrap());
    let n = (base + SUBNET.fetch_add(1, Ordering::Relaxed)) % 256;
    format!("10.99.{n}.0/24")
}

/// One test's plugin configuration: Kubernetes datastore through the CNI's
/// ServiceAccount kubeconfig, k8s policy, its own node name, host-local
/// with its own subnet, data directory and log file.
struct Plugin {
    dir: tempfile::TempDir,
    node: String,
    subnet: String,
}

impl Plugin {
    fn new() -> Plugin {
        Plugin {
            dir: tempfile::tempdir().unwrap(),
            node: format!("ctrd-node-{}", unique()),
            subnet: subnet(),
        }
    }

    fn conf(&self, bed: &Testbed) -> Value {
        json!({
            "type": "calico",
            "log_level": "debug",
            "log_file_path": self.log_path(),
            "datastore_type": "kubernetes",
            "nodename": self.node,
            "mtu_file": self.dir.path().join("mtu"),
            "release_queue_dir": self.dir.path().join("release-queue"),
            "kubernetes": {"kubeconfig": bed.cni_kubeconfig()},
            "policy": {"type": "k8s"},
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": self.subnet}]],
                "dataDir": self.ipam_dir(),
            },
        })
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("cni.log")
    }

    fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }

    /// host-local's reservations (address files) for the network.
    fn reservations(&self) -> Vec<(String, String)> {
        let Ok(rd) = std::fs::read_dir(self.ipam_dir().join(NETWORK)) else {
            return vec![];
        };
        rd.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
            .map(|n| {
                let body = std::fs::read_to_string(self.ipam_dir().join(NETWORK).join(&n))
                    .unwrap_or_default();
                (n, body)
            })
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The plugin's "invoked" log lines: (command, container, netns, line).
    fn invocations(&self) -> Vec<(String, String, String, String)> {
        let field = |line: &str, key: &str| -> String {
            line.split_once(&format!(" {key}="))
                .map(|(_, rest)| {
                    let rest = rest.trim_start_matches('"');
                    rest.split([' ', '"']).next().unwrap_or("").to_string()
                })
                .unwrap_or_default()
        };
        self.log()
            .lines()
            .filter(|l| l.contains(" invoked "))
            .map(|l| {
                (
                    field(l, "command"),
                    field(l, "container"),
                    field(l, "netns"),
                    l.to_string(),
                )
            })
            .collect()
    }

    fn commands_for(&self, id: &str) -> Vec<String> {
        self.invocations()
            .into_iter()
            .filter(|(_, c, _, _)| c == id)
            .map(|(cmd, _, _, _)| cmd)
            .collect()
    }
}

/// The pod of one test: created in the API server (bound to the plugin's
/// node), then run by containerd from a PodSandboxConfig as kubelet
/// writes one.
struct Pod<'a> {
    ns: &'a Namespace,
    name: String,
    uid: String,
}

impl<'a> Pod<'a> {
    fn create(ns: &'a Namespace, node: &str, ports: Value) -> Pod<'a> {
        let name = "web".to_string();
        let pod = ns.create_pod(json!({
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "calico-cni.test/pause:1",
                     "ports": ports}]}
        }));
        let uid = pod["metadata"]["uid"]
            .as_str()
            .expect("pod uid")
            .to_string();
        Pod { ns, name, uid }
    }

    fn sandbox_config(&self, ctrd: &Containerd, port_mappings: Value, annotations: Value) -> Value {
        let mut ann = json!({
            "kubernetes.io/config.source": "api",
            "kubernetes.io/config.seen": "2026-01-01T00:00:00Z",
        });
        for (k, v) in annotations.as_object().unwrap() {
            ann[k] = v.clone();
        }
        json!({
            "metadata": {"name": self.name, "namespace": self.ns.name, "uid": self.uid, "attempt": 0},
            "hostname": self.name,
            "log_directory": ctrd.pod_logs().join(format!("{}_{}_{}", self.ns.name, self.name, self.uid)),
            "dns_config": {"servers": ["10.251.0.10"],
                           "searches": [format!("{}.svc.cluster.local", self.ns.name), "svc.cluster.local"],
                           "options": ["ndots:5"]},
            "port_mappings": port_mappings,
            "labels": {
                "io.kubernetes.pod.name": self.name,
                "io.kubernetes.pod.namespace": self.ns.name,
                "io.kubernetes.pod.uid": self.uid,
                "app": "web",
            },
            "annotations": ann,
            // Pod network namespace (POD = 0), container PID namespace (1).
            "linux": {"cgroup_parent": ctrd.cgroup_parent(),
                      "security_context": {"namespace_options": {"network": 0, "pid": 1, "ipc": 0}}},
        })
    }

    fn veth(&self) -> String {
        veth_name_for_workload(&self.ns.name, &self.name, None)
    }

    fn annotations(&self) -> Value {
        self.ns.pod(&self.name).expect("pod")["metadata"]["annotations"].clone()
    }
}

/// The host link called `name` (`ip -j link show`, which must succeed),
/// `None` when there is none.
fn host_dev(name: &str) -> Option<Value> {
    let links = host_ip_json(&["link", "show"]);
    let links = links.as_array().expect("ip -j link show: a list");
    assert!(!links.is_empty(), "ip -j link show listed nothing");
    links.iter().find(|l| l["ifname"] == name).cloned()
}

fn has_route(routes: &Value, dst: &str, gateway: Option<&str>, scope: Option<&str>) -> bool {
    routes.as_array().unwrap().iter().any(|r| {
        r["dst"] == dst
            && r["dev"] == "eth0"
            && gateway.is_none_or(|g| r["gateway"] == g)
            && scope.is_none_or(|s| r["scope"] == s)
    })
}

/// What a running sandbox must show: its IP from CRI, the pod's netns
/// (eth0, Calico's routes, eth0's peer = the host veth), the host veth and
/// /32 route, host-local's reservation, the pod's annotations. The pod IP.
fn assert_running(
    ctrd: &Containerd,
    plugin: &Plugin,
    pod: &Pod,
    id: &str,
) -> (String, SandboxNetns) {
    let status = ctrd.inspectp(id);
    assert_eq!(status["status"]["state"], "SANDBOX_READY", "{status}");
    let ip = status["status"]["network"]["ip"]
        .as_str()
        .unwrap_or_else(|| panic!("no sandbox IP: {status}"))
        .to_string();
    let subnet: ipnet::Ipv4Net = plugin.subnet.parse().unwrap();
    assert!(
        subnet.contains(&ip.parse::<std::net::Ipv4Addr>().unwrap()),
        "{ip} not in {subnet}"
    );
    // The CNI result containerd kept: eth0 in the sandbox with the IP.
    let eth0 = &status["info"]["cniResult"]["Interfaces"]["eth0"];
    assert_eq!(eth0["IPConfigs"][0]["IP"], json!(ip), "{status}");

    let netns = ctrd.sandbox_netns(id);
    let links = netns.ip_json(&["link", "show", "dev", "eth0"]);
    let link = &links[0];
    assert!(
        link["flags"].as_array().unwrap().contains(&json!("UP")),
        "{link}"
    );
    let addrs = netns.ip_json(&["-4", "addr", "show", "dev", "eth0"]);
    let inet: Vec<String> = addrs[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    assert_eq!(inet, vec![format!("{ip}/32")], "{addrs}");
    let routes = netns.ip_json(&["-4", "route", "show"]);
    assert!(
        has_route(&routes, "default", Some("169.254.1.1"), None),
        "no default via 169.254.1.1 dev eth0: {routes}"
    );
    assert!(
        has_route(&routes, "169.254.1.1", None, Some("link")),
        "no 169.254.1.1 dev eth0 scope link: {routes}"
    );

    let veth = pod.veth();
    let host = host_dev(&veth).unwrap_or_else(|| panic!("no host veth {veth}"));
    assert_eq!(
        link["link_index"], host["ifindex"],
        "eth0's peer is not {veth}: {link} / {host}"
    );
    let route = host_ip_json(&["-4", "route", "show", &format!("{ip}/32")]);
    assert_eq!(
        route,
        json!([{"dst": ip, "dev": veth, "scope": "link", "flags": []}]),
        "host route to {ip}"
    );

    let reservations = plugin.reservations();
    assert_eq!(reservations.len(), 1, "{reservations:?}");
    assert_eq!(reservations[0].0, ip);
    assert!(
        reservations[0].1.starts_with(id),
        "host-local's reservation is not the sandbox's: {reservations:?}"
    );

    let ann = pod.annotations();
    assert_eq!(ann[POD_IP], json!(format!("{ip}/32")), "{ann}");
    assert_eq!(ann[POD_IPS], json!(format!("{ip}/32")), "{ann}");
    assert_eq!(ann[CONTAINER_ID], json!(id), "{ann}");

    // containerd exec'd our binary for this sandbox, in that netns.
    let adds: Vec<_> = plugin
        .invocations()
        .into_iter()
        .filter(|(cmd, c, _, _)| cmd == "ADD" && c == id)
        .collect();
    assert_eq!(adds.len(), 1, "{adds:?}");
    assert_eq!(adds[0].2, netns.path);
    (ip, netns)
}

/// Stops and removes the sandbox; then nothing of it may be left.
fn stop_and_remove(ctrd: &Containerd, plugin: &Plugin, pod: &Pod, id: &str, ip: &str, netns: &str) {
    let t = Instant::now();
    ctrd.crictl_ok(&["stopp", id]);
    eprintln!("crictl stopp: {:?}", t.elapsed());
    let veth = pod.veth();
    assert!(host_dev(&veth).is_none(), "{veth} left after stopp");
    assert_eq!(
        host_ip_json(&["-4", "route", "show", &format!("{ip}/32")]),
        json!([]),
        "route to {ip} left after stopp"
    );
    assert_eq!(plugin.reservations(), vec![], "host-local reservation left");
    assert!(!Path::new(netns).exists(), "{netns} left after stopp");
    let ann = pod.annotations();
    assert_eq!(ann[POD_IP], "", "{ann}");
    assert_eq!(ann[POD_IPS], "", "{ann}");

    let t = Instant::now();
    ctrd.crictl_ok(&["rmp", id]);
    eprintln!("crictl rmp: {:?}", t.elapsed());
    assert!(!ctrd.pods().contains(&id.to_string()));
    assert!(host_dev(&veth).is_none());
    assert_eq!(plugin.reservations(), vec![]);
    let cache = format!("/var/lib/cni/results/{NETWORK}-{id}-eth0");
    assert!(!Path::new(&cache).exists(), "libcni cache {cache} left");
    let ann = pod.annotations();
    assert_eq!(ann[POD_IP], "", "{ann}");
    assert_eq!(ann[CONTAINER_ID], json!(id), "containerID is left in place");

    let commands = plugin.commands_for(id);
    eprintln!("plugin invocations for the sandbox: {commands:?}");
    assert_eq!(commands[0], "ADD");
    assert!(commands[1..].iter().all(|c| c == "DEL"), "{commands:?}");
    assert!(commands.len() >= 2, "{commands:?}");
    // The first DEL (stopp) names the netns and carries libcni's cached
    // result; containerd 2.x DELs again on rmp, with no netns.
    let dels: Vec<_> = plugin
        .invocations()
        .into_iter()
        .filter(|(cmd, c, _, _)| cmd == "DEL" && c == id)
        .collect();
    assert_eq!(dels[0].2, netns);
    assert!(
        dels[0].3.contains("\"prevResult\"") && dels[0].3.contains(&format!("{ip}/32")),
        "DEL without prevResult: {}",
        dels[0].3
    );
    let log = plugin.log();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR "))
        .map(|l| &l[..l.len().min(300)])
        .collect();
    assert!(errors.is_empty(), "plugin logged errors: {errors:#?}");
}

/// The plugin's install, a namespace of the test's own, and a containerd.
fn start(bed: &'static Testbed) -> (Plugin, Namespace, Containerd) {
    let plugin = Plugin::new();
    let ns = bed.namespace(json!({}), json!({}));
    let t = Instant::now();
    let ctrd = Containerd::start(bed);
    eprintln!("containerd up: {:?}", t.elapsed());
    (plugin, ns, ctrd)
}

#[test]
fn kubernetes_mode_plain_conflist() {
    let test = "kubernetes_mode_plain_conflist";
    let Some(bed) = bed(test, &["nsenter"]) else {
        return;
    };
    let (plugin, ns, ctrd) = start(bed);
    ctrd.write_conflist(&json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [plugin.conf(bed)],
    }));

    let pod = Pod::create(&ns, &plugin.node, json!([]));
    let t = Instant::now();
    let id = ctrd.runp(&pod.sandbox_config(&ctrd, json!([]), json!({})));
    eprintln!("crictl runp: {:?}", t.elapsed());
    let (ip, netns) = assert_running(&ctrd, &plugin, &pod, &id);
    stop_and_remove(&ctrd, &plugin, &pod, &id, &ip, &netns.path);

    // Before 1.1.0 libcni runs no STATUS; containerd never runs CHECK.
    let all: Vec<String> = plugin.invocations().into_iter().map(|i| i.0).collect();
    assert!(
        !all.iter().any(|c| c == "STATUS" || c == "CHECK"),
        "{all:?}"
    );
}

#[test]
fn kubernetes_mode_chained_portmap_bandwidth() {
    let test = "kubernetes_mode_chained_portmap_bandwidth";
    let Some(bed) = bed(test, &["nsenter", "iptables", "iptables-save", "tc"]) else {
        return;
    };
    let (plugin, ns, ctrd) = start(bed);
    let conflist = json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "plugins": [
            plugin.conf(bed),
            {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "iptables", "snat": true},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}},
        ],
    });
    ctrd.write_conflist(&conflist);
    // CRI Status (crictl info) ran the chain's STATUS: NetworkReady is true.
    let statuses = plugin
        .invocations()
        .iter()
        .filter(|i| i.0 == "STATUS")
        .count();
    assert!(statuses >= 1, "no STATUS: {}", plugin.log());

    let host_port = 30000 + u32::from_str_radix(&unique()[..4], 16).unwrap() % 20000;
    let pod = Pod::create(
        &ns,
        &plugin.node,
        json!([{"containerPort": 8080, "hostPort": host_port, "protocol": "TCP"}]),
    );
    let config = pod.sandbox_config(
        &ctrd,
        json!([{"protocol": 0, "container_port": 8080, "host_port": host_port}]),
        json!({"kubernetes.io/ingress-bandwidth": "1M", "kubernetes.io/egress-bandwidth": "2M"}),
    );
    let t = Instant::now();
    let id = ctrd.runp(&config);
    eprintln!("crictl runp: {:?}", t.elapsed());
    let (ip, netns) = assert_running(&ctrd, &plugin, &pod, &id);
    let veth = pod.veth();

    // portmap got calico's result: its DNAT for the hostPort goes to the pod IP.
    let nat = run_ok(&containerd::tool("iptables-save"), &["-t", "nat"]);
    let dnat: Vec<&str> = nat
        .lines()
        .filter(|l| l.contains(&format!("id: \\\"{id}\\\"")))
        .collect();
    assert_eq!(dnat.len(), 1, "no DNAT rule for the sandbox:\n{nat}");
    assert!(
        dnat[0].contains(&format!("--dports {host_port}")),
        "{}",
        dnat[0]
    );
    let chain = dnat[0]
        .split(" -j ")
        .nth(1)
        .expect("DNAT jump")
        .trim()
        .to_string();
    assert!(chain.starts_with("CNI-DN-"), "{chain}");
    assert!(
        nat.lines().any(|l| l.starts_with(&format!("-A {chain} "))
            && l.contains(&format!("--dport {host_port}"))
            && l.contains(&format!("-j DNAT --to-destination {ip}:8080"))),
        "no DNAT to {ip}:8080 in {chain}:\n{nat}"
    );

    // bandwidth got it too: the pod's ingress limit shapes the host veth's
    // egress (1 Mbit/s = 125000 B/s), its egress limit the ifb device that
    // the veth's ingress is redirected to (2 Mbit/s).
    let qdiscs = run_ok(
        &containerd::tool("tc"),
        &["-j", "qdisc", "show", "dev", &veth],
    );
    let qdiscs: Value = serde_json::from_str(&qdiscs).unwrap();
    let kinds = |q: &Value| -> Vec<(String, Value)> {
        q.as_array()
            .unwrap()
            .iter()
            .map(|q| {
                (
                    q["kind"].as_str().unwrap().to_string(),
                    q["options"]["rate"].clone(),
                )
            })
            .collect()
    };
    let on_veth = kinds(&qdiscs);
    assert!(
        on_veth.contains(&("tbf".into(), json!(125000))),
        "no tbf 1mbit on {veth}: {qdiscs}"
    );
    assert!(
        on_veth.iter().any(|(k, _)| k == "ingress"),
        "no ingress qdisc on {veth}: {qdiscs}"
    );
    let filters: Value = serde_json::from_str(&run_ok(
        &containerd::tool("tc"),
        &["-j", "filter", "show", "dev", &veth, "ingress"],
    ))
    .unwrap();
    let ifb = filters
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| {
            f["options"]["actions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|a| a["kind"] == "mirred")
        .and_then(|a| a["to_dev"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no mirred redirect on {veth} ingress: {filters}"));
    assert!(ifb.starts_with("bwp"), "{ifb}");
    let ifb_link = host_dev(&ifb).unwrap_or_else(|| panic!("no ifb {ifb}"));
    assert_eq!(ifb_link["link_type"], "ether");
    let ifb_qdiscs: Value = serde_json::from_str(&run_ok(
        &containerd::tool("tc"),
        &["-j", "qdisc", "show", "dev", &ifb],
    ))
    .unwrap();
    assert!(
        kinds(&ifb_qdiscs).contains(&("tbf".into(), json!(250000))),
        "no tbf 2mbit on {ifb}: {ifb_qdiscs}"
    );
    // And the chain's result reached containerd with bandwidth's ifb in it.
    let status = ctrd.inspectp(&id);
    assert!(
        status["info"]["cniResult"]["Interfaces"][&ifb].is_object(),
        "{}",
        status["info"]["cniResult"]
    );

    stop_and_remove(&ctrd, &plugin, &pod, &id, &ip, &netns.path);
    let nat = run_ok(&containerd::tool("iptables-save"), &["-t", "nat"]);
    assert!(
        !nat.contains(&id) && !nat.contains(&chain) && !nat.contains(&format!("{ip}:8080")),
        "portmap rules left:\n{nat}"
    );
    assert!(host_dev(&ifb).is_none(), "{ifb} left");
    let all: Vec<String> = plugin.invocations().into_iter().map(|i| i.0).collect();
    assert!(!all.iter().any(|c| c == "CHECK"), "{all:?}");
    eprintln!("plugin invocations: {all:?}");
}
