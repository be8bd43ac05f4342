//! The test bed's node (`scripts/testbed.sh up --node`): a real kubelet and
//! kube-scheduler, the node's containerd, this plugin put in place by
//! `calico install` in a calico-node DaemonSet's init container, as Calico's
//! manifest runs its install-cni, with Calico's stock conflist text.
//! Everything here goes
//! through the API server only, as a user's workloads do: pods scheduled,
//! started, deleted on kubelet's clock; the effects read back from the
//! kernel (veths, routes, reachability from the node) and from the
//! datastore (calico-ipam's handles). A separate stage of scripts/test.sh,
//! after the rest (`cargo test --test node -- --ignored` once the node is
//! up), so that the node's plugin calls — containerd's STATUS every few
//! seconds included — never meet the other tests' use of the node defaults
//! (/var/lib/calico). One test at a time (`--test-threads=1`): each judges
//! what it left by the node's whole datastore.

mod common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::testbed::{Namespace, Testbed, testbed};
use common::*;
use ipnet::IpNet;
use serde_json::{Value, json};

/// The test bed with its node: (bed, node name, the node's pool).
fn node(test: &str) -> Option<(&'static Testbed, String, IpNet)> {
    if !root_or_skip(test) {
        return None;
    }
    let bed = testbed(test)?;
    let Some(name) = bed.var_opt("TESTBED_NODE") else {
        cannot_run(
            test,
            "the test bed has no node (scripts/testbed.sh up --node)",
        );
        return None;
    };
    let pool = bed.var("TESTBED_NODE_POOL").parse().unwrap();
    Some((bed, name.to_string(), pool))
}

/// A Deployment of `replicas` echo servers (peers/echo/echo.c: HTTP on
/// 8080, UDP on 8081) on the node, ready when kubelet's TCP probe from the
/// node reaches them.
fn deployment(bed: &Testbed, ns: &Namespace, name: &str, node: &str, replicas: u32) {
    let image = bed.var("TESTBED_ECHO_IMAGE");
    bed.create(
        &format!("/apis/apps/v1/namespaces/{}/deployments", ns.name),
        &json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "containers": [{
                            "name": "c", "image": image, "imagePullPolicy": "Never",
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
                        }],
                        "dnsPolicy": "Default",
                        "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 2
                    }
                }
            }
        }),
    );
}

fn scale(bed: &Testbed, ns: &Namespace, name: &str, replicas: u32) {
    bed.merge_patch(
        &format!("/apis/apps/v1/namespaces/{}/deployments/{name}", ns.name),
        &json!({"spec": {"replicas": replicas}}),
    );
}

