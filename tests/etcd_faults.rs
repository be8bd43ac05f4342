//! Datastore faults on the real etcd cluster of the test bed, staged by the
//! fault proxy in front of one member (it presents the plugin's client
//! certificate upstream): black-holed, 2 s per answer, connections reset,
//! 401, a storm of compare failures on the IPAM blocks (a concurrent
//! writer bumping every block's revision before each transaction), 429.
//! An ADD fails cleanly within its deadline and leaves nothing on the host
//! (nor in IPAM once the runtime's DEL of the failed sandbox has run); a
//! DEL completes locally and queues; after recovery the queue drains and
//! nothing is leaked.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::faultproxy::{Fault, FaultProxy, Rule};
use common::ipam::{Backend, World, address};
use common::*;
use serde_json::json;

/// A world on the test bed's etcd and a fault proxy in front of its first
/// member (`None`: the test bed is not there).
fn behind_a_proxy(test: &str) -> Option<(World, FaultProxy)> {
    let bed = common::testbed::testbed(test)?;
    let w = World::new(test, Backend::Etcd)?;
    let a = w.etcd_access().clone();
    let proxy = FaultProxy::start_with_identity(
        &a.endpoints[0],
        &a.ca,
        bed.var("TESTBED_PROXY_CERT").as_ref(),
        bed.var("TESTBED_PROXY_KEY").as_ref(),
        Some((&a.cert, &a.key)),
    );
    Some((w, proxy))
}

/// [`behind_a_proxy`] with a pool of the world's first range and a config
/// that reaches etcd through the proxy (`None`: not root, or no test bed).
fn through_a_proxy(test: &str) -> Option<(World, FaultProxy, serde_json::Value)> {
    if !root_or_skip(test) {
        return None;
    }
    let (w, proxy) = behind_a_proxy(test)?;
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["etcd_endpoints"] = json!(proxy.url());
    Some((w, proxy, conf))
}

