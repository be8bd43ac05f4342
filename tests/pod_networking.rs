//! Plain-CNI pods end to end, as root: the built binary wires namespaces
//! this test makes, with Debian's host-local, and the kernel state and the
//! embedded store are read back.

mod common;

use std::thread;

use common::*;
use serde_json::{Value, json};

fn routes(ns: &Netns, v6: bool) -> Vec<Value> {
    let fam = if v6 { "-6" } else { "-4" };
    ns.ip_json(&[fam, "route", "show", "table", "main"])
        .as_array()
        .unwrap()
        .clone()
}

/// `dst` / `gateway` / `scope` triples of a route listing, for exact comparison.
fn route_summary(rs: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = rs
        .iter()
        .map(|r| {
            format!(
                "{} via {} scope {}",
                r["dst"].as_str().unwrap_or(""),
                r["gateway"].as_str().unwrap_or("-"),
                r["scope"].as_str().unwrap_or("global")
            )
        })
        .collect();
    out.sort();
    out
}

fn host_route_to(ip: &str) -> Option<Value> {
    host_ip_json(&["route", "show", "exact", ip])
        .as_array()
        .and_then(|a| a.first().cloned())
}

fn host_route6_to(ip: &str) -> Option<Value> {
    host_ip_json(&["-6", "route", "show", "exact", ip])
        .as_array()
        .and_then(|a| a.first().cloned())
}

fn pod_ip(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["address"].as_str().unwrap().to_string())
        .find(|a| a.contains(':') == v6)
        .unwrap()
}