/// The pods of app `name`.
fn pods(bed: &Testbed, ns: &Namespace, name: &str) -> Vec<Value> {
    bed.get(&format!(
        "/api/v1/namespaces/{}/pods?labelSelector=app%3D{name}",
        ns.name
    ))
    .expect("pods")["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits (bounded) until `done` holds, polling every 200 ms; its last
/// answer in the panic otherwise.
fn wait_until<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> (bool, T),
) -> T {
    let end = Instant::now() + limit;
    loop {
        let (done, seen) = probe();
        if done {
            return seen;
        }
        assert!(Instant::now() < end, "{what} after {limit:?}: {seen:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The ready pods' (name, address), once `n` are.
fn running(bed: &Testbed, ns: &Namespace, name: &str, n: usize) -> Vec<(String, IpAddr)> {
    wait_until(
        &format!("{n} pods of {name} ready"),
        Duration::from_secs(180),
        || {
            let pods = pods(bed, ns, name);
            let up: Vec<(String, IpAddr)> = pods
                .iter()
                .filter(|p| is_ready(p) && p["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|p| {
                    let ip = p["status"]["podIP"].as_str()?.parse().ok()?;
                    Some((p["metadata"]["name"].as_str()?.to_string(), ip))
                })
                .collect();
            (up.len() == n && pods.len() == n, up)
        },
    )
}

/// calico-ipam's handles of this node's network (`k8s-pod-network.<sandbox>`).
fn handles(bed: &Testbed) -> BTreeSet<String> {
    bed.get("/apis/crd.projectcalico.org/v1/ipamhandles")
        .expect("handles")["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["spec"]["handleID"].as_str())
        .filter(|h| h.starts_with("k8s-pod-network."))
        .map(String::from)
        .collect()
}

/// The addresses allocated in the node's pool.
fn allocated(bed: &Testbed, pool: &IpNet) -> BTreeSet<IpAddr> {
    let blocks = bed
        .get("/apis/crd.projectcalico.org/v1/ipamblocks")
        .expect("blocks");
    let mut out = BTreeSet::new();
    for b in blocks["items"].as_array().unwrap() {
        let Some(cidr) = b["spec"]["cidr"]
            .as_str()
            .and_then(|c| c.parse::<IpNet>().ok())
        else {
            continue;
        };
        if !pool.contains(&cidr) {
            continue;
        }
        for (i, a) in b["spec"]["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            if !a.is_null() {
                out.insert(common::ipam::address_at(&cidr, i));
            }
        }
    }
    out
}

/// The pod's name as its echo server answers it from the node: over HTTP
/// (TCP 8080) and UDP (8081).
fn echo_from_node(ip: IpAddr) -> (Result<String, String>, Result<String, String>) {
    let tcp = http_get(ip, 8080);
    let udp = (|| {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(3))).ok();
        s.send_to(b"hello", (ip, 8081)).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 256];
        let n = s.recv(&mut buf).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    })();
    (tcp, udp)
}

/// A pod that probes `targets` (echo probe: HTTP and UDP to each) once and
/// exits: its phase and report (the termination message) once finished.
fn probe_from_pod(
    bed: &Testbed,
    ns: &Namespace,
    node: &str,
    name: &str,
    targets: &[IpAddr],
) -> (String, String) {
    probe_from_labelled_pod(bed, ns, node, name, json!({}), targets)
}

/// `probe_from_pod` from a pod with `labels` (what a policy selects).
fn probe_from_labelled_pod(
    bed: &Testbed,
    ns: &Namespace,
    node: &str,
    name: &str,
    labels: Value,
    targets: &[IpAddr],
) -> (String, String) {
    let image = bed.var("TESTBED_ECHO_IMAGE");
    let mut command = vec!["/echo".to_string(), "probe".to_string()];
    command.extend(targets.iter().map(IpAddr::to_string));
    ns.create_pod(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "command": command}],
            "dnsPolicy": "Default",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2
        }
    }));
    let pod = wait_until(
        &format!("probe pod {name} finished"),
        Duration::from_secs(120),
        || {
            let pod = ns.pod(name).unwrap_or_default();
            let phase = pod["status"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (phase == "Succeeded" || phase == "Failed", pod)
        },
    );
    let terminated = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    (
        pod["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        terminated["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// What the node's datastore held before a test, to tell what the test
/// left.
struct Before {
    pool: IpNet,
    handles: BTreeSet<String>,
    allocated: BTreeSet<IpAddr>,
}

impl Before {
    fn now(bed: &Testbed, pool: &IpNet) -> Before {
        Before {
            pool: *pool,
            handles: handles(bed),
            allocated: allocated(bed, pool),
        }
    }

    fn new_handles(&self, bed: &Testbed) -> BTreeSet<String> {
        handles(bed).difference(&self.handles).cloned().collect()
    }

    /// Waits (bounded: kubelet tears sandboxes down after their pods are
    /// gone from the API) until none of the test's handles, allocations,
    /// host veths of `pods` or routes to their addresses is left.
    fn nothing_left(&self, bed: &Testbed, ns: &Namespace, pods: &[(String, IpAddr)]) {
        wait_until("nothing left", Duration::from_secs(90), || {
            let handles_left: Vec<String> = self.new_handles(bed).into_iter().collect();
            let extra: Vec<IpAddr> = allocated(bed, &self.pool)
                .difference(&self.allocated)
                .copied()
                .collect();
            let veths: Vec<String> = pods
                .iter()
                .map(|(pod, _)| {
                    calico_cni::datastore::names::veth_name_for_workload(&ns.name, pod, None)
                })
                .filter(|v| host_link_exists(v))
                .collect();
            let routes: Vec<IpAddr> = pods
                .iter()
                .map(|(_, ip)| *ip)
                .filter(|ip| {
                    host_ip_json(&["route", "show", &format!("{ip}/32")])
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
                })
                .collect();
            let clean = handles_left.is_empty()
                && extra.is_empty()
                && veths.is_empty()
                && routes.is_empty();
            (clean, (handles_left, extra, veths, routes))
        });
    }
}

/// Scales app `name` to 0 and waits until its pods are gone from the API.
fn scale_to_zero(bed: &Testbed, ns: &Namespace, name: &str) {
    scale(bed, ns, name, 0);
    wait_until("the pods gone", Duration::from_secs(180), || {
        let left = pods(bed, ns, name).len();
        (left == 0, left)
    });
}

/// A Deployment of 10 echo servers: ready (kubelet's probe from the node)
/// with distinct addresses from the node's pool, each with its host veth
/// and route, answering the node and every other pod over TCP and UDP;
/// scaled to 0 (and the prober gone), nothing is left: no handle, no
/// allocation, no veth, no route.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn a_deployment_runs_and_leaves_nothing() {
    let test = "node_a_deployment_runs_and_leaves_nothing";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    let started = Instant::now();
    deployment(bed, &ns, "web", &node, 10);
    let up = running(bed, &ns, "web", 10);
    let took = started.elapsed();
    let ips: BTreeSet<IpAddr> = up.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(ips.len(), 10, "addresses not distinct: {up:?}");
    for (pod, ip) in &up {
        assert!(pool.contains(ip), "{pod}: {ip} is not from {pool}");
        let veth = calico_cni::datastore::names::veth_name_for_workload(&ns.name, pod, None);
        assert!(host_link_exists(&veth), "{pod}: no host veth {veth}");
        let routes = host_ip_json(&["route", "show", &format!("{ip}/32")]);
        assert_eq!(
            routes[0]["dev"], veth,
            "{pod}: the host route of {ip} is not via {veth}: {routes}"
        );
        let (tcp, udp) = echo_from_node(*ip);
        assert_eq!(
            tcp.as_deref(),
            Ok(pod.as_str()),
            "{pod} ({ip}) over TCP from the node"
        );
        assert_eq!(
            udp.as_deref(),
            Ok(pod.as_str()),
            "{pod} ({ip}) over UDP from the node"
        );
        let p = bed.get(&ns.pod_path(pod)).unwrap();
        assert_eq!(
            p["metadata"]["annotations"]["cni.projectcalico.org/podIP"],
            format!("{ip}/32"),
            "{pod}"
        );
    }
    // Every pod reaches every other, HTTP and UDP, from a pod of its own.
    let targets: Vec<IpAddr> = ips.iter().copied().collect();
    let (phase, report) = probe_from_pod(bed, &ns, &node, "prober", &targets);
    assert_eq!(phase, "Succeeded", "{report}");
    for (pod, ip) in &up {
        for proto in ["tcp", "udp"] {
            assert!(
                report.lines().any(|l| l == format!("{ip} {proto} {pod}")),
                "{pod} ({ip}) {proto} from a pod: {report}"
            );
        }
    }
    bed.delete(&ns.pod_path("prober"));
    // (The prober's handle is among them until its sandbox goes.)
    let new_handles = before.new_handles(bed);
    assert!(new_handles.len() >= 10, "{new_handles:?}");
    eprintln!("{test}: 10 pods ready in {took:?}");

    scale_to_zero(bed, &ns, "web");
    before.nothing_left(bed, &ns, &up);
    bed.delete(&format!(
        "/apis/apps/v1/namespaces/{}/deployments/web",
        ns.name
    ));
}

/// The node registered Ready only once the plugin's STATUS said the
/// network was ready (scripts/testbed-node.sh checked it NotReady, with
/// our STATUS's reason, before its pool existed); it reports the runtime's
/// network as ready now; the plugin was installed by the calico-node
/// DaemonSet's pod on the node, which runs on.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn the_node_is_ready_with_our_network() {
    let test = "node_the_node_is_ready_with_our_network";
    let Some((bed, node, _)) = node(test) else {
        return;
    };
    // (Bounded: a test before may have just given the node back its
    // plugin, which kubelet sees at its next runtime status poll.)
    let n = wait_until("the node Ready", Duration::from_secs(60), || {
        let n = bed.get(&format!("/api/v1/nodes/{node}")).expect("the node");
        let ready = n["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        (ready, n)
    });
    assert_eq!(
        n["status"]["nodeInfo"]["kubeletVersion"], "v1.36.3",
        "{n:#}"
    );
    let dir = bed.var("TESTBED_NODE_DIR");
    // Before its pool existed: NotReady, for the network.
    let before: Value =
        serde_json::from_slice(&std::fs::read(format!("{dir}/ready-before-pool.json")).unwrap())
            .unwrap();
    assert_eq!(before["status"], "False", "{before:#}");
    let message = before["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("network not ready")
            && message.contains("calico-ipam cannot allocate: no enabled IP pool"),
        "{before:#}"
    );
    // Installed by the DaemonSet's pod on this node: its install-cni init
    // container done, its token-renewing container running.
    let pods = bed
        .get("/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcalico-node")
        .expect("calico-node pods");
    let pod = pods["items"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["spec"]["nodeName"] == node.as_str()))
        .unwrap_or_else(|| panic!("no calico-node pod on {node}: {pods:#}"));
    assert_eq!(pod["status"]["phase"], "Running", "{pod:#}");
    assert_eq!(
        pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 0,
        "{pod:#}"
    );
    assert_eq!(
        pod["status"]["containerStatuses"][0]["ready"], true,
        "{pod:#}"
    );
    // The installed conflist is Calico's stock text, rendered.
    let conflist: Value = serde_json::from_slice(
        &std::fs::read(format!("{dir}/host/etc/cni/net.d/10-calico.conflist")).unwrap(),
    )
    .unwrap();
    assert_eq!(conflist["plugins"][0]["nodename"], node.as_str());
    assert_eq!(
        conflist["plugins"][0]["kubernetes"]["kubeconfig"],
        format!("{dir}/host/etc/cni/net.d/calico-kubeconfig")
    );
}

/// 0 → 50 → 0 at once: 50 distinct addresses of the pool, then nothing
/// left.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn fifty_at_once_and_back_to_zero() {
    let test = "node_fifty_at_once_and_back_to_zero";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "many", &node, 0);
    let started = Instant::now();
    scale(bed, &ns, "many", 50);
    let up = running(bed, &ns, "many", 50);
    eprintln!("{test}: 50 pods ready in {:?}", started.elapsed());
    let ips: BTreeSet<IpAddr> = up.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(ips.len(), 50, "addresses not distinct: {up:?}");
    assert!(ips.iter().all(|ip| pool.contains(ip)), "{ips:?}");
    assert_eq!(before.new_handles(bed).len(), 50);
    scale_to_zero(bed, &ns, "many");
    before.nothing_left(bed, &ns, &up);
}

