//! GC (spec 1.1.0) with `cni.dev/valid-attachments`: what this network
//! left on this node for attachments not in the list goes (the endpoint
//! record, the host veth, the calico-ipam allocation); another network's,
//! another node's and the valid attachments' stay; without the list
//! nothing goes; GC is idempotent. On the embedded store and on the test
//! bed's etcd cluster through the `calico` plugin, and through the
//! `calico-ipam` personality on the Kubernetes datastore too.

mod common;

use common::ipam::{Backend, World, address};
use common::*;
use serde_json::{Value, json};

fn gc_conf(w: &World, valid: &[&str]) -> Value {
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    let list: Vec<Value> = valid
        .iter()
        .map(|c| json!({"containerID": c, "ifname": "eth0"}))
        .collect();
    conf["cni.dev/valid-attachments"] = json!(list);
    conf
}

fn gc(w: &World, conf: &Value) -> Outcome {
    w.plugin("GC", "", "", conf, "", None)
}

fn cids_of_endpoints(w: &World) -> Vec<String> {
    let mut cids: Vec<String> = w
        .endpoints("default")
        .iter()
        .map(|e| e["spec"]["containerID"].as_str().unwrap().to_string())
        .collect();
    cids.sort();
    cids
}

fn plugin_gc(test: &str, backend: Backend) {
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, backend) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let conf = w.conf();
    let mut other_net = conf.clone();
    other_net["name"] = json!("net2");
    let (na, nb, nc, nd) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    let (a, b, c, d) = (
        container_id(),
        container_id(),
        container_id(),
        container_id(),
    );
    let mut ips = Vec::new();
    for (cid, ns, conf) in [
        (&a, &na, &conf),
        (&b, &nb, &conf),
        (&c, &nc, &conf),
        (&d, &nd, &other_net),
    ] {
        let r = w
            .plugin("ADD", cid, &ns.path(), conf, "", None)
            .assert_ok()
            .json();
        ips.push(address(&r, 0).addr());
    }
    // Another node's allocation of this network (embedded store: its
    // pools select every node).
    let other_node = container_id();
    if backend == Backend::Embedded {
        let mut conf = w.conf();
        conf["nodename"] = json!("node-other");
        w.ipam("ADD", &other_node, &conf, "").assert_ok();
    }
    let mut all = vec![a.clone(), b.clone(), c.clone(), d.clone()];
    all.sort();
    assert_eq!(cids_of_endpoints(&w), all);

    // Without the list: nothing goes.
    let mut bare = w.conf();
    bare["cniVersion"] = json!("1.1.0");
    gc(&w, &bare).assert_ok();
    assert_eq!(cids_of_endpoints(&w), all);
    assert_eq!(w.addresses_of(&format!("net1.{b}")), [ips[1]]);

    // A and C valid: B's record, veth and address go; D (net2) and the
    // other node's allocation stay.
    gc(&w, &gc_conf(&w, &[&a, &c])).assert_ok();
    let mut left = vec![a.clone(), c.clone(), d.clone()];
    left.sort();
    assert_eq!(cids_of_endpoints(&w), left);
    assert!(w.handle(&format!("net1.{b}")).is_none(), "B's handle kept");
    assert!(w.addresses_of(&format!("net1.{b}")).is_empty());
    assert!(!host_link_exists(&host_veth(&b)), "B's host veth kept");
    assert!(nb.link("eth0").is_none(), "B's pod interface kept");
    assert_eq!(w.addresses_of(&format!("net1.{a}")), [ips[0]]);
    assert_eq!(w.addresses_of(&format!("net1.{c}")), [ips[2]]);
    assert_eq!(w.addresses_of(&format!("net2.{d}")), [ips[3]]);
    assert!(host_link_exists(&host_veth(&a)) && host_link_exists(&host_veth(&d)));
    if backend == Backend::Embedded {
        assert_eq!(w.addresses_of(&format!("net1.{other_node}")).len(), 1);
    }
    // Idempotent.
    gc(&w, &gc_conf(&w, &[&a, &c])).assert_ok();
    assert_eq!(cids_of_endpoints(&w), left);

    for (cid, ns, conf) in [
        (&a, &na, &conf),
        (&b, &nb, &conf),
        (&c, &nc, &conf),
        (&d, &nd, &other_net),
    ] {
        w.plugin("DEL", cid, &ns.path(), conf, "", None).assert_ok();
    }
    if backend == Backend::Embedded {
        let mut conf = w.conf();
        conf["nodename"] = json!("node-other");
        w.ipam("DEL", &other_node, &conf, "").assert_ok();
    }
    assert!(cids_of_endpoints(&w).is_empty());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

