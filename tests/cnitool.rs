//! The real `cnitool` drives the plugin with the shipped conf/ example:
//! Debian's (libcni 1.1.2, spec 1.0.0) add, check, del with Debian's
//! host-local (which stops at 1.0.0: the negotiation path), and the current
//! one (libcni 1.3, scripts/peers.sh) add, check, status, gc, del at 1.1.0
//! with the 1.1-capable host-local.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

fn cnitool(test: &str) -> Option<String> {
    for p in ["/usr/local/bin/cnitool", "/usr/bin/cnitool"] {
        if Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    cannot_run(
        test,
        "cnitool is not installed (scripts/install-cnitool.sh builds it)",
    );
    None
}

/// The conf/ example as network `net` in a conf dir of `s`'s own, with
/// `version` as its cniVersion.
fn conf_example(s: &Setup, net: &str, version: &str) -> std::path::PathBuf {
    let mut list: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conf/10-calico-local-host-local.conflist"
        ))
        .unwrap(),
    )
    .unwrap();
    list["name"] = net.into();
    list["cniVersion"] = version.into();
    let plugin = &mut list["plugins"][0];
    plugin["nodename"] = "cnitool-node".into();
    plugin["log_file_path"] = s.dir.path().join("cni.log").to_string_lossy().into();
    plugin["local_datastore_path"] = s.store_path().to_string_lossy().into();
    plugin["mtu_file"] = s.dir.path().join("mtu").to_string_lossy().into();
    plugin["ipam"]["dataDir"] = s.dir.path().join("ipam").to_string_lossy().into();
    plugin["ipam"]["ranges"] = serde_json::json!([[{"subnet": s.subnet}]]);
    let confdir = s.dir.path().join("net.d");
    std::fs::create_dir_all(&confdir).unwrap();
    std::fs::write(confdir.join("10-test.conflist"), list.to_string()).unwrap();
    confdir
}

/// host-local's reservations of network `net`.
fn reserved(s: &Setup, net: &str) -> usize {
    std::fs::read_dir(s.dir.path().join("ipam").join(net))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("10."))
                .count()
        })
        .unwrap_or(0)
}

fn no_eth0(ns: &Netns) -> bool {
    ns.link("eth0").is_none()
}

fn ping_first_ip(result: &Value) {
    let ip = result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let ping = Command::new("ping")
        .args(["-c1", "-W2", &ip])
        .output()
        .unwrap();
    assert!(ping.status.success(), "host to pod {ip}");
}

fn assert_ok(verb: &str, out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{verb}: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn current_cnitool_add_check_status_gc_del_at_1_1_0() {
    if !root_or_skip("current_cnitool_at_1_1_0") {
        return;
    }
    let test = "current_cnitool_at_1_1_0";
    let Some(cnitool) = common::testbed::peer(test, "cnitool") else {
        return;
    };
    let Some(host_local) = common::testbed::peer(test, "host-local") else {
        return;
    };
    let s = Setup::new("1.1.0", false);
    let net = format!("cnitool11-{}", unique());
    let confdir = conf_example(&s, &net, "1.1.0");
    let bindir = Path::new(CALICO).parent().unwrap();
    let cni_path = format!(
        "{}:{}",
        bindir.display(),
        host_local.parent().unwrap().display()
    );
    let ns = Netns::new();
    let tool = |verb: &str| {
        Command::new(&cnitool)
            .args([verb, &net, &ns.path()])
            .env("NETCONFPATH", &confdir)
            .env("CNI_PATH", &cni_path)
            .output()
            .unwrap()
    };
    let add = tool("add");
    assert_ok("add", &add);
    let result: Value = serde_json::from_slice(&add.stdout).unwrap();
    assert_eq!(result["cniVersion"], "1.1.0", "{result}");
    ping_first_ip(&result);
    assert_eq!(s.endpoints().len(), 1);
    assert_eq!(reserved(&s, &net), 1);
    assert_ok("check", &tool("check"));
    assert_ok("status", &tool("status"));
    // cnitool's gc DELs every cached attachment of the network, then sends
    // GC (without valid attachments) to every plugin of the list.
    assert_ok("gc", &tool("gc"));
    assert!(s.endpoints().is_empty());
    assert_eq!(reserved(&s, &net), 0);
    assert!(no_eth0(&ns));
    assert_ok("del after gc", &tool("del"));
    // STATUS tells the truth: the embedded datastore marked not ready.
    let conn = rusqlite::Connection::open(s.store_path()).unwrap();
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1;
         UPDATE resources SET value = json_set(value, '$.spec.datastoreReady', json('false')),
           revision = (SELECT last_revision FROM counter WHERE id = 1)
           WHERE kind = 'ClusterInformation' AND namespace = '' AND name = 'default';
         COMMIT;",
    )
    .unwrap();
    let status = tool("status");
    assert!(!status.status.success(), "STATUS of a datastore not ready");
    let said = String::from_utf8_lossy(&status.stderr);
    assert!(said.contains("not ready"), "{said}");
}

#[test]
fn cnitool_add_check_del_with_the_conf_example() {
    if !root_or_skip("cnitool_add_check_del") {
        return;
    }
    let Some(cnitool) = cnitool("cnitool_add_check_del") else {
        return;
    };
    let s = Setup::new("1.0.0", false);
    let net = format!("cnitool-{}", unique());
    let confdir = conf_example(&s, &net, "1.0.0");
    let bindir = Path::new(CALICO).parent().unwrap();
    let ns = Netns::new();
    let tool = |verb: &str| {
        Command::new(&cnitool)
            .args([verb, &net, &ns.path()])
            .env("NETCONFPATH", &confdir)
            .env("CNI_PATH", format!("{}:{CNI_BIN}", bindir.display()))
            .output()
            .unwrap()
    };
    let add = tool("add");
    assert_ok("add", &add);
    let result: Value = serde_json::from_slice(&add.stdout).unwrap();
    ping_first_ip(&result);
    assert_eq!(s.endpoints().len(), 1);
    assert_ok("check", &tool("check"));
    assert_ok("del", &tool("del"));
    assert_ok("second del", &tool("del"));
    assert!(s.endpoints().is_empty());
    assert_eq!(reserved(&s, &net), 0);
    assert!(no_eth0(&ns));
}
