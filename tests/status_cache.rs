//! STATUS's cached answer, against the test bed's API server through the
//! fault proxy (which logs every request it forwards): on an idle node,
//! calls within the window ask the API server nothing after the first full
//! check; an API server that stops accepting connections makes the very
//! next call not ready; every ADD and DEL (failed ones too) makes the next
//! STATUS check afresh; the answer is keyed by the network, its config and
//! its credentials; on etcd, every member must accept connections.

mod common;

use std::time::{Duration, Instant};

use common::faultproxy::FaultProxy;
use common::ipam::{Backend, World};
use common::*;
use serde_json::{Value, json};

/// A Kdd world with one pool, and a 1.1.0 config whose kubeconfig reaches
/// the API server through a fault proxy: (world, proxy, config).
fn proxied(test: &str) -> Option<(World, FaultProxy, Value)> {
    if !root_or_skip(test) {
        return None;
    }
    let w = World::new(test, Backend::Kdd)?;
    w.pool(&w.v4(0).to_string(), json!({}));
    let (proxy, kubeconfig) = w
        .bed()
        .cni_through_proxy(w.dir.path(), "proxied.kubeconfig");
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
    Some((w, proxy, conf))
}

/// One STATUS of `conf`: (the outcome, the API requests it made, its wall
/// time).
fn status(w: &World, proxy: &FaultProxy, conf: &Value) -> (Outcome, usize, Duration) {
    let before = proxy.requests().len();
    let t0 = Instant::now();
    let out = w.plugin("STATUS", "", "", conf, "", None);
    let took = t0.elapsed();
    (out, proxy.requests().len() - before, took)
}

/// `n` ready STATUS calls of `conf`: the requests each made, and the mean
/// wall time of a call.
fn statuses(w: &World, proxy: &FaultProxy, conf: &Value, n: usize) -> (Vec<usize>, Duration) {
    let mut requests = Vec::new();
    let mut total = Duration::ZERO;
    for _ in 0..n {
        let (out, made, took) = status(w, proxy, conf);
        out.assert_ok();
        requests.push(made);
        total += took;
    }
    (requests, total / n as u32)
}

#[test]
fn status_on_an_idle_node_asks_the_api_server_once_a_window() {
    let Some((w, proxy, conf)) = proxied("status_cache_idle_node") else {
        return;
    };
    // The cache off: every call is a full check (today's STATUS).
    let mut uncached = conf.clone();
    uncached["status_cache_seconds"] = json!(0);
    let (each, uncached_ms) = statuses(&w, &proxy, &uncached, 50);
    let full = each[1];
    assert!(full > 0, "a full check asks the API server: {each:?}");
    assert!(each.iter().all(|n| *n == full), "{each:?}");

    // Cached: the first call checks, the next 49 (well within the
    // window) ask nothing of the API server.
    let (each, cached_ms) = statuses(&w, &proxy, &conf, 50);
    assert_eq!(each[0], full, "the first call is a full check: {each:?}");
    assert!(
        each[1..].iter().all(|n| *n == 0),
        "calls within the window ask the API server nothing: {each:?}"
    );
    let log = w.log();
    assert!(
        log.contains("STATUS answered from the cache"),
        "the log says where the answer came from"
    );
    eprintln!(
        "status_cache: a full check makes {full} API requests; 50 calls uncached: {} requests, {:.1} ms per call; \
         cached: {} requests, {:.1} ms per call",
        full * 50,
        uncached_ms.as_secs_f64() * 1e3,
        each.iter().sum::<usize>(),
        cached_ms.as_secs_f64() * 1e3
    );
}

#[test]
fn an_api_server_that_stops_answering_is_not_ready_at_the_next_call() {
    let Some((w, proxy, conf)) = proxied("status_cache_api_server_gone") else {
        return;
    };
    let (each, _) = statuses(&w, &proxy, &conf, 3);
    assert_eq!(each[1..], [0, 0], "the answer is cached: {each:?}");
    // The proxy closed: its port refuses connections.
    drop(proxy);
    let t0 = Instant::now();
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    let took = t0.elapsed();
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(10), "not ready in {took:?}");
    assert!(
        w.log().contains("STATUS checks afresh"),
        "the cheap check sent it to a full check"
    );
}

#[test]
fn every_add_and_del_makes_the_next_status_check_afresh() {
    let Some((w, proxy, conf)) = proxied("status_cache_add_del") else {
        return;
    };
    let (each, _) = statuses(&w, &proxy, &conf, 2);
    let full = each[0];
    assert_eq!(each[1], 0, "{each:?}");
    let next = |what: &str| {
        let (out, made, _) = status(&w, &proxy, &conf);
        out.assert_ok();
        assert_eq!(made, full, "the STATUS after {what} is a full check");
        let (out, made, _) = status(&w, &proxy, &conf);
        out.assert_ok();
        assert_eq!(made, 0, "the one after it is cached again ({what})");
    };
    let cid = container_id();
    assert_eq!(w.ipam("ADD", &cid, &conf, "").code, 0);
    next("an ADD");
    assert_eq!(w.ipam("DEL", &cid, &conf, "").code, 0);
    next("a DEL");
    // A failed ADD: an address outside every pool.
    let out = w.ipam("ADD", &container_id(), &conf, "IP=192.0.2.77");
    assert_ne!(out.code, 0, "{out:?}");
    next("a failed ADD");
}