/// A pod with a hostPort answers on the node's address (portmap chained
/// after calico, as Calico's stock conflist has it); once it is gone, so
/// is the port mapping.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn a_host_port_answers_on_the_node() {
    let test = "node_a_host_port_answers_on_the_node";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    let image = bed.var("TESTBED_ECHO_IMAGE");
    ns.create_pod(json!({
        "metadata": {"name": "hp", "labels": {"app": "hp"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                            "ports": [{"containerPort": 8080, "hostPort": 28080, "protocol": "TCP"}],
                            "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}],
            "dnsPolicy": "Default",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2
        }
    }));
    let up = running(bed, &ns, "hp", 1);
    let n = bed.get(&format!("/api/v1/nodes/{node}")).unwrap();
    let node_ip: IpAddr = n["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .and_then(|a| a.parse().ok())
        .expect("the node's InternalIP");
    let answer = http_get(node_ip, 28080);
    assert_eq!(answer.as_deref(), Ok("hp"), "{node_ip}:28080");
    bed.delete(&ns.pod_path("hp"));
    wait_until("the pod gone", Duration::from_secs(60), || {
        let left = ns.pod("hp").is_some();
        (!left, left)
    });
    before.nothing_left(bed, &ns, &up);
    let dnat = std::process::Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&dnat.stdout);
    assert!(
        !rules.lines().any(|l| l.contains("--dport 28080")),
        "the port mapping outlived the pod:\n{rules}"
    );
}

