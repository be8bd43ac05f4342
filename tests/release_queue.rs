//! The durable release queue: a DEL that cannot reach the datastore
//! completes its local teardown, queues what it owes and fails retryably;
//! STATUS reports the queue while it cannot drain; once the datastore is
//! back the next call drains it, releasing exactly what the DEL owed and
//! nothing of a newer sandbox of the same pod. On a private three-member
//! etcd cluster whose quorum is taken away.

mod common;

use std::time::Duration;

use common::etcd::PrivateCluster;
use common::ipam::{World, address};
use common::*;
use serde_json::{Value, json};

const WEPS: &str = "/calico/resources/v3/projectcalico.org/workloadendpoints";

fn queue(w: &World) -> Vec<Value> {
    let dir = w.dir.path().join("cni-release-queue");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
        .collect()
}

#[test]
fn a_del_that_cannot_reach_the_datastore_is_queued_and_drained() {
    let test = "a_del_that_cannot_reach_the_datastore_is_queued_and_drained";
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let Some(mut cluster) = PrivateCluster::start(test, 3) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    let access = cluster.access();
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["deadline_seconds"] = json!(4);
    let mut k8s = conf.clone();
    k8s["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
    k8s["policy"] = json!({"type": "k8s"});
    let ns = bed.namespace(json!({}), json!({}));
    w.pod(&ns, "pod1", json!({}));
    let args = |cid: &str| {
        format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
            ns.name
        )
    };

    // A plain container P and sandbox A of pod1.
    let (np, p) = (Netns::new(), container_id());
    w.plugin("ADD", &p, &np.path(), &conf, "", None).assert_ok();
    let (na, a) = (Netns::new(), container_id());
    let ra = w
        .plugin("ADD", &a, &na.path(), &k8s, &args(&a), None)
        .assert_ok()
        .json();
    let ip_a = address(&ra, 0).addr();

    // No quorum: both DELs tear down locally, fail retryably, and queue.
    cluster.stop_member(0);
    cluster.stop_member(1);
    let out = w.plugin("DEL", &p, &np.path(), &conf, "", None);
    assert_eq!(out.error_code(), 11, "{out:?}");
    let out = w.plugin("DEL", &a, &na.path(), &k8s, &args(&a), None);
    assert_eq!(out.error_code(), 11, "{out:?}");
    for (ns, cid) in [(&np, &p), (&na, &a)] {
        assert!(ns.link("eth0").is_none(), "eth0 of {cid} left");
    }
    let q = queue(&w);
    let mut queued: Vec<&str> = q
        .iter()
        .map(|o| o["container_id"].as_str().unwrap())
        .collect();
    queued.sort();
    let mut want = vec![p.as_str(), a.as_str()];
    want.sort();
    assert_eq!(queued, want, "{q:?}");
    // No credential in the entries: the CNI variables only.
    for o in &q {
        let vars = o["vars"].as_object().unwrap();
        assert!(
            vars.keys()
                .all(|k| k.starts_with("CNI_") || k == "FELIX_INTERFACEPREFIX"),
            "{o}"
        );
    }
    // STATUS tells the truth.
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(out.error_code(), 50, "{out:?}");

    // The cluster comes back; before the queue drains, pod1 gets a new
    // sandbox B (same endpoint name, new container ID).
    cluster.start_member(0);
    cluster.start_member(1);
    for i in 0..3 {
        cluster.wait_healthy(i, Duration::from_secs(30));
    }
    // (Its ADD is given another queue, so that it cannot drain this one
    // first, whatever the timing.)
    let elsewhere = tempfile::tempdir().unwrap();
    let mut k8s_b = k8s.clone();
    k8s_b["release_queue_dir"] = json!(elsewhere.path());
    let (nb, b) = (Netns::new(), container_id());
    let rb = w
        .plugin("ADD", &b, &nb.path(), &k8s_b, &args(&b), None)
        .assert_ok()
        .json();
    assert_eq!(queue(&w).len(), 2);
    let ip_b = address(&rb, 0).addr();
    assert_ne!(ip_a, ip_b, "A's address is still held");

    // STATUS drains everything: P's and A's releases are made, B is kept.
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(queue(&w).is_empty(), "{:?}", queue(&w));
    assert!(w.handle(&format!("net1.{p}")).is_none());
    assert!(w.handle(&format!("net1.{a}")).is_none());
    assert_eq!(w.addresses_of(&format!("net1.{b}")), [ip_b]);
    let name = format!("{}-k8s-pod1-eth0", w.node.replace('-', "--"));
    let (wep, _) = access
        .get(&format!("{WEPS}/{}/{name}", ns.name))
        .expect("B's endpoint");
    assert_eq!(wep["spec"]["containerID"], json!(b));
    let plain = format!("{}-cni-{p}-eth0", w.node.replace('-', "--"));
    assert!(access.get(&format!("{WEPS}/default/{plain}")).is_none());

    w.plugin("DEL", &b, &nb.path(), &k8s, &args(&b), None)
        .assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(access.keys(&format!("{WEPS}/")).is_empty());
}