#[test]
fn the_cached_answer_is_keyed_by_network_config_and_credentials() {
    let Some((w, proxy, conf)) = proxied("status_cache_keyed") else {
        return;
    };
    let (each, _) = statuses(&w, &proxy, &conf, 2);
    let full = each[0];
    assert_eq!(each[1], 0, "{each:?}");
    let fresh_then_cached = |conf: &Value, what: &str| {
        let (out, made, _) = status(&w, &proxy, conf);
        out.assert_ok();
        assert_eq!(made, full, "{what}: a full check");
        let (out, made, _) = status(&w, &proxy, conf);
        out.assert_ok();
        assert_eq!(made, 0, "{what}: then cached");
    };
    // Another network: its own answer.
    let mut other = conf.clone();
    other["name"] = json!("net2");
    fresh_then_cached(&other, "another network");
    // net1 kept its own.
    assert_eq!(status(&w, &proxy, &conf).1, 0, "net1's answer is its own");
    // Another config of the same network.
    let mut changed = conf.clone();
    changed["token_expiry_margin_seconds"] = json!(120);
    fresh_then_cached(&changed, "another config");
    fresh_then_cached(&conf, "the first config again");
    // The credentials rewritten (the same token, the file touched anew
    // with other bytes): checked afresh.
    let kubeconfig = conf["kubernetes"]["kubeconfig"]
        .as_str()
        .unwrap()
        .to_string();
    let mut text = std::fs::read_to_string(&kubeconfig).unwrap();
    text.push('\n');
    std::fs::write(&kubeconfig, text).unwrap();
    fresh_then_cached(&conf, "a rewritten kubeconfig");
}

#[test]
fn a_probe_confirms_the_kept_answer_and_finds_refused_credentials() {
    let Some((w, proxy, mut conf)) = proxied("status_cache_probe") else {
        return;
    };
    conf["status_cache_seconds"] = json!(6);
    conf["status_probe_seconds"] = json!(2);
    let (each, _) = statuses(&w, &proxy, &conf, 2);
    let full = each[0];
    assert_eq!(each[1], 0, "{each:?}");
    // The probe due: one request, ClusterInformation; then cached again.
    std::thread::sleep(Duration::from_millis(2100));
    let seen = proxy.requests().len();
    let (each, _) = statuses(&w, &proxy, &conf, 2);
    assert_eq!(each, [1, 0], "one probe, then the kept answer");
    let probe = &proxy.requests()[seen];
    assert!(
        probe.0 == "GET" && probe.1.contains("/clusterinformations/default"),
        "{probe:?}"
    );
    assert!(w.log().contains("confirmed by a probe"));
    // The window past: a full check.
    std::thread::sleep(Duration::from_millis(4100));
    let (each, _) = statuses(&w, &proxy, &conf, 1);
    assert_eq!(each, [full], "a full check once the window has passed");
    // The API server refuses the token: the next probe finds it, and the
    // full check it leads to says not ready.
    proxy.push(common::faultproxy::Rule::always(
        common::faultproxy::Fault::Status(401),
    ));
    assert_eq!(
        status(&w, &proxy, &conf).1,
        0,
        "still within the probe interval"
    );
    std::thread::sleep(Duration::from_millis(2100));
    let (out, _, took) = status(&w, &proxy, &conf);
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Not ready is never kept: the next call checks again.
    proxy.clear();
    let (out, made, _) = status(&w, &proxy, &conf);
    out.assert_ok();
    assert_eq!(made, full);
}

#[test]
fn on_etcd_the_kept_answer_needs_every_member_to_accept_connections() {
    let test = "status_cache_etcd";
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let Some(w) = World::new(test, Backend::Etcd) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let a = w.etcd_access().clone();
    let proxy = FaultProxy::start_with_identity(
        &a.endpoints[0],
        &a.ca,
        bed.var("TESTBED_PROXY_CERT").as_ref(),
        bed.var("TESTBED_PROXY_KEY").as_ref(),
        Some((&a.cert, &a.key)),
    );
    // Two endpoints: the proxy (its requests counted), then a real member.
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["etcd_endpoints"] = json!(format!("{},{}", proxy.url(), a.endpoints[1]));
    let (each, _) = statuses(&w, &proxy, &conf, 5);
    assert!(each[0] > 0, "a full check reads etcd: {each:?}");
    assert_eq!(each[1..], [0, 0, 0, 0], "then the kept answer: {each:?}");
    // One member gone (the proxy closed, its port refusing): the next call
    // checks afresh; a ready etcd (the other member answers) is ready still.
    drop(proxy);
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    out.assert_ok();
    assert!(
        w.log().contains("refuses connections"),
        "the closed endpoint sent it to a full check"
    );
}