/// kubelet recreates a pod's sandbox when it dies: the pod gets a new
/// sandbox (a new ADD), answers again, and the old sandbox's address and
/// handle are released (its DEL), so the pod holds one of each.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn a_recreated_sandbox_keeps_the_pod_working() {
    let test = "node_a_recreated_sandbox_keeps_the_pod_working";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "phoenix", &node, 1);
    let up = running(bed, &ns, "phoenix", 1);
    let (pod, _) = &up[0];
    let first = before.new_handles(bed);
    assert_eq!(first.len(), 1, "{first:?}");
    let sandbox = crictl(bed, &["pods", "-q", "--name", pod, "--state", "ready"]);
    let sandbox = sandbox.trim();
    assert!(!sandbox.is_empty(), "no ready sandbox of {pod}");
    crictl(bed, &["stopp", sandbox]);
    // kubelet notices, makes a new sandbox, restarts the container.
    let again = wait_until("a new sandbox, ready", Duration::from_secs(120), || {
        let ready = crictl(bed, &["pods", "-q", "--name", pod, "--state", "ready"]);
        let ready = ready.trim().to_string();
        let p = ns.pod(pod).unwrap_or_default();
        let fresh = !ready.is_empty() && ready != sandbox && is_ready(&p);
        (fresh, (ready, p["status"]["podIP"].clone()))
    });
    let ip: IpAddr = again.1.as_str().unwrap().parse().unwrap();
    let (tcp, udp) = echo_from_node(ip);
    assert_eq!(tcp.as_deref(), Ok(pod.as_str()));
    assert_eq!(udp.as_deref(), Ok(pod.as_str()));
    let now = wait_until("one handle for the pod", Duration::from_secs(60), || {
        let h = before.new_handles(bed);
        (h.len() == 1 && h != first, h)
    });
    drop(now);
    scale_to_zero(bed, &ns, "phoenix");
    before.nothing_left(bed, &ns, &[(pod.clone(), ip)]);
}

/// An HTTP GET of `ip:port`: the body's first line.
fn http_get(ip: IpAddr, port: u16) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&(ip, port).into(), Duration::from_secs(3))
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_string())
        .ok_or(answer)
}

/// crictl on the node's containerd: its stdout.
fn crictl(bed: &Testbed, args: &[&str]) -> String {
    let sock = format!(
        "unix://{}/containerd/containerd.sock",
        bed.var("TESTBED_NODE_DIR")
    );
    let out = std::process::Command::new(bed.peer("crictl"))
        .args(["--runtime-endpoint", &sock, "--image-endpoint", &sock])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "crictl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubelet restarted while 20 pods start: they all become ready, no two
/// with one address and each with one allocation; back to 0, nothing left.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn kubelet_restarted_mid_way_leaks_nothing() {
    let test = "node_kubelet_restarted_mid_way_leaks_nothing";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "churn", &node, 20);
    // Some pods have their sandbox, some not yet.
    wait_until("the first pods started", Duration::from_secs(60), || {
        let started = pods(bed, &ns, "churn")
            .iter()
            .filter(|p| p["status"]["podIP"].is_string())
            .count();
        (started >= 3, started)
    });
    testbed_script(&["restart-kubelet"]);
    let up = running(bed, &ns, "churn", 20);
    let ips: BTreeSet<IpAddr> = up.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(ips.len(), 20, "an address twice: {up:?}");
    let held: BTreeSet<IpAddr> = allocated(bed, &pool)
        .difference(&before.allocated)
        .copied()
        .collect();
    assert_eq!(held, ips, "allocations beside the pods' addresses");
    scale_to_zero(bed, &ns, "churn");
    before.nothing_left(bed, &ns, &up);
}