fn addr_only(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

#[test]
fn ipv4_pod_is_laid_out_like_calico() {
    if !root_or_skip("ipv4_pod_is_laid_out_like_calico") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    std::fs::write(s.dir.path().join("mtu"), "1440").unwrap();
    let ns = Netns::new();
    let cid = container_id();
    let veth = host_veth(&cid);
    let result = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();

    // Result: two interfaces, the address narrowed to /32 at index 1.
    assert_eq!(result["cniVersion"], "1.0.0");
    assert_eq!(result["interfaces"][0]["name"], json!(veth));
    assert_eq!(result["interfaces"][1]["name"], "eth0");
    assert_eq!(result["interfaces"][1]["sandbox"], json!(ns.path()));
    let ip = pod_ip(&result, false);
    assert!(ip.ends_with("/32"), "{ip}");
    assert_eq!(result["ips"][0]["interface"], 1);
    assert!(result["ips"][0].get("gateway").is_none());

    // Host side.
    let link = &host_link(&veth).expect("host veth");
    assert_eq!(link["address"], "ee:ee:ee:ee:ee:ee");
    assert_eq!(link["mtu"], 1440);
    assert!(link["flags"].as_array().unwrap().contains(&json!("UP")));
    let hr = host_route_to(&ip).expect("host route");
    assert_eq!(hr["dev"], json!(veth));
    assert_eq!(hr["scope"], "link");
    // iproute2's JSON omits the protocol when it is the default, boot.
    assert!(hr.get("protocol").is_none_or(|p| p == "boot"), "{hr}");
    for (key, want) in [
        (format!("net/ipv4/conf/{veth}/proxy_arp"), "1"),
        (format!("net/ipv4/neigh/{veth}/proxy_delay"), "0"),
        (format!("net/ipv4/conf/{veth}/forwarding"), "1"),
        (format!("net/ipv4/conf/{veth}/route_localnet"), "1"),
        (format!("net/ipv6/conf/{veth}/accept_ra"), "0"),
    ] {
        assert_eq!(host_sysctl(&key), want, "{key}");
    }

    // Container side.
    let c = &ns.link("eth0").expect("eth0");
    assert_eq!(c["mtu"], 1440);
    assert_eq!(c["address"], result["interfaces"][1]["mac"]);
    let addrs = ns.ip_json(&["-4", "addr", "show", "dev", "eth0"]);
    assert_eq!(addrs[0]["addr_info"][0]["local"], json!(addr_only(&ip)));
    assert_eq!(addrs[0]["addr_info"][0]["prefixlen"], 32);
    assert_eq!(
        route_summary(&routes(&ns, false)),
        vec![
            "169.254.1.1 via - scope link",
            "default via 169.254.1.1 scope global"
        ]
    );
    assert_eq!(ns.sysctl("net/ipv4/ip_forward"), "0");

    // The endpoint record.
    let weps = s.endpoints();
    assert_eq!(weps.len(), 1);
    let w = &weps[0];
    assert_eq!(
        w["metadata"]["name"],
        json!(format!("test--node-cni-{cid}-eth0"))
    );
    assert_eq!(w["metadata"]["namespace"], "default");
    assert_eq!(w["spec"]["interfaceName"], json!(veth));
    assert_eq!(w["spec"]["ipNetworks"], json!([ip]));
    assert_eq!(w["spec"]["mac"], result["interfaces"][1]["mac"]);
    assert_eq!(w["spec"]["profiles"], json!(["net1"]));
    assert_eq!(w["spec"]["orchestrator"], "cni");
    assert_eq!(w["spec"]["containerID"], json!(cid));

    // The network's profile (policy.type empty), Calico's shape.
    let profiles = s.stored("Profile");
    assert_eq!(profiles.len(), 1);
    assert_eq!(profiles[0]["metadata"]["name"], "net1");
    assert_eq!(profiles[0]["spec"]["labelsToApply"], json!({"net1": ""}));
    assert_eq!(profiles[0]["spec"]["egress"], json!([{"action": "Allow"}]));
    assert_eq!(
        profiles[0]["spec"]["ingress"],
        json!([{"action": "Allow", "source": {"selector": "has(net1)"}}])
    );

    // CHECK right after ADD passes and prints nothing.
    let mut conf = s.conf.clone();
    conf["prevResult"] = result.clone();
    let out = s.run_with("CHECK", &cid, &ns.path(), "eth0", &conf, &[]);
    out.assert_ok();
    assert!(out.stdout.is_empty(), "{}", out.stdout);

    // DEL removes everything.
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    assert!(!host_link_exists(&veth));
    assert!(host_route_to(&ip).is_none());
    assert!(ns.link("eth0").is_none());
    assert!(s.reservations().is_empty(), "{:?}", s.reservations());
    assert!(s.endpoints().is_empty());
}

/// The pod's `net.ipv4.ip_forward` follows `allow_ip_forwarding`, both
/// ways, written in the pod's namespace and nowhere else (the file is
/// opened with the pod's netlink socket and written later from another
/// thread): each pod's starts at the opposite value.
#[test]
fn pod_ip_forward_follows_allow_ip_forwarding_in_the_pod_only() {
    if !root_or_skip("pod_ip_forward_follows_allow_ip_forwarding_in_the_pod_only") {
        return;
    }
    let host_before = host_sysctl("net/ipv4/ip_forward");
    for (allow, start, want) in [(true, "0", "1"), (false, "1", "0")] {
        let s = Setup::new("1.0.0", false);
        let mut conf = s.conf.clone();
        conf["container_settings"] = json!({"allow_ip_forwarding": allow});
        let ns = Netns::new();
        let out = ns.exec(&["sysctl", "-qw", &format!("net.ipv4.ip_forward={start}")]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(ns.sysctl("net/ipv4/ip_forward"), start);
        let cid = container_id();
        s.run_with("ADD", &cid, &ns.path(), "eth0", &conf, &[])
            .assert_ok();
        assert_eq!(ns.sysctl("net/ipv4/ip_forward"), want, "allow {allow}");
        assert_eq!(host_sysctl("net/ipv4/ip_forward"), host_before);
        s.run_with("DEL", &cid, &ns.path(), "eth0", &conf, &[])
            .assert_ok();
    }
}

#[test]
fn dual_stack_pod_has_ipv6_default_via_link_local_and_nothing_tentative() {
    if !root_or_skip("dual_stack_pod") {
        return;
    }
    let s = Setup::new("1.1.0", true);
    let ns = Netns::new();
    let cid = container_id();
    let veth = host_veth(&cid);
    let result = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
    assert_eq!(result["cniVersion"], "1.1.0");
    let ip6 = pod_ip(&result, true);
    assert!(ip6.ends_with("/128"), "{ip6}");

    let r6: Vec<_> = routes(&ns, true);
    let default = r6
        .iter()
        .find(|r| r["dst"] == "default")
        .expect("v6 default route");
    assert_eq!(default["gateway"], "fe80::ecee:eeff:feee:eeee");
    assert_eq!(default["dev"], "eth0");
    for a in ns.ip_json(&["-6", "addr", "show", "dev", "eth0"])[0]["addr_info"]
        .as_array()
        .unwrap()
    {
        assert!(a.get("tentative").is_none(), "tentative address: {a}");
    }
    assert!(
        ns.ip_json(&["-6", "addr", "show", "dev", "eth0"])[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["local"] == json!(addr_only(&ip6)) && a["prefixlen"] == 128)
    );
    let hr = host_route6_to(&ip6).expect("host /128 route");
    assert_eq!(hr["dev"], json!(veth));
    for (key, want) in [
        (format!("net/ipv6/conf/{veth}/proxy_ndp"), "1"),
        (format!("net/ipv6/conf/{veth}/forwarding"), "1"),
        (format!("net/ipv6/conf/{veth}/accept_dad"), "0"),
        (format!("net/ipv6/conf/{veth}/disable_ipv6"), "0"),
    ] {
        assert_eq!(host_sysctl(&key), want, "{key}");
    }
    assert_eq!(ns.sysctl("net/ipv6/conf/eth0/accept_dad"), "0");
    assert_eq!(ns.sysctl("net/ipv6/conf/all/disable_ipv6"), "0");
    assert_eq!(ns.sysctl("net/ipv6/conf/all/forwarding"), "0");

    // Host to pod over IPv6.
    let ping = std::process::Command::new("ping")
        .args(["-6", "-c1", "-W2", addr_only(&ip6)])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "ping6 failed: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    assert!(host_route6_to(&ip6).is_none());
    assert!(s.reservations().is_empty());
}

#[test]
fn pods_reach_each_other_and_the_host() {
    if !root_or_skip("pods_reach_each_other_and_the_host") {
        return;
    }
    let s = Setup::new("0.4.0", false);
    let (a, b) = (Netns::new(), Netns::new());
    let (ca, cb) = (container_id(), container_id());
    let ra = s.run("ADD", &ca, &a.path(), "eth0").assert_ok().json();
    let rb = s.run("ADD", &cb, &b.path(), "eth0").assert_ok().json();
    let (ipa, ipb) = (pod_ip(&ra, false), pod_ip(&rb, false));
    assert_ne!(ipa, ipb);
    assert_ping(Some(&a), addr_only(&ipb), "pod to pod");
    assert_ping(None, addr_only(&ipa), "host to pod");
    s.run("DEL", &ca, &a.path(), "eth0").assert_ok();
    s.run("DEL", &cb, &b.path(), "eth0").assert_ok();
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());
}

#[test]
fn result_in_each_version() {
    if !root_or_skip("result_in_each_version") {
        return;
    }
    for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let s = Setup::new(v, false);
        let ns = Netns::new();
        let cid = container_id();
        let r = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
        assert_eq!(r["cniVersion"], json!(v));
        assert_eq!(r["interfaces"].as_array().unwrap().len(), 2, "{v}");
        assert_eq!(r["ips"][0]["interface"], 1, "{v}");
        let has_version = r["ips"][0].get("version").is_some();
        assert_eq!(has_version, v.starts_with("0."), "{v}: {r}");
        assert!(
            r["interfaces"][1]["mac"]
                .as_str()
                .is_some_and(|m| m.len() == 17),
            "{v}"
        );
        s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    }
}

