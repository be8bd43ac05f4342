//! Calico's IPAM test vectors (calico-behaviour.md §10, §11 items 12, 29,
//! 36, 39, 43-48) against the built binary: as `calico-ipam` (this binary
//! under that name, exec'd directly) and as the `calico` plugin running it,
//! each on the embedded store and, unless the vector is about Kubernetes
//! only, on the test bed's real kube-apiserver. The IPAM objects are read
//! back from the store (or through the admin API) and checked field by
//! field; every world's pools, node and address ranges are its own (see
//! tests/common/ipam.rs).

mod common;

use std::net::IpAddr;

use common::ipam::*;
use common::testbed::{Namespace, Testbed, testbed};
use common::*;
use ipnet::IpNet;
use serde_json::{Value, json};

const POD_IP: &str = "cni.projectcalico.org/podIP";
const POD_IPS: &str = "cni.projectcalico.org/podIPs";
const IPV4_POOLS: &str = "cni.projectcalico.org/ipv4pools";

/// One `#[test]` running vector `$name` on `$backend`.
macro_rules! variant {
    ($name:ident, $variant:ident, $backend:ident) => {
        #[test]
        fn $variant() {
            let test = concat!(stringify!($name), "::", stringify!($variant));
            if let Some(w) = World::new(test, Backend::$backend) {
                super::$name(test, &w);
            }
        }
    };
}

/// Runs `$body(&World)` on the embedded store (`embedded`) and on the test
/// bed's API server (`kdd`).
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            use super::*;
            variant!($name, embedded, Embedded);
            variant!($name, kdd, Kdd);
        }
    };
}

/// As `on_both!`, and on the test bed's etcd cluster (`etcd`).
macro_rules! on_all {
    ($name:ident) => {
        mod $name {
            use super::*;
            variant!($name, embedded, Embedded);
            variant!($name, kdd, Kdd);
            variant!($name, etcd, Etcd);
        }
    };
}

/// The `n`-th address of a network.
fn nth(net: &IpNet, n: u32) -> IpAddr {
    address_at(&net.trunc(), n as usize)
}

/// A block's resource name: its CIDR with `.`, `:` and `/` as `-`.
fn block_name(cidr: &IpNet) -> String {
    cidr.to_string().replace(['.', ':', '/'], "-")
}

/// `w`'s block that holds `ip`, as stored.
fn stored_block_holding(w: &World, ip: IpAddr) -> Value {
    w.blocks()
        .into_iter()
        .find(|b| cidr_of(b).is_some_and(|n| n.contains(&ip)))
        .expect("the address's block")
}

/// The CIDR of `w`'s block that holds `ip`.
fn block_holding(w: &World, ip: IpAddr) -> IpNet {
    cidr_of(&stored_block_holding(w, ip)).expect("the block's CIDR")
}

fn cidr_of(block: &Value) -> Option<IpNet> {
    block["spec"]["cidr"].as_str().and_then(|c| c.parse().ok())
}

fn msg(out: &Outcome) -> String {
    out.json()["msg"].as_str().unwrap_or_default().to_string()
}

/// A failed call: exit code 1 and an error whose message contains `want`.
fn assert_fails_with(out: &Outcome, want: &str) {
    assert_eq!(
        out.code, 1,
        "expected failure: {} / {}",
        out.stdout, out.stderr
    );
    let m = msg(out);
    assert!(m.contains(want), "error {m:?} does not contain {want:?}");
}