#[test]
fn gc_through_the_plugin_on_the_embedded_store() {
    plugin_gc(
        "gc_through_the_plugin_on_the_embedded_store",
        Backend::Embedded,
    );
}

#[test]
fn gc_through_the_plugin_on_etcd() {
    plugin_gc("gc_through_the_plugin_on_etcd", Backend::Etcd);
}

/// calico-ipam's GC alone (exec'd): stale handles of this network and
/// node are released, the rest kept.
fn ipam_gc(test: &str, backend: Backend) {
    let Some(w) = World::new(test, backend) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let (a, b) = (container_id(), container_id());
    for cid in [&a, &b] {
        w.ipam("ADD", cid, &w.conf(), "").assert_ok();
    }
    let mut net2 = w.conf();
    net2["name"] = json!("net2");
    let c = container_id();
    w.ipam("ADD", &c, &net2, "").assert_ok();

    let mut bare = w.conf();
    bare["cniVersion"] = json!("1.1.0");
    w.ipam("GC", "", &bare, "").assert_ok();
    assert_eq!(w.addresses_of(&format!("net1.{b}")).len(), 1);

    w.ipam("GC", "", &gc_conf(&w, &[&a]), "").assert_ok();
    assert_eq!(w.addresses_of(&format!("net1.{a}")).len(), 1);
    assert!(w.addresses_of(&format!("net1.{b}")).is_empty());
    assert!(w.handle(&format!("net1.{b}")).is_none());
    assert_eq!(w.addresses_of(&format!("net2.{c}")).len(), 1);
    w.ipam("GC", "", &gc_conf(&w, &[&a]), "").assert_ok();

    w.ipam("DEL", &a, &w.conf(), "").assert_ok();
    w.ipam("DEL", &c, &net2, "").assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

#[test]
fn calico_ipam_gc_on_the_embedded_store() {
    ipam_gc("calico_ipam_gc_on_the_embedded_store", Backend::Embedded);
}

#[test]
fn calico_ipam_gc_on_the_kubernetes_datastore() {
    ipam_gc("calico_ipam_gc_on_the_kubernetes_datastore", Backend::Kdd);
}

#[test]
fn calico_ipam_gc_on_etcd() {
    ipam_gc("calico_ipam_gc_on_etcd", Backend::Etcd);
}

/// Debian's host-local answers GC without collecting anything, so the
/// plugin collects host-local's reservations itself (under host-local's
/// lock). A node that lost a sandbox without its DEL (the netns gone, as
/// after a reboot) gets its address back from GC; the valid attachment's
/// reservation, the lock and host-local's last-reserved marker stay.
#[test]
fn gc_collects_host_local_reservations() {
    let test = "gc_collects_host_local_reservations";
    if !root_or_skip(test) {
        return;
    }
    if !std::path::Path::new(CNI_BIN).join("host-local").exists() {
        cannot_run(
            test,
            "host-local (containernetworking-plugins) is not installed",
        );
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    let data = w.dir.path().join("host-local");
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["ipam"] = json!({"type": "host-local", "subnet": w.v4(1).to_string(), "dataDir": data});
    let reservations = || {
        let mut names: Vec<String> = std::fs::read_dir(data.join("net1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let (na, nb) = (Netns::new(), Netns::new());
    let (a, b) = (container_id(), container_id());
    let ra = w
        .plugin("ADD", &a, &na.path(), &conf, "", None)
        .assert_ok()
        .json();
    let rb = w
        .plugin("ADD", &b, &nb.path(), &conf, "", None)
        .assert_ok()
        .json();
    let (ip_a, ip_b) = (
        address(&ra, 0).addr().to_string(),
        address(&rb, 0).addr().to_string(),
    );
    let mut before = vec![
        ip_a.clone(),
        ip_b.clone(),
        "last_reserved_ip.0".into(),
        "lock".into(),
    ];
    before.sort();
    assert_eq!(reservations(), before);

    // B's sandbox is lost without a DEL.
    run_ok("ip", &["netns", "del", &nb.name]);
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([{"containerID": a, "ifname": "eth0"}]);
    gc(&w, &gc_conf).assert_ok();
    let mut after = vec![ip_a.clone(), "last_reserved_ip.0".into(), "lock".into()];
    after.sort();
    assert_eq!(reservations(), after, "B's reservation kept");
    assert_eq!(cids_of_endpoints(&w), std::slice::from_ref(&a));
    assert!(host_link_exists(&host_veth(&a)));
    // Idempotent; and the released address is host-local's to give again.
    gc(&w, &gc_conf).assert_ok();
    assert_eq!(reservations(), after);
    let (nc, c) = (Netns::new(), container_id());
    w.plugin("ADD", &c, &nc.path(), &conf, "", None).assert_ok();
    for (cid, ns) in [(&a, &na), (&c, &nc)] {
        w.plugin("DEL", cid, &ns.path(), &conf, "", None)
            .assert_ok();
    }
    assert_eq!(reservations(), ["last_reserved_ip.0", "lock"]);
    assert!(cids_of_endpoints(&w).is_empty());
}

/// On the Kubernetes datastore an ADD writes its handle before the IPAM
/// lock (the block alone is written under it), so a handle holding
/// nothing may belong to an ADD on its way to the lock: GC, holding the
/// lock, takes it for a killed ADD's leftover only once it is older than
/// a call's deadline.
#[test]
fn a_handle_written_ahead_of_the_lock_is_left_to_its_add() {
    let test = "a_handle_written_ahead_of_the_lock_is_left_to_its_add";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let a = container_id();
    let ip = address(&w.ipam("ADD", &a, &w.conf(), "").assert_ok().json(), 0).addr();
    let block = w
        .blocks()
        .into_iter()
        .filter_map(|b| b["spec"]["cidr"].as_str().map(str::to_string))
        .find(|c| c.parse::<ipnet::IpNet>().unwrap().contains(&ip))
        .expect("the ADD's block");
    // What an ADD leaves between its handle and the lock (or when killed
    // there): a handle naming this host's block, holding nothing in it.
    let ahead = format!("net1.{}", container_id());
    w.create::<calico_cni::datastore::ipam_model::IpamHandle>(json!({
        "metadata": {"name": w.handle_name(&ahead)},
        "spec": {"handleID": ahead, "block": {block.clone(): 1}, "deleted": false}
    }));
    let mut conf = gc_conf(&w, &[&a]);
    conf["deadline_seconds"] = json!(2);
    w.ipam("GC", "", &conf, "").assert_ok();
    assert!(
        w.handle(&ahead).is_some(),
        "a handle of an ADD in flight collected"
    );
    assert_eq!(w.addresses_of(&format!("net1.{a}")), [ip]);

    // Older than a call's deadline: a killed ADD's, collected.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    w.ipam("GC", "", &conf, "").assert_ok();
    assert!(w.handle(&ahead).is_none(), "a killed ADD's handle left");
    assert_eq!(w.addresses_of(&format!("net1.{a}")), [ip]);

    w.ipam("DEL", &a, &w.conf(), "").assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