/// The host's state that a pod touches, for before/after comparison.
fn host_snapshot(s: &Setup, veth: &str) -> (bool, usize, usize, usize) {
    let routes = host_ip_json(&["route", "show", "dev", "lo"])
        .as_array()
        .map_or(0, |a| a.len());
    (
        host_link_exists(veth),
        routes,
        s.reservations().len(),
        s.endpoints().len(),
    )
}

#[test]
fn failed_add_at_each_step_leaves_nothing() {
    if !root_or_skip("failed_add_at_each_step_leaves_nothing") {
        return;
    }
    if !cfg!(feature = "fault-injection") {
        cannot_run(
            "failed_add_at_each_step_leaves_nothing",
            "build with --features fault-injection to inject failures",
        );
        return;
    }
    for step in ["ipam", "networking", "endpoint", "profile"] {
        let s = Setup::new("1.0.0", true);
        let ns = Netns::new();
        let cid = container_id();
        let veth = host_veth(&cid);
        let before = host_snapshot(&s, &veth);
        let out = s.run_with(
            "ADD",
            &cid,
            &ns.path(),
            "eth0",
            &s.conf,
            &[("CALICO_CNI_FAIL_AFTER", step)],
        );
        assert_eq!(out.code, 1, "{step}: {}", out.stdout);
        assert!(out.json()["msg"].as_str().unwrap().contains(step));
        assert_eq!(host_snapshot(&s, &veth), before, "{step}");
        assert!(!host_link_exists(&veth), "{step}: veth left");
        assert!(
            s.reservations().is_empty(),
            "{step}: {:?}",
            s.reservations()
        );
        assert!(s.endpoints().is_empty(), "{step}: endpoint left");
        assert!(ns.link("eth0").is_none(), "{step}: eth0 left");
        let leftover = host_ip_json(&["route", "show", "proto", "boot"]).to_string();
        assert!(
            !leftover.contains(&veth),
            "{step}: host route left: {leftover}"
        );
    }
}

