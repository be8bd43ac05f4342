//! Calico v3.32.1's own binaries beside ours (scripts/peers.sh unpacks them
//! from ../shared/calico/v3.32.1): what Calico's binary prints for a
//! request, ours prints; what one binary ADDs on a node and a datastore,
//! the other DELs without leaving anything; what ours writes, Calico's
//! calicoctl reads as it reads Calico's.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::ipam::{Backend, World};
use common::testbed::Namespace;
use common::*;
use serde_json::{Value, json};

/// Calico's binaries, `None` (skip, or fail under CI=true) when the peers
/// build did not unpack them.
struct Calico {
    dir: PathBuf,
}

impl Calico {
    fn find(test: &str) -> Option<Calico> {
        let calico = common::testbed::peer(test, "calico-v3.32.1/calico")?;
        Some(Calico {
            dir: calico.parent().unwrap().to_path_buf(),
        })
    }
}

/// What every test here needs: root, Calico's binaries, the test bed.
fn prerequisites(test: &str) -> Option<(Calico, &'static common::testbed::Testbed)> {
    if !root_or_skip(test) {
        return None;
    }
    let c = Calico::find(test)?;
    let bed = common::testbed::testbed(test)?;
    Some((c, bed))
}

/// A world on `backend` with a pool of /28 blocks in its first /24 and,
/// with `dual`, one of /122 blocks in its first /64.
fn world(test: &str, backend: Backend, dual: bool) -> Option<World> {
    let w = World::new(test, backend)?;
    w.pool(&w.v4(0).to_string(), json!({"blockSize": 28}));
    if dual {
        w.pool(&w.v6(0).to_string(), json!({"blockSize": 122}));
    }
    Some(w)
}

/// Which binary answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Ours,
    Theirs,
}

/// One binary's `calico` (or its `calico-ipam`, with `ipam`), with its own
/// calico-ipam first in CNI_PATH.
#[derive(Clone, Copy)]
struct Binary<'a> {
    w: &'a World,
    c: &'a Calico,
    who: Who,
    ipam: bool,
}

/// `who`'s `calico`.
fn calico<'a>(w: &'a World, c: &'a Calico, who: Who) -> Binary<'a> {
    Binary {
        w,
        c,
        who,
        ipam: false,
    }
}

impl Binary<'_> {
    fn call(&self, command: &str, cid: &str, netns: &str, conf: &Value, cni_args: &str) -> Outcome {
        let dir = match self.who {
            Who::Ours => self.w.bin.display().to_string(),
            Who::Theirs => self.c.dir.display().to_string(),
        };
        let binary = match (self.who, self.ipam) {
            (Who::Ours, false) => CALICO.to_string(),
            (_, true) => format!("{dir}/calico-ipam"),
            (Who::Theirs, false) => format!("{dir}/calico"),
        };
        let mut env: HashMap<String, String> = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &format!("{dir}:{CNI_BIN}")),
        ]);
        if !cni_args.is_empty() {
            env.insert("CNI_ARGS".into(), cni_args.into());
        }
        exec(&binary, &env, &conf.to_string())
    }
}

/// The config both binaries run with: the world's, with the nodename file
/// optional (Calico's binary wants /var/lib/calico/nodename otherwise).
fn conf(w: &World) -> Value {
    let mut conf = w.conf();
    conf["nodename_file_optional"] = json!(true);
    conf
}

/// CNI_ARGS as containerd passes them.
fn k8s_args(ns: &Namespace, pod: &str, cid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
        ns.name
    )
}