/// The node's plugin swapped for Calico v3.32.1's binary and back while
/// pods run (as an operator rolling calico/cni back and forth): pods added
/// by either binary and deleted by either leave nothing, and Felix's policy
/// holds on the pods of both, whichever binary networked the client.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn swapped_for_calicos_binary_and_back() {
    let test = "node_swapped_for_calicos_binary_and_back";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let Some(theirs) = common::testbed::peer(test, "calico-v3.32.1/calico") else {
        return;
    };
    // calico-node writes the node's name here; Calico's binary insists on
    // it. (Removed again when this test made it.)
    struct NodenameFile(bool);
    impl Drop for NodenameFile {
        fn drop(&mut self) {
            if self.0 {
                let _ = std::fs::remove_file("/var/lib/calico/nodename");
            }
        }
    }
    let nodename = std::path::Path::new("/var/lib/calico/nodename");
    let _made = NodenameFile(!nodename.exists());
    std::fs::create_dir_all("/var/lib/calico").unwrap();
    std::fs::write(nodename, &node).unwrap();
    let node_dir = std::path::PathBuf::from(bed.var("TESTBED_NODE_DIR"));
    let binary = node_dir.join("host/opt/cni/bin/calico");
    let conflist = node_dir.join("host/etc/cni/net.d/10-calico.conflist");
    let ours = (
        std::fs::read(&binary).unwrap(),
        std::fs::read(&conflist).unwrap(),
    );
    // Calico's install renders the stock text as it is: cniVersion 0.3.1
    // (the node's 1.1.0 is for STATUS, which Calico's binary does not answer).
    let mut stock: Value = serde_json::from_slice(&ours.1).unwrap();
    stock["cniVersion"] = json!("0.3.1");
    let theirs = (
        std::fs::read(&theirs).unwrap(),
        serde_json::to_vec_pretty(&stock).unwrap(),
    );
    // As an installer writes: a new file renamed over the old.
    fn put(path: &std::path::Path, bytes: &[u8], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let tmp = path.with_extension("swap");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    struct Installed<'a>(&'a std::path::Path, &'a std::path::Path, (Vec<u8>, Vec<u8>));
    impl Installed<'_> {
        fn put(&self, which: &(Vec<u8>, Vec<u8>)) {
            put(self.0, &which.0, 0o755);
            put(self.1, &which.1, 0o644);
        }
    }
    // Ours again whatever happens here, for the tests after this one.
    impl Drop for Installed<'_> {
        fn drop(&mut self) {
            self.put(&self.2);
        }
    }
    let installed = Installed(&binary, &conflist, ours.clone());
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "a", &node, 4);
    let by_ours = running(bed, &ns, "a", 4);
    installed.put(&theirs);
    deployment(bed, &ns, "b", &node, 4);
    let by_theirs = running(bed, &ns, "b", 4);
    for (pod, ip) in &by_theirs {
        assert!(pool.contains(ip), "{pod}: {ip}");
        assert_eq!(echo_from_node(*ip).0.as_deref(), Ok(pod.as_str()));
    }
    // Felix enforces policy on the pods of both binaries, from probe pods
    // networked by either: a default deny on the namespace's pods...
    let targets: Vec<IpAddr> = by_ours
        .iter()
        .chain(&by_theirs)
        .map(|(_, ip)| *ip)
        .collect();
    let probe = json!({"role": "probe"});
    let policies = network_policies(&ns.name);
    bed.create(
        &policies,
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "deny-servers"},
                "spec": {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                         "policyTypes": ["Ingress"]}}),
    );
    probe_until(bed, &ns, &node, "theirs-denied", &probe, &targets, false);
    installed.put(&ours);
    probe_until(bed, &ns, &node, "ours-denied", &probe, &targets, false);
    // ... and lifted, traffic flows again.
    bed.delete(&format!("{policies}/deny-servers"));
    probe_until(bed, &ns, &node, "ours-open", &probe, &targets, true);
    installed.put(&theirs);
    // Calico's binary deletes pods ours added.
    scale_to_zero(bed, &ns, "a");
    installed.put(&ours);
    // Ours deletes pods Calico's added.
    scale_to_zero(bed, &ns, "b");
    let all: Vec<(String, IpAddr)> = by_ours.into_iter().chain(by_theirs).collect();
    before.nothing_left(bed, &ns, &all);
}

/// scripts/testbed.sh with `args`; panics with its output when it fails.
fn testbed_script(args: &[&str]) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "testbed.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// --- The whole Calico node: Calico's Felix beside the plugin -------------

/// Felix's endpoint status files (FELIX_ENDPOINTSTATUSPATHPREFIX on the
/// calico-node DaemonSet: /var/run/calico/endpoint-status).
const STATUS_DIR: &str = "/var/run/calico/endpoint-status";