#[test]
fn existing_container_interface_is_a_clear_error() {
    if !root_or_skip("existing_container_interface_is_a_clear_error") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let ns = Netns::new();
    run_ok(
        "ip",
        &[
            "netns", "exec", &ns.name, "ip", "link", "add", "eth0", "type", "veth", "peer", "name",
            "other0",
        ],
    );
    let cid = container_id();
    let out = s.run("ADD", &cid, &ns.path(), "eth0");
    assert_eq!(out.code, 1);
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap()
            .contains("already exists"),
        "{}",
        out.stdout
    );
    assert!(!host_link_exists(&host_veth(&cid)));
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());
}

#[test]
fn del_is_idempotent_for_every_missing_piece() {
    if !root_or_skip("del_is_idempotent_for_every_missing_piece") {
        return;
    }
    let s = Setup::new("1.0.0", false);

    // Never added, with a live netns and with a path that never existed.
    let ns = Netns::new();
    s.run("DEL", &container_id(), &ns.path(), "eth0")
        .assert_ok();
    s.run("DEL", &container_id(), "/not/a/real/path1234567890", "eth0")
        .assert_ok();

    // Twice after an ADD.
    let cid = container_id();
    s.run("ADD", &cid, &ns.path(), "eth0").assert_ok();
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();

    // Interface already gone.
    let cid = container_id();
    s.run("ADD", &cid, &ns.path(), "eth0").assert_ok();
    run_ok(
        "ip",
        &["netns", "exec", &ns.name, "ip", "link", "del", "eth0"],
    );
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    assert!(s.endpoints().is_empty());

    // IP already released and record already gone.
    let cid = container_id();
    s.run("ADD", &cid, &ns.path(), "eth0").assert_ok();
    for f in s.reservations() {
        std::fs::remove_file(s.ipam_dir().join(f)).unwrap();
    }
    let conn = rusqlite::Connection::open(s.store_path()).unwrap();
    conn.execute("DELETE FROM resources WHERE kind = 'WorkloadEndpoint'", [])
        .unwrap();
    drop(conn);
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    assert!(!host_link_exists(&host_veth(&cid)));

    // Netns deleted before DEL: the host veth is still removed.
    let gone = Netns::new();
    let cid = container_id();
    s.run("ADD", &cid, &gone.path(), "eth0").assert_ok();
    let path = gone.path();
    drop(gone);
    s.run("DEL", &cid, &path, "eth0").assert_ok();
    assert!(!host_link_exists(&host_veth(&cid)));

    // Empty CNI_NETNS.
    let other = Netns::new();
    let cid = container_id();
    s.run("ADD", &cid, &other.path(), "eth0").assert_ok();
    s.run("DEL", &cid, "", "eth0").assert_ok();
    assert!(!host_link_exists(&host_veth(&cid)));

    assert!(s.reservations().is_empty(), "{:?}", s.reservations());
    assert!(s.endpoints().is_empty());
}