/// A result with what legitimately differs between two runs made
/// uniform: MACs, and each distinct address (in order of appearance) named
/// by its family and its place, its prefix length kept, so that "the route
/// is to the very address given, with the block's prefix" is compared.
fn normalized(result: &Value) -> Value {
    fn walk(v: &Value, seen: &mut Vec<String>) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| {
                        let v = if k == "mac" {
                            json!("<mac>")
                        } else {
                            walk(v, seen)
                        };
                        (k.clone(), v)
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, seen)).collect()),
            Value::String(s) => {
                let (addr, len) = s.split_once('/').unwrap_or((s, ""));
                match addr.parse::<std::net::IpAddr>() {
                    Ok(ip) => {
                        if !seen.contains(&addr.to_string()) {
                            seen.push(addr.to_string());
                        }
                        let i = seen.iter().position(|x| x == addr).unwrap();
                        let family = if ip.is_ipv4() { "v4" } else { "v6" };
                        let len = if len.is_empty() {
                            String::new()
                        } else {
                            format!("/{len}")
                        };
                        json!(format!("<{family}#{i}>{len}"))
                    }
                    Err(_) => v.clone(),
                }
            }
            other => other.clone(),
        }
    }
    walk(result, &mut Vec::new())
}

/// One request answered by Calico's binary and then by ours (each DELs
/// what it added before the other runs), same container ID and netns:
/// both succeed and print the same result, field for field.
#[allow(clippy::too_many_arguments)]
fn same_answer(
    w: &World,
    c: &Calico,
    ipam: bool,
    conf: &Value,
    cid: &str,
    netns: &str,
    cni_args: &str,
    what: &str,
) -> Value {
    let mut answers = Vec::new();
    for who in [Who::Theirs, Who::Ours] {
        let binary = Binary { w, c, who, ipam };
        let out = binary.call("ADD", cid, netns, conf, cni_args);
        assert_eq!(out.code, 0, "{what}: {who:?} ADD: {out:?}");
        let result: Value = serde_json::from_str(&out.stdout).unwrap();
        let out = binary.call("DEL", cid, netns, conf, cni_args);
        assert_eq!(out.code, 0, "{what}: {who:?} DEL: {out:?}");
        answers.push(result);
    }
    assert_eq!(
        normalized(&answers[1]),
        normalized(&answers[0]),
        "{what}: ours {:#} Calico's {:#}",
        answers[1],
        answers[0]
    );
    answers.pop().unwrap()
}

