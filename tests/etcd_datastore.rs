//! The etcd v3 datastore on real etcd: what the plugin writes is Calico's
//! key layout and value format (read back raw with etcdctl), `calico -t`,
//! and a three-member cluster losing one member (everything works) and
//! then its quorum (ADD fails cleanly within the deadline and leaves
//! nothing on the host; DEL completes its local teardown), then recovering.

mod common;

use std::time::{Duration, Instant};

use common::etcd::{EtcdAccess, PrivateCluster, calico_etcd};
use common::ipam::{World, address};
use common::*;
use serde_json::{Value, json};

const WEPS: &str = "/calico/resources/v3/projectcalico.org/workloadendpoints";

fn test_connection(conf: &Value) -> Outcome {
    let env = env_of(&[("CNI_COMMAND", "VERSION")]);
    let mut out = std::process::Command::new(CALICO)
        .arg("-t")
        .envs(&env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    out.stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let o = out.wait_with_output().unwrap();
    Outcome {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn etcd_conf(a: &EtcdAccess) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "net1", "type": "calico",
        "datastore_type": "etcdv3", "etcd_endpoints": a.endpoints_csv(),
        "etcd_ca_cert_file": a.ca, "etcd_cert_file": a.cert, "etcd_key_file": a.key,
    })
}