#[test]
fn del_without_the_nodename_file_when_nodename_is_configured() {
    if !root_or_skip("del_without_the_nodename_file") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let mut conf = s.conf.clone();
    conf["nodename_file"] = json!(s.dir.path().join("absent-nodename"));
    let ns = Netns::new();
    let cid = container_id();
    s.run_with("ADD", &cid, &ns.path(), "eth0", &conf, &[])
        .assert_ok();
    s.run_with("DEL", &cid, &ns.path(), "eth0", &conf, &[])
        .assert_ok();
}

#[test]
fn check_fails_when_the_interface_or_host_route_is_removed() {
    if !root_or_skip("check_fails_when_removed") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    for what in ["interface", "route"] {
        let ns = Netns::new();
        let cid = container_id();
        let result = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
        let mut conf = s.conf.clone();
        conf["prevResult"] = result.clone();
        s.run_with("CHECK", &cid, &ns.path(), "eth0", &conf, &[])
            .assert_ok();
        match what {
            "interface" => {
                run_ok(
                    "ip",
                    &["netns", "exec", &ns.name, "ip", "link", "del", "eth0"],
                );
            }
            _ => {
                let ip = pod_ip(&result, false);
                run_ok("ip", &["route", "del", &ip, "dev", &host_veth(&cid)]);
            }
        }
        let out = s.run_with("CHECK", &cid, &ns.path(), "eth0", &conf, &[]);
        assert_eq!(out.code, 1, "{what}");
        assert!(out.json()["msg"].is_string(), "{what}: {}", out.stdout);
        s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    }
    assert!(s.reservations().is_empty());
}

#[test]
fn status_reports_the_datastore() {
    let s = Setup::new("1.1.0", false);
    let ns_path = "/var/run/netns/unused";
    s.run("STATUS", "", ns_path, "").assert_ok();
    let store = calico_cni::datastore::local::LocalStore::open(
        &s.store_path(),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    store.set_cluster_ready(false).unwrap();
    let out = s.run("STATUS", "", ns_path, "");
    assert_eq!(out.error_code(), 50);
    assert!(out.json()["msg"].as_str().unwrap().contains("not ready"));
    // ADD refuses, and changes nothing, while not ready.
    if root_or_skip("status: ADD while not ready") {
        let ns = Netns::new();
        let cid = container_id();
        assert_eq!(s.run("ADD", &cid, &ns.path(), "eth0").code, 1);
        assert!(!host_link_exists(&host_veth(&cid)));
        assert!(s.reservations().is_empty());
    }
}

#[test]
fn repeat_add_reuses_the_endpoint_and_adds_the_network_profile() {
    if !root_or_skip("repeat_add") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let ns = Netns::new();
    let cid = container_id();
    let first = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
    let mut conf2 = s.conf.clone();
    conf2["name"] = json!("net2");
    let second = s
        .run_with("ADD", &cid, &ns.path(), "eth0", &conf2, &[])
        .assert_ok()
        .json();
    assert_eq!(second["ips"], first["ips"]);
    let weps = s.endpoints();
    assert_eq!(weps.len(), 1);
    assert_eq!(weps[0]["spec"]["profiles"], json!(["net1", "net2"]));
    assert_eq!(s.reservations().len(), 1, "no second allocation");
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
}

#[test]
fn fifty_concurrent_adds_then_dels() {
    if !root_or_skip("fifty_concurrent_adds_then_dels") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let pods: Vec<(Netns, String)> = (0..50).map(|_| (Netns::new(), container_id())).collect();
    let results: Vec<Value> = thread::scope(|scope| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(ns, cid)| {
                let s = &s;
                scope.spawn(move || s.run("ADD", cid, &ns.path(), "eth0"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().assert_ok().json())
            .collect()
    });
    let mut ips: Vec<String> = results.iter().map(|r| pod_ip(r, false)).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 50, "distinct IPs");
    assert_eq!(s.endpoints().len(), 50);
    assert_eq!(s.reservations().len(), 50);
    for (ns, cid) in &pods {
        assert!(host_link_exists(&host_veth(cid)));
        assert!(ns.link("eth0").is_some(), "{cid}: no eth0");
    }
    thread::scope(|scope| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(ns, cid)| {
                let s = &s;
                scope.spawn(move || s.run("DEL", cid, &ns.path(), "eth0"))
            })
            .collect();
        for h in handles {
            h.join().unwrap().assert_ok();
        }
    });
    assert!(s.endpoints().is_empty());
    assert!(s.reservations().is_empty());
    for (_, cid) in &pods {
        assert!(!host_link_exists(&host_veth(cid)));
    }
    for ip in &ips {
        assert!(host_route_to(ip).is_none(), "{ip}");
    }
}