/// On the Kubernetes datastore, `conf` made a Kubernetes pod's (the CNI's
/// kubeconfig, k8s policy) and the pod `p<cid>` created in `ns`: its
/// CNI_ARGS, as containerd passes them; elsewhere none.
fn as_a_pod(
    w: &World,
    bed: &common::testbed::Testbed,
    ns: &Namespace,
    conf: &mut Value,
    cid: &str,
) -> String {
    if w.backend != Backend::Kdd {
        return String::new();
    }
    conf["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
    conf["policy"] = json!({"type": "k8s"});
    let pod = format!("p{}", &cid[..8]);
    w.pod(ns, &pod, json!({}));
    k8s_args(ns, &pod, cid)
}

/// calico-ipam's result (and the `calico` plugin's, which passes its routes
/// on) is what Calico v3.32.1 prints: each address with its block's prefix
/// (an explicit `IP=` as /32), one route per address to that same prefixed
/// address. Plain CNI on etcd, a Kubernetes pod on the API server; IPv4,
/// dual stack, `IP=`; spec 1.0.0 and 0.3.1.
#[test]
fn results_are_calicos_field_for_field() {
    let test = "results_are_calicos_field_for_field";
    let Some((c, bed)) = prerequisites(test) else {
        return;
    };
    for backend in [Backend::Etcd, Backend::Kdd] {
        let Some(w) = world(test, backend, true) else {
            return;
        };
        let ns = bed.namespace(json!({}), json!({}));
        for (dual, version, explicit) in [
            (false, "1.0.0", false),
            (true, "1.0.0", false),
            (true, "0.3.1", false),
            (false, "1.0.0", true),
        ] {
            let mut conf = conf(&w);
            conf["cniVersion"] = json!(version);
            if dual {
                conf["ipam"]["assign_ipv6"] = json!("true");
            }
            let cid = container_id();
            let netns = Netns::new();
            let mut args = as_a_pod(&w, bed, &ns, &mut conf, &cid);
            let ip = common::ipam::address_at(&w.v4(0), 200);
            if explicit {
                args = format!("{args}{}IP={ip}", if args.is_empty() { "" } else { ";" });
            }
            let what = format!("{backend:?} dual={dual} {version} IP={explicit}");
            for ipam in [true, false] {
                let what = format!("{what} {}", if ipam { "calico-ipam" } else { "calico" });
                let ours = same_answer(&w, &c, ipam, &conf, &cid, &netns.path(), &args, &what);
                // The shape itself (beyond being Calico's).
                let ips = &ours["ips"];
                let routes = &ours["routes"];
                let count = if dual { 2 } else { 1 };
                assert_eq!(ips.as_array().unwrap().len(), count, "{what}: {ours:#}");
                for (i, r) in routes.as_array().unwrap().iter().enumerate() {
                    let addr = ips[i]["address"].as_str().unwrap();
                    let len = addr.split('/').nth(1).unwrap();
                    let want = match (explicit, i, ipam) {
                        (true, _, _) => "32",
                        (_, 0, _) => "28",
                        _ => "122",
                    };
                    assert_eq!(
                        r["dst"].as_str().unwrap().split('/').nth(1).unwrap(),
                        want,
                        "{what}"
                    );
                    if ipam {
                        assert_eq!(r["dst"], ips[i]["address"], "{what}");
                        assert_eq!(len, want, "{what}");
                    }
                }
                if explicit {
                    assert_eq!(ips[0]["address"], json!(format!("{ip}/32")), "{what}");
                }
            }
            assert!(w.allocations().is_empty(), "{what}: {:?}", w.allocations());
        }
        // On a node with calico/node the MTU it detected is in
        // /var/lib/calico/mtu (Felix writes it), which both binaries read;
        // the config's `mtu` wins over it. (Only this test compares results,
        // so the file, there for a moment, changes no other test's answer.)
        let mtu_file = MtuFile::holding("1400");
        for (conf_mtu, want) in [(0, 1400), (1450, 1450)] {
            let mut conf = conf(&w);
            conf["mtu"] = json!(conf_mtu);
            // Ours reads the node's file too (the world points it elsewhere).
            conf.as_object_mut().unwrap().remove("mtu_file");
            let cid = container_id();
            let netns = Netns::new();
            let args = as_a_pod(&w, bed, &ns, &mut conf, &cid);
            let what = format!("{backend:?} mtu file 1400, config mtu {conf_mtu}");
            let ours = same_answer(&w, &c, false, &conf, &cid, &netns.path(), &args, &what);
            assert_eq!(
                ours["interfaces"][1]["mtu"],
                json!(want),
                "{what}: {ours:#}"
            );
        }
        drop(mtu_file);
    }
}

/// `/var/lib/calico/mtu` holding a value for as long as this lives, then
/// as it was before (absent, or its earlier content).
struct MtuFile {
    before: Option<Vec<u8>>,
}

impl MtuFile {
    const PATH: &'static str = "/var/lib/calico/mtu";

    fn holding(value: &str) -> MtuFile {
        let before = std::fs::read(Self::PATH).ok();
        std::fs::create_dir_all("/var/lib/calico").unwrap();
        std::fs::write(Self::PATH, value).unwrap();
        MtuFile { before }
    }
}

impl Drop for MtuFile {
    fn drop(&mut self) {
        let _ = match &self.before {
            Some(content) => std::fs::write(Self::PATH, content),
            None => std::fs::remove_file(Self::PATH),
        };
    }
}

/// The first address of an ADD's result, without its prefix.
fn first_address(out: &Outcome) -> String {
    let address = out.json()["ips"][0]["address"]
        .as_str()
        .unwrap()
        .to_string();
    address.split('/').next().unwrap().to_string()
}

/// The host-local IPAM of a world: its own range and data directory.
fn host_local(w: &World) -> Value {
    json!({"type": "host-local", "ranges": [[{"subnet": w.v4(1).to_string()}]],
           "dataDir": w.dir.path().join("host-local")})
}

/// host-local's reservations in a world.
fn reservations(w: &World) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(w.dir.path().join("host-local/net1")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
        .collect()
}

/// One workload as a test drives it: plain CNI (no pod) or a pod of `ns`.
struct Workload<'a> {
    ns: Option<&'a Namespace>,
    pod: String,
}