/// The status file Felix writes for `pod`'s endpoint.
fn felix_status_file(ns: &Namespace, pod: &str) -> std::path::PathBuf {
    std::path::Path::new(STATUS_DIR).join(calico_cni::plugin::policy_wait::status_file_name(
        "k8s",
        &format!("{}/{pod}", ns.name),
        "eth0",
    ))
}

/// The API path of a namespace's NetworkPolicies.
fn network_policies(ns: &str) -> String {
    format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")
}

/// Felix's log (the calico-node container's), from `since` on (to the
/// second before it).
fn felix_log(bed: &Testbed, since: Instant) -> String {
    let since = since.elapsed().as_secs() + 1;
    let out = std::process::Command::new(format!("{}/kubectl", bed.peers_bin()))
        .args([
            "-n",
            "kube-system",
            "logs",
            "ds/calico-node",
            "-c",
            "calico-node",
            &format!("--since={since}s"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Felix's complaints about what it found on the host: interfaces it does
/// not know, routes in conflict.
fn felix_complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("unknown interface") || (l.contains("route") && l.contains("conflict"))
        })
        .collect()
}

/// Probes `targets` from fresh pods (`name`-1, -2, ...) until every probe
/// has the outcome `open` says (all answer, or none does), within a minute:
/// policy takes Felix a moment to program. The last report.
#[allow(clippy::too_many_arguments)]
fn probe_until(
    bed: &Testbed,
    ns: &Namespace,
    node: &str,
    name: &str,
    labels: &Value,
    targets: &[IpAddr],
    open: bool,
) -> String {
    let end = Instant::now() + Duration::from_secs(60);
    for attempt in 1.. {
        let pod = format!("{name}-{attempt}");
        let (phase, report) = probe_from_labelled_pod(bed, ns, node, &pod, labels.clone(), targets);
        bed.delete(&ns.pod_path(&pod));
        let lines: Vec<&str> = report.lines().collect();
        let answered = lines.iter().filter(|l| !l.contains(" FAIL ")).count();
        let done = if open {
            phase == "Succeeded" && answered == targets.len() * 2
        } else {
            answered == 0 && lines.len() == targets.len() * 2
        };
        if done {
            return report;
        }
        assert!(
            Instant::now() < end,
            "{name}: expected every probe {} after a minute; last ({phase}):\n{report}",
            if open { "answered" } else { "refused" }
        );
    }
    unreachable!()
}

/// Felix sees every pod our plugin networks: its status file for each
/// endpoint appears, naming the host veth our plugin made and the pod's
/// address; Felix's log has no unknown interface or route conflict; the
/// files go with the pods.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn felix_sees_every_pod_we_network() {
    let test = "node_felix_sees_every_pod_we_network";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let since = Instant::now();
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "seen", &node, 6);
    let up = running(bed, &ns, "seen", 6);
    for (pod, ip) in &up {
        let file = felix_status_file(&ns, pod);
        let status: Value = wait_until(
            &format!("Felix's status file for {pod}"),
            Duration::from_secs(60),
            || match std::fs::read(&file) {
                Ok(b) => (true, serde_json::from_slice(&b).unwrap_or_default()),
                Err(e) => (false, Value::String(e.to_string())),
            },
        );
        let veth = calico_cni::datastore::names::veth_name_for_workload(&ns.name, pod, None);
        assert_eq!(status["ifaceName"], veth, "{pod}: {status}");
        assert_eq!(status["ipv4Nets"], json!([format!("{ip}/32")]), "{pod}");
    }
    let log = felix_log(bed, since);
    assert!(
        felix_complaints(&log).is_empty(),
        "Felix complained:\n{:#?}",
        felix_complaints(&log)
    );
    scale_to_zero(bed, &ns, "seen");
    before.nothing_left(bed, &ns, &up);
    for (pod, _) in &up {
        let file = felix_status_file(&ns, pod);
        wait_until(
            &format!("Felix's status file for {pod} gone"),
            Duration::from_secs(60),
            || (!file.exists(), file.clone()),
        );
    }
    eprintln!(
        "{test}: 6 status files, {} lines of Felix's log read",
        log.lines().count()
    );
}

/// A default-deny NetworkPolicy, enforced by Felix on our pods, blocks
/// pod-to-pod traffic (TCP and UDP); a policy allowing the client's label
/// restores it for that client only.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn a_default_deny_policy_blocks_and_an_allow_rule_restores() {
    let test = "node_a_default_deny_policy_blocks_and_an_allow_rule_restores";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "srv", &node, 2);
    let up = running(bed, &ns, "srv", 2);
    let targets: Vec<IpAddr> = up.iter().map(|(_, ip)| *ip).collect();
    let client = json!({"role": "client"});
    let other = json!({"role": "other"});
    probe_until(bed, &ns, &node, "open", &client, &targets, true);
    let policies = network_policies(&ns.name);
    bed.create(
        &policies,
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "default-deny"},
                "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}),
    );
    probe_until(bed, &ns, &node, "denied", &client, &targets, false);
    bed.create(
        &policies,
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "allow-client"},
                "spec": {"podSelector": {"matchLabels": {"app": "srv"}},
                         "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}}),
    );
    probe_until(bed, &ns, &node, "allowed", &client, &targets, true);
    probe_until(bed, &ns, &node, "still-denied", &other, &targets, false);
    scale_to_zero(bed, &ns, "srv");
    before.nothing_left(bed, &ns, &up);
}

