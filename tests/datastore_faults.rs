//! Datastore faults with calico-ipam on the real API server, staged by the
//! fault proxy in front of it: black-holed, 2 s per answer, connections
//! reset, 401, a 409 storm on IPAM blocks, 429. An ADD fails cleanly within
//! its deadline and leaves nothing on the host (and, once the runtime's DEL
//! of the failed sandbox has run, nothing in IPAM); a DEL completes locally
//! and queues what it owes; after recovery the queue drains and nothing is
//! leaked.

mod common;

use std::time::{Duration, Instant};

use common::faultproxy::{Fault, Rule};
use common::ipam::{Backend, World, address};
use common::*;
use serde_json::json;

const POD_IP: &str = "cni.projectcalico.org/podIP";

#[test]
fn calico_ipam_through_api_server_faults() {
    let test = "calico_ipam_through_api_server_faults";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    let (proxy, kubeconfig) = bed.cni_through_proxy(w.dir.path(), "through-proxy");
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
    conf["policy"] = json!({"type": "k8s"});
    conf["deadline_seconds"] = json!(3);
    let ns = bed.namespace(json!({}), json!({}));
    let args = |pod: &str, cid: &str| {
        format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
            ns.name
        )
    };
    let run = |verb: &str, pod: &str, cid: &str, netns: &str| {
        w.plugin(verb, cid, netns, &conf, &args(pod, cid), None)
    };
    let veth =
        |pod: &str| calico_cni::datastore::names::veth_name_for_workload(&ns.name, pod, None);

    w.pod(&ns, "pod-a", json!({}));
    let (na, a) = (Netns::new(), container_id());
    let ra = run("ADD", "pod-a", &a, &na.path()).assert_ok().json();
    let ip_a = address(&ra, 0).addr();

    let mut faults = common::faultproxy::common_faults();
    faults.push((
        "409 storm on blocks",
        Rule::on("PUT", "/ipamblocks/", Fault::Status(409)),
    ));
    for (i, (what, rule)) in faults.into_iter().enumerate() {
        let pod = format!("pod-{i}");
        w.pod(&ns, &pod, json!({}));
        proxy.push(rule);
        let (netns, cid) = (Netns::new(), container_id());
        let started = Instant::now();
        let out = run("ADD", &pod, &cid, &netns.path());
        let took = started.elapsed();
        eprintln!("{what}: ADD failed in {took:?}: {}", out.stdout.trim());
        assert_failed_cleanly(what, &out, took, 3, &netns, &veth(&pod));
        proxy.clear();
        // The runtime's DEL of the failed sandbox: nothing of it is left.
        run("DEL", &pod, &cid, &netns.path()).assert_ok();
        assert!(
            w.handle(&format!("net1.{cid}")).is_none(),
            "{what}: handle left"
        );
        let live: Vec<_> = w.allocations().into_iter().map(|(ip, _)| ip).collect();
        assert_eq!(live, [ip_a], "{what}: only pod-a's address");
    }

    // Throttled a little: the requests that met a 429 are sent again after
    // the server's Retry-After, and the ADD succeeds within its deadline.
    w.pod(&ns, "pod-throttled", json!({}));
    proxy.push(Rule::always(Fault::Status(429)).times(2));
    let (nt, t) = (Netns::new(), container_id());
    let started = Instant::now();
    let rt = run("ADD", "pod-throttled", &t, &nt.path())
        .assert_ok()
        .json();
    let took = started.elapsed();
    eprintln!("429 twice: ADD succeeded in {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "no wait after a 429: {took:?}"
    );
    let ip_t = address(&rt, 0).addr();
    assert_ne!(ip_t, ip_a);
    proxy.clear();
    run("DEL", "pod-throttled", &t, &nt.path()).assert_ok();
    let live: Vec<_> = w.allocations().into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(live, [ip_a], "throttled pod released");

    // The watch cache being filled again (the first seconds after
    // kube-apiserver starts): its reads answer 429 "storage is
    // (re)initializing" asking for a second's wait; they are sent again at
    // once as reads as of now, so the ADD does not wait.
    w.pod(&ns, "pod-cold-cache", json!({}));
    let initializing = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": "storage is (re)initializing", "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1}, "code": 429
    });
    proxy.push(Rule::on(
        "GET",
        "resourceVersion=0",
        Fault::Answer(429, "application/json", initializing.to_string()),
    ));
    let before = proxy.requests().len();
    let (nc, c) = (Netns::new(), container_id());
    let started = Instant::now();
    let rc = run("ADD", "pod-cold-cache", &c, &nc.path())
        .assert_ok()
        .json();
    let took = started.elapsed();
    eprintln!("cold watch cache: ADD succeeded in {took:?}");
    let sent = proxy.requests()[before..].to_vec();
    let cached: Vec<_> = sent
        .iter()
        .filter(|(_, p)| p.contains("resourceVersion=0"))
        .collect();
    assert!(!cached.is_empty(), "no read asked of the cache: {sent:?}");
    for (_, p) in &cached {
        let again = p
            .replace("&resourceVersion=0", "")
            .replace("?resourceVersion=0", "");
        assert!(
            sent.iter().any(|(m, q)| m == "GET" && *q == again),
            "{p} not read again as of now: {sent:?}"
        );
    }
    assert!(
        took < Duration::from_secs(1),
        "waited for the cache: {took:?}"
    );
    assert_ne!(address(&rc, 0).addr(), ip_a);
    proxy.clear();
    run("DEL", "pod-cold-cache", &c, &nc.path()).assert_ok();

    // DEL while the API server is black-holed: local teardown, then the
    // release is queued and the call fails retryably.
    proxy.push(Rule::always(Fault::Hang));
    let started = Instant::now();
    let out = run("DEL", "pod-a", &a, &na.path());
    assert_eq!(out.code, 1, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(3 + 5 + 1));
    assert!(!host_link_exists(&veth("pod-a")), "veth removed");
    assert!(na.link("eth0").is_none());
    let queue = w.dir.path().join("cni-release-queue");
    assert_eq!(queue_entry_files(&queue).len(), 1, "one entry queued");
    proxy.clear();
    // Recovered: once the entry is due (its first pause passed), STATUS
    // replays it.
    make_queue_due(&queue);
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    assert!(queue_entry_files(&queue).is_empty());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(w.handle(&format!("net1.{a}")).is_none());
    assert_eq!(
        ns.pod("pod-a").unwrap()["metadata"]["annotations"][POD_IP],
        ""
    );
}
