//! IPAM delegation against Debian's real host-local, and a failing IPAM
//! plugin's error passed through the binary unchanged.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use calico_cni::cni::delegate::Delegate;
use calico_cni::cni::env::Command;
use calico_cni::cni::{CniResult, Version};
use common::{CALICO, CNI_BIN, block_on, env_of, exec};
use ipnet::IpNet;
use serde_json::{Value, json};
use tokio::time::Instant;

fn have_host_local(test: &str) -> bool {
    if std::path::Path::new(CNI_BIN).join("host-local").exists() {
        return true;
    }
    common::cannot_run(
        test,
        &format!("{CNI_BIN}/host-local is not installed (containernetworking-plugins)"),
    );
    false
}

fn reservations(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir.join("net1"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn host_local_add_and_del_in_every_version() {
    if !have_host_local("host_local_add_and_del_in_every_version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = vec![PathBuf::from("/nonexistent"), PathBuf::from(CNI_BIN)];
    let range: IpNet = "10.77.0.0/24".parse().unwrap();
    for (i, v) in [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
    ]
    .iter()
    .enumerate()
    {
        let env: HashMap<String, String> = env_of(&[
            ("CNI_CONTAINERID", &format!("deleg{i}")),
            ("CNI_NETNS", "/var/run/netns/unused"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", CNI_BIN),
            ("CNI_ARGS", "K8S_POD_NAME=p;UnknownKey=x"),
        ]);
        let conf = json!({
            "cniVersion": v, "name": "net1", "type": "calico",
            "ipam": {"type": "host-local", "subnet": range.to_string(), "dataDir": dir.path()}
        });
        let delegate = Delegate {
            plugin: "host-local".into(),
            path: path.clone().into(),
            env: std::sync::Arc::new(env.clone()),
            extra_args: None,
            deadline: Instant::now() + std::time::Duration::from_secs(10),
        };
        let result: CniResult =
            block_on(delegate.add(&conf)).unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(result.ips.len(), 1, "{v}");
        let addr = result.ips[0].address;
        assert!(range.contains(&addr.addr()), "{v}: {addr} not in {range}");
        // Printed in the version the config asked for.
        let printed = result.to_version(Version::parse(v).unwrap()).unwrap();
        assert_eq!(printed["cniVersion"], json!(v));
        assert_eq!(
            reservations(dir.path()),
            vec![addr.addr().to_string()],
            "{v}"
        );

        block_on(delegate.run(Command::Del, &conf)).unwrap_or_else(|e| panic!("{v} DEL: {e}"));
        assert!(
            reservations(dir.path()).is_empty(),
            "{v}: DEL left a reservation"
        );
    }
}

#[test]
fn negotiation_asks_version_only_when_refused() {
    if !have_host_local("negotiation_asks_version_only_when_refused") {
        return;
    }
    let path = vec![PathBuf::from(CNI_BIN)];
    let env = env_of(&[]);
    let delegate = Delegate {
        plugin: "host-local".into(),
        path: path.clone().into(),
        env: std::sync::Arc::new(env.clone()),
        extra_args: None,
        deadline: Instant::now() + std::time::Duration::from_secs(10),
    };
    let theirs = block_on(delegate.supported_versions()).unwrap();
    assert!(theirs.contains(&"1.0.0".to_string()), "{theirs:?}");
    // A 1.1.0-only verb is skipped for a plugin that predates 1.1.0.
    let conf = json!({"cniVersion": "1.1.0", "name": "net1", "ipam": {"type": "host-local"}});
    block_on(delegate.run_v11_verb(Command::Status, &conf)).unwrap();
}

/// A plugin that fails with a fixed error JSON, and one that hangs.
fn fake_plugins() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        "failing-ipam",
        r#"printf '%s' '{"cniVersion":"1.0.0","code":7,"msg":"Invalid Configuration","details":"Network 192.168.0.0/31 too small to allocate from."}'
exit 1"#,
    );
    write("hanging-ipam", "exec sleep 30");
    // Debian's host-local, whose ADD keeps its answer back past any deadline.
    let slow = dir.path().join("slow-host-local");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then\n  out=$({CNI_BIN}/host-local) || exit $?\n  sleep 30\n  printf '%s' \"$out\"\nelse\n  exec {CNI_BIN}/host-local\nfi\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// An ADD through the binary with IPAM plugin `ipam` found in `cni_path`,
/// into a fresh netns; returns the outcome and asserts that the failed ADD
/// left no interface behind.
fn add_with_ipam(ipam: &str, cni_path: &std::path::Path, extra: Value) -> Option<common::Outcome> {
    // ADD opens the pod netns before (and while) the IPAM plugin runs.
    if !common::root_or_skip(&format!("ADD with IPAM {ipam}")) {
        return None;
    }
    let ns = common::Netns::new();
    let state = tempfile::tempdir().unwrap();
    let mut conf = json!({
        "cniVersion": "1.0.0", "name": "net1", "type": "calico", "nodename": "n",
        "mtu_file": state.path().join("mtu"),
        "local_datastore_path": state.path().join("store.db"),
        "ipam": {"type": ipam}
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    let cid = common::container_id();
    let env = env_of(&[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", &cid),
        ("CNI_NETNS", &ns.path()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", cni_path.to_str().unwrap()),
    ]);
    let out = exec(CALICO, &env, &conf.to_string());
    assert_eq!(out.code, 1, "{}", out.stdout);
    assert!(
        !common::host_link_exists(&common::host_veth(&cid)),
        "host veth left"
    );
    assert!(ns.link("eth0").is_none(), "eth0 left");
    Some(out)
}

#[test]
fn failing_ipam_error_reaches_stdout_unchanged() {
    let plugins = fake_plugins();
    let Some(out) = add_with_ipam("failing-ipam", plugins.path(), json!({})) else {
        return;
    };
    let reply: Value = out.json();
    assert_eq!(reply["code"], 7);
    assert_eq!(reply["msg"], "Invalid Configuration");
    assert_eq!(
        reply["details"],
        "Network 192.168.0.0/31 too small to allocate from."
    );
}

#[test]
fn hanging_ipam_is_bounded_by_the_deadline() {
    let plugins = fake_plugins();
    let started = std::time::Instant::now();
    let Some(out) = add_with_ipam(
        "hanging-ipam",
        plugins.path(),
        json!({"deadline_seconds": 1.5}),
    ) else {
        return;
    };
    // The deadline (1.5 s), then the rollback's IPAM DEL (which hangs too)
    // on its own cleanup budget (5 s), and no longer.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(8), "took {took:?}");
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
}

#[test]
fn an_ipam_add_that_outlives_the_deadline_is_released_by_the_rollback() {
    if !have_host_local("an_ipam_add_that_outlives_the_deadline") {
        return;
    }
    let plugins = fake_plugins();
    let data = tempfile::tempdir().unwrap();
    let ipam = json!({"type": "slow-host-local", "subnet": "10.78.0.0/24", "dataDir": data.path()});
    let started = std::time::Instant::now();
    let Some(out) = add_with_ipam(
        "slow-host-local",
        plugins.path(),
        json!({"deadline_seconds": 2, "ipam": ipam}),
    ) else {
        return;
    };
    assert_eq!(out.error_code(), 11, "{}", out.stdout);
    // host-local reserved an address within milliseconds; the rollback's
    // DEL, on its own budget after the spent deadline, released it.
    assert!(
        data.path().join("net1").exists(),
        "host-local never ran: nothing shows the test can fail"
    );
    assert!(
        reservations(data.path()).is_empty(),
        "left reserved: {:?}",
        reservations(data.path())
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(7));
}

#[test]
fn missing_ipam_plugin_is_a_config_error() {
    let empty = tempfile::tempdir().unwrap();
    let Some(out) = add_with_ipam("no-such-ipam", empty.path(), json!({})) else {
        return;
    };
    assert_eq!(out.error_code(), 7, "{}", out.stdout);
    assert!(out.json()["msg"].as_str().unwrap().contains("no-such-ipam"));
}

/// DEL starts the exec'd IPAM plugin early (its start-up overlaps the
/// kernel's work) but the plugin is given its config, and so releases the
/// address, only once the interface that held it is gone: released
/// earlier, a new pod could be given the address while the old host route
/// still points at the old veth. A wrapper of host-local records, when it
/// has read its config, whether the host veth still exists; with the
/// sandbox's netns there, and with it gone.
#[test]
fn del_releases_the_address_only_after_the_interface_is_gone() {
    let test = "del_releases_the_address_only_after_the_interface_is_gone";
    if !have_host_local(test) || !common::root_or_skip(test) {
        return;
    }
    let plugins = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let log = state.path().join("observed");
    let wrapper = plugins.path().join("observing-host-local");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nobserve() {{ if ip link show dev \"$OBSERVE_VETH\" >/dev/null 2>&1; then echo \"$1 present\" >>{log}; else echo \"$1 gone\" >>{log}; fi; }}\nconf=$(cat)\n[ \"$CNI_COMMAND\" = DEL ] && observe configured\nprintf '%s' \"$conf\" | exec {CNI_BIN}/host-local\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = json!({
        "cniVersion": "1.0.0", "name": "net1", "type": "calico", "nodename": "n",
        "mtu_file": state.path().join("mtu"),
        "local_datastore_path": state.path().join("store.db"),
        "ipam": {"type": "observing-host-local", "subnet": "10.79.0.0/24", "dataDir": data.path()}
    })
    .to_string();
    for netns_gone in [false, true] {
        let ns = common::Netns::new();
        let cid = common::container_id();
        let veth = common::host_veth(&cid);
        let run = |verb: &str| {
            let env = env_of(&[
                ("CNI_COMMAND", verb),
                ("CNI_CONTAINERID", &cid),
                ("CNI_NETNS", &ns.path()),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", plugins.path().to_str().unwrap()),
                ("OBSERVE_VETH", &veth),
            ]);
            exec(CALICO, &env, &conf)
        };
        run("ADD").assert_ok();
        assert!(common::host_link_exists(&veth));
        assert_eq!(reservations(data.path()).len(), 1);
        let _ = std::fs::remove_file(&log);
        if netns_gone {
            common::run_ok("ip", &["netns", "del", &ns.name]);
        }
        run("DEL").assert_ok();
        let observed = std::fs::read_to_string(&log).unwrap();
        let observed: Vec<&str> = observed.lines().collect();
        assert_eq!(
            observed.last(),
            Some(&"configured gone"),
            "netns gone: {netns_gone}: the plugin was given its config while the veth existed: {observed:?}"
        );
        assert_eq!(observed.len(), 1, "{observed:?}");
        assert!(!common::host_link_exists(&veth));
        assert!(
            reservations(data.path()).is_empty(),
            "{:?}",
            reservations(data.path())
        );
    }
}