/// Every address of the result has a route whose destination contains it.
fn assert_routes_cover(result: &Value) {
    let routes: Vec<IpNet> = result["routes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| r["dst"].as_str().unwrap().parse().unwrap())
        .collect();
    for ip in result["ips"].as_array().unwrap() {
        let a: IpNet = ip["address"].as_str().unwrap().parse().unwrap();
        assert!(
            routes.iter().any(|r| r.contains(&a.addr())),
            "no route contains {a}: {result}"
        );
    }
}

/// Go's `time.Time.String()` of a UTC time:
/// `2006-01-02 15:04:05.999999999 +0000 UTC`.
fn is_go_utc_time(s: &str) -> bool {
    let digits = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = s.strip_suffix(" +0000 UTC") else {
        return false;
    };
    let Some((date, time)) = rest.split_once(' ') else {
        return false;
    };
    let (clock, frac) = time.split_once('.').unwrap_or((time, "0"));
    let d: Vec<&str> = date.split('-').collect();
    let c: Vec<&str> = clock.split(':').collect();
    d.len() == 3
        && digits(d[0], 4)
        && digits(d[1], 2)
        && digits(d[2], 2)
        && c.len() == 3
        && c.iter().all(|p| digits(p, 2))
        && (1..=9).contains(&frac.len())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// The k8s plugin config of a world: policy k8s, the CNI's kubeconfig.
fn k8s_conf(w: &World, bed: &Testbed) -> Value {
    let mut conf = w.conf();
    conf["policy"] = json!({"type": "k8s"});
    conf["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
    conf
}

fn k8s_args(ns: &Namespace, pod: &str, cid: &str) -> String {
    format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
        ns.name
    )
}

fn set_namespace_annotations(bed: &Testbed, ns: &Namespace, annotations: Value) {
    let (code, v) = bed.admin_typed(
        "PATCH",
        &format!("/api/v1/namespaces/{}", ns.name),
        Some(&json!([{"op": "add", "path": "/metadata/annotations", "value": annotations}])),
        "application/json-patch+json",
    );
    assert_eq!(code, 200, "{v}");
}

fn pools_annotation(pools: &[&str]) -> Value {
    json!({ IPV4_POOLS: serde_json::to_string(pools).unwrap() })
}

// ---------------------------------------------------------------------------
// 12: the objects an ADD writes.

fn v12_objects_written_by_an_add(_test: &str, w: &World) {
    // The vector, computed here independently of the plugin.
    assert_eq!(
        hostname_hash("node-a"),
        "PY3TQE2E3XMTETLM2MJO3UITKPFB27YUJ4T4E5XGPEJON3SM4QAA"
    );
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    // Upper case in the container ID: the handle's name is lower-cased.
    let cid = format!("ABC{}", container_id());
    let handle_id = format!("net1.{cid}");
    let r = w.ipam("ADD", &cid, &w.conf(), "").assert_ok().json();
    let ip = address(&r, 0);
    assert_eq!(ip.prefix_len(), 26, "{r}");
    let block = ip.trunc();
    assert!(pool.contains(&block), "{ip} outside {pool}");
    assert_eq!(
        ip.addr(),
        block.network(),
        "a fresh block hands out its base"
    );

    // BlockAffinity `<node>-<cidr name>` (on etcd: keyed by node and
    // CIDR), labelled for host lookups.
    let affinity = w.affinity(&block).expect("BlockAffinity");
    let labels = &affinity["metadata"]["labels"];
    let hash = if w.backend == Backend::Embedded {
        assert_eq!(w.node, "node-a");
        "PY3TQE2E3XMTETLM2MJO3UITKPFB27YUJ4T4E5XGPEJON3SM4QAA".to_string()
    } else {
        hostname_hash(&w.node)
    };
    assert_eq!(labels["projectcalico.org/hostname-hash"], json!(hash));
    assert_eq!(labels["projectcalico.org/affinity-type"], "host");
    assert_eq!(labels["projectcalico.org/ip-version"], "4");
    assert_eq!(
        affinity["spec"],
        json!({"state": "confirmed", "node": w.node, "type": "host",
               "cidr": block.to_string(), "deleted": "false"})
    );

    // The IPAMBlock.
    let b = w.get::<IpamBlock>(&block_name(&block)).expect("IPAMBlock");
    let spec = &b["spec"];
    assert_eq!(spec["cidr"], json!(block.to_string()));
    assert_eq!(spec["affinity"], json!(format!("host:{}", w.node)));
    let mut allocations = vec![Value::Null; 64];
    allocations[0] = json!(0);
    assert_eq!(spec["allocations"], json!(allocations));
    assert_eq!(spec["unallocated"], json!((1..64).collect::<Vec<_>>()));
    let attrs = spec["attributes"].as_array().unwrap();
    assert_eq!(attrs.len(), 1, "{spec}");
    assert_eq!(attrs[0]["handle_id"], json!(handle_id));
    let secondary = attrs[0]["secondary"].as_object().unwrap();
    assert_eq!(
        secondary.keys().collect::<Vec<_>>(),
        ["node", "timestamp"],
        "{spec}"
    );
    assert_eq!(secondary["node"], json!(w.node));
    let ts = secondary["timestamp"].as_str().unwrap();
    assert!(is_go_utc_time(ts), "timestamp {ts:?}");
    assert_eq!(spec["deleted"], json!(false));

    // The IPAMHandle: named by the lower-cased ID (on etcd, keyed by the ID).
    let h = w.handle(&handle_id).expect("IPAMHandle");
    assert_eq!(h["metadata"]["name"], json!(w.handle_name(&handle_id)));
    assert_eq!(h["spec"]["handleID"], json!(handle_id));
    assert_eq!(h["spec"]["block"], json!({ block.to_string(): 1 }));

    // A pod's address also records its pod and namespace.
    let cid2 = container_id();
    let args = format!("K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid2}");
    let r2 = w.ipam("ADD", &cid2, &w.conf(), &args).assert_ok().json();
    assert_eq!(address(&r2, 0).addr(), nth(&block, 1), "{r2}");
    let b = w.get::<IpamBlock>(&block_name(&block)).unwrap();
    let attr = &b["spec"]["attributes"][1];
    assert_eq!(attr["handle_id"], json!(format!("net1.{cid2}")));
    assert_eq!(attr["secondary"]["pod"], "pod1");
    assert_eq!(attr["secondary"]["namespace"], "ns1");
    assert_eq!(attr["secondary"]["node"], json!(w.node));
    assert_eq!(b["spec"]["allocations"][1], json!(1));

    w.ipam("DEL", &cid, &w.conf(), "").assert_ok();
    w.ipam("DEL", &cid2, &w.conf(), &args).assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(w.handle(&handle_id).is_none());
    // The block stays, affine to this host, all free.
    let b = w.get::<IpamBlock>(&block_name(&block)).unwrap();
    assert_eq!(b["spec"]["affinity"], json!(format!("host:{}", w.node)));
    assert_eq!(b["spec"]["unallocated"].as_array().unwrap().len(), 64);
}
on_all!(v12_objects_written_by_an_add);

// ---------------------------------------------------------------------------
// 29: calico-ipam's result and handle; the calico plugin with calico-ipam.

fn v29_calico_ipam_result_and_handle(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let small = w.v4(1);
    w.pool(&small.to_string(), json!({"blockSize": 28}));

    let cid = container_id();
    let conf = w.conf_with_ipam(json!({"ipv4_pools": [pool.to_string()]}));
    let r = w.ipam("ADD", &cid, &conf, "").assert_ok().json();
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    let ip = address(&r, 0);
    assert_eq!(ip.prefix_len(), 26, "the block's prefix: {r}");
    assert!(pool.contains(&ip.addr()));
    // One route, to the very address with its block's prefix, as Calico's
    // calico-ipam prints it (tests/calico_peer.rs compares with its binary).
    assert_eq!(r["routes"], json!([{"dst": ip.to_string()}]), "{r}");
    let handle_id = format!("net1.{cid}");
    assert_eq!(w.addresses_of(&handle_id), [ip.addr()]);

    // A pool's blockSize is the result's prefix.
    let cid2 = container_id();
    let conf2 = w.conf_with_ipam(json!({"ipv4_pools": [small.to_string()]}));
    let r2 = w.ipam("ADD", &cid2, &conf2, "").assert_ok().json();
    let ip2 = address(&r2, 0);
    assert_eq!(ip2.prefix_len(), 28, "{r2}");
    assert!(small.contains(&ip2.addr()));

    for c in [&cid, &cid2] {
        let out = w.ipam("DEL", c, &conf, "");
        out.assert_ok();
        assert_eq!(out.stdout, "");
    }
    assert!(w.handle(&handle_id).is_none());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(v29_calico_ipam_result_and_handle);

fn v29_calico_plugin_with_calico_ipam(test: &str, w: &World) {
    if !root_or_skip(test) {
        return;
    }
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let netns = Netns::new();
    let cid = container_id();
    let handle_id = format!("net1.{cid}");
    // Embedded: the plain CNI path; Kubernetes: a pod of the API server.
    let bed_ns = match w.backend {
        Backend::Embedded | Backend::Etcd => None,
        Backend::Kdd => {
            let ns = w.bed().namespace(json!({}), json!({}));
            w.pod(&ns, "pod1", json!({}));
            Some(ns)
        }
    };
    let (conf, args) = match &bed_ns {
        None => (w.conf(), String::new()),
        Some(ns) => (k8s_conf(w, w.bed()), k8s_args(ns, "pod1", &cid)),
    };
    let r = w
        .plugin("ADD", &cid, &netns.path(), &conf, &args, None)
        .assert_ok()
        .json();
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    let ip = address(&r, 0);
    assert_eq!(ip.prefix_len(), 32, "the plugin narrows to /32: {r}");
    assert!(pool.contains(&ip.addr()));
    assert_eq!(w.addresses_of(&handle_id), [ip.addr()]);
    // This binary is CNI_PATH's calico-ipam: no second process.
    assert!(w.log().contains("calico-ipam in process"), "{}", w.log());
    let block = IpNet::new(ip.addr(), 26).unwrap().trunc();
    let h = w.handle(&handle_id).expect("handle");
    assert_eq!(h["spec"]["block"], json!({ block.to_string(): 1 }));

    if bed_ns.is_none() {
        // The endpoint exists: the same result again, no second address.
        let again = w
            .plugin("ADD", &cid, &netns.path(), &conf, &args, None)
            .assert_ok()
            .json();
        assert_eq!(again["ips"], r["ips"]);
        assert_eq!(w.addresses_of(&handle_id), [ip.addr()]);
    }

    w.plugin("DEL", &cid, &netns.path(), &conf, &args, None)
        .assert_ok();
    assert!(w.handle(&handle_id).is_none());
    let blocks = w.blocks();
    assert!(!blocks.is_empty());
    for b in &blocks {
        assert!(
            b["spec"]["allocations"]
                .as_array()
                .unwrap()
                .iter()
                .all(Value::is_null),
            "{b}"
        );
    }
}
on_all!(v29_calico_plugin_with_calico_ipam);

// ---------------------------------------------------------------------------
// 36 (Kubernetes): pools from namespace and pod annotations.

#[test]
fn v36_pool_annotations_kdd() {
    let test = "v36_pool_annotations_kdd";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    let ns = bed.namespace(json!({}), json!({}));
    let conf = k8s_conf(&w, bed);
    let a = w.v4(0);
    w.pool(&a.to_string(), json!({}));
    // Four addresses in one block of four.
    let full: IpNet = format!("{}/30", w.v4(1).network()).parse().unwrap();
    w.pool(&full.to_string(), json!({"blockSize": 30}));
    let b = w.v4(2);
    w.pool(&b.to_string(), json!({}));
    let by_pod = w.v4(3);
    w.pool(&by_pod.to_string(), json!({}));
    let named_cidr = w.v4(4);
    let named = w.pool(&named_cidr.to_string(), json!({}));

    let mut n = 0;
    let mut add = |ns_annotations: Value, pod_annotations: Value| {
        set_namespace_annotations(bed, &ns, ns_annotations);
        n += 1;
        let pod = format!("pod{n}");
        w.pod(&ns, &pod, pod_annotations);
        let netns = Netns::new();
        let cid = container_id();
        let args = k8s_args(&ns, &pod, &cid);
        let out = w.plugin("ADD", &cid, &netns.path(), &conf, &args, None);
        (out, netns, cid, args)
    };
    let del = |netns: &Netns, cid: &str, args: &str| {
        w.plugin("DEL", cid, &netns.path(), &conf, args, None)
            .assert_ok();
    };

    // The namespace's pool.
    let (out, netns, cid, args) = add(pools_annotation(&[&a.to_string()]), json!({}));
    let ip = address(&out.assert_ok().json(), 0);
    assert!(a.contains(&ip.addr()), "{ip} not from {a}");
    del(&netns, &cid, &args);

    // A pool that does not exist: ADD fails, DEL succeeds.
    let (out, netns, cid, args) = add(pools_annotation(&["100.0.0.0/16"]), json!({}));
    assert_fails_with(
        &out,
        "the given pool (100.0.0.0/16) does not exist, or is not enabled",
    );
    del(&netns, &cid, &args);
    assert!(w.handle(&format!("net1.{cid}")).is_none());

    // A full pool: ADD fails.
    let fillers: Vec<String> = (0..4).map(|_| container_id()).collect();
    let fill = w.conf_with_ipam(json!({"ipv4_pools": [full.to_string()]}));
    for c in &fillers {
        w.ipam("ADD", c, &fill, "").assert_ok();
    }
    let (out, netns, cid, args) = add(pools_annotation(&[&full.to_string()]), json!({}));
    assert_fails_with(&out, "Assigned 0 out of 1 requested IPv4 addresses");
    assert!(w.handle(&format!("net1.{cid}")).is_none());
    del(&netns, &cid, &args);

    // The first pool full: an address from the second.
    let (out, netns, cid, args) = add(
        pools_annotation(&[&full.to_string(), &b.to_string()]),
        json!({}),
    );
    let ip = address(&out.assert_ok().json(), 0);
    assert!(b.contains(&ip.addr()), "{ip} not from {b}");
    del(&netns, &cid, &args);

    // The pod's annotation beats the namespace's.
    let (out, netns, cid, args) = add(
        pools_annotation(&[&a.to_string()]),
        pools_annotation(&[&by_pod.to_string()]),
    );
    let ip = address(&out.assert_ok().json(), 0);
    assert!(by_pod.contains(&ip.addr()), "{ip} not from {by_pod}");
    del(&netns, &cid, &args);

    // A pool named rather than given by CIDR.
    let (out, netns, cid, args) = add(pools_annotation(&[&named]), json!({}));
    let ip = address(&out.assert_ok().json(), 0);
    assert!(named_cidr.contains(&ip.addr()), "{ip} not from {named}");
    del(&netns, &cid, &args);

    for c in &fillers {
        w.ipam("DEL", c, &fill, "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

// ---------------------------------------------------------------------------
// 39: the ipAddrs and ipAddrsNoIpam annotations.

fn v39_ip_addrs_annotations(test: &str, w: &World) {
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = testbed(test) else { return };
    let ns = bed.namespace(json!({}), json!({}));
    let conf = k8s_conf(w, bed);
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    // An automatic assignment first: the host's block and its copy beside
    // the lock, from which an ADD writes its handle ahead (the Kubernetes
    // datastore) once the datastore has said ready, before the pod's
    // annotations are read. Every ADD below whose addresses come from the
    // annotations must leave no such handle behind (nor count it).
    w.pod(&ns, "pod0", json!({}));
    let (n0, c0) = (Netns::new(), container_id());
    let args0 = k8s_args(&ns, "pod0", &c0);
    let auto = w.plugin("ADD", &c0, &n0.path(), &conf, &args0, None);
    let auto_ip = address(&auto.assert_ok().json(), 0).addr();
    w.plugin("DEL", &c0, &n0.path(), &conf, &args0, None)
        .assert_ok();
    let block_of = |ip: IpAddr| block_holding(w, ip);
    let host_block = block_of(auto_ip);
    // The pod's address outside the host's block.
    let ip = [111, 175]
        .into_iter()
        .map(|n| nth(&pool, n))
        .find(|ip| !host_block.contains(ip))
        .expect("an address outside one /26");
    let want = format!("{ip}/32");
    w.pod(
        &ns,
        "pod1",
        json!({"cni.projectcalico.org/ipAddrs": format!("[\"{ip}\"]")}),
    );
    let add = |cid: &str, netns: &Netns, conf: &Value, pod: &str| {
        w.plugin(
            "ADD",
            cid,
            &netns.path(),
            conf,
            &k8s_args(&ns, pod, cid),
            None,
        )
    };
    let del = |cid: &str, netns: &Netns, pod: &str| {
        w.plugin(
            "DEL",
            cid,
            &netns.path(),
            &conf,
            &k8s_args(&ns, pod, cid),
            None,
        )
        .assert_ok();
    };
    let recorded = || -> Vec<Value> {
        match w.backend {
            Backend::Kdd => {
                let ann = &ns.pod("pod1").unwrap()["metadata"]["annotations"];
                vec![ann[POD_IP].clone(), ann[POD_IPS].clone()]
            }
            Backend::Embedded => w
                .endpoints(&ns.name)
                .iter()
                .map(|e| e["spec"]["ipNetworks"].clone())
                .collect(),
            Backend::Etcd => unreachable!("a Kubernetes vector"),
        }
    };
    let expected = || match w.backend {
        Backend::Kdd => vec![json!(want), json!(want)],
        Backend::Embedded => vec![json!([want])],
        Backend::Etcd => unreachable!("a Kubernetes vector"),
    };

    let (n1, c1) = (Netns::new(), container_id());
    let r = add(&c1, &n1, &conf, "pod1").assert_ok().json();
    assert_eq!(r["ips"][0]["address"], json!(want), "{r}");
    assert_eq!(recorded(), expected());
    assert_eq!(w.addresses_of(&format!("net1.{c1}")), [ip]);
    // The handle counts the address's block alone (not the host's block a
    // handle written ahead would have named).
    assert_eq!(
        w.handle(&format!("net1.{c1}")).expect("the handle")["spec"]["block"],
        json!({block_of(ip).to_string(): 1})
    );

    // The pod re-created (a new sandbox before the old one's DEL): the
    // address moves to the new container.
    let (n2, c2) = (Netns::new(), container_id());
    let r = add(&c2, &n2, &conf, "pod1").assert_ok().json();
    assert_eq!(r["ips"][0]["address"], json!(want), "{r}");
    assert_eq!(w.addresses_of(&format!("net1.{c2}")), [ip]);
    assert!(w.handle(&format!("net1.{c1}")).is_none());
    // The old sandbox's DEL leaves the new one's address alone.
    del(&c1, &n1, "pod1");
    assert_eq!(w.addresses_of(&format!("net1.{c2}")), [ip]);
    assert_eq!(recorded(), expected());
    del(&c2, &n2, "pod1");
    assert!(w.handle(&format!("net1.{c2}")).is_none());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    // Deleted and re-created: the same address again.
    let (n3, c3) = (Netns::new(), container_id());
    let r = add(&c3, &n3, &conf, "pod1").assert_ok().json();
    assert_eq!(r["ips"][0]["address"], json!(want), "{r}");
    assert_eq!(w.addresses_of(&format!("net1.{c3}")), [ip]);
    del(&c3, &n3, "pod1");

    // ipAddrsNoIpam: the address as given, no IPAM record; only with the
    // feature on.
    let no_ipam = nth(&pool, 112);
    w.pod(
        &ns,
        "pod2",
        json!({"cni.projectcalico.org/ipAddrsNoIpam": format!("[\"{no_ipam}\"]")}),
    );
    let mut on = conf.clone();
    on["feature_control"] = json!({"ip_addrs_no_ipam": true});
    let (n4, c4) = (Netns::new(), container_id());
    let r = add(&c4, &n4, &on, "pod2").assert_ok().json();
    assert_eq!(
        r["ips"][0]["address"],
        json!(format!("{no_ipam}/32")),
        "{r}"
    );
    assert!(w.handle(&format!("net1.{c4}")).is_none());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    w.plugin(
        "DEL",
        &c4,
        &n4.path(),
        &on,
        &k8s_args(&ns, "pod2", &c4),
        None,
    )
    .assert_ok();
    let (n5, c5) = (Netns::new(), container_id());
    assert_fails_with(
        &add(&c5, &n5, &conf, "pod2"),
        "requested feature is not enabled: ip_addrs_no_ipam",
    );
    // Refused after the datastore said ready: nothing written is left.
    assert!(w.handle(&format!("net1.{c5}")).is_none());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_both!(v39_ip_addrs_annotations);

// ---------------------------------------------------------------------------
// 43: which families calico-ipam assigns.

fn v43_families(_test: &str, w: &World) {
    let p4 = w.v4(0);
    let p6 = w.v6(0);
    w.pool(&p4.to_string(), json!({}));
    w.pool(&p6.to_string(), json!({}));
    let mut cids = Vec::new();
    let mut add = |ipam: Value| {
        let cid = container_id();
        let r = w
            .ipam("ADD", &cid, &w.conf_with_ipam(ipam), "")
            .assert_ok()
            .json();
        assert_routes_cover(&r);
        cids.push(cid);
        r
    };

    let r = add(json!({}));
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    let ip = address(&r, 0);
    assert!(ip.addr().is_ipv4() && p4.contains(&ip.addr()), "{r}");
    assert_eq!(ip.netmask().to_string(), "255.255.255.192");

    let r = add(json!({"assign_ipv4": "false", "assign_ipv6": "true"}));
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    let ip = address(&r, 0);
    assert!(p6.contains(&ip.addr()), "{r}");
    assert_eq!(ip.prefix_len(), 122);
    assert_eq!(
        ip.netmask().to_string(),
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffc0"
    );

    let r = add(json!({"assign_ipv4": "true", "assign_ipv6": "true"}));
    let ips = r["ips"].as_array().unwrap();
    assert_eq!(ips.len(), 2, "{r}");
    assert!(p4.contains(&address(&r, 0).addr()), "{r}");
    assert!(p6.contains(&address(&r, 1).addr()), "{r}");

    // Only the exact strings count: "TRUE" is not "true".
    let r = add(json!({"assign_ipv6": "TRUE"}));
    assert_eq!(r["ips"].as_array().unwrap().len(), 1, "{r}");
    assert!(address(&r, 0).addr().is_ipv4());

    for cid in &cids {
        w.ipam("DEL", cid, &w.conf(), "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(v43_families);

// ---------------------------------------------------------------------------
// 44: an explicit address (IP= in CNI_ARGS).

fn v44_explicit_ip(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let tunnel = w.v4(1);
    let tunnel_pool = w.pool(&tunnel.to_string(), json!({"allowedUses": ["Tunnel"]}));
    let ip = nth(&pool, 123);
    let arg = format!("IP={ip}");
    let conf = w.conf();

    let c1 = container_id();
    let r = w.ipam("ADD", &c1, &conf, &arg).assert_ok().json();
    assert_eq!(
        r["ips"][0]["address"],
        json!(format!("{ip}/32")),
        "an explicit address is returned as /32 (§10.1 step 5): {r}"
    );
    assert_eq!(w.addresses_of(&format!("net1.{c1}")), [ip]);
    w.ipam("DEL", &c1, &conf, &arg).assert_ok();
    assert!(w.handle(&format!("net1.{c1}")).is_none());
    assert!(w.allocations().is_empty());
    // ADD, DEL, ADD: the same address again.
    let r = w.ipam("ADD", &c1, &conf, &arg).assert_ok().json();
    assert_eq!(address(&r, 0).addr(), ip, "{r}");

    // Held: another container cannot have it; the error names the holder.
    let c2 = container_id();
    let out = w.ipam("ADD", &c2, &conf, &arg);
    assert_fails_with(&out, &format!("net1.{c1}"));
    assert!(msg(&out).contains(&ip.to_string()), "{}", msg(&out));
    assert!(w.handle(&format!("net1.{c2}")).is_none());
    assert_eq!(w.addresses_of(&format!("net1.{c1}")), [ip]);

    // A pool that does not allow workloads.
    let out = w.ipam("ADD", &c2, &conf, &format!("IP={}", nth(&tunnel, 5)));
    assert_fails_with(&out, "which is not allowed for use \"Workload\"");
    assert!(msg(&out).contains(&tunnel_pool), "{}", msg(&out));
    // No pool at all.
    let outside = nth(&w.v4(15), 1);
    let out = w.ipam("ADD", &c2, &conf, &format!("IP={outside}"));
    assert_fails_with(&out, "The provided IP address is not in a configured pool");
    assert!(w.handle(&format!("net1.{c2}")).is_none());

    w.ipam("DEL", &c1, &conf, "").assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(v44_explicit_ip);

// ---------------------------------------------------------------------------
// The blocks' copies kept under the host lock (src/ipam/calico/block_cache.rs):
// a stale copy never wins, and a copy offering nothing is read again.

fn block_copies_under_the_lock(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let conf = w.conf();
    let c1 = container_id();
    let r = w.ipam("ADD", &c1, &conf, "").assert_ok().json();
    let ip1 = address(&r, 0);
    let block: IpNet = IpNet::new(ip1.addr(), 26).unwrap().trunc();
    let copies = {
        let mut name = w.lock_file.file_name().unwrap().to_os_string();
        name.push(".blocks");
        w.lock_file.with_file_name(name)
    };
    let copy_path = copies.join(block_name(&block));
    if matches!(w.backend, Backend::Embedded) {
        // The local store's reads cost no round trip: no copies.
        assert!(!copy_path.exists(), "{}", copy_path.display());
        w.ipam("DEL", &c1, &conf, "").assert_ok();
        assert!(w.allocations().is_empty());
        return;
    }
    let read_copy = || -> Value {
        serde_json::from_slice(&std::fs::read(&copy_path).expect("the block's copy kept")).unwrap()
    };
    let copy = read_copy();
    assert_eq!(
        copy["block"]["metadata"]["name"],
        json!(block_name(&block)),
        "{copy}"
    );

    // Another writer, not under this lock, takes the very address the copy
    // would hand out next: the copy is now stale.
    let next = copy["block"]["spec"]["unallocated"][0]
        .as_u64()
        .expect("a free ordinal");
    let taken = address_at(&block, next as usize);
    let mut elsewhere = conf.clone();
    elsewhere["ipam_lock_file"] = json!(w.dir.path().join("other.lock"));
    let c2 = container_id();
    w.ipam("ADD", &c2, &elsewhere, &format!("IP={taken}"))
        .assert_ok();

    // Under the lock, from the stale copy: its write loses, the block is
    // read again, and the next address is another.
    let c3 = container_id();
    let mark = w.log().len();
    let r = w.ipam("ADD", &c3, &conf, "").assert_ok().json();
    if matches!(w.backend, Backend::Kdd) {
        // The API server's side of it, in the debug log's requests.
        let log = w.log()[mark..].to_string();
        let block_request = |l: &&str, method: &str| {
            l.contains(&format!("method={method} ")) && l.contains("/ipamblocks/")
        };
        let lines: Vec<&str> = log.lines().collect();
        let put = lines
            .iter()
            .position(|l| block_request(l, "PUT"))
            .expect("a block write");
        assert!(
            lines[put].contains("ok=false"),
            "the stale copy's write should have lost: {log}"
        );
        assert!(
            lines[put..].iter().any(|l| block_request(l, "GET")),
            "the block read again after the lost write: {log}"
        );
    }
    let ip3 = address(&r, 0).addr();
    assert_ne!(ip3, taken, "a stale copy handed out a held address");
    assert_ne!(ip3, ip1.addr());
    assert_eq!(w.addresses_of(&format!("net1.{c2}")), [taken]);
    assert_eq!(w.addresses_of(&format!("net1.{c3}")), [ip3]);
    assert_eq!(w.allocations().len(), 3, "{:?}", w.allocations());

    // With the copy as stored, the block is not read at all.
    if matches!(w.backend, Backend::Kdd) {
        let c5 = container_id();
        let mark = w.log().len();
        w.ipam("ADD", &c5, &conf, "").assert_ok();
        let log = w.log()[mark..].to_string();
        assert!(
            !log.lines()
                .any(|l| l.contains("method=GET") && l.contains("/ipamblocks/")),
            "a block read though its copy was current: {log}"
        );
        w.ipam("DEL", &c5, &conf, "").assert_ok();
    }

    // A copy saying the block is full (it is not) is read again before a
    // new block is claimed: the next address is still from this block.
    let mut full = read_copy();
    let spec = &mut full["block"]["spec"];
    let free: Vec<Value> = spec["unallocated"].as_array().unwrap().clone();
    for o in free {
        spec["allocations"][o.as_u64().unwrap() as usize] = json!(0);
    }
    spec["unallocated"] = json!([]);
    std::fs::write(&copy_path, serde_json::to_vec(&full).unwrap()).unwrap();
    let c4 = container_id();
    let r = w.ipam("ADD", &c4, &conf, "").assert_ok().json();
    let ip4 = address(&r, 0).addr();
    assert!(
        block.contains(&ip4),
        "{ip4} not from {block}: a stale copy made a block claimed"
    );
    assert_eq!(w.affinities().len(), 1, "{:?}", w.affinities());

    // With another of this host's blocks offering room, a copy saying its
    // block is full is taken at its word: the address comes from the other
    // block, and the full one is not read again (under the lock, where a
    // burst filling one block went on reading it once per pod). On the
    // API server, where every block write keeps its copy (on etcd an
    // explicit address's block write keeps none).
    let mut also = Vec::new();
    if matches!(w.backend, Backend::Kdd) {
        let other = (0..4)
            .map(|i| IpNet::new(address_at(&pool, 64 * i), 26).unwrap())
            .find(|b| *b != block)
            .unwrap();
        let c6 = container_id();
        let explicit = address_at(&other, 10);
        w.ipam("ADD", &c6, &conf, &format!("IP={explicit}"))
            .assert_ok();
        assert_eq!(w.affinities().len(), 2, "{:?}", w.affinities());
        let (low, high) = (block.min(other), block.max(other));
        let low_copy = copies.join(block_name(&low));
        let mut full: Value =
            serde_json::from_slice(&std::fs::read(&low_copy).expect("both copies kept")).unwrap();
        let spec = &mut full["block"]["spec"];
        for o in spec["unallocated"].as_array().unwrap().clone() {
            spec["allocations"][o.as_u64().unwrap() as usize] = json!(0);
        }
        spec["unallocated"] = json!([]);
        std::fs::write(&low_copy, serde_json::to_vec(&full).unwrap()).unwrap();
        let c7 = container_id();
        let mark = w.log().len();
        let r = w.ipam("ADD", &c7, &conf, "").assert_ok().json();
        let ip7 = address(&r, 0).addr();
        assert!(
            high.contains(&ip7),
            "{ip7} not from {high}: the block whose copy is full ({low}) was read again"
        );
        let log = w.log()[mark..].to_string();
        assert!(
            !log.lines().any(|l| l.contains("method=GET")
                && l.contains(&format!("/ipamblocks/{}", block_name(&low)))),
            "the full copy's block read again: {log}"
        );
        also = vec![c6, c7];
    }

    // Releases start from the copy too; everything goes.
    for c in [&c1, &c2, &c3, &c4].into_iter().chain(&also) {
        w.ipam("DEL", c, &conf, "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(block_copies_under_the_lock);

// ---------------------------------------------------------------------------
// The calls waiting for the host lock served by its holder
// (src/ipam/calico/intents.rs): one block write for many.

/// A world for the intents' tests: a pool of /29 blocks, one address
/// taken (so the host has a block and the lock its copy); the conf, that
/// call's container, the block, the intents' directory beside the lock.
fn queued_world(w: &World) -> (Value, String, IpNet, std::path::PathBuf) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({"blockSize": 29}));
    let conf = w.conf();
    let c0 = container_id();
    let first = address(&w.ipam("ADD", &c0, &conf, "").assert_ok().json(), 0);
    let block_a: IpNet = IpNet::new(first.addr(), 29).unwrap().trunc();
    let mut name = w.lock_file.file_name().unwrap().to_os_string();
    name.push(".intents");
    (conf, c0, block_a, w.lock_file.with_file_name(name))
}

/// Five ADDs queue behind the host lock (held by the test), each posting
/// its intent; meanwhile another writer fills their predicted block down to
/// two free addresses (the holder's copy now stale). Let go, the first
/// holder's stale write loses, is read again and serves one waiter beside
/// itself; the next finds the block full, claims a new one, makes the
/// remaining waiters' handles name it and serves them in its write. Every
/// call gets its own address, every handle names the block of its address
/// once, and the five took two block writes, not five. On etcd the same,
/// each served call's handle created in its holder's transaction.
fn waiting_calls_served_by_the_holder(_test: &str, w: &World) {
    let (conf, c0, block_a, intents_dir) = queued_world(w);
    let posted = || -> Vec<String> {
        std::fs::read_dir(&intents_dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    };
    let held = std::fs::File::options()
        .write(true)
        .open(&w.lock_file)
        .unwrap();
    held.lock().unwrap();
    // A call that gives up waiting takes its intent back and keeps its
    // handle (a holder may have been serving it) for the DEL; on etcd it
    // wrote none.
    let gave_up = container_id();
    {
        let mut short = conf.clone();
        short["deadline_seconds"] = json!(1.5);
        let out = w.ipam("ADD", &gave_up, &short, "");
        assert_ne!(out.code, 0, "{out:?}");
        assert!(posted().is_empty(), "{:?}", posted());
        assert_eq!(
            w.handle(&format!("net1.{gave_up}")).is_some(),
            matches!(w.backend, Backend::Kdd)
        );
    }
    let waiters: Vec<String> = (0..5).map(|_| container_id()).collect();
    let mut mark = 0;
    let results: Vec<Outcome> = std::thread::scope(|scope| {
        let calls: Vec<_> = waiters
            .iter()
            .map(|cid| scope.spawn(|| w.ipam("ADD", cid, &conf, "")))
            .collect();
        let expected = waiters.len();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while posted().len() < expected {
            assert!(
                std::time::Instant::now() < until,
                "the waiting calls posted {:?}",
                posted()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        {
            // Another writer, not under this lock, leaves two addresses
            // of the block the waiters' handles name.
            let mut elsewhere = conf.clone();
            elsewhere["ipam_lock_file"] = json!(w.dir.path().join("other.lock"));
            let block = w
                .blocks()
                .into_iter()
                .find(|b| b["metadata"]["name"] == json!(block_name(&block_a)))
                .expect("the block");
            let free: Vec<u64> = block["spec"]["unallocated"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_u64().unwrap())
                .collect();
            for &o in &free[..free.len() - 2] {
                let ip = address_at(&block_a, o as usize);
                w.ipam("ADD", &container_id(), &elsewhere, &format!("IP={ip}"))
                    .assert_ok();
            }
        }
        assert_eq!(posted().len(), expected, "{:?}", posted());
        // (The waiters write nothing of the blocks before the lock.)
        mark = w.log().len();
        held.unlock().unwrap();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let mut got = Vec::new();
    for (cid, out) in waiters.iter().zip(&results) {
        let ip = address(&out.assert_ok().json(), 0);
        let block: IpNet = IpNet::new(ip.addr(), 29).unwrap().trunc();
        assert_eq!(w.addresses_of(&format!("net1.{cid}")), [ip.addr()]);
        let handle = w.handle(&format!("net1.{cid}")).expect("the handle");
        assert_eq!(
            handle["spec"]["block"],
            json!({block.to_string(): 1}),
            "{cid}: {handle}"
        );
        got.push(ip.addr());
    }
    got.sort();
    got.dedup();
    assert_eq!(got.len(), waiters.len(), "{got:?}");
    assert!(posted().is_empty(), "{:?}", posted());
    assert!(
        got.iter().any(|ip| !block_a.contains(ip)),
        "no waiter from a new block: {got:?}"
    );
    let log = w.log()[mark..].to_string();
    // The holders' count: on the API server the first holder's retry
    // serves one and the new block's claimer the last two; on etcd a
    // transaction that failed with others in it is retried alone (one of
    // their handles might exist), so the first serves none.
    let served: usize = log
        .lines()
        .filter_map(|l| l.split("served waiting calls served=").nth(1))
        .map(|n| n.trim().parse::<usize>().unwrap())
        .sum();
    let want = match w.backend {
        Backend::Kdd => 3,
        _ => 2,
    };
    assert_eq!(served, want, "{log}");
    if matches!(w.backend, Backend::Kdd) {
        let written = log
            .lines()
            .filter(|l| l.contains("method=PUT ") && l.contains("/ipamblocks/"))
            .filter(|l| l.contains("ok=true"))
            .count();
        assert_eq!(written, 2, "block writes of the five calls: {log}");
    }
    for cid in waiters.iter().chain([&c0, &gave_up]) {
        w.ipam("DEL", cid, &conf, "").assert_ok();
    }
    for cid in waiters.iter().chain([&gave_up]) {
        assert!(w.handle(&format!("net1.{cid}")).is_none());
    }
}
/// A holder that wrote a waiting call's address but stopped before it
/// recorded so (staged: the test, holding the lock, writes the address into
/// the block itself and leaves the intent as posted, the lock's copy of the
/// block stale): the waiter finds its address in the block when its own
/// write from the copy loses, and takes no second one.
#[test]
fn a_service_left_unrecorded_is_found_in_the_block() {
    let test = "a_service_left_unrecorded_is_found_in_the_block";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let (conf, c0, block_a, intent) = queued_world(&w);
    let held = std::fs::File::options()
        .write(true)
        .open(&w.lock_file)
        .unwrap();
    held.lock().unwrap();
    let waiter = container_id();
    let handle = format!("net1.{waiter}");
    let intent = intent.join(w.handle_name(&handle));
    let (out, served) = std::thread::scope(|scope| {
        let call = scope.spawn(|| w.ipam("ADD", &waiter, &conf, ""));
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !intent.exists() {
            assert!(std::time::Instant::now() < until, "no intent posted");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut block = w
            .blocks()
            .into_iter()
            .find(|b| b["metadata"]["name"] == json!(block_name(&block_a)))
            .expect("the block");
        let spec = &mut block["spec"];
        let free = spec["unallocated"].as_array().unwrap().clone();
        let ordinal = free[0].as_u64().unwrap() as usize;
        spec["unallocated"] = json!(free[1..]);
        let attrs = spec["attributes"].as_array_mut().unwrap();
        attrs.push(json!({"handle_id": handle, "secondary": {"node": w.node}}));
        spec["allocations"][ordinal] = json!(attrs.len() - 1);
        w.update::<calico_cni::datastore::ipam_model::IpamBlock>(block);
        held.unlock().unwrap();
        (call.join().unwrap(), address_at(&block_a, ordinal))
    });
    let got = address(&out.assert_ok().json(), 0).addr();
    assert_eq!(got, served, "{}", out.stdout);
    assert_eq!(w.addresses_of(&handle), [served]);
    assert_eq!(
        w.handle(&handle).expect("the handle")["spec"]["block"],
        json!({block_a.to_string(): 1})
    );
    assert!(!intent.exists());
    for cid in [&waiter, &c0] {
        w.ipam("DEL", cid, &conf, "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

mod waiting_calls_served_by_the_holder {
    use super::*;
    variant!(waiting_calls_served_by_the_holder, kdd, Kdd);
    variant!(waiting_calls_served_by_the_holder, etcd, Etcd);
}

/// What an ADD reads and where: configuration (IPAMConfig, the node's
/// labels for the pool's node selector) from the API server's watch cache
/// and before the host lock; under the lock, only the allocation's writes
/// (here, a first ADD: the block's claim and the handle). Elsewhere, the
/// same ADD and DEL work.
fn configuration_is_read_before_the_lock(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let conf = w.conf();
    let c = container_id();
    let mark = w.log().len();
    w.ipam("ADD", &c, &conf, "").assert_ok();
    if matches!(w.backend, Backend::Kdd) {
        let log = w.log()[mark..].to_string();
        let lines: Vec<&str> = log.lines().collect();
        let at = |what: &str| {
            lines
                .iter()
                .position(|l| l.contains(what))
                .unwrap_or_else(|| panic!("no {what:?} in the log: {log}"))
        };
        let (taken, released) = (at("IPAM host lock taken"), at("IPAM host lock released"));
        // The v3 group names the IPAM configuration `ipamconfigurations`.
        let config = if v3_mode() {
            "/ipamconfigurations/default?resourceVersion=0"
        } else {
            "/ipamconfigs/default?resourceVersion=0"
        };
        for read in [config, "/nodes/"] {
            let line = at(read);
            assert!(line < taken, "{read} read under the host lock: {log}");
            assert!(
                lines[line].contains("resourceVersion=0"),
                "{read} not read from the cache: {log}"
            );
        }
        let under: Vec<&&str> = lines[taken..released]
            .iter()
            .filter(|l| l.contains("API request"))
            .collect();
        assert!(
            under.iter().all(|l| !l.contains("method=GET ")
                || l.contains("/ipamblocks")
                || l.contains("/blockaffinities")),
            "a configuration read under the host lock: {under:#?}"
        );
    }
    w.ipam("DEL", &c, &conf, "").assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(configuration_is_read_before_the_lock);

/// On the Kubernetes datastore (one object per write), an ADD writes its
/// handle before the host lock, naming the block this host's calls last
/// wrote, so that under the lock it writes the block alone. A handle
/// naming another block than the one its address came from is made to
/// name that one (before the block's write); a failed ADD deletes it.
fn the_handle_is_written_ahead_of_the_lock(_test: &str, w: &World) {
    let (a, b) = (w.v4(0), w.v4(1));
    w.pool(&a.to_string(), json!({}));
    let conf = w.conf_with_ipam(json!({"ipv4_pools": [a.to_string()]}));
    let block_of = |ip: IpAddr| block_holding(w, ip);
    let handle_blocks =
        |cid: &str| w.handle(&format!("net1.{cid}")).expect("the handle")["spec"]["block"].clone();
    // The first ADD claims the block (no copy of it yet: the handle is
    // written under the lock).
    let first = container_id();
    w.ipam("ADD", &first, &conf, "").assert_ok();

    let c = container_id();
    let mark = w.log().len();
    let ip = address(&w.ipam("ADD", &c, &conf, "").assert_ok().json(), 0).addr();
    let log = w.log()[mark..].to_string();
    let lines: Vec<&str> = log.lines().collect();
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} in the log: {log}"))
    };
    let (taken, released) = (at("IPAM host lock taken"), at("IPAM host lock released"));
    // (Either API group: crd.projectcalico.org/v1 or projectcalico.org/v3.)
    let handle_write = lines
        .iter()
        .position(|l| l.contains("method=POST ") && l.contains("/ipamhandles "))
        .unwrap_or_else(|| panic!("no handle written in the log: {log}"));
    assert!(
        handle_write < taken,
        "the handle written under the lock: {log}"
    );
    let writes: Vec<&&str> = lines[taken..released]
        .iter()
        .filter(|l| l.contains("API request") && !l.contains("method=GET "))
        .collect();
    assert_eq!(writes.len(), 1, "the block's write alone: {writes:#?}");
    assert!(
        writes[0].contains("method=PUT ") && writes[0].contains("/ipamblocks/"),
        "{writes:#?}"
    );
    assert_eq!(handle_blocks(&c), json!({block_of(ip).to_string(): 1}));

    // Another pool asked for: the handle written ahead names the first
    // pool's block, the address comes from the other's.
    w.pool(&b.to_string(), json!({}));
    let other = w.conf_with_ipam(json!({"ipv4_pools": [b.to_string()]}));
    let d = container_id();
    let ip_b = address(&w.ipam("ADD", &d, &other, "").assert_ok().json(), 0).addr();
    assert!(b.contains(&ip_b), "{ip_b}");
    assert_eq!(handle_blocks(&d), json!({block_of(ip_b).to_string(): 1}));

    // A failed ADD (a pool that does not exist) leaves no handle.
    let missing = w.conf_with_ipam(json!({"ipv4_pools": [w.v4(2).to_string()]}));
    let e = container_id();
    let failed = w.ipam("ADD", &e, &missing, "");
    assert_ne!(failed.code, 0, "{failed:?}");
    assert!(
        w.handle(&format!("net1.{e}")).is_none(),
        "a handle left: {failed:?}"
    );

    w.ipam("DEL", &first, &conf, "").assert_ok();
    w.ipam("DEL", &c, &conf, "").assert_ok();
    w.ipam("DEL", &d, &other, "").assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

mod the_handle_is_written_ahead_of_the_lock {
    use super::*;
    variant!(the_handle_is_written_ahead_of_the_lock, kdd, Kdd);
}

/// The stores that write several objects in one transaction (the embedded
/// store, etcd) write an allocation's handle and block together: each
/// write on its own precondition, all or none.
fn handle_and_block_are_written_together(_test: &str, w: &World) {
    use calico_cni::datastore::ipam_model::IpamHandle;
    use calico_cni::datastore::{DatastoreError, Resource, Write};
    let handle = |name: &str, id: &str| {
        json!({"kind": "IPAMHandle", "apiVersion": "projectcalico.org/v3",
               "metadata": {"name": name},
               "spec": {"handleID": id, "block": {"10.0.0.0/26": 1}}})
    };
    let kind = IpamHandle::KIND;
    let (a, b) = (
        w.handle_name(&format!("wt-a-{}", unique())),
        w.handle_name(&format!("wt-b-{}", unique())),
    );
    let stored_b = w.create::<IpamHandle>(handle(&b, &b));
    let mut stale_b = stored_b.clone();
    stale_b["spec"]["block"]["10.0.0.0/26"] = json!(2);
    let mut older = stale_b.clone();
    older["metadata"]["resourceVersion"] = json!("1");

    // A stale update refuses the whole: the create beside it is not made.
    let refused = w.write_together(vec![
        Write::Create(kind, handle(&a, &a)),
        Write::Update(kind, older),
    ]);
    assert!(
        matches!(refused, Err(DatastoreError::Conflict(_))),
        "{refused:?}"
    );
    assert!(w.get::<IpamHandle>(&a).is_none());

    // Both hold: both written, each answered as stored.
    let written = w
        .write_together(vec![
            Write::Create(kind, handle(&a, &a)),
            Write::Update(kind, stale_b.clone()),
        ])
        .unwrap();
    let got_a = w
        .get::<calico_cni::datastore::ipam_model::IpamHandle>(&a)
        .unwrap();
    let got_b = w
        .get::<calico_cni::datastore::ipam_model::IpamHandle>(&b)
        .unwrap();
    assert_eq!(
        written[0]["metadata"]["resourceVersion"],
        got_a["metadata"]["resourceVersion"]
    );
    assert_eq!(
        written[1]["metadata"]["resourceVersion"],
        got_b["metadata"]["resourceVersion"]
    );
    assert_eq!(got_b["spec"]["block"]["10.0.0.0/26"], json!(2), "{got_b}");

    // Each refusal says which precondition failed; nothing is written.
    let again = w.write_together(vec![
        Write::Update(kind, got_b.clone()),
        Write::Create(kind, handle(&a, &a)),
    ]);
    assert!(
        matches!(again, Err(DatastoreError::AlreadyExists(_))),
        "{again:?}"
    );
    let gone = handle(&format!("wt-gone-{}", unique()), "gone");
    let mut gone_update = gone.clone();
    gone_update["metadata"]["resourceVersion"] = got_b["metadata"]["resourceVersion"].clone();
    let missing = w.write_together(vec![Write::Update(kind, gone_update)]);
    assert!(
        matches!(missing, Err(DatastoreError::NotFound(_))),
        "{missing:?}"
    );
    assert_eq!(
        w.get::<IpamHandle>(&b).unwrap()["metadata"]["resourceVersion"],
        got_b["metadata"]["resourceVersion"],
        "a refused write changed nothing"
    );
    w.delete::<IpamHandle>(&a);
    w.delete::<IpamHandle>(&b);

    // An ADD's allocation: the handle and the block in one transaction
    // (on etcd, one revision wrote both).
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let conf = w.conf();
    let first = container_id();
    w.ipam("ADD", &first, &conf, "").assert_ok();
    let c = container_id();
    let r = w.ipam("ADD", &c, &conf, "").assert_ok().json();
    let ip = address(&r, 0).addr();
    let handle = w
        .get::<calico_cni::datastore::ipam_model::IpamHandle>(&w.handle_name(&format!("net1.{c}")))
        .expect("the handle");
    let block = stored_block_holding(w, ip);
    if w.backend == Backend::Etcd {
        assert_eq!(
            handle["metadata"]["resourceVersion"], block["metadata"]["resourceVersion"],
            "one transaction: {handle} {block}"
        );
    }
    for cid in [&first, &c] {
        w.ipam("DEL", cid, &conf, "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

mod handle_and_block_are_written_together {
    use super::*;
    variant!(handle_and_block_are_written_together, embedded, Embedded);
    variant!(handle_and_block_are_written_together, etcd, Etcd);
}

/// The IPAM configuration, which most clusters never create (its absence
/// means the defaults), is read once per call from the API server's watch
/// cache, its "not found" included: no second read as of now. (The 404 is
/// the fault proxy's, so that the test bed's shared configuration stays.)
#[test]
fn an_ipam_configuration_absent_from_the_cache_is_read_once() {
    use common::faultproxy::{Fault, Rule};
    let test = "an_ipam_configuration_absent_from_the_cache_is_read_once";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    w.pool(&w.v4(0).to_string(), json!({}));
    let (proxy, kubeconfig) = bed.cni_through_proxy(w.dir.path(), "through-proxy");
    let mut conf = w.conf();
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
    let not_found = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": "not found", "reason": "NotFound",
        "details": {"name": "default", "kind": "ipamconfigs"}, "code": 404});
    proxy.push(Rule::on(
        "GET",
        "/ipamconfig",
        Fault::Answer(404, "application/json", not_found.to_string()),
    ));
    let reads = || -> Vec<String> {
        proxy
            .requests()
            .into_iter()
            .filter(|(_, p)| p.contains("/ipamconfig"))
            .map(|(_, p)| p)
            .collect()
    };
    let cid = container_id();
    w.ipam("ADD", &cid, &conf, "").assert_ok();
    let after_add = reads();
    assert_eq!(after_add.len(), 1, "{after_add:?}");
    assert!(
        after_add[0].ends_with("/default?resourceVersion=0"),
        "{after_add:?}"
    );
    w.ipam("DEL", &cid, &conf, "").assert_ok();
    assert_eq!(reads().len(), 2, "{:?}", reads());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

/// The calico plugin starts its in-process calico-ipam's reads (the IPAM
/// configuration, the pools, this host's affinities) with the call: they
/// wait neither for the datastore's readiness nor for the pod's reads
/// (only the writes do). With the pod's read and the pools' list each
/// held 800 ms by the fault proxy, the ADD takes one hold, not both.
#[test]
fn the_assignments_reads_start_with_the_call() {
    use common::faultproxy::{Fault, Rule};
    use std::time::{Duration, Instant};
    let test = "the_assignments_reads_start_with_the_call";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    w.pool(&w.v4(0).to_string(), json!({}));
    let ns = bed.namespace(json!({}), json!({}));
    w.pod(&ns, "early", json!({}));
    let (proxy, kubeconfig) = bed.cni_through_proxy(w.dir.path(), "through-proxy");
    let mut conf = w.conf();
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
    conf["policy"] = json!({"type": "k8s"});
    let hold = Duration::from_millis(800);
    proxy.push(Rule::on("GET", "/pods/early", Fault::Delay(hold)));
    proxy.push(Rule::on("GET", "/ippools", Fault::Delay(hold)));
    let (netns, cid) = (Netns::new(), container_id());
    let args = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME=early;K8S_POD_INFRA_CONTAINER_ID={cid}",
        ns.name
    );
    let started = Instant::now();
    w.plugin("ADD", &cid, &netns.path(), &conf, &args, None)
        .assert_ok();
    let took = started.elapsed();
    proxy.clear();
    let requests = proxy.requests();
    assert!(
        requests
            .iter()
            .any(|(m, p)| m == "GET" && p.contains("/pods/early"))
            && requests
                .iter()
                .any(|(m, p)| m == "GET" && p.contains("/ippools")),
        "both held reads made: {requests:?}"
    );
    assert!(
        took < hold * 2 - Duration::from_millis(300),
        "the reads waited for each other: ADD in {took:?}"
    );
    w.plugin("DEL", &cid, &netns.path(), &conf, &args, None)
        .assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

// ---------------------------------------------------------------------------
// 45: requested pools must exist and be enabled.

fn v45_requested_and_disabled_pools(_test: &str, w: &World) {
    let enabled = w.v4(0);
    w.pool(&enabled.to_string(), json!({}));
    let disabled = w.v4(1);
    w.pool(&disabled.to_string(), json!({"disabled": true}));
    let cid = container_id();

    let conf = w.conf_with_ipam(json!({"ipv4_pools": [enabled.to_string(), "192.169.1.0/24"]}));
    assert_fails_with(
        &w.ipam("ADD", &cid, &conf, ""),
        "192.169.1.0/24) does not exist",
    );
    let conf = w.conf_with_ipam(json!({"ipv4_pools": [disabled.to_string()]}));
    assert_fails_with(
        &w.ipam("ADD", &cid, &conf, ""),
        &format!("the given pool ({disabled}) does not exist, or is not enabled"),
    );
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());

    // Automatic assignment never picks the disabled pool.
    let cids: Vec<String> = (0..3).map(|_| container_id()).collect();
    for c in &cids {
        let r = w.ipam("ADD", c, &w.conf(), "").assert_ok().json();
        let ip = address(&r, 0);
        assert!(enabled.contains(&ip.addr()), "{ip} not from {enabled}");
    }
    assert!(
        w.blocks().iter().all(|b| {
            let c: IpNet = b["spec"]["cidr"].as_str().unwrap().parse().unwrap();
            !disabled.contains(&c)
        }),
        "a block of the disabled pool was made"
    );
    for c in &cids {
        w.ipam("DEL", c, &w.conf(), "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_all!(v45_requested_and_disabled_pools);

// ---------------------------------------------------------------------------
// 46: dual stack with one family short fails and keeps nothing.

fn v46_dual_stack_half_failure(_test: &str, w: &World) {
    let p4 = w.v4(0);
    w.pool(&p4.to_string(), json!({}));
    let assert_nothing_kept = |cid: &str| {
        assert!(w.handle(&format!("net1.{cid}")).is_none(), "handle kept");
        assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    };
    if matches!(w.backend, Backend::Embedded) {
        // No IPv6 pool at all (on the embedded store, whose pools are all
        // this test's).
        let cid = container_id();
        let conf = w.conf_with_ipam(json!({"assign_ipv4": "true", "assign_ipv6": "true"}));
        assert_fails_with(
            &w.ipam("ADD", &cid, &conf, ""),
            "cannot find a qualified ippool",
        );
        assert_nothing_kept(&cid);
    }
    // Four IPv6 addresses, in one block.
    let p6: IpNet = format!("{}/126", w.v6(0).network()).parse().unwrap();
    w.pool(&p6.to_string(), json!({"blockSize": 126}));
    let dual = |pools6: &[String]| {
        w.conf_with_ipam(json!({"assign_ipv4": "true", "assign_ipv6": "true",
                                 "ipv4_pools": [p4.to_string()], "ipv6_pools": pools6}))
    };

    // The IPv6 pool missing.
    let cid = container_id();
    let missing: IpNet = format!("{}/64", w.v6(9).network()).parse().unwrap();
    let out = w.ipam("ADD", &cid, &dual(&[missing.to_string()]), "");
    assert_fails_with(&out, "does not exist, or is not enabled");
    assert!(out.stdout.contains(&missing.to_string()), "{}", out.stdout);
    assert_nothing_kept(&cid);

    // The IPv6 pool exhausted.
    let v6_only = w.conf_with_ipam(json!({"assign_ipv4": "false", "assign_ipv6": "true",
                                           "ipv6_pools": [p6.to_string()]}));
    let fillers: Vec<String> = (0..4).map(|_| container_id()).collect();
    for c in &fillers {
        w.ipam("ADD", c, &v6_only, "").assert_ok();
    }
    let out = w.ipam("ADD", &cid, &dual(&[p6.to_string()]), "");
    assert_fails_with(&out, "Assigned 0 out of 1 requested IPv6 addresses");
    assert!(w.handle(&format!("net1.{cid}")).is_none(), "handle kept");
    let v4_left: Vec<_> = w
        .allocations()
        .into_iter()
        .filter(|(ip, _)| ip.is_ipv4())
        .collect();
    assert!(v4_left.is_empty(), "the IPv4 address was kept: {v4_left:?}");
    for c in &fillers {
        w.ipam("DEL", c, &v6_only, "").assert_ok();
    }
    assert_nothing_kept(&cid);
}
on_all!(v46_dual_stack_half_failure);

// ---------------------------------------------------------------------------
// 47: DEL releases both the handle and the pre-v3 handle.

fn v47_del(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let conf = w.conf();

    // Nothing allocated: success, no output.
    let out = w.ipam("DEL", &container_id(), &conf, "");
    out.assert_ok();
    assert_eq!(out.stdout, "");

    // One address under `net1.<cid>` (an ADD) and one under the bare
    // container ID (written here, as a pre-v3 plugin did).
    let cid = container_id();
    let r = w.ipam("ADD", &cid, &conf, "").assert_ok().json();
    let block = address(&r, 0).trunc();
    let mut b = w.get::<IpamBlock>(&block_name(&block)).unwrap();
    let spec = &mut b["spec"];
    let ordinal = spec["unallocated"].as_array_mut().unwrap().remove(0);
    let attr = spec["attributes"].as_array().unwrap().len();
    spec["attributes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"handle_id": cid, "secondary": {"node": w.node}}));
    spec["allocations"][ordinal.as_u64().unwrap() as usize] = json!(attr);
    spec["sequenceNumber"] = json!(spec["sequenceNumber"].as_u64().unwrap() + 1);
    w.update::<IpamBlock>(b);
    w.create::<IpamHandle>(json!({
        "metadata": {"name": cid},
        "spec": {"handleID": cid, "block": { block.to_string(): 1 }, "deleted": false}
    }));
    assert_eq!(w.addresses_of(&cid).len(), 1);
    assert_eq!(w.addresses_of(&format!("net1.{cid}")).len(), 1);

    let out = w.ipam("DEL", &cid, &conf, "");
    out.assert_ok();
    assert_eq!(out.stdout, "");
    assert!(w.handle(&cid).is_none());
    assert!(w.handle(&format!("net1.{cid}")).is_none());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    // And again: nothing left, still success.
    w.ipam("DEL", &cid, &conf, "").assert_ok();
}
on_all!(v47_del);

// ---------------------------------------------------------------------------
// 48: the one-time labelling of a host's old BlockAffinities.

fn v48_affinity_upgrade(_test: &str, w: &World) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let old_block: IpNet = format!("{}/26", nth(&pool, 128)).parse().unwrap();
    let name = format!("{}-{}", w.node, block_name(&old_block));
    // As an older Calico wrote it: no labels.
    w.create::<BlockAffinity>(json!({
        "metadata": {"name": name},
        "spec": {"state": "confirmed", "node": w.node, "type": "host",
                 "cidr": old_block.to_string(), "deleted": "false"}
    }));
    let marker = w.lock_file.parent().unwrap().join("cni/ipam_upgraded");
    let conf = w.conf();

    // Auto-assignment does not upgrade.
    let c0 = container_id();
    w.ipam("ADD", &c0, &conf, "").assert_ok();
    assert!(!marker.exists());
    let labels = |w: &World| w.get::<BlockAffinity>(&name).unwrap()["metadata"]["labels"].clone();
    assert!(
        labels(w).get("projectcalico.org/hostname-hash").is_none(),
        "{}",
        labels(w)
    );

    // The first explicit-address ADD labels and leaves the marker.
    let c1 = container_id();
    w.ipam("ADD", &c1, &conf, &format!("IP={}", nth(&pool, 7)))
        .assert_ok();
    assert!(marker.exists(), "{} missing", marker.display());
    let l = labels(w);
    assert_eq!(
        l["projectcalico.org/hostname-hash"],
        json!(hostname_hash(&w.node))
    );
    assert_eq!(l["projectcalico.org/affinity-type"], "host");
    assert_eq!(l["projectcalico.org/ip-version"], "4");

    // Later ones do not relabel.
    let mut a = w.get::<BlockAffinity>(&name).unwrap();
    a["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("projectcalico.org/affinity-type");
    w.update::<BlockAffinity>(a);
    let c2 = container_id();
    w.ipam("ADD", &c2, &conf, &format!("IP={}", nth(&pool, 8)))
        .assert_ok();
    assert!(
        labels(w).get("projectcalico.org/affinity-type").is_none(),
        "relabelled: {}",
        labels(w)
    );

    for c in [&c0, &c1, &c2] {
        w.ipam("DEL", c, &conf, "").assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
on_both!(v48_affinity_upgrade);

// ---------------------------------------------------------------------------
// calico-ipam in process when CNI_PATH's calico-ipam is this binary.

#[test]
fn calico_ipam_runs_in_process_only_when_it_is_this_binary() {
    let test = "calico_ipam_runs_in_process_only_when_it_is_this_binary";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({}));
    let dir = w.dir.path();

    // A wrapper that records each exec of calico-ipam.
    let wrapped = dir.join("wrapped");
    std::fs::create_dir(&wrapped).unwrap();
    let marker = dir.join("execs");
    let script = wrapped.join("calico-ipam");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\necho x >> {}\nexec -a calico-ipam {CALICO} \"$@\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A hard link is this binary too.
    let linked = dir.join("linked");
    std::fs::create_dir(&linked).unwrap();
    let hard_link = std::fs::hard_link(CALICO, linked.join("calico-ipam")).is_ok();

    let run = |bin: &std::path::Path, log: &str| {
        let mut conf = w.conf();
        conf["log_file_path"] = json!(dir.join(log));
        let path = format!("{}:{CNI_BIN}", bin.display());
        let netns = Netns::new();
        let cid = container_id();
        w.plugin("ADD", &cid, &netns.path(), &conf, "", Some(&path))
            .assert_ok();
        let held = w.addresses_of(&format!("net1.{cid}"));
        assert_eq!(held.len(), 1, "{log}: {held:?}");
        w.plugin("DEL", &cid, &netns.path(), &conf, "", Some(&path))
            .assert_ok();
        assert!(w.handle(&format!("net1.{cid}")).is_none());
        std::fs::read_to_string(dir.join(log)).unwrap_or_default()
    };

    let log = run(&wrapped, "wrapped.log");
    let execs = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(
        execs.lines().count(),
        2,
        "one exec per IPAM call (ADD, DEL)"
    );
    assert!(!log.contains("calico-ipam in process"), "{log}");

    std::fs::remove_file(&marker).unwrap();
    let log = run(&w.bin, "symlink.log");
    assert!(log.contains("calico-ipam in process"), "{log}");
    assert!(!marker.exists());

    if hard_link {
        let log = run(&linked, "hardlink.log");
        assert!(log.contains("calico-ipam in process"), "{log}");
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

/// This binary installed under another name (a conflist naming a copy,
/// `calico-v3`): run by a runtime (CNI_COMMAND set), the config says which
/// plugin is meant — the network's `ipam.type` naming it makes it
/// calico-ipam (addresses only), its `type` the plugin; outside a runtime
/// the name is refused, as Calico's binary refuses it.
#[test]
fn another_name_under_a_runtime() {
    let test = "another_name_under_a_runtime";
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let renamed = w.bin.join("calico-v3");
    std::os::unix::fs::symlink(CALICO, &renamed).unwrap();
    let renamed = renamed.display().to_string();
    let cid = container_id();
    let env = |command: &str| {
        env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &cid),
            ("CNI_NETNS", "/var/run/netns/not-needed"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &w.bin.display().to_string()),
        ])
    };
    // As the network's IPAM: an address and no interface.
    let as_ipam = w.conf_with_ipam(json!({"type": "calico-v3"}));
    let r = exec(&renamed, &env("ADD"), &as_ipam.to_string())
        .assert_ok()
        .json();
    assert!(r.get("interfaces").is_none(), "{r}");
    let ip = address(&r, 0).addr();
    assert_eq!(w.allocations().len(), 1, "{:?}", w.allocations());
    assert_eq!(w.allocations()[0].0, ip);
    exec(&renamed, &env("DEL"), &as_ipam.to_string()).assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    // As the network's plugin: the plugin's checks (here: the netns).
    let mut as_plugin = w.conf();
    as_plugin["type"] = json!("calico-v3");
    let out = exec(&renamed, &env("ADD"), &as_plugin.to_string());
    assert_fails_with(&out, "not-needed");
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    // Outside a runtime: Calico's refusal.
    let out = exec(&renamed, &env_of(&[]), "");
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("Unknown binary name: calico-v3"),
        "{out:?}"
    );
}

/// Calico v3.32's native v3 CRDs, found by discovery as Calico finds them:
/// through a proxy in front of the test bed's API server that makes it
/// look like a cluster serving `projectcalico.org` and not
/// `crd.projectcalico.org` (its plain 404 for that group, an `/apis` list
/// without it), calico-ipam with no `calico_api_group` asks `/apis` once,
/// then allocates in the v3 CRDs (read back from the real server, where
/// the v1 CRDs see nothing of it) and releases there. Where the v1 group
/// is served, nothing is discovered: not one request more.
#[test]
fn the_v3_group_is_discovered_where_v1_is_not_served() {
    use common::faultproxy::{Fault, Rule};
    let test = "the_v3_group_is_discovered_where_v1_is_not_served";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    let v3 = "/apis/projectcalico.org/v3";
    // The world's pool, in the v3 group (the world's own is in crd_api()).
    let pool_name = w.pool(&w.v4(0).to_string(), json!({}));
    let mut pool = w.get::<IpPool>(&pool_name).unwrap();
    pool["apiVersion"] = json!("projectcalico.org/v3");
    pool["metadata"] = json!({"name": format!("{pool_name}-v3")});
    if v3_mode() {
        pool["metadata"]["name"] = json!(pool_name);
    } else {
        bed.create(&format!("{v3}/ippools"), &pool);
    }
    let (proxy, kubeconfig) = bed.cni_through_proxy(w.dir.path(), "through-proxy");
    let mut conf = w.conf();
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
    conf.as_object_mut().unwrap().remove("calico_api_group");

    // A cluster with the v1 group: no discovery.
    if !v3_mode() {
        let cid = container_id();
        w.ipam("ADD", &cid, &conf, "").assert_ok();
        w.ipam("DEL", &cid, &conf, "").assert_ok();
        let asked: Vec<_> = proxy
            .requests()
            .into_iter()
            .filter(|(_, p)| p == "/apis")
            .collect();
        assert!(asked.is_empty(), "discovery where v1 is served: {asked:?}");
    }

    // A cluster with only the v3 group.
    proxy.push(Rule {
        method: None,
        path_contains: Some("/apis/crd.projectcalico.org/".into()),
        path_is: None,
        body_contains: None,
        times: None,
        fault: Fault::Answer(404, "text/plain", "404 page not found".into()),
    });
    let groups = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
        {"name": "projectcalico.org",
         "versions": [{"groupVersion": "projectcalico.org/v3", "version": "v3"}]}]});
    proxy.push(Rule::exactly(
        "GET",
        "/apis",
        Fault::Answer(200, "application/json", groups.to_string()),
    ));
    let before = proxy.requests().len();
    let cid = container_id();
    let r = w.ipam("ADD", &cid, &conf, "").assert_ok().json();
    let ip = address(&r, 0).addr();
    let handle = format!("net1.{cid}");
    let got = bed
        .get(&format!("{v3}/ipamhandles/{handle}"))
        .expect("the v3 handle");
    assert_eq!(got["spec"]["handleID"], json!(handle), "{got}");
    assert!(
        bed.get(&format!(
            "/apis/crd.projectcalico.org/v1/ipamhandles/{handle}"
        ))
        .is_none()
            || v3_mode()
    );
    let block = IpNet::new(ip, 26).unwrap().trunc();
    let name = block.to_string().replace(['.', '/'], "-");
    let stored = bed
        .get(&format!("{v3}/ipamblocks/{name}"))
        .expect("the v3 block");
    assert!(
        block_allocations(&stored).contains(&(ip, handle.clone())),
        "{stored}"
    );
    let affinity = bed
        .get(&format!("{v3}/blockaffinities/{}-{name}", w.node))
        .expect("the v3 affinity");
    assert_eq!(
        affinity["spec"]["deleted"],
        json!(false),
        "a boolean in v3: {affinity}"
    );
    let requests: Vec<_> = proxy.requests().split_off(before);
    let asked = requests.iter().filter(|(_, p)| p == "/apis").count();
    assert_eq!(asked, 1, "one discovery per call: {requests:?}");
    w.ipam("DEL", &cid, &conf, "").assert_ok();
    assert!(bed.get(&format!("{v3}/ipamhandles/{handle}")).is_none());
    let stored = bed.get(&format!("{v3}/ipamblocks/{name}")).unwrap();
    assert!(block_allocations(&stored).is_empty(), "{stored}");

    // The v3 objects this test made beside the world's own.
    if !v3_mode() {
        bed.delete(&format!("{v3}/blockaffinities/{}-{name}", w.node));
        bed.delete(&format!("{v3}/ipamblocks/{name}"));
        bed.delete(&format!("{v3}/ippools/{pool_name}-v3"));
    }
}