/// calicoctl, with the Kubernetes datastore's v1 CRDs the node runs on.
fn calicoctl(bed: &Testbed, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(bed.peer("calico-v3.32.1/calicoctl"))
        .args(args)
        .env("DATASTORE_TYPE", "kubernetes")
        .env("CALICO_API_GROUP", "crd.projectcalico.org/v1")
        .env("KUBECONFIG", bed.var("KUBECONFIG"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.unwrap_or_default().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "calicoctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Calico GlobalNetworkPolicy applied with Calico's calicoctl (denying
/// ingress to this test's pods) is enforced by Felix on pods our plugin
/// networks; deleted, traffic flows again.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn a_global_network_policy_from_calicoctl_is_enforced() {
    let test = "node_a_global_network_policy_from_calicoctl_is_enforced";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    if common::testbed::peer(test, "calico-v3.32.1/calicoctl").is_none() {
        return;
    }
    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "gsrv", &node, 2);
    let up = running(bed, &ns, "gsrv", 2);
    let targets: Vec<IpAddr> = up.iter().map(|(_, ip)| *ip).collect();
    let labels = json!({});
    probe_until(bed, &ns, &node, "open", &labels, &targets, true);
    let name = format!("deny-{}", ns.name);
    let gnp = json!({
        "apiVersion": "projectcalico.org/v3", "kind": "GlobalNetworkPolicy",
        "metadata": {"name": name},
        "spec": {"order": 10,
                 "selector": format!("app == 'gsrv' && projectcalico.org/namespace == '{}'", ns.name),
                 "types": ["Ingress"],
                 "ingress": [{"action": "Deny"}]}
    });
    // (Removed whatever happens: it is cluster-wide.)
    struct Gnp<'a>(&'a Testbed, String);
    impl Drop for Gnp<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new(self.0.peer("calico-v3.32.1/calicoctl"))
                .args(["delete", "globalnetworkpolicy", &self.1])
                .env("DATASTORE_TYPE", "kubernetes")
                .env("CALICO_API_GROUP", "crd.projectcalico.org/v1")
                .env("KUBECONFIG", self.0.var("KUBECONFIG"))
                .output();
        }
    }
    calicoctl(bed, &["apply", "-f", "-"], Some(&gnp.to_string()));
    let gnp_guard = Gnp(bed, name.clone());
    // Calico's tool reads back what it wrote, in its own terms.
    let got: Value = serde_json::from_str(&calicoctl(
        bed,
        &["get", "globalnetworkpolicy", &name, "-o", "json"],
        None,
    ))
    .unwrap();
    assert_eq!(got["metadata"]["name"], name.as_str(), "{got}");
    assert_eq!(
        got["metadata"]["labels"]["projectcalico.org/tier"], "default",
        "{got}"
    );
    probe_until(bed, &ns, &node, "denied", &labels, &targets, false);
    calicoctl(bed, &["delete", "globalnetworkpolicy", &name], None);
    drop(gnp_guard);
    probe_until(bed, &ns, &node, "open-again", &labels, &targets, true);
    scale_to_zero(bed, &ns, "gsrv");
    before.nothing_left(bed, &ns, &up);
}

/// The CNI config's `policy_setup_timeout_seconds` makes a pod's ADD wait
/// for Felix's status file for that pod: our log shows the wait begin
/// before Felix wrote the file and end after it, and the ADD's result
/// after that.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn the_add_waits_for_felix_with_policy_setup_timeout() {
    let test = "node_the_add_waits_for_felix_with_policy_setup_timeout";
    let Some((bed, node, pool)) = node(test) else {
        return;
    };
    let node_dir = std::path::PathBuf::from(bed.var("TESTBED_NODE_DIR"));
    let conflist = node_dir.join("host/etc/cni/net.d/10-calico.conflist");
    let original = std::fs::read(&conflist).unwrap();
    struct Restore(std::path::PathBuf, Vec<u8>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let tmp = self.0.with_extension("restore");
            let _ = std::fs::write(&tmp, &self.1);
            let _ = std::fs::rename(&tmp, &self.0);
        }
    }
    let _restore = Restore(conflist.clone(), original.clone());
    let mut conf: Value = serde_json::from_slice(&original).unwrap();
    conf["plugins"][0]["policy_setup_timeout_seconds"] = json!(30);
    conf["plugins"][0]["log_level"] = json!("debug");
    let log_path = conf["plugins"][0]["log_file_path"]
        .as_str()
        .unwrap_or("/var/log/calico/cni/cni.log")
        .to_string();
    let tmp = conflist.with_extension("policy");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
    std::fs::rename(&tmp, &conflist).unwrap();

    let ns = bed.namespace(json!({}), json!({}));
    let before = Before::now(bed, &pool);
    deployment(bed, &ns, "waited", &node, 1);
    let up = running(bed, &ns, "waited", 1);
    let (pod, _) = &up[0];
    let file = felix_status_file(&ns, pod);
    let written: std::time::SystemTime = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .expect("Felix's status file");
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let log = std::fs::read_to_string(&log_path).unwrap();
    let at = |what: &str| -> std::time::SystemTime {
        let line = log
            .lines()
            .rfind(|l| l.contains(what) && l.contains(&name))
            .unwrap_or_else(|| panic!("no {what:?} for {name} in {log_path}"));
        rfc3339_time(line.split_whitespace().next().unwrap())
    };
    let waiting = at("waiting for the endpoint's status file");
    let present = at("endpoint status file present");
    assert!(
        waiting <= written && written <= present,
        "the ADD did not wait for Felix: began waiting {waiting:?}, file written {written:?}, seen {present:?}"
    );
    eprintln!(
        "{test}: the ADD waited {:?} for Felix's status file (written {:?} after the wait began)",
        present.duration_since(waiting).unwrap(),
        written.duration_since(waiting).unwrap()
    );
    drop(_restore);
    scale_to_zero(bed, &ns, "waited");
    before.nothing_left(bed, &ns, &up);
}