impl Workload<'_> {
    fn args(&self, cid: &str) -> String {
        match self.ns {
            Some(ns) => k8s_args(ns, &self.pod, cid),
            None => String::new(),
        }
    }

    fn host_veth(&self, cid: &str) -> String {
        match self.ns {
            Some(ns) => {
                calico_cni::datastore::names::veth_name_for_workload(&ns.name, &self.pod, None)
            }
            None => host_veth(cid),
        }
    }
}

/// What a workload's sandbox `cid` (which had `ip`) left behind: its host
/// veth, the host route to its address, its calico-ipam handle and
/// addresses, host-local's reservations, its endpoint record (etcd) or the
/// pod's address annotations (Kubernetes datastore).
fn leftovers(w: &World, wl: &Workload, cid: &str, ip: &str) -> Vec<String> {
    let mut left = Vec::new();
    let veth = wl.host_veth(cid);
    if host_link_exists(&veth) {
        left.push(format!("host veth {veth}"));
    }
    let routes = host_ip_json(&["route", "show", "exact", &format!("{ip}/32")]);
    if routes.as_array().is_some_and(|r| !r.is_empty()) {
        left.push(format!("host route {routes}"));
    }
    if let Some(h) = w.handle(&format!("net1.{cid}")) {
        left.push(format!("handle {h}"));
    }
    let addrs = w.addresses_of(&format!("net1.{cid}"));
    if !addrs.is_empty() {
        left.push(format!("addresses {addrs:?}"));
    }
    let reserved = reservations(w);
    if !reserved.is_empty() {
        left.push(format!("host-local reservations {reserved:?}"));
    }
    match (w.backend, wl.ns) {
        (Backend::Kdd, Some(ns)) => {
            let pod = ns.pod(&wl.pod).expect("the pod");
            let ann = &pod["metadata"]["annotations"];
            // (Calico's DEL empties podIP and podIPs and keeps
            // containerID: the sandbox that last had the pod.)
            for key in ["podIP", "podIPs"] {
                let key = format!("cni.projectcalico.org/{key}");
                if ann.get(&key).is_some_and(|v| v.as_str() != Some("")) {
                    left.push(format!("annotation {key}={}", ann[&key]));
                }
            }
        }
        (_, ns) => {
            let namespace = ns.map_or("default", |n| n.name.as_str());
            let weps: Vec<Value> = w
                .endpoints(namespace)
                .into_iter()
                .filter(|e| e["spec"]["containerID"] == json!(cid))
                .collect();
            if !weps.is_empty() {
                left.push(format!("endpoints {weps:?}"));
            }
        }
    }
    left
}