#[test]
fn calico_ipam_through_etcd_faults() {
    let test = "calico_ipam_through_etcd_faults";
    if !root_or_skip(test) {
        return;
    }
    let Some((w, proxy)) = behind_a_proxy(test) else {
        return;
    };
    let a = w.etcd_access().clone();
    w.pool(&w.v4(0).to_string(), json!({"blockSize": 28}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["etcd_endpoints"] = json!(proxy.url());
    conf["deadline_seconds"] = json!(3);
    let run = |verb: &str, cid: &str, netns: &str| w.plugin(verb, cid, netns, &conf, "", None);

    let (na, first) = (Netns::new(), container_id());
    let r = run("ADD", &first, &na.path()).assert_ok().json();
    let ip = address(&r, 0).addr();

    // Every block of this world's range, bumped: each block transaction's
    // compare fails.
    let bump = {
        let a = a.clone();
        let prefix = format!(
            "/calico/ipam/v2/assignment/ipv4/block/{}",
            w.v4(0).addr().to_string().rsplit_once('.').unwrap().0
        );
        Arc::new(move || {
            for (key, value) in a.list(&prefix) {
                a.put(&key, &value.to_string());
            }
        })
    };
    let mut faults = common::faultproxy::common_faults();
    faults.push((
        "compare-failure storm on blocks",
        Rule::on("POST", "/v3/kv/txn", Fault::Before(bump)),
    ));
    for (what, rule) in faults {
        proxy.push(rule);
        let (netns, cid) = (Netns::new(), container_id());
        let started = Instant::now();
        let out = run("ADD", &cid, &netns.path());
        let took = started.elapsed();
        eprintln!("{what}: ADD answered in {took:?}: {}", out.stdout.trim());
        proxy.clear();
        if what.starts_with("compare") && out.code == 0 {
            // Its own block may have won a round between two bumps: the
            // storm then only delays it. Nothing to clean but the sandbox.
            run("DEL", &cid, &netns.path()).assert_ok();
            continue;
        }
        assert_failed_cleanly(what, &out, took, 3, &netns, &host_veth(&cid));
        if what.starts_with("compare") {
            // The storm only hits block transactions: the rollback, on its
            // own budget after the deadline, releases the handle itself
            // (finishing a release the deadline cut short, if any).
            assert!(
                w.handle(&format!("net1.{cid}")).is_none(),
                "{what}: handle left by the rollback"
            );
        }
        run("DEL", &cid, &netns.path()).assert_ok();
        assert!(
            w.handle(&format!("net1.{cid}")).is_none(),
            "{what}: handle left"
        );
        let live: Vec<_> = w.allocations().into_iter().map(|(ip, _)| ip).collect();
        assert_eq!(live, [ip], "{what}: only the first sandbox's address");
    }

    // DEL while black-holed: local teardown, then queued; drained after.
    proxy.push(Rule::always(Fault::Hang));
    let out = run("DEL", &first, &na.path());
    assert_eq!(out.code, 1, "{out:?}");
    assert!(!host_link_exists(&host_veth(&first)));
    let queue = w.dir.path().join("cni-release-queue");
    assert_eq!(queue_entry_files(&queue).len(), 1);
    proxy.clear();
    // Once due (its first pause passed), STATUS replays it.
    make_queue_due(&queue);
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    assert!(queue_entry_files(&queue).is_empty());
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(w.endpoints("default").is_empty());
}

/// A write whose answer is lost (applied by etcd, never answered: what a
/// write meets when the leader it went through dies) or that never arrives
/// is sent again after two seconds, within the call's deadline; one that
/// was applied after all is recognised by what its key holds. ADD and DEL
/// succeed and leave exactly one allocation, then none.
#[test]
fn a_write_whose_answer_is_lost_is_sent_again() {
    let Some((w, proxy, mut conf)) = through_a_proxy("a_write_whose_answer_is_lost_is_sent_again")
    else {
        return;
    };
    conf["deadline_seconds"] = json!(8);
    let run = |verb: &str, cid: &str, netns: &str| w.plugin(verb, cid, netns, &conf, "", None);
    // A transaction that writes (the reads a call makes at once go as a
    // transaction too).
    let txn = |fault: Fault| {
        Rule::on("POST", "/v3/kv/txn", fault)
            .with_body("request_put")
            .times(1)
    };
    let forwarded = || txn(Fault::Delay(Duration::ZERO));

    // The first ADD's first write (the block's claim) with its answer
    // lost; then a later ADD's allocation (the handle and the block, one
    // transaction of two keys), its record; then an allocation never
    // delivered.
    let mut sandboxes = Vec::new();
    for (what, before, fault) in [
        ("the claim's 1st write's answer lost", 0, Fault::Lost),
        ("the allocation's answer lost", 0, Fault::Lost),
        ("the record's answer lost", 1, Fault::Lost),
        ("the allocation never delivered", 0, Fault::Hang),
    ] {
        proxy.clear();
        for _ in 0..before {
            proxy.push(forwarded());
        }
        proxy.push(txn(fault));
        let (ns, cid) = (Netns::new(), container_id());
        let started = Instant::now();
        let r = run("ADD", &cid, &ns.path());
        eprintln!("{what}: ADD in {:?}", started.elapsed());
        let ip = address(&r.assert_ok().json(), 0).addr();
        assert_eq!(proxy.rules_left(), 0, "{what}: the fault was met");
        let handle = format!("net1.{cid}");
        let owned: Vec<_> = w
            .allocations()
            .into_iter()
            .filter(|(_, h)| *h == handle)
            .map(|(ip, _)| ip)
            .collect();
        assert_eq!(owned, [ip], "{what}: one allocation");
        sandboxes.push((ns, cid));
    }
    // A DEL whose writes' answers are lost: done all the same.
    for (ns, cid) in &sandboxes {
        proxy.clear();
        proxy.push(txn(Fault::Lost));
        run("DEL", cid, &ns.path()).assert_ok();
        assert!(
            w.handle(&format!("net1.{cid}")).is_none(),
            "the handle of {cid} left"
        );
    }
    proxy.clear();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

/// The reads an ADD makes at once (readiness, the existing endpoint, the
/// network's profile, IPAM's configuration, pools, reservations, this
/// host's affinities and its node) reach etcd as one read-only transaction,
/// not a request apiece: the ADD makes three requests in all (those reads,
/// the allocation, the endpoint), counted by the proxy in pass-through.
#[test]
fn an_adds_reads_reach_etcd_as_one_request() {
    let Some((w, proxy, conf)) = through_a_proxy("an_adds_reads_reach_etcd_as_one_request") else {
        return;
    };
    // The first ADD of this host claims a block; the second finds it.
    let (first_netns, first) = (Netns::new(), container_id());
    w.plugin("ADD", &first, &first_netns.path(), &conf, "", None)
        .assert_ok();
    let (netns, cid) = (Netns::new(), container_id());
    let before = proxy.requests().len();
    w.plugin("ADD", &cid, &netns.path(), &conf, "", None)
        .assert_ok();
    let requests = proxy.requests().split_off(before);
    let ranges = requests.iter().filter(|(_, p)| p == "/v3/kv/range").count();
    assert!(
        requests.len() <= 3 && ranges == 0,
        "the ADD's reads went one by one: {requests:?}"
    );
    for (cid, netns) in [(&cid, &netns), (&first, &first_netns)] {
        w.plugin("DEL", cid, &netns.path(), &conf, "", None)
            .assert_ok();
    }
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}