#[test]
fn calico_t_tests_the_connection() {
    let test = "calico_t_tests_the_connection";
    let Some(a) = calico_etcd(test) else { return };
    common::ipam::ensure_etcd_cluster_information(&a);
    let ok = test_connection(&etcd_conf(&a));
    assert_eq!(ok.code, 0, "{ok:?}");
    assert_eq!(ok.stdout, "");

    // A port nothing listens on: code 100, Calico's message.
    let wrong = a.with_endpoints(&["https://127.0.0.1:1".to_string()]);
    let started = Instant::now();
    let out = test_connection(&etcd_conf(&wrong));
    assert_eq!(out.code, 1, "{out:?}");
    let reply = out.json();
    assert_eq!(reply["code"], 100, "{reply}");
    assert_eq!(reply["msg"], "data store connection failed");
    assert!(
        reply["details"].as_str().unwrap().contains("127.0.0.1:1"),
        "{reply}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // The first endpoint down, the others up: it answers.
    let mut endpoints = vec!["https://127.0.0.1:1".to_string()];
    endpoints.extend(a.endpoints.clone());
    let out = test_connection(&etcd_conf(&a.with_endpoints(&endpoints)));
    assert_eq!(out.code, 0, "{out:?}");

    // A client certificate the cluster does not trust: refused.
    let mut untrusted = a.clone();
    untrusted.cert = a.ca.clone();
    let out = test_connection(&etcd_conf(&untrusted));
    assert_eq!(out.code, 1, "{out:?}");
}

/// The raw value of `key`, JSON.
fn raw(a: &EtcdAccess, key: &str) -> Value {
    a.get(key)
        .unwrap_or_else(|| panic!("no key {key}; keys: {:?}", a.keys("/calico/")))
        .0
}

#[test]
fn plain_cni_add_writes_calicos_keys_and_values() {
    let test = "plain_cni_add_writes_calicos_keys_and_values";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, common::ipam::Backend::Etcd) else {
        return;
    };
    let a = w.etcd_access().clone();
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let netns = Netns::new();
    let cid = container_id();
    let conf = w.conf();
    let r = w
        .plugin("ADD", &cid, &netns.path(), &conf, "", None)
        .assert_ok()
        .json();
    let ip = address(&r, 0);
    assert!(pool.contains(&ip.addr()), "{r}");

    // The WorkloadEndpoint: v3 JSON at Calico's key, no resourceVersion.
    // Calico's name: the node's dashes doubled.
    let name = format!("{}-cni-{cid}-eth0", w.node.replace('-', "--"));
    let key = format!("{WEPS}/default/{name}");
    let wep = raw(&a, &key);
    assert_eq!(wep["kind"], "WorkloadEndpoint");
    assert_eq!(wep["apiVersion"], "projectcalico.org/v3");
    let meta = &wep["metadata"];
    assert_eq!(meta["name"], json!(name));
    assert_eq!(meta["namespace"], "default");
    assert!(meta.get("resourceVersion").is_none(), "{meta}");
    assert_eq!(meta["uid"].as_str().unwrap().len(), 36, "{meta}");
    assert!(meta["creationTimestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(meta["labels"]["projectcalico.org/namespace"], "default");
    assert_eq!(meta["labels"]["projectcalico.org/orchestrator"], "cni");
    let spec = &wep["spec"];
    assert_eq!(spec["orchestrator"], "cni");
    assert_eq!(spec["node"], json!(w.node));
    assert_eq!(spec["containerID"], json!(cid));
    assert_eq!(spec["endpoint"], "eth0");
    assert_eq!(spec["interfaceName"], json!(host_veth(&cid)));
    assert_eq!(spec["profiles"], json!(["net1"]));
    assert_eq!(spec["ipNetworks"], json!([format!("{}/32", ip.addr())]));
    assert!(
        spec["mac"].as_str().is_some_and(|m| m.len() == 17),
        "{spec}"
    );

    // IPAM in libcalico-go's model format under /calico/ipam/v2.
    let block = ipnet::IpNet::new(ip.addr(), 26).unwrap().trunc();
    let segment = block.to_string().replace('/', "-");
    let b = raw(
        &a,
        &format!("/calico/ipam/v2/assignment/ipv4/block/{segment}"),
    );
    assert_eq!(b["cidr"], json!(block.to_string()));
    assert_eq!(b["affinity"], json!(format!("host:{}", w.node)));
    assert!(b["affinity_claim_time"].is_string(), "{b}");
    assert!(b.get("strictAffinity").is_none() && b.get("affinityClaimTime").is_none());
    assert_eq!(b["allocations"][0], json!(0), "{b}");
    assert_eq!(b["unallocated"].as_array().unwrap().len(), 63);
    assert_eq!(
        b["attributes"][0]["handle_id"],
        json!(format!("net1.{cid}"))
    );
    assert_eq!(b["attributes"][0]["secondary"]["node"], json!(w.node));
    assert_eq!(b["deleted"], json!(false));
    let affinity = raw(
        &a,
        &format!("/calico/ipam/v2/host/{}/ipv4/block/{segment}", w.node),
    );
    assert_eq!(affinity, json!({"state": "confirmed", "deleted": false}));
    let handle = raw(&a, &format!("/calico/ipam/v2/handle/net1.{cid}"));
    assert_eq!(
        handle,
        json!({"block": {block.to_string(): 1}, "deleted": false})
    );

    // CHECK, then DEL: the endpoint and handle keys go, the address is free.
    w.plugin(
        "CHECK",
        &cid,
        &netns.path(),
        &with_prev(&conf, &r),
        "",
        None,
    )
    .assert_ok();
    w.plugin("DEL", &cid, &netns.path(), &conf, "", None)
        .assert_ok();
    assert!(a.get(&key).is_none());
    assert!(
        a.get(&format!("/calico/ipam/v2/handle/net1.{cid}"))
            .is_none()
    );
    let b = raw(
        &a,
        &format!("/calico/ipam/v2/assignment/ipv4/block/{segment}"),
    );
    assert!(
        b["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_null)
    );
    // DEL again: idempotent.
    w.plugin("DEL", &cid, &netns.path(), &conf, "", None)
        .assert_ok();
}

fn with_prev(conf: &Value, result: &Value) -> Value {
    let mut c = conf.clone();
    c["prevResult"] = result.clone();
    c
}

/// Nothing of container `cid` on the host or in `netns`.
fn assert_nothing_on_the_host(netns: &Netns, cid: &str) {
    assert!(netns.link("eth0").is_none(), "eth0 left in the netns");
    assert!(!host_link_exists(&host_veth(cid)), "host veth left");
    let routes = host_ip_json(&["route", "show"]);
    let left: Vec<&Value> = routes
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dev"] == json!(host_veth(cid)))
        .collect();
    assert!(left.is_empty(), "host routes left: {left:?}");
}

#[test]
fn a_cluster_that_loses_a_member_then_its_quorum() {
    let test = "a_cluster_that_loses_a_member_then_its_quorum";
    if !root_or_skip(test) {
        return;
    }
    let Some(mut cluster) = PrivateCluster::start(test, 3) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["deadline_seconds"] = json!(6);
    let add = |cid: &str, ns: &Netns| w.plugin("ADD", cid, &ns.path(), &conf, "", None);
    let del = |cid: &str, ns: &Netns| w.plugin("DEL", cid, &ns.path(), &conf, "", None);

    let (ns_a, a) = (Netns::new(), container_id());
    add(&a, &ns_a).assert_ok();

    // The first endpoint's member stops: every verb still works.
    cluster.stop_member(0);
    let (ns_b, b) = (Netns::new(), container_id());
    let r = add(&b, &ns_b).assert_ok().json();
    w.plugin("CHECK", &b, &ns_b.path(), &with_prev(&conf, &r), "", None)
        .assert_ok();
    del(&b, &ns_b).assert_ok();
    assert_nothing_on_the_host(&ns_b, &b);

    // A second one: no quorum. ADD fails within its deadline, cleanly.
    cluster.stop_member(1);
    let (ns_c, c) = (Netns::new(), container_id());
    let started = Instant::now();
    let out = add(&c, &ns_c);
    let took = started.elapsed();
    assert_eq!(out.code, 1, "{out:?}");
    let reply = out.json();
    assert!(
        reply["code"].as_u64().is_some() && reply["msg"].is_string(),
        "{reply}"
    );
    eprintln!("quorum lost: ADD failed in {took:?}: {reply}");
    // The deadline, then the rollback's own budget (5 s: the member still
    // serves its own view, so the ADD gets as far as the IPAM, whose
    // release is then tried), and the process's start and exit.
    assert!(
        took < Duration::from_secs(6 + 5) + Duration::from_millis(500),
        "ADD took {took:?}: {reply}"
    );
    assert_nothing_on_the_host(&ns_c, &c);
    // DEL of the pod made before: its local part completes (the interface
    // goes); the datastore part is reported.
    let started = Instant::now();
    let out = del(&a, &ns_a);
    eprintln!("quorum lost: DEL in {:?}: {out:?}", started.elapsed());
    assert_nothing_on_the_host(&ns_a, &a);
    assert!(out.code == 0 || out.json()["msg"].is_string(), "{out:?}");

    // The members come back: the next calls succeed, and the retried DEL
    // releases what the failed one could not.
    cluster.start_member(0);
    cluster.start_member(1);
    for i in 0..3 {
        cluster.wait_healthy(i, Duration::from_secs(30));
    }
    add(&c, &ns_c).assert_ok();
    del(&c, &ns_c).assert_ok();
    del(&a, &ns_a).assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    let access = cluster.access();
    assert!(access.keys("/calico/ipam/v2/handle/").is_empty());
    assert!(access.keys(&format!("{WEPS}/")).is_empty());
}

/// Kubernetes mode on the etcd datastore (Calico's etcd deployments): the
/// pod and namespace come from the API server, the WorkloadEndpoint and
/// IPAM go to etcd, the pod's podIP annotations are not written.
#[test]
fn a_kubernetes_pod_on_the_etcd_datastore() {
    let test = "a_kubernetes_pod_on_the_etcd_datastore";
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let Some(w) = World::new(test, common::ipam::Backend::Etcd) else {
        return;
    };
    let a = w.etcd_access().clone();
    w.pool(&w.v4(0).to_string(), json!({}));
    let ns = bed.namespace(json!({"team": "a"}), json!({}));
    ns.create_pod(json!({
        "metadata": {"name": "pod1", "labels": {"app": "web"}},
        "spec": {"nodeName": w.node, "containers": [{"name": "c", "image": "i"}]}
    }));
    let mut conf = w.conf();
    conf["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
    conf["policy"] = json!({"type": "k8s"});
    let netns = Netns::new();
    let cid = container_id();
    let args = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
        ns.name
    );
    let r = w
        .plugin("ADD", &cid, &netns.path(), &conf, &args, None)
        .assert_ok()
        .json();
    let ip = address(&r, 0);
    let name = format!("{}-k8s-pod1-eth0", w.node.replace('-', "--"));
    let key = format!("{WEPS}/{}/{name}", ns.name);
    let wep = raw(&a, &key);
    let spec = &wep["spec"];
    assert_eq!(spec["orchestrator"], "k8s");
    assert_eq!(spec["pod"], "pod1");
    assert_eq!(spec["containerID"], json!(cid));
    assert_eq!(spec["ipNetworks"], json!([format!("{}/32", ip.addr())]));
    // The service account profile only when the pod names one (the test
    // bed may run without the ServiceAccount admission plugin).
    let sa = ns.pod("pod1").unwrap()["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut profiles = vec![format!("kns.{}", ns.name)];
    if !sa.is_empty() {
        profiles.push(format!("ksa.{}.{sa}", ns.name));
        assert_eq!(spec["serviceAccountName"], json!(sa));
        assert_eq!(
            wep["metadata"]["labels"]["projectcalico.org/serviceaccount"],
            json!(sa)
        );
    }
    assert_eq!(spec["profiles"], json!(profiles));
    let labels = &wep["metadata"]["labels"];
    assert_eq!(labels["projectcalico.org/namespace"], json!(ns.name));
    assert_eq!(labels["projectcalico.org/orchestrator"], "k8s");
    // The pod's own labels (namespace labels reach policy via kns.).
    assert_eq!(labels["app"], "web", "{labels}");
    let handle = format!("net1.{cid}");
    assert_eq!(w.addresses_of(&handle), [ip.addr()]);

    w.plugin(
        "CHECK",
        &cid,
        &netns.path(),
        &with_prev(&conf, &r),
        &args,
        None,
    )
    .assert_ok();
    w.plugin("DEL", &cid, &netns.path(), &conf, &args, None)
        .assert_ok();
    assert!(a.get(&key).is_none(), "the endpoint key is left");
    assert!(w.handle(&handle).is_none());
    assert!(w.allocations().is_empty());
}

/// etcd's own authentication (ETCD_USERNAME, ETCD_PASSWORD, as Calico reads
/// them): a private cluster with auth on that takes clients without a
/// certificate (so only the token of a user and password can open it).
/// With them, ADD and DEL work (read back as root); without them, or with a
/// wrong or empty password, ADD fails and changes nothing; with a client
/// certificate, etcd's gateway refuses (it will not take a certificate's
/// name for a user) and the error says so; the password is in no log line.
#[test]
fn etcd_users_authenticate_with_a_password() {
    let test = "etcd_users_authenticate_with_a_password";
    if !root_or_skip(test) {
        return;
    }
    let Some(cluster) = PrivateCluster::start_with(test, 1, false) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let a = cluster.access();
    for args in [
        &["user", "add", "root:root-pw"][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "calico-cni"],
        &[
            "role",
            "grant-permission",
            "calico-cni",
            "--prefix=true",
            "readwrite",
            "/calico/",
        ],
        &["user", "add", "calico-cni:s3cret-pw"],
        &["user", "grant-role", "calico-cni", "calico-cni"],
        &["auth", "enable"],
    ] {
        a.etcdctl(args);
    }
    let as_root = |args: &[&str]| a.etcdctl(&[&["--user", "root:root-pw"][..], args].concat());
    let keys = || as_root(&["get", "/calico/ipam/v2/handle/", "--prefix", "--keys-only"]);

    let mut conf = w.conf();
    let plugin = conf.as_object_mut().unwrap();
    plugin.remove("etcd_cert_file");
    plugin.remove("etcd_key_file");
    let with = |user: &str, pw: &str| {
        vec![
            ("ETCD_USERNAME", user.to_owned()),
            ("ETCD_PASSWORD", pw.to_owned()),
        ]
    };
    let run = |cmd: &str, cid: &str, ns: &Netns, conf: &Value, env: &[(&str, String)]| {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        w.plugin_with_env(cmd, cid, &ns.path(), conf, "", &env)
    };

    let (ns, cid) = (Netns::new(), container_id());
    let good = with("calico-cni", "s3cret-pw");
    for (conf, env, why, says) in [
        (&conf, vec![], "no credentials", "user name is empty"),
        (
            &conf,
            with("calico-cni", "wrong-pw"),
            "a wrong password",
            "authentication failed",
        ),
        (
            &conf,
            with("calico-cni", ""),
            "an empty password",
            "user name is empty",
        ),
    ] {
        let out = run("ADD", &cid, &ns, conf, &env);
        assert_eq!(out.code, 1, "{why}: {out:?}");
        assert!(
            out.json()["msg"].as_str().unwrap().contains(says),
            "{why}: {out:?}"
        );
        assert!(keys().trim().is_empty(), "{why}: {}", keys());
        assert_nothing_on_the_host(&ns, &cid);
    }

    let r = run("ADD", &cid, &ns, &conf, &good).assert_ok().json();
    let ip = address(&r, 0).addr();
    assert!(keys().contains(&cid), "the handle is written: {}", keys());
    let blocks = as_root(&[
        "get",
        "/calico/ipam/v2/assignment/",
        "--prefix",
        "--print-value-only",
    ]);
    assert!(blocks.contains(&cid), "{blocks}");
    run("DEL", &cid, &ns, &conf, &good).assert_ok();
    assert!(keys().trim().is_empty(), "released: {}", keys());
    assert_nothing_on_the_host(&ns, &cid);
    assert!(!w.log().contains("s3cret-pw"), "the password is logged");
    eprintln!("{test}: {ip} allocated and released as calico-cni");
    // The world's own cleanup reads without a user.
    as_root(&["auth", "disable"]);

    // A cluster that takes client certificates, with auth on: its gateway
    // refuses a request that carries one (even with a user's token), and
    // the error says what works.
    let Some(strict) = PrivateCluster::start(test, 1) else {
        return;
    };
    let s = strict.access();
    s.etcdctl(&["user", "add", "root:root-pw"]);
    s.etcdctl(&["user", "grant-role", "root", "root"]);
    s.etcdctl(&["auth", "enable"]);
    let mut certified = w.conf();
    certified["etcd_endpoints"] = json!(s.endpoints_csv());
    certified["etcd_cert_file"] = json!(s.cert);
    certified["etcd_key_file"] = json!(s.key);
    let out = run("ADD", &cid, &ns, &certified, &with("root", "root-pw"));
    assert_eq!(out.code, 1, "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains("CommonName") && msg.contains("ETCD_USERNAME"),
        "{msg}"
    );
    assert_nothing_on_the_host(&ns, &cid);
}

/// A DNS server of the test's on a loopback address of its own, answering
/// the SRV queries for `_etcd-client-ssl._tcp.<domain>` with one record
/// (target `localhost`, `port`) and everything else with NXDOMAIN; it
/// counts what it was asked.
struct SrvServer {
    address: std::net::Ipv4Addr,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SrvServer {
    fn start(domain: &str, port: u16) -> SrvServer {
        let address = std::net::Ipv4Addr::new(
            127,
            53,
            (std::process::id() % 250) as u8,
            1 + (port % 250) as u8,
        );
        let socket =
            std::net::UdpSocket::bind((address, 53)).expect("port 53 on a loopback address");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let wanted = format!("_etcd-client-ssl._tcp.{domain}");
        let (log, done) = (asked.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                let query = &buf[..n];
                // The question's name: labels from byte 12.
                let (mut at, mut labels) = (12, Vec::new());
                while query[at] != 0 {
                    let len = query[at] as usize;
                    labels.push(String::from_utf8_lossy(&query[at + 1..at + 1 + len]).into_owned());
                    at += 1 + len;
                }
                let question_end = at + 5;
                let name = labels.join(".");
                log.lock().unwrap().push(name.clone());
                let mut answer = query[..question_end].to_vec();
                answer[2] = 0x85; // QR, AA, RD
                if name == wanted {
                    answer[3] = 0x80;
                    answer[6..8].copy_from_slice(&[0, 1]);
                    answer.extend_from_slice(&[0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 30]);
                    let target = b"\x09localhost\x00";
                    answer.extend_from_slice(&((6 + target.len()) as u16).to_be_bytes());
                    answer.extend_from_slice(&[0, 0, 0, 10]);
                    answer.extend_from_slice(&port.to_be_bytes());
                    answer.extend_from_slice(target);
                } else {
                    answer[3] = 0x83; // NXDOMAIN
                }
                let _ = socket.send_to(&answer, from);
            }
        });
        SrvServer {
            address,
            asked,
            stop,
        }
    }
}

impl Drop for SrvServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `etcd_discovery_srv`: the members from DNS SRV records, as etcd's client
/// finds them for Calico, asked of the name server of /etc/resolv.conf —
/// here one of the test's on loopback, seen through a resolv.conf mounted
/// over the host's in a mount namespace of the plugin's own. ADD and DEL
/// work on the member it names; a domain without records and one given
/// beside etcd_endpoints are refused with Calico's words.
#[test]
fn members_from_dns_srv_records() {
    let test = "members_from_dns_srv_records";
    if !root_or_skip(test) {
        return;
    }
    let Some(cluster) = PrivateCluster::start(test, 1) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let port: u16 = cluster
        .endpoint(0)
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let dns = SrvServer::start("calico.test", port);
    let resolv = w.dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", dns.address)).unwrap();
    let run = |verb: &str, cid: &str, conf: &Value| {
        let env = env_of(&[
            ("CNI_COMMAND", verb),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/not-needed"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &w.bin.display().to_string()),
        ]);
        let ipam = w.bin.join("calico-ipam").display().to_string();
        let script = format!(
            "mount --bind {} /etc/resolv.conf && exec {ipam}",
            resolv.display()
        );
        common::exec_args(
            "unshare",
            &["--mount", "sh", "-c", &script],
            &env,
            &conf.to_string(),
        )
    };
    let mut conf = w.conf();
    conf.as_object_mut().unwrap().remove("etcd_endpoints");
    conf["etcd_discovery_srv"] = json!("calico.test");

    let cid = container_id();
    let r = run("ADD", &cid, &conf).assert_ok().json();
    let ip = address(&r, 0).addr();
    assert!(
        w.allocations().iter().any(|(a, _)| *a == ip),
        "{:?}",
        w.allocations()
    );
    let asked = dns.asked.lock().unwrap().clone();
    assert!(
        asked.contains(&"_etcd-client-ssl._tcp.calico.test".to_string()),
        "{asked:?}"
    );
    assert!(
        asked.contains(&"_etcd-client._tcp.calico.test".to_string()),
        "{asked:?}"
    );
    run("DEL", &cid, &conf).assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());

    let mut nothing = conf.clone();
    nothing["etcd_discovery_srv"] = json!("nothing.test");
    let out = run("ADD", &container_id(), &nothing);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap()
            .contains("dns lookup errors"),
        "{out:?}"
    );

    let mut both = conf.clone();
    both["etcd_endpoints"] = json!(cluster.endpoint(0));
    let out = run("ADD", &container_id(), &both);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap()
            .contains("multiple discovery or bootstrap options specified"),
        "{out:?}"
    );
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