#[test]
fn del_completes_local_teardown_when_the_datastore_fails() {
    if !root_or_skip("del_completes_local_teardown_when_the_datastore_fails") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let ns = Netns::new();
    let cid = container_id();
    s.run("ADD", &cid, &ns.path(), "eth0").assert_ok();
    let mut broken = s.conf.clone();
    broken["local_datastore_path"] = json!("/proc/no-such-dir/store.db");
    let out = s.run_with("DEL", &cid, &ns.path(), "eth0", &broken, &[]);
    assert_eq!(out.error_code(), 100, "the datastore failure is reported");
    assert!(!host_link_exists(&host_veth(&cid)), "veth removed anyway");
    assert!(s.reservations().is_empty(), "IP released anyway");
    // The record is removed by a DEL once the datastore is back.
    assert_eq!(s.endpoints().len(), 1);
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    assert!(s.endpoints().is_empty());
}

/// The pod's pair is made while the datastore is read, but only where its
/// names are free: an ADD that then fails never removes an interface that
/// already had the pod's host veth name.
#[test]
fn a_failed_add_leaves_an_existing_interface_of_its_name() {
    if !root_or_skip("a_failed_add_leaves_an_existing_interface_of_its_name") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let store = calico_cni::datastore::local::LocalStore::open(
        &s.store_path(),
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    store.set_cluster_ready(false).unwrap();
    let ns = Netns::new();
    let cid = container_id();
    let veth = host_veth(&cid);
    let peer = format!("x{}", &veth[veth.len() - 12..]);
    run_ok(
        "ip",
        &["link", "add", &veth, "type", "veth", "peer", "name", &peer],
    );
    let out = s.run("ADD", &cid, &ns.path(), "eth0");
    let kept = host_link_exists(&veth);
    let _ = std::process::Command::new("ip")
        .args(["link", "del", &veth])
        .status();
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(kept, "the existing {veth} was removed");
    assert!(ns.link("eth0").is_none());
    assert!(s.reservations().is_empty());
}

/// A repeat ADD of a container whose endpoint exists reuses the endpoint
/// and makes no networking: a pair made ahead for it (its names were free:
/// the host veth had been removed) is removed again.
#[test]
fn a_repeat_add_removes_the_pair_made_ahead() {
    if !root_or_skip("a_repeat_add_removes_the_pair_made_ahead") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let ns = Netns::new();
    let cid = container_id();
    let veth = host_veth(&cid);
    let first = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
    run_ok("ip", &["link", "del", &veth]);
    assert!(ns.link("eth0").is_none());
    let again = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
    assert_eq!(again["ips"], first["ips"]);
    assert!(!host_link_exists(&veth), "the pair made ahead is left");
    assert!(ns.link("eth0").is_none(), "eth0 made ahead is left");
    assert_eq!(s.endpoints().len(), 1);
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
}