/// An RFC 3339 UTC time as our log writes it (`2026-12-06T07:20:28.324102Z`).
fn rfc3339_time(s: &str) -> std::time::SystemTime {
    let (date, time) = s.trim_end_matches('Z').split_once('T').expect(s);
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    // Days since 1970-01-01 of a proleptic Gregorian date.
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2];
    let nanos: u32 = format!("{frac:0<9}")[..9].parse().unwrap();
    std::time::UNIX_EPOCH + Duration::new(secs as u64, nanos)
}

/// STATUS as containerd asks it on this node: the plugin exec'd with the
/// installed conflist's `calico` plugin and the node's defaults (the
/// status cache and the datastore watch's report under /var/lib/calico).
fn node_status(bed: &Testbed) -> Outcome {
    let dir = std::path::PathBuf::from(bed.var("TESTBED_NODE_DIR"));
    let list: Value = serde_json::from_slice(
        &std::fs::read(dir.join("host/etc/cni/net.d/10-calico.conflist")).unwrap(),
    )
    .unwrap();
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    let bin = dir.join("host/opt/cni/bin");
    let vars = env_of(&[
        ("CNI_COMMAND", "STATUS"),
        ("CNI_PATH", bin.to_str().unwrap()),
    ]);
    exec(
        bin.join("calico").to_str().unwrap(),
        &vars,
        &conf.to_string(),
    )
}

/// The calico-node pod's `cni-token` container (`calico install --watch`)
/// follows the datastore for STATUS: its report under
/// /var/lib/calico/cni-status is ready and fresh, and when ClusterInformation
/// says the datastore is not ready — which nothing on the node can see,
/// and which STATUS's own probe would find only within 2 minutes — STATUS
/// on the node says so within a second, then ready again once it is.
#[test]
#[ignore = "the node stage of scripts/test.sh: -- --ignored with the node up"]
fn status_hears_from_the_datastore_watch_at_once() {
    let test = "node_status_hears_from_the_datastore_watch_at_once";
    let Some((bed, _, _)) = node(test) else {
        return;
    };
    let report_file = "/var/lib/calico/cni-status/datastore-watch.json";
    let report = wait_until("a fresh ready report", Duration::from_secs(60), || {
        let report: Option<Value> = std::fs::read(report_file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let fresh = report.as_ref().is_some_and(|r| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            r["verdict"] == "ready" && now.saturating_sub(r["at_ms"].as_u64().unwrap()) < 25_000
        });
        (fresh, report)
    });
    eprintln!("{test}: the watch's report: {report:?}");
    node_status(bed).assert_ok();

    let info = "/apis/crd.projectcalico.org/v1/clusterinformations/default";
    struct Ready(&'static Testbed, &'static str);
    impl Drop for Ready {
        fn drop(&mut self) {
            self.0
                .merge_patch(self.1, &json!({"spec": {"datastoreReady": true}}));
        }
    }
    let restore = Ready(bed, info);
    let flipped = Instant::now();
    bed.merge_patch(info, &json!({"spec": {"datastoreReady": false}}));
    let out = wait_until("STATUS not ready", Duration::from_secs(30), || {
        let out = node_status(bed);
        (out.code != 0, out)
    });
    let not_ready = flipped.elapsed();
    assert_eq!(out.json()["code"], 50, "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("the datastore watch on this node reports")
            && msg.contains("datastoreReady is not true"),
        "{msg}"
    );
    let back = Instant::now();
    drop(restore);
    wait_until("STATUS ready again", Duration::from_secs(30), || {
        let out = node_status(bed);
        (out.code == 0, out)
    });
    eprintln!(
        "{test}: STATUS not ready {} ms after datastoreReady turned false, ready {} ms after it turned true",
        not_ready.as_millis(),
        back.elapsed().as_millis()
    );
    assert!(not_ready < Duration::from_secs(5), "{not_ready:?}");
}
