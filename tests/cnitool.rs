//! The real `cnitool` (libcni 1.1.2) drives the plugin with the shipped
//! conf/ example: add, check, del.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

fn cnitool() -> Option<String> {
    for p in ["/usr/local/bin/cnitool", "/usr/bin/cnitool"] {
        if Path::new(p).exists() {
            return Some(p.to_string());
        }
    }
    eprintln!("skipping: cnitool is not installed (scripts/install-cnitool.sh builds it)");
    None
}

#[test]
fn cnitool_add_check_del_with_the_conf_example() {
    if !root_or_skip("cnitool_add_check_del") {
        return;
    }
    let Some(cnitool) = cnitool() else { return };
    let s = Setup::new("1.0.0", false);
    let net = format!("cnitool-{}", unique());
    let mut list: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/conf/10-calico-local.conflist"
        ))
        .unwrap(),
    )
    .unwrap();
    list["name"] = net.clone().into();
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
    assert!(
        add.status.success(),
        "add: {} {}",
        String::from_utf8_lossy(&add.stdout),
        String::from_utf8_lossy(&add.stderr)
    );
    let result: Value = serde_json::from_slice(&add.stdout).unwrap();
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
    assert_eq!(s.endpoints().len(), 1);

    let check = tool("check");
    assert!(
        check.status.success(),
        "check: {}",
        String::from_utf8_lossy(&check.stdout)
    );

    let del = tool("del");
    assert!(
        del.status.success(),
        "del: {}",
        String::from_utf8_lossy(&del.stdout)
    );
    assert!(tool("del").status.success(), "second del");
    assert!(s.endpoints().is_empty());
    let ipam_files = std::fs::read_dir(s.dir.path().join("ipam").join(&net))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("10."))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(ipam_files, 0);
    assert!(
        ns.ip_json(&["link", "show", "dev", "eth0"])
            .as_array()
            .is_none_or(|a| a.is_empty())
    );
}