/// A rolling replacement of the binary on a live node, both ways: what one
/// binary ADDs, the other DELs, leaving nothing (no veth, route, handle,
/// address, reservation, endpoint or pod annotation); on the API server
/// and on etcd, with calico-ipam and host-local, pods and (etcd) plain
/// containers. A sandbox Calico's binary created is replaced by one ours
/// creates (the pod's sandbox recreated) and both DELs by ours leave
/// nothing.
#[test]
fn one_node_two_binaries() {
    let test = "one_node_two_binaries";
    let Some((c, bed)) = prerequisites(test) else {
        return;
    };
    for backend in [Backend::Kdd, Backend::Etcd] {
        let Some(w) = world(test, backend, false) else {
            return;
        };
        let ns = bed.namespace(json!({}), json!({}));
        for ipam in [json!({"type": "calico-ipam"}), host_local(&w)] {
            let mut base = conf(&w);
            base["ipam"] = ipam.clone();
            let mut k8s = base.clone();
            k8s["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
            k8s["policy"] = json!({"type": "k8s"});
            let mut shapes = vec![(k8s.clone(), true)];
            if backend == Backend::Etcd {
                shapes.push((base.clone(), false));
            }
            for (conf, is_pod) in &shapes {
                for (adder, deleter) in [(Who::Theirs, Who::Ours), (Who::Ours, Who::Theirs)] {
                    let cid = container_id();
                    let wl = Workload {
                        ns: is_pod.then_some(&ns),
                        pod: format!("p{}", &cid[..8]),
                    };
                    if *is_pod {
                        w.pod(&ns, &wl.pod, json!({}));
                    }
                    let what = format!(
                        "{backend:?} {} pod={is_pod} {adder:?} ADD, {deleter:?} DEL",
                        ipam["type"]
                    );
                    let (netns, args) = (Netns::new(), wl.args(&cid));
                    let (adding, deleting) = (calico(&w, &c, adder), calico(&w, &c, deleter));
                    let out = adding.call("ADD", &cid, &netns.path(), conf, &args);
                    assert_eq!(out.code, 0, "{what}: {out:?}");
                    let ip = first_address(&out);
                    assert!(host_link_exists(&wl.host_veth(&cid)), "{what}");
                    let out = deleting.call("DEL", &cid, &netns.path(), conf, &args);
                    assert_eq!(out.code, 0, "{what}: {out:?}");
                    let left = leftovers(&w, &wl, &cid, &ip);
                    assert!(left.is_empty(), "{what}: left {left:?}");
                    assert!(netns.link("eth0").is_none(), "{what}");
                    // The other binary's DEL again: nothing to do, success.
                    let out = adding.call("DEL", &cid, &netns.path(), conf, &args);
                    assert_eq!(out.code, 0, "{what}: repeated DEL {out:?}");
                }
            }

            // The pod's sandbox A (Calico's binary) dies and kubelet makes B
            // (ours) before A's DEL comes; then A's DEL, then B's, by ours.
            let what = format!("{backend:?} {} sandbox replaced", ipam["type"]);
            let (a, b) = (container_id(), container_id());
            let wl = Workload {
                ns: Some(&ns),
                pod: format!("p{}", &a[..8]),
            };
            w.pod(&ns, &wl.pod, json!({}));
            let (na, nb) = (Netns::new(), Netns::new());
            let out = calico(&w, &c, Who::Theirs).call("ADD", &a, &na.path(), &k8s, &wl.args(&a));
            assert_eq!(out.code, 0, "{what}: {out:?}");
            let ip_a = first_address(&out);
            drop(na);
            let out = calico(&w, &c, Who::Ours).call("ADD", &b, &nb.path(), &k8s, &wl.args(&b));
            assert_eq!(out.code, 0, "{what}: {out:?}");
            let ip_b = first_address(&out);
            assert!(nb.link("eth0").is_some(), "{what}");
            let gone = "/var/run/netns/gone-".to_string() + &a[..8];
            let out = calico(&w, &c, Who::Ours).call("DEL", &a, &gone, &k8s, &wl.args(&a));
            assert_eq!(out.code, 0, "{what}: A's DEL {out:?}");
            // B is untouched by A's DEL.
            assert!(
                host_link_exists(&wl.host_veth(&b)),
                "{what}: B's veth went with A's DEL"
            );
            assert!(nb.link("eth0").is_some(), "{what}");
            if w.backend == Backend::Kdd {
                let ann = &ns.pod(&wl.pod).unwrap()["metadata"]["annotations"];
                assert_eq!(
                    ann["cni.projectcalico.org/containerID"],
                    json!(b),
                    "{what}: {ann}"
                );
            }
            if ip_a != ip_b && ipam["type"] == "calico-ipam" {
                assert!(
                    w.handle(&format!("net1.{a}")).is_none(),
                    "{what}: A's handle"
                );
            }
            let out = calico(&w, &c, Who::Ours).call("DEL", &b, &nb.path(), &k8s, &wl.args(&b));
            assert_eq!(out.code, 0, "{what}: B's DEL {out:?}");
            for (cid, ip) in [(&a, &ip_a), (&b, &ip_b)] {
                let left = leftovers(&w, &wl, cid, ip);
                assert!(left.is_empty(), "{what}: {cid} left {left:?}");
            }
        }
        assert!(
            w.allocations().is_empty(),
            "{backend:?}: {:?}",
            w.allocations()
        );
    }
}

/// Calico's calicoctl on a world's datastore (`args`), its stdout; panics
/// with its output when it fails.
fn calicoctl(w: &World, c: &Calico, args: &[&str]) -> String {
    w.calicoctl(&c.dir.join("calicoctl"), args)
}

/// An object as calicoctl prints it, without what differs between two
/// creations of the same endpoint (uid, resourceVersion, creation time, the
/// MAC) and with addresses normalized.
fn comparable(object: &Value) -> Value {
    let mut o = object.clone();
    for meta in [&mut o["metadata"]] {
        if let Some(m) = meta.as_object_mut() {
            for k in ["uid", "resourceVersion", "creationTimestamp"] {
                m.remove(k);
            }
        }
    }
    if let Some(items) = o["items"].as_array_mut() {
        for item in items {
            *item = comparable(item);
        }
    }
    if let Some(spec) = o["spec"].as_object_mut() {
        spec.remove("mac");
    }
    normalized(&o)
}

/// Calico's calicoctl reads what ours writes as it reads what Calico's
/// binary writes: `get workloadendpoints` of a pod added by each (labels,
/// a service account, named ports, dual stack) is the same object; after a
/// mix of ADD, DEL and GC by ours, `ipam show --show-blocks` counts what is
/// live, `ipam show --ip` finds a live address and not a released one,
/// and `ipam check` finds no problem in this test's addresses. On the API
/// server and on etcd.
#[test]
fn calicoctl_reads_what_we_write() {
    let test = "calicoctl_reads_what_we_write";
    let Some((c, bed)) = prerequisites(test) else {
        return;
    };
    for backend in [Backend::Kdd, Backend::Etcd] {
        let Some(w) = world(test, backend, true) else {
            return;
        };
        let pool4 = w.v4(0).to_string();
        let ns = bed.namespace(json!({"team": "a"}), json!({}));
        let mut k8s = conf(&w);
        k8s["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
        k8s["policy"] = json!({"type": "k8s"});
        k8s["ipam"]["assign_ipv6"] = json!("true");

        // The same pod and sandbox, added by Calico's binary, then by ours.
        let cid = container_id();
        let pod = format!("p{}", &cid[..8]);
        ns.create_pod(json!({
            "metadata": {"name": pod, "labels": {"app": "web", "tier": "front"}},
            "spec": {"nodeName": w.node, "serviceAccountName": "default",
                     "containers": [{"name": "c", "image": "i",
                                     "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"},
                                               {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}
        }));
        let netns = Netns::new();
        let args = k8s_args(&ns, &pod, &cid);
        let mut seen = Vec::new();
        for who in [Who::Theirs, Who::Ours] {
            let out = calico(&w, &c, who).call("ADD", &cid, &netns.path(), &k8s, &args);
            assert_eq!(out.code, 0, "{backend:?} {who:?}: {out:?}");
            let json_list = calicoctl(
                &w,
                &c,
                &["get", "workloadendpoints", "-n", &ns.name, "-o", "json"],
            );
            let yaml = calicoctl(
                &w,
                &c,
                &["get", "workloadendpoints", "-n", &ns.name, "-o", "yaml"],
            );
            assert!(yaml.contains(&format!("pod: {pod}")), "{yaml}");
            let list: Value = serde_json::from_str(&json_list).unwrap();
            assert_eq!(list["items"].as_array().map(Vec::len), Some(1), "{list:#}");
            if backend == Backend::Kdd {
                // The API server names the writer of the annotations alike.
                let fields = ns.pod(&pod).unwrap()["metadata"]["managedFields"].clone();
                let manager = fields
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|f| f["subresource"] == "status")
                    .map(|f| f["manager"].clone());
                assert_eq!(manager, Some(json!("calico")), "{who:?}: {fields:#}");
            }
            seen.push(list);
            let out = calico(&w, &c, who).call("DEL", &cid, &netns.path(), &k8s, &args);
            assert_eq!(out.code, 0, "{backend:?} {who:?}: {out:?}");
        }
        assert_eq!(
            comparable(&seen[1]),
            comparable(&seen[0]),
            "{backend:?}: ours {:#} Calico's {:#}",
            seen[1],
            seen[0]
        );

        // A mix by ours: three pods added, one deleted, one lost without a
        // DEL and collected by GC.
        let mut live = Vec::new();
        let mut ips = Vec::new();
        let mut sandboxes = Vec::new();
        for i in 0..3 {
            let cid = container_id();
            let pod = format!("m{i}{}", &cid[..6]);
            w.pod(&ns, &pod, json!({}));
            let netns = Netns::new();
            let args = k8s_args(&ns, &pod, &cid);
            let out = calico(&w, &c, Who::Ours).call("ADD", &cid, &netns.path(), &k8s, &args);
            assert_eq!(out.code, 0, "{out:?}");
            ips.push(first_address(&out));
            sandboxes.push((cid, netns, args));
        }
        let (cid, netns, args) = &sandboxes[0];
        let out = calico(&w, &c, Who::Ours).call("DEL", cid, &netns.path(), &k8s, args);
        assert_eq!(out.code, 0, "{out:?}");
        let (lost, _, _) = &sandboxes[1];
        live.push(sandboxes[2].0.clone());
        // (GC is spec 1.1.0, which Calico's binary does not speak.)
        let mut gc = k8s.clone();
        gc["cniVersion"] = json!("1.1.0");
        gc["cni.dev/valid-attachments"] =
            json!([{"containerID": sandboxes[2].0, "ifname": "eth0"}]);
        let out = calico(&w, &c, Who::Ours).call("GC", "", "", &gc, "");
        assert_eq!(out.code, 0, "{out:?}");
        assert!(w.handle(&format!("net1.{lost}")).is_none());
        // The pod that outlived its sandbox no longer claims the address.
        let lost_wl = Workload {
            ns: Some(&ns),
            pod: pod_name(&ns, &sandboxes[1].2),
        };
        let left = leftovers(&w, &lost_wl, lost, &ips[1]);
        assert!(left.is_empty(), "{backend:?}: GC left {left:?}");

        let blocks = calicoctl(&w, &c, &["ipam", "show", "--show-blocks"]);
        let block_line = blocks
            .lines()
            .find(|l| {
                l.contains("Block") && l.contains(&pool4.trim_end_matches(".0/24").to_string())
            })
            .unwrap_or_else(|| panic!("{backend:?}: no block of {pool4}:\n{blocks}"));
        assert!(
            block_line.contains("| 1 (6%)"),
            "{backend:?}: one address in use:\n{blocks}"
        );
        let shown = calicoctl(&w, &c, &["ipam", "show", &format!("--ip={}", ips[2])]);
        assert!(shown.contains("is in use"), "{backend:?}: {shown}");
        assert!(
            shown.contains(&live[0]) || shown.contains(&pod_name(&ns, &sandboxes[2].2)),
            "{backend:?}: {shown}"
        );
        let released = calicoctl(&w, &c, &["ipam", "show", &format!("--ip={}", ips[0])]);
        assert!(
            released.contains("is not assigned"),
            "{backend:?}: {released}"
        );
        let report = calicoctl(&w, &c, &["ipam", "check", "--show-problem-ips"]);
        // The problems (after the inventory), those of this test's
        // addresses and node: the cluster is shared with other tests.
        let problems = report.split_once("Scanning for").map_or("", |(_, p)| p);
        let mine: Vec<&str> = problems
            .lines()
            .filter(|l| w.owns_text(l) || l.contains(&w.node))
            .collect();
        assert!(
            mine.is_empty(),
            "{backend:?}: ipam check reports {mine:?}:\n{report}"
        );
        assert!(report.contains("Check complete"), "{report}");

        let (cid, netns, args) = &sandboxes[2];
        let out = calico(&w, &c, Who::Ours).call("DEL", cid, &netns.path(), &k8s, args);
        assert_eq!(out.code, 0, "{out:?}");
        assert!(
            w.allocations().is_empty(),
            "{backend:?}: {:?}",
            w.allocations()
        );
    }
}

/// The pod name in CNI_ARGS.
fn pod_name(_ns: &Namespace, args: &str) -> String {
    args.split(';')
        .find_map(|kv| kv.strip_prefix("K8S_POD_NAME="))
        .unwrap_or_default()
        .to_string()
}
